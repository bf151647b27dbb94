"""Reading committed checkpoints: :class:`CheckpointReader`, manifests, steps, load, verify.

- A load reads only the chunks that overlap what is asked for, straight into the output where
  a chunk lands on contiguous bytes; small neighbouring chunks of one object are fetched with
  one request (:data:`COALESCE_CHUNK_BYTES`, :data:`COALESCE_REQUEST_BYTES`).
- Before allocating anything it checks that this machine can hold what it will allocate
  (:func:`ckptio.arrays.ensure_memory`), and each object's size against the manifest while
  the first chunks are read: a hostile or truncated checkpoint fails with a clear error
  naming the object and both sizes, not an out-of-memory kill (a declaration larger than
  the machine is checked against the objects before the memory error is raised).
- Every chunk's CRC32C is checked; a mismatch names the object and byte range.
- "The newest checkpoint" is the newest that loads: one whose manifest does not validate is
  skipped with a logged warning, one whose manifest stays but an object of which is missing or
  unreadable with a :class:`~ckptio.errors.DamagedCheckpointWarning` (``load``; an explicit
  ``step`` raises instead), and a step retired by retention while it is opened or read makes
  the reader list the steps again (:data:`RELISTS` times). A damaged step is never loaded."""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.arrays import Target, as_target, ensure_memory
from ckptio.checkpoint.crcs import PiecedChunk, crc32c_zeros
from ckptio.checkpoint.sink import Job, PlannedState, land, place
from ckptio.checkpoint.snapshot import Shard, aligned_empty, crc32c
from ckptio.registry import open_store
from ckptio.store import Store, as_byte_view, wait_all

log = logging.getLogger(__name__)

__all__ = [
    "COALESCE_CHUNK_BYTES",
    "COALESCE_REQUEST_BYTES",
    "MANIFEST_FIRST_READ",
    "VERIFY_BLOCK_BYTES",
    "CheckpointReader",
    "Index",
    "committed_steps",
    "load",
    "open_checkpoint",
    "read_manifest",
    "verify",
]

VERIFY_BLOCK_BYTES = 16 << 20
"""Bytes: ``verify`` reads a larger chunk in blocks of this size, its CRC32C continued from
block to block, so it holds at most ``readers`` blocks whatever size a manifest declares."""


COALESCE_CHUNK_BYTES = 1 << 20
"""Bytes: chunks smaller than this that lie next to each other in an object are loaded with
one request per up to :data:`COALESCE_REQUEST_BYTES` (many small tensors: no per-chunk
request)."""


COALESCE_REQUEST_BYTES = 16 << 20


Index = tuple[slice | int, ...]


def _normalize(
    index: Any, shape: tuple[int, ...], path: str
) -> tuple[list[int], list[int], list[bool]]:
    """(starts, stops, keep_dim) for a basic index; only unit-step slices and ints."""
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) > len(shape):
        raise errors.InvalidArgumentError(
            f"{path}: index {index} has more dimensions than shape {shape}"
        )
    index = index + (slice(None),) * (len(shape) - len(index))
    starts, stops, keep = [], [], []
    for d, (ix, n) in enumerate(zip(index, shape, strict=True)):
        if isinstance(ix, slice):
            a, b, s = ix.indices(n)
            if s != 1:
                raise errors.InvalidArgumentError(
                    f"{path}: only unit-step slices can be loaded (dim {d})"
                )
            starts.append(a)
            stops.append(max(a, b))
            keep.append(True)
        elif isinstance(ix, int | np.integer):
            i = int(ix) + n if ix < 0 else int(ix)
            if not 0 <= i < n:
                raise errors.InvalidArgumentError(
                    f"{path}: index {ix} out of range for dim {d} of size {n}"
                )
            starts.append(i)
            stops.append(i + 1)
            keep.append(False)
        else:
            raise errors.InvalidArgumentError(
                f"{path}: unsupported index {ix!r} (use slices and ints)"
            )
    return starts, stops, keep


@dataclass
class _Reads:
    """What :meth:`CheckpointReader.read_many` reads, and into what."""

    jobs: list[Job] = field(default_factory=list)
    results: dict[str, np.ndarray] = field(default_factory=dict)
    finals: dict[str, list[bool]] = field(default_factory=dict)
    """Path -> the dimensions its result keeps (an int index drops one)."""
    copy_back: list[tuple[np.ndarray, str]] = field(default_factory=list)
    """``into=`` arrays read through a new array (strided ones), copied once read."""

    def finish(self, into: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The results once every job has run: int-indexed dimensions dropped, strided
        ``into=`` arrays filled, and the ``into=`` arrays themselves returned."""
        results = self.results
        for path, keep in self.finals.items():
            if not all(keep):
                results[path] = results[path].reshape(
                    tuple(n for n, k in zip(results[path].shape, keep, strict=True) if k)
                )
        for dest, path in self.copy_back:
            np.copyto(dest, results[path])
        for path, dest in into.items():
            results[path] = dest
        return results


def _row_jobs(entry: mf.TensorEntry, out: np.ndarray) -> list[Job] | None:
    """A whole tensor whose chunks are split along dim 0 (how ckptio writes them): each chunk
    lands on contiguous rows of ``out``, with no box arithmetic. None for other chunkings."""
    rows = [c for c in entry.chunks if c.shape[1:] == entry.shape[1:]]
    if not (len(rows) == len(entry.chunks) and all(not any(c.offsets[1:]) for c in rows)):
        return None
    flat = out.reshape(entry.shape[0], -1) if out.ndim else out.reshape(1, -1)
    jobs: list[Job] = []
    for c in rows:
        o = c.offsets[0] if c.offsets else 0
        n = c.shape[0] if c.shape else 1
        jobs.append((c, flat[o : o + n].reshape(-1).view(np.uint8)))
    return jobs


def _box_jobs(
    entry: mf.TensorEntry,
    out: np.ndarray,
    starts: list[int],
    stops: list[int],
    shape: tuple[int, ...],
) -> list[Job]:
    """The chunks of ``entry`` that overlap the box ``starts..stops`` (read into ``out``,
    of that box's ``shape``), each with the part of it that is wanted."""
    jobs: list[Job] = []
    for chunk in entry.chunks:
        lo = [max(a, o) for a, o in zip(starts, chunk.offsets, strict=True)]
        hi = [min(b, o + n) for b, o, n in zip(stops, chunk.offsets, chunk.shape, strict=True)]
        if math.prod(shape) == 0 or any(h <= a for a, h in zip(lo, hi, strict=True)):
            continue  # nothing of this chunk is wanted
        jobs.append((chunk, (out, starts, lo, hi)))
    return jobs


def _coalesce(jobs: list[Job]) -> tuple[list[Job], list[list[Job]]]:
    """The jobs read one request each (chunks of :data:`COALESCE_CHUNK_BYTES` and more), and
    groups of small chunks that lie next to each other in one object, each group read with one
    request of at most :data:`COALESCE_REQUEST_BYTES`."""
    singles: list[Job] = []
    small: dict[str, list[Job]] = {}
    for job in jobs:
        if job[0].length < COALESCE_CHUNK_BYTES:
            small.setdefault(job[0].key, []).append(job)
        else:
            singles.append(job)
    groups: list[list[Job]] = []
    for group_jobs in small.values():
        group_jobs.sort(key=lambda j: j[0].offset)
        group: list[Job] = []
        g_start = g_end = 0
        for job in group_jobs:
            c = job[0]
            if group and (
                c.offset < g_end  # never, chunks do not share bytes; but stay exact
                or c.offset - g_end > fmt.ALIGNMENT
                or c.offset + c.length - g_start > COALESCE_REQUEST_BYTES
            ):
                groups.append(group)
                group = []
            if not group:
                g_start = c.offset
            group.append(job)
            g_end = max(g_end, c.offset + c.length)
        if group:
            groups.append(group)
    return singles, groups


class CheckpointReader:
    """A committed checkpoint opened for reading: its manifest and the data behind it.

    ``read(path, index)`` reads a box of one tensor, fetching only the chunks that overlap it
    and checking each chunk's CRC32C. ``state(select)`` rebuilds the saved structure.
    """

    def __init__(self, store: Store, step: int, manifest: mf.Manifest, *, readers: int = 8) -> None:
        self.store = store
        self.step = step
        self.manifest = manifest
        self.readers = readers
        self._prefix = fmt.step_dir(step) + "/"
        self._sizes_checked: set[str] = set()
        self.hugetlb = False
        """The arrays a read returns go on the kernel's hugetlb pool where it has the pages
        (``load(..., hugetlb=True)``; see :func:`load`)."""

    @property
    def metadata(self) -> Any:
        return self.manifest.metadata

    def _read_chunk_into(self, chunk: mf.Chunk, out: memoryview) -> None:
        n = self._read_object(chunk.key, chunk.offset, out)
        self._check_chunk(chunk, n, out)

    def _read_object(self, key: str, offset: int, out: memoryview) -> int:
        """``store.read_into`` of one of the step's objects; one that is gone (or is no
        regular file) is damage to the checkpoint, raised as such, never taken for a missing
        argument (a load falls back past damage: :func:`read_newest`)."""
        try:
            return self.store.read_into(self._prefix + key, offset, out)
        except FileNotFoundError as err:
            raise errors.CorruptCheckpointError(
                f"{self.store.url}/{self._prefix}{key}: missing ({err})"
            ) from err

    def _check_chunk(self, chunk: mf.Chunk, n: int, data: Any, *, crc: int | None = None) -> None:
        """Raise unless ``n`` (bytes read) is the chunk's length and ``data`` (or ``crc``, the
        CRC32C of what was read) its CRC32C."""
        key = self._prefix + chunk.key
        if n != chunk.length:
            raise errors.CorruptCheckpointError(
                f"{self.store.url}/{key}: bytes {chunk.offset}..{chunk.offset + chunk.length} "
                f"requested, object ends after {chunk.offset + n} (truncated object)"
            )
        got = crc32c(data) if crc is None else crc
        if got != chunk.crc32c:
            raise errors.ChecksumError(
                f"{self.store.url}/{key}: CRC32C mismatch in bytes {chunk.offset}..{chunk.offset + chunk.length} "
                f"(expected {chunk.crc32c:#010x}, read {got:#010x}): the object is damaged"
            )

    def _check_sizes(self, keys: Iterable[str]) -> None:
        """Raise CorruptCheckpointError unless each object's size is what the manifest says
        (one HEAD/stat per object, once per reader)."""
        todo = sorted(set(keys) - self._sizes_checked)
        if not todo:
            return

        def size(key: str) -> int | None:
            try:
                return self.store.size(self._prefix + key)
            except errors.NotRegularFileError as err:  # a FIFO, say: never read
                raise errors.CorruptCheckpointError(
                    f"{self.store.url}/{self._prefix}{key}: {err.strerror}"
                ) from None
            except FileNotFoundError:
                return None

        if len(todo) == 1:
            actual = [size(todo[0])]
        else:
            with ThreadPoolExecutor(
                min(self.readers, len(todo)), thread_name_prefix="ckptio-read"
            ) as pool:
                actual = list(pool.map(size, todo))
        for key, got in zip(todo, actual, strict=True):
            want = self.manifest.objects[key]
            if got is None:
                raise errors.CorruptCheckpointError(
                    f"{self.store.url}/{self._prefix}{key}: missing"
                )
            if got != want:
                raise errors.CorruptCheckpointError(
                    f"{self.store.url}/{self._prefix}{key}: {got} bytes, the manifest says {want}; "
                    "refusing to load (truncated, replaced or hostile checkpoint)"
                )
        self._sizes_checked.update(todo)

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype[Any], what: str) -> np.ndarray:
        try:
            return aligned_empty(shape, dtype, hugetlb=self.hugetlb)
        except MemoryError:  # the address-space limit (ulimit -v), or overcommit refused it
            raise errors.InsufficientMemoryError(
                f"step {self.step}: cannot allocate {math.prod(shape) * dtype.itemsize} bytes for {what!r}"
            ) from None

    def read(self, path: str, index: Any = None) -> np.ndarray:
        """Tensor ``path`` (or the box ``index`` of it: ints and unit-step slices)."""
        return self.read_many({path: index})[path]

    def read_many(
        self, wanted: Mapping[str, Any], *, into: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Several tensors (or boxes of them), their chunks read in parallel. ``into`` maps
        some of those paths to writable arrays of the result's shape and dtype (checked by
        the caller), which are filled in place and returned instead of new arrays.

        The objects' sizes are checked against the manifest (a HEAD each on an object store)
        while the first chunks are read, not before: their round trip no longer delays the
        first read. A size that differs is the error raised, whatever the reads found; and
        where what would be allocated exceeds this machine, the sizes are checked first, so
        a hostile declaration is named as such (:meth:`_check_sizes`)."""
        into = into or {}
        reads = self._prepare(wanted, into)
        self._run(reads)
        return reads.finish(into)

    def _prepare(self, wanted: Mapping[str, Any], into: Mapping[str, np.ndarray]) -> _Reads:
        """The first half of :meth:`read_many`: the arrays allocated (not touched yet, after
        checking that this machine holds them and the read buffers) and the chunk reads that
        fill them."""
        self._check_wanted(wanted)
        keys = {c.key for p in wanted for c in self.manifest.tensors[p].chunks}
        # this machine can hold the arrays to be allocated: else a clear error before allocating
        need = self._allocation(wanted, into)
        what = f"loading step {self.step} ({len(wanted)} tensor(s))"
        self._ensure_memory(need, what, keys)
        reads = self._plan(wanted, into)
        singles, groups = _coalesce(reads.jobs)
        # the read buffers too, before any is taken (the arrays above are not touched yet)
        buffers = self._buffer_bytes(singles, groups)
        if buffers:
            self._ensure_memory(need + buffers, what, keys)
        return reads

    def _run(self, reads: _Reads, skip: Iterable[str] = ()) -> None:
        """The second half of :meth:`read_many`: every job of ``reads`` run, but those of the
        objects in ``skip`` (delivered otherwise: :class:`~ckptio.checkpoint.sink.ObjectSink`)."""
        skip = set(skip)
        jobs = [j for j in reads.jobs if j[0].key not in skip]
        keys = {j[0].key for j in jobs}
        singles, groups = _coalesce(jobs)
        tasks: list[tuple[Callable[[Any], None], Any]] = []
        piece = self._piece_bytes()
        for job in singles:
            target, _, direct = place(job)
            if direct and piece and job[0].length > piece:
                whole = PiecedChunk(job[0], as_byte_view(target), piece)
                tasks += [(self._read_piece, (whole, i)) for i in range(len(whole.spans))]
            else:
                tasks.append((self._read_job, job))
        tasks += [(self._read_group, g) for g in groups]
        with ThreadPoolExecutor(1, thread_name_prefix="ckptio-read") as sizer:
            checked = sizer.submit(self._check_sizes, keys)
            if len(tasks) <= 1:
                try:
                    for fn, arg in tasks:
                        fn(arg)
                finally:
                    wait_all([checked])  # a size that differs names the damage first
            else:
                with ThreadPoolExecutor(
                    min(self.readers, len(tasks)), thread_name_prefix="ckptio-read"
                ) as pool:
                    wait_all([checked, *(pool.submit(fn, arg) for fn, arg in tasks)])

    def _ensure_memory(self, nbytes: int, what: str, keys: Iterable[str]) -> None:
        """:func:`ensure_memory`; where it refuses, the objects' sizes are checked first: a
        manifest that declares more than an object holds is refused as damage, not as a
        shortage of memory."""
        try:
            ensure_memory(nbytes, what)
        except errors.InsufficientMemoryError:
            self._check_sizes(keys)
            raise

    def _check_wanted(self, wanted: Mapping[str, Any]) -> None:
        """Raise unless every wanted path is a tensor of this step."""
        unknown = [p for p in wanted if p not in self.manifest.tensors]
        if unknown:
            raise errors.NotFoundError(f"step {self.step} has no tensor {unknown[0]!r}")

    def _allocation(self, wanted: Mapping[str, Any], into: Mapping[str, np.ndarray]) -> int:
        """Bytes of the arrays a read of ``wanted`` allocates: the declared bytes of what is
        read, less what ``into`` receives in place."""
        need = 0
        for path, index in wanted.items():
            entry = self.manifest.tensors[path]
            dest = into.get(path)
            if dest is None or not dest.flags.c_contiguous:
                starts, stops, _ = _normalize(() if index is None else index, entry.shape, path)
                need += (
                    math.prod(b - a for a, b in zip(starts, stops, strict=True))
                    * entry.np_dtype.itemsize
                )
        return need

    def _plan(self, wanted: Mapping[str, Any], into: Mapping[str, np.ndarray]) -> _Reads:
        """The output arrays (allocated, not touched yet) and the chunk reads that fill them."""
        reads = _Reads()

        def destination(path: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
            dest = into.get(path)
            if dest is not None and dest.flags.c_contiguous:
                return dest.reshape(shape)  # a view: only unit dims of an int index differ
            if dest is not None:
                reads.copy_back.append((dest, path))  # strided (a transposed view): read, copy
            return self._allocate(shape, dtype, path)

        for path, index in wanted.items():
            entry = self.manifest.tensors[path]
            if index is None and entry.chunks and math.prod(entry.shape) > 0:
                out = destination(path, entry.shape, entry.np_dtype)
                reads.results[path] = out
                rows = _row_jobs(entry, out)
                if rows is not None:
                    reads.jobs.extend(rows)
                    continue
                index = ()
            starts, stops, keep = _normalize(() if index is None else index, entry.shape, path)
            shape = tuple(b - a for a, b in zip(starts, stops, strict=True))
            out = (
                reads.results[path]
                if path in reads.results
                else destination(path, shape, entry.np_dtype)
            )  # every element is read: chunks tile it
            reads.results[path] = out
            reads.finals[path] = keep
            reads.jobs.extend(_box_jobs(entry, out, starts, stops, shape))
        return reads

    def _buffer_bytes(self, singles: list[Job], groups: list[list[Job]]) -> int:
        """Bytes of the read buffers in use at once: one per reader, of a whole chunk that
        does not land in place, or of a group."""
        partial = sorted((job[0].length for job in singles if not place(job)[2]), reverse=True)
        grouped = min(len(groups), self.readers) * COALESCE_REQUEST_BYTES
        return sum(partial[: self.readers]) + grouped

    def _piece_bytes(self) -> int:
        """Bytes per read of a large chunk on an object store (its ``request_size``: a ranged
        GET), or 0 where a chunk is read with one ``read_into`` (a local or parallel
        filesystem, whose ``read_into`` keeps its own reads in flight, or memory).

        On an object store the load splits each large chunk itself into ranged reads of that
        size, all chunks' pieces in one queue in chunk order: every reader stays busy across
        chunk and object boundaries, the chunks complete in order, and each piece's CRC32C
        is computed by the thread that received it while the network is still busy with
        later pieces; a chunk's CRC is those combined (:func:`~ckptio.checkpoint.crcs.crc32c_combine`), checked as
        its last piece arrives. The CRC left after the last GET is one piece's, not one
        chunk's (measured in ``benchmarks/s3_peers.py``, ``ckptio-load-*``)."""
        info = self.store.describe()
        return info.request_size if info.local_path is None and not info.emulated else 0

    def _read_piece(self, arg: tuple[PiecedChunk, int]) -> None:
        """One piece of a large chunk into its slice of the output, its CRC32C computed here;
        the thread that completes the chunk combines the pieces' CRCs and checks the chunk."""
        whole, i = arg
        start, n = whole.spans[i]
        got = self._read_object(
            whole.chunk.key, whole.chunk.offset + start, whole.out[start : start + n]
        )
        crc = crc32c(whole.out[start : start + got]) if got else 0
        done = whole.piece_done(i, got, crc)
        if done is not None:
            self._check_chunk(whole.chunk, done[0], None, crc=done[1])

    def _read_job(self, job: Job) -> None:
        """Read one chunk: straight into its target, or through a buffer when only part of it
        is wanted or the target is not contiguous."""
        chunk = job[0]
        target, _, direct = place(job)
        if direct:
            self._read_chunk_into(chunk, as_byte_view(target))
            return
        tmp = self._allocate((chunk.length,), np.dtype(np.uint8), chunk.key)
        self._read_chunk_into(chunk, as_byte_view(tmp))
        land(job, tmp)

    def _read_group(self, group: list[Job]) -> None:
        """Neighbouring small chunks of one object: one request, then each copied out."""
        start = group[0][0].offset
        end = max(c.offset + c.length for c, _ in group)
        buf = aligned_empty((end - start,), np.uint8)
        n = self._read_object(group[0][0].key, start, as_byte_view(buf))
        for job in group:
            chunk = job[0]
            a = chunk.offset - start
            data = buf[a : a + chunk.length]
            self._check_chunk(chunk, max(0, min(n - a, chunk.length)), data)
            land(job, data)

    def state(self, select: Mapping[str, Any] | None = None, *, into: Any = None) -> Any:
        """The saved structure with every tensor read (``select``: path -> index, to read
        only a box of some tensors; other tensors are read whole).

        ``into``: a state whose arrays are filled in place (see :func:`ckptio.load`)."""
        planned = self.plan_state(select, into=into)
        planned.read()
        return planned.finish()

    def plan_state(
        self, select: Mapping[str, Any] | None = None, *, into: Any = None
    ) -> PlannedState:
        """:meth:`state` before anything is read: its arrays allocated and the chunk reads
        that fill them planned, so that some objects' bytes can be delivered by the caller
        as they arrive (:meth:`~ckptio.checkpoint.sink.PlannedState.sink`) while the others are read."""
        select = dict(select or {})
        unknown = set(select) - set(self.manifest.tensors)
        if unknown:
            raise errors.NotFoundError(
                f"step {self.step} has no tensor(s) {sorted(unknown)}; it has {sorted(self.manifest.tensors)[:20]}"
            )
        paths = list(fmt.tree_tensor_paths(self.manifest.tree))
        boxes: dict[str, Any] = {}  # the boxes that Shard leaves of into= name
        targets = self._targets(into, select, boxes) if into is not None else {}
        views = {p: t.view for p, t in targets.items()}
        reads = self._prepare({p: boxes.get(p, select.get(p)) for p in paths}, views)
        return PlannedState(self, reads, targets, views)

    def _targets(
        self, into: Any, select: Mapping[str, Any], boxes: dict[str, Any]
    ) -> dict[str, Target]:
        """The arrays of ``into`` by tensor path, each checked against what will be read;
        the box each :class:`Shard` leaf names goes into ``boxes``."""
        targets: dict[str, Target] = {}

        def on_array(path: str, leaf: Any) -> Any:
            if isinstance(leaf, np.generic):
                return None
            target = as_target(leaf.array if isinstance(leaf, Shard) else leaf, path)
            if target is None:
                if isinstance(leaf, Shard):
                    raise errors.InvalidArgumentError(
                        f"into= at {path!r}: the Shard does not hold an array"
                    )
                return None
            entry = self.manifest.tensors.get(path)
            if entry is None:
                raise errors.NotFoundError(
                    f"into= holds an array at {path!r}, but step {self.step} has no tensor {path!r}"
                )
            shape = entry.shape
            if isinstance(leaf, Shard):
                target.leaf = leaf
                boxes[path] = self._shard_box(path, leaf, target.view.shape, entry.shape, select)
                shape = target.view.shape
            elif path in select:
                starts, stops, keep = _normalize(select[path], entry.shape, path)
                shape = tuple(b - a for a, b, k in zip(starts, stops, keep, strict=True) if k)
            got = target.view
            if got.shape != shape or got.dtype != entry.np_dtype:
                raise errors.InvalidArgumentError(
                    f"into= at {path!r} is {got.dtype} {tuple(got.shape)}; step {self.step} holds "
                    f"{entry.np_dtype} {shape}"
                    + (f" (select={select[path]!r})" if path in select else "")
                )
            targets[path] = target
            return {"t": path}

        fmt.encode_tree(into, on_array)
        return targets

    def _shard_box(
        self,
        path: str,
        shard: Shard,
        shape: tuple[int, ...],
        stored: tuple[int, ...],
        select: Mapping[str, Any],
    ) -> tuple[slice, ...]:
        """The box of the stored tensor that ``shard`` (an ``into=`` leaf) is to hold."""
        if path in select:
            raise errors.InvalidArgumentError(
                f"into= at {path!r} is a Shard, which names its own box; do not select {path!r} as well"
            )
        gshape = tuple(int(x) for x in shard.global_shape)
        offsets = tuple(int(x) for x in shard.offsets)
        if gshape != stored:
            raise errors.InvalidArgumentError(
                f"into= at {path!r} is a Shard of a tensor of shape {gshape}; step {self.step} holds {stored}"
            )
        if len(offsets) != len(shape) or any(
            o < 0 or o + n > g for o, n, g in zip(offsets, shape, gshape, strict=True)
        ):
            raise errors.InvalidArgumentError(
                f"into= at {path!r}: a box of shape {shape} at offsets {offsets} does not fit the shape {gshape}"
            )
        return tuple(slice(o, o + n) for o, n in zip(offsets, shape, strict=True))

    def verify(self, progress: Callable[[int], None] | None = None) -> list[str]:
        """Re-read every object and check sizes and every chunk's CRC. Returns the problems
        found (empty: the checkpoint is intact). ``progress(n)`` is called (in this thread)
        as the chunks of ``n`` declared bytes are checked.

        Bounded by what is stored, not by what the manifest declares: it holds at most
        ``readers`` buffers of :data:`VERIFY_BLOCK_BYTES`, and of a sparse object (a file
        whose declared size is mostly holes, :meth:`~ckptio.store.Store.stored_ranges`) it
        reads only the bytes stored, the CRC of each hole's zeros computed
        (:func:`~ckptio.checkpoint.crcs.crc32c_zeros`): a manifest declaring terabytes over a sparse file is answered
        in the time its few stored bytes take."""
        problems: list[str] = []
        sizes: dict[str, int] = {}
        for key, size in self.manifest.objects.items():
            try:
                actual = self.store.size(self._prefix + key)
            except (errors.NotRegularFileError, errors.StoragePermissionError) as err:  # refused
                problems.append(f"{self._prefix}{key}: {err.strerror}")
                continue
            except FileNotFoundError:
                problems.append(f"{self._prefix}{key}: missing")
                continue
            sizes[key] = actual
            if actual != size:
                problems.append(f"{self._prefix}{key}: {actual} bytes, manifest says {size}")
        by_object: dict[str, list[mf.Chunk]] = {}
        for t in self.manifest.tensors.values():
            for c in t.chunks:
                by_object.setdefault(c.key, []).append(c)
        dense: list[mf.Chunk] = []
        sparse: list[tuple[str, list[mf.Chunk]]] = []
        for key, chunks in by_object.items():
            stat = sizes.get(key)
            if stat is not None and self._sparse(key, stat):
                sparse.append((key, chunks))
            else:
                dense.extend(chunks)

        def check(chunk: mf.Chunk) -> str | None:
            buf = as_byte_view(aligned_empty((min(chunk.length, VERIFY_BLOCK_BYTES),), np.uint8))
            try:
                if chunk.length <= VERIFY_BLOCK_BYTES:
                    self._read_chunk_into(chunk, buf)
                    return None
                crc = done = 0
                while done < chunk.length:
                    view = buf[: min(len(buf), chunk.length - done)]
                    n = self._read_object(chunk.key, chunk.offset + done, view)
                    crc, done = crc32c(view[:n], crc), done + n
                    if n < len(view):
                        break  # the object ends early
                self._check_chunk(chunk, done, None, crc=crc)
            except _VERIFY_FAILURES as err:
                return str(err)
            return None

        def check_sparse(job: tuple[str, list[mf.Chunk]]) -> list[str]:
            key, chunks = job
            return self._verify_sparse(key, chunks, sizes[key])

        with ThreadPoolExecutor(self.readers, thread_name_prefix="ckptio-verify") as pool:
            for chunk, problem in zip(dense, pool.map(check, dense), strict=True):
                if problem:
                    problems.append(problem)
                if progress is not None:
                    progress(chunk.length)
            for job, found in zip(sparse, pool.map(check_sparse, sparse), strict=True):
                problems.extend(found)
                if progress is not None:
                    progress(sum(c.length for c in job[1]))
        return problems

    def _sparse(self, key: str, size: int) -> bool:
        """Whether the storage holds fewer bytes of ``key`` than its ``size`` (holes)."""
        try:
            return _first_hole(self.store, self._prefix + key, size) is not None
        except _VERIFY_FAILURES:
            return False  # the reads will say what is wrong

    def _verify_sparse(self, key: str, chunks: list[mf.Chunk], size: int) -> list[str]:
        """The problems of ``chunks`` of the sparse object ``key`` (of ``size`` bytes): only
        its stored ranges are read, in blocks; each hole adds the CRC of its zeros."""
        path = self._prefix + key
        problems: list[str] = []
        buf = as_byte_view(aligned_empty((VERIFY_BLOCK_BYTES,), np.uint8))
        try:
            ranges = self.store.stored_ranges(path, 0, size)
            here: tuple[int, int] | None = next(ranges, None)
        except _VERIFY_FAILURES as err:
            return [str(err)]
        stored = 0
        for chunk in sorted(chunks, key=lambda c: c.offset):  # they never share bytes
            end = chunk.offset + chunk.length
            crc, pos = 0, chunk.offset
            try:
                if end > size:  # truncated: named as a read of the whole chunk names it
                    self._check_chunk(chunk, max(0, size - chunk.offset), None, crc=0)
                while pos < end:
                    while here is not None and here[1] <= pos:
                        here = next(ranges, None)
                    data = end if here is None else min(max(here[0], pos), end)
                    crc, pos = crc32c_zeros(crc, data - pos), data  # a hole: zeros
                    stop = pos if here is None else min(here[1], end)
                    while pos < stop:
                        view = buf[: min(len(buf), stop - pos)]
                        n = self.store.read_into(path, pos, view)
                        crc, pos, stored = crc32c(view[:n], crc), pos + n, stored + n
                        if n < len(view):
                            raise errors.CorruptCheckpointError(
                                f"{self.store.url}/{path}: ends at byte {pos} while read, "
                                f"its size said {size}"
                            )
                self._check_chunk(chunk, chunk.length, None, crc=crc)
            except errors.ChecksumError as err:
                problems.append(
                    f"{err} (a sparse file: {size} bytes by its size, of which "
                    f"{stored} read so far are stored)"
                )
            except _VERIFY_FAILURES as err:
                problems.append(str(err))
        return problems


_VERIFY_FAILURES = (errors.CorruptCheckpointError, FileNotFoundError, errors.StoragePermissionError)
"""What ``verify`` reports as a problem of the checkpoint rather than raises."""


MANIFEST_FIRST_READ = 512 << 10
"""Bytes: a manifest is fetched with one read of this many bytes from its start; one that
fills them (100,000 chunks, say) is then sized and read whole. On an object store that is one
GET where sizing it first took a HEAD, and :meth:`~ckptio.store.Store.get` a second HEAD
and the GET. Small enough that a local store reads it through the page cache."""


def read_manifest(store: Store, step: int) -> mf.Manifest:
    """Fetch and validate the manifest of ``step``; NotFoundError if it is not committed.

    A manifest shorter than :data:`MANIFEST_FIRST_READ` takes one read. A longer one is sized
    first and refused unread above :data:`~ckptio.format.MAX_MANIFEST_BYTES` (a shorter one
    above it is refused too, unparsed); either way a manifest that is a sparse file (a hole:
    bytes its size claims but nothing stores) is refused, never parsed."""
    key = fmt.manifest_key(step)
    first = bytearray(MANIFEST_FIRST_READ)
    size = store.read_into(key, 0, first)
    data: bytes | None = None
    if size < len(first):  # the whole manifest, in one request
        data = bytes(memoryview(first)[:size])
    else:
        size = store.size(key)
    del first
    if size > fmt.MAX_MANIFEST_BYTES:
        raise errors.ManifestError(f"{key} is {size} bytes, more than {fmt.MAX_MANIFEST_BYTES}")
    hole = _first_hole(store, key, size)
    if hole is not None:  # not parsed: its size is not what is stored
        raise errors.ManifestError(
            f"{store.url}/{key}: {size} bytes by its size, but a sparse file with a hole at "
            f"byte {hole} (nothing stored there); ckptio writes manifests whole, so it is "
            "damaged or hostile, and not read"
        )
    if data is None:
        data = store.get(key)
    try:
        return mf.parse_manifest(data, expect_step=step)
    except errors.ManifestError as err:
        raise errors.ManifestError(f"{store.url}/{key}: {err}") from None


def _first_hole(store: Store, key: str, size: int) -> int | None:
    """The offset of the first byte of ``key`` (of ``size`` bytes) that the storage does not
    hold (a sparse file's hole), or None when it holds them all."""
    pos = 0
    for start, end in store.stored_ranges(key, 0, size):
        if start > pos:
            return pos
        pos = end
    return pos if pos < size else None


def committed_steps(store: Store) -> list[int]:
    """Steps that have a manifest object (not yet validated), ascending."""
    return _manifest_steps(store.list("step-"))


def _manifest_steps(keys: Iterable[str]) -> list[int]:
    steps = []
    for key in keys:
        head, _, tail = key.partition("/")
        if tail == fmt.MANIFEST_NAME:
            step = fmt.parse_step_dir(head)
            if step is not None:
                steps.append(step)
    return sorted(set(steps))


def open_checkpoint(
    url: str | os.PathLike[str] | Store, step: int | None = None, **options: Any
) -> CheckpointReader:
    """Open the checkpoint of ``step`` (default: the newest complete one) for reading."""
    store = open_store(url, **options)
    if step is not None:
        step = fmt.as_step(step)
        try:
            return CheckpointReader(store, step, read_manifest(store, step))
        except errors.NotRegularFileError:
            raise  # a FIFO, say, where the manifest should be: named as such
        except FileNotFoundError:
            raise errors.NotFoundError(
                f"{store.url}: no committed checkpoint at step {step}"
            ) from None
    return _open_newest(store, skip=())


RELISTS = 8
"""How many times a reader re-lists the steps when the checkpoint it chose was retired under it
(each time the newest then complete one is taken; retention's grace makes a second rare)."""


def _open_newest(store: Store, skip: Iterable[int]) -> CheckpointReader:
    """The newest step whose manifest validates, other than ``skip``. A step whose manifest is
    damaged or refused (a symlink out of the root, unreadable, not a regular file) is skipped
    with a warning; if every listed step vanished meanwhile (retention), the steps are listed
    again. So too when a listing names no manifest but other objects of steps: a listing of a
    local directory tree is not one snapshot, and a save that commits a step and retires the
    previous one between the scans of their two directories hides both manifests from it."""
    skipped = set(skip)
    for _ in range(RELISTS):
        keys = store.list("step-")
        steps = _manifest_steps(keys)
        vanished = not steps and bool(keys)
        for s in reversed(steps):
            if s in skipped:
                continue
            try:
                return CheckpointReader(store, s, read_manifest(store, s))
            except (
                errors.CorruptCheckpointError,
                PermissionError,
                errors.NotRegularFileError,
            ) as err:
                log.warning("skipping step %d: its manifest cannot be used (%s)", s, err)
                skipped.add(s)
            except FileNotFoundError:
                vanished = True  # retired meanwhile: an older one, or a newer one on re-listing
        if not vanished:
            break
    foreign = fmt.foreign_checkpoint(store.list(""))
    raise errors.NotFoundError(
        f"{store.url}: no complete checkpoint found" + (f"; {foreign}" if foreign else "")
    )


_DAMAGE = (
    errors.CorruptCheckpointError,  # missing, truncated, replaced, a CRC that does not match
    errors.StorageError,  # unreadable (EIO), refused (a symlink out of the root, a mode bit)
)
"""What reading a committed step's objects can fail with that makes a load of the newest
checkpoint fall back to an older one. Not an argument the step cannot serve (``select`` or
``into=`` naming a tensor it lacks), and not a transient failure that outlasted its retries
(the storage, not the step, is the problem then)."""


def read_newest(
    store: Store, select: Mapping[str, Any] | None, into: Any, *, hugetlb: bool = False
) -> Any:
    """The state of the newest loadable checkpoint. A step retired while it is read (its
    manifest gone, an object with it) is skipped quietly, the steps listed again; a step whose
    manifest stays but an object of which is missing or unreadable is damaged: it is skipped
    with a :class:`~ckptio.errors.DamagedCheckpointWarning` naming it and the object, and the
    next older one is read (never a mix: each try reads a whole state from one step). If
    every step is damaged, the newest one's error is raised."""
    skip: set[int] = set()
    damaged: list[BaseException] = []
    retired = 0
    while True:
        try:
            reader = _open_newest(store, skip)
        except errors.NotFoundError:
            if damaged:
                raise damaged[0] from None
            raise
        reader.hugetlb = hugetlb
        try:
            return reader.state(select, into=into)
        except _DAMAGE as err:
            if isinstance(err, errors.TransientStorageError | errors.RetryBudgetExceededError):
                raise
            skip.add(reader.step)
            if not store.exists(fmt.manifest_key(reader.step)):
                retired += 1
                if retired >= RELISTS:
                    raise errors.NotFoundError(
                        f"{store.url}: every checkpoint read was retired before it could be "
                        f"read whole ({RELISTS} tries); is retention removing checkpoints "
                        "faster than they are read?"
                    ) from err
                log.info("step %d was retired while read (%s); reading again", reader.step, err)
                continue
            damaged.append(err)
            warnings.warn(
                f"{store.url}: skipping step {reader.step}, which is damaged ({err}); loading "
                "the newest older checkpoint instead (`ckptio verify --step "
                f"{reader.step}` lists every problem)",
                errors.DamagedCheckpointWarning,
                stacklevel=3,  # the caller of load() or Checkpointer.load()
            )


def load(
    url: str | os.PathLike[str] | Store,
    step: int | None = None,
    *,
    select: Mapping[str, Any] | None = None,
    into: Any = None,
    hugetlb: bool = False,
    **options: Any,
) -> Any:
    """Load the checkpoint of ``step`` (default: the newest complete one) under ``url``.

    ``select`` maps tensor paths (``"model/w"``) to indexes (``np.s_[0:512, :]``) to read only
    those boxes: resharding to a different number of ranks.

    ``into`` is a state (the one being resumed, say) whose arrays are filled in place, as
    torch DCP's ``load`` does: numpy arrays and torch tensors (CUDA ones through pinned host
    memory). Each must have the dtype and shape the checkpoint holds at its path (the box's
    shape where ``select`` names the path); a :class:`Shard` leaf receives the box of the
    stored tensor that it names (a rank restoring its own shards). A mismatch, or an array at
    a path the checkpoint lacks, is an error before anything is read. The returned state holds those same objects;
    tensors that ``into`` lacks come back as new arrays. No second copy of the state is
    allocated, which on Linux also saves the kernel zeroing fresh pages for it. If the load
    fails (a damaged chunk, say), it raises and the arrays of ``into`` may hold part of the
    checkpoint.

    Memory: the declared bytes of what it returns (less what ``into`` receives in place) plus
    at most one read buffer per reader, and the manifest; a load needing more than this
    machine's memory and swap (or its cgroup's limit) raises
    :class:`~ckptio.errors.InsufficientMemoryError` before allocating.

    ``hugetlb=True`` puts the new arrays on pages of the kernel's hugetlb pool where it has
    enough free ones (reserved by an administrator: ``/proc/sys/vm/nr_hugepages``), and on
    ordinary memory where it does not: the fastest of the cold loads from a local disk that
    ``benchmarks/run.py`` compares with fio. Fresh 4 KiB pages cost the kernel a fault and a
    zeroing each as the reads land, and an ``O_DIRECT`` read into scattered pages reaches the
    device as smaller requests; pool pages are contiguous and only zeroed. The
    arrays keep their pool pages until freed; they are inherited by ``fork`` as other memory
    is, but a child that writes to them needs free pool pages of its own (the kernel ends it
    with SIGBUS where the pool has none).
    """
    if step is not None:
        reader = open_checkpoint(url, step, **options)
        reader.hugetlb = hugetlb
        return reader.state(select, into=into)
    return read_newest(open_store(url, **options), select, into, hugetlb=hugetlb)


def verify(
    url: str | os.PathLike[str] | Store, step: int | None = None, **options: Any
) -> list[str]:
    """Re-read a checkpoint and check every CRC; the list of problems (empty when intact)."""
    return open_checkpoint(url, step, **options).verify()
