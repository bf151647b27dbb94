"""What counts as an array in a state, and how it becomes host memory (numpy) without a copy
where that is possible.

numpy arrays are taken as they are. Other frameworks' arrays are recognised by the module of
their type and converted by a lazily imported adapter, so ckptio imports neither torch nor jax
unless the state holds their arrays.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib
import mmap
import os
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptio import errors

__all__ = [
    "ADAPTERS",
    "CAPACITY_TTL",
    "MADV_POPULATE_WRITE",
    "PAGE",
    "PREFAULT_MIN",
    "TARGETS",
    "Target",
    "address",
    "as_host_array",
    "as_target",
    "contiguous_le",
    "copy_into",
    "ensure_memory",
    "hugetlb_pages",
    "memory_capacity",
    "not_inherited",
    "prefault",
    "private_pages",
]

#: type-module prefix -> "module:function" turning such an object into a numpy array (or None
#: when the object is not an array after all). Integrations add entries.
ADAPTERS: dict[str, str] = {
    "torch": "ckptio.torch:to_numpy",
    "jax": "ckptio.jax:to_numpy",
    "jaxlib": "ckptio.jax:to_numpy",
}

#: type-module prefix -> "module:function" turning such an array into a :class:`Target` that a
#: load fills in place (or None when the object is not an array after all)
TARGETS: dict[str, str] = {
    "torch": "ckptio.torch:to_target",
}

_loaded: dict[str, Callable[..., Any]] = {}


@dataclass(slots=True)
class Target:
    """An array that a load fills in place (``ckptio.load(..., into=state)``)."""

    leaf: Any
    """The caller's object, returned in the loaded state."""
    view: np.ndarray
    """Writable host memory the bytes are read into: the leaf's own memory where it has some."""
    finish: Callable[[], object] | None = None
    """Run once ``view`` holds the bytes, to move them into the leaf (e.g. onto a GPU)."""


not_inherited: list[object] = []
"""In a forked child: ckptio's memory maps that were not inherited (``inherit=False``), which
the child forgot. Kept referenced so they are never unmapped there: their addresses may hold
the child's own mappings later."""

_uninherited_maps: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()
"""Every live ``inherit=False`` map of this process (see :func:`_keep_uninherited_maps`)."""


def _keep_uninherited_maps() -> None:
    """In a forked child: every map the child did not inherit is kept referenced for good
    (:data:`not_inherited`). Closing one unmaps its address range, and in the child that
    range is a hole its own mappings fill (a thread's stack, Python's object arenas, fresh
    staging blocks): the child's garbage collector freeing a cycle the parent left behind, or
    the child dropping the last view of a replaced snapshot arena or of a staging block a
    writer held, would unmap that memory under the child (SIGSEGV, or objects read from
    whatever is mapped there next)."""
    not_inherited.extend(list(_uninherited_maps))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_keep_uninherited_maps)


_capacity: tuple[float, int | None] = (-1e9, None)
CAPACITY_TTL = 10.0
"""Seconds :func:`memory_capacity` reuses what it read (a load of many tensors one by one,
as PyTorch DCP's reader does, asks per tensor; limits change rarely: a container resized)."""


def memory_capacity() -> int | None:
    """The most memory this process could be given, in bytes: physical memory plus swap
    (``/proc/meminfo``), less where a cgroup limits it (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``, of the process's group or any group above it). None where
    unknown. The capacity, not what is free now: a load that the kernel could serve by
    reclaiming caches (which ``MemAvailable`` undercounts, e.g. ZFS's ARC) is never refused."""
    global _capacity
    now = time.monotonic()
    if now - _capacity[0] > CAPACITY_TTL:
        _capacity = (now, _read_capacity())
    return _capacity[1]


def _read_capacity() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {
                k: int(v.split()[0]) * 1024
                for k, _, v in (line.partition(":") for line in f)
                if v.strip()
            }
        total = info["MemTotal"] + info.get("SwapTotal", 0)
    except (OSError, KeyError, ValueError):
        return None
    limits = [total]
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            groups = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        groups = []
    for _, controllers, path in (g for g in groups if len(g) == 3):
        if controllers == "":
            base, name = "/sys/fs/cgroup", "memory.max"
        elif "memory" in controllers.split(","):
            base, name = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):  # the group, its ancestors, the mount's root
            try:
                with open("/".join([base, *parts[:depth], name]), encoding="ascii") as f:
                    value = f.read().strip()
            except OSError:
                continue
            if value.isdigit():  # "max": no limit
                limits.append(int(value))
    return min(limits)


def ensure_memory(nbytes: int, what: str) -> None:
    """Raise :class:`~ckptio.errors.InsufficientMemoryError` before allocating ``nbytes``
    that this machine (or cgroup) could never give (:func:`memory_capacity`)."""
    capacity = memory_capacity()
    if capacity is not None and nbytes > capacity:
        raise errors.InsufficientMemoryError(
            f"{what} needs {nbytes} bytes of memory, more than this machine can give ({capacity} "
            "bytes of memory and swap, or its cgroup's limit); refused before reading"
        )


def private_pages(nbytes: int, *, inherit: bool = True, huge: bool = False) -> mmap.mmap:
    """``nbytes`` (a multiple of the page size) of page-aligned, zero-filled anonymous memory,
    mapped private: a forked process gets its own copy-on-write view of it, never memory it
    shares with its parent (``mmap.mmap(-1, n)`` alone maps it shared).

    ``inherit=False`` (ckptio's own scratch memory: staging blocks, copy snapshots): forked
    processes do not get it at all (``MADV_DONTFORK``). So a fork (a DataLoader worker, a
    ``snapshot="fork"`` writer) neither write-protects it, which would cost a page fault per
    4 KiB at its next use, nor hands the child buffers the parent keeps using.

    ``huge=True`` (memory that is reused for ``O_DIRECT`` transfers: staging blocks) asks for
    transparent huge pages (``MADV_HUGEPAGE``), where the kernel has them: memory physically
    contiguous in 2 MiB pieces. The block layer builds a request from physically contiguous
    segments, and a device takes a bounded number of segments per request
    (``/sys/block/<dev>/queue/max_segments``), so a large transfer from scattered 4 KiB pages
    is split into several requests, from huge pages it goes as one. How scattered 4 KiB pages
    are depends on how fragmented free memory was when they were first touched. The
    ``ckptio-sync`` and ``ckptio-load-into`` cases of ``benchmarks/run.py`` measure the staged
    saves and loads this serves. The first touch of a huge page costs more (zeroing 2 MiB, and
    compaction where free memory is fragmented), so it pays only for memory that is reused."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if not flags:  # Windows
        return mmap.mmap(-1, nbytes)
    m = mmap.mmap(-1, nbytes, flags=flags)
    if not inherit and hasattr(mmap, "MADV_DONTFORK"):
        _uninherited_maps.add(m)  # before the advice: a fork between them keeps a copy it has
        m.madvise(mmap.MADV_DONTFORK)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages
            m.madvise(mmap.MADV_HUGEPAGE)
    return m


PAGE = mmap.PAGESIZE

MAP_HUGETLB: int = getattr(mmap, "MAP_HUGETLB", 0x40000 if sys.platform.startswith("linux") else 0)
"""The mmap flag that maps pages of the kernel's hugetlb pool (Linux's value where Python's
``mmap`` module has no name for it); 0 where the platform has no such pool."""


def _huge_page_size() -> int:
    """Bytes of the hugetlb pool's default page (``Hugepagesize`` in /proc/meminfo), 2 MiB
    where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("Hugepagesize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 2 << 20


def hugetlb_pages(nbytes: int) -> mmap.mmap | None:
    """``nbytes`` (rounded up to whole huge pages) of private anonymous memory from the
    kernel's hugetlb pool (``MAP_HUGETLB``: pages an administrator reserved, as in
    ``echo N > /proc/sys/vm/nr_hugepages``), or None where the pool lacks free pages (or the
    platform has none). The mapping reserves its pages at once, so a short pool is refused
    here, never met later as a fault.

    Pool pages are physically contiguous and set aside in advance, so the kernel only zeroes
    them on first touch, and an ``O_DIRECT`` read into them reaches the device in requests of the
    device's largest size. Transparent huge pages (``MADV_HUGEPAGE``) are not the same thing:
    the kernel finds (and may compact) each one at its first touch, dearer than 4 KiB pages
    on a VM whose host reclaims freed memory (``benchmarks/run.py``'s ``memcpy-fresh-numpy``
    case measures it)."""
    if not MAP_HUGETLB or not hasattr(mmap, "MAP_ANONYMOUS"):
        return None
    huge = _huge_page_size()
    size = max(huge, -(-nbytes // huge) * huge)
    try:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
    except OSError:  # ENOMEM: too few free pages in the pool; EINVAL: no such pool
        return None


try:  # resolved at import, in the parent: the dynamic loader's lock may be held at a fork
    madvise: Callable[[int, int, int], int] | None = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)  # type: ignore[union-attr]
    madvise.restype = ctypes.c_int  # type: ignore[union-attr]
except (OSError, AttributeError):  # no C library to call
    madvise = None
"""libc's ``madvise(addr, length, advice)`` on any memory (``mmap.madvise`` takes only the
maps Python made), or None where there is none."""

try:
    mincore: Callable[[int, int, Any], int] | None = ctypes.CDLL(None, use_errno=True).mincore
    mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)  # type: ignore[union-attr]
    mincore.restype = ctypes.c_int  # type: ignore[union-attr]
except (OSError, AttributeError):
    mincore = None
"""libc's ``mincore(addr, length, vec)``: whether pages are mapped (:func:`page_mapped`)."""

MADV_POPULATE_WRITE: int | None = getattr(
    mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None
)
"""Linux 5.14+: fault a range in, writable, in one call (Python's mmap module has no name for
it before 3.13)."""
PREFAULT_MIN = 1 << 20
"""Bytes: smaller reads are not worth a system call."""
_prefault_works = MADV_POPULATE_WRITE is not None and madvise is not None


try:
    from ckptio._memcopy import copy as _stream_copy
except ImportError:  # installed without a C compiler (setup.py builds it optionally)
    _stream_copy = None


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for C-contiguous arrays of the same number of bytes (any dtypes:
    the bytes are copied), as one large copy with the GIL released.

    Large copies go through :mod:`ckptio._memcopy`, whose non-temporal stores skip reading
    each destination cache line before writing it; a snapshot or staging copy is not read
    again before storage takes it. The ``ckptio-async`` and ``ckptio-async-numpy-copy`` cases
    of ``benchmarks/run.py`` compare it with ``numpy.copyto``, which is used where the
    compiled module is missing."""
    if dst.nbytes != src.nbytes or not (dst.flags.c_contiguous and src.flags.c_contiguous):
        raise ValueError(
            f"copy_into: needs C-contiguous arrays of equal size, got {dst.nbytes} bytes "
            f"(contiguous: {dst.flags.c_contiguous}) from {src.nbytes} ({src.flags.c_contiguous})"
        )
    d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)  # any dtype, as bytes
    if _stream_copy is not None:
        _stream_copy(d, s)
    else:
        np.copyto(d, s)


def address(view: memoryview) -> int:
    """Address of the first byte of ``view`` (read-only buffers too)."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0


_MINCORE_VEC = ctypes.c_ubyte * 1


def page_mapped(addr: int) -> bool:
    """Whether the page at ``addr`` (page-aligned) is mapped in this process (``mincore``);
    False where that cannot be asked."""
    if mincore is None:
        return False
    vec = _MINCORE_VEC()
    return mincore(addr, PAGE, vec) == 0 and bool(vec[0] & 1)


def prefault(view: memoryview) -> None:
    """Map the whole pages of ``view``, which a copy is about to fill, in one system call
    (``MADV_POPULATE_WRITE``); elsewhere, or when the kernel refuses, nothing happens.

    A copy into fresh memory (a socket's bytes, a staging block) otherwise takes one page
    fault per 4 KiB page; populating first does the same work in one call, with less kernel
    CPU (``benchmarks/s3_peers.py`` measures the CPU per byte of S3 downloads, which read into
    such memory). Where a VM's host is slow to back fresh pages,
    that cost is the host's and no advice changes it. Reads by DMA (``O_DIRECT``)
    gain nothing: the kernel maps their pages in bulk already.

    A view whose last whole page is mapped already is taken as mapped (one ``mincore`` call,
    microseconds), and nothing is done: populating mapped pages is no fault, but a walk of
    the page table that marks every page accessed, about a quarter of a first populate's
    kernel CPU (``docs/performance.md``, "Against Ceph RGW"): a load ``into=`` arrays in
    use, or a buffer read into again. A view mapped only in part, its last page among the
    mapped, is then filled with a fault per unmapped page, as without this call."""
    global _prefault_works
    call, advice = madvise, MADV_POPULATE_WRITE
    if not _prefault_works or view.nbytes < PREFAULT_MIN or call is None or advice is None:
        return
    lo = address(view)
    hi = (lo + view.nbytes) // PAGE * PAGE
    lo = -(-lo // PAGE) * PAGE
    if hi <= lo or page_mapped(hi - PAGE):
        return
    failed = call(lo, hi - lo, advice) != 0
    if failed and ctypes.get_errno() == errno.EINVAL:  # a kernel before 5.14: stop asking
        _prefault_works = False


def as_host_array(obj: Any) -> np.ndarray | None:
    """``obj`` as a numpy array in host memory, or None if it is not an array.

    numpy scalars (``np.float32(1)``) are not arrays here: they are stored inline.
    """
    if isinstance(obj, np.ndarray):
        return obj
    fn = _adapter(obj, ADAPTERS)
    return None if fn is None else fn(obj)


def as_target(obj: Any, path: str) -> Target | None:
    """``obj`` (found at ``path`` of a load's ``into=`` state) as a :class:`Target`, or None
    if it is not an array. Arrays that cannot be written in place are refused by name."""
    if isinstance(obj, np.ndarray):
        if not obj.flags.writeable:
            raise errors.InvalidArgumentError(
                f"into= at {path!r}: a read-only numpy array cannot be filled in place"
            )
        return Target(obj, obj)
    fn = _adapter(obj, TARGETS)
    if fn is not None:
        return fn(obj, path)
    if isinstance(obj, np.generic) or as_host_array(obj) is None:
        return None
    raise errors.InvalidArgumentError(
        f"into= at {path!r}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be filled in "
        "place (JAX arrays are immutable: use ckptio.jax.load(url, target=...)); load without into="
    )


def _adapter(obj: Any, table: dict[str, str]) -> Callable[..., Any] | None:
    """The function ``table`` names for the module of ``obj``'s type, imported on first use."""
    module = type(obj).__module__
    for prefix, target in table.items():
        if module == prefix or module.startswith(prefix + "."):
            fn = _loaded.get(target)
            if fn is None:
                mod_name, _, attr = target.partition(":")
                fn = getattr(importlib.import_module(mod_name), attr)
                _loaded[target] = fn
            return fn
    return None


def contiguous_le(array: np.ndarray) -> np.ndarray:
    """C-contiguous and little-endian: the stored form. Copies only when it must."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    # not np.ascontiguousarray: it turns 0-d arrays into 1-d ones
    return array if array.flags.c_contiguous else array.copy(order="C")
