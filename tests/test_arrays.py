"""ckptio.arrays: prefaulting memory that a copy is about to fill."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest
from _smaps import mapping_kib

from ckptio import arrays
from ckptio.arrays import PAGE, PREFAULT_MIN, prefault, private_pages

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")


def _rss_bytes(addr: int, n: int) -> int:
    return mapping_kib(addr, n, "Rss") * 1024


@linux_only
def test_prefault_maps_the_whole_pages_of_a_view_and_changes_no_byte() -> None:
    n = 8 << 20
    mem = private_pages(n)
    mem.madvise(mmap.MADV_DONTDUMP)  # a flag its neighbours lack: its own smaps entry
    mem.madvise(mmap.MADV_NOHUGEPAGE)  # 4 KiB pages whatever the machine's THP setting
    a = np.frombuffer(mem, dtype=np.uint8)
    a[:PAGE] = 7  # the first page mapped and written
    addr = int(a.ctypes.data)
    assert _rss_bytes(addr, n) == PAGE
    prefault(memoryview(a)[: PREFAULT_MIN - 1])  # too small to be worth a call
    assert _rss_bytes(addr, n) == PAGE
    prefault(memoryview(a)[100 : n - 100])  # the first and last pages are partly outside
    if not arrays._prefault_works:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    assert _rss_bytes(addr, n) == n - PAGE  # every page but the last
    assert (a[:PAGE] == 7).all() and not a[PAGE:].any()


@linux_only
def test_prefault_is_harmless_where_the_kernel_refuses() -> None:
    read_only = mmap.mmap(-1, 2 * PREFAULT_MIN, prot=mmap.PROT_READ)
    prefault(memoryview(read_only))  # the kernel refuses (EFAULT): nothing is raised
    assert not any(read_only[:: PAGE])
