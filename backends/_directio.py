"""O_DIRECT I/O of the local stores: alignment, page-aligned staging blocks, direct reads.

Large objects are written and read with ``O_DIRECT`` where the filesystem accepts it: no
page-cache copy, no dirty pages for fsync to flush, cold reads at device speed. Page-aligned
memory goes to the device as it is; other memory passes through page-aligned staging blocks
(:class:`Staging`) that the I/O threads fill. Free blocks are shared by every store of the
process, so a new save does not fault in fresh memory.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from ckptio import errors
from ckptio.arrays import address, private_pages

from ._posixfiles import open_regular, os_error

if TYPE_CHECKING:
    from .local import LocalStore

__all__ = [
    "ALIGN",
    "DIRECT_MIN",
    "O_DIRECT",
    "STAGE_CACHE_BYTES",
    "DirectRefused",
    "Staging",
    "aligned_buffer",
    "read_direct",
]

ALIGN = 4096
"""Bytes; O_DIRECT offset/length/address alignment that every Linux filesystem accepts."""


O_DIRECT: int = getattr(os, "O_DIRECT", 0)
"""The open flag, 0 where the platform has none."""

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
    """In a forked child: the cache starts empty (its blocks were not inherited, and stay
    referenced there, never unmapped: :data:`ckptio.arrays.not_inherited`); its lock may have
    been held by a thread that did not survive the fork."""
    global _stage_cache, _stage_cache_lock
    _stage_cache, _stage_cache_lock = {}, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_stage_cache)


class DirectRefused(Exception):
    """An O_DIRECT read was refused (EINVAL) although the open succeeded."""

    def __init__(self, err: OSError) -> None:
        super().__init__(str(err))
        self.err = err


def aligned_buffer(size: int) -> mmap.mmap:
    """Page-aligned anonymous memory (what O_DIRECT needs), ``size`` rounded up to ALIGN, on
    huge pages where the kernel has them: staging blocks are reused, and huge pages let each
    transfer reach the device as few large requests (see :func:`private_pages`)."""
    return private_pages(max(ALIGN, -(-size // ALIGN) * ALIGN), inherit=False, huge=True)


class Staging:
    """The staging blocks of one store: ``block_size`` bytes each, page-aligned, taken from
    and given back to the process-wide cache (up to :data:`STAGE_CACHE_BYTES`). A reader's
    blocks are bounded (:meth:`take` blocks beyond 2x ``streams``); a writer's are bounded by
    :attr:`inflight` (``streams`` blocks queued or being written)."""

    def __init__(self, block_size: int, streams: int) -> None:
        self.block_size = block_size
        self._taken = threading.BoundedSemaphore(streams * 2)
        self.inflight = threading.BoundedSemaphore(streams)
        """Held by a writer from a block's queueing to the end of its write."""

    def take(self) -> mmap.mmap:
        """A block, counted against the bound of 2x ``streams`` taken at once; waits until
        one is given back (:meth:`give`)."""
        self._taken.acquire()
        try:
            return self.new()
        except BaseException:
            self._taken.release()
            raise

    def give(self, stage: mmap.mmap) -> None:
        self.recycle(stage)
        self._taken.release()

    def new(self) -> mmap.mmap:
        """A block not counted against any bound: a free one of the process if there is one,
        else fresh memory."""
        size = max(ALIGN, self.block_size)
        with _stage_cache_lock:
            free = _stage_cache.get(size)
            if free:
                return free.pop()
        return aligned_buffer(size)

    def recycle(self, stage: mmap.mmap) -> None:
        """Give a block of :meth:`new` back to the process's free blocks (or drop it where
        they already hold :data:`STAGE_CACHE_BYTES`)."""
        with _stage_cache_lock:
            cached = sum(len(m) for ms in _stage_cache.values() for m in ms)
            if cached + len(stage) <= STAGE_CACHE_BYTES:
                _stage_cache.setdefault(len(stage), []).append(stage)


def read_direct(store: LocalStore, key: str, path: str, offset: int, out: memoryview) -> int | None:
    """Read through O_DIRECT: where ``out`` and the file line up on pages (the usual
    case: chunks start on pages and load buffers are page-aligned) straight into
    ``out``; the unaligned edges (or everything, if they never line up) through staging
    blocks. Blocks go out in parallel, up to the store's ``read_depth`` in flight (its
    :attr:`~.local.LocalStore.read_pool`, shared by every read of the store: a load's reader
    threads each hand their chunk's blocks to it). None: O_DIRECT refused, read buffered."""
    try:
        dfd = open_regular(path, os.O_RDONLY | O_DIRECT)
    except errors.StorageError as err:
        if err.errno != errno.EINVAL:
            raise
        store.direct_refused(path, err)
        return None
    try:
        end = offset + out.nbytes
        block = store.block_size
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
        pieces.extend((a, min(a + block, body_hi), True) for a in range(body_lo, body_hi, block))
        lo = max(lo, body_hi)
        while lo < end:  # staged tail
            hi = min(end, lo - lo % ALIGN + block)
            pieces.append((lo, hi, False))
            lo = hi

        def fill(view: memoryview, pos: int) -> int:
            got = 0
            with store.trace.request("get", key, 0, backend=store.name) as ev:
                try:
                    while got < view.nbytes:
                        n = os.preadv(dfd, [view[got:]], pos + got)
                        got += n
                        if n == 0 or got % ALIGN:
                            break  # end of file
                except OSError as err:
                    if err.errno == errno.EINVAL:
                        raise DirectRefused(err) from err
                    raise os_error(err, path, "read") from err
                ev.nbytes = got
            return got

        def one(lo: int, hi: int, direct: bool) -> int:
            if direct:
                return fill(out[lo - offset : hi - offset], lo)
            alo = lo - lo % ALIGN
            ahi = -(-hi // ALIGN) * ALIGN
            stage = store.staging.take()
            try:
                got = fill(memoryview(stage)[: ahi - alo], alo)
                b = min(hi, alo + got)
                if b <= lo:
                    return 0
                src = np.frombuffer(stage, dtype=np.uint8, count=b - lo, offset=lo - alo)
                np.copyto(np.frombuffer(out[lo - offset : b - offset], dtype=np.uint8), src)
                return b - lo
            finally:
                store.staging.give(stage)

        futs: list[Future[int]] = []
        try:
            if len(pieces) == 1:
                counts = [one(*pieces[0])]
            else:
                futs = [store.read_pool.submit(one, *p) for p in pieces]
                counts = [f.result() for f in futs]
        except DirectRefused as refused:
            for f in futs:
                f.exception()  # let every piece finish before the buffered retry
            store.direct_refused(path, refused.err)
            return None
        total = 0
        for (lo, hi, _d), c in zip(pieces, counts, strict=True):
            total += c
            if c < hi - lo:
                break
        return total
    finally:
        os.close(dfd)
