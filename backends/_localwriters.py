"""The writers of the local stores: :class:`LocalWriter` (one object, temp file + fsync +
rename) and :class:`LocalPositionalWriter` (one writer's ranges of a shared file), both
writing blocks through the store's thread pool, O_DIRECT through staging blocks where the
store writes direct (:mod:`._directio`)."""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import secrets
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from ckptio import errors
from ckptio.arrays import address, copy_into
from ckptio.store import Buffer, PositionalWriter, Writer, as_byte_view, wait_all

from ._directio import ALIGN, DIRECT_MIN, O_DIRECT
from ._durabledirs import fsync_dir
from ._posixfiles import TMP_MARK, open_regular, os_error

if TYPE_CHECKING:
    from .local import LocalStore

__all__ = ["LocalPositionalWriter", "LocalWriter"]

log = logging.getLogger(__name__)


class _FileWriter:
    """What both writers of a local store share: the file's descriptors (buffered, and
    ``O_DIRECT`` where the store writes direct), blocks written from the store's thread pool,
    their errors, the fsync, closing the descriptors."""

    key: str
    _store: LocalStore
    _path: str
    _fd: int
    _dfd: int
    _done: bool
    _futures: list[Future[None]]

    def _open_direct(self, path: str) -> bool:
        """Open ``path`` again ``O_DIRECT`` (into ``_dfd``); False where the filesystem
        refuses (the store then stops trying)."""
        try:
            self._dfd = os.open(path, os.O_WRONLY | O_DIRECT)
            return True
        except OSError as err:
            self._store.direct_refused(self._path, err)
            return False

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

    def _wait(self) -> None:
        futures, self._futures = self._futures, []
        wait_all(futures)

    def _fsync(self) -> None:
        with self._store.trace.request("fsync", self.key, backend=self._store.name):
            try:
                os.fsync(self._fd)
            except OSError as err:
                raise os_error(err, self._path, "fsync") from err

    def _close_fds(self) -> None:
        for fd in (self._fd, self._dfd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._dfd = -1


class LocalWriter(_FileWriter, Writer):
    """One object written to a temp file beside its target in blocks from the store's thread
    pool, fsynced, renamed into place, its directory fsynced (see :mod:`.local`)."""

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
            self._direct = self._open_direct(self._tmp)
        if size_hint and store.preallocate:
            try:
                os.posix_fallocate(self._fd, 0, size_hint)
            except OSError as err:
                if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    self.abort()
                    raise os_error(err, self._path, "allocate space for") from err
                # EOPNOTSUPP and friends: preallocation is an optimisation only

    # -- write path -------------------------------------------------------------------------
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
                self._stage = self._store.staging.new()
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
        store.staging.inflight.acquire()  # at most `streams` staged blocks queued or being written

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
                store.staging.recycle(stage)
                store.staging.inflight.release()

        try:
            self._futures.append(store.pool.submit(task))
        except BaseException:
            store.staging.recycle(stage)
            store.staging.inflight.release()
            raise

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
                self._fsync()
            with tr.request("close", self.key, backend=store.name):
                self._close_fds()
            with tr.request("rename", self.key, backend=store.name):
                try:
                    os.replace(self._tmp, self._path)
                except OSError as err:
                    raise os_error(err, self._path, "rename into") from err
            if store.fsync:
                fsync_dir(os.path.dirname(self._path))
                store.dirs.sync_new()
        except BaseException:
            self.abort()
            raise
        self._done = True

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
            self._store.staging.recycle(self._stage)
            self._stage = None
        self._segments = []
        if self._fd >= 0 or self._dfd >= 0:
            self._close_fds()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)


class LocalPositionalWriter(_FileWriter, PositionalWriter):
    """One writer's handle on a shared file: blocks go out through the store's pwrite pool
    (O_DIRECT from aligned staging blocks when the store writes direct; a range's tail off a
    page through the page cache, so nothing is written outside the writer's ranges)."""

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
                store.dirs.new_entry(os.path.dirname(self._path))
            except OSError as err:
                os.close(self._fd)
                raise os_error(err, self._path, "size") from err
        else:
            with tr.request("open", key, backend=store.name):
                self._fd = open_regular(self._path, os.O_WRONLY)
        self._dfd = -1
        if store.direct:
            self._open_direct(self._path)

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
        """O_DIRECT from an aligned staging block for the whole pages of ``piece`` (at an
        aligned ``offset``); a tail off a page through the page cache, unpadded: padding would
        grow the file past its size or land on bytes another range holds."""
        whole = piece.nbytes - piece.nbytes % ALIGN
        if whole:
            stage = self._store.staging.take()
            try:
                stage[:whole] = piece[:whole]
                self._pwrite(self._dfd, memoryview(stage)[:whole], offset)
            finally:
                self._store.staging.give(stage)
        if whole < piece.nbytes:
            self._pwrite(self._fd, piece[whole:], offset + whole)

    def close(self) -> None:
        if self._done:
            return
        store, tr = self._store, self._store.trace
        try:
            self._wait()
            if store.fsync:
                self._fsync()
                store.dirs.sync_new()
        except BaseException:
            self.abort()
            raise
        with tr.request("close", self.key, backend=store.name):
            self._close_fds()
        self._done = True

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
