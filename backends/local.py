"""POSIX files on a local disk (NVMe, SSD): ``file:///path`` or a plain path.

Writes go to a temp file beside the target (``.<name>.ckptio-tmp-<hex>``), in large blocks
from a thread pool (``os.pwrite`` releases the GIL, so blocks of one object are written in
parallel), are fsynced, renamed into place, and the directory is fsynced: on return from
``close`` the object is durable and visible, and no reader ever sees a partial file. Every
directory the store creates (a step's, the root and its missing parents) is made durable in
its parent before the first object under it is: the parents are fsynced when a writer or a
publish that created them completes, after its own file's fsync (:meth:`LocalStore.make_dirs`,
:meth:`LocalStore.sync_new_dirs`). An fsync at the mkdir itself would cost a journal commit
per directory in the save's critical path, before any byte is written; after the file's
fsync, the journal already holds the new entries and the directory's fsync finds little to
do.

Large objects are written and read with ``O_DIRECT`` where the filesystem accepts it (the
default; ``direct=0`` turns it off): no page-cache copy, no dirty pages for fsync to flush,
cold reads at device speed. Page-aligned memory goes to the device as it is; other memory
passes through page-aligned staging blocks that the I/O threads fill.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import logging
import mmap
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ClassVar, Unpack

import numpy as np

from ckptio import errors
from ckptio.arrays import address, copy_into, not_inherited, private_pages
from ckptio.store import (
    Buffer,
    Capabilities,
    ColdReads,
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
    wait_all,
)
from ckptio.trace import Trace
from ckptio.units import MAX_LOCAL_PROCESSES, parse_size

__all__ = [
    "ALIGN",
    "DIRECT_MIN",
    "STAGE_CACHE_BYTES",
    "TMP_MARK",
    "LocalStore",
    "fsync_dir",
    "local_root",
    "not_regular",
    "open_regular",
    "open_regular_raw",
    "os_error",
    "why_unwritable",
]

log = logging.getLogger(__name__)

LOCAL_OPTIONS = ("streams", "block_size", "direct", "direct_read", "fsync", "preallocate")
"""The options of :class:`LocalStore` (keyword-only, or from the URL query)."""

DEFAULT_STREAMS = 8
"""I/O threads of a store unless ``streams`` says otherwise."""

DEFAULT_BLOCK_SIZE = "16MiB"
"""Bytes per write request unless ``block_size`` says otherwise."""

TMP_MARK = ".ckptio-tmp-"
"""Every temp file has this in its name; ``list`` hides them and ``gc`` removes them."""

ALIGN = 4096
"""Bytes; O_DIRECT offset/length/address alignment that every Linux filesystem accepts."""

_O_DIRECT = getattr(os, "O_DIRECT", 0)

DIRECT_MIN = 1 << 20
"""Bytes: with ``direct`` left automatic, objects smaller than this (by their size hint) are
written through the page cache; O_DIRECT pays off for large sequential writes."""

STAGE_CACHE_BYTES = 160 << 20
"""Bytes of free staging blocks kept for reuse across stores and saves in this process
(fresh memory costs a page fault per 4 KiB on first touch; reused memory does not): the
``streams`` (8) blocks in flight plus one being filled by each of two concurrent writers,
at the default 16 MiB block size."""

_stage_cache: dict[int, list[mmap.mmap]] = {}
_stage_cache_lock = threading.Lock()


def _reset_stage_cache() -> None:
    """In a forked child: the cache starts empty (its blocks were not inherited); its lock may
    have been held by a thread that did not survive the fork."""
    global _stage_cache, _stage_cache_lock
    not_inherited.append(_stage_cache)
    _stage_cache, _stage_cache_lock = {}, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_stage_cache)


class _DirectRefused(Exception):
    """An O_DIRECT read was refused (EINVAL) although the open succeeded."""

    def __init__(self, err: OSError) -> None:
        super().__init__(str(err))
        self.err = err


def os_error(err: OSError, path: str, action: str) -> errors.CkptioError:
    """Translate an OSError into the ckptio error a user should see, naming the path."""
    reason = os.strerror(err.errno) if err.errno else str(err)
    msg = f"cannot {action} {path}: {reason}"
    code = err.errno
    if code == errno.ENOENT:
        return errors.NotFoundError(code, msg, path)
    if code == errno.EEXIST:
        return errors.AlreadyExistsError(code, msg, path)
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return errors.NoSpaceError(code, msg, path)
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return errors.StoragePermissionError(code, f"{msg}: {why_unwritable(path, code)}", path)
    return errors.StorageError(code, msg, path)


def why_unwritable(path: str, code: int | None = None) -> str:
    """Why this process may not write ``path``, naming the directory (or file) at fault: the
    nearest existing directory on the way that it may not write into (its owner and mode), or
    the read-only filesystem that holds it."""
    import stat

    cur = path
    while not os.path.isdir(cur):
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    if code == errno.EROFS:
        return f"{cur} is on a read-only filesystem; remount it read-write or choose another path"
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    for where in (cur, *((path,) if os.path.isfile(path) else ())):
        if not os.access(where, os.W_OK | (os.X_OK if where == cur else 0), effective_ids=True):
            st = os.stat(where)
            kind = "directory" if where == cur else "file"
            return (
                f"{kind} {where} is not writable by this process (uid {uid}; owner uid "
                f"{st.st_uid}, mode {stat.filemode(st.st_mode)}): make it writable "
                "(chmod/chown) or choose another path"
            )
    return (
        f"refused although {cur} looks writable (an ACL, an immutable attribute, a security "
        "module or the filesystem's own permissions)"
    )


def _aligned_buffer(size: int) -> mmap.mmap:
    """Page-aligned anonymous memory (what O_DIRECT needs), ``size`` rounded up to ALIGN, on
    huge pages where the kernel has them: staging blocks are reused, and huge pages let each
    transfer reach the device as few large requests (see :func:`private_pages`)."""
    return private_pages(max(ALIGN, -(-size // ALIGN) * ALIGN), inherit=False, huge=True)


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


def not_regular(path: str, mode: int) -> errors.NotRegularFileError:
    """The refusal of anything but a regular file where an object should be: no object is
    there (a :class:`~ckptio.errors.NotFoundError`, as on an object store), and nothing is
    read from or written to it."""
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    err = errors.NotRegularFileError(
        errno.ENOENT, f"refusing {path}: it is {kind}, not a regular file", path
    )
    err.mode = mode
    return err


def open_regular_raw(path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW, mode)`` that refuses (:func:`not_regular`) anything
    but a regular file without blocking: opened ``O_NONBLOCK`` (a FIFO would otherwise block
    the open until a writer comes), checked with ``fstat``, then made blocking again. Other
    errors are the OSError of ``open``."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise not_regular(path, stat.S_IFLNK) from err
        raise
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise not_regular(path, kind)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str, flags: int, action: str = "open", *, name: str | None = None) -> int:
    """:func:`open_regular_raw`, its errors ckptio's (:func:`os_error`), naming ``name``
    (default: ``path``)."""
    name = name or path
    try:
        return open_regular_raw(path, flags)
    except errors.NotRegularFileError as err:
        raise not_regular(name, err.mode) from None
    except OSError as err:
        raise os_error(err, name, action) from err


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _LocalWriter(Writer):
    def __init__(self, store: LocalStore, key: str, size_hint: int | None) -> None:
        self.key = key
        self._store = store
        self._path = store.path_of(key)
        directory, base = os.path.split(self._path)
        self._tmp = os.path.join(directory, f".{base}{TMP_MARK}{secrets.token_hex(6)}")
        self._nbytes = 0
        self._futures: list[Future[None]] = []
        self._done = False
        self._direct = store.direct
        self._stage: mmap.mmap | None = None
        self._stage_used = 0
        self._stage_offset = 0
        self._segments: list[tuple[int, memoryview]] = []
        self._fd = store.create_file(key, self._tmp, size_hint, target=self._path)
        self._dfd = -1
        if store.direct_auto and size_hint is not None and size_hint < DIRECT_MIN:
            self._direct = False  # small object: the page cache is cheaper
        if self._direct:
            try:
                self._dfd = os.open(self._tmp, os.O_WRONLY | _O_DIRECT)
            except OSError as err:
                store.direct_refused(self._path, err)
                self._direct = False
        if size_hint and store.preallocate:
            try:
                os.posix_fallocate(self._fd, 0, size_hint)
            except OSError as err:
                if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    self.abort()
                    raise os_error(err, self._path, "allocate space for") from err
                # EOPNOTSUPP and friends: preallocation is an optimisation only

    # -- write path -------------------------------------------------------------------------
    def _pwrite(self, fd: int, view: memoryview, offset: int) -> None:
        if self._done:
            return  # aborted while queued: skip the write (close waits before setting _done)
        with self._store.trace.request("write", self.key, view.nbytes, backend=self._store.name):
            try:
                while view:
                    try:
                        n = os.pwrite(fd, view, offset)
                    except OSError as err:
                        if err.errno != errno.EINVAL or fd != self._dfd or fd < 0:
                            raise
                        # the filesystem opened O_DIRECT but refuses this request (alignment
                        # rules stricter than a page): write it through the page cache
                        log.debug("O_DIRECT write refused for %s (%s); buffered", self._path, err)
                        fd = self._fd
                        continue
                    view = view[n:]
                    offset += n
            except OSError as err:
                raise os_error(err, self._path, "write") from err

    def _submit(self, fd: int, view: memoryview, offset: int, keep: object = None) -> None:
        self._futures.append(self._store.pool.submit(self._pwrite, fd, view, offset))

    def write(self, data: Buffer) -> None:
        if self._done:
            raise errors.InvalidArgumentError(f"write to {self.key!r} after close/abort")
        view = as_byte_view(data)
        if self._direct:
            self._write_direct(view)
            return
        block = self._store.block_size
        for start in range(0, view.nbytes, block):
            piece = view[start : start + block]
            self._submit(self._fd, piece, self._nbytes)
            self._nbytes += piece.nbytes

    def _write_direct(self, view: memoryview) -> None:
        """O_DIRECT: page-aligned memory at an aligned file offset goes to the device as it
        is (no copy); anything else is gathered into page-aligned staging blocks, copied by
        the I/O threads (so copies of several blocks run in parallel and overlap the I/O)."""
        block = self._store.block_size
        while view:
            if view.nbytes >= DIRECT_MIN and address(view) % ALIGN == 0:
                if self._stage is not None and self._stage_used % ALIGN == 0:
                    self._flush_stage(final=False)
                if self._stage is None and self._nbytes % ALIGN == 0:
                    n = view.nbytes - view.nbytes % ALIGN
                    for start in range(0, n, block):
                        piece = view[start : min(start + block, n)]
                        self._submit(self._dfd, piece, self._nbytes)
                        self._nbytes += piece.nbytes
                    view = view[n:]
                    continue
            if self._stage is None:
                self._stage = self._store.new_stage()
                self._stage_used = 0
                self._stage_offset = self._nbytes
                self._segments = []
            n = min(block - self._stage_used, view.nbytes)
            self._segments.append((self._stage_used, view[:n]))
            self._stage_used += n
            self._nbytes += n
            view = view[n:]
            if self._stage_used == block:
                self._flush_stage(final=False)

    def _flush_stage(self, *, final: bool) -> None:
        stage, used, offset, segments = (
            self._stage,
            self._stage_used,
            self._stage_offset,
            self._segments,
        )
        assert stage is not None
        self._stage = None
        self._segments = []
        length = -(-used // ALIGN) * ALIGN if final else used
        store = self._store
        store._inflight.acquire()  # at most `streams` staged blocks queued or being written

        def task() -> None:
            try:
                if self._done:
                    return  # aborted while queued
                dst = np.frombuffer(stage, dtype=np.uint8)
                for pos, src in segments:  # streaming stores, the GIL released
                    copy_into(dst[pos : pos + src.nbytes], np.frombuffer(src, dtype=np.uint8))
                if length > used:
                    dst[used:length] = 0
                self._pwrite(self._dfd, memoryview(stage)[:length], offset)
            finally:
                store.recycle_stage(stage)
                store._inflight.release()

        try:
            self._futures.append(store.pool.submit(task))
        except BaseException:
            store.recycle_stage(stage)
            store._inflight.release()
            raise

    def _wait(self) -> None:
        futures, self._futures = self._futures, []
        wait_all(futures)

    def close(self) -> None:
        if self._done:
            return
        store, tr = self._store, self._store.trace
        try:
            if self._stage is not None:
                self._flush_stage(final=True)
            self._wait()
            if self._direct:
                os.ftruncate(self._fd, self._nbytes)  # drop the alignment padding
            elif store.preallocate:
                os.ftruncate(self._fd, self._nbytes)
            if store.fsync:
                with tr.request("fsync", self.key, backend=store.name):
                    try:
                        os.fsync(self._fd)
                    except OSError as err:
                        raise os_error(err, self._path, "fsync") from err
            with tr.request("close", self.key, backend=store.name):
                self._close_fds()
            with tr.request("rename", self.key, backend=store.name):
                try:
                    os.replace(self._tmp, self._path)
                except OSError as err:
                    raise os_error(err, self._path, "rename into") from err
            if store.fsync:
                fsync_dir(os.path.dirname(self._path))
                store.sync_new_dirs()
        except BaseException:
            self.abort()
            raise
        self._done = True

    def _close_fds(self) -> None:
        for fd in (self._fd, self._dfd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._dfd = -1

    def abort(self) -> None:
        if self._done:
            return
        self._done = True  # queued writes see this and skip their I/O
        for fut in self._futures:  # not cancelled: each must run to give its staging block back
            try:
                fut.result()
            except BaseException as err:  # already failing; the first error is raised by close
                log.debug("write of %s failed during abort: %s", self.key, err)
        self._futures.clear()
        if self._stage is not None:
            self._store.recycle_stage(self._stage)
            self._stage = None
        self._segments = []
        if self._fd >= 0 or self._dfd >= 0:
            self._close_fds()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)


class _LocalPositionalWriter(PositionalWriter):
    """One writer's handle on a shared file: blocks go out through the store's pwrite pool
    (O_DIRECT from aligned staging blocks when the store writes direct)."""

    def __init__(self, store: LocalStore, key: str, size: int, create: bool) -> None:
        self.key = key
        self._store = store
        self._path = store.path_of(key)
        self._futures: list[Future[None]] = []
        self._done = False
        tr = store.trace
        if create:
            self._fd = store.create_file(key, self._path, size, target=self._path, exclusive=False)
            try:
                os.ftruncate(self._fd, size)
                store.new_dir_entry(os.path.dirname(self._path))
            except OSError as err:
                os.close(self._fd)
                raise os_error(err, self._path, "size") from err
        else:
            with tr.request("open", key, backend=store.name):
                self._fd = open_regular(self._path, os.O_WRONLY)
        self._dfd = -1
        if store.direct:
            try:
                self._dfd = os.open(self._path, os.O_WRONLY | _O_DIRECT)
            except OSError as err:
                store.direct_refused(self._path, err)

    def _pwrite(self, fd: int, view: memoryview, offset: int) -> None:
        with self._store.trace.request("write", self.key, view.nbytes, backend=self._store.name):
            try:
                while view:
                    n = os.pwrite(fd, view, offset)
                    view = view[n:]
                    offset += n
            except OSError as err:
                raise os_error(err, self._path, "write") from err

    def pwrite(self, offset: int, data: Buffer) -> None:
        if self._done:
            raise errors.InvalidArgumentError(f"pwrite to {self.key!r} after close/abort")
        if offset < 0:
            raise errors.InvalidArgumentError(f"negative offset {offset} for {self.key!r}")
        view = as_byte_view(data)
        store, block = self._store, self._store.block_size
        direct = self._dfd >= 0 and offset % ALIGN == 0
        for start in range(0, view.nbytes, block):
            piece = view[start : start + block]
            if direct:
                self._futures.append(store.pool.submit(self._staged, piece, offset + start))
            else:
                self._futures.append(
                    store.pool.submit(self._pwrite, self._fd, piece, offset + start)
                )

    def _staged(self, piece: memoryview, offset: int) -> None:
        # O_DIRECT: copy into an aligned block, zero-pad the tail to ALIGN (the writer owns it)
        stage = self._store.take_stage()
        try:
            length = -(-piece.nbytes // ALIGN) * ALIGN
            stage[: piece.nbytes] = piece
            stage[piece.nbytes : length] = bytes(length - piece.nbytes)
            self._pwrite(self._dfd, memoryview(stage)[:length], offset)
        finally:
            self._store.give_stage(stage)

    def _wait(self) -> None:
        futures, self._futures = self._futures, []
        wait_all(futures)

    def close(self) -> None:
        if self._done:
            return
        store, tr = self._store, self._store.trace
        try:
            self._wait()
            if store.fsync:
                with tr.request("fsync", self.key, backend=store.name):
                    try:
                        os.fsync(self._fd)
                    except OSError as err:
                        raise os_error(err, self._path, "fsync") from err
                store.sync_new_dirs()
        except BaseException:
            self.abort()
            raise
        with tr.request("close", self.key, backend=store.name):
            self._close_fds()
        self._done = True

    def _close_fds(self) -> None:
        for fd in (self._fd, self._dfd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._dfd = -1

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        for fut in self._futures:
            fut.cancel()
        for fut in self._futures:
            if not fut.cancelled():
                try:
                    fut.result()
                except BaseException as err:  # already failing; close raised the first error
                    log.debug("pwrite of %s failed during abort: %s", self.key, err)
        self._futures.clear()
        self._close_fds()


class LocalColdReads(ColdReads):
    """Cold reads of a :class:`LocalStore`: ``o_direct`` turns the store's ``direct_read`` on
    until :meth:`end`; ``fadvise`` drops the cached pages of every key
    (:meth:`LocalStore.drop_cache`)."""

    def __init__(self, store: LocalStore) -> None:
        self._store = store
        self._direct_before: bool | None = None
        """``direct_read`` before :meth:`start` switched it on (None: not switched)."""

    @property
    def modes(self) -> tuple[str, ...]:
        direct = ("o_direct",) if self._store.capabilities.direct_io else ()
        return (*direct, "fadvise") if hasattr(os, "posix_fadvise") else direct

    def start(self, keys: Sequence[str], mode: str) -> str:
        store = self._store
        if mode not in self.modes:
            raise self.refuse(mode, store.name)
        if mode == "o_direct":
            if self._direct_before is None:
                self._direct_before = store.direct_read
            store.direct_read = True
            return mode
        done = [store.drop_cache(k) for k in keys]
        return mode if done and all(done) else "none" if any(done) else ""

    def end(self) -> bool:
        """False where the filesystem refused O_DIRECT during the reads (``direct_read`` then
        stays off: later reads go buffered at once); else ``direct_read`` is as it was."""
        before, self._direct_before = self._direct_before, None
        if before is None:
            return True
        store = self._store
        held = store.direct_read
        if held:
            store.direct_read = before
        return held


class LocalStore(Store):
    """Files under a local directory.

    Options (keyword-only; also accepted from the URL query, e.g. ``file:///ckpt?direct=1``):

    - ``streams`` (int, default 8): I/O threads; blocks of one and of many objects are written
      and read concurrently.
    - ``block_size`` (size, default ``16MiB``): bytes per write request.
    - ``direct`` (bool, default automatic): write through ``O_DIRECT``, bypassing the page
      cache. Page-aligned memory (ckptio's async snapshots) goes to the device without a copy;
      other memory is copied into page-aligned staging blocks by the I/O threads (at most
      ``streams`` blocks in use). Automatic: on for objects of at least ``DIRECT_MIN`` bytes
      (by their size hint) wherever the filesystem accepts O_DIRECT, silently off where it
      does not; explicitly on: a warning where the filesystem refuses it.
    - ``direct_read`` (bool, default automatic = like ``direct``): read large ranges through
      ``O_DIRECT`` straight into page-aligned destination memory (cold reads at device
      speed, nothing left in the page cache); unaligned edges go through a staging block.
    - ``fsync`` (bool, default True): fsync files and directories on commit. Turning it off
      makes saves not durable; only for measuring what fsync costs.
    - ``preallocate`` (bool, default False): ``posix_fallocate`` the size hint first, so a full
      disk fails the save at its start.

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
        direct_io=bool(_O_DIRECT),
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
        self.block_size = parse_size(block_size, field="block_size")
        if self.block_size < ALIGN or self.block_size % ALIGN:
            raise errors.InvalidArgumentError(
                f"block_size must be a positive multiple of {ALIGN} bytes, got {self.block_size}"
            )
        self.direct_auto = direct is None
        """``direct`` was left automatic: small objects buffered, refusal is silent."""
        want = True if direct is None else option_bool(direct, field="direct")
        want_read = want if direct_read is None else option_bool(direct_read, field="direct_read")
        self.direct = want and bool(_O_DIRECT)
        self.direct_read = want_read and bool(_O_DIRECT)
        self.fsync = option_bool(fsync, field="fsync")
        self.preallocate = option_bool(preallocate, field="preallocate")
        self._fresh_concurrency()
        self._real_root: str | None = None
        self._dirs: set[str] = set()
        """Directories known to exist."""
        self._unsynced: set[str] = set()
        """Directories with an entry created here and not yet fsynced (see sync_new_dirs)."""
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
        self._pool_lock = threading.Lock()
        self._stage_sem = threading.BoundedSemaphore(self.streams * 2)
        self._inflight = threading.BoundedSemaphore(self.streams)

    # -- shared resources -------------------------------------------------------------------
    @property
    def pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.streams, thread_name_prefix="ckptio-file")
            return self._pool

    def take_stage(self) -> mmap.mmap:
        """A page-aligned staging block of ``block_size`` bytes; at most 2x ``streams`` are
        taken at once per store (bounded memory); blocks until one is given back."""
        self._stage_sem.acquire()
        try:
            return self.new_stage()
        except BaseException:
            self._stage_sem.release()
            raise

    def give_stage(self, stage: mmap.mmap) -> None:
        self.recycle_stage(stage)
        self._stage_sem.release()

    def new_stage(self) -> mmap.mmap:
        """A page-aligned block of ``block_size`` bytes, not counted against any bound. Free
        blocks are shared by every store of the process (up to :data:`STAGE_CACHE_BYTES`),
        so a new save does not fault in fresh memory."""
        size = max(ALIGN, self.block_size)
        with _stage_cache_lock:
            free = _stage_cache.get(size)
            if free:
                return free.pop()
        return _aligned_buffer(size)

    def recycle_stage(self, stage: mmap.mmap) -> None:
        with _stage_cache_lock:
            cached = sum(len(m) for ms in _stage_cache.values() for m in ms)
            if cached + len(stage) <= STAGE_CACHE_BYTES:
                _stage_cache.setdefault(len(stage), []).append(stage)

    def direct_refused(self, path: str, err: OSError) -> None:
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
            pool, self._pool = self._pool, None
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
                return self.open_creating(path, flags)
            except errors.NotRegularFileError as err:
                raise not_regular(target, err.mode) from None
            except OSError as err:
                raise os_error(err, target, "create") from err

    def make_dirs(self, directory: str) -> None:
        """Create ``directory`` and its missing parents. With ``fsync`` on, the parent of
        every directory this creates, at every level (a step's directories, the root, the
        root's own missing parents), is noted for :meth:`sync_new_dirs`, which the writer or
        publish that needed the directory calls once its own data is durable. A directory
        another writer created at the same moment (``EEXIST``) gets its parent noted too,
        since that writer may not have synced it yet. Directories known to exist are cached
        per store, so a save pays for each new directory once, not per object."""
        if directory in self._dirs:
            return
        missing: list[str] = []
        d = directory
        while d not in self._dirs and not os.path.isdir(d):
            missing.append(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise
            self.new_dir_entry(os.path.dirname(d))
        self._dirs.add(directory)

    def new_dir_entry(self, directory: str) -> None:
        """Note that ``directory`` gained an entry that must be made durable (with ``fsync``)
        before whatever is written under it is reported durable."""
        if self.fsync:
            self._unsynced.add(directory)

    def sync_new_dirs(self) -> None:
        """fsync every directory noted by :meth:`new_dir_entry`, deepest first. Called by a
        writer's ``close`` and by ``publish`` after their own fsync, so a save that returns
        has every directory it created durable in its parent."""
        while self._unsynced:
            pending = sorted(self._unsynced, key=len, reverse=True)
            for d in pending:
                fsync_dir(d)
                self._unsynced.discard(d)

    def open_creating(self, path: str, flags: int) -> int:
        """``os.open(path, flags, 0o644)`` after :meth:`make_dirs` of its directory. A cached
        directory removed since (retention or gc pruning empty directories, here or in
        another process) is created again, once."""
        directory = os.path.dirname(path)
        self.make_dirs(directory)
        try:
            return open_regular_raw(path, flags)
        except errors.NotRegularFileError:
            raise
        except FileNotFoundError:
            self._dirs.clear()
            self.make_dirs(directory)
            return open_regular_raw(path, flags)

    # -- paths ------------------------------------------------------------------------------
    def path_of(self, key: str) -> str:
        """Absolute path of ``key`` (checked: stays under the root)."""
        return os.path.join(self.root, *check_key(key).split("/"))

    def _checked_read_path(self, key: str) -> str:
        """``path_of(key)``, refusing symlinks that resolve outside the root."""
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
        return _LocalWriter(self, key, size_hint)

    def open_positional(self, key: str, size: int, *, create: bool = False) -> PositionalWriter:
        if size < 0:
            raise errors.InvalidArgumentError(f"negative size {size} for {key!r}")
        return _LocalPositionalWriter(self, key, size, create)

    def publish(self, key: str, data: bytes, *, overwrite: bool = True) -> None:
        self._publish(key, data, overwrite=overwrite, durable=self.fsync)

    def publish_transient(self, key: str, data: bytes) -> None:
        """:meth:`publish` without fsyncs: visible on return, not durable. Directories made for
        it stay noted for :meth:`sync_new_dirs`, so the next durable write under them (a save's
        first data object, or its manifest) still makes them durable in their parents."""
        self._publish(key, data, overwrite=True, durable=False)

    def _publish(self, key: str, data: bytes, *, overwrite: bool, durable: bool) -> None:
        path = self.path_of(key)
        directory, base = os.path.split(path)
        tmp = os.path.join(directory, f".{base}{TMP_MARK}{secrets.token_hex(6)}")
        with self.trace.request("put", key, len(data), backend=self.name):
            try:
                fd = self.open_creating(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
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
                    self.sync_new_dirs()
            except OSError as err:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise os_error(err, path, "publish") from err

    def read_into(self, key: str, offset: int, buffer: Buffer) -> int:
        out = as_byte_view(buffer)
        if offset < 0:
            raise errors.InvalidArgumentError(f"negative offset {offset} for {key!r}")
        path = self._checked_read_path(key)
        if self.direct_read and out.nbytes >= DIRECT_MIN:
            got = self._read_direct(key, path, offset, out)
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

    def _read_direct(self, key: str, path: str, offset: int, out: memoryview) -> int | None:
        """Read through O_DIRECT: where ``out`` and the file line up on pages (the usual
        case: chunks start on pages and load buffers are page-aligned) straight into
        ``out``; the unaligned edges (or everything, if they never line up) through staging
        blocks. Blocks go out in parallel. None: O_DIRECT refused, read buffered."""
        try:
            dfd = open_regular(path, os.O_RDONLY | _O_DIRECT)
        except errors.StorageError as err:
            if err.errno != errno.EINVAL:
                raise
            self.direct_refused(path, err)
            return None
        try:
            end = offset + out.nbytes
            block = self.block_size
            if (address(out) - offset) % ALIGN == 0:
                body_lo = min(end, -(-offset // ALIGN) * ALIGN)
                body_hi = max(body_lo, end - end % ALIGN)
            else:
                body_lo = body_hi = end  # never lines up: all staged
            pieces: list[tuple[int, int, bool]] = []
            lo = offset
            while lo < body_lo:  # staged head; each piece's aligned span fits one block
                hi = min(body_lo, lo - lo % ALIGN + block)
                pieces.append((lo, hi, False))
                lo = hi
            pieces.extend(
                (a, min(a + block, body_hi), True) for a in range(body_lo, body_hi, block)
            )
            lo = max(lo, body_hi)
            while lo < end:  # staged tail
                hi = min(end, lo - lo % ALIGN + block)
                pieces.append((lo, hi, False))
                lo = hi

            def fill(view: memoryview, pos: int) -> int:
                got = 0
                with self.trace.request("get", key, 0, backend=self.name) as ev:
                    try:
                        while got < view.nbytes:
                            n = os.preadv(dfd, [view[got:]], pos + got)
                            got += n
                            if n == 0 or got % ALIGN:
                                break  # end of file
                    except OSError as err:
                        if err.errno == errno.EINVAL:
                            raise _DirectRefused(err) from err
                        raise os_error(err, path, "read") from err
                    ev.nbytes = got
                return got

            def one(lo: int, hi: int, direct: bool) -> int:
                if direct:
                    return fill(out[lo - offset : hi - offset], lo)
                alo = lo - lo % ALIGN
                ahi = -(-hi // ALIGN) * ALIGN
                stage = self.take_stage()
                try:
                    got = fill(memoryview(stage)[: ahi - alo], alo)
                    b = min(hi, alo + got)
                    if b <= lo:
                        return 0
                    src = np.frombuffer(stage, dtype=np.uint8, count=b - lo, offset=lo - alo)
                    np.copyto(np.frombuffer(out[lo - offset : b - offset], dtype=np.uint8), src)
                    return b - lo
                finally:
                    self.give_stage(stage)

            futs: list[Future[int]] = []
            try:
                if len(pieces) == 1:
                    counts = [one(*pieces[0])]
                else:
                    futs = [self.pool.submit(one, *p) for p in pieces]
                    counts = [f.result() for f in futs]
            except _DirectRefused as refused:
                for f in futs:
                    f.exception()  # let every piece finish before the buffered retry
                self.direct_refused(path, refused.err)
                return None
            total = 0
            for (lo, hi, _d), c in zip(pieces, counts, strict=True):
                total += c
                if c < hi - lo:
                    break
            return total
        finally:
            os.close(dfd)

    def drop_cache(self, key: str) -> bool:
        """Ask the kernel to drop ``key``'s cached pages (``posix_fadvise DONTNEED``), so the
        next read comes from the device. Returns False where that is not possible."""
        try:
            fd = open_regular(self._checked_read_path(key), os.O_RDONLY)
        except errors.CkptioError:
            return False
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            return True
        except (OSError, AttributeError):
            return False
        finally:
            os.close(fd)

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
        path = self._checked_read_path(key)
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
        path = self._checked_read_path(key)
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
        path = self._checked_read_path(key)
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
            self._dirs.discard(d)
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
                if now - entry.stat(follow_symlinks=False).st_mtime < older_than:
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
