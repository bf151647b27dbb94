"""s3+boto3 reads longer than ``part_size``: ranged GETs of ``part_size``, ``streams`` at a
time, each into its slice of the caller's buffer; the bytes, the ends of the object, a part
that fails, and a checkpoint whose chunks span several parts (CRC32C checked, damage found)."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio.registry import open_store
from ckptio.trace import Trace

MiB = 1 << 20
PART = 5 * MiB  # S3's smallest part size
DATA = np.random.default_rng(3).integers(0, 256, 17 * MiB + 12_345, dtype=np.uint8).tobytes()


def _store(bucket: str, trace: Trace | None = None) -> Any:
    store = open_store(f"s3+boto3://{bucket}/rr", part_size=PART, streams=3, trace=trace)
    with store.open_writer("obj.bin") as w:
        w.write(DATA)
    return store


def test_a_long_read_goes_out_as_parallel_ranged_gets_of_part_size(s3_bucket: str) -> None:
    trace = Trace()
    store = _store(s3_bucket, trace)
    before = len([e for e in trace.events() if e.op == "get"])
    buf = bytearray(16 * MiB)
    assert store.read_into("obj.bin", 1_234, buf) == len(buf)
    assert bytes(buf) == DATA[1_234 : 1_234 + len(buf)]
    gets = [e for e in trace.events() if e.op == "get"][before:]
    assert sorted(e.nbytes for e in gets) == [MiB, PART, PART, PART]
    # more than one in flight at once: some GET started before another ended
    spans = sorted((e.start, e.end) for e in gets)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans))
    store.close()


def test_a_long_read_past_the_end_returns_what_the_object_holds(s3_bucket: str) -> None:
    store = _store(s3_bucket)
    start = len(DATA) - 7 * MiB
    buf = bytearray(16 * MiB)  # parts 2 and 3 lie past the end
    assert store.read_into("obj.bin", start, buf) == 7 * MiB
    assert bytes(buf[: 7 * MiB]) == DATA[start:]
    assert store.read_into("obj.bin", len(DATA), bytearray(11 * MiB)) == 0
    store.close()


def test_a_failed_part_raises_after_every_part_ended(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(s3_bucket)
    real = store._read_range
    started: list[int] = []
    ends: list[float] = []
    lock = threading.Lock()

    def read_range(key: str, full: str, offset: int, out: memoryview) -> int:
        with lock:
            started.append(offset)
        try:
            if offset == PART:
                raise errors.StoragePermissionError(f"{key}: refused (test)")
            time.sleep(0.05)  # the other parts are still receiving when the failure is raised
            return real(key, full, offset, out)
        finally:
            with lock:
                ends.append(time.monotonic())

    monkeypatch.setattr(store, "_read_range", read_range)
    with pytest.raises(errors.StoragePermissionError, match="refused"):
        store.read_into("obj.bin", 0, bytearray(15 * MiB))
    raised = time.monotonic()
    assert sorted(started) == [0, PART, 2 * PART]
    assert len(ends) == 3 and max(ends) <= raised  # none still wrote into the buffer after
    store.close()


def test_a_checkpoint_of_chunks_longer_than_a_part_loads_and_damage_is_found(
    s3_bucket: str, s3_client: Any
) -> None:
    url = f"s3+boto3://{s3_bucket}/ck?part_size={PART}&streams=3"
    state = {
        "w": np.frombuffer(DATA, dtype=np.uint8)[: 16 * MiB].view(np.float32).reshape(-1, 1024)
    }
    ckptio.save(state, url, step=1)
    got = ckptio.load(url, step=1)
    np.testing.assert_array_equal(got["w"], state["w"])
    keys = [
        o["Key"]
        for o in s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="ck/")["Contents"]
        if o["Key"].endswith(".bin")
    ]
    body = bytearray(s3_client.get_object(Bucket=s3_bucket, Key=keys[0])["Body"].read())
    body[len(body) - 3] ^= 0x40  # in the last part of the object
    s3_client.put_object(Bucket=s3_bucket, Key=keys[0], Body=bytes(body))
    with pytest.raises(errors.ChecksumError):
        ckptio.load(url, step=1)


def test_a_load_fetches_its_manifest_with_one_get_and_no_head(s3_bucket: str) -> None:
    """The manifest of a load is one ranged GET (it was a HEAD to size it, a HEAD in
    ``Store.get``, then the GET); a damaged manifest is still refused."""
    url = f"s3+boto3://{s3_bucket}/mf?part_size={PART}&streams=3"
    state = {"w": np.arange(4096, dtype=np.float32)}
    ckptio.save(state, url, step=1)
    trace = Trace()
    store = open_store(url, trace=trace)
    got = ckptio.load(store, step=1)
    np.testing.assert_array_equal(got["w"], state["w"])
    on_manifest = [e.op for e in trace.events() if e.key.endswith("manifest.json")]
    assert on_manifest == ["get"]
    body = store.get("step-0000000001/manifest.json")
    store.publish("step-0000000001/manifest.json", body[:-10])  # truncated
    with pytest.raises(errors.ManifestError):
        ckptio.load(store, step=1)
    store.close()


def test_an_object_longer_than_its_manifest_says_is_refused(s3_bucket: str) -> None:
    """The objects' sizes are checked while the chunks are read (no HEAD before the first
    GET); an object replaced by a longer one, its chunks intact, is still refused."""
    url = f"s3+boto3://{s3_bucket}/long?part_size={PART}&streams=3"
    ckptio.save({"w": np.arange(1 << 20, dtype=np.float32)}, url, step=1)
    store = open_store(url)
    key = next(k for k in store.list("step-") if k.endswith(".bin"))
    store.publish(key, store.get(key) + b"\0" * 100)
    with pytest.raises(errors.CorruptCheckpointError, match="the manifest says"):
        ckptio.load(store, step=1)
    store.close()


@pytest.mark.parametrize("len_a", [0, 1, 7, 65_536, 100_003])
@pytest.mark.parametrize("len_b", [0, 1, 13, 65_537, 5 * MiB + 3])
def test_crc32c_combine_is_the_crc32c_of_the_concatenation(len_a: int, len_b: int) -> None:
    import crc32c

    from ckptio.checkpoint.crcs import crc32c_combine

    a, b = DATA[:len_a], DATA[len_a : len_a + len_b]
    got = crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len_b)
    assert got == crc32c.crc32c(a + b)


def test_a_load_reads_large_chunks_as_part_sized_gets_and_finds_damage_in_a_middle_part(
    s3_bucket: str, s3_client: Any
) -> None:
    """A chunk longer than ``part_size`` is read as ranged GETs of at most ``part_size``, each
    part's CRC32C computed as it arrives and combined per chunk: the bytes load intact, and a
    byte flipped in a part that is neither a chunk's first nor its last is still found, the
    error naming that chunk's byte range."""
    url = f"s3+boto3://{s3_bucket}/mid?part_size={PART}&streams=3"
    chunk = 12 * MiB + 4096  # three parts: 5 MiB, 5 MiB, 2 MiB + 4 KiB
    w = np.random.default_rng(4).random((2 * chunk // 4096, 1024), dtype=np.float32)
    ckptio.save({"w": w}, url, step=1, chunk_size=chunk)
    trace = Trace()
    store = open_store(url, trace=trace)
    np.testing.assert_array_equal(ckptio.load(store, step=1)["w"], w)
    gets = [e.nbytes for e in trace.events() if e.op == "get" and e.key.endswith(".bin")]
    assert sum(gets) == 2 * chunk and max(gets) <= PART and len(gets) == 6
    key = next(k for k in store.list("step-") if k.endswith(".bin"))
    body = bytearray(store.get(key))
    assert len(body) == 2 * chunk  # one object, two chunks
    body[chunk + PART + 100] ^= 0x01  # the second chunk's middle part
    store.publish(key, bytes(body))
    with pytest.raises(errors.ChecksumError, match=f"bytes {chunk}..{2 * chunk} "):
        ckptio.load(store, step=1)
    store.close()


def _mapped_at(addr: int, nbytes: int) -> bool:
    """Whether the first and the last page of ``nbytes`` at ``addr`` (page-aligned) are mapped."""
    from ckptio.arrays import PAGE, page_mapped

    return page_mapped(addr) and page_mapped(addr + nbytes - PAGE)


def test_a_ranged_get_goes_out_before_its_destination_is_mapped(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mapping fresh memory takes milliseconds of CPU: the GET goes out first, and the pages
    of its destination are mapped in one call once the answer has come, before the body is
    copied in (they overlap the server's sending instead of delaying the request)."""
    from ckptio import arrays
    from ckptio.arrays import address, private_pages

    if not arrays._prefault_works:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    store = _store(s3_bucket)
    assert store._presigned is not None  # botocore's session: the reads' own path
    view = memoryview(private_pages(PART))  # fresh memory: no page mapped
    addr = address(view)
    session = store._presigned._session
    real_send = session.send
    seen: dict[str, bool] = {}

    class Body:
        """The response's socket file; notes whether the destination is mapped when the
        body is first copied in."""

        def __init__(self, fp: Any) -> None:
            self._fp = fp

        def readinto(self, b: Any) -> int:
            seen.setdefault("at the first copy", _mapped_at(addr, PART))
            return int(self._fp.readinto(b))

        def __getattr__(self, name: str) -> Any:
            return getattr(self._fp, name)

    def send(request: Any) -> Any:
        seen["at the request"] = _mapped_at(addr, PART)
        resp = real_send(request)
        resp.raw._fp = Body(resp.raw._fp)
        return resp

    monkeypatch.setattr(session, "send", send)
    assert store.read_into("obj.bin", 0, view) == PART
    assert seen == {"at the request": False, "at the first copy": True}
    assert bytes(view) == DATA[:PART]
    store.close()
