"""A drain's parts: copying one rank's objects of a committed step from the fast tier to the
durable one, checking every chunk's CRC32C as its bytes pass, in bounded memory (see
:mod:`ckptio.checkpoint.tiered` for the protocol around it), and what a drain reports."""

from __future__ import annotations

import logging
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.checkpoint.snapshot import aligned_empty, crc32c
from ckptio.lease import SaveLease
from ckptio.store import Store

log = logging.getLogger(__name__)

__all__ = [
    "BUFFER_WAIT_SECONDS",
    "COPY_PIECE_BYTES",
    "DRAIN_BUFFER_BYTES",
    "DRAIN_STREAMS",
    "Cancelled",
    "DrainHandle",
    "DrainResult",
    "acquire_beside",
    "copy_object",
    "copy_rank_objects",
    "object_rank",
]

COPY_PIECE_BYTES = 8 << 20
"""Bytes read from the fast tier and handed to the durable tier's writer at a time."""

DRAIN_STREAMS = 4
"""Objects a rank copies at the same time while draining."""

DRAIN_BUFFER_BYTES = 64 << 20
"""Bytes of one object's copy read ahead of its writer (writers queue buffers without copying
them): at least this, or two of the durable store's parts (or staging blocks) and a piece, so
a writer that sends whole parts gets one while the next fills."""

BUFFER_WAIT_SECONDS = 30.0
"""How long a copy waits for its writer to let go of a buffer before it reads on regardless (a
writer that holds every buffer until ``close`` would otherwise never let go): past it, memory
is not bounded for that object."""

_OWNER = re.compile(r"(?:^|/)rank-(\d{5})-\d{3}")


def object_rank(key: str) -> int:
    """The rank that wrote a file-per-shard object (``data/rank-00003-000-<token>.bin``); 0
    for any other key (a layout whose objects rank 0 creates)."""
    m = _OWNER.search(key)
    return int(m.group(1)) if m else 0


class Cancelled(Exception):
    """A drain stopped on request (backpressure ``cancel``, or a failed copy beside it)."""


@dataclass
class DrainResult:
    """What one drain of a step to the durable tier did, on this rank."""

    step: int
    status: str
    """``durable`` (committed on the durable tier), ``cancelled`` (by backpressure
    ``cancel``) or ``failed``."""
    nbytes: int = 0
    """Bytes this rank copied."""
    seconds: float = 0.0
    """From the start of the copy to the durable commit (or the end), on this rank."""
    lag_seconds: float = 0.0
    """From the step's commit on the fast tier to its commit on the durable tier (or the end):
    how long the newest checkpoint existed on the fast tier only."""
    error: str = ""


class DrainHandle:
    """A drain queued, running or done."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.cancel_event = threading.Event()
        self.future: Future[DrainResult] = Future()
        self.fast_committed: float | None = None
        """time.monotonic() of the step's fast commit, once known."""

    def done(self) -> bool:
        return self.future.done()

    def wait(self, timeout: float | None = None) -> DrainResult:
        """The drain's result (a failed drain's is ``status="failed"``; it never raises but
        ``TimeoutError``)."""
        return self.future.result(timeout)

    def cancel(self) -> None:
        """Ask the drain to stop; it discards what it copied and commits nothing."""
        self.cancel_event.set()


def acquire_beside(store: Store, step: int, tries: int = 3) -> SaveLease:
    """A lease on a committed step (a drain's, on the fast tier). Its publish can lose its temp
    file to a concurrent retention's sweep of the step (temp files under a step without a
    live lease are debris to it); while the step's manifest is still there, it is tried again."""
    for attempt in range(tries):
        try:
            return SaveLease(store, step).acquire()
        except FileNotFoundError:
            if attempt == tries - 1 or not store.exists(fmt.manifest_key(step)):
                raise
    raise AssertionError("unreachable")


def copy_object(
    src: Store,
    dst: Store,
    key: str,
    size: int,
    chunks: Sequence[mf.Chunk],
    stop: Callable[[], bool],
    *,
    writer: Any = None,
) -> int:
    """Copy one object, checking the CRC32C of every chunk as its bytes pass; abort (leaving
    nothing at ``dst``) on a mismatch, a short read or when ``stop()`` says so. Returns the
    bytes copied. ``writer`` (``write``/``close``/``abort``, holding no buffer past
    ``write``; ``dst`` is then unused): where the bytes go instead of a new object of
    ``dst`` (a peer copy's stream, :mod:`ckptio.checkpoint.peers`)."""
    # a writer may hold buffers until a part (S3) or a staging block (file://) is full
    held = 0 if writer is not None else dst.describe().request_size
    parts = 2 * held + COPY_PIECE_BYTES
    budget = threading.Semaphore(max(2, max(DRAIN_BUFFER_BYTES, parts) // COPY_PIECE_BYTES))
    # buffers the writer let go of are read into again: fresh memory costs a page fault per
    # page, more than the read itself on a busy machine
    free: list[Any] = []

    def let_go(base: Any, bounded: bool) -> None:
        free.append(base)
        if bounded:
            budget.release()

    if writer is None:
        writer = dst.open_writer(key, size_hint=size)
    try:
        ci = 0
        acc = 0
        pos = 0
        while pos < size:
            if stop():
                raise Cancelled
            n = min(COPY_PIECE_BYTES, size - pos)
            bounded = budget.acquire(timeout=BUFFER_WAIT_SECONDS)
            if not bounded:
                log.debug("%s: its writer holds every buffer; reading on unbounded", key)
            try:
                base = free.pop()
            except IndexError:
                base = aligned_empty((COPY_PIECE_BYTES,), "uint8")
            buf = base[:n]
            # given back (and its budget) when the writer lets go of it. The writer gets a
            # memoryview of ``buf``: every view it derives keeps ``buf`` alive (the buffer
            # protocol references its exporter), whereas a numpy view of ``buf`` would
            # reference ``base`` directly and let ``buf`` die while the bytes are queued
            piece = memoryview(buf)  # type: ignore[arg-type]
            weakref.finalize(buf, let_go, base, bounded)
            got = src.read_into(key, pos, buf)
            if got != n:
                raise errors.CorruptCheckpointError(
                    f"{src.url}/{key}: {pos + got} bytes, the manifest says {size}"
                )
            end = pos + n
            while ci < len(chunks) and chunks[ci].offset < end:
                c = chunks[ci]
                lo, hi = max(c.offset, pos), min(c.offset + c.length, end)
                acc = crc32c(buf[lo - pos : hi - pos], acc)
                if hi < c.offset + c.length:
                    break  # the chunk goes on in the next piece
                if acc != c.crc32c:
                    raise errors.ChecksumError(
                        f"{src.url}/{key}: CRC32C mismatch in bytes {c.offset}..{c.offset + c.length} "
                        f"(expected {c.crc32c:#010x}, read {acc:#010x}): not drained"
                    )
                acc = 0
                ci += 1
            writer.write(piece)
            del buf, piece  # only the writer holds them now
            pos = end
        if ci != len(chunks):
            raise errors.CorruptCheckpointError(f"{src.url}/{key}: chunks beyond the object's end")
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return size


def copy_rank_objects(
    src: Store,
    dst: Store,
    manifest: mf.Manifest,
    rank: int,
    cancelled: Callable[[], bool],
    outcome: dict[str, Any],
) -> None:
    """Copy ``rank``'s objects of ``manifest`` from ``src`` (the fast tier) to ``dst`` (the
    durable one), :data:`DRAIN_STREAMS` at a time, recording each finished key and its bytes in
    ``outcome`` (``keys``, ``nbytes``: so a failure can discard them); stop when
    ``cancelled()`` says so (raising :class:`Cancelled`) or when one copy failed."""
    chunks: dict[str, list[mf.Chunk]] = {}
    for entry in manifest.tensors.values():
        for c in entry.chunks:
            chunks.setdefault(c.key, []).append(c)
    mine = sorted(k for k in manifest.objects if object_rank(k) == rank)
    prefix = fmt.step_dir(manifest.step) + "/"
    lock = threading.Lock()
    failed = threading.Event()  # one copy failed: the others stop

    def copy(key: str) -> None:
        try:
            n = copy_object(
                src,
                dst,
                prefix + key,
                manifest.objects[key],
                sorted(chunks.get(key, []), key=lambda c: c.offset),
                lambda: cancelled() or failed.is_set(),
            )
        except Cancelled:
            raise
        except BaseException:
            failed.set()
            raise
        with lock:
            outcome["keys"].append(key)
            outcome["nbytes"] += n

    with ThreadPoolExecutor(
        max(1, min(DRAIN_STREAMS, len(mine))), thread_name_prefix="ckptio-drain-copy"
    ) as ex:
        futures = [ex.submit(copy, k) for k in mine]
    errs = [e for e in (f.exception() for f in futures) if e is not None]
    real = [e for e in errs if not isinstance(e, Cancelled)]
    if real or errs:
        raise (real or errs)[0]
