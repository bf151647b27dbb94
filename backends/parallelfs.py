"""Parallel POSIX filesystems: ``pfs:///path`` (and ``file://`` roots that lie on one).

The store is :class:`~ckptio.backends.local.LocalStore` (temp + fsync + rename, a pwrite
thread pool, O_DIRECT from aligned staging blocks, every create/open/write/fsync/close/rename
traced per file) plus what each filesystem needs, chosen from the filesystem type that
``statfs(2)`` reports for the root (:func:`detect_fs`):

========== ================ ===================================================================
kind        statfs magic     what the store does there
========== ================ ===================================================================
lustre      0x0BD00BD0       ``lfs setstripe -c <count> -S <size> <file>`` creates every shard
                             file with a stripe layout chosen from its size (:func:`stripe_for`);
                             O_DIRECT on; N-1 ranges aligned to the stripe size; key fan-out.
gpfs        0x47504653       O_DIRECT on; N-1 ranges aligned to the filesystem block size
                             (``statvfs`` ``f_bsize``), so no two nodes share a block and its
                             byte-range token; key fan-out.
beegfs      0x19830326       N-1 ranges aligned to ``f_bsize`` (the chunk size); key fan-out.
glusterfs   0x65735546       (FUSE, ``fuse.glusterfs`` in ``/proc/self/mounts``) the local
                             store's I/O defaults; the volume's DHT spreads files over bricks
                             by name hash.
nfs, fuse,  (see _MAGIC)     not parallel: plain local behaviour.
ext4, xfs,
tmpfs
========== ================ ===================================================================

"Key fan-out" means the store asks the checkpoint layer for the ``hashed`` key layout
(``step-…/data/<2 hex>/rank-…``: 256 directories), so no directory of a large job holds more
than about ranks/256 files and creates spread over metadata locks (Lustre DNE, GPFS
directory blocks).

Hints not applied (documented so nobody assumes they are): GPFS ``gpfs_fcntl`` access-range
hints and BeeGFS ``beegfs-ctl --setpattern`` (striping of a *directory*, usually root-only)
need the vendor library or admin rights; set them on the run directory beforehand. The
``direct``, ``fanout`` and stripe options override every default.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any, ClassVar, Unpack

from ckptio import errors
from ckptio.store import option_bool, option_int
from ckptio.trace import Trace
from ckptio.units import parse_size

from .local import (
    ALIGN,
    LOCAL_OPTIONS,
    LocalOptions,
    LocalStore,
    local_root,
    open_regular,
    os_error,
)

__all__ = [
    "DEFAULT_STRIPE_SIZE",
    "KINDS",
    "MAX_ALIGNMENT",
    "PARALLEL_KINDS",
    "FsInfo",
    "PFSOptions",
    "ParallelFSStore",
    "detect_fs",
    "kind_of",
    "mount_of",
    "statfs_type",
    "stripe_for",
]

log = logging.getLogger(__name__)

KINDS = ("lustre", "gpfs", "beegfs", "glusterfs", "fuse", "nfs", "ext4", "xfs", "tmpfs", "other")
PARALLEL_KINDS = frozenset({"lustre", "gpfs", "beegfs", "glusterfs"})

#: statfs ``f_type`` magic numbers (linux/magic.h and the vendors' headers).
_MAGIC: dict[int, str] = {
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x19830326: "beegfs",
    0x65735546: "fuse",
    0x6969: "nfs",
    0xEF53: "ext4",  # also ext2/ext3: one magic
    0x58465342: "xfs",
    0x01021994: "tmpfs",
}


class PFSOptions(LocalOptions, total=False):
    """The options of :class:`ParallelFSStore`: every
    :class:`~ckptio.backends.local.LocalOptions` (``streams``, ``block_size``, ``direct``,
    ``direct_read``, ``fsync``, ``preallocate``) plus these, each documented once, here
    (keyword arguments or ``name=value`` pairs of the URL's query:
    ``pfs:///lustre/run1?stripe_count=8``)."""

    fs: str
    """The filesystem kind (one of :data:`KINDS`; default ``auto``, detected with statfs).
    Set it where detection cannot see the truth (a bind mount through a container layer)."""
    stripe_count: int | str
    """Lustre stripe count of each shard file; ``auto`` (the default) chooses by size
    (:func:`stripe_for`), -1 means every OST."""
    stripe_size: int | str
    """Lustre stripe size (a size, default ``4MiB``; a multiple of 64 KiB)."""
    lfs: str
    """The ``lfs`` command (default ``lfs``, looked up on ``PATH``). Missing on Lustre: a
    warning, and files get the directory's default layout."""
    fanout: bool | str | None
    """Spread shard files over 256 directories (the ``hashed`` key layout); default on for
    lustre/gpfs/beegfs. (``direct`` defaults on for lustre/gpfs, else as ``file://``.)"""


PFS_OPTIONS = tuple(k for k in PFSOptions.__annotations__ if k not in LOCAL_OPTIONS)
"""The options :class:`ParallelFSStore` takes beyond :data:`~ckptio.backends.local.LOCAL_OPTIONS`."""

DEFAULT_STRIPE_SIZE = 4 * 2**20
"""Bytes: Lustre stripe size unless ``stripe_size`` says otherwise (1 MiB is Lustre's own
default; checkpoint shards are large sequential writes, 4 MiB halves the RPC count per OST)."""

MAX_ALIGNMENT = 64 * 2**20
"""Bytes: the largest alignment used between writers of a shared file (caps odd f_bsize)."""


@dataclass(frozen=True)
class FsInfo:
    """What :func:`detect_fs` found for a path."""

    kind: str
    """One of :data:`KINDS`."""
    magic: int
    """statfs ``f_type`` (0 where statfs failed)."""
    mount_point: str
    """Mount point holding the path (``/proc/self/mounts``), ``""`` if unknown."""
    mount_type: str
    """Filesystem type as the mount table names it (``fuse.glusterfs``, ``lustre``, ...)."""
    block_size: int
    """Bytes: ``statvfs`` ``f_bsize``, the filesystem's preferred I/O size."""

    @property
    def parallel(self) -> bool:
        return self.kind in PARALLEL_KINDS


class _StatFs(ctypes.Structure):
    # struct statfs on 64-bit Linux: f_type is the first field, a long; the rest is unused here
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_long * 15)]


_libc: ctypes.CDLL | None = None


def statfs_type(path: str) -> int:
    """The ``f_type`` magic of the filesystem holding ``path`` (statfs(2) through libc);
    0 off Linux (other systems lay ``struct statfs`` out differently)."""
    global _libc
    if not sys.platform.startswith("linux"):
        return 0
    if _libc is None:
        # the process's own symbols, libc's among them: ctypes.util.find_library("c") would run
        # ldconfig in a subprocess, at the first file:// store of every process
        _libc = ctypes.CDLL(None, use_errno=True)
    buf = _StatFs()
    if _libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return buf.f_type & 0xFFFFFFFF


def mount_of(path: str, mounts_file: str = "/proc/self/mounts") -> tuple[str, str]:
    """(mount point, fs type) of the deepest mount holding ``path``; ("", "") if unknown."""
    real = os.path.realpath(path)
    best = ("", "")
    try:
        with open(mounts_file, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, parts[2])
    return best


def kind_of(magic: int, mount_type: str) -> str:
    """The filesystem kind from a statfs magic and the mount table's type name."""
    kind = _MAGIC.get(magic, "other")
    if kind == "fuse" and mount_type in ("fuse.glusterfs", "glusterfs"):
        return "glusterfs"
    if kind == "other" and mount_type in PARALLEL_KINDS:
        return mount_type  # e.g. an unknown magic the mount table still names
    return kind


def detect_fs(path: str) -> FsInfo:
    """Detect the filesystem that holds ``path`` (or would: the nearest existing parent)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        magic = statfs_type(probe)
        bsize = os.statvfs(probe).f_bsize
    except OSError as err:
        log.debug("statfs(%s) failed: %s", probe, err)
        magic, bsize = 0, ALIGN
    point, mtype = mount_of(probe)
    return FsInfo(kind_of(magic, mtype), magic, point, mtype, bsize)


def stripe_for(nbytes: int) -> int:
    """Default Lustre stripe count for a file of ``nbytes`` bytes (-1: every OST).

    Small files on one OST (no extra OST RPCs or locks); larger ones over more OSTs so one
    writer's stream is not bound by one OST: <1 GiB: 1, <8 GiB: 4, <64 GiB: 8, else all.
    """
    gib = 2**30
    if nbytes < gib:
        return 1
    if nbytes < 8 * gib:
        return 4
    if nbytes < 64 * gib:
        return 8
    return -1


@dataclass(frozen=True)
class _Defaults:
    direct: bool | None
    """None: LocalStore's own default."""
    fanout: bool


_DEFAULTS: dict[str, _Defaults] = {
    "lustre": _Defaults(direct=True, fanout=True),
    "gpfs": _Defaults(direct=True, fanout=True),
    "beegfs": _Defaults(direct=None, fanout=True),
    "glusterfs": _Defaults(direct=None, fanout=False),
}
_PLAIN = _Defaults(direct=None, fanout=False)


class ParallelFSStore(LocalStore):
    """Files on a parallel filesystem (or any POSIX one): ``pfs:///lustre/run1?stripe_count=8``.

    Options: :class:`PFSOptions` (keyword-only; also from the URL query): every
    :class:`~ckptio.backends.local.LocalOptions` plus the striping ones. ``direct`` defaults
    on for lustre/gpfs, else as for ``file://``.
    """

    schemes: ClassVar[tuple[str, ...]] = ("pfs",)
    name: ClassVar[str] = "pfs"

    @classmethod
    def claims(cls, path: str) -> bool:
        """Whether ``path`` lies on a parallel filesystem (:func:`detect_fs`): the registry
        opens a ``file://`` URL there with this class instead of the plain local store."""
        return detect_fs(path).parallel

    def __init__(
        self, url: str, *, trace: Trace | None = None, **options: Unpack[PFSOptions]
    ) -> None:
        opts: dict[str, Any] = dict(options)
        fs = opts.pop("fs", "auto")
        stripe_count = opts.pop("stripe_count", "auto")
        stripe_size = opts.pop("stripe_size", DEFAULT_STRIPE_SIZE)
        lfs = opts.pop("lfs", "lfs")
        fanout = opts.pop("fanout", None)
        direct = opts.pop("direct", None)
        unknown = {k: v for k, v in opts.items() if k not in LOCAL_OPTIONS}
        root = local_root(url)
        self.fs = detect_fs(root)
        if fs != "auto":
            if fs not in KINDS:
                raise errors.InvalidArgumentError(
                    f"unknown fs {fs!r}; valid: auto, {', '.join(KINDS)}"
                )
            self.fs = FsInfo(
                fs, self.fs.magic, self.fs.mount_point, self.fs.mount_type, self.fs.block_size
            )
        defaults = _DEFAULTS.get(self.fs.kind, _PLAIN)
        direct = defaults.direct if direct is None else option_bool(direct, field="direct")
        if unknown:
            where = f"{self.name}://"
            raise errors.UnknownOptionError(
                where, unknown, [(where, (*PFS_OPTIONS, *LOCAL_OPTIONS))]
            )
        try:
            super().__init__(url, trace=trace, direct=direct, **opts)
        except errors.InvalidArgumentError as err:
            raise errors.InvalidArgumentError(
                f"{err} (pfs:// also takes: {', '.join(PFS_OPTIONS)})"
            ) from None
        if stripe_count in ("auto", None):
            self.stripe_count: int | None = None
        else:
            self.stripe_count = option_int(stripe_count, field="stripe_count", minimum=-1)
            if self.stripe_count == 0:
                raise errors.InvalidArgumentError(
                    "stripe_count: 0 is not a count; use auto, -1 (all OSTs) or >= 1"
                )
        self.stripe_size = parse_size(stripe_size, field="stripe_size")
        if self.stripe_size <= 0 or self.stripe_size % (64 * 1024):
            raise errors.InvalidArgumentError(
                f"stripe_size must be a positive multiple of 64 KiB (Lustre's rule), got {self.stripe_size}"
            )
        self.lfs = lfs
        self._lfs_warned = False
        self.fanout = defaults.fanout if fanout is None else option_bool(fanout, field="fanout")
        self.preferred_key_layout = "hashed" if self.fanout else "flat"
        self.positional_alignment = self._alignment()

    # -- what the filesystem kind changes -----------------------------------------------------
    def _alignment(self) -> int:
        """Bytes between writers of a shared file: Lustre's stripe size, GPFS/BeeGFS's block
        size, else 4096."""
        if self.fs.kind == "lustre":
            return self.stripe_size
        if self.fs.kind in ("gpfs", "beegfs") and self.fs.block_size % ALIGN == 0:
            return max(ALIGN, min(self.fs.block_size, MAX_ALIGNMENT))
        return ALIGN

    def create_file(
        self,
        key: str,
        path: str,
        size_hint: int | None,
        *,
        target: str,
        exclusive: bool = True,
    ) -> int:
        """On Lustre, create the file through ``lfs setstripe`` (its layout is fixed at
        creation), then open it; elsewhere as :meth:`LocalStore.create_file`."""
        if self.fs.kind != "lustre" or not size_hint or os.path.exists(path):
            return super().create_file(key, path, size_hint, target=target, exclusive=exclusive)
        count = self.stripe_count if self.stripe_count is not None else stripe_for(size_hint)
        cmd = [self.lfs, "setstripe", "-c", str(count), "-S", str(self.stripe_size), path]
        exe = shutil.which(self.lfs)
        if exe is None:
            if not self._lfs_warned:
                log.warning(
                    "%s is on Lustre but %r is not on PATH: files get the directory's default "
                    "striping (install lustre-client utilities or pass lfs=/path/to/lfs)",
                    self.root,
                    self.lfs,
                )
                self._lfs_warned = True
            return super().create_file(key, path, size_hint, target=target, exclusive=exclusive)
        with self.trace.request("create", key, backend=self.name):
            try:
                self.dirs.make(os.path.dirname(path))
            except OSError as err:
                raise os_error(err, target, "create") from err
            import subprocess  # only striping runs a command; every file:// store loads this module

            with self.trace.request("setstripe", key, backend=self.name):
                try:
                    done = subprocess.run(
                        [exe, *cmd[1:]], capture_output=True, text=True, timeout=120, check=False
                    )
                except (OSError, subprocess.TimeoutExpired) as err:
                    raise errors.StorageError(
                        errno.EIO, f"cannot stripe {target}: {' '.join(cmd)} failed: {err}", target
                    ) from err
            if done.returncode != 0:
                raise errors.StorageError(
                    errno.EIO,
                    f"cannot stripe {target}: `{' '.join(cmd)}` exited {done.returncode}: "
                    f"{done.stderr.strip()[:500]}",
                    target,
                )
            return open_regular(path, os.O_WRONLY, "create", name=target)

    def __repr__(self) -> str:
        return f"ParallelFSStore({self.url!r}, fs={self.fs.kind})"
