"""The FUSE operations of :mod:`ckptio.testing.faultyfs`: a passthrough to a backing
directory that fails chosen operations. Imported only by the server process (it needs
``mfusepy`` and libfuse3 at import); the test process talks to the server through
:class:`~ckptio.testing.faultyfs.FaultyFS`."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterable
from typing import Any

import mfusepy

__all__ = ["FaultyPassthrough"]


class FaultyPassthrough(mfusepy.Operations):
    """Passthrough to ``backing``; file operations work on the backing descriptors. Fails
    the operations named by :meth:`set_faults` (among ``known_ops``) on matching paths."""

    use_ns = True

    def __init__(self, backing: str, known_ops: Iterable[str]) -> None:
        self.root = os.path.realpath(backing)
        self.known_ops = tuple(known_ops)
        self._faults: dict[str, Any] = {"ops": set(), "match": "", "errno": errno.EIO}
        self._mutex = threading.Lock()
        self._paths: dict[int, str] = {}  # fh -> the path it was opened at (fault matching)

    def set_faults(self, ops: Iterable[str], match: str, err: int) -> None:
        unknown = set(ops) - set(self.known_ops)
        if unknown:
            raise ValueError(f"unknown fault ops {sorted(unknown)}; known: {self.known_ops}")
        with self._mutex:
            self._faults = {"ops": set(ops), "match": match, "errno": err}

    def _fail(self, op: str, path: str | None, fh: int | None = None) -> None:
        with self._mutex:
            faults = self._faults
            if op not in faults["ops"]:
                return
            where = path if path is not None else self._paths.get(fh or -1, "")
        if faults["match"] in where:
            raise mfusepy.FuseOSError(faults["errno"])

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    # -- metadata
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
        keys = (
            "st_mode",
            "st_ino",
            "st_nlink",
            "st_uid",
            "st_gid",
            "st_size",
            "st_blocks",
            "st_blksize",
        )
        out: dict[str, Any] = {k: getattr(st, k) for k in keys}
        out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return out

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._full(path))
        keys = (
            "f_bavail",
            "f_bfree",
            "f_blocks",
            "f_bsize",
            "f_favail",
            "f_ffree",
            "f_files",
            "f_flag",
            "f_frsize",
            "f_namemax",
        )
        return {k: getattr(sv, k) for k in keys}

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._full(path), amode):
            raise mfusepy.FuseOSError(errno.EACCES)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._full(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._full(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._full(path))
        else:
            os.utime(self._full(path), ns=times)
        return 0

    # -- namespace
    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._full(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._full(path))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._full(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        os.replace(self._full(old), self._full(new))
        return 0

    def link(self, target: str, source: str) -> int:  # ln source target
        os.link(self._full(source), self._full(target))
        return 0

    def opendir(self, path: str) -> int:
        return os.open(self._full(path), os.O_RDONLY | os.O_DIRECTORY)

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        # with use_ino an entry needs its inode number (the kernel drops inode 0)
        here = os.lstat(self._full(path))
        out = [(n, {"st_mode": here.st_mode, "st_ino": here.st_ino}, 0) for n in (".", "..")]
        with os.scandir(self._full(path)) as entries:
            for e in entries:
                st = e.stat(follow_symlinks=False)
                out.append((e.name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0))
        return out

    def releasedir(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._fail("fsync", path)
        os.fsync(fh)
        return 0

    # -- files
    def _opened(self, path: str, fh: int) -> int:
        with self._mutex:
            self._paths[fh] = path
        return fh

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        flags = (flags & ~getattr(os, "O_DIRECT", 0)) | os.O_CREAT
        return self._opened(path, os.open(self._full(path), flags, mode))

    def open(self, path: str, flags: int) -> int:
        flags &= ~getattr(os, "O_DIRECT", 0)  # the backing fs has its own alignment rules
        return self._opened(path, os.open(self._full(path), flags))

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._fail("read", path, fh)
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._fail("write", path, fh)
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._full(path), length)
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        if mode != 0:  # punching holes, keep-size, ...: not needed
            raise mfusepy.FuseOSError(errno.EOPNOTSUPP)
        os.posix_fallocate(fh, offset, size)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._fail("fsync", path, fh)
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)
        return 0

    def release(self, path: str, fh: int) -> int:
        with self._mutex:
            self._paths.pop(fh, None)
        os.close(fh)
        return 0
