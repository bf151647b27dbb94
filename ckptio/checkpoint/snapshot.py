"""What a rank offers to save, and the snapshot of it (the bottom of the package).

:func:`prepare` walks a state into a :class:`PreparedState`: its structure (encoded by
:mod:`ckptio.format`), one :class:`LocalTensor` per array, and JSON metadata. Decisions:

- A background save copies the arrays once into :class:`SnapshotBuffers`, one page-aligned
  arena kept from one save to the next: later snapshots pay no page fault per page, and
  ``file://`` writes from it with ``O_DIRECT`` without a copy. Copies are split over
  :func:`cpu_pool` (streaming stores, :func:`ckptio.arrays.copy_into`).
- A blocking save copies nothing: it writes from the caller's arrays.
- Everything a load would refuse (an empty state, an unsupported dtype, metadata that is not
  JSON or too large) is refused here, before anything is written.
- :func:`aligned_empty` gives large arrays page-aligned memory of 4 KiB pages (``load``
  returns such arrays).

Also here, because both the write and the read path need them: the process's CPU thread pool
and :func:`crc32c`. A forked child forgets the pool and the arenas it did not inherit."""

from __future__ import annotations

import math
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import crc32c as _crc32c
import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.arrays import (
    as_host_array,
    contiguous_le,
    copy_into,
    hugetlb_pages,
    private_pages,
)

__all__ = [
    "PAGE",
    "PAGE_ALIGNED_MIN",
    "SNAPSHOTS",
    "LocalTensor",
    "PreparedState",
    "Shard",
    "SnapshotBuffers",
    "aligned_empty",
    "cpu_pool",
    "crc32c",
    "refuse_empty",
]

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


def _align_for(nbytes: int) -> int:
    return PAGE if nbytes >= PAGE_ALIGNED_MIN else 64


class SnapshotBuffers:
    """Host memory for async snapshots, page-aligned and kept from one save to the next.

    A Checkpointer has one save in flight at a time, so when a save starts the previous
    snapshot's memory is free again. Reusing it avoids the page fault per 4 KiB that fresh
    memory costs, which makes a copy into fresh memory several times slower than into memory
    already touched (the ``memcpy`` and ``memcpy-fresh`` cases of ``benchmarks/run.py``), and
    page alignment lets ``file://`` write it with O_DIRECT without a copy. Holds one state's
    worth of memory until :meth:`release`.
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
    """In a forked child: arenas that were not inherited are forgotten (the maps themselves
    stay referenced there, never unmapped: :data:`ckptio.arrays.not_inherited`)."""
    for buffers in list(_not_inherited_buffers):
        buffers._arena = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_uninherited_arenas)


def aligned_empty(shape: tuple[int, ...], dtype: Any, *, hugetlb: bool = False) -> np.ndarray:
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
    ``memcpy-fresh`` and ``memcpy-fresh-numpy`` cases of ``benchmarks/run.py`` measure both
    choices; ``ckptio-sync-aligned`` against ``ckptio-sync`` the saves from such memory.

    ``hugetlb=True``: large arrays on pages of the kernel's hugetlb pool where it has enough
    free (:func:`ckptio.arrays.hugetlb_pages`), else as above."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes < PAGE_ALIGNED_MIN:
        return np.empty(shape, dtype=dt)
    huge = hugetlb_pages(nbytes) if hugetlb else None
    if huge is not None:
        return np.frombuffer(huge, dtype=np.uint8, count=nbytes).view(dt).reshape(shape)
    try:
        buf = private_pages(fmt.align_up(nbytes, PAGE))
    except OSError:  # e.g. the per-process limit on mappings (vm.max_map_count)
        raw = np.empty(nbytes + PAGE, dtype=np.uint8)
        start = -raw.ctypes.data % PAGE
        return raw[start : start + nbytes].view(dt).reshape(shape)
    return np.frombuffer(buf, dtype=np.uint8, count=nbytes).view(dt).reshape(shape)


def prepare(
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
        problem = mf.metadata_problem(text.encode("utf-8", "surrogatepass"))
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
