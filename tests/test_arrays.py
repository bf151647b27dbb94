"""ckptio.arrays: prefaulting memory that a copy is about to fill, and the copy itself."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import pytest
from _smaps import mapping_flags, mapping_kib

from ckptio import arrays
from ckptio.arrays import PAGE, PREFAULT_MIN, prefault, private_pages

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's"
)


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
def test_prefault_leaves_a_view_whose_last_page_is_mapped_alone() -> None:
    """A view whose last whole page is mapped is taken as mapped already (memory read into
    again, arrays a load fills in place), so a second call is no second walk of its page
    table; a view whose last page is not mapped is mapped whole."""
    if not arrays._prefault_works:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    n = 8 << 20
    mem = private_pages(n)
    mem.madvise(mmap.MADV_DONTDUMP)  # its own smaps entry
    mem.madvise(mmap.MADV_NOHUGEPAGE)
    a = np.frombuffer(mem, dtype=np.uint8)
    addr = int(a.ctypes.data)
    a[-PAGE:] = 5  # the last page mapped and written
    assert arrays.page_mapped(addr + n - PAGE) and not arrays.page_mapped(addr)
    prefault(memoryview(a))
    assert _rss_bytes(addr, n) == PAGE  # left alone
    prefault(memoryview(a)[: n - PAGE])  # its last page is not mapped: mapped whole
    assert _rss_bytes(addr, n) == n
    assert (a[-PAGE:] == 5).all() and not a[:-PAGE].any()


@linux_only
def test_prefault_is_harmless_where_the_kernel_refuses() -> None:
    read_only = mmap.mmap(-1, 2 * PREFAULT_MIN, prot=mmap.PROT_READ)
    prefault(memoryview(read_only))  # the kernel refuses (EFAULT): nothing is raised
    assert not any(read_only[::PAGE])


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage").exists(), reason="no transparent huge pages"
)
def test_staging_blocks_ask_for_huge_pages_and_other_scratch_memory_does_not() -> None:
    """Staging blocks are reused for every O_DIRECT transfer, so they are on huge pages (few,
    large device requests); memory touched once (snapshots, load buffers) keeps 4 KiB pages,
    whose first touch is cheaper."""
    from ckptio.backends._directio import aligned_buffer

    stage = aligned_buffer(4 << 20)
    flags = mapping_flags(int(np.frombuffer(stage, dtype=np.uint8).ctypes.data))
    assert {"hg", "dc"} <= flags  # MADV_HUGEPAGE, and not inherited by forks (MADV_DONTFORK)
    plain = private_pages(4 << 20)
    plain.madvise(mmap.MADV_DONTDUMP)  # its own mapping, not merged with the stage's
    assert "hg" not in mapping_flags(int(np.frombuffer(plain, dtype=np.uint8).ctypes.data))


@pytest.fixture(params=["streaming", "numpy"])
def copier(request, monkeypatch):
    """copy_into through the compiled module and through its numpy fallback."""
    if request.param == "streaming":
        if arrays._stream_copy is None:
            pytest.skip("ckptio._memcopy was not built (no C compiler at install)")
    else:
        monkeypatch.setattr(arrays, "_stream_copy", None)
    return arrays.copy_into


@pytest.mark.parametrize(
    "n", [0, 1, 15, 16, 63, 64, 65, (256 << 10) - 1, 256 << 10, (256 << 10) + 77, 3 << 20]
)
def test_copy_into_copies_every_byte_at_every_alignment(copier, n) -> None:
    rng = np.random.default_rng(n)
    src_buf = rng.integers(0, 256, n + 64, dtype=np.uint8)
    for d_off, s_off in [(0, 0), (1, 0), (0, 3), (7, 13), (16, 1), (63, 62)]:
        dst_buf = np.full(n + 128, 0xA5, dtype=np.uint8)
        copier(dst_buf[d_off : d_off + n], src_buf[s_off : s_off + n])
        assert np.array_equal(dst_buf[d_off : d_off + n], src_buf[s_off : s_off + n]), (
            n,
            d_off,
            s_off,
        )
        # not a byte outside the destination: streaming stores write whole 16-byte lines
        assert (dst_buf[:d_off] == 0xA5).all() and (dst_buf[d_off + n :] == 0xA5).all(), (
            n,
            d_off,
            s_off,
        )


def test_copy_into_takes_any_dtype_as_bytes(copier) -> None:
    import ml_dtypes

    src = np.arange(300_000, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(600, 500)
    dst = np.empty_like(src)
    copier(dst, src)
    assert np.array_equal(dst.view(np.uint16), src.view(np.uint16))
    stamps = np.arange(70_000).astype("datetime64[s]")  # a dtype without a buffer format
    out = np.empty_like(stamps)
    copier(out, stamps)
    assert np.array_equal(out, stamps)
    ro = np.frombuffer(bytes(range(256)) * 2048, dtype=np.uint8)  # a read-only source
    into = np.empty(ro.size, dtype=np.uint8)
    copier(into, ro)
    assert np.array_equal(into, ro)


def test_copy_into_refuses_what_it_cannot_copy_whole(copier) -> None:
    with pytest.raises(ValueError, match="equal size"):
        copier(np.empty(10, np.uint8), np.empty(11, np.uint8))
    with pytest.raises(ValueError, match="contiguous"):
        copier(np.empty((4, 4))[:, :2], np.empty((4, 2)))
    with pytest.raises((ValueError, TypeError)):
        copier(np.frombuffer(bytes(8), dtype=np.uint8), np.zeros(8, np.uint8))  # read-only dst


def test_copy_into_runs_threads_in_parallel_without_a_torn_byte() -> None:
    """Copies on several threads at once (the snapshot's CPU pool) each land whole. (That
    the GIL is released is measured by the benchmark's copy times, not asserted here.)"""
    from concurrent.futures import ThreadPoolExecutor

    n = 4 << 20
    srcs = [np.full(n, i, dtype=np.uint8) for i in range(8)]
    dsts = [np.zeros(n, dtype=np.uint8) for _ in range(8)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: arrays.copy_into(dsts[i], srcs[i]), range(8)))
    assert all((d == i).all() for i, d in enumerate(dsts))
