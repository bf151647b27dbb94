""":class:`StoreCheckpointer`, the one-store engine of the :class:`~ckptio.Checkpointer` a training
loop holds (:mod:`ckptio.checkpoint.facade`), the lifetime every checkpointer shares, and
:func:`save`.

- Options are validated once, when it is made; unknown ones go to the store, whose error then
  lists the Checkpointer's options too.
- One save in flight at a time: a save first waits for the previous one. A background save
  takes its snapshot (a copy into reused buffers, or a fork: :mod:`ckptio.forked`) and
  returns; a thread of its own writes and commits it, on a duplicated communicator.
- A background save's failure is handed to the caller exactly once: by the handle's
  ``wait``, else the next ``save``/``wait``/``close``, else printed at interpreter exit, which
  also waits for saves still in flight (:func:`_wait_at_exit`).
- Retention runs on rank 0 after each commit, and before the first save's write (what a
  killed predecessor left); its failure never fails a committed save.
- Loads through a Checkpointer first wait for its save in flight, so a step it just saved is
  seen."""

from __future__ import annotations

import atexit
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint.commit import SaveResult, save_collective
from ckptio.checkpoint.read import CheckpointReader, committed_steps, open_checkpoint, read_newest
from ckptio.checkpoint.retention import doomed_steps, retain
from ckptio.checkpoint.snapshot import (
    SNAPSHOTS,
    PreparedState,
    SnapshotBuffers,
    prepare,
    refuse_empty,
)
from ckptio.checkpoint.write import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_OBJECT_SIZE,
    LAYOUTS,
    PARALLEL_OBJECTS,
    WriteOptions,
    write_rank_shards,
)
from ckptio.dist import Communicator, SingleProcess, detect
from ckptio.forked import SMAPS, ForkedWriter, PageReleaser, in_ranges, unforkable_ranges
from ckptio.lease import RETIRE_GRACE_SECONDS
from ckptio.registry import open_store
from ckptio.store import Store, option_int
from ckptio.units import parse_size

log = logging.getLogger(__name__)

__all__ = [
    "FORK_OBJECT_BYTES",
    "Lifetime",
    "SaveHandle",
    "StoreCheckpointer",
    "save",
]

_CHECKPOINT_OPTIONS = ("layout", "key_layout", "chunk_size", "max_object_size", "retire_grace")


FORK_OBJECT_BYTES = 256 << 20
"""Bytes: the largest shard object a fork snapshot's child writes (see :meth:`StoreCheckpointer._fork_writer`)."""


@dataclass
class SaveHandle:
    """A save in progress or done. ``blocking_seconds``: how long ``save`` held the caller."""

    step: int
    blocking_seconds: float
    _future: Future[SaveResult] | None = None
    _result: SaveResult | None = None
    _report: _BackgroundSave | None = None

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def wait(self, timeout: float | None = None) -> SaveResult:
        """Block until the save is committed; raise its error if it failed (at every call;
        once raised here, the failure is not raised again by the Checkpointer's next
        ``wait``/``save``/``close`` nor printed at exit). ``TimeoutError`` if ``timeout``
        seconds pass first."""
        result, error, _ = self._outcome(timeout)
        if error is not None:
            raise error
        assert result is not None
        return result

    result = wait

    def _outcome(
        self, timeout: float | None
    ) -> tuple[SaveResult | None, BaseException | None, bool]:
        """The save's result or error, and whether this call is the first to hand that error
        to the caller."""
        if self._result is None:
            assert self._future is not None
            error = self._future.exception(timeout)  # TimeoutError while the save still runs
            if error is not None:
                return None, error, self._report is None or self._report.claim()
            self._result = self._future.result()
        return self._result, None, False


class _BackgroundSave:
    """One background save as the exit report sees it.

    Held strongly by ``_unreported`` from its start until it commits or its failure has been
    handed to the caller once, whether or not its Checkpointer and handle still exist: the
    registry, not the Checkpointer, is what the exit hook reads. A finished save keeps only
    its error's text, not the error (whose traceback's frames hold the Checkpointer and the
    snapshot), so a dropped Checkpointer's memory is freed as usual.
    """

    __slots__ = ("error", "future", "reported", "step", "url")

    def __init__(self, step: int, url: str, future: Future[SaveResult]) -> None:
        self.step, self.url = step, url
        self.future: Future[SaveResult] | None = future
        self.error: str | None = None
        self.reported = False
        with _unreported_lock:
            _unreported[self] = None
        future.add_done_callback(self._finished)

    def _finished(self, future: Future[SaveResult]) -> None:
        error = None if future.cancelled() else future.exception()
        with _unreported_lock:
            self.future = None
            if error is None or self.reported:
                _unreported.pop(self, None)
            else:
                self.error = str(error)

    def claim(self) -> bool:
        """Mark the failure as reported; True for the first caller only."""
        with _unreported_lock:
            first, self.reported = not self.reported, True
            _unreported.pop(self, None)
        return first

    def report_at_exit(self) -> None:
        """Wait for the save if it still runs; print its failure on stderr unless reported."""
        with _unreported_lock:
            future = self.future
        error = self.error
        if future is not None:
            if not future.done():
                log.warning(
                    "interpreter exiting: waiting for the checkpoint save of step %d", self.step
                )
            try:
                exc = future.exception()
            except KeyboardInterrupt:
                if self.claim():
                    _print_err(
                        f"ckptio: interrupted while waiting for the background save of step {self.step}; "
                        f"it may not be committed (check with `ckptio ls {self.url}`)"
                    )
                return
            error = None if exc is None else str(exc)
        if error is not None and self.claim():
            _print_err(
                f"ckptio: the background save of step {self.step} FAILED and was not committed: {error}"
            )


def _print_err(msg: str) -> None:
    # print, not log: with logging unconfigured (or configured to stderr) a log record would
    # reach stderr as well, and the report must appear exactly once
    print(msg, file=sys.stderr, flush=True)


# background saves in flight, and failed ones whose failure no caller has been handed yet
_unreported: dict[_BackgroundSave, None] = {}


_unreported_lock = threading.Lock()


def _forget_parents_saves() -> None:
    """A forked child did not start its parent's saves (nor runs their threads): they are the
    parent's to wait for and report."""
    global _unreported_lock
    _unreported_lock = threading.Lock()
    _unreported.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parents_saves)


@atexit.register
def _wait_at_exit() -> None:
    """Interpreter exit: wait for every background save still in flight, and print on stderr,
    once, each failure that no ``wait``/``save``/``close``/``with`` has raised — including
    those of handles and Checkpointers dropped long before. Not when a Checkpointer is
    garbage-collected: that comes at an arbitrary moment and thread (a failure's traceback
    ties its Checkpointer into a reference cycle, freed only by the cyclic collector), while
    exit comes once, after the program's own chances to ``wait``.

    Exit status: left as the program set it (0 after a normal end). An exit hook cannot
    change it: Python ignores an exception raised there, and ``os._exit`` would skip the
    remaining exit handlers (logging's flush, other libraries' cleanup) and overwrite a
    status the program chose. A program whose status must tell calls ``wait()`` (or leaves
    the ``with`` block) before it ends: the failure is then raised there.
    """
    with _unreported_lock:
        saves = list(_unreported)
    for save in saves:
        save.report_at_exit()


# At interpreter exit, concurrent.futures stops accepting work (its hook runs in
# threading._shutdown, before atexit); a save still in flight would then fail. Hooks of
# threading._register_atexit run in reverse order, so this one, registered after
# concurrent.futures.thread was imported, waits for the save while the pools still work.
_register_thread_atexit = getattr(threading, "_register_atexit", None)


if _register_thread_atexit is not None:
    _register_thread_atexit(_wait_at_exit)


class Lifetime:
    """What every checkpointer (the one-store engine, the tiered one, the public facade)
    shares about its lifetime: a ``with`` block closes it (:meth:`close`: wait for the save
    in flight, raising its failure, and release resources), raising a failure of that save
    unless the body raised (then the body's exception propagates and the failure is
    logged)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception as err:
            log.error("checkpoint save in flight failed while leaving the Checkpointer: %s", err)


class StoreCheckpointer(Lifetime):
    """The one-store engine of :class:`ckptio.Checkpointer`: saves and loads the checkpoints
    of one run under ``url``: a storage URL
    (``s3://bucket/prefix``, ``file:///abs/path``, ...), a plain path or ``os.PathLike`` (a
    local directory), or a Store. URLs are parsed strictly (:func:`ckptio.registry.parse_url`):
    a malformed one is refused with the accepted forms.

    Options:

    - ``keep_last`` (int or None): after each committed save, delete all but the newest
      ``keep_last`` checkpoints (and debris of interrupted saves older than the newest). The
      first save of a Checkpointer also does so before it writes, so a job killed between a
      commit and its retention (a restart) never leaves more than ``keep_last + 1``.
      Retention never touches a save in flight (this job's or another's: see
      :mod:`ckptio.lease`) and applies to every checkpoint under the root; a second process
      saving under the same root is named in a warning.
    - ``retire_grace`` (seconds, default 60): a checkpoint removed by retention stops existing
      at once (its manifest goes first), but its data stays this long for readers that opened
      it just before; then retention or ``ckptio gc`` removes it. 0 frees the space at once
      (a reader then falls back to the newest checkpoint).
    - ``async_save`` (bool): ``save`` snapshots the state (one memory copy) and returns; the
      write and commit run in a background thread. A failure is reported exactly once: raised
      by the handle's ``wait``, or else by the next ``save``/``wait``/``close`` (leaving the
      ``with`` block), or else — handle and Checkpointer dropped, or the program ended
      first — printed on stderr at interpreter exit (which leaves the exit status as it is;
      see ``_wait_at_exit``). Leaving the ``with`` block or the interpreter waits for the
      save in flight. The snapshot memory (one state's worth, page-aligned) is kept for the next
      save, so later snapshots cost one memory copy and no page faults; ``close`` frees it.
    - ``snapshot`` (``copy``, ``fork``; async saves only): ``fork`` takes the snapshot by
      forking a child process that writes the shards from its copy-on-write view of the
      state, so ``save`` holds the caller for a fork (page tables) instead of a memory copy;
      while the child writes, the caller's first write to each page it has not written yet
      pays a page copy (written pages it gives back: a fault only), and the state's memory
      can double. Arrays in shared memory are copied first. Needs ``os.fork``, a store that is
      ``fork_safe`` (``file://``, ``pfs://``) and the ``file-per-shard`` layout; see
      :mod:`ckptio.forked`.
    - ``comm``: a :class:`~ckptio.dist.Communicator` (default: detected from the launcher).
      Every rank must create the Checkpointer and call ``save`` together.
    - ``layout`` (``file-per-shard``, ``shared-file``, ``shared-file-per-node``: see
      :data:`LAYOUTS`), ``key_layout`` (``flat``/``hashed``; default: the store's
      ``preferred_key_layout``), ``chunk_size``, ``max_object_size`` (file-per-shard only);
      any other option goes to the store (``streams``, ``part_size``, ...).
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Store,
        *,
        keep_last: int | None = None,
        async_save: bool = False,
        comm: Communicator | None = None,
        layout: str = "file-per-shard",
        key_layout: str | None = None,
        chunk_size: int | str = DEFAULT_CHUNK_SIZE,
        max_object_size: int | str = DEFAULT_MAX_OBJECT_SIZE,
        snapshot: str = "copy",
        retire_grace: float = RETIRE_GRACE_SECONDS,
        **store_options: Any,
    ) -> None:
        if snapshot not in SNAPSHOTS:
            raise errors.InvalidArgumentError(
                f"unknown snapshot {snapshot!r}; valid: {', '.join(SNAPSHOTS)}"
            )
        if layout not in LAYOUTS:
            raise errors.InvalidArgumentError(
                f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}"
            )
        if key_layout is not None and key_layout not in fmt.KEY_LAYOUTS:
            raise errors.InvalidArgumentError(
                f"unknown key_layout {key_layout!r}; valid: {', '.join(fmt.KEY_LAYOUTS)}"
            )
        if keep_last is not None:
            keep_last = option_int(keep_last, field="keep_last", minimum=1)
        if not isinstance(retire_grace, int | float) or not 0 <= retire_grace < math.inf:
            raise errors.InvalidArgumentError(
                f"retire_grace: expected seconds >= 0, got {retire_grace!r}"
            )
        self.retire_grace = float(retire_grace)
        # a store this Checkpointer opened is its to close; a Store it was given is the caller's
        self._owns_store = not isinstance(url, Store)
        try:
            self.store = open_store(url, **store_options)
        except errors.UnknownOptionError as err:  # suggest the Checkpointer's options too
            raise err.widened("Checkpointer", _own_options(type(self))) from None
        if layout != "file-per-shard" and not self.store.capabilities.positional_writes:
            raise errors.InvalidArgumentError(
                f"layout {layout!r} needs positional writes, which {self.store.url} "
                f"({self.store.name}) lacks; valid here: file-per-shard"
            )
        if snapshot == "fork":
            why = (
                "this platform has no os.fork"
                if not hasattr(os, "fork")
                else f"this platform has no {SMAPS} (Linux) to tell private memory from shared"
                if not os.path.exists(SMAPS)
                else f"{self.store.url} ({self.store.name}) cannot write from a forked process"
                if not self.store.fork_safe
                else f"layout {layout!r} coordinates ranks while writing"
                if layout != "file-per-shard"
                else ""
            )
            if why:
                raise errors.InvalidArgumentError(
                    f"snapshot='fork' is not possible here: {why}; use snapshot='copy'"
                    + ("" if layout == "file-per-shard" else " or layout='file-per-shard'")
                )
        key_layout = key_layout or self.store.preferred_key_layout
        self.snapshot = snapshot
        self.keep_last = keep_last
        self.async_save = async_save
        self.comm: Communicator = comm if comm is not None else detect()
        self.layout = layout
        self.key_layout = key_layout
        self.chunk_size = parse_size(chunk_size, field="chunk_size")
        self.max_object_size = parse_size(max_object_size, field="max_object_size")
        if self.chunk_size <= 0 or self.max_object_size <= 0:
            raise errors.InvalidArgumentError("chunk_size and max_object_size must be > 0")
        self._bg_comm: Communicator | None = None
        self._executor: ThreadPoolExecutor | None = None
        # async snapshots reuse this memory; a fork's child must see the copies it holds
        self._snapshots = SnapshotBuffers(inherit=snapshot == "fork")
        self._pending: SaveHandle | None = None
        self._lock = threading.Lock()
        self._retained = False  # retention ran once (see keep_last)
        self._warned_other_writer = False

    # -- saving -----------------------------------------------------------------------------
    def save(
        self, state: Any, step: int, *, metadata: Any = None, blocking: bool | None = None
    ) -> SaveHandle:
        """Save ``state`` as ``step``. Blocking: returns when committed. Async: returns after
        the snapshot; ``handle.wait()`` (or the next ``save``/``wait``) gives the outcome.
        ``step``: any integral (:func:`ckptio.format.as_step`)."""
        step = fmt.as_step(step)
        self.wait()  # one save in flight at a time; raises the previous one's failure
        background = self.async_save if blocking is None else not blocking
        fork = background and self.snapshot == "fork"
        t0 = time.perf_counter()
        try:
            if self.comm.rank == 0:  # rank 0's state is the checkpoint's structure
                refuse_empty(state)
            prepared = prepare(
                state,
                metadata,
                copy=self._fork_copies() if fork else background,
                buffers=self._snapshots,
            )
        except errors.CkptioError as err:
            if self.comm.size == 1:
                raise
            prepared = PreparedState(None, {}, None, error=err)  # still join the collective
        if not background:
            result = self._persist(prepared, step, self.comm)
            return SaveHandle(step, time.perf_counter() - t0, None, result)
        forked = self._fork_writer(prepared, step) if fork and prepared.error is None else None
        if self._executor is None:
            self._bg_comm = self.comm.dup() if self.comm.size > 1 else SingleProcess()
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ckptio-save")
        comm = self._bg_comm
        assert comm is not None
        try:
            fut = self._executor.submit(self._persist, prepared, step, comm, forked)
        except BaseException:
            if forked is not None:
                forked.cancel()
            raise
        report = _BackgroundSave(step, self.store.url, fut)
        handle = SaveHandle(step, time.perf_counter() - t0, fut, None, report)
        if prepared.error is not None:
            handle.wait()  # the collective fails on every rank; raise here, not later
        with self._lock:
            self._pending = handle
        return handle

    @staticmethod
    def _fork_copies() -> Callable[[np.ndarray], bool]:
        """Which arrays a fork would not snapshot (shared or not-inherited memory): those are
        copied before the fork, the rest is left to copy-on-write."""
        ranges = unforkable_ranges()
        return lambda array: in_ranges(array, ranges)

    def _fork_writer(self, prepared: PreparedState, step: int) -> ForkedWriter:
        """Fork the child that will write this rank's shards of ``prepared`` (see
        :mod:`ckptio.forked`); it waits for the plan's token and its share of the tensors."""
        store, rank, tensors = self.store, self.comm.rank, prepared.tensors
        key_layout, chunk_size, max_object_size = (
            self.key_layout,
            self.chunk_size,
            self.max_object_size,
        )

        def work(orders: Mapping[str, Any]) -> dict[str, Any]:
            # objects of at most FORK_OBJECT_BYTES: the memory of each is given back to the
            # parent (its pages become the parent's alone) as soon as it is durable
            return write_rank_shards(
                store,
                step,
                rank,
                orders["token"],
                [tensors[p] for p in orders["paths"]],
                key_layout=key_layout,
                chunk_size=chunk_size,
                max_object_size=min(max_object_size, FORK_OBJECT_BYTES),
                parallel=PARALLEL_OBJECTS,
                progress=PageReleaser(),
            )

        return ForkedWriter(work, after_fork=store.after_fork)

    def _persist(
        self,
        prepared: PreparedState,
        step: int,
        comm: Communicator,
        forked: ForkedWriter | None = None,
    ) -> SaveResult:
        retains = self.keep_last is not None and self._retains(comm)
        if retains and not self._retained:
            self._retain(step - 1)  # what a killed predecessor left before its retention ran
        try:
            result = self._commit(prepared, step, comm, forked)
        finally:
            if forked is not None:
                forked.cancel()  # a no-op once it ran; ends the child if the save stopped before
        if retains:
            self._retain(step)
        return result

    def _retains(self, comm: Communicator) -> bool:
        """Whether this rank applies retention to the store (rank 0: the store is shared)."""
        return comm.rank == 0

    def _commit(
        self, prepared: PreparedState, step: int, comm: Communicator, forked: ForkedWriter | None
    ) -> SaveResult:
        """Write ``prepared`` and commit it as ``step`` (collective): the save pipeline."""
        return save_collective(self.store, prepared, step, comm, self.write_options, forked=forked)

    @property
    def write_options(self) -> WriteOptions:
        """How this checkpointer's saves lay their data out (every save's
        :class:`~ckptio.checkpoint.write.SavePlan` carries it)."""
        return WriteOptions(self.layout, self.key_layout, self.chunk_size, self.max_object_size)

    def _retain(self, newest: int) -> None:
        """Retire all but the newest ``keep_last`` steps up to ``newest`` (their data stays for
        readers for the grace period, see :mod:`ckptio.lease`) and collect debris."""
        self._retained = True
        try:
            sweep = retain(
                self.store, newest, self.keep_last, grace=self.retire_grace, doomed=self._doomed
            )
            others = sorted({lease.holder() for lease in sweep.live if not lease.mine()})
            if others and not self._warned_other_writer:
                self._warned_other_writer = True
                log.warning(
                    "another process is saving under %s (%s): keep_last=%d applies to every "
                    "checkpoint under the root, its checkpoints too (saves in flight are never "
                    "touched); give each job its own root to keep their checkpoints apart",
                    self.store.url,
                    ", ".join(others),
                    self.keep_last,
                )
        except Exception as err:  # retention must not fail a committed save
            log.warning("retention after step %d failed: %s", newest, err)

    def _doomed(self, steps: Sequence[int], newest: int) -> list[int]:
        """The committed ``steps`` retention retires: all but the newest ``keep_last`` up to
        ``newest`` (a tier of :class:`~ckptio.checkpoint.fastroot.FastTier` keeps more)."""
        return doomed_steps(steps, newest, self.keep_last)

    def wait(self) -> SaveResult | None:
        """Wait for the save in flight, if any; raise its error if it failed, unless its
        handle's ``wait`` raised it already (a failure is handed to the caller once)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return None
        result, error, first = pending._outcome(None)
        if error is None or not first:
            return result
        if isinstance(error, errors.CkptioError) or not isinstance(error, Exception):
            raise error
        raise errors.SaveFailedError(
            f"background save of step {pending.step} failed: {error}"
        ) from error

    # -- loading ----------------------------------------------------------------------------
    # Each of these first waits for this Checkpointer's save in flight (raising its failure),
    # so a step it just saved in the background is seen as soon as it is asked for.
    def steps(self) -> list[int]:
        """Committed steps (manifest present), ascending."""
        self.wait()
        return committed_steps(self.store)

    def latest(self) -> int | None:
        """The newest step whose manifest validates, or None."""
        self.wait()
        try:
            return open_checkpoint(self.store).step
        except FileNotFoundError:
            return None

    def open(self, step: int | None = None) -> CheckpointReader:
        self.wait()
        return open_checkpoint(self.store, step)

    def load(
        self, step: int | None = None, *, select: Mapping[str, Any] | None = None, into: Any = None
    ) -> Any:
        """The state of ``step`` (default: the newest complete checkpoint); ``select`` and
        ``into`` as for :func:`load`."""
        if step is not None:
            step = fmt.as_step(step)
        self.wait()
        if step is not None:
            return open_checkpoint(self.store, step).state(select, into=into)
        return read_newest(self.store, select, into)

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the save in flight (raising its failure) and release resources: the
        background thread, the snapshot memory, and the store if this Checkpointer opened it
        from a URL (its clients and I/O threads; a Store passed in is left open for its
        owner). Closing twice is harmless."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            self._snapshots.release()
            if self._owns_store:
                self._owns_store = False
                self.store.close()


def _own_options(cls: type) -> list[str]:
    """The keyword arguments ``cls.__init__`` (and its bases') take by name: what a
    Checkpointer keeps for itself rather than passing on to its store."""
    import inspect  # error path only

    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None and klass is not object:
            names.update(
                p.name
                for p in inspect.signature(init).parameters.values()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.name not in ("self", "url")
            )
    return sorted(names)


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    ck = {k: options.pop(k) for k in list(options) if k in _CHECKPOINT_OPTIONS}
    return ck, options


def save(
    state: Any,
    url: str | os.PathLike[str] | Store,
    step: int,
    *,
    blocking: bool = True,
    metadata: Any = None,
    comm: Communicator | None = None,
    **options: Any,
) -> SaveHandle:
    """Save ``state`` under ``url`` as ``step``. See :class:`Checkpointer` for options.

    ``blocking=False`` returns after the snapshot; the handle's ``wait`` raises a failure. A
    failure no ``wait`` raised (the handle dropped) is printed on stderr at interpreter exit,
    which also waits for the save if it still runs.
    """
    ck = StoreCheckpointer(url, async_save=not blocking, comm=comm, **options)
    handle = ck.save(state, step, metadata=metadata)
    if blocking:
        ck.close()
    return handle
