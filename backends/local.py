"""POSIX files on a local disk (NVMe, SSD): ``file:///path`` or a plain path.

Writes go to a temp file beside the target (``.<name>.ckptio-tmp-<hex>``), in large blocks
from a thread pool (``os.pwrite`` releases the GIL, so blocks of one object are written in
parallel), are fsynced, renamed into place, and the directory is fsynced: on return from
``close`` the object is durable and visible, and no reader ever sees a partial file.

The store is this module; each of its other responsibilities is a module of its own:
:mod:`._localwriters` (the writers), :mod:`._directio` (O_DIRECT: alignment, staging blocks,
direct reads), :mod:`._durabledirs` (every directory the store creates made durable in its
parent before an object under it is), :mod:`._coldreads` (how a read misses the page cache),
:mod:`._posixfiles` (OS errors, regular-file opens, the temp-file mark). The names other code
imports from here stay importable from here.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, TypedDict, Unpack

from ckptio import errors
from ckptio.store import (
    Buffer,
    Capabilities,
    NoOptions,
    ObjectStat,
    PositionalWriter,
    Store,
    StoreInfo,
    Writer,
    as_byte_view,
    check_key,
    option_bool,
    option_int,
)
from ckptio.trace import Trace
from ckptio.units import MAX_LOCAL_PROCESSES, parse_size

from ._coldreads import LocalColdReads
from ._directio import ALIGN, DIRECT_MIN, O_DIRECT, STAGE_CACHE_BYTES, Staging, read_direct
from ._durabledirs import DurableDirs, fsync_dir
from ._localwriters import LocalPositionalWriter, LocalWriter
from ._posixfiles import (
    TMP_MARK,
    not_regular,
    open_regular,
    open_regular_raw,
    os_error,
    why_unwritable,
)

__all__ = [
    "ALIGN",
    "DIRECT_MIN",
    "LOCAL_OPTIONS",
    "O_DIRECT",
    "STAGE_CACHE_BYTES",
    "TMP_MARK",
    "LocalOptions",
    "LocalPositionalWriter",
    "LocalStore",
    "LocalWriter",
    "fsync_dir",
    "local_root",
    "not_regular",
    "open_regular",
    "open_regular_raw",
    "os_error",
    "why_unwritable",
]

log = logging.getLogger(__name__)


class LocalOptions(TypedDict, total=False):
    """The options of :class:`LocalStore` (and of every store built on it: ``pfs://``), each
    documented once, here: keyword arguments of the constructor or ``name=value`` pairs of
    the URL's query (``file:///ckpt?direct=1``), and of ``ckptio.save``/``load``/
    ``Checkpointer``, which pass them on. A name outside these is refused when the store
    opens (:class:`~ckptio.errors.UnknownOptionError`)."""

    streams: int | str
    """I/O threads (default 8); blocks of one and of many objects are written and read
    concurrently."""
    block_size: int | str
    """Bytes per write request (a size, default ``16MiB``; a multiple of 4096)."""
    direct: bool | str | None
    """Write through ``O_DIRECT``, bypassing the page cache (default automatic). Page-aligned
    memory (ckptio's async snapshots) goes to the device without a copy; other memory is
    copied into page-aligned staging blocks by the I/O threads (at most ``streams`` blocks in
    use). Automatic: on for objects of at least 1 MiB (``DIRECT_MIN``, by their size hint)
    wherever the filesystem accepts O_DIRECT, silently off where it does not; explicitly on:
    a warning where the filesystem refuses it."""
    direct_read: bool | str | None
    """Read large ranges through ``O_DIRECT`` straight into page-aligned destination memory
    (cold reads at device speed, nothing left in the page cache); unaligned edges go through
    a staging block. Default automatic: as ``direct``."""
    read_depth: int | str
    """``O_DIRECT`` reads of one ``block_size`` each kept in flight by the store (default 16),
    from a thread pool of their own: a cold load reads its chunks' blocks through it, so the
    device's queue stays full while chunks are checked (CRC32C) and placed. A read through
    the page cache uses the ``streams`` pool."""
    fsync: bool | str
    """fsync files and directories on commit (default True). Turning it off makes saves not
    durable; only for measuring what fsync costs."""
    preallocate: bool | str
    """``posix_fallocate`` the size hint first, so a full disk fails the save at its start
    (default False)."""


LOCAL_OPTIONS = tuple(LocalOptions.__annotations__)
"""The names of :class:`LocalOptions`."""

DEFAULT_STREAMS = 8
"""I/O threads of a store unless ``streams`` says otherwise."""

DEFAULT_BLOCK_SIZE = "16MiB"
"""Bytes per write request unless ``block_size`` says otherwise."""

DEFAULT_READ_DEPTH = 16
"""``O_DIRECT`` reads in flight unless ``read_depth`` says otherwise: twice the default
``streams``, as a prototype with 16 reached 0.95-1.09x fio's read into hugetlb buffers
where 8 reached 0.85-0.96x (3 rounds each, a loaded machine). Side by side in
``benchmarks/run.py`` (``ckptio-load-hugetlb`` against ``ckptio-load-hugetlb-depth8``) 16
was ahead by 0.04-0.07x in two of three runs and level in the third; ``docs/performance.md``,
"Cold load", has the runs."""


class LocalStore(Store):
    """Files under a local directory.

    Options: :class:`LocalOptions` (keyword-only; also accepted from the URL query, e.g.
    ``file:///ckpt?direct=1``).

    A ``file://`` URL whose root lies on a parallel filesystem (Lustre, GPFS, BeeGFS,
    GlusterFS) opens as :class:`~ckptio.backends.parallelfs.ParallelFSStore` (``pfs://``),
    which takes the same options plus striping ones: the registry makes that choice
    (:func:`ckptio.registry.open_store`); this class, constructed directly, is always the plain
    local store.
    """

    schemes: ClassVar[tuple[str, ...]] = ("file",)
    name: ClassVar[str] = "file"
    capabilities: ClassVar[Capabilities] = Capabilities(
        atomic_rename=True,
        range_reads=True,
        durable_flush=True,
        conditional_create=True,
        multipart=True,
        listing=True,
        positional_writes=True,
        direct_io=bool(O_DIRECT),
    )

    def __init__(
        self,
        url: str,
        *,
        trace: Trace | None = None,
        streams: int | str = DEFAULT_STREAMS,
        block_size: int | str = DEFAULT_BLOCK_SIZE,
        direct: bool | str | None = None,
        direct_read: bool | str | None = None,
        read_depth: int | str = DEFAULT_READ_DEPTH,
        fsync: bool | str = True,
        preallocate: bool | str = False,
        **unknown: Unpack[NoOptions],
    ) -> None:
        if unknown:
            raise errors.UnknownOptionError(
                f"{self.name}://", unknown, [(f"{self.name}://", LOCAL_OPTIONS)]
            )
        super().__init__(url, trace=trace)
        self.root = local_root(url)
        self.streams = option_int(streams, field="streams", minimum=1, maximum=MAX_LOCAL_PROCESSES)
        self.read_depth = option_int(
            read_depth, field="read_depth", minimum=1, maximum=MAX_LOCAL_PROCESSES
        )
        self.block_size = parse_size(block_size, field="block_size")
        if self.block_size < ALIGN or self.block_size % ALIGN:
            raise errors.InvalidArgumentError(
                f"block_size must be a positive multiple of {ALIGN} bytes, got {self.block_size}"
            )
        self.direct_auto = direct is None
        """``direct`` was left automatic: small objects buffered, refusal is silent."""
        want = True if direct is None else option_bool(direct, field="direct")
        want_read = want if direct_read is None else option_bool(direct_read, field="direct_read")
        self.direct = want and bool(O_DIRECT)
        self.direct_read = want_read and bool(O_DIRECT)
        self.fsync = option_bool(fsync, field="fsync")
        self.preallocate = option_bool(preallocate, field="preallocate")
        self._fresh_concurrency()
        self._real_root: str | None = None
        self.dirs = DurableDirs(durable=self.fsync)
        """The directories this store made, made durable in their parents (with ``fsync``)."""
        self._cold_reads = LocalColdReads(self)

    def describe(self) -> StoreInfo:
        return StoreInfo(
            self.name,
            request_size=self.block_size,
            streams=self.streams,
            local_path=self.root,
            cold_reads=self._cold_reads,
        )

    def _fresh_concurrency(self) -> None:
        """The I/O pool (created on first use) and the locks and bounds around it."""
        self._pool: ThreadPoolExecutor | None = None
        self._read_pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.staging = Staging(self.block_size, self.streams)
        """O_DIRECT staging blocks, bounded per store."""

    # -- shared resources -------------------------------------------------------------------
    @property
    def pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.streams, thread_name_prefix="ckptio-file")
            return self._pool

    @property
    def read_pool(self) -> ThreadPoolExecutor:
        """The threads of ``O_DIRECT`` reads (``read_depth`` of them), apart from
        :attr:`pool` so that reads keep their depth whatever ``streams`` writes use."""
        with self._pool_lock:
            if self._read_pool is None:
                self._read_pool = ThreadPoolExecutor(
                    self.read_depth, thread_name_prefix="ckptio-file-read"
                )
            return self._read_pool

    def direct_refused(self, path: str, err: OSError) -> None:
        """The filesystem refused O_DIRECT at ``path``: this store reads and writes through
        the page cache from now on (a warning where ``direct`` was asked for, else quietly)."""
        if self.direct_auto:
            log.debug(
                "O_DIRECT refused at %s (%s); buffered I/O", path, os.strerror(err.errno or 0)
            )
        else:
            log.warning(
                "O_DIRECT refused by the filesystem at %s (%s); using buffered I/O instead",
                path,
                os.strerror(err.errno or 0),
            )
        self.direct = False
        self.direct_read = False

    fork_safe = True

    def after_fork(self) -> None:
        super().after_fork()
        self._fresh_concurrency()  # the pool's threads did not survive the fork, nor its locks' holders

    def close(self) -> None:
        with self._pool_lock:
            pools = (self._pool, self._read_pool)
            self._pool = self._read_pool = None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True)

    def create_file(
        self,
        key: str,
        path: str,
        size_hint: int | None,
        *,
        target: str,
        exclusive: bool = True,
    ) -> int:
        """Create ``path`` (making its directories) and return a write descriptor; traced as
        ``create``. Subclasses lay the file out first (Lustre striping). ``target`` is the
        path errors name (the final one, not a temp name)."""
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else 0)
        with self.trace.request("create", key, backend=self.name):
            try:
                return self.dirs.open_creating(path, flags)
            except errors.NotRegularFileError as err:
                raise not_regular(target, err.mode) from None
            except OSError as err:
                raise os_error(err, target, "create") from err

    # -- paths ------------------------------------------------------------------------------
    def path_of(self, key: str) -> str:
        """Absolute path of ``key`` (checked: stays under the root)."""
        return os.path.join(self.root, *check_key(key).split("/"))

    def read_path(self, key: str) -> str:
        """``path_of(key)``, refusing symlinks that resolve outside the root (what every read
        opens)."""
        path = self.path_of(key)
        if self._real_root is None:
            self._real_root = os.path.realpath(self.root)
        real = os.path.realpath(path)
        if real != self._real_root and not real.startswith(self._real_root + os.sep):
            raise errors.StoragePermissionError(
                errno.EACCES, f"refusing {path}: it resolves outside the root {self.root}", path
            )
        return path

    # -- Store ------------------------------------------------------------------------------
    def open_writer(self, key: str, *, size_hint: int | None = None) -> Writer:
        return LocalWriter(self, key, size_hint)

    def open_positional(self, key: str, size: int, *, create: bool = False) -> PositionalWriter:
        if size < 0:
            raise errors.InvalidArgumentError(f"negative size {size} for {key!r}")
        return LocalPositionalWriter(self, key, size, create)

    def publish(self, key: str, data: bytes, *, overwrite: bool = True) -> None:
        self._publish(key, data, overwrite=overwrite, durable=self.fsync)

    def publish_transient(self, key: str, data: bytes) -> None:
        """:meth:`publish` without fsyncs: visible on return, not durable. Directories made for
        it stay noted for :meth:`DurableDirs.sync_new`, so the next durable write under them (a save's
        first data object, or its manifest) still makes them durable in their parents."""
        self._publish(key, data, overwrite=True, durable=False)

    def _publish(self, key: str, data: bytes, *, overwrite: bool, durable: bool) -> None:
        path = self.path_of(key)
        directory, base = os.path.split(path)
        tmp = os.path.join(directory, f".{base}{TMP_MARK}{secrets.token_hex(6)}")
        with self.trace.request("put", key, len(data), backend=self.name):
            try:
                fd = self.dirs.open_creating(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    if durable:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                if overwrite:
                    os.replace(tmp, path)
                else:
                    os.link(tmp, path)  # atomic create-if-absent: EEXIST if another won
                    os.unlink(tmp)
                if durable:
                    fsync_dir(directory)
                    self.dirs.sync_new()
            except OSError as err:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise os_error(err, path, "publish") from err

    def read_into(self, key: str, offset: int, buffer: Buffer) -> int:
        out = as_byte_view(buffer)
        if offset < 0:
            raise errors.InvalidArgumentError(f"negative offset {offset} for {key!r}")
        path = self.read_path(key)
        if self.direct_read and out.nbytes >= DIRECT_MIN:
            got = read_direct(self, key, path, offset, out)
            if got is not None:
                return got
        fd = open_regular(path, os.O_RDONLY)
        try:
            block = self.block_size
            if out.nbytes <= block:
                return self._pread(fd, key, path, out, offset)
            futs = [
                self.pool.submit(self._pread, fd, key, path, out[s : s + block], offset + s)
                for s in range(0, out.nbytes, block)
            ]
            counts = [f.result() for f in futs]
            total = 0
            for c, s in zip(counts, range(0, out.nbytes, block), strict=True):
                if c < min(block, out.nbytes - s):
                    return s + c
                total += c
            return total
        finally:
            os.close(fd)

    def _pread(self, fd: int, key: str, path: str, out: memoryview, offset: int) -> int:
        got = 0
        with self.trace.request("get", key, 0, backend=self.name) as ev:
            try:
                while got < out.nbytes:
                    n = os.preadv(fd, [out[got:]], offset + got)
                    if n == 0:
                        break
                    got += n
            except OSError as err:
                raise os_error(err, path, "read") from err
            ev.nbytes = got
        return got

    def list(self, prefix: str = "") -> list[str]:
        with self.trace.request("list", prefix, backend=self.name):
            return sorted(k for k, _ in self._walk(prefix) if TMP_MARK not in k)

    def _walk(self, prefix: str) -> Iterable[tuple[str, os.DirEntry[str]]]:
        base_dir = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = os.path.join(self.root, *base_dir.split("/")) if base_dir else self.root
        stack = [(start, base_dir)]
        while stack:
            directory, rel = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as err:
                raise os_error(err, directory, "list") from err
            for entry in entries:
                key = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if key.startswith(prefix) or prefix.startswith(key + "/"):
                        stack.append((entry.path, key))
                elif key.startswith(prefix):
                    yield key, entry

    def size(self, key: str) -> int:
        """Checked as reads are: a path that resolves outside the root is refused
        (:class:`~ckptio.errors.StoragePermissionError`), and anything but a regular file
        is no object (:func:`not_regular`)."""
        return self._stat_regular(key).st_size

    def stat(self, key: str) -> ObjectStat:
        """Checked as :meth:`size`; the mtime is stamped by the kernel that wrote the file (an
        NFS server's; on Lustre and CephFS, the writing client's)."""
        st = self._stat_regular(key)
        return ObjectStat(st.st_size, st.st_mtime)

    def _stat_regular(self, key: str) -> os.stat_result:
        path = self.read_path(key)
        with self.trace.request("head", key, backend=self.name):
            try:
                st = os.stat(path, follow_symlinks=False)  # as reads: they open O_NOFOLLOW
            except OSError as err:
                raise os_error(err, path, "stat") from err
            if not stat.S_ISREG(st.st_mode):
                raise not_regular(path, st.st_mode)
            return st

    def stored_ranges(self, key: str, start: int, end: int) -> Iterator[tuple[int, int]]:
        """The file's data regions within ``start..end`` (and its size), by
        ``lseek(SEEK_DATA)`` / ``lseek(SEEK_HOLE)``: a sparse file's holes are left out. Where
        the file system cannot tell holes, all of it. Checked as reads are."""
        path = self.read_path(key)
        fd = open_regular(path, os.O_RDONLY)
        try:
            end = min(end, os.fstat(fd).st_size)
            pos = start
            while pos < end:
                try:
                    data = os.lseek(fd, pos, os.SEEK_DATA)
                    hole = os.lseek(fd, data, os.SEEK_HOLE)
                except OSError as err:
                    if err.errno == errno.ENXIO:  # nothing but a hole from pos to the end
                        return
                    if err.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # holes cannot be told
                        yield (pos, end)
                        return
                    raise os_error(err, path, "seek") from err
                if data >= end:
                    return
                yield (data, min(hole, end))
                pos = hole
        finally:
            os.close(fd)

    def get(self, key: str) -> bytes:
        """The whole object, read into one ``bytes`` of the size ``fstat`` gives (through
        the page cache: no staging blocks, no second copy; manifests are read so)."""
        path = self.read_path(key)
        fd = open_regular(path, os.O_RDONLY)
        try:
            with self.trace.request("get", key, 0, backend=self.name) as ev:
                try:
                    size = os.fstat(fd).st_size
                    pieces = [os.read(fd, size)]
                    got = len(pieces[0])
                    while 0 < got < size:  # reads of more than ~2 GiB come back short
                        pieces.append(os.read(fd, size - got))
                        got += len(pieces[-1]) or size  # (the file shrank: stop)
                    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                except OSError as err:
                    raise os_error(err, path, "read") from err
                ev.nbytes = len(data)
                return data
        finally:
            os.close(fd)

    def delete(self, keys: Iterable[str]) -> None:
        dirs: set[str] = set()
        for key in keys:
            path = self.path_of(key)
            with self.trace.request("delete", key, backend=self.name):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as err:
                    raise os_error(err, path, "delete") from err
            dirs.add(os.path.dirname(path))
        self._prune(dirs)

    def _prune(self, dirs: set[str]) -> None:
        """Remove directories left empty, deepest first, never the root."""
        todo = sorted(dirs, key=len, reverse=True)
        seen: set[str] = set()
        while todo:
            d = todo.pop(0)
            if d in seen or len(d) <= len(self.root) or not d.startswith(self.root):
                continue
            seen.add(d)
            try:
                os.rmdir(d)
            except OSError:
                continue
            self.dirs.removed(d)
            todo.append(os.path.dirname(d))
            todo.sort(key=len, reverse=True)

    def list_incomplete(self, prefix: str = "") -> builtins.list[str]:
        return sorted(k for k, _ in self._walk(prefix) if TMP_MARK in k)

    def cleanup_incomplete(self, prefix: str = "", *, older_than: float = 0.0) -> int:
        now = time.time()
        removed = 0
        dirs: set[str] = set()
        for key, entry in list(self._walk(prefix)):
            if TMP_MARK not in key:
                continue
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
                if older_than > 0 and age < older_than:
                    continue
                os.unlink(entry.path)
                removed += 1
                dirs.add(os.path.dirname(entry.path))
            except FileNotFoundError:
                continue
        self._prune(dirs)
        return removed


def local_root(url: str) -> str:
    """The absolute directory a ``file://``/``pfs://`` URL or a plain path names (parsed by
    :func:`ckptio.registry.parse_url`)."""
    from ckptio.registry import parse_url

    loc = parse_url(url)
    if not loc.local:
        raise errors.InvalidArgumentError(
            f"{loc.scheme}:// does not name a local directory; expected file:///abs/path or a path"
        )
    return loc.path
