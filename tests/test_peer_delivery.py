"""A peer restore's received bytes delivered straight into a planned read's arrays
(:class:`ckptio.checkpoint.sink.ObjectSink` fed by :func:`ckptio.checkpoint.peers.receive_objects`),
on a real checkpoint: bit-identical whole and resharded (boxes that cut chunks), and a byte
changed in transit refused by the chunk's CRC32C even where the sender's own checksum of the
stream agrees with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio import format as fmt
from ckptio.checkpoint.peers import _DATA, receive_objects, send_objects
from ckptio.checkpoint.read import CheckpointReader, read_manifest
from ckptio.checkpoint.snapshot import crc32c
from ckptio.registry import open_store

W = np.random.default_rng(7).standard_normal((600, 40), dtype=np.float32)
B = np.linspace(0, 1, 37)


class ListWire:
    """The messages one rank sends another, kept in order (one process plays both ends)."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, np.ndarray]] = []
        self.in_place = 0
        """Messages received where ``recv``'s ``place`` put them (the arrays)."""

    def send(self, dest: int, data: Any, kind: int = 0) -> None:
        self.messages.append((kind, np.frombuffer(bytes(data), dtype=np.uint8)))

    def recv(self, source: int, place: Any = None) -> tuple[int, np.ndarray]:
        kind, data = self.messages.pop(0)
        into = place(kind, data.size) if place is not None else None
        if into is None:
            return kind, data.copy()
        into[...] = data  # as MPI's receive into a buffer given
        self.in_place += 1
        return kind, into


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Any, Any]:
    url = f"file://{tmp_path}/ckpt"
    with ckptio.Checkpointer(url, chunk_size=16 * 1024, max_object_size=32 * 1024) as ck:
        ck.save({"model": {"w": W, "bias": B}, "step": 5}, 5)
        ck.wait()
    store = open_store(url)
    return store, read_manifest(store, 5)


def stream(store: Any, manifest: Any, keys: list[str]) -> ListWire:
    w = ListWire()
    sent, err = send_objects(w, 1, store, fmt.step_dir(5) + "/", manifest, keys, {"step": 5})
    assert not err and sent == sum(manifest.objects[k] for k in keys)
    return w


@pytest.mark.parametrize(
    "select", [None, {"model/w": np.s_[77:411, 3:29]}], ids=["whole", "resharded-box"]
)
def test_received_objects_land_in_the_arrays_bit_identical(
    saved: tuple[Any, Any], tmp_path: Path, select: Any
) -> None:
    """Every object arrives over the wire; the reader's own store is empty (anything it read
    there would be missing): the state comes from the stream alone, bit-identical, and the
    received objects are kept, byte for byte, where the receiver writes them."""
    store, manifest = saved
    empty = open_store(f"file://{tmp_path}/empty")
    planned = CheckpointReader(empty, 5, manifest).plan_state(select)
    keys = sorted(planned.keys)
    assert len(keys) > 1
    w = stream(store, manifest, keys)
    fast = open_store(f"file://{tmp_path}/fast")
    sinks = {k: planned.sink(k, "rank 0") for k in keys}
    _, kept, error = receive_objects(w, 0, fast, "step-0000000005/", sinks=sinks)
    assert error == "" and sorted(kept) == keys
    planned.read(skip=sinks)
    got = planned.finish()
    want = W if select is None else W[77:411, 3:29]
    assert np.array_equal(got["model"]["w"], want) and np.array_equal(got["model"]["bias"], B)
    for k in keys:
        assert (tmp_path / "fast/step-0000000005" / k).read_bytes() == (
            tmp_path / "ckpt/step-0000000005" / k
        ).read_bytes()


def test_pieces_inside_a_chunk_are_received_in_the_array_itself(tmp_path: Path) -> None:
    """A 24 MiB tensor in large chunks: its 8 MiB pieces each fall inside one chunk that
    lands on contiguous bytes of the array, and are received there (no copy after), the
    chunks' CRC32C still checked; bit-identical, and the fast root's copy whole."""
    big = np.random.default_rng(3).standard_normal(6 << 20, dtype=np.float32)
    url = f"file://{tmp_path}/ckpt"
    with ckptio.Checkpointer(url) as ck:
        ck.save({"big": big}, 5)
        ck.wait()
    store = open_store(url)
    manifest = read_manifest(store, 5)
    out = np.zeros_like(big)
    planned = CheckpointReader(open_store(f"file://{tmp_path}/empty"), 5, manifest).plan_state(
        into={"big": out}
    )
    keys = sorted(planned.keys)
    w = stream(store, manifest, keys)
    sinks = {k: planned.sink(k, "rank 0") for k in keys}
    fast = open_store(f"file://{tmp_path}/fast")
    _, kept, error = receive_objects(w, 0, fast, "step-0000000005/", sinks=sinks)
    assert error == "" and sorted(kept) == keys
    assert w.in_place >= 2
    got = planned.finish()
    assert got["big"] is out and np.array_equal(out, big)
    # what the restore publishes once the objects are in (run_restore): a whole copy
    fast.publish(fmt.manifest_key(5), store.get(fmt.manifest_key(5)))
    assert ckptio.load(f"file://{tmp_path}/fast", step=5)["big"].tobytes() == big.tobytes()


def test_a_byte_changed_in_transit_is_refused_by_the_chunk_crc(
    saved: tuple[Any, Any], tmp_path: Path
) -> None:
    """One byte of a piece changed after the sender's checks, with the stream's trailer made
    to agree (a sender whose memory flipped a bit, or a hostile one): the object's own
    CRC32C passes, the chunk's CRC32C from the manifest does not; the error names it and
    nothing of the stream is kept."""
    store, manifest = saved
    empty = open_store(f"file://{tmp_path}/empty")
    planned = CheckpointReader(empty, 5, manifest).plan_state()
    keys = sorted(planned.keys)
    w = stream(store, manifest, keys)
    # the first object's first piece, and the trailer after it
    i = next(n for n, (kind, _) in enumerate(w.messages) if kind == _DATA)
    piece = w.messages[i][1].copy()
    piece[100] ^= 0xFF
    w.messages[i] = (_DATA, piece)
    assert w.messages[i + 1][0] != _DATA  # 32 KiB objects: one piece each
    trailer = f'{{"crc32c":{crc32c(piece)}}}'.encode()
    w.messages[i + 1] = (0, np.frombuffer(trailer, dtype=np.uint8))
    fast = open_store(f"file://{tmp_path}/fast")
    sinks = {k: planned.sink(k, "rank 0") for k in keys}
    _, kept, error = receive_objects(w, 0, fast, "step-0000000005/", sinks=sinks)
    assert kept == {} and "CRC32C mismatch" in error and keys[0] in error, error
    assert not w.messages  # the stream was read to its end: the sender is not left waiting
    assert fast.list("step-0000000005/") == []
