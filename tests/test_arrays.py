"""ckptio.arrays: prefaulting memory that a copy is about to fill."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import pytest
from _smaps import mapping_flags, mapping_kib

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


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage").exists(), reason="no transparent huge pages")
def test_staging_blocks_ask_for_huge_pages_and_other_scratch_memory_does_not() -> None:
    """Staging blocks are reused for every O_DIRECT transfer, so they are on huge pages (few,
    large device requests); memory touched once (snapshots, load buffers) keeps 4 KiB pages,
    whose first touch is cheaper."""
    from ckptio.backends.local import _aligned_buffer

    stage = _aligned_buffer(4 << 20)
    flags = mapping_flags(int(np.frombuffer(stage, dtype=np.uint8).ctypes.data))
    assert {"hg", "dc"} <= flags  # MADV_HUGEPAGE, and not inherited by forks (MADV_DONTFORK)
    plain = private_pages(4 << 20)
    plain.madvise(mmap.MADV_DONTDUMP)  # its own mapping, not merged with the stage's
    assert "hg" not in mapping_flags(int(np.frombuffer(plain, dtype=np.uint8).ctypes.data))
