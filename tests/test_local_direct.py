"""The O_DIRECT paths of ``file://``: zero-copy writes of page-aligned memory, staged writes of
anything else, reads straight into aligned memory with staged edges, and the async snapshot
memory that is reused from one save to the next. Content is what is checked; where the
filesystem refuses O_DIRECT the same tests run through the buffered fallback."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest
from ckptio.backends.local import ALIGN, LocalStore

import ckptio
from ckptio.checkpoint import LocalTensor, aligned_empty
from ckptio.checkpoint.snapshot import SnapshotBuffers
from ckptio.checkpoint.write import _pieces

MiB = 1 << 20


def _random(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


def _aligned_copy(data: np.ndarray) -> np.ndarray:
    m = mmap.mmap(-1, -(-data.nbytes // ALIGN) * ALIGN)
    a = np.frombuffer(m, dtype=np.uint8, count=data.nbytes)
    a[:] = data
    return a


@pytest.fixture
def store(tmp_path):
    s = LocalStore(str(tmp_path), direct=True, block_size="256KiB", streams=4)
    yield s
    s.close()


def _read_file(store: LocalStore, key: str) -> bytes:
    with open(store.path_of(key), "rb") as f:
        return f.read()


@pytest.mark.parametrize(
    "layout",
    [
        "aligned",  # page-aligned memory: written as it is
        "unaligned",  # numpy memory at +1 byte: staged
        "mixed",  # small unaligned pieces between aligned ones, odd lengths
    ],
)
def test_direct_writes_store_exactly_the_bytes_given(store, layout):
    parts: list[np.ndarray]
    if layout == "aligned":
        parts = [_aligned_copy(_random(3 * MiB + 4096, 1))]
    elif layout == "unaligned":
        parts = [_random(3 * MiB + 7, 2)[1:]]
    else:
        parts = [
            _random(100, 3),
            _aligned_copy(_random(2 * MiB, 4)),  # lands at an unaligned file offset: staged
            _random(4096 - (2 * MiB + 100) % 4096, 5),  # pads the file to a page
            _aligned_copy(_random(2 * MiB + 123, 6)),  # aligned on both sides: direct + tail
            _random(10, 7),
        ]
    with store.open_writer("obj", size_hint=sum(p.nbytes for p in parts)) as w:
        for p in parts:
            w.write(p)
    expected = b"".join(p.tobytes() for p in parts)
    assert _read_file(store, "obj") == expected
    assert store.list() == ["obj"]


def test_aborted_direct_write_leaves_nothing_and_frees_its_blocks(store):
    w = store.open_writer("gone", size_hint=8 * MiB)
    w.write(_random(5 * MiB + 3)[1:])
    w.abort()
    assert store.list() == [] and store.list_incomplete() == []
    # every staging permit came back: a write needing all of them still completes
    data = _random(8 * MiB, 9)[1:]
    with store.open_writer("after") as w2:
        w2.write(data)
    assert _read_file(store, "after") == data.tobytes()


@pytest.mark.parametrize(
    ("offset", "length", "dst_shift"),
    [
        (0, 3 * MiB, 0),  # all aligned: straight into the destination
        (4096 * 3, 2 * MiB + 5, 0),  # aligned start, odd length: staged tail
        (123, 2 * MiB, 0),  # unaligned start and destination in step: staged head
        (4096, 2 * MiB, 1),  # destination never lines up: everything staged
        (5 * MiB - 1000, 2 * MiB, 0),  # runs past the end: short count
    ],
)
def test_direct_reads_match_the_file(store, offset, length, dst_shift):
    data = _random(5 * MiB, 11)
    with store.open_writer("src") as w:
        w.write(data)
    raw = aligned_empty((length + dst_shift,), np.uint8)
    dst = raw[dst_shift:]
    n = store.read_into("src", offset, dst)
    want = data[offset : offset + length]
    assert n == want.nbytes
    assert np.array_equal(dst[:n], want)


def test_direct_read_of_a_missing_object_is_not_found(store):
    with pytest.raises(FileNotFoundError):
        store.read_into("nope", 0, aligned_empty((2 * MiB,), np.uint8))


def test_aligned_empty_is_page_aligned_for_large_arrays():
    a = aligned_empty((3, MiB), np.float32)
    assert a.shape == (3, MiB) and a.dtype == np.float32 and a.flags.c_contiguous
    assert a.ctypes.data % 4096 == 0


def test_save_from_aligned_empty_arrays_needs_no_staging(tmp_path, monkeypatch):
    """State allocated with ``ckptio.aligned_empty`` goes to the disk as it is; numpy's own
    arrays (not on a page) go through staging blocks."""
    from ckptio.backends._directio import Staging

    import ckptio

    staged: list[int] = []
    new_stage = Staging.new
    monkeypatch.setattr(Staging, "new", lambda self: staged.append(1) or new_stage(self))
    a = ckptio.aligned_empty((4, MiB), np.float32)
    a[...] = np.arange(4 * MiB, dtype=np.float32).reshape(4, MiB)
    ckptio.save({"a": a}, LocalStore(str(tmp_path / "aligned"), direct=True), step=1)
    assert staged == []
    # an array off a page boundary (numpy's own allocation is only sometimes off one)
    raw = np.empty(a.nbytes + 4096, np.uint8)
    off = 16 if (raw.ctypes.data + 16) % 4096 else 32
    b = raw[off : off + a.nbytes].view(np.float32).reshape(a.shape)
    b[...] = a
    assert b.ctypes.data % 4096
    ckptio.save({"b": b}, LocalStore(str(tmp_path / "numpy"), direct=True), step=1)
    assert staged
    assert np.array_equal(ckptio.load(f"file://{tmp_path}/aligned")["a"], a)
    assert np.array_equal(ckptio.load(f"file://{tmp_path}/numpy")["b"], a)


def test_pieces_hold_whole_pages_when_rows_allow():
    arr = np.zeros((1000, 300), dtype=np.float32)  # 1200-byte rows
    pieces = _pieces(LocalTensor("w", arr, arr.shape, (0, 0), True), 400_000)
    assert sum(p.view.shape[0] for p in pieces) == 1000
    assert all(p.view.nbytes % 4096 == 0 for p in pieces[:-1])
    assert [p.offsets[0] for p in pieces] == list(
        np.cumsum([0] + [p.view.shape[0] for p in pieces[:-1]])
    )


def test_snapshot_buffers_are_reused_and_page_aligned():
    bufs = SnapshotBuffers()
    srcs = [np.ones((2 * MiB,), np.uint8), np.ones((10,), np.float64), np.ones((MiB,), np.int32)]
    first = bufs.views(srcs)
    size = bufs.nbytes
    assert [v.shape for v in first] == [s.shape for s in srcs]
    assert [v.dtype for v in first] == [s.dtype for s in srcs]
    assert first[0].ctypes.data % 4096 == 0 and first[2].ctypes.data % 4096 == 0
    second = bufs.views(srcs)
    assert bufs.nbytes == size
    assert second[0].ctypes.data == first[0].ctypes.data  # the same memory again


def test_async_snapshots_isolate_each_save_from_later_updates(tmp_path):
    state = {"w": np.arange(3 * MiB // 4, dtype=np.float32).reshape(-1, 256), "b": np.ones(7)}
    url = "file://" + str(tmp_path)
    with ckptio.Checkpointer(url, async_save=True) as ck:
        h1 = ck.save(state, step=1)
        state["w"] += 1  # training goes on while step 1 is written
        h1.wait()
        h2 = ck.save(state, step=2)
        state["w"] += 1
        h2.wait()
    assert np.array_equal(
        ckptio.load(url, step=1)["w"], np.arange(3 * MiB // 4, dtype=np.float32).reshape(-1, 256)
    )
    assert np.array_equal(
        ckptio.load(url, step=2)["w"],
        np.arange(3 * MiB // 4, dtype=np.float32).reshape(-1, 256) + 1,
    )
    assert ckptio.verify(url, step=2) == []


def test_large_checkpoint_round_trips_through_direct_io(tmp_path):
    rng = np.random.default_rng(5)
    state = {
        "a": rng.standard_normal((700, 1000)).astype(np.float32),  # 4000-byte rows
        "b": rng.standard_normal(1_000_003),
        "c": np.arange(5, dtype=np.int16),
    }
    url = "file://" + str(tmp_path)
    ckptio.save(state, url, step=3, chunk_size="1MiB")
    got = ckptio.load(url)
    for k, v in state.items():
        assert np.array_equal(got[k], v)
    box = ckptio.load(url, select={"a": np.s_[123:456, 7:900]})["a"]
    assert np.array_equal(box, state["a"][123:456, 7:900])
    assert os.listdir(tmp_path) == ["step-0000000003"]


def test_a_large_rank_is_written_as_parallel_objects(tmp_path, monkeypatch):
    from ckptio.checkpoint import write as ck

    monkeypatch.setattr(ck, "PARALLEL_OBJECTS_MIN", MiB)
    rng = np.random.default_rng(8)
    state = {
        f"w{i}": rng.standard_normal((256, 1024)).astype(np.float32) for i in range(4)
    }  # 4 MiB
    url = "file://" + str(tmp_path)
    ckptio.save(state, url, step=1, chunk_size="512KiB")
    reader = ckptio.open_checkpoint(url)
    assert len(reader.manifest.objects) == ck.PARALLEL_OBJECTS
    got = reader.state()
    for k, v in state.items():
        assert np.array_equal(got[k], v)
    assert reader.verify() == []


def _refuse_direct(monkeypatch, name):
    import fcntl

    from ckptio.backends import local

    real = getattr(os, name)

    def fake(fd, *args):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & local.O_DIRECT:
            raise OSError(22, "Invalid argument")
        return real(fd, *args)

    monkeypatch.setattr(local.os, name, fake)


def test_direct_writes_the_filesystem_refuses_go_through_the_page_cache(store, monkeypatch):
    _refuse_direct(monkeypatch, "pwrite")
    data = _aligned_copy(_random(3 * MiB + 11, 12))
    with store.open_writer("obj") as w:
        w.write(data)
    assert _read_file(store, "obj") == data.tobytes()


def test_direct_reads_the_filesystem_refuses_are_read_buffered(store, monkeypatch):
    data = _random(3 * MiB, 13)
    with store.open_writer("obj") as w:
        w.write(data)
    _refuse_direct(monkeypatch, "preadv")
    dst = aligned_empty((3 * MiB,), np.uint8)
    assert store.read_into("obj", 0, dst) == 3 * MiB
    assert np.array_equal(dst, data)
    assert not store.direct_read  # remembered: later reads go buffered at once


def test_many_small_tensors_load_with_few_requests(tmp_path):
    from ckptio.trace import Trace

    rng = np.random.default_rng(21)
    state = {f"w{i}": rng.standard_normal(1000 + i) for i in range(300)}
    url = "file://" + str(tmp_path)
    ckptio.save(state, url, step=1)
    trace = Trace()
    store = LocalStore(str(tmp_path), trace=trace)
    got = ckptio.load(store)
    for k, v in state.items():
        assert np.array_equal(got[k], v)
    data_reads = [e for e in trace.events() if e.op == "get" and "/data/" in e.key]
    assert 0 < len(data_reads) < 30  # 300 chunks, coalesced into requests of up to 16 MiB
    part = ckptio.load(store, select={"w7": np.s_[10:20]})["w7"]
    assert np.array_equal(part, state["w7"][10:20])


def test_aligned_empty_falls_back_when_no_mapping_is_left(monkeypatch):
    import mmap

    def refuse(*a, **k):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    a = aligned_empty((2, MiB), np.float32)
    assert a.shape == (2, MiB) and a.ctypes.data % 4096 == 0
    a[:] = 1.5
    assert float(a.sum()) == 1.5 * 2 * MiB


@pytest.mark.parametrize("size", [5000, 4096 * 3 + 1, 256 * 1024 + 17])
def test_direct_positional_writes_leave_the_declared_size(store, size):
    """A shared file written through O_DIRECT whose ranges end off a page: the unaligned tail
    goes through the page cache, so nothing past the declared size is written (zero padding
    used to grow the file to the next 4096 bytes)."""
    data = _random(size, 7).tobytes()
    split = 4096 if size > 8192 else size  # one writer, or two meeting at a page boundary
    first = store.open_positional("shared.bin", size, create=True)
    first.pwrite(0, data[:split])
    second = store.open_positional("shared.bin", size)
    second.pwrite(split, data[split:])
    second.close()
    first.close()
    assert store.size("shared.bin") == size
    assert _read_file(store, "shared.bin") == data


def test_one_positional_writer_continuing_off_a_page_keeps_its_bytes(store):
    """One writer's ranges, the first ending off a page and the next starting there: the first
    range's tail is not followed by padding that could land over the next range's bytes."""
    data = _random(3 * 4096, 8).tobytes()
    w = store.open_positional("seq.bin", len(data), create=True)
    w.pwrite(0, data[:5000])
    w.pwrite(5000, data[5000:])
    w.close()
    assert _read_file(store, "seq.bin") == data


def test_a_cold_load_keeps_read_depth_direct_reads_in_flight(tmp_path, monkeypatch):
    """``read_depth`` O_DIRECT reads are in flight at once during a load, never more, whatever
    ``streams`` is: the first ``depth`` reads wait for each other at a barrier, which breaks
    (and the test fails) unless that many can be outstanding together."""
    import fcntl
    import threading

    from ckptio.backends import _directio

    depth = 12
    state = {
        f"w{i}": _random(2 * MiB, 30 + i).view(np.float32).reshape(512, 1024) for i in range(8)
    }
    url = f"file://{tmp_path}"
    ckptio.save(state, url, step=1)
    barrier = threading.Barrier(depth, timeout=60)  # a guard against a hang, not a clock
    lock = threading.Lock()
    seen = {"now": 0, "most": 0, "calls": 0, "broken": 0}
    real = os.preadv

    def preadv(fd, buffers, offset, *rest):
        if not fcntl.fcntl(fd, fcntl.F_GETFL) & _directio.O_DIRECT:
            return real(fd, buffers, offset, *rest)
        with lock:
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
            seen["calls"] += 1
            first = seen["calls"] <= depth
        try:
            if first:
                try:
                    barrier.wait()
                except threading.BrokenBarrierError:
                    seen["broken"] += 1
            return real(fd, buffers, offset, *rest)
        finally:
            with lock:
                seen["now"] -= 1

    monkeypatch.setattr(os, "preadv", preadv)
    got = ckptio.load(url, streams=4, read_depth=depth, block_size="256KiB", direct_read=True)
    if seen["calls"] == 0:
        pytest.skip("the filesystem of tmp_path refuses O_DIRECT")
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in state.items()}
    assert seen["broken"] == 0, f"fewer than {depth} direct reads were ever in flight together"
    assert seen["most"] == depth


def test_read_depth_must_be_a_positive_count(tmp_path):
    with pytest.raises(ckptio.errors.InvalidArgumentError, match="read_depth"):
        LocalStore(str(tmp_path), read_depth=0)
