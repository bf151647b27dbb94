"""Copy-on-write snapshots: a save's writes run in a child process forked at ``save``.

``Checkpointer(async_save=True, snapshot="fork")`` does not copy the state. ``save`` forks;
the child's memory is the state as it was at that instant (the kernel shares the pages and
copies one only when the parent writes to it), so ``save`` holds the caller for the time of a
fork (page tables, not data) instead of a memory copy of the state. The parent's background
thread then runs the collective plan, hands the child what to write, and commits what the
child reports. The cost moves, it does not vanish: while the child writes, the first write
by the training process to each 4 KiB page of the state the child has not written yet is a
page fault and a page copy (pages it has written, it gives back: :class:`PageReleaser`), and
the memory the state occupies can grow by as much as the state.

Hand-written because no library offers it: ``multiprocessing`` forks with a pickled payload
and its own machinery, where this needs the state left untouched in the child and nothing
run there but ckptio's writer. What the child runs is kept small and fork-safe: it resets the
thread pools and locks it uses (see :meth:`ckptio.store.Store.after_fork`), imports nothing,
talks to the parent through two pipes in JSON (never pickle), leaves its fault handler's output
in a file whose end a crash's error quotes, and leaves with ``os._exit``
(no atexit handlers, no destructors of the parent's objects, no collective).
"""

from __future__ import annotations

import bisect
import faulthandler
import json
import mmap
import os
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ckptio import errors
from ckptio.arrays import madvise

__all__ = [
    "CRASH_REPORT_BYTES",
    "ORPHAN_POLL_SECONDS",
    "PAGE",
    "SMAPS",
    "ForkedWriter",
    "PageReleaser",
    "in_ranges",
    "unforkable_ranges",
]

SMAPS = "/proc/self/smaps"


def unforkable_ranges(smaps: str = SMAPS) -> list[tuple[int, int]]:
    """Address ranges, sorted and merged, that a forked child does not get as a copy-on-write
    snapshot: shared mappings (``MAP_SHARED``, ``/dev/shm``, a torch tensor after
    ``share_memory_()``), where the parent's later writes show through, and mappings marked
    ``MADV_DONTFORK`` (CUDA's pinned host memory), which the child does not have at all. Read
    from the ``VmFlags`` of ``/proc/self/smaps`` (``sh``, ``dc``); Linux only (raises
    :class:`~ckptio.errors.InvalidArgumentError` where it is missing)."""
    try:
        with open(smaps) as f:
            text = f.read()
    except OSError as err:
        raise errors.InvalidArgumentError(
            f"snapshot='fork' needs {smaps} to tell private memory from shared ({err.strerror}); use snapshot='copy'"
        ) from err
    out: list[tuple[int, int]] = []
    span: tuple[int, int] | None = None
    for line in text.splitlines():
        if line.startswith("VmFlags:"):
            flags = line.split()[1:]
            if span is not None and ("sh" in flags or "dc" in flags):
                if out and out[-1][1] >= span[0]:
                    out[-1] = (out[-1][0], max(out[-1][1], span[1]))
                else:
                    out.append(span)
            span = None
        elif line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
            lo, hi = line.split(" ", 1)[0].split("-")
            span = (int(lo, 16), int(hi, 16))
    return out


def in_ranges(array: np.ndarray, ranges: list[tuple[int, int]]) -> bool:
    """Whether any byte of ``array``'s data lies in one of ``ranges`` (sorted, disjoint)."""
    if array.nbytes == 0 or not ranges:
        return False
    lo = int(array.ctypes.data)
    hi = lo + array.nbytes
    i = bisect.bisect_right(ranges, (lo, float("inf"))) - 1
    return (i >= 0 and ranges[i][1] > lo) or (i + 1 < len(ranges) and ranges[i + 1][0] < hi)


def _read_line(fd: int) -> bytes:
    """One message: bytes up to a newline (JSON as ``json.dumps`` writes it has none), or
    what came before end of file. Messages are delimited, not ended by closing the pipe: a
    process the trainer forks meanwhile (a DataLoader worker) inherits the pipe's ends, so
    end of file could come much later."""
    parts: list[bytes] = []
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            return b"".join(parts)
        parts.append(b)
        if b.endswith(b"\n"):
            return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by {name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


PAGE = mmap.PAGESIZE

_in_child = False
"""True in a fork snapshot's child (where :class:`PageReleaser` may give memory back)."""


class PageReleaser:
    """In a fork snapshot's child only: gives back the memory of pieces once they are written
    (``MADV_DONTNEED`` on the child's own mapping; the parent's pages are untouched). A page
    the child no longer maps is the parent's alone again, so the parent's next write to it is
    a fault without a copy: an optimizer step that overlaps the save copies only what has not
    been written yet.

    A page is given back only when it lies wholly inside a written piece and no piece still
    to be written overlaps it: arrays may share memory (tied weights, views), and the child
    reads a page it has given back as zeros.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lo = np.empty(0, dtype=np.int64)
        self._hi = np.empty(0, dtype=np.int64)
        self._pending = np.empty(0, dtype=bool)
        self._where: dict[tuple[int, int], list[int]] = {}

    @staticmethod
    def _span(view: np.ndarray) -> tuple[int, int]:
        lo = int(view.ctypes.data)
        return lo, lo + view.nbytes

    def expect(self, views: Sequence[np.ndarray]) -> None:
        spans = [self._span(v) for v in views]
        with self._lock:
            base = len(self._lo)
            self._lo = np.concatenate([self._lo, np.array([a for a, _ in spans], dtype=np.int64)])
            self._hi = np.concatenate([self._hi, np.array([b for _, b in spans], dtype=np.int64)])
            self._pending = np.concatenate([self._pending, np.ones(len(spans), dtype=bool)])
            for i, span in enumerate(spans, start=base):
                self._where.setdefault(span, []).append(i)

    def written(self, views: Sequence[np.ndarray]) -> None:
        if not _in_child:
            raise RuntimeError("PageReleaser gives memory back only in a fork snapshot's child")
        spans = [self._span(v) for v in views]
        free: list[tuple[int, int]] = []
        with self._lock:
            for span in spans:
                slots = self._where.get(span)
                if slots:
                    self._pending[slots.pop()] = False
            for lo, hi in spans:
                lo, hi = -(-lo // PAGE) * PAGE, hi // PAGE * PAGE
                if hi <= lo:
                    continue
                busy = self._pending & (self._lo < hi) & (self._hi > lo)
                cur = lo
                for b_lo, b_hi in sorted(
                    zip(self._lo[busy].tolist(), self._hi[busy].tolist(), strict=True)
                ):
                    if b_lo // PAGE * PAGE > cur:
                        free.append((cur, min(b_lo // PAGE * PAGE, hi)))
                    cur = max(cur, -(-b_hi // PAGE) * PAGE)
                    if cur >= hi:
                        break
                if cur < hi:
                    free.append((cur, hi))
        if madvise is not None:  # else nothing is given back
            for lo, hi in free:
                madvise(lo, hi - lo, mmap.MADV_DONTNEED)  # an optimisation: failure is harmless


ORPHAN_POLL_SECONDS = 0.05

CRASH_REPORT_BYTES = 8192
"""Bytes: the end of a crashed child's fault-handler output that its SaveFailedError quotes."""


def _exit_when_orphaned(parent: int) -> None:
    """In the child: stop at once when the parent dies (SIGKILL, OOM): nobody would commit
    what it writes, and a restarted job must not meet a writer left over from the old one.
    Polled, not PR_SET_PDEATHSIG, which fires when the forking *thread* ends."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_SECONDS)
    os._exit(75)


class ForkedWriter:
    """A child process forked now, which waits for its orders and then runs ``work(orders)``.

    In the parent: :meth:`run` sends the orders (a JSON value) and returns the child's result
    (the JSON value ``work`` returned), or raises :class:`~ckptio.errors.SaveFailedError` with
    the child's error; :meth:`cancel` ends the child without work. Exactly one of them must
    be called.
    """

    def __init__(
        self, work: Callable[[Any], Mapping[str, Any]], *, after_fork: Callable[[], None]
    ) -> None:
        if not hasattr(os, "fork"):
            raise errors.InvalidArgumentError("snapshot='fork' needs os.fork (Linux, macOS)")
        parent = os.getpid()
        # where the child's fault handler writes its threads' stacks on a crash (SIGSEGV...);
        # the parent puts the end of it in the SaveFailedError
        self._crash_log = tempfile.TemporaryFile()  # noqa: SIM115 (closed once the child is reaped)
        self._crash_report = ""
        orders_r, orders_w = os.pipe()
        result_r, result_w = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns when a process with threads forks: the child here runs only
            # ckptio's writer, after resetting the pools and locks it uses
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: never returns
            global _in_child
            _in_child = True
            code = 70
            try:
                faulthandler.enable(self._crash_log.fileno(), all_threads=True)
                os.close(orders_w)
                os.close(result_r)
                threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()
                after_fork()
                orders = json.loads(_read_line(orders_r) or b"null")
                if orders is not None:
                    try:
                        out: dict[str, Any] = {"ok": True, "result": dict(work(orders))}
                    except BaseException as err:
                        out = {"ok": False, "error": f"{type(err).__name__}: {err}"}
                    _write_all(result_w, json.dumps(out, allow_nan=False).encode() + b"\n")
                code = 0
            finally:
                os._exit(code)
        os.close(orders_r)
        os.close(result_w)
        self.pid = pid
        self._orders: int | None = orders_w
        self._result: int | None = result_r
        self._status: int | None = None

    def run(self, orders: Any) -> dict[str, Any]:
        """Send ``orders``; wait for the child; its result, or its error raised here."""
        try:
            assert self._orders is not None, "ForkedWriter used twice"
            self._send(json.dumps(orders, allow_nan=False).encode())
            data = _read_line(self._result) if self._result is not None else b""
        finally:
            status = self._reap()
        if not data:
            raise errors.SaveFailedError(
                f"the forked snapshot writer (pid {self.pid}) ended without a result: "
                f"{_describe(status)}{self._crash_report}"
            )
        out = json.loads(data)
        if not out.get("ok"):
            raise errors.SaveFailedError(f"the forked snapshot writer failed: {out.get('error')}")
        return dict(out["result"])

    def cancel(self) -> None:
        """End the child without work (the save was refused before writing); a no-op after
        :meth:`run`."""
        self._reap()

    def _send(self, message: bytes) -> None:
        if self._orders is None:
            return
        try:
            _write_all(self._orders, message + b"\n")
        except BrokenPipeError:
            pass  # the child is gone; waitpid says how
        finally:
            os.close(self._orders)
            self._orders = None

    def _reap(self) -> int:
        self._send(b"null")  # no work (unless orders went already)
        if self._result is not None:
            os.close(self._result)
            self._result = None
        if self._status is None:
            _, self._status = os.waitpid(self.pid, 0)
            try:
                size = os.fstat(self._crash_log.fileno()).st_size
                tail = os.pread(
                    self._crash_log.fileno(), CRASH_REPORT_BYTES, max(0, size - CRASH_REPORT_BYTES)
                )
            except OSError:
                tail = b""
            finally:
                self._crash_log.close()
            if tail:
                self._crash_report = "; its fault handler wrote:\n" + tail.decode(errors="replace")
        return self._status
