"""Tiered checkpoints: every save commits on a fast tier, some are drained to a durable one.

::

    ck = ckptio.Checkpointer("s3://bucket/run", local="file:///nvme/run",
                             keep_last_local=2, keep_last=5, persist_every=3)
    ck.save(state, step=s)        # returns once step s is committed on the fast tier
    state = ck.load()             # the newest step complete for every rank, on either tier

``Checkpointer(url, local=...)`` is made of a :class:`TieredCheckpointer`: the two-tier engine,
built of one ordinary :class:`~ckptio.checkpoint.checkpointer.StoreCheckpointer` per tier (the
fast one a :class:`~ckptio.checkpoint.fastroot.FastTier`); the on-storage format of each tier
is the ordinary one. The copy is :mod:`ckptio.checkpoint.drain`'s.

**Saving.** Every save is an ordinary ckptio checkpoint on the fast tier (shards, then the
manifest, under the save's lease; see :mod:`ckptio.lease`); ``save`` blocks for that only (or,
with ``async_save``, for the snapshot). The first save and every ``persist_every``-th after it
is then *drained* in a background thread: the rank that committed it publishes a lease on the
durable tier's step (and one on the fast tier's, so no gc or retention of another process
deletes what is being read), every rank copies the shard objects that the fast manifest names
for it (its own ``rank-NNNNN-…`` objects) byte for byte under the same keys, checking every
chunk's CRC32C as the bytes pass, and once every rank reports its objects durable, the durable
tier's commit publishes the same manifest there (after checking its lease and listing every
object). A drain that fails or is cancelled discards what it copied and commits nothing.

**Backpressure** (``drain_backpressure``), when the previous drain still runs at the next save
that is to be drained: ``"wait"`` (the save first waits for it: the caller stalls),
``"skip"`` (this step stays on the fast tier only), ``"cancel"`` (the older drain is abandoned
and this step's drain starts after it has wound down). The handle records what was done and
the drain lag (how long the running drain had been behind its fast commit).

**Retention**, per tier, only ever by retirement (:func:`ckptio.lease.retire`): the durable
tier keeps its newest ``keep_last`` steps; the fast tier keeps its newest ``keep_last_local``
steps, plus every step whose drain is queued or running, plus the newest step chosen for
draining while it is not yet committed on the durable tier (a failed or cancelled drain keeps
it until a newer chosen step is chosen). A step skipped by backpressure is not chosen. With
``replicas``, it also keeps every step whose peer copies are queued or being made, and the
newest step whose copies every rank completed (the step a lost node's ranks restore from
until a newer one is complete everywhere).

**Restore** (``load``): every rank reports the steps whose objects it finds on its fast root
(the manifest there and every object it names that belongs on that root) and the steps
committed on the durable tier; the newest step that every rank has on its fast root or that
is committed on the durable tier is read, each rank from its fast root where it has it (an
object missing there is read from the durable tier when the step is committed there), else
from the durable tier. Any read of the fast tier that fails (an object gone, a CRC mismatch,
an I/O error of a failing disk, an object refused as a symlink out of the root) falls back to
the same step on the durable tier, then to the next older candidate, agreed by every rank
(:func:`read_first_intact`), each time with a warning naming the tier, the step and the cause.
A durable tier that cannot be listed (its endpoint down) leaves the fast tier's steps, with a
warning. Damaged data is never returned: every chunk's CRC32C is checked on either tier.

**Fast roots per rank** (node-local disks): ``local`` may name each rank's root, as a URL with
``{rank}`` or a list of one URL per rank. Each rank then writes its shards, its lease and a
copy of the manifest under its own root; a rank's root is complete for a step when the
manifest and that rank's own objects are there. Tensors a rank reads that another rank wrote
(replicated ones are written once, by the lowest rank holding them) are read from the durable
tier when the step was drained, else from that rank's root if this process can reach it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.checkpoint.checkpointer import Lifetime, SaveHandle, StoreCheckpointer
from ckptio.checkpoint.commit import (
    SaveResult,
    discard_objects,
    lease_new_step,
    publish_manifest,
)
from ckptio.checkpoint.drain import (
    Cancelled,
    DrainHandle,
    DrainResult,
    acquire_beside,
    copy_rank_objects,
    object_rank,
)
from ckptio.checkpoint.fastroot import (
    OWNER_KEY,
    FastTier,
    check_one_root_reaches_every_node,
    claim_fast_root,
    fast_roots,
)
from ckptio.checkpoint.peer_restore import CALLERS_FAULT as _CALLERS_FAULT
from ckptio.checkpoint.peer_restore import durable_listing, restore_with_peers
from ckptio.checkpoint.peers import (
    NodeRing,
    PeerResult,
    RestoreRecord,
    node_name,
    replicate_step,
    wire,
)
from ckptio.checkpoint.read import RELISTS, CheckpointReader, committed_steps, read_manifest
from ckptio.checkpoint.retention import retire_newer
from ckptio.dist import Communicator, SingleProcess, detect
from ckptio.lease import SaveLease
from ckptio.registry import location, open_store
from ckptio.store import Store, option_int

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = [
    "BACKPRESSURE",
    "DrainHandle",
    "DrainResult",
    "TieredCheckpointer",
    "TieredSaveHandle",
    "read_first_intact",
    "tiered_checkpointer",
]

BACKPRESSURE = ("wait", "skip", "cancel")
"""What a save chosen for draining does while the previous drain still runs (see the module
docstring)."""


@dataclass
class TieredSaveHandle:
    """A save on the fast tier, and its drain if the step was chosen for the durable tier."""

    step: int
    blocking_seconds: float
    """How long ``save`` held the caller (the fast tier's save, or its snapshot, plus any
    backpressure wait)."""
    fast: SaveHandle
    drain: DrainHandle | None = None
    """None when the step is not drained (not chosen by ``persist_every``, or skipped)."""
    backpressure: str = ""
    """``""`` (no drain was running when this step was chosen), ``waited``, ``skipped`` or
    ``cancelled``: what was done about the previous drain."""
    drain_lag_seconds: float = 0.0
    """When this step was chosen for draining: how long the previous drain, still running,
    had been behind its fast commit (0 if none was running)."""
    backpressure_seconds: float = 0.0
    """Seconds this save waited for the previous drain (``wait``)."""
    peer: Future[PeerResult] | None = None
    """The step's peer copies (``replicas``), running in the background; None without."""

    def done(self) -> bool:
        return self.fast.done()

    def wait(self, timeout: float | None = None) -> SaveResult:
        """The fast tier's save (raises its failure, as :meth:`SaveHandle.wait`)."""
        return self.fast.wait(timeout)

    result = wait

    def wait_drain(self, timeout: float | None = None) -> DrainResult | None:
        """The drain's result, None if the step is not drained."""
        return None if self.drain is None else self.drain.wait(timeout)

    def wait_peers(self, timeout: float | None = None) -> PeerResult | None:
        """The peer copies' result (never raises but ``TimeoutError``), None without."""
        return None if self.peer is None else self.peer.result(timeout)


class _Overlay(Store):
    """Read-only: each object from the first of ``stores`` that has it."""

    name = "tiers"

    def __init__(self, stores: Sequence[Store]) -> None:
        super().__init__(stores[0].url, trace=stores[0].trace)
        self.stores = list(stores)
        self.capabilities = stores[0].capabilities  # type: ignore[misc]

    def _either(self, fn: Callable[[Store], T]) -> T:
        for store in self.stores[:-1]:
            try:
                return fn(store)
            except FileNotFoundError:
                continue
        return fn(self.stores[-1])

    def read_into(self, key: str, offset: int, buffer: Any) -> int:
        return self._either(lambda s: s.read_into(key, offset, buffer))

    def size(self, key: str) -> int:
        return self._either(lambda s: s.size(key))

    def list(self, prefix: str = "") -> list[str]:
        return sorted({k for store in self.stores for k in store.list(prefix)})

    def open_writer(self, key: str, *, size_hint: int | None = None) -> Any:
        raise errors.InvalidArgumentError("a restore's view of two tiers is read-only")

    def delete(self, keys: Any) -> None:
        raise errors.InvalidArgumentError("a restore's view of two tiers is read-only")

    def publish(self, key: str, data: bytes, *, overwrite: bool = True) -> None:
        raise errors.InvalidArgumentError("a restore's view of two tiers is read-only")


FAST_TIER_OPTIONS = (
    "async_save",
    "layout",
    "key_layout",
    "chunk_size",
    "max_object_size",
    "snapshot",
)
"""Options of :func:`tiered_checkpointer` that go to the fast tier only (the saves happen
there); ``comm`` and ``retire_grace`` go to both tiers, the rest to the durable one."""


def tiered_checkpointer(
    url: Any,
    *,
    local: Any,
    keep_last: int | None = None,
    keep_last_local: int | None = 2,
    persist_every: int = 1,
    drain_backpressure: str = "wait",
    local_options: Mapping[str, Any] | None = None,
    replicas: int = 0,
    **options: Any,
) -> TieredCheckpointer:
    """A :class:`TieredCheckpointer` built of its two tiers: ``url`` the durable one, ``local``
    the fast one (a URL, a URL with ``{rank}``, or one URL per rank).

    ``keep_last_local`` (default 2; None keeps all), ``keep_last`` (the durable tier's; None
    keeps all), ``persist_every`` (default 1: the first save and every N-th after it are
    drained), ``drain_backpressure`` (``wait``, ``skip``, ``cancel``; default ``wait``),
    ``local_options`` (store options of the fast tier), ``replicas`` (default 0: copies of
    each rank's fast-tier steps on that many other nodes' fast roots,
    :mod:`ckptio.checkpoint.peers`); ``async_save``, ``snapshot``,
    ``layout`` (``file-per-shard`` only: a drain copies each rank's own objects),
    ``key_layout`` (default: the durable store's preference: the keys are the same on both
    tiers), ``chunk_size``, ``max_object_size`` (the fast tier's saves), ``comm``,
    ``retire_grace`` (both tiers) as for
    :class:`~ckptio.checkpoint.checkpointer.StoreCheckpointer`; any other option goes to the
    durable store.
    """
    if drain_backpressure not in BACKPRESSURE:
        raise errors.InvalidArgumentError(
            f"drain_backpressure: unknown {drain_backpressure!r}; valid: {', '.join(BACKPRESSURE)}"
        )
    fast_options = {k: options.pop(k) for k in FAST_TIER_OPTIONS if k in options}
    layout = fast_options.setdefault("layout", "file-per-shard")
    if layout != "file-per-shard":
        raise errors.InvalidArgumentError(
            f"layout {layout!r} cannot be tiered: a drain copies each rank's own objects; use file-per-shard"
        )
    persist_every = option_int(persist_every, field="persist_every", minimum=1)
    replicas = option_int(replicas, field="replicas", minimum=0)
    comm: Communicator = options.pop("comm", None) or detect()
    roots = fast_roots(local, comm.size)
    if len(set(roots)) not in (1, comm.size):
        raise errors.InvalidArgumentError(
            "local: give every rank its own fast-tier root, or all ranks one"
        )
    durable = StoreCheckpointer(url, keep_last=keep_last, comm=comm, **options)
    if fast_options.get("key_layout") is None:  # the same keys on both tiers
        fast_options["key_layout"] = durable.store.preferred_key_layout
    if "retire_grace" in options:
        fast_options["retire_grace"] = options["retire_grace"]
    try:
        fast = FastTier(
            roots[comm.rank],
            keep_last=keep_last_local,
            comm=comm,
            **fast_options,
            **dict(local_options or {}),
        )
    except BaseException:
        durable.close()
        raise
    return TieredCheckpointer(
        durable,
        fast,
        roots,
        persist_every=persist_every,
        drain_backpressure=drain_backpressure,
        replicas=replicas,
    )


class TieredCheckpointer(Lifetime):
    """Checkpoints of one run on two tiers (see the module docstring), composed of two
    one-store engines: ``durable`` and ``fast`` (this rank's root of ``roots``, one per rank).
    Built by :func:`tiered_checkpointer` (or ``ckptio.Checkpointer(url, local=...)``); it owns
    both tiers from then on (``close`` closes them), and claims the fast root for the durable
    one (:func:`~ckptio.checkpoint.fastroot.claim_fast_root`), collectively."""

    def __init__(
        self,
        durable: StoreCheckpointer,
        fast: FastTier,
        roots: Sequence[str],
        *,
        persist_every: int = 1,
        drain_backpressure: str = "wait",
        replicas: int = 0,
    ) -> None:
        self.durable, self.fast = durable, fast
        self.replicas = replicas
        self.persist_every = persist_every
        self.drain_backpressure = drain_backpressure
        self.comm: Communicator = durable.comm
        self.store = durable.store
        self.roots = list(roots)
        self.per_rank = self.comm.size > 1 and len(set(self.roots)) > 1
        self.fast.protected = self._protected
        self.fast.per_rank = self.per_rank
        self._claim_fast_root()
        if not self.per_rank and self.comm.size > 1:
            try:
                check_one_root_reaches_every_node(self.fast.store, self.comm)
            except errors.InvalidArgumentError:
                self.fast.close()
                self.durable.close()
                raise
        self._lock = threading.Lock()
        self._saves = 0
        self._drains: list[DrainHandle] = []  # queued or running, in order
        self._last_drain: DrainHandle | None = None
        self._chosen: int | None = None  # the newest step chosen for draining
        self._durable_steps: set[int] = set()  # steps this Checkpointer's drains committed
        self._drain_comm: Communicator | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._peer_jobs: list[tuple[int, Future[PeerResult]]] = []  # queued or running
        self._peer_executor: ThreadPoolExecutor | None = None
        self._peer_wire: Any = None
        self._replicated: int | None = None
        """The newest step whose peer round every rank saw replicated (or that was restored
        with peer copies): kept on the fast root and in the copies until a newer one is."""
        self.last_restore: RestoreRecord | None = None
        """Where this rank's last :meth:`load` read from (``local``/``peer``/``durable``)."""
        self.job = location(self.store.url)
        self.ring: NodeRing | None = None
        if replicas:
            try:
                self._setup_peers()
            except BaseException:
                self.fast.close()
                self.durable.close()
                raise

    def _setup_peers(self) -> None:
        """Collective: the job's nodes (see :mod:`ckptio.checkpoint.peers`), and the process
        group the copies travel on (a dup of the job's)."""
        if self.comm.size > 1 and not self.per_rank:
            raise errors.InvalidArgumentError(
                f"replicas={self.replicas}: peer copies go from one node's fast root to "
                "another's; give each rank its own fast root on its node (local= with {rank})"
            )
        names = self.comm.gather(node_name(), root=0)
        self.ring = self.comm.bcast(None if names is None else list(names), root=0)
        self.ring = NodeRing.of(self.ring)  # type: ignore[arg-type]
        comm = self.comm.dup() if self.comm.size > 1 else self.comm
        self._peer_comm = comm
        self._peer_wire = wire(comm)

    def _claim_fast_root(self) -> None:
        """Collective: every rank's fast root is this job's (its owner record names this
        durable root, or is written now), or every rank raises the same error."""
        refusal: tuple[str, str] = ("", "")  # (why, "refused" or "failed")
        try:
            why = claim_fast_root(self.fast.store, location(self.store.url))
            refusal = (why, "refused")
        except errors.CkptioError as err:
            where = f"{self.fast.store.url}/{OWNER_KEY}"
            refusal = (
                f"local: the fast root's owner record {where} cannot be read or written: {err}",
                "failed",
            )
        if self.comm.size > 1:
            refusals = self.comm.gather(refusal, root=0)
            refusal = self.comm.bcast(next((r for r in refusals or () if r[0]), ("", "")), root=0)
        why, how = refusal
        if why:
            self.fast.close()
            self.durable.close()
            raise (errors.InvalidArgumentError if how == "refused" else errors.StorageError)(why)

    # -- saving -----------------------------------------------------------------------------
    def save(
        self, state: Any, step: int, *, metadata: Any = None, blocking: bool | None = None
    ) -> TieredSaveHandle:
        """Save ``state`` as ``step`` on the fast tier (returns when it is committed there, or
        after the snapshot with ``async_save``); drain it if it is chosen (see the module
        docstring). Every rank calls it together."""
        step = fmt.as_step(step)
        t0 = time.perf_counter()
        self.fast.wait()  # the previous save's commit (raising its failure): its drain may start
        chosen = self._saves % self.persist_every == 0
        self._saves += 1
        action, lag, waited = "", 0.0, 0.0
        if chosen:
            running, lag = self._agree_running()
            if running:
                prev = self._last_drain
                assert prev is not None
                if self.drain_backpressure == "wait":
                    action = "waited"
                    w0 = time.perf_counter()
                    prev.future.exception()  # a drain's failure is in its result, never raised
                    waited = time.perf_counter() - w0
                elif self.drain_backpressure == "skip":
                    action, chosen = "skipped", False
                else:
                    action = "cancelled"
                    prev.cancel()
        job = DrainHandle(step) if chosen else None
        if job is not None:
            with self._lock:  # the fast tier's retention (in this save) must see it already
                self._chosen = step
                self._drains.append(job)
                self._last_drain = job
        try:
            fast = self.fast.save(state, step, metadata=metadata, blocking=blocking)
        except BaseException as err:
            if job is not None:
                self._finish(
                    job, DrainResult(step, "failed", error=f"the fast tier's save failed: {err}")
                )
            raise
        if job is not None:
            if fast._future is None:
                job.fast_committed = time.monotonic()
            else:
                committing = job

                def committed(_f: Future[Any]) -> None:
                    committing.fast_committed = time.monotonic()

                fast._future.add_done_callback(committed)
            try:
                self._submit(job, fast)
            except BaseException as err:  # never left pending: close() waits for it
                self._finish(job, DrainResult(step, "failed", error=f"not started: {err}"))
                raise
        peer = self._replicate(step, fast) if self.replicas else None
        return TieredSaveHandle(
            step, time.perf_counter() - t0, fast, job, action, lag, waited, peer=peer
        )

    def _replicate(self, step: int, fast: SaveHandle) -> Future[PeerResult]:
        """Queue the peer copies of ``step`` (after its fast commit), in the background: every
        rank queues the same steps in the same order, so the rounds match."""
        assert self.ring is not None
        self.ring.check(self.replicas)
        if self._peer_executor is None:
            self._peer_executor = ThreadPoolExecutor(1, thread_name_prefix="ckptio-peers")
        ring, k, store = self.ring, self.replicas, self.fast.store
        keep = self.fast.keep_last

        def run() -> PeerResult:
            try:
                if fast._future is not None and fast._future.exception() is not None:
                    return PeerResult(step, "failed", error="the fast tier's save failed")
                with self._lock:
                    safe = self._replicated
                result = replicate_step(
                    self._peer_comm, self._peer_wire, ring, k, store, step, self.job, keep, safe
                )
                if result.status == "replicated":
                    self._mark_replicated(step)
                return result
            except BaseException as err:  # recorded in the result; training goes on
                log.debug("peer copies of step %d failed", step, exc_info=True)
                return PeerResult(step, "failed", error=f"{type(err).__name__}: {err}")

        with self._lock:
            future = self._peer_executor.submit(run)
            self._peer_jobs.append((step, future))

        def finished(f: Future[PeerResult]) -> None:
            with self._lock:
                self._peer_jobs = [(s, j) for s, j in self._peer_jobs if j is not f]
            result = f.result()
            if result.status == "failed":
                log.warning("the peer copies of step %d failed: %s", step, result.error)

        future.add_done_callback(finished)
        return future

    def _mark_replicated(self, step: int) -> None:
        """``step`` is whole on the peers (every rank's copies committed on all its partners,
        or restored): the fast tier's retention and the copies' keep it until a newer one is
        (see :func:`~ckptio.checkpoint.peers.retain_copies`)."""
        with self._lock:
            if self._replicated is None or step > self._replicated:
                self._replicated = step

    def wait_peers(self) -> list[PeerResult]:
        """Wait for the peer copies queued or running; their results."""
        with self._lock:
            pending = [f for _, f in self._peer_jobs]
        return [f.result() for f in pending]

    def _agree_running(self) -> tuple[bool, float]:
        """Whether the previous drain still runs on any rank (every rank gets the same answer,
        so all take the same backpressure action), and how far it is behind its fast commit."""
        prev = self._last_drain
        running = prev is not None and not prev.done()
        lag = 0.0
        if running and prev is not None and prev.fast_committed is not None:
            lag = time.monotonic() - prev.fast_committed
        if self.comm.size == 1:
            return running, lag
        flags = self.comm.gather((running, lag), root=0)
        verdict = (
            (any(f[0] for f in flags), max(f[1] for f in flags)) if flags is not None else None
        )
        running, lag = self.comm.bcast(verdict, root=0)
        return bool(running), float(lag)

    def _submit(self, job: DrainHandle, fast: SaveHandle) -> None:
        if self._executor is None:
            self._drain_comm = self.comm.dup() if self.comm.size > 1 else SingleProcess()
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ckptio-drain")
        self._executor.submit(self._run_drain, job, fast)

    def _finish(self, job: DrainHandle, result: DrainResult) -> None:
        with self._lock:
            if job in self._drains:
                self._drains.remove(job)
            if result.status == "durable":
                self._durable_steps.add(job.step)
        if result.status == "failed":
            log.warning(
                "the drain of step %d to %s failed: %s", job.step, self.store.url, result.error
            )
        job.future.set_result(result)

    def _protected(self) -> set[int]:
        """Steps the fast tier's retention keeps beyond its newest ``keep_last_local``."""
        with self._lock:
            keep = {j.step for j in self._drains} | {s for s, _ in self._peer_jobs}
            if self._replicated is not None:
                keep.add(self._replicated)
            if self._chosen is not None and self._chosen not in self._durable_steps:
                keep.add(self._chosen)
            return keep

    # -- draining ---------------------------------------------------------------------------
    def _run_drain(self, job: DrainHandle, fast: SaveHandle) -> None:
        try:
            result = self._drain(job, fast)
        except BaseException as err:  # recorded in the result; training goes on
            log.debug("drain of step %d failed", job.step, exc_info=True)
            result = DrainResult(job.step, "failed", error=f"{type(err).__name__}: {err}")
        if job.fast_committed is not None and result.lag_seconds == 0.0:
            result.lag_seconds = time.monotonic() - job.fast_committed
        self._finish(job, result)

    def _drain(self, job: DrainHandle, fast: SaveHandle) -> DrainResult:
        step = job.step
        if fast._future is not None:
            err = fast._future.exception()  # not claimed: the fast save's failure is the caller's
            if err is not None:
                return DrainResult(step, "failed", error=f"the fast tier's save failed: {err}")
        comm = self._drain_comm
        assert comm is not None
        t0 = time.perf_counter()
        mkey = fmt.manifest_key(step)
        leases: list[SaveLease] = []
        plan: dict[str, Any] = {}
        try:
            if comm.rank == 0:
                try:
                    if job.cancel_event.is_set():
                        raise Cancelled
                    data = self.fast.store.get(mkey)
                    mf.parse_manifest(data, expect_step=step)
                    if self.durable.keep_last is not None and not self.durable._retained:
                        # what killed predecessors' drains left before their retention ran:
                        # a run of such kills cannot pile checkpoints up (as Checkpointer)
                        self.durable._retain(step - 1)
                    # leases first: nothing is written to the durable tier, nor read from the
                    # fast one, before gc and retention elsewhere know to leave the step alone
                    leases.append(lease_new_step(self.store, step))
                    leases.append(acquire_beside(self.fast.store, step))
                    plan = {"ok": True, "manifest": data.decode()}
                except Cancelled:
                    plan = {"ok": False, "cancelled": True}
                except Exception as err:
                    plan = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            plan = comm.bcast(plan, root=0)
            if not plan["ok"]:
                if plan.get("cancelled"):
                    return DrainResult(step, "cancelled")
                return DrainResult(step, "failed", error=plan["error"])
            manifest = mf.parse_manifest(plan["manifest"].encode(), expect_step=step)
            outcome: dict[str, Any] = {"ok": True, "keys": [], "nbytes": 0}
            try:
                if self.per_rank and comm.rank != 0:  # what this rank reads stays on its root
                    leases.append(acquire_beside(self.fast.store, step))
                copy_rank_objects(
                    self.fast.store,
                    self.store,
                    manifest,
                    comm.rank,
                    job.cancel_event.is_set,
                    outcome,
                )
            except Cancelled:
                outcome.update(ok=False, cancelled=True)
            except Exception as err:
                log.debug("rank %d failed draining step %d", comm.rank, step, exc_info=True)
                outcome.update(ok=False, error=f"{type(err).__name__}: {err}")
            outcomes = comm.gather(outcome, root=0)
            verdict: dict[str, Any] = {}
            if comm.rank == 0:
                assert outcomes is not None
                verdict = self._commit_drain(step, plan["manifest"].encode(), manifest, outcomes)
                for lease in leases:
                    lease.release()
                if verdict["ok"] and self.durable.keep_last is not None:
                    self.durable._retain(step)  # also the debris of a killed predecessor's drains
            verdict = comm.bcast(verdict, root=0)
        finally:
            for lease in leases:
                lease.release()
        seconds = time.perf_counter() - t0
        lag = time.monotonic() - job.fast_committed if job.fast_committed is not None else 0.0
        status = (
            "durable" if verdict["ok"] else "cancelled" if verdict.get("cancelled") else "failed"
        )
        return DrainResult(step, status, outcome["nbytes"], seconds, lag, verdict.get("error", ""))

    def _commit_drain(
        self,
        step: int,
        data: bytes,
        manifest: mf.Manifest,
        outcomes: Sequence[Mapping[str, Any]],
    ) -> dict[str, Any]:
        """Rank 0: publish the manifest on the durable tier once every rank's objects are
        there, or discard what the drain copied."""
        copied = [f"{fmt.step_dir(step)}/{k}" for o in outcomes for k in o["keys"]]
        cancelled = any(o.get("cancelled") for o in outcomes)
        failed = [
            f"rank {r}: {o['error']}"
            for r, o in enumerate(outcomes)
            if not o["ok"] and "error" in o
        ]
        if cancelled or failed:
            discard_objects(self.store, copied)
            return {"ok": False, "cancelled": cancelled and not failed, "error": "; ".join(failed)}
        try:
            publish_manifest(self.store, step, data, manifest.objects)
        except Exception as err:
            if not isinstance(err, errors.AlreadyExistsError):
                discard_objects(self.store, copied)
            return {"ok": False, "error": f"{type(err).__name__}: {err}"}
        return {"ok": True}

    # -- loading ----------------------------------------------------------------------------
    def tiers(self) -> dict[str, list[int]]:
        """Committed steps per tier, ascending: ``{"local": [...], "durable": [...]}`` (this
        rank's fast root)."""
        self.fast.wait()
        return {"local": committed_steps(self.fast.store), "durable": committed_steps(self.store)}

    def steps(self) -> list[int]:
        """Steps committed on either tier (this rank's fast root), ascending."""
        t = self.tiers()
        return sorted(set(t["local"]) | set(t["durable"]))

    def _local_complete(self, step: int | None) -> list[int]:
        """Steps whose manifest is on this rank's fast root with every object that belongs
        there, newest first."""
        store, rank = self.fast.store, self.comm.rank
        mine_only = self.per_rank
        out: list[int] = []
        try:
            steps = committed_steps(store)
        except _CALLERS_FAULT:
            raise
        except Exception as err:  # a failing local disk: the durable tier may have it all
            log.warning(
                "the fast tier %s cannot be listed (%s): restoring without it", store.url, err
            )
            return out
        for s in reversed(steps):
            if step is not None and s != step:
                continue
            try:
                m = read_manifest(store, s)
                prefix = fmt.step_dir(s) + "/"
                present = set(store.list(prefix))
            except _CALLERS_FAULT:
                raise
            except Exception as err:
                gone = isinstance(err, FileNotFoundError)  # retired meanwhile
                if not gone or isinstance(err, errors.NotRegularFileError):
                    log.warning("step %d on the fast tier %s cannot be read: %s", s, store.url, err)
                continue
            need = [k for k in m.objects if not mine_only or object_rank(k) == rank]
            if all(prefix + k in present for k in need):
                out.append(s)
        return out

    def _choose(
        self, step: int | None, skip: set[int], *, speculate: Any = None
    ) -> tuple[Any, ...] | None:
        """Collective: the step to restore, whether this rank reads it from its fast root, and
        whether it is on the durable tier. The durable tier is listed while the fast root is
        looked at; with ``speculate`` (a read of a step: ``speculate(step) -> (state, error)``),
        the newest step every rank has on its fast root is read meanwhile too, so a restore
        from the fast tier does not wait for the listing. Returns ``(step, local, durable,
        state, error)`` where state/error are the speculative read's if it read that step."""

        def want(s):
            return s not in skip and (step is None or s == step)

        with ThreadPoolExecutor(1, thread_name_prefix="ckptio-restore") as ex:
            listing = ex.submit(committed_steps, self.store)
            local = [s for s in self._local_complete(step) if want(s)]
            guess: Any = None
            read: tuple[Any, str] = (None, "")
            if speculate is not None:
                everyone = self.comm.gather(local, root=0)
                if everyone is not None:
                    common = set(everyone[0]).intersection(*map(set, everyone[1:]))
                    guess = max(common, default=None)
                guess = self.comm.bcast(guess, root=0)
                if guess is not None:
                    read = speculate(guess)
            durable, unreachable = durable_listing(listing, self.store.url)
            durable = [s for s in durable if want(s)]
        gathered = self.comm.gather(
            {"local": local, "durable": durable, "unreachable": unreachable}, root=0
        )
        verdict: tuple[int | None, str] = (None, "")
        if gathered is not None:
            durable0 = set(durable)
            candidates = sorted({s for g in gathered for s in g["local"]} | durable0, reverse=True)
            down = next((g["unreachable"] for g in gathered if g["unreachable"]), "")
            verdict = (None, down)
            for s in candidates:
                if all(s in g["local"] or s in durable0 for g in gathered):
                    verdict = (s, down)
                    break
        pick, down = self.comm.bcast(verdict, root=0)
        if pick is None:
            if down:  # nothing on the fast tier: the durable tier's failure is the answer
                what = f"step {step}" if step is not None else "checkpoint"
                raise errors.StorageError(
                    f"no {what} complete for every rank on the fast tier "
                    f"({self.roots[self.comm.rank]}), and the durable tier cannot be listed: {down}"
                )
            return None
        state, error = read if pick == guess else (None, "")
        return pick, pick in local, pick in durable, pick == guess, state, error

    def latest(self) -> int | None:
        """The step :meth:`load` would read (collective), or None."""
        self.fast.wait()
        choice = self._choose(None, set())
        return None if choice is None else choice[0]

    def load(
        self, step: int | None = None, *, select: Mapping[str, Any] | None = None, into: Any = None
    ) -> Any:
        """The state of the newest step complete for every rank (or of ``step``), read from
        the fast tier where this rank has it, else from the durable tier (see the module
        docstring). Every rank calls it together."""
        if step is not None:
            step = fmt.as_step(step)
        self.fast.wait()
        if self.replicas:
            self.wait_peers()  # a round still running shares the restore's process group
            return restore_with_peers(self, step, select, into)
        skip: set[int] = set()
        for _ in range(RELISTS):
            choice = self._choose(
                step, skip, speculate=lambda s: self._read(s, True, True, select, into)
            )
            if choice is None:
                where = f"step {step}" if step is not None else "checkpoint"
                raise errors.NotFoundError(
                    f"no {where} complete for every rank on {self.roots[self.comm.rank]} nor {self.store.url}"
                )
            s, local, durable, done, state, error = choice
            if not done:  # the durable tier has a newer step than every fast root holds
                state, error = self._read(s, local, durable, select, into)
            errs = self.comm.gather(error, root=0)
            failed = self.comm.bcast(None if errs is None else [e for e in errs if e], root=0)
            if not failed:
                if step is None:
                    self._retire_orphans(s, skip)
                return state
            log.warning(
                "restoring step %d failed (%s); trying the next older one", s, "; ".join(failed)
            )
            skip.add(s)
        raise errors.NotFoundError(f"restoring failed {RELISTS} times; the last tried: step {s}")

    def _retire_orphans(self, step: int, failed: set[int]) -> None:
        """After a restore of the newest step complete for every rank (``step``): the newer
        steps on this rank's fast root that the durable tier does not have either are some
        lost node's unfinished business and can never be restored; retired
        (:func:`~ckptio.checkpoint.retention.retire_newer`), so that the resumed run can save
        those step numbers. Kept: the steps that were whole but ``failed`` to read (a failing
        disk may come back), a step whose drain is in flight, and everything while the
        durable tier cannot be listed (a newer step may be whole there). A failure here is
        logged, never the restore's."""
        fast = self.fast.store
        try:
            if not [s for s in committed_steps(fast) if s > step]:
                return
            keep = set(committed_steps(self.store)) | failed
            with self._lock:
                keep.update(j.step for j in self._drains)
            retire_newer(fast, step, keep=keep)
        except _CALLERS_FAULT:
            raise
        except Exception as err:
            log.warning(
                "the steps newer than step %d on %s were not retired (%s: %s); a save of "
                "those step numbers will find them taken",
                step,
                fast.url,
                type(err).__name__,
                err,
            )

    def _read(
        self,
        step: int,
        local: bool,
        durable: bool,
        select: Any,
        into: Any,
        used: list[str] | None = None,
        unread: set[str] | None = None,
    ) -> tuple[Any, str]:
        """This rank's read of ``step``: (state, "") or (None, the error)."""
        with ExitStack() as stack:
            tiers: list[tuple[str, Store]] = []
            if local:
                tiers.append(("the fast tier", stack.enter_context(self._fast_view(durable))))
            if durable:
                tiers.append(("the durable tier", self.store))
            return read_first_intact(tiers, step, select, into, used, unread)

    @contextmanager
    def _fast_view(self, durable: bool) -> Iterator[Store]:
        """The fast tier as a read sees it: this rank's fast root, and the objects of other
        ranks (replicated tensors, a resharded read) from the durable tier if the step is
        there (``durable``), else from their fast roots if this process reaches them."""
        others = [
            open_store(u) for u in dict.fromkeys(self.roots) if u != self.roots[self.comm.rank]
        ]
        try:
            yield _Overlay([self.fast.store, *([self.store] if durable else []), *others])
        finally:
            for store in others:
                store.close()

    # -- lifetime ---------------------------------------------------------------------------
    def wait(self) -> SaveResult | None:
        """Wait for the fast tier's save in flight (raising its failure) and for every drain."""
        result = self.fast.wait()
        self.wait_drains()
        self.wait_peers()
        return result

    def wait_drains(self) -> list[DrainResult]:
        """Wait for the drains queued or running; their results."""
        with self._lock:
            pending = list(self._drains)
        return [j.wait() for j in pending]

    def close(self) -> None:
        """Wait for the save in flight (raising its failure) and the drains; release resources."""
        try:
            self.fast.close()
        finally:
            try:
                self.wait_drains()
                self.wait_peers()
            finally:
                if self._peer_executor is not None:
                    self._peer_executor.shutdown(wait=True)
                    self._peer_executor = None
                if self._executor is not None:
                    self._executor.shutdown(wait=True)
                    self._executor = None
                self.durable.close()


def read_first_intact(
    tiers: Sequence[tuple[str, Store]],
    step: int,
    select: Any,
    into: Any,
    used: list[str] | None = None,
    unread: set[str] | None = None,
) -> tuple[Any, str]:
    """The restore's fallback: the state of ``step`` from the first of ``tiers`` (``(name,
    store)``, nearest first) that reads it whole, as ``(state, "")``; ``(None, the last
    failure)`` when none does. Any failure to read a tier (an object missing, a CRC mismatch,
    an I/O error such as a failing disk's EIO, an object refused as a symlink out of the
    root, the storage unreachable) moves on to the next tier, with a warning naming the tier,
    the step and the cause. Damaged data is never returned: every chunk's CRC32C is checked
    on every tier. ``used`` (a list) gets the name of the tier read. ``unread``: objects the
    read does not touch (a peer restore's rank holds only what it reads), whose size is not
    checked."""
    error = "not on either tier"
    for i, (name, store) in enumerate(tiers):
        try:
            manifest = read_manifest(store, step)
            reader = CheckpointReader(store, step, manifest)
            reader._sizes_checked.update(unread or ())
            state = reader.state(select, into=into)
            if used is not None:
                used.append(name)
            return state, ""
        except _CALLERS_FAULT:
            raise
        except Exception as err:
            error = f"{name} ({store.url}): {type(err).__name__}: {err}"
            if i + 1 < len(tiers):
                log.warning(
                    "step %d cannot be read from %s; reading it from %s",
                    step,
                    error,
                    tiers[i + 1][0],
                )
    return None, error
