"""``ckptio.load(..., hugetlb=True)``: the new arrays on pages of the kernel's hugetlb pool where
it has enough free, on ordinary pages where it does not; every chunk's CRC32C checked either
way. The pool is the machine's: a test that needs pages reserves them (root) and gives the
pool back its size after; without root it is skipped."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio.arrays import hugetlb_pages

MiB = 1 << 20
NR = "/proc/sys/vm/nr_hugepages"


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _kernel_page_kib(address: int) -> int:
    """KiB of the pages behind ``address`` in this process (``KernelPageSize`` in smaps)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "KernelPageSize:":
                return int(line.split()[1])
    raise AssertionError(f"{address:#x} is not mapped")


@contextlib.contextmanager
def _pool_with_free(pages: int) -> Iterator[None]:
    """The hugetlb pool resized so that exactly ``pages`` of it are free (as root), and put
    back to its size after."""
    if os.geteuid() != 0 or not os.path.exists(NR) or _meminfo("Hugepagesize") != 2048:
        pytest.skip("needs root and a hugetlb pool of 2 MiB pages")
    with open(NR) as f:
        before = int(f.read())
    in_use = _meminfo("HugePages_Total") - _meminfo("HugePages_Free")
    try:
        with open(NR, "w") as f:
            f.write(str(in_use + pages))
        if _meminfo("HugePages_Free") != pages:
            pytest.skip(f"the kernel could not give the pool {pages} free pages")
        yield
    finally:
        with open(NR, "w") as f:
            f.write(str(before))


def _state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "w": rng.standard_normal((1024, 1024), dtype=np.float32),  # 4 MiB: two huge pages
        "b": rng.standard_normal(7).astype(np.float32),  # small: ordinary memory
    }


def test_hugetlb_load_puts_large_arrays_on_pool_pages(tmp_path: Path) -> None:
    state = _state()
    ckptio.save(state, f"file://{tmp_path}", step=1)
    with _pool_with_free(4):
        got = ckptio.load(f"file://{tmp_path}", hugetlb=True)
        assert _meminfo("HugePages_Free") == 2  # the 4 MiB array holds two pool pages
        assert _kernel_page_kib(got["w"].ctypes.data) == 2048
        assert got["w"].ctypes.data % (2 * MiB) == 0
        for k, v in state.items():
            np.testing.assert_array_equal(got[k], v)
        del got
        assert _meminfo("HugePages_Free") == 4  # given back with the arrays


def test_hugetlb_load_falls_back_to_ordinary_pages_when_the_pool_is_short(
    tmp_path: Path,
) -> None:
    state = _state()
    ckptio.save(state, f"file://{tmp_path}", step=1)
    with _pool_with_free(1):  # one page free, the array needs two
        got = ckptio.load(f"file://{tmp_path}", step=1, hugetlb=True)
        assert _kernel_page_kib(got["w"].ctypes.data) == os.sysconf("SC_PAGE_SIZE") // 1024
        assert _meminfo("HugePages_Free") == 1
        np.testing.assert_array_equal(got["w"], state["w"])


def test_hugetlb_load_of_a_damaged_checkpoint_raises(tmp_path: Path) -> None:
    ckptio.save(_state(), f"file://{tmp_path}", step=1)
    obj = max(tmp_path.rglob("*.bin"), key=lambda p: p.stat().st_size)
    data = bytearray(obj.read_bytes())
    data[3 * MiB] ^= 0x01
    obj.write_bytes(bytes(data))
    with _pool_with_free(4), pytest.raises(errors.ChecksumError, match=obj.name):
        ckptio.load(f"file://{tmp_path}", step=1, hugetlb=True)


def test_hugetlb_pages_is_none_where_the_pool_is_short() -> None:
    with _pool_with_free(0):
        assert hugetlb_pages(2 * MiB) is None
