"""Where a read's bytes land: each chunk's place in the arrays (:func:`place`,
:func:`land`), a :meth:`~ckptio.checkpoint.read.CheckpointReader.state` planned before
anything is read (:class:`PlannedState`), and :class:`ObjectSink`, which places an object's
bytes arriving in order from a peer (:mod:`ckptio.checkpoint.peers`) straight into them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.checkpoint.snapshot import crc32c

if TYPE_CHECKING:
    from ckptio.arrays import Target
    from ckptio.checkpoint.read import CheckpointReader

__all__ = ["Job", "ObjectSink", "PlannedState", "land", "place"]

Job = tuple[mf.Chunk, Any]
"""A chunk to read and where it lands: a byte view of contiguous output (a whole chunk), or
``(out, starts, lo, hi)``: the box ``lo..hi`` of the tensor, whose output ``out`` begins at
``starts``."""


def place(job: Job) -> tuple[np.ndarray, tuple[slice, ...], bool]:
    """Where a job's chunk goes: the target view, the box of the chunk it takes, and whether
    the whole chunk lands on contiguous bytes of the target (read straight into it)."""
    chunk, where = job
    if isinstance(where, np.ndarray):  # a whole chunk onto contiguous output bytes
        return where, (), True
    out, starts, lo, hi = where
    dst_box = tuple(slice(a - s, h - s) for a, h, s in zip(lo, hi, starts, strict=True))
    src_box = tuple(slice(a - o, h - o) for a, h, o in zip(lo, hi, chunk.offsets, strict=True))
    target = out[dst_box] if dst_box else out  # out[()] would be a scalar, not a view
    whole = all(b.start == 0 and b.stop == n for b, n in zip(src_box, chunk.shape, strict=True))
    return target, src_box, whole and target.flags.c_contiguous


def land(job: Job, data: np.ndarray) -> None:
    """A chunk's bytes (``data``, uint8, checked) into where ``job`` puts them."""
    target, src_box, direct = place(job)
    if direct:
        np.copyto(target.reshape(-1).view(np.uint8), data)
    else:
        target[...] = data.view(target.dtype).reshape(job[0].shape)[src_box]


class PlannedState:
    """A :meth:`CheckpointReader.state` planned (:meth:`CheckpointReader.plan_state`): the
    objects it reads (:attr:`keys`), a :meth:`sink` for each object whose bytes the caller
    delivers itself, :meth:`read` for the others, then :meth:`finish`."""

    def __init__(
        self,
        reader: CheckpointReader,
        reads: Any,  # the reader's plan of chunk reads (read._Reads)
        targets: Mapping[str, Target],
        views: Mapping[str, np.ndarray],
    ) -> None:
        self.reader, self.reads, self.targets, self.views = reader, reads, targets, views
        self._jobs: dict[str, list[Job]] = {}  # each object's chunk jobs, grouped once
        for job in reads.jobs:
            self._jobs.setdefault(job[0].key, []).append(job)
        self.keys: set[str] = set(self._jobs)
        """The objects the state's chunks are read from."""

    def sink(self, key: str, source: str) -> ObjectSink:
        """Where the bytes of object ``key`` go as they arrive in order (from ``source``, for
        messages), instead of :meth:`read` reading them from the store."""
        return ObjectSink(self.reader, key, self._jobs.get(key, []), source)

    def read(self, skip: Iterable[str] = ()) -> None:
        """Read every chunk from the reader's store but those of the objects in ``skip``
        (delivered through :meth:`sink`), whose sizes are not checked here either."""
        self.reader._sizes_checked.update(skip)
        self.reader._run(self.reads, skip)

    def finish(self) -> Any:
        """The state, once every chunk is in."""
        arrays = self.reads.finish(self.views)
        for t in self.targets.values():
            if t.finish is not None:
                t.finish()
        return fmt.decode_tree(
            self.reader.manifest.tree,
            lambda p: self.targets[p].leaf if p in self.targets else arrays[p],
        )


class ObjectSink:
    """One object's bytes, arriving in order (a stream from a peer, :mod:`ckptio.checkpoint.peers`),
    placed straight into the arrays of a planned read: each wanted chunk's part copied into
    its target as it passes (through a buffer only where the chunk does not land on contiguous
    bytes of it), the chunk's CRC32C continued over those bytes and checked against the
    manifest as its last byte arrives: the same check as a read from a store, end to end.
    Bytes of chunks not wanted only pass."""

    def __init__(self, reader: CheckpointReader, key: str, jobs: list[Job], source: str) -> None:
        self.reader, self.key, self.source = reader, key, source
        self.jobs = sorted(jobs, key=lambda j: j[0].offset)
        self._i = 0
        self._crc = 0
        self._buf: np.ndarray | None = None  # the current chunk's bytes, where not in place

    def view(self, pos: int, n: int) -> np.ndarray | None:
        """Where the object's next bytes ``pos .. pos + n`` may be received in place: the
        target's bytes when they all fall in one wanted chunk that lands on contiguous bytes
        of it (then :meth:`write` finds them there and copies nothing), else None."""
        if self._i >= len(self.jobs):
            return None
        job = self.jobs[self._i]
        c = job[0]
        if not (c.offset <= pos and pos + n <= c.offset + c.length):
            return None
        target, _, direct = place(job)
        if not direct:
            return None
        return target.reshape(-1).view(np.uint8)[pos - c.offset : pos - c.offset + n]

    def write(self, pos: int, data: np.ndarray) -> None:
        """The object's bytes ``pos .. pos + len(data)`` (uint8), the next in order (received
        where :meth:`view` said, or elsewhere)."""
        end = pos + len(data)
        while self._i < len(self.jobs):
            job = self.jobs[self._i]
            c = job[0]
            if c.offset >= end:
                return
            lo, hi = max(c.offset, pos), min(c.offset + c.length, end)
            part = data[lo - pos : hi - pos]
            self._crc = crc32c(part, self._crc)
            target, _, direct = place(job)
            if direct:
                dst = target.reshape(-1).view(np.uint8)
            else:
                if self._buf is None:
                    self._buf = self.reader._allocate((c.length,), np.dtype(np.uint8), c.key)
                dst = self._buf
            into = dst[lo - c.offset : hi - c.offset]
            if into.ctypes.data != part.ctypes.data:  # else received in place
                np.copyto(into, part)
            if hi < c.offset + c.length:
                return  # the chunk goes on in the next piece
            if self._crc != c.crc32c:
                raise errors.ChecksumError(
                    f"{self.key} from {self.source}: CRC32C mismatch in bytes {c.offset}.."
                    f"{c.offset + c.length} (expected {c.crc32c:#010x}, received "
                    f"{self._crc:#010x}): the copy is damaged"
                )
            if not direct:
                land(job, dst)
            self._i, self._crc, self._buf = self._i + 1, 0, None

    def close(self) -> None:
        """The stream's end: raise unless every wanted chunk arrived whole."""
        if self._i < len(self.jobs):
            c = self.jobs[self._i][0]
            raise errors.CorruptCheckpointError(
                f"{self.key} from {self.source}: ended before bytes {c.offset}..{c.offset + c.length} "
                "(truncated object)"
            )
