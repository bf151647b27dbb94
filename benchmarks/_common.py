"""Helpers of the peer benchmark: machine facts, page-cache control, durable-write helpers,
statistics. Nothing here measures; ``run.py`` does."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import numpy as np


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def version_of(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def fio_version() -> str | None:
    exe = shutil.which("fio")
    if exe is None:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or None


def machine_info(directory: str) -> dict[str, Any]:
    """What a reader needs to judge the figures: CPUs, memory, kernel, the disk under
    ``directory`` and the versions of every peer."""
    info: dict[str, Any] = {
        "utc": utc_now(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "directory": directory,
    }
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        info["mem_total_bytes"] = int(f.readline().split()[1]) * 1024
    with contextlib.suppress(OSError, IndexError):
        out = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "--target", directory],
            capture_output=True,
            text=True,
            check=False,
        )
        info["mount"] = out.stdout.strip()
    info["versions"] = {
        "ckptio": version_of("ckptio"),
        "numpy": version_of("numpy"),
        "crc32c": version_of("crc32c"),
        "msgspec": version_of("msgspec"),
        "torch": version_of("torch"),
        "safetensors": version_of("safetensors"),
        "fio": fio_version(),
    }
    import ckptio.arrays

    # snapshot and staging copies: compiled streaming stores, or numpy where it was not built
    info["streaming_copy"] = ckptio.arrays._stream_copy is not None
    return info


class CacheDropper:
    """Empties the page cache between cases so reads come from the device.

    As root: ``sync`` and ``echo 3 > /proc/sys/vm/drop_caches`` (the whole cache). Otherwise:
    ``posix_fadvise(DONTNEED)`` on every file under the benchmark directory (after an fsync),
    which the kernel may honour only in part; ``method`` says which was used.
    """

    def __init__(self, directory: str, *, allow_global: bool = True) -> None:
        self.directory = directory
        self.method = "drop_caches" if allow_global and self._can_drop() else "fadvise"

    @staticmethod
    def _can_drop() -> bool:
        return os.access("/proc/sys/vm/drop_caches", os.W_OK)

    def drop(self) -> None:
        os.sync()
        if self.method == "drop_caches":
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return
        for dirpath, _dirs, files in os.walk(self.directory):
            for name in files:
                with contextlib.suppress(OSError):
                    fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                    try:
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)


def fsync_path(path: str) -> None:
    """fsync a file (or directory) by path: the durability step the peers without one get."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tree_bytes(path: str) -> int:
    """Bytes of every file under ``path`` (or of the file itself)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(d, f)) for d, _dirs, files in os.walk(path) for f in files
    )


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@dataclass
class Sample:
    """One timed run of one case."""

    seconds: float
    """Wall seconds of the timed part."""
    cpu_seconds: float
    """User + system CPU seconds of this process and its children during the timed part."""
    sys_seconds: float = 0.0
    """The system (kernel) part of ``cpu_seconds``: page faults, copies into the page cache."""
    extra: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, float] = field(default_factory=dict)
    """Machine-wide counters over the timed part (see :func:`machine_counters`)."""

    @classmethod
    def of(cls, t: Mapping[str, Any], *, seconds: float | None = None, **extra: Any) -> Sample:
        """The sample of one :func:`timed` block; ``seconds`` replaces its wall time where
        the tool timed itself (fio's own bandwidth)."""
        return cls(
            t["seconds"] if seconds is None else seconds,
            t["cpu_seconds"],
            t["sys_seconds"],
            extra,
            t.get("machine", {}),
        )


_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_VMSTAT_FIELDS = (
    "pgfault",
    "thp_fault_alloc",
    "thp_fault_fallback",
    "compact_stall",
    "pgscan_direct",
    "pgscan_kswapd",
    "allocstall_normal",
    "allocstall_movable",
    "thp_split_pmd",
)


def free_huge_pages() -> int:
    """Free hugetlb pages of the default size (``HugePages_Free``; 0 where there are none)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("HugePages_Free:"):
                return int(line.split()[1])
    return 0


_device_stat: str | None = None


def watch_device(directory: str) -> str | None:
    """Make :func:`machine_counters` also count the requests of the block device that holds
    ``directory`` (its ``/sys/dev/block/MAJ:MIN/stat``); the path, or None where there is none."""
    global _device_stat
    st = os.stat(directory)
    path = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
    _device_stat = path if os.path.exists(path) else None
    return _device_stat


def machine_counters() -> dict[str, float]:
    """Machine-wide counters that say what else a case's time went to (Linux; empty
    elsewhere): CPU seconds of all CPUs by state from ``/proc/stat`` (``steal`` is time the VM's
    host gave to others, ``iowait`` idle time with I/O pending); from ``/proc/vmstat`` page
    faults, transparent-huge-page faults, compaction stalls and direct reclaim; and the
    requests the watched device completed (:func:`watch_device`), whose mean size shows how the
    block layer split the transfers (it splits a transfer from scattered memory into more,
    smaller requests)."""
    out: dict[str, float] = {}
    if _device_stat:
        with contextlib.suppress(OSError, ValueError, IndexError), open(_device_stat) as f:
            d = [int(x) for x in f.read().split()]
            out.update(
                {
                    "disk_reads": d[0],
                    "disk_read_bytes": d[2] * 512,
                    "disk_writes": d[4],
                    "disk_write_bytes": d[6] * 512,
                }
            )
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/stat") as f:
            ticks = f.readline().split()[1:]
        hz = os.sysconf("SC_CLK_TCK")
        out.update({f"cpu_{k}": int(v) / hz for k, v in zip(_CPU_FIELDS, ticks, strict=False)})
        with open("/proc/vmstat") as f:
            for line in f:
                k, _, v = line.partition(" ")
                if k in _VMSTAT_FIELDS:
                    out[k] = int(v)
    return out


@contextlib.contextmanager
def timed() -> Iterator[dict[str, Any]]:
    """Yields a dict that gets ``seconds`` (wall), ``cpu_seconds`` and ``sys_seconds`` on exit,
    and ``machine``: the change in :func:`machine_counters` over the timed part."""
    out: dict[str, Any] = {}
    m0 = machine_counters()
    t0, c0 = time.perf_counter(), os.times()
    try:
        yield out
    finally:
        c1 = os.times()
        m1 = machine_counters()
        out["machine"] = {k: round(m1[k] - v, 3) for k, v in m0.items() if k in m1}
        out["seconds"] = time.perf_counter() - t0
        out["cpu_seconds"] = (
            (c1.user - c0.user)
            + (c1.system - c0.system)
            + (c1.children_user - c0.children_user)
            + (c1.children_system - c0.children_system)
        )
        out["sys_seconds"] = (c1.system - c0.system) + (c1.children_system - c0.children_system)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def gb_per_s(nbytes: int, seconds: float) -> float:
    """GB/s, GB = 1e9 bytes."""
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def touch_pages(state: Mapping[str, np.ndarray]) -> float:
    """Seconds to write one byte of every 4 KiB page of the state (values unchanged): what a
    training step's first writes to the state pay per page after a fork snapshot, without the
    step's own arithmetic."""
    t0 = time.perf_counter()
    for v in state.values():
        b = v.reshape(-1).view(np.uint8)[::4096]
        np.add(b, 0, out=b)
    return time.perf_counter() - t0
