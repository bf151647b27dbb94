"""The library API: save and load sharded checkpoints on any Store.

::

    import ckptio
    ckptio.save({"model": params, "step": 100}, "s3://bucket/run1", step=100)
    state = ckptio.load("s3://bucket/run1")            # newest complete checkpoint

    with ckptio.Checkpointer("file:///ckpt/run1", keep_last=3, async_save=True) as ck:
        for step in range(...):
            ...
            if step % 1000 == 0:
                ck.save(state, step=step)   # returns after the snapshot; persists in background

Guarantees: ``save`` (blocking) returns only when every shard is durable and the manifest is
committed; until the manifest is published nothing of the step is visible to ``load``. A failed
save (any rank) publishes no manifest and so never damages an earlier checkpoint. Every chunk
is CRC32C-checked on load; a mismatch raises :class:`~ckptio.errors.ChecksumError` naming the
object and byte range.

Multi-rank: every rank calls ``save`` with its own state; ``ckptio.Shard`` leaves say which
box of a global tensor a rank holds; plain arrays are replicated and written once (by the
lowest rank that has them). Rank 0 commits after every rank has succeeded.
"""

from __future__ import annotations

import atexit
import logging
import math
import mmap
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, Self

import crc32c as _crc32c
import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio.arrays import (
    Target,
    as_host_array,
    as_target,
    contiguous_le,
    copy_into,
    ensure_memory,
    not_inherited,
    private_pages,
)
from ckptio.dist import Communicator, SingleProcess, detect
from ckptio.forked import SMAPS, ForkedWriter, PageReleaser, in_ranges, unforkable_ranges
from ckptio.lease import (
    RETIRE_GRACE_SECONDS,
    TEMP_MIN_AGE_SECONDS,
    LeaseInfo,
    SaveLease,
    is_lease_key,
    read_lease,
    retire,
    retired_at,
    retired_key,
)
from ckptio.registry import open_store
from ckptio.store import Store, is_key, option_int, parse_size, wait_all

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 64 * 2**20
"""Bytes: tensors larger than this are split along their first dimension into chunks of about
this size (parallel CRC, finer-grained resharded loads)."""
DEFAULT_MAX_OBJECT_SIZE = 16 * 2**30
"""Bytes: a rank's shard data is split into objects of at most this size."""

LAYOUTS = ("file-per-shard", "shared-file", "shared-file-per-node")
"""Data layouts: ``file-per-shard`` (N-N) writes one or more objects per rank;
``shared-file`` (N-1) has every rank ``pwrite`` its chunks into one object per checkpoint, at
a byte range rank 0 assigns (aligned to :attr:`Store.positional_alignment`);
``shared-file-per-node`` does the same with one object per host. The manifest format is the
same for all (chunks name an object and a byte offset), so load and verify need no layout.
The shared layouts need ``capabilities.positional_writes`` (file://, pfs://)."""

_CHECKPOINT_OPTIONS = ("layout", "key_layout", "chunk_size", "max_object_size", "retire_grace")

FORK_OBJECT_BYTES = 256 << 20
"""Bytes: the largest shard object a fork snapshot's child writes (see :meth:`Checkpointer._fork_writer`)."""

SNAPSHOTS = ("copy", "fork")
"""How an async save takes its snapshot: ``copy`` (one memory copy into reused buffers) or
``fork`` (a copy-on-write child process; see :mod:`ckptio.forked`)."""

_cpu_pool: ThreadPoolExecutor | None = None
_cpu_lock = threading.Lock()


def cpu_pool() -> ThreadPoolExecutor:
    """Threads for CRC32C and memory copies (the crc32c package releases the GIL)."""
    global _cpu_pool
    with _cpu_lock:
        if _cpu_pool is None:
            _cpu_pool = ThreadPoolExecutor(
                max(2, os.cpu_count() or 2), thread_name_prefix="ckptio-cpu"
            )
        return _cpu_pool


def _forget_cpu_pool() -> None:  # a forked child: the pool's threads did not survive
    global _cpu_pool, _cpu_lock
    _cpu_pool, _cpu_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_cpu_pool)


def crc32c(data: Any, value: int = 0) -> int:
    """CRC32C of ``data``, continued from ``value`` (the CRC of the bytes before it)."""
    return int(_crc32c.crc32c(data, value))


# -- describing what a rank holds -------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """A leaf of a rank's state that holds one box of a larger, global tensor.

    ``Shard(local, global_shape=(4096, 1024), offsets=(1024, 0))``: this rank holds rows
    1024..2047 (``local.shape == (1024, 1024)``). Shards of all ranks must tile the global
    tensor; loading may then read any box of it with ``select``.
    """

    array: Any
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]


@dataclass
class LocalTensor:
    """A tensor (or shard of one) this rank offers to save."""

    path: str
    array: np.ndarray  # C-contiguous, little-endian
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    replicated: bool

    def meta(self) -> list[Any]:
        return [
            fmt.dtype_name(self.array.dtype),
            list(self.global_shape),
            list(self.offsets),
            list(self.array.shape),
            self.replicated,
        ]


@dataclass
class PreparedState:
    tree: Any
    tensors: dict[str, LocalTensor]
    metadata: Any
    snapshot_bytes: int = 0
    error: BaseException | None = None
    """Set when this rank's state could not be prepared: the rank still takes part in the
    collective plan (so other ranks fail too instead of waiting forever), then raises."""

    def metas(self) -> dict[str, list[Any]]:
        return {p: t.meta() for p, t in self.tensors.items()}


PAGE = 4096
"""Bytes: snapshot and load buffers of large tensors start on a page (O_DIRECT, no copy)."""
PAGE_ALIGNED_MIN = 1 << 20
"""Bytes: tensors at least this large get page-aligned snapshot/load memory; smaller ones
are packed (64-byte aligned) so many small tensors do not waste a page each."""
VERIFY_BLOCK_BYTES = 16 << 20
"""Bytes: ``verify`` reads a larger chunk in blocks of this size, its CRC32C continued from
block to block, so it holds at most ``readers`` blocks whatever size a manifest declares."""


def _align_for(nbytes: int) -> int:
    return PAGE if nbytes >= PAGE_ALIGNED_MIN else 64


class SnapshotBuffers:
    """Host memory for async snapshots, page-aligned and kept from one save to the next.

    A Checkpointer has one save in flight at a time, so when a save starts the previous
    snapshot's memory is free again. Reusing it avoids the page fault per 4 KiB that fresh
    memory costs (on a 2-core VM: ~3.5 GB/s to fill fresh memory vs ~12 GB/s for memory
    already touched), and page alignment lets ``file://`` write it with O_DIRECT without a
    copy. Holds one state's worth of memory until :meth:`release`.
    """

    def __init__(self, *, inherit: bool = True) -> None:
        self._arena: mmap.mmap | None = None
        self.inherit = inherit
        """False: forked processes do not get this memory (see :func:`private_pages`); a
        ``snapshot="fork"`` Checkpointer keeps it inherited (its child writes copies from it)."""
        if not inherit:
            _not_inherited_buffers.add(self)

    def views(self, sources: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Uninitialised arrays shaped like ``sources``, laid out in one arena."""
        offsets, end = [], 0
        for a in sources:
            end = fmt.align_up(end, _align_for(a.nbytes))
            offsets.append(end)
            end += a.nbytes
        if self._arena is None or len(self._arena) < end:
            self._arena = None  # views of the old arena keep it alive while in use
            self._arena = private_pages(max(PAGE, fmt.align_up(end, PAGE)), inherit=self.inherit)
        out = []
        for a, off in zip(sources, offsets, strict=True):
            raw = np.frombuffer(self._arena, dtype=np.uint8, count=a.nbytes, offset=off)
            out.append(raw.view(a.dtype).reshape(a.shape))
        return out

    @property
    def nbytes(self) -> int:
        return 0 if self._arena is None else len(self._arena)

    def release(self) -> None:
        self._arena = None


_not_inherited_buffers: weakref.WeakSet[SnapshotBuffers] = weakref.WeakSet()


def _drop_uninherited_arenas() -> None:
    """In a forked child: arenas that were not inherited are forgotten (see
    :data:`ckptio.arrays.not_inherited`)."""
    for buffers in list(_not_inherited_buffers):
        if buffers._arena is not None:
            not_inherited.append(buffers._arena)
            buffers._arena = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_uninherited_arenas)


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose data starts on a page when it is large (at least
    :data:`PAGE_ALIGNED_MIN` bytes), so ``O_DIRECT`` reads land in it and writes leave from it
    without a copy. ``ckptio.load`` returns such arrays. State kept in host memory saves
    faster from them: numpy's and torch's own large arrays do not start on a page, and
    ``file://`` copies those into page-aligned staging blocks before writing them with
    ``O_DIRECT``.

    Large arrays are anonymous memory maps of 4 KiB pages, not numpy's allocation: numpy asks
    for transparent huge pages (``MADV_HUGEPAGE``), and where the kernel compacts memory on
    such faults (``defrag=madvise``, the usual default) or a VM's host has reclaimed freed
    memory, fresh huge pages cost several times more to fill than 4 KiB pages. The
    measurements behind both choices are in ``docs/performance.md`` ("Cold load") and the
    ``memcpy-fresh`` cases of ``benchmarks/run.py``."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes < PAGE_ALIGNED_MIN:
        return np.empty(shape, dtype=dt)
    try:
        buf = private_pages(fmt.align_up(nbytes, PAGE))
    except OSError:  # e.g. the per-process limit on mappings (vm.max_map_count)
        raw = np.empty(nbytes + PAGE, dtype=np.uint8)
        start = -raw.ctypes.data % PAGE
        return raw[start : start + nbytes].view(dt).reshape(shape)
    return np.frombuffer(buf, dtype=np.uint8, count=nbytes).view(dt).reshape(shape)


def _prepare(
    state: Any,
    metadata: Any,
    *,
    copy: bool | Callable[[np.ndarray], bool],
    buffers: SnapshotBuffers | None = None,
) -> PreparedState:
    """Walk the state: encode its structure, collect its arrays (copied if ``copy``, or those
    for which ``copy(array)`` is true, into ``buffers`` when given, else into fresh
    page-aligned memory)."""
    tensors: dict[str, LocalTensor] = {}
    copies: list[tuple[np.ndarray, np.ndarray]] = []

    def take(arr: np.ndarray) -> np.ndarray:
        return contiguous_le(arr)  # copied below, once the sizes of all are known

    def on_array(path: str, leaf: Any) -> Any:
        if isinstance(leaf, Shard):
            arr = as_host_array(leaf.array)
            if arr is None:
                raise errors.InvalidArgumentError(f"Shard at {path!r} does not hold an array")
            gshape, offs = (
                tuple(int(x) for x in leaf.global_shape),
                tuple(int(x) for x in leaf.offsets),
            )
            if (
                len(gshape) != arr.ndim
                or len(offs) != arr.ndim
                or any(o < 0 or o + n > g for o, n, g in zip(offs, arr.shape, gshape, strict=True))
            ):
                raise errors.InvalidArgumentError(
                    f"Shard at {path!r}: box at offsets {offs} of shape {arr.shape} does not fit "
                    f"the global shape {gshape}"
                )
            tensors[path] = LocalTensor(path, take(arr), gshape, offs, replicated=False)
            return {"t": path}
        if isinstance(leaf, np.generic):
            return None
        arr = as_host_array(leaf)
        if arr is None:
            return None
        tensors[path] = LocalTensor(path, take(arr), arr.shape, (0,) * arr.ndim, replicated=True)
        return {"t": path}

    tree = fmt.encode_tree(state, on_array)
    for t in tensors.values():
        fmt.dtype_name(t.array.dtype)  # refuse unsupported dtypes before anything is written
    if copy and tensors:
        locals_ = [t for t in tensors.values() if copy is True or copy(t.array)]
        dsts = (buffers or SnapshotBuffers()).views([t.array for t in locals_])
        for t, dst in zip(locals_, dsts, strict=True):
            copies.append((dst, t.array))
            t.array = dst
    if metadata is not None:
        import json

        try:
            text = json.dumps(metadata, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError) as err:
            raise errors.InvalidArgumentError(f"metadata must be JSON values: {err}") from None
        problem = fmt.metadata_problem(text.encode("utf-8", "surrogatepass"))
        if problem is not None:  # a load would refuse it: refused before anything is written
            raise errors.InvalidArgumentError(
                f"metadata {problem}; store large data as arrays in the state"
            )
        metadata = json.loads(text)  # a deep, JSON-only copy
    nbytes = _parallel_copy(copies)
    return PreparedState(tree, tensors, metadata, snapshot_bytes=nbytes)


def _holds_nothing(state: Any) -> bool:
    if state is None:
        return True
    if isinstance(state, Mapping):
        return all(_holds_nothing(v) for v in state.values())
    if isinstance(state, list | tuple):
        return all(_holds_nothing(v) for v in state)
    return False


def refuse_empty(state: Any) -> None:
    """Raise :class:`~ckptio.errors.InvalidArgumentError` if ``state`` holds nothing to save:
    None, or containers holding only None and empty containers (no array, no value). Such a
    save is almost always a mistake (a function that returned None, a state not filled yet),
    and committing it would make an empty checkpoint the newest one to resume from."""
    if _holds_nothing(state):
        what = (
            "None"
            if state is None
            else f"a {type(state).__name__} with no array and no value in it"
        )
        raise errors.InvalidArgumentError(
            f"nothing to save: the state is {what}; pass the state to checkpoint (arrays, "
            "tensors, values in dicts/lists), not the result of a function that returns None"
        )


def _parallel_copy(copies: Sequence[tuple[np.ndarray, np.ndarray]]) -> int:
    """Copy src -> dst pairs (:func:`~ckptio.arrays.copy_into`: streaming stores), large ones
    split over the CPU pool. Returns bytes copied."""
    if not copies:
        return 0
    piece = 32 * 2**20
    jobs = []
    for dst, src in copies:
        d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
        for a in range(0, d.nbytes, piece):
            jobs.append((d[a : a + piece], s[a : a + piece]))
    if len(jobs) == 1:
        copy_into(*jobs[0])
    else:
        list(cpu_pool().map(lambda j: copy_into(j[0], j[1]), jobs))
    return sum(d.nbytes for d, _ in copies)


# -- the save itself --------------------------------------------------------------------------


@dataclass
class Piece:
    path: str
    view: np.ndarray  # C-contiguous slice of the local array
    offsets: tuple[int, ...]  # in the global tensor


def _pieces(local: LocalTensor, chunk_size: int) -> list[Piece]:
    """Split a local tensor along dim 0 into C-contiguous pieces of about ``chunk_size``;
    where rows allow, every piece holds a whole number of pages (so pieces of page-aligned
    memory stay page-aligned: O_DIRECT without a copy, on save and on load)."""
    arr = local.array
    if arr.ndim == 0 or arr.nbytes <= chunk_size or arr.shape[0] <= 1:
        return [Piece(local.path, arr, local.offsets)]
    row = arr.nbytes // arr.shape[0]
    rows = max(1, chunk_size // max(row, 1))
    per_page = PAGE // math.gcd(row, PAGE) if row else 1  # rows per whole number of pages
    if rows >= per_page:
        rows -= rows % per_page
    out = []
    for r in range(0, arr.shape[0], rows):
        offs = (local.offsets[0] + r, *local.offsets[1:])
        out.append(Piece(local.path, arr[r : r + rows], offs))
    return out


_ZEROS = memoryview(bytes(fmt.ALIGNMENT))
CRC_BATCH_BYTES = 8 << 20
"""Bytes: small pieces are checksummed in batches of about this size (one task, not one per
piece); a larger piece is a batch of its own."""


def _crc_many(datas: Sequence[np.ndarray]) -> list[int]:
    return [crc32c(d) for d in datas]


COALESCE_CHUNK_BYTES = 1 << 20
"""Bytes: chunks smaller than this that lie next to each other in an object are loaded with
one request per up to :data:`COALESCE_REQUEST_BYTES` (many small tensors: no per-chunk
request)."""
COALESCE_REQUEST_BYTES = 16 << 20
PARALLEL_OBJECTS = 2
"""Shard objects a rank writes at the same time (when it has enough data)."""
PARALLEL_OBJECTS_MIN = 256 * 2**20
"""Bytes: below this a rank writes one object at a time."""


class WriteProgress(Protocol):
    """What :func:`write_rank_shards` reports as it goes (a fork snapshot's child gives back
    the memory of what it has written: :class:`ckptio.forked.PageReleaser`)."""

    def expect(self, views: Sequence[np.ndarray]) -> None: ...

    def written(self, views: Sequence[np.ndarray]) -> None: ...


def write_rank_shards(
    store: Store,
    step: int,
    rank: int,
    token: str,
    mine: Sequence[LocalTensor],
    *,
    key_layout: str,
    chunk_size: int,
    max_object_size: int,
    first_index: int = 0,
    parallel: int = 1,
    progress: WriteProgress | None = None,
) -> dict[str, Any]:
    """Write this rank's tensors into shard objects, numbered from ``first_index`` (callers
    that write a rank's objects in several calls, like the runner, keep the numbers apart).
    ``parallel``: a rank's data of at least :data:`PARALLEL_OBJECTS_MIN` bytes is spread over
    about this many objects, written at the same time (a local filesystem serialises direct
    writes to one file; object stores take more streams). ``progress`` hears of every piece
    of memory to be written, then of each object's pieces once that object is durable and
    checksummed. Returns the chunk index and objects."""
    pieces = [p for local in mine for p in _pieces(local, chunk_size)]
    if progress is not None:
        progress.expect([p.view for p in pieces])
    total_bytes = sum(p.view.nbytes for p in pieces)
    if parallel > 1 and total_bytes >= PARALLEL_OBJECTS_MIN:
        # each object then gets at least total/parallel bytes, so there are at most `parallel`
        largest = max(p.view.nbytes for p in pieces)
        max_object_size = min(max_object_size, -(-total_bytes // parallel) + fmt.align_up(largest))
    # assign pieces to objects
    objects: list[list[tuple[Piece, int]]] = [[]]
    sizes = [0]
    for p in pieces:
        if sizes[-1] and sizes[-1] + p.view.nbytes > max_object_size:
            objects.append([])
            sizes.append(0)
        objects[-1].append((p, sizes[-1]))
        sizes[-1] = fmt.align_up(sizes[-1] + p.view.nbytes)
    chunks: dict[str, list[dict[str, Any]]] = {}
    object_sizes: dict[str, int] = {}
    prefix = fmt.step_dir(step) + "/"
    pool = cpu_pool()

    def write_object(index: int, members: list[tuple[Piece, int]]) -> tuple[str, int, list[int]]:
        key = fmt.shard_key(step, rank, index, key_layout=key_layout).replace(
            ".bin", f"-{token}.bin"
        )
        total = members[-1][1] + members[-1][0].view.nbytes
        crcs: list[Future[list[int]]] = []  # one CRC job per large piece or batch of small ones
        batch: list[np.ndarray] = []
        batch_bytes = 0
        writer = store.open_writer(key, size_hint=total)
        try:
            pos = 0
            for piece, offset in members:
                if offset > pos:
                    writer.write(_ZEROS[: offset - pos])
                data = piece.view.reshape(-1).view(np.uint8)
                batch.append(data)
                batch_bytes += data.nbytes
                if batch_bytes >= CRC_BATCH_BYTES:
                    crcs.append(pool.submit(_crc_many, batch))
                    batch, batch_bytes = [], 0
                writer.write(data)
                pos = offset + data.nbytes
            if batch:
                crcs.append(pool.submit(_crc_many, batch))
            writer.close()
        except BaseException:
            writer.abort()
            for f in crcs:
                f.cancel()
            raise
        crc_values = [crc for job in crcs for crc in job.result()]
        if progress is not None:
            progress.written([piece.view for piece, _ in members])
        return key[len(prefix) :], total, crc_values

    todo = [(index, members) for index, members in enumerate(objects, start=first_index) if members]
    if len(todo) > 1 and parallel > 1:
        with ThreadPoolExecutor(min(parallel, len(todo)), thread_name_prefix="ckptio-object") as ex:
            done = wait_all([ex.submit(write_object, index, members) for index, members in todo])
    else:
        done = [write_object(index, members) for index, members in todo]
    for (_index, members), (rel, total, crcs) in zip(todo, done, strict=True):
        object_sizes[rel] = total
        for (piece, offset), crc in zip(members, crcs, strict=True):
            chunks.setdefault(piece.path, []).append(
                fmt.Chunk(
                    piece.offsets, piece.view.shape, rel, offset, piece.view.nbytes, crc
                ).as_json()
            )
    return {"chunks": chunks, "objects": object_sizes}


def pack_pieces(sizes: Iterable[int]) -> tuple[list[int], int]:
    """Offsets (bytes) of consecutive pieces of ``sizes`` bytes in one region, each starting
    on a :data:`ckptio.format.ALIGNMENT` boundary, and the region's size in bytes (a multiple
    of it, so a direct write's zero-padded tail stays inside the region)."""
    offsets: list[int] = []
    need = 0
    for n in sizes:
        offsets.append(need)
        need = fmt.align_up(need + int(n))
    return offsets, need


@dataclass(frozen=True)
class SharedRegion:
    """This rank's byte range in a shared (N-1) object, as rank 0 placed it."""

    key: str
    """The object, relative to the step directory (``data/shared-<token>.bin``)."""
    start: int
    """Bytes: where this rank's region begins (a multiple of the store's
    ``positional_alignment``)."""
    size: int
    """Bytes: the size of the whole object."""
    owner: bool
    """True on the lowest rank placed in this object (one rank per object says so)."""


def place_shared_region(
    store: Store, step: int, comm: Communicator, token: str, need: int, *, per_node: bool
) -> SharedRegion:
    """N-1 placement, collective: every rank asks for ``need`` bytes; rank 0 places the
    regions one after another in one object per checkpoint (or per host with ``per_node``),
    each aligned to ``store.positional_alignment`` so no two ranks share a stripe/block, and
    creates the objects at their full size. Raises :class:`SaveFailedError` on every rank if
    the creation failed."""
    import socket

    asks = comm.gather(
        {"need": int(need), "host": socket.gethostname() if per_node else ""}, root=0
    )
    prefix = fmt.step_dir(step) + "/"
    placement: dict[str, Any] = {}
    if comm.rank == 0:
        assert asks is not None
        align = max(fmt.ALIGNMENT, int(store.positional_alignment))
        hosts = sorted({a["host"] for a in asks})
        ends = {h: 0 for h in hosts}
        ranks: list[tuple[str, int]] = []
        for a in asks:
            node = hosts.index(a["host"])
            name = f"data/node-{node:05d}-{token}.bin" if per_node else f"data/shared-{token}.bin"
            begin = fmt.align_up(ends[a["host"]], align)
            ranks.append((name, begin))
            if a["need"]:
                ends[a["host"]] = begin + a["need"]
        files = {name: ends[asks[i]["host"]] for i, (name, _) in enumerate(ranks)}
        try:
            for name, size in files.items():
                store.open_positional(prefix + name, size, create=True).close()
            placement = {"ok": True, "ranks": ranks, "files": files}
        except Exception as err:  # every rank learns it from the bcast
            placement = {"ok": False, "error": _error_text(err)}
    placement = comm.bcast(placement, root=0)
    if not placement["ok"]:
        raise errors.SaveFailedError(f"cannot create the shared file: {placement['error']}")
    rel, start = placement["ranks"][comm.rank]
    owner = next(i for i, (name, _) in enumerate(placement["ranks"]) if name == rel) == comm.rank
    return SharedRegion(rel, int(start), int(placement["files"][rel]), owner)


def pwrite_pieces(
    store: Store, step: int, region: SharedRegion, placed: Sequence[tuple[Piece, int]]
) -> dict[str, list[dict[str, Any]]]:
    """Open the shared object of ``region``, pwrite each piece at ``region.start`` + its
    offset (CRC32C computed alongside) and close: the pieces are durable when this returns.
    Returns the chunk index (tensor path -> chunk JSON). The pieces' memory must stay
    unchanged until then."""
    prefix = fmt.step_dir(step) + "/"
    crcs: list[Future[int]] = []
    if placed:
        pool = cpu_pool()
        writer = store.open_positional(prefix + region.key, region.size)
        try:
            for piece, offset in placed:
                data = piece.view.reshape(-1).view(np.uint8)
                crcs.append(pool.submit(crc32c, data))
                writer.pwrite(region.start + offset, data)
            writer.close()
        except BaseException:
            writer.abort()
            for f in crcs:
                f.cancel()
            raise
    chunks: dict[str, list[dict[str, Any]]] = {}
    for (piece, offset), crc in zip(placed, crcs, strict=True):
        chunks.setdefault(piece.path, []).append(
            fmt.Chunk(
                piece.offsets,
                piece.view.shape,
                region.key,
                region.start + offset,
                piece.view.nbytes,
                crc.result(),
            ).as_json()
        )
    return chunks


def _write_rank_shared(
    store: Store,
    step: int,
    comm: Communicator,
    token: str,
    mine: Sequence[LocalTensor],
    *,
    per_node: bool,
    chunk_size: int,
) -> dict[str, Any]:
    """N-1: every rank calls this. Rank 0 places each rank's byte range in a shared object
    (one per checkpoint, or per host) and creates it; each rank then pwrites its chunks.
    Returns the chunk index and objects like :func:`write_rank_shards`."""
    pieces = [p for local in mine for p in _pieces(local, chunk_size)]
    offsets, need = pack_pieces(p.view.nbytes for p in pieces)
    region = place_shared_region(store, step, comm, token, need, per_node=per_node)
    chunks = pwrite_pieces(store, step, region, list(zip(pieces, offsets, strict=True)))
    return {"chunks": chunks, "objects": {region.key: region.size}}


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


@dataclass
class SaveResult:
    """What a finished save did (on this rank)."""

    step: int
    nbytes: int
    """Bytes of tensor data written by this rank."""
    seconds: float
    """Wall time of the write and commit on this rank."""
    committed_bytes: int = 0
    """Bytes of the whole checkpoint (every rank), known on rank 0."""


def _save_collective(
    store: Store,
    prepared: PreparedState,
    step: int,
    comm: Communicator,
    *,
    layout: str,
    key_layout: str,
    chunk_size: int,
    max_object_size: int,
    forked: ForkedWriter | None = None,
) -> SaveResult:
    """Plan, write, gather, commit: every rank calls this; rank 0 publishes the manifest.
    With ``forked`` (file-per-shard only), that child process writes this rank's shards from
    its copy-on-write snapshot (see :mod:`ckptio.forked`); the caller ends it afterwards."""
    t0 = time.perf_counter()
    mkey = fmt.manifest_key(step)
    # 1. plan: rank 0 decides who writes what (replicated tensors once), refuses conflicts
    offer = (
        {"error": _error_text(prepared.error)} if prepared.error else {"metas": prepared.metas()}
    )
    gathered = comm.gather(offer, root=0)
    plan: dict[str, Any]
    lease: SaveLease | None = None
    refusal: BaseException | None = prepared.error  # chained to the error every rank raises
    try:
        if comm.rank == 0:
            assert gathered is not None
            try:
                refused = [
                    f"rank {r}: {o['error']}" for r, o in enumerate(gathered) if "error" in o
                ]
                if refused:
                    raise errors.SaveFailedError("; ".join(refused))
                if store.exists(mkey):
                    raise errors.AlreadyExistsError(
                        f"{store.url}: step {step} already has a committed checkpoint ({mkey})"
                    )
                writers = _plan_writers([o["metas"] for o in gathered])
                # the lease is published before any rank writes: gc and retention leave the
                # step alone while it is live (see ckptio.lease)
                lease = SaveLease(store, step).acquire()
                plan = {"ok": True, "token": lease.token, "writers": writers}
            except errors.CkptioError as err:
                plan = {"ok": False, "error": _error_text(err)}
                refusal = refusal or err
        else:
            plan = {}
        return _write_and_commit(
            store,
            prepared,
            step,
            comm,
            plan,
            lease,
            refusal,
            t0,
            layout=layout,
            key_layout=key_layout,
            chunk_size=chunk_size,
            max_object_size=max_object_size,
            forked=forked,
        )
    finally:
        if lease is not None:
            lease.release()


def _write_and_commit(
    store: Store,
    prepared: PreparedState,
    step: int,
    comm: Communicator,
    plan: dict[str, Any],
    lease: SaveLease | None,
    refusal: BaseException | None,
    t0: float,
    *,
    layout: str,
    key_layout: str,
    chunk_size: int,
    max_object_size: int,
    forked: ForkedWriter | None,
) -> SaveResult:
    plan = comm.bcast(plan, root=0)
    if not plan["ok"]:
        raise errors.SaveFailedError(
            f"save of step {step} refused, nothing committed: {plan['error']}"
        ) from refusal
    mine = [t for p, t in prepared.tensors.items() if plan["writers"][p] in (comm.rank, -1)]
    # 2. write this rank's shards
    try:
        if forked is not None:
            written = forked.run({"token": plan["token"], "paths": [t.path for t in mine]})
        elif layout == "file-per-shard":
            written = write_rank_shards(
                store,
                step,
                comm.rank,
                plan["token"],
                mine,
                key_layout=key_layout,
                chunk_size=chunk_size,
                max_object_size=max_object_size,
                parallel=PARALLEL_OBJECTS,
            )
        else:
            written = _write_rank_shared(
                store,
                step,
                comm,
                plan["token"],
                mine,
                per_node=layout == "shared-file-per-node",
                chunk_size=chunk_size,
            )
        outcome: dict[str, Any] = {"ok": True, **written}
    except Exception as err:  # reported to every rank below, then raised
        log.debug("rank %d failed writing step %d", comm.rank, step, exc_info=True)
        outcome = {"ok": False, "error": _error_text(err)}
        local_error: BaseException | None = err
    else:
        local_error = None
    # 3. gather, commit on rank 0
    results = comm.gather(outcome, root=0)
    verdict: dict[str, Any] = {}
    if comm.rank == 0:
        assert results is not None
        verdict = commit_step(
            store, step, prepared, plan, results, comm.size, layout, key_layout, lease=lease
        )
        if lease is not None:
            lease.release()  # before the other ranks return: the save is over when they do
    verdict = comm.bcast(verdict, root=0)
    if not verdict["ok"]:
        raise errors.SaveFailedError(
            f"save of step {step} failed, nothing committed: {verdict['error']}"
        ) from local_error
    nbytes = sum(t.array.nbytes for t in mine)
    return SaveResult(step, nbytes, time.perf_counter() - t0, verdict.get("nbytes", 0))


def _plan_writers(gathered: Sequence[Mapping[str, list[Any]]]) -> dict[str, int]:
    """path -> writing rank (replicated: lowest rank that has it) or -1 (sharded: every
    holder writes its box). Raises if ranks disagree about a tensor."""
    writers: dict[str, int] = {}
    seen: dict[str, list[Any]] = {}
    for rank, metas in enumerate(gathered):
        for path, (dtype, gshape, _offs, _shape, replicated) in metas.items():
            if path in seen:
                d0, g0, rep0 = seen[path][0], seen[path][1], seen[path][4]
                if (d0, g0, rep0) != (dtype, gshape, replicated):
                    raise errors.InvalidArgumentError(
                        f"ranks disagree about tensor {path!r}: {d0}{g0}{' replicated' if rep0 else ' sharded'}"
                        f" vs {dtype}{gshape}{' replicated' if replicated else ' sharded'} on rank {rank}"
                    )
                continue
            seen[path] = [dtype, gshape, _offs, _shape, replicated]
            writers[path] = rank if replicated else -1
    return writers


def build_manifest(
    step: int,
    prepared: PreparedState,
    plan: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    world_size: int,
    layout: str,
    key_layout: str,
) -> tuple[bytes, dict[str, int]]:
    """Rank 0: the manifest of a step whose data every rank reported written (``results``),
    validated exactly as a reader will validate it, and the objects it names."""
    objects: dict[str, int] = {}
    chunk_lists: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        objects.update(r["objects"])
        for path, cs in r["chunks"].items():
            chunk_lists.setdefault(path, []).extend(cs)
    metas = prepared.metas()
    doc_tensors = {}
    for path in plan["writers"]:
        meta = metas.get(path)
        if meta is None:
            raise errors.SaveFailedError(
                f"tensor {path!r} is held by another rank but not by rank 0; rank 0's state "
                "must name every tensor (its structure is the checkpoint's)"
            )
        doc_tensors[path] = {
            "dtype": meta[0],
            "shape": meta[1],
            "chunks": sorted(chunk_lists.get(path, []), key=lambda c: c["offsets"]),
        }
    manifest = fmt.Manifest(
        step=step,
        world_size=world_size,
        tensors={},
        objects=objects,
        tree=prepared.tree,
        metadata=prepared.metadata,
        layout={"kind": layout, "key_layout": key_layout},
        created=datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    )
    data = manifest.to_json()
    # splice the tensors in (as JSON) and validate what we are about to commit, exactly
    # as a reader will: a save never publishes a manifest that load would refuse
    import json

    doc = json.loads(data)
    doc["tensors"] = doc_tensors
    data = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
    fmt.parse_manifest(data, expect_step=step)
    return data, objects


def commit_step(
    store: Store,
    step: int,
    prepared: PreparedState,
    plan: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    world_size: int,
    layout: str,
    key_layout: str,
    *,
    lease: SaveLease | None = None,
) -> dict[str, Any]:
    """Rank 0: publish the manifest of a step whose data every rank reported written, or
    discard that data. Before publishing it checks that ``lease`` (the save's, see
    :mod:`ckptio.lease`) has not lapsed and that every object the manifest names is listed, so
    a manifest never names a missing object."""
    prefix = fmt.step_dir(step) + "/"
    written = [prefix + k for r in results if r.get("ok") for k in r["objects"]]
    failed = [(rank, r["error"]) for rank, r in enumerate(results) if not r.get("ok")]
    if failed:
        # a shared (N-1) object was created by rank 0 for every rank: find it by the token
        token = plan.get("token")
        strays = _attempt_keys(store, prefix, token) if token else []
        discard_objects(store, sorted(set(written) | set(strays)))
        return {"ok": False, "error": "; ".join(f"rank {rank}: {e}" for rank, e in failed)}
    try:
        data, objects = build_manifest(
            step, prepared, plan, results, world_size, layout, key_layout
        )
        if lease is not None:
            lease.check()
        check_objects_present(store, step, objects)
        store.publish(fmt.manifest_key(step), data, overwrite=False)
    except Exception as err:  # reported to every rank; the data is discarded
        log.debug("commit of step %d failed", step, exc_info=True)
        if isinstance(err, errors.AlreadyExistsError):
            # create-if-absent refused: another writer committed this step first; its
            # checkpoint stands, ours (objects named by our own token) is left for gc
            return {
                "ok": False,
                "error": f"another writer already committed step {step} ({_error_text(err)})",
            }
        discard_objects(store, written)
        return {"ok": False, "error": _error_text(err)}
    return {"ok": True, "nbytes": sum(objects.values())}


def check_objects_present(store: Store, step: int, objects: Iterable[str]) -> None:
    """Raise :class:`~ckptio.errors.SaveFailedError` unless every object (a key relative to
    the step directory) is listed: one listing of the step, before its manifest is published."""
    if not store.capabilities.shared:
        return  # other processes' objects are not visible here (memory://)
    prefix = fmt.step_dir(step) + "/"
    present = set(store.list(prefix))
    missing = sorted(k for k in objects if prefix + k not in present)
    if missing:
        raise errors.SaveFailedError(
            f"{len(missing)} object(s) of step {step} vanished before its commit (deleted by "
            f"another process?), e.g. {prefix}{missing[0]}; not committed"
        )


def _attempt_keys(store: Store, prefix: str, token: str) -> list[str]:
    """Data objects of the save attempt with ``token`` under a step's ``prefix``."""
    try:
        return [k for k in store.list(prefix + "data/") if f"-{token}." in k.rsplit("/", 1)[-1]]
    except Exception as err:  # best effort, like discard_objects
        log.warning("could not list data of a failed save (%s); `ckptio gc` will remove it", err)
        return []


def discard_objects(store: Store, keys: Sequence[str]) -> None:
    try:
        store.delete(keys)
    except Exception as err:  # best effort: what remains is garbage that gc removes
        log.warning("could not delete data of a failed save (%s); `ckptio gc` will remove it", err)


# -- loading ----------------------------------------------------------------------------------


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


class CheckpointReader:
    """A committed checkpoint opened for reading: its manifest and the data behind it.

    ``read(path, index)`` reads a box of one tensor, fetching only the chunks that overlap it
    and checking each chunk's CRC32C. ``state(select)`` rebuilds the saved structure.
    """

    def __init__(
        self, store: Store, step: int, manifest: fmt.Manifest, *, readers: int = 8
    ) -> None:
        self.store = store
        self.step = step
        self.manifest = manifest
        self.readers = readers
        self._prefix = fmt.step_dir(step) + "/"
        self._sizes_checked: set[str] = set()

    @property
    def metadata(self) -> Any:
        return self.manifest.metadata

    def _read_chunk_into(self, chunk: fmt.Chunk, out: memoryview) -> None:
        n = self.store.read_into(self._prefix + chunk.key, chunk.offset, out)
        self._check_chunk(chunk, n, out)

    def _check_chunk(self, chunk: fmt.Chunk, n: int, data: Any, *, crc: int | None = None) -> None:
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
            return aligned_empty(shape, dtype)
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
        the caller), which are filled in place and returned instead of new arrays."""
        jobs: list[tuple[fmt.Chunk, Any]] = []
        results: dict[str, np.ndarray] = {}
        finals: dict[str, list[bool]] = {}
        into = into or {}
        copy_back: list[tuple[np.ndarray, str]] = []  # destinations read through a new array

        def destination(path: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
            dest = into.get(path)
            if dest is not None and dest.flags.c_contiguous:
                return dest.reshape(shape)  # a view: only unit dims of an int index differ
            if dest is not None:
                copy_back.append((dest, path))  # strided (a transposed view): read, then copy
            return self._allocate(shape, dtype, path)

        unknown = [p for p in wanted if p not in self.manifest.tensors]
        if unknown:
            raise errors.NotFoundError(f"step {self.step} has no tensor {unknown[0]!r}")
        # before allocating anything: the objects' sizes are what the manifest declares (the
        # manifest is validated so that no two chunks share bytes, so what is allocated is at
        # most what the storage reports holding; a sparse file reports its apparent size)
        self._check_sizes({c.key for p in wanted for c in self.manifest.tensors[p].chunks})
        # ... and this machine can hold the arrays to be allocated (the declared bytes of what
        # is read, less what into= receives in place): else a clear error before allocating
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
        what = f"loading step {self.step} ({len(wanted)} tensor(s))"
        ensure_memory(need, what)
        for path, index in wanted.items():
            entry = self.manifest.tensors[path]
            if index is None and entry.chunks and math.prod(entry.shape):
                # the whole tensor: chunks split along dim 0 (how ckptio writes them) land on
                # contiguous rows of the output, with no box arithmetic per chunk
                out = destination(path, entry.shape, entry.np_dtype)
                results[path] = out
                rows = [c for c in entry.chunks if c.shape[1:] == entry.shape[1:]]
                if len(rows) == len(entry.chunks) and all(not any(c.offsets[1:]) for c in rows):
                    flat = out.reshape(entry.shape[0], -1) if out.ndim else out.reshape(1, -1)
                    for c in rows:
                        o = c.offsets[0] if c.offsets else 0
                        n = c.shape[0] if c.shape else 1
                        jobs.append((c, flat[o : o + n].reshape(-1).view(np.uint8)))
                    continue
                index = ()
            starts, stops, keep = _normalize(() if index is None else index, entry.shape, path)
            shape = tuple(b - a for a, b in zip(starts, stops, strict=True))
            out = (
                results[path] if path in results else destination(path, shape, entry.np_dtype)
            )  # every element is read: chunks tile it
            results[path] = out
            finals[path] = keep
            for chunk in entry.chunks:
                lo = [max(a, o) for a, o in zip(starts, chunk.offsets, strict=True)]
                hi = [
                    min(b, o + n) for b, o, n in zip(stops, chunk.offsets, chunk.shape, strict=True)
                ]
                if math.prod(shape) == 0 or any(h <= a for a, h in zip(lo, hi, strict=True)):
                    continue  # nothing of this chunk is wanted
                jobs.append((chunk, (out, starts, lo, hi)))

        def place(job: tuple[fmt.Chunk, Any]) -> tuple[np.ndarray, tuple[slice, ...], bool]:
            chunk, where = job
            if isinstance(where, np.ndarray):  # a whole chunk onto contiguous output bytes
                return where, (), True
            out, starts, lo, hi = where
            dst_box = tuple(slice(a - s, h - s) for a, h, s in zip(lo, hi, starts, strict=True))
            src_box = tuple(
                slice(a - o, h - o) for a, h, o in zip(lo, hi, chunk.offsets, strict=True)
            )
            target = out[dst_box] if dst_box else out  # out[()] would be a scalar, not a view
            whole = all(
                b.start == 0 and b.stop == n for b, n in zip(src_box, chunk.shape, strict=True)
            )
            return target, src_box, whole and target.flags.c_contiguous

        def run(job: tuple[fmt.Chunk, Any]) -> None:
            chunk = job[0]
            target, src_box, direct = place(job)
            if direct:
                self._read_chunk_into(chunk, memoryview(target.reshape(-1).view(np.uint8)))
                return
            tmp = self._allocate((chunk.length,), np.dtype(np.uint8), chunk.key)
            self._read_chunk_into(chunk, memoryview(tmp))
            target[...] = tmp.view(target.dtype).reshape(chunk.shape)[src_box]

        def run_group(group: list[tuple[fmt.Chunk, Any]]) -> None:
            # neighbouring small chunks of one object: one request, then copy each out
            start = group[0][0].offset
            end = max(c.offset + c.length for c, _ in group)
            buf = aligned_empty((end - start,), np.uint8)
            n = self.store.read_into(self._prefix + group[0][0].key, start, memoryview(buf))
            for job in group:
                chunk = job[0]
                a = chunk.offset - start
                data = buf[a : a + chunk.length]
                self._check_chunk(chunk, max(0, min(n - a, chunk.length)), data)
                target, src_box, direct = place(job)
                if direct:
                    np.copyto(target.reshape(-1).view(np.uint8), data)
                else:
                    target[...] = data.view(target.dtype).reshape(chunk.shape)[src_box]

        tasks: list[tuple[Any, Any]] = []
        small: dict[str, list[tuple[fmt.Chunk, Any]]] = {}
        for job in jobs:
            if job[0].length < COALESCE_CHUNK_BYTES:
                small.setdefault(job[0].key, []).append(job)
            else:
                tasks.append((run, job))
        for group_jobs in small.values():
            group_jobs.sort(key=lambda j: j[0].offset)
            group: list[tuple[fmt.Chunk, Any]] = []
            g_start = g_end = 0
            for job in group_jobs:
                c = job[0]
                if group and (
                    c.offset < g_end  # never, chunks do not share bytes; but stay exact
                    or c.offset - g_end > fmt.ALIGNMENT
                    or c.offset + c.length - g_start > COALESCE_REQUEST_BYTES
                ):
                    tasks.append((run_group, group))
                    group = []
                if not group:
                    g_start = c.offset
                group.append(job)
                g_end = max(g_end, c.offset + c.length)
            if group:
                tasks.append((run_group, group))

        # the read buffers too, before any is taken (the arrays above are not touched yet): one
        # per reader, of a whole chunk that does not land in place, or of a group
        partial = sorted(
            (job[0].length for fn, job in tasks if fn is run and not place(job)[2]), reverse=True
        )
        groups = sum(fn is run_group for fn, _ in tasks)
        buffers = sum(partial[: self.readers]) + min(groups, self.readers) * COALESCE_REQUEST_BYTES
        if buffers:
            ensure_memory(need + buffers, what)
        if len(tasks) <= 1:
            for fn, arg in tasks:
                fn(arg)
        else:
            with ThreadPoolExecutor(
                min(self.readers, len(tasks)), thread_name_prefix="ckptio-read"
            ) as pool:
                wait_all([pool.submit(fn, arg) for fn, arg in tasks])
        for path, keep in finals.items():
            if not all(keep):
                results[path] = results[path].reshape(
                    tuple(n for n, k in zip(results[path].shape, keep, strict=True) if k)
                )
        for dest, path in copy_back:
            np.copyto(dest, results[path])
        for path, dest in into.items():
            results[path] = dest
        return results

    def state(self, select: Mapping[str, Any] | None = None, *, into: Any = None) -> Any:
        """The saved structure with every tensor read (``select``: path -> index, to read
        only a box of some tensors; other tensors are read whole).

        ``into``: a state whose arrays are filled in place (see :func:`ckptio.load`)."""
        select = dict(select or {})
        unknown = set(select) - set(self.manifest.tensors)
        if unknown:
            raise errors.NotFoundError(
                f"step {self.step} has no tensor(s) {sorted(unknown)}; it has {sorted(self.manifest.tensors)[:20]}"
            )
        paths = list(fmt.tree_tensor_paths(self.manifest.tree))
        boxes: dict[str, Any] = {}  # the boxes that Shard leaves of into= name
        targets = self._targets(into, select, boxes) if into is not None else {}
        arrays = self.read_many(
            {p: boxes.get(p, select.get(p)) for p in paths},
            into={p: t.view for p, t in targets.items()},
        )
        for t in targets.values():
            if t.finish is not None:
                t.finish()
        return fmt.decode_tree(
            self.manifest.tree, lambda p: targets[p].leaf if p in targets else arrays[p]
        )

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

    def verify(self) -> list[str]:
        """Re-read every object and check sizes and every chunk's CRC. Returns the problems
        found (empty: the checkpoint is intact). Holds at most ``readers`` buffers of
        :data:`VERIFY_BLOCK_BYTES`, whatever the manifest declares."""
        problems: list[str] = []
        for key, size in self.manifest.objects.items():
            try:
                actual = self.store.size(self._prefix + key)
            except (errors.NotRegularFileError, errors.StoragePermissionError) as err:  # refused
                problems.append(f"{self._prefix}{key}: {err.strerror}")
                continue
            except FileNotFoundError:
                problems.append(f"{self._prefix}{key}: missing")
                continue
            if actual != size:
                problems.append(f"{self._prefix}{key}: {actual} bytes, manifest says {size}")
        jobs = [c for t in self.manifest.tensors.values() for c in t.chunks]

        def check(chunk: fmt.Chunk) -> str | None:
            buf = memoryview(aligned_empty((min(chunk.length, VERIFY_BLOCK_BYTES),), np.uint8))
            try:
                if chunk.length <= VERIFY_BLOCK_BYTES:
                    self._read_chunk_into(chunk, buf)
                    return None
                crc = done = 0
                while done < chunk.length:
                    view = buf[: min(len(buf), chunk.length - done)]
                    n = self.store.read_into(self._prefix + chunk.key, chunk.offset + done, view)
                    crc, done = crc32c(view[:n], crc), done + n
                    if n < len(view):
                        break  # the object ends early
                self._check_chunk(chunk, done, None, crc=crc)
            except (
                errors.CorruptCheckpointError,
                FileNotFoundError,
                errors.StoragePermissionError,
            ) as err:
                return str(err)
            return None

        with ThreadPoolExecutor(self.readers, thread_name_prefix="ckptio-verify") as pool:
            problems.extend(p for p in pool.map(check, jobs) if p)
        return problems


def read_manifest(store: Store, step: int) -> fmt.Manifest:
    """Fetch and validate the manifest of ``step``; NotFoundError if it is not committed."""
    key = fmt.manifest_key(step)
    size = store.size(key)
    if size > fmt.MAX_MANIFEST_BYTES:
        raise errors.ManifestError(f"{key} is {size} bytes, more than {fmt.MAX_MANIFEST_BYTES}")
    data = store.get(key)
    try:
        return fmt.parse_manifest(data, expect_step=step)
    except errors.ManifestError as err:
        raise errors.ManifestError(f"{store.url}/{key}: {err}") from None


def committed_steps(store: Store) -> list[int]:
    """Steps that have a manifest object (not yet validated), ascending."""
    steps = []
    for key in store.list("step-"):
        head, _, tail = key.partition("/")
        if tail == fmt.MANIFEST_NAME:
            step = fmt.parse_step_dir(head)
            if step is not None:
                steps.append(step)
    return sorted(set(steps))


@dataclass
class StepInfo:
    step: int
    complete: bool
    """Has a manifest that validates."""
    nbytes: int
    """Bytes of all objects under the step."""
    objects: int
    created: str = ""
    problem: str = ""


def list_steps(store: Store) -> list[StepInfo]:
    """Every step under the root, committed or not, with its size (for ``ckptio ls``)."""
    by_step: dict[int, list[str]] = {}
    for key in filter(is_key, store.list("step-")):  # not a foreign key (a folder marker)
        step = fmt.parse_step_dir(key.partition("/")[0])
        if step is not None:
            by_step.setdefault(step, []).append(key)

    def size(key: str) -> int:
        try:
            return store.size(key)
        except (FileNotFoundError, PermissionError):  # deleted meanwhile, or refused
            return 0

    out = []
    for step, keys in sorted(by_step.items()):
        nbytes = sum(map(size, keys))
        info = StepInfo(step, False, nbytes, len(keys))
        if fmt.manifest_key(step) in keys:
            try:
                m = read_manifest(store, step)
                info.complete, info.created = True, m.created
            except errors.CkptioError as err:
                info.problem = str(err)
        elif live := _live_leases(store, keys, time.time()):
            info.problem = "save in progress (" + ", ".join(lease.holder() for lease in live) + ")"
        elif retired_key(step) in keys:
            info.problem = "retired by retention (its data stays for readers, then gc removes it)"
        else:
            info.problem = "no manifest (incomplete or interrupted save)"
        out.append(info)
    return out


def open_checkpoint(
    url: str | os.PathLike[str] | Store, step: int | None = None, **options: Any
) -> CheckpointReader:
    """Open the checkpoint of ``step`` (default: the newest complete one) for reading."""
    store = open_store(url, **options)
    if step is not None:
        fmt.step_dir(step)
        try:
            return CheckpointReader(store, step, read_manifest(store, step))
        except errors.NotRegularFileError:
            raise  # a FIFO, say, where the manifest should be: named as such
        except FileNotFoundError:
            raise errors.NotFoundError(
                f"{store.url}: no committed checkpoint at step {step}"
            ) from None
    return _open_newest(store, skip=())


_RELISTS = 8
"""How many times a reader re-lists the steps when the checkpoint it chose was retired under it
(each time the newest then complete one is taken; retention's grace makes a second rare)."""


def _open_newest(store: Store, skip: Iterable[int]) -> CheckpointReader:
    """The newest step whose manifest validates, other than ``skip``. A step whose manifest is
    damaged or refused (a symlink out of the root, unreadable, not a regular file) is skipped
    with a warning; if every listed step vanished meanwhile (retention), the steps are listed
    again."""
    skipped = set(skip)
    for _ in range(_RELISTS):
        steps = committed_steps(store)
        vanished = False
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
    raise errors.NotFoundError(f"{store.url}: no complete checkpoint found")


def _read_newest(store: Store, select: Mapping[str, Any] | None, into: Any) -> Any:
    """The state of the newest complete checkpoint. If the step is retired while it is read
    (its manifest gone, an object with it), the newest complete one is read instead; an object
    missing under a manifest that still exists is damage, raised as it is."""
    skip: set[int] = set()
    for _ in range(_RELISTS):
        reader = _open_newest(store, skip)
        try:
            return reader.state(select, into=into)
        except (FileNotFoundError, errors.CorruptCheckpointError) as err:
            if store.exists(fmt.manifest_key(reader.step)):
                raise
            log.info(
                "step %d was retired while being read (%s); reading the newest again",
                reader.step,
                err,
            )
            skip.add(reader.step)
    raise errors.NotFoundError(
        f"{store.url}: every checkpoint read was retired before it could be read whole "
        f"({_RELISTS} tries); is retention removing checkpoints faster than they are read?"
    )


# -- the public API ---------------------------------------------------------------------------


@dataclass
class SaveHandle:
    """A save in progress or done. ``blocking_seconds``: how long ``save`` held the caller."""

    step: int
    blocking_seconds: float
    _future: Future[SaveResult] | None = None
    _result: SaveResult | None = None
    _report: _BackgroundSave | None = None

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def wait(self, timeout: float | None = None) -> SaveResult:
        """Block until the save is committed; raise its error if it failed (at every call;
        once raised here, the failure is not raised again by the Checkpointer's next
        ``wait``/``save``/``close`` nor printed at exit). ``TimeoutError`` if ``timeout``
        seconds pass first."""
        result, error, _ = self._outcome(timeout)
        if error is not None:
            raise error
        assert result is not None
        return result

    result = wait

    def _outcome(
        self, timeout: float | None
    ) -> tuple[SaveResult | None, BaseException | None, bool]:
        """The save's result or error, and whether this call is the first to hand that error
        to the caller."""
        if self._result is None:
            assert self._future is not None
            error = self._future.exception(timeout)  # TimeoutError while the save still runs
            if error is not None:
                return None, error, self._report is None or self._report.claim()
            self._result = self._future.result()
        return self._result, None, False


class _BackgroundSave:
    """One background save as the exit report sees it.

    Held strongly by ``_unreported`` from its start until it commits or its failure has been
    handed to the caller once, whether or not its Checkpointer and handle still exist: the
    registry, not the Checkpointer, is what the exit hook reads. A finished save keeps only
    its error's text, not the error (whose traceback's frames hold the Checkpointer and the
    snapshot), so a dropped Checkpointer's memory is freed as usual.
    """

    __slots__ = ("error", "future", "reported", "step", "url")

    def __init__(self, step: int, url: str, future: Future[SaveResult]) -> None:
        self.step, self.url = step, url
        self.future: Future[SaveResult] | None = future
        self.error: str | None = None
        self.reported = False
        with _unreported_lock:
            _unreported[self] = None
        future.add_done_callback(self._finished)

    def _finished(self, future: Future[SaveResult]) -> None:
        error = None if future.cancelled() else future.exception()
        with _unreported_lock:
            self.future = None
            if error is None or self.reported:
                _unreported.pop(self, None)
            else:
                self.error = str(error)

    def claim(self) -> bool:
        """Mark the failure as reported; True for the first caller only."""
        with _unreported_lock:
            first, self.reported = not self.reported, True
            _unreported.pop(self, None)
        return first

    def report_at_exit(self) -> None:
        """Wait for the save if it still runs; print its failure on stderr unless reported."""
        with _unreported_lock:
            future = self.future
        error = self.error
        if future is not None:
            if not future.done():
                log.warning(
                    "interpreter exiting: waiting for the checkpoint save of step %d", self.step
                )
            try:
                exc = future.exception()
            except KeyboardInterrupt:
                if self.claim():
                    _print_err(
                        f"ckptio: interrupted while waiting for the background save of step {self.step}; "
                        f"it may not be committed (check with `ckptio ls {self.url}`)"
                    )
                return
            error = None if exc is None else str(exc)
        if error is not None and self.claim():
            _print_err(
                f"ckptio: the background save of step {self.step} FAILED and was not committed: {error}"
            )


def _print_err(msg: str) -> None:
    # print, not log: with logging unconfigured (or configured to stderr) a log record would
    # reach stderr as well, and the report must appear exactly once
    print(msg, file=sys.stderr, flush=True)


# background saves in flight, and failed ones whose failure no caller has been handed yet
_unreported: dict[_BackgroundSave, None] = {}
_unreported_lock = threading.Lock()


def _forget_parents_saves() -> None:
    """A forked child did not start its parent's saves (nor runs their threads): they are the
    parent's to wait for and report."""
    global _unreported_lock
    _unreported_lock = threading.Lock()
    _unreported.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parents_saves)


@atexit.register
def _wait_at_exit() -> None:
    """Interpreter exit: wait for every background save still in flight, and print on stderr,
    once, each failure that no ``wait``/``save``/``close``/``with`` has raised — including
    those of handles and Checkpointers dropped long before. Not when a Checkpointer is
    garbage-collected: that comes at an arbitrary moment and thread (a failure's traceback
    ties its Checkpointer into a reference cycle, freed only by the cyclic collector), while
    exit comes once, after the program's own chances to ``wait``.

    Exit status: left as the program set it (0 after a normal end). An exit hook cannot
    change it: Python ignores an exception raised there, and ``os._exit`` would skip the
    remaining exit handlers (logging's flush, other libraries' cleanup) and overwrite a
    status the program chose. A program whose status must tell calls ``wait()`` (or leaves
    the ``with`` block) before it ends: the failure is then raised there.
    """
    with _unreported_lock:
        saves = list(_unreported)
    for save in saves:
        save.report_at_exit()


# At interpreter exit, concurrent.futures stops accepting work (its hook runs in
# threading._shutdown, before atexit); a save still in flight would then fail. Hooks of
# threading._register_atexit run in reverse order, so this one, registered after
# concurrent.futures.thread was imported, waits for the save while the pools still work.
_register_thread_atexit = getattr(threading, "_register_atexit", None)
if _register_thread_atexit is not None:
    _register_thread_atexit(_wait_at_exit)


class Checkpointer:
    """Saves and loads the checkpoints of one run under ``url``: a storage URL
    (``s3://bucket/prefix``, ``file:///abs/path``, ...), a plain path or ``os.PathLike`` (a
    local directory), or a Store. URLs are parsed strictly (:func:`ckptio.registry.parse_url`):
    a malformed one is refused with the accepted forms.

    Options:

    - ``keep_last`` (int or None): after each committed save, delete all but the newest
      ``keep_last`` checkpoints (and debris of interrupted saves older than the newest). The
      first save of a Checkpointer also does so before it writes, so a job killed between a
      commit and its retention (a restart) never leaves more than ``keep_last + 1``.
      Retention never touches a save in flight (this job's or another's: see
      :mod:`ckptio.lease`) and applies to every checkpoint under the root; a second process
      saving under the same root is named in a warning.
    - ``retire_grace`` (seconds, default 60): a checkpoint removed by retention stops existing
      at once (its manifest goes first), but its data stays this long for readers that opened
      it just before; then retention or ``ckptio gc`` removes it. 0 frees the space at once
      (a reader then falls back to the newest checkpoint).
    - ``async_save`` (bool): ``save`` snapshots the state (one memory copy) and returns; the
      write and commit run in a background thread. A failure is reported exactly once: raised
      by the handle's ``wait``, or else by the next ``save``/``wait``/``close`` (leaving the
      ``with`` block), or else — handle and Checkpointer dropped, or the program ended
      first — printed on stderr at interpreter exit (which leaves the exit status as it is;
      see ``_wait_at_exit``). Leaving the ``with`` block or the interpreter waits for the
      save in flight. The snapshot memory (one state's worth, page-aligned) is kept for the next
      save, so later snapshots cost one memory copy and no page faults; ``close`` frees it.
    - ``snapshot`` (``copy``, ``fork``; async saves only): ``fork`` takes the snapshot by
      forking a child process that writes the shards from its copy-on-write view of the
      state, so ``save`` holds the caller for a fork (page tables) instead of a memory copy;
      while the child writes, the caller's first write to each page it has not written yet
      pays a page copy (written pages it gives back: a fault only), and the state's memory
      can double. Arrays in shared memory are copied first. Needs ``os.fork``, a store that is
      ``fork_safe`` (``file://``, ``pfs://``) and the ``file-per-shard`` layout; see
      :mod:`ckptio.forked`.
    - ``comm``: a :class:`~ckptio.dist.Communicator` (default: detected from the launcher).
      Every rank must create the Checkpointer and call ``save`` together.
    - ``layout`` (``file-per-shard``, ``shared-file``, ``shared-file-per-node``: see
      :data:`LAYOUTS`), ``key_layout`` (``flat``/``hashed``; default: the store's
      ``preferred_key_layout``), ``chunk_size``, ``max_object_size`` (file-per-shard only);
      any other option goes to the store (``streams``, ``part_size``, ...).
    - ``local`` (a URL, a URL with ``{rank}``, or one URL per rank): returns a
      :class:`ckptio.tiered.TieredCheckpointer` instead, which saves every step on that fast
      tier and drains some to ``url`` in the background (``keep_last_local``,
      ``persist_every``, ``drain_backpressure``: see there).
    """

    def __new__(cls, *args: Any, local: Any = None, **kwargs: Any) -> Any:
        if local is not None:  # a tiered Checkpointer (see the class docstring)
            return cls._tiered()(*args, local=local, **kwargs)
        return super().__new__(cls)

    @classmethod
    def _tiered(cls) -> Any:
        """The class ``cls(url, local=...)`` returns instead (integrations override it)."""
        if cls is not Checkpointer:
            raise errors.InvalidArgumentError(f"{cls.__name__} takes no local= tier")
        from ckptio.tiered import TieredCheckpointer

        return TieredCheckpointer

    def __init__(
        self,
        url: str | os.PathLike[str] | Store,
        *,
        keep_last: int | None = None,
        async_save: bool = False,
        comm: Communicator | None = None,
        layout: str = "file-per-shard",
        key_layout: str | None = None,
        chunk_size: int | str = DEFAULT_CHUNK_SIZE,
        max_object_size: int | str = DEFAULT_MAX_OBJECT_SIZE,
        snapshot: str = "copy",
        retire_grace: float = RETIRE_GRACE_SECONDS,
        **store_options: Any,
    ) -> None:
        if snapshot not in SNAPSHOTS:
            raise errors.InvalidArgumentError(
                f"unknown snapshot {snapshot!r}; valid: {', '.join(SNAPSHOTS)}"
            )
        if layout not in LAYOUTS:
            raise errors.InvalidArgumentError(
                f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}"
            )
        if key_layout is not None and key_layout not in fmt.KEY_LAYOUTS:
            raise errors.InvalidArgumentError(
                f"unknown key_layout {key_layout!r}; valid: {', '.join(fmt.KEY_LAYOUTS)}"
            )
        if keep_last is not None:
            keep_last = option_int(keep_last, field="keep_last", minimum=1)
        if not isinstance(retire_grace, int | float) or not 0 <= retire_grace < math.inf:
            raise errors.InvalidArgumentError(
                f"retire_grace: expected seconds >= 0, got {retire_grace!r}"
            )
        self.retire_grace = float(retire_grace)
        try:
            self.store = open_store(url, **store_options)
        except errors.UnknownOptionError as err:  # suggest the Checkpointer's options too
            raise err.widened(type(self).__name__, _own_options(type(self))) from None
        if layout != "file-per-shard" and not self.store.capabilities.positional_writes:
            raise errors.InvalidArgumentError(
                f"layout {layout!r} needs positional writes, which {self.store.url} "
                f"({self.store.name}) lacks; valid here: file-per-shard"
            )
        if snapshot == "fork":
            why = (
                "this platform has no os.fork"
                if not hasattr(os, "fork")
                else f"this platform has no {SMAPS} (Linux) to tell private memory from shared"
                if not os.path.exists(SMAPS)
                else f"{self.store.url} ({self.store.name}) cannot write from a forked process"
                if not self.store.fork_safe
                else f"layout {layout!r} coordinates ranks while writing"
                if layout != "file-per-shard"
                else ""
            )
            if why:
                raise errors.InvalidArgumentError(
                    f"snapshot='fork' is not possible here: {why}; use snapshot='copy'"
                    + ("" if layout == "file-per-shard" else " or layout='file-per-shard'")
                )
        key_layout = key_layout or self.store.preferred_key_layout
        self.snapshot = snapshot
        self.keep_last = keep_last
        self.async_save = async_save
        self.comm: Communicator = comm if comm is not None else detect()
        self.layout = layout
        self.key_layout = key_layout
        self.chunk_size = parse_size(chunk_size, field="chunk_size")
        self.max_object_size = parse_size(max_object_size, field="max_object_size")
        if self.chunk_size <= 0 or self.max_object_size <= 0:
            raise errors.InvalidArgumentError("chunk_size and max_object_size must be > 0")
        self._bg_comm: Communicator | None = None
        self._executor: ThreadPoolExecutor | None = None
        # async snapshots reuse this memory; a fork's child must see the copies it holds
        self._snapshots = SnapshotBuffers(inherit=snapshot == "fork")
        self._pending: SaveHandle | None = None
        self._lock = threading.Lock()
        self._retained = False  # retention ran once (see keep_last)
        self._warned_other_writer = False

    # -- saving -----------------------------------------------------------------------------
    def save(
        self, state: Any, step: int, *, metadata: Any = None, blocking: bool | None = None
    ) -> SaveHandle:
        """Save ``state`` as ``step``. Blocking: returns when committed. Async: returns after
        the snapshot; ``handle.wait()`` (or the next ``save``/``wait``) gives the outcome."""
        fmt.step_dir(step)
        self.wait()  # one save in flight at a time; raises the previous one's failure
        background = self.async_save if blocking is None else not blocking
        fork = background and self.snapshot == "fork"
        t0 = time.perf_counter()
        try:
            if self.comm.rank == 0:  # rank 0's state is the checkpoint's structure
                refuse_empty(state)
            prepared = _prepare(
                state,
                metadata,
                copy=self._fork_copies() if fork else background,
                buffers=self._snapshots,
            )
        except errors.CkptioError as err:
            if self.comm.size == 1:
                raise
            prepared = PreparedState(None, {}, None, error=err)  # still join the collective
        if not background:
            result = self._persist(prepared, step, self.comm)
            return SaveHandle(step, time.perf_counter() - t0, None, result)
        forked = self._fork_writer(prepared, step) if fork and prepared.error is None else None
        if self._executor is None:
            self._bg_comm = self.comm.dup() if self.comm.size > 1 else SingleProcess()
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ckptio-save")
        comm = self._bg_comm
        assert comm is not None
        try:
            fut = self._executor.submit(self._persist, prepared, step, comm, forked)
        except BaseException:
            if forked is not None:
                forked.cancel()
            raise
        report = _BackgroundSave(step, self.store.url, fut)
        handle = SaveHandle(step, time.perf_counter() - t0, fut, None, report)
        if prepared.error is not None:
            handle.wait()  # the collective fails on every rank; raise here, not later
        with self._lock:
            self._pending = handle
        return handle

    @staticmethod
    def _fork_copies() -> Callable[[np.ndarray], bool]:
        """Which arrays a fork would not snapshot (shared or not-inherited memory): those are
        copied before the fork, the rest is left to copy-on-write."""
        ranges = unforkable_ranges()
        return lambda array: in_ranges(array, ranges)

    def _fork_writer(self, prepared: PreparedState, step: int) -> ForkedWriter:
        """Fork the child that will write this rank's shards of ``prepared`` (see
        :mod:`ckptio.forked`); it waits for the plan's token and its share of the tensors."""
        store, rank, tensors = self.store, self.comm.rank, prepared.tensors
        key_layout, chunk_size, max_object_size = (
            self.key_layout,
            self.chunk_size,
            self.max_object_size,
        )

        def work(orders: Mapping[str, Any]) -> dict[str, Any]:
            # objects of at most FORK_OBJECT_BYTES: the memory of each is given back to the
            # parent (its pages become the parent's alone) as soon as it is durable
            return write_rank_shards(
                store,
                step,
                rank,
                orders["token"],
                [tensors[p] for p in orders["paths"]],
                key_layout=key_layout,
                chunk_size=chunk_size,
                max_object_size=min(max_object_size, FORK_OBJECT_BYTES),
                parallel=PARALLEL_OBJECTS,
                progress=PageReleaser(),
            )

        return ForkedWriter(work, after_fork=store.after_fork)

    def _persist(
        self,
        prepared: PreparedState,
        step: int,
        comm: Communicator,
        forked: ForkedWriter | None = None,
    ) -> SaveResult:
        if comm.rank == 0 and self.keep_last is not None and not self._retained:
            self._retain(step - 1)  # what a killed predecessor left before its retention ran
        try:
            result = _save_collective(
                self.store,
                prepared,
                step,
                comm,
                layout=self.layout,
                key_layout=self.key_layout,
                chunk_size=self.chunk_size,
                max_object_size=self.max_object_size,
                forked=forked,
            )
        finally:
            if forked is not None:
                forked.cancel()  # a no-op once it ran; ends the child if the save stopped before
        if comm.rank == 0 and self.keep_last is not None:
            self._retain(step)
        return result

    def _retain(self, newest: int) -> None:
        """Retire all but the newest ``keep_last`` steps up to ``newest`` (their data stays for
        readers for the grace period, see :mod:`ckptio.lease`) and collect debris."""
        self._retained = True
        try:
            sweep = retain(
                self.store, newest, self.keep_last, grace=self.retire_grace, doomed=self._doomed
            )
            others = sorted({lease.holder() for lease in sweep.live if not lease.mine()})
            if others and not self._warned_other_writer:
                self._warned_other_writer = True
                log.warning(
                    "another process is saving under %s (%s): keep_last=%d applies to every "
                    "checkpoint under the root, its checkpoints too (saves in flight are never "
                    "touched); give each job its own root to keep their checkpoints apart",
                    self.store.url,
                    ", ".join(others),
                    self.keep_last,
                )
        except Exception as err:  # retention must not fail a committed save
            log.warning("retention after step %d failed: %s", newest, err)

    def _doomed(self, steps: Sequence[int], newest: int) -> list[int]:
        """The committed ``steps`` retention retires: all but the newest ``keep_last`` up to
        ``newest`` (a tier of :class:`ckptio.tiered.TieredCheckpointer` keeps more)."""
        return doomed_steps(steps, newest, self.keep_last)

    def wait(self) -> SaveResult | None:
        """Wait for the save in flight, if any; raise its error if it failed, unless its
        handle's ``wait`` raised it already (a failure is handed to the caller once)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return None
        result, error, first = pending._outcome(None)
        if error is None or not first:
            return result
        if isinstance(error, errors.CkptioError) or not isinstance(error, Exception):
            raise error
        raise errors.SaveFailedError(
            f"background save of step {pending.step} failed: {error}"
        ) from error

    # -- loading ----------------------------------------------------------------------------
    # Each of these first waits for this Checkpointer's save in flight (raising its failure),
    # so a step it just saved in the background is seen as soon as it is asked for.
    def steps(self) -> list[int]:
        """Committed steps (manifest present), ascending."""
        self.wait()
        return committed_steps(self.store)

    def latest(self) -> int | None:
        """The newest step whose manifest validates, or None."""
        self.wait()
        try:
            return open_checkpoint(self.store).step
        except FileNotFoundError:
            return None

    def open(self, step: int | None = None) -> CheckpointReader:
        self.wait()
        return open_checkpoint(self.store, step)

    def load(
        self, step: int | None = None, *, select: Mapping[str, Any] | None = None, into: Any = None
    ) -> Any:
        """The state of ``step`` (default: the newest complete checkpoint); ``select`` and
        ``into`` as for :func:`load`."""
        self.wait()
        if step is not None:
            return open_checkpoint(self.store, step).state(select, into=into)
        return _read_newest(self.store, select, into)

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the save in flight (raising its failure) and release resources."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            self._snapshots.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        close_on_exit(self.close, exc_type)


def close_on_exit(close: Callable[[], None], exc_type: Any) -> None:
    """Leaving a Checkpointer's ``with`` block: ``close()``, raising its failure unless the
    body raised (then the body's exception propagates and the failure is logged)."""
    if exc_type is None:
        close()
        return
    try:
        close()
    except Exception as err:
        log.error("checkpoint save in flight failed while leaving the Checkpointer: %s", err)


def doomed_steps(steps: Sequence[int], newest: int, keep_last: int | None) -> list[int]:
    """Of the committed ``steps`` (ascending), those retention retires after a commit of
    ``newest``: all but the newest ``keep_last`` up to ``newest`` (none with ``None``)."""
    return [s for s in steps if s <= newest][:-keep_last] if keep_last else []


def retain(
    store: Store,
    newest: int,
    keep_last: int | None,
    *,
    grace: float = RETIRE_GRACE_SECONDS,
    doomed: Callable[[Sequence[int], int], list[int]] | None = None,
) -> _Sweep:
    """Retention and debris after a commit of ``newest`` (every Checkpointer and the DCP
    writer): retire the committed steps ``doomed`` names (default :func:`doomed_steps`), then
    sweep debris as :func:`collect_garbage` does with ``before_step=newest``, leaving temp
    files younger than :data:`~ckptio.lease.TEMP_MIN_AGE_SECONDS`."""
    steps = committed_steps(store)
    for s in doomed(steps, newest) if doomed else doomed_steps(steps, newest, keep_last):
        retire(store, s)
    return _sweep(store, before_step=newest, grace=grace, temp_min_age=TEMP_MIN_AGE_SECONDS)


def delete_step(store: Store, step: int) -> None:
    """Delete one checkpoint: the manifest first (so it stops existing at once), then data."""
    prefix = fmt.step_dir(step) + "/"
    store.delete([fmt.manifest_key(step)])
    store.delete([k for k in store.list(prefix) if is_key(k)])
    store.cleanup_incomplete(prefix)


def collect_garbage(
    store: Store,
    *,
    before_step: int | None = None,
    older_than: float = 0.0,
    unfinished: bool = False,
    dry_run: bool = False,
    grace: float = RETIRE_GRACE_SECONDS,
) -> list[str]:
    """Remove debris of interrupted or losing saves and the data of retired steps; never
    touches a committed checkpoint nor a save in flight.

    Nothing is removed under a step while a save holds a live lease there (see
    :mod:`ckptio.lease`): not its data, not a competing save's, not temp files or open uploads.
    Elsewhere it removes: objects under a committed step that its manifest does not name (a
    losing concurrent save), leases of dead saves, the data of a step retired by retention more
    than ``grace`` seconds ago, every object of a step without a manifest whose save's lease is
    dead, or that is older than ``before_step`` (default: the newest committed step), or, with
    ``unfinished``, of any step without a manifest, and temp files / open multipart uploads older than ``older_than``
    seconds (of any age under a step whose save's lease is dead: that save was killed). Before removing anything of a step it lists the step's leases again and checks its
    manifest once more, so a save that started or committed meanwhile keeps its data. Returns
    the keys removed (with ``dry_run``, that would be removed).
    """
    return _sweep(
        store,
        before_step=before_step,
        older_than=older_than,
        unfinished=unfinished,
        dry_run=dry_run,
        grace=grace,
    ).removed


@dataclass
class _Sweep:
    removed: list[str]
    live: list[LeaseInfo]
    """Leases of saves in flight (every step)."""


def _live_leases(store: Store, keys: Iterable[str], now: float) -> list[LeaseInfo]:
    infos = (read_lease(store, k) for k in keys if is_lease_key(k))
    return [i for i in infos if i is not None and i.live(now)]


def _sweep(
    store: Store,
    *,
    before_step: int | None = None,
    older_than: float = 0.0,
    unfinished: bool = False,
    dry_run: bool = False,
    grace: float = RETIRE_GRACE_SECONDS,
    temp_min_age: float = 0.0,
) -> _Sweep:
    """:func:`collect_garbage`, also returning the live leases. ``temp_min_age``: temp files and
    uploads younger than this are left under steps without a dead lease, whatever
    ``older_than`` says (retention passes :data:`~ckptio.lease.TEMP_MIN_AGE_SECONDS`: it runs
    beside other jobs' saves, whose lease is itself a temp file for an instant)."""
    by_step: dict[int, list[str]] = {}
    for key in filter(is_key, store.list("step-")):  # foreign keys are left alone
        s = fmt.parse_step_dir(key.partition("/")[0])
        if s is not None:
            by_step.setdefault(s, []).append(key)
    committed = [s for s, keys in by_step.items() if fmt.manifest_key(s) in keys]
    limit = before_step if before_step is not None else max(committed, default=None)
    now = time.time()
    removed: list[str] = []
    live: list[LeaseInfo] = []
    quiet: list[str] = []  # prefixes of steps with no save in flight
    over: list[str] = []  # quiet prefixes with a dead lease: their saves ended (killed)
    for s, keys in sorted(by_step.items()):
        prefix = fmt.step_dir(s) + "/"
        leases = _live_leases(store, keys, now)
        if leases:
            live.extend(leases)
            continue
        quiet.append(prefix)
        if any(map(is_lease_key, keys)):
            over.append(prefix)
        mkey = fmt.manifest_key(s)
        if mkey in keys:
            try:
                manifest = read_manifest(store, s)
            except (errors.CorruptCheckpointError, PermissionError):
                continue  # damaged or refused: leave it for a person to look at
            except FileNotFoundError:
                manifest = None  # retired meanwhile: judged as such on the next sweep
            if manifest is None:
                continue
            keep = {prefix + k for k in manifest.objects} | {mkey, retired_key(s)}
            stray = [k for k in keys if k not in keep]
        else:
            when = retired_at(store, s) if retired_key(s) in keys else None
            if when is not None:
                if now - when < grace:
                    continue
            elif not (
                unfinished or (limit is not None and s < limit) or any(map(is_lease_key, keys))
            ):
                continue  # may be a save in flight; a dead lease proves its save is over
            stray = keys
        # a save may have started (its lease listed after its first data) or committed since
        # the listing: its lease is published before its data, the manifest before its lease
        # is removed, so leases are listed again first and the manifest checked after them
        again = _live_leases(store, store.list(prefix), time.time())
        if again:
            live.extend(again)
            continue
        if mkey not in keys and store.exists(mkey):
            continue
        if stray and not dry_run:
            store.delete(stray)
        removed.extend(stray)
    if not dry_run:
        # temp files and open uploads: under every step when no save is in flight (that also
        # reaches steps with no listed object), else under the quiet steps only
        for prefix in quiet if live else ["step-"]:
            store.cleanup_incomplete(prefix, older_than=max(older_than, temp_min_age))
        # the temp files of a save whose lease is dead (a killed save) are debris at any age;
        # the leases are listed once more first, as above
        for prefix in over:
            if max(older_than, temp_min_age) > 0 and not _live_leases(
                store, store.list(prefix), time.time()
            ):
                store.cleanup_incomplete(prefix)
    return _Sweep(removed, live)


def _own_options(cls: type) -> list[str]:
    """The keyword arguments ``cls.__init__`` (and its bases') take by name: what a
    Checkpointer keeps for itself rather than passing on to its store."""
    import inspect  # error path only

    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None and klass is not object:
            names.update(
                p.name
                for p in inspect.signature(init).parameters.values()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.name not in ("self", "url")
            )
    return sorted(names)


def _split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    ck = {k: options.pop(k) for k in list(options) if k in _CHECKPOINT_OPTIONS}
    return ck, options


def save(
    state: Any,
    url: str | os.PathLike[str] | Store,
    step: int,
    *,
    blocking: bool = True,
    metadata: Any = None,
    comm: Communicator | None = None,
    **options: Any,
) -> SaveHandle:
    """Save ``state`` under ``url`` as ``step``. See :class:`Checkpointer` for options.

    ``blocking=False`` returns after the snapshot; the handle's ``wait`` raises a failure. A
    failure no ``wait`` raised (the handle dropped) is printed on stderr at interpreter exit,
    which also waits for the save if it still runs.
    """
    ck = Checkpointer(url, async_save=not blocking, comm=comm, **options)
    handle = ck.save(state, step, metadata=metadata)
    if blocking:
        ck.close()
    return handle


def load(
    url: str | os.PathLike[str] | Store,
    step: int | None = None,
    *,
    select: Mapping[str, Any] | None = None,
    into: Any = None,
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
    """
    if step is not None:
        return open_checkpoint(url, step, **options).state(select, into=into)
    return _read_newest(open_store(url, **options), select, into)


def verify(
    url: str | os.PathLike[str] | Store, step: int | None = None, **options: Any
) -> list[str]:
    """Re-read a checkpoint and check every CRC; the list of problems (empty when intact)."""
    return open_checkpoint(url, step, **options).verify()
