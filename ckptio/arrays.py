"""What counts as an array in a state, and how it becomes host memory (numpy) without a copy
where that is possible.

numpy arrays are taken as they are. Other frameworks' arrays are recognised by the module of
their type and converted by a lazily imported adapter, so ckptio imports neither torch nor jax
unless the state holds their arrays.
"""

from __future__ import annotations

import importlib
import mmap
from collections.abc import Callable
from typing import Any

import numpy as np

#: type-module prefix -> "module:function" turning such an object into a numpy array (or None
#: when the object is not an array after all). Integrations add entries.
ADAPTERS: dict[str, str] = {
    "torch": "ckptio.torch:to_numpy",
    "jax": "ckptio.jax:to_numpy",
    "jaxlib": "ckptio.jax:to_numpy",
}

_loaded: dict[str, Callable[[Any], np.ndarray | None]] = {}


not_inherited: list[object] = []
"""In a forked child: ckptio's memory maps that were not inherited (``inherit=False``), which
the child forgot. Kept referenced so they are never unmapped there: their addresses may hold
the child's own mappings later."""


def private_pages(nbytes: int, *, inherit: bool = True) -> mmap.mmap:
    """``nbytes`` (a multiple of the page size) of page-aligned, zero-filled anonymous memory,
    mapped private: a forked process gets its own copy-on-write view of it, never memory it
    shares with its parent (``mmap.mmap(-1, n)`` alone maps it shared).

    ``inherit=False`` (ckptio's own scratch memory: staging blocks, copy snapshots): forked
    processes do not get it at all (``MADV_DONTFORK``). So a fork (a DataLoader worker, a
    ``snapshot="fork"`` writer) neither write-protects it, which would cost a page fault per
    4 KiB at its next use, nor hands the child buffers the parent keeps using."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if not flags:  # Windows
        return mmap.mmap(-1, nbytes)
    m = mmap.mmap(-1, nbytes, flags=flags)
    if not inherit and hasattr(mmap, "MADV_DONTFORK"):
        m.madvise(mmap.MADV_DONTFORK)
    return m


def as_host_array(obj: Any) -> np.ndarray | None:
    """``obj`` as a numpy array in host memory, or None if it is not an array.

    numpy scalars (``np.float32(1)``) are not arrays here: they are stored inline.
    """
    if isinstance(obj, np.ndarray):
        return obj
    module = type(obj).__module__
    for prefix, target in ADAPTERS.items():
        if module == prefix or module.startswith(prefix + "."):
            fn = _loaded.get(target)
            if fn is None:
                mod_name, _, attr = target.partition(":")
                fn = getattr(importlib.import_module(mod_name), attr)
                _loaded[target] = fn
            return fn(obj)
    return None


def contiguous_le(array: np.ndarray) -> np.ndarray:
    """C-contiguous and little-endian: the stored form. Copies only when it must."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    # not np.ascontiguousarray: it turns 0-d arrays into 1-d ones
    return array if array.flags.c_contiguous else array.copy(order="C")
