"""A restore with peer copies (``replicas``): every rank reports what it holds, rank 0 picks
the newest step that survives and plans where each rank's missing objects come from, the
transfers run, delivering what each rank receives straight into its arrays, and each rank
reads the rest from its fast root beside them (see :mod:`ckptio.checkpoint.peers` for the
protocol). Functions of the :class:`~ckptio.checkpoint.tiered.TieredCheckpointer` they
serve."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.checkpoint.peer_plan import assign
from ckptio.checkpoint.peers import (
    RestoreRecord,
    copy_record,
    drop_copies,
    held_copies,
    run_restore,
)
from ckptio.checkpoint.read import RELISTS, CheckpointReader, committed_steps, read_manifest
from ckptio.checkpoint.sink import PlannedState

if TYPE_CHECKING:
    from ckptio.checkpoint.tiered import TieredCheckpointer

log = logging.getLogger(__name__)

CALLERS_FAULT = (errors.InvalidArgumentError, errors.InsufficientMemoryError)
"""What a read raises that another tier would raise as well (a bad ``select`` or ``into``,
more than this machine can hold): raised at once, not tried elsewhere."""

__all__ = ["CALLERS_FAULT", "durable_listing", "pick_step", "restore_with_peers"]


def _holdings(self: TieredCheckpointer, step: int | None) -> dict[str, Any]:
    """What this rank holds for a restore with peer copies: the steps complete on its own
    fast root (with their world sizes) and the copies on it."""
    own: dict[str, int] = {}
    for s in self._local_complete(step):
        try:
            own[str(s)] = read_manifest(self.fast.store, s).world_size
        except Exception as err:  # retired or damaged meanwhile: not offered
            log.warning("step %d on the fast tier cannot be read: %s", s, err)
    copies: dict[str, dict[str, int]] = {}
    try:
        for q, steps in held_copies(self.fast.store, self.job).items():
            copies[str(q)] = {str(s): w for s, w in steps.items() if step in (None, s)}
    except Exception as err:  # a failing local disk: the others may hold it all
        log.warning("the peer copies on %s cannot be listed: %s", self.fast.store.url, err)
    return {"own": own, "copies": copies}


def restore_with_peers(self: TieredCheckpointer, step: int | None, select: Any, into: Any) -> Any:
    """:meth:`TieredCheckpointer.load` with peer copies (``replicas``; collective): see
    :mod:`ckptio.checkpoint.peers`."""
    comm, fast = self.comm, self.fast.store
    skip: set[int] = set()
    unreadable: set[int] = set()  # whole somewhere, but its read failed: never retired here
    bad: set[tuple[int, int, int]] = set()
    spent = {"plan": 0.0, "transfer": 0.0, "read": 0.0}
    for _ in range(2 * RELISTS):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(1, thread_name_prefix="ckptio-restore") as ex:
            listing = ex.submit(committed_steps, self.store)
            mine = _holdings(self, step)
            durable, down = durable_listing(listing, self.store.url)
        reports = comm.gather(mine, root=0)
        pick: dict[str, Any] = {"step": None, "down": down}
        if reports is not None:
            pick = pick_step(reports, set(durable), step, skip, down)
        pick = comm.bcast(pick, root=0)
        s = pick["step"]
        if s is None:
            what = f"step {step}" if step is not None else "checkpoint"
            if pick["down"]:
                raise errors.StorageError(
                    f"no {what} survives on the fast tier or its peer copies, and the "
                    f"durable tier cannot be listed: {pick['down']}"
                )
            raise errors.NotFoundError(
                f"no {what} survives on the fast tier ({self.roots[comm.rank]}), its peer "
                f"copies, nor {self.store.url}"
            )
        text = b""
        holder = pick["holder"]
        if holder is None:
            text = self.store.get(fmt.manifest_key(s))
        else:
            if comm.rank == holder:
                if str(s) in mine["own"]:
                    text = fast.get(fmt.manifest_key(s))
                else:
                    q = next(q for q, c in mine["copies"].items() if str(s) in c)
                    text = copy_record(fast, int(q), s)["manifest"].encode()
            texts = comm.gather(text.decode() if comm.rank == holder else None, root=0)
            text = comm.bcast(None if texts is None else texts[holder], root=0).encode()
        manifest = mf.parse_manifest(text, expect_step=s)
        with self._fast_view(bool(pick["durable"])) as view:
            planned = CheckpointReader(view, s, manifest).plan_state(select, into=into)
            needed = planned.keys
            prefix = fmt.step_dir(s) + "/"
            present = {k[len(prefix) :] for k in fast.list(prefix)}
            missing = sorted(needed - present)
            wants = comm.gather(missing, root=0)
            plan: dict[str, Any] | None = None
            if wants is not None and reports is not None:
                plan = assign(
                    s,
                    wants,
                    [{int(x) for x in r["own"]} for r in reports],
                    [
                        {int(q): {int(x) for x in c} for q, c in r["copies"].items()}
                        for r in reports
                    ],
                    bool(pick["durable"]),
                    manifest.objects,
                    bad,
                    [self.ring.where(r)[0] for r in range(comm.size)] if self.ring else None,
                )
            plan = comm.bcast(plan, root=0)
            t1 = time.perf_counter()
            spent["plan"] += t1 - t0
            if plan is None:  # some object survives nowhere after all: an older step
                skip.add(s)
                continue
            outcome: dict[str, Any] = {"error": "", "seconds": 0.0}
            failed, received, senders, error = _transfer(
                self, s, manifest, text, plan, planned, outcome
            )
        fails = comm.gather(failed, root=0)
        fails = comm.bcast(None if fails is None else [f for g in fails for f in g], root=0)
        t2 = time.perf_counter()
        spent["transfer"] += t2 - t1
        spent["read"] += outcome["seconds"]
        read_error = [outcome["error"]] if outcome["error"] else []
        if fails:
            log.warning(
                "restoring step %d: peer copies failed their checks (%s); planning again "
                "without them",
                s,
                error or "on other ranks",
            )
            bad.update((s, int(h), int(q)) for h, q in fails)
            continue
        used: list[str] = []
        state: Any = None
        if not read_error:
            state = planned.finish()
            used.append("the fast tier")
        else:
            log.warning("step %d cannot be read from %s", s, read_error[0])
            if pick["durable"]:  # the whole step from the durable tier, as a plain restore
                t3 = time.perf_counter()
                state, err = self._read(s, False, True, select, into, used)
                spent["read"] += time.perf_counter() - t3
                read_error = [err] if err else []
        errs = comm.gather(read_error[0] if read_error else "", root=0)
        failed_reads = comm.bcast(None if errs is None else [e for e in errs if e], root=0)
        if failed_reads:
            log.warning(
                "restoring step %d failed (%s); trying the next older one",
                s,
                "; ".join(failed_reads),
            )
            skip.add(s)
            unreadable.add(s)
            continue
        if step is None and not pick["down"]:
            _retire_newer(self, s, unreadable)
        # every rank holds it now (its fast root, or the durable tier): kept until a newer
        # step's copies are complete on every partner
        self._mark_replicated(s)
        self.last_restore = _record(self, s, manifest, plan, needed, present, received, used)
        self.last_restore.seconds = spent
        if self.ring is not None:  # what each sending node sent this rank
            for t in plan["transfers"]:
                if t["dst"] == comm.rank and t["src"] != comm.rank:
                    name = self.ring.nodes[self.ring.where(t["src"])[0]]
                    got = sum(manifest.objects[k] for k in t["keys"])
                    self.last_restore.from_nodes[name] = (
                        self.last_restore.from_nodes.get(name, 0) + got
                    )
        self.last_restore.sources = [
            f"rank {r} ({self.ring.nodes[self.ring.where(r)[0]]})" if self.ring else str(r)
            for r in sorted(set(senders))
        ]
        log.info("restored step %d: %s", s, self.last_restore.as_dict())
        if self.last_restore.path == "durable":
            log.warning(
                "step %d: rank %d restored from the durable tier (no peer copy of its "
                "data survived)",
                s,
                comm.rank,
            )
        return state
    raise errors.NotFoundError(f"restoring with peer copies failed {2 * RELISTS} times")


def _transfer(
    self: TieredCheckpointer,
    step: int,
    manifest: mf.Manifest,
    text: bytes,
    plan: Mapping[str, Any],
    planned: PlannedState,
    outcome: dict[str, Any],
) -> tuple[list[tuple[int, int]], int, list[int], str]:
    """:func:`~ckptio.checkpoint.peers.run_restore` of ``plan``: what this rank receives
    goes straight into the arrays of ``planned`` (and onto its fast root, not read back);
    the rest is read beside the transfers (its failure and time in ``outcome``)."""
    rank = self.comm.rank
    sinks = {
        k: planned.sink(k, f"rank {t['src']}")
        for t in plan["transfers"]
        if t["dst"] == rank and t["src"] != rank
        for k in t["keys"]
    }
    beside = partial(_read_beside, planned, sinks, self.fast.store.url, outcome)
    return run_restore(
        self.comm, self._peer_wire, self.fast.store, step, manifest, text, plan, sinks, beside
    )


def _read_beside(
    planned: PlannedState, skip: Iterable[str], where: str, outcome: dict[str, Any]
) -> None:
    """A peer restore's read of what this rank does not receive (beside the transfers): its
    failure (``outcome["error"]``) falls back to the durable tier or an older step, a
    caller's fault is raised."""
    t0 = time.perf_counter()
    try:
        planned.read(skip=skip)
    except CALLERS_FAULT:
        raise
    except Exception as err:
        outcome["error"] = f"the fast tier ({where}): {type(err).__name__}: {err}"
    outcome["seconds"] = time.perf_counter() - t0


def _retire_newer(self: TieredCheckpointer, step: int, unreadable: set[int]) -> None:
    """After restoring the newest step that survives (``step``): the newer steps on this
    rank's fast root that no rank can complete are retired as without peer copies
    (:meth:`~ckptio.checkpoint.tiered.TieredCheckpointer._retire_orphans`: ``unreadable``
    ones, whole but failed to read, kept), and the copies of them it holds go too."""
    self._retire_orphans(step, unreadable)
    drop_copies(self.fast.store, lambda s: s > step and s not in unreadable)


def _record(
    self: TieredCheckpointer,
    step: int,
    manifest: mf.Manifest,
    plan: Mapping[str, Any],
    needed: set[str],
    present: set[str],
    received: int,
    used: list[str],
) -> RestoreRecord:
    rank = self.comm.rank
    from_durable = set(plan["durable"].get(str(rank), []))
    incoming = [t for t in plan["transfers"] if t["dst"] == rank]
    sizes = manifest.objects
    nbytes = {
        "local": sum(sizes[k] for k in needed & present),
        "peer": received,
        "durable": sum(sizes[k] for k in from_durable),
    }
    if from_durable or used[-1:] == ["the durable tier"]:
        path = "durable"
    elif manifest.world_size == self.comm.size:
        path = "peer" if any(t["source"] == rank for t in incoming) else "local"
    else:
        path = "peer" if incoming else "local"
    return RestoreRecord(step, path, nbytes)


def pick_step(
    reports: Sequence[Mapping[str, Any]],
    durable: set[int],
    step: int | None,
    skip: set[int],
    down: str,
) -> dict[str, Any]:
    """Rank 0 of a restore with peer copies: the newest step (or ``step``) whose every source
    rank's objects survive on a fast root, in a copy or on the durable tier; the rank whose
    manifest of it is sent to all (None: read it from the durable tier)."""
    size = len(reports)
    worlds: dict[int, int] = {}
    for r in reports:
        worlds.update({int(s): w for s, w in r["own"].items()})
        for c in r["copies"].values():
            worlds.update({int(s): w for s, w in c.items()})
    candidates = sorted(set(worlds) | durable, reverse=True)
    for s in candidates:
        if s in skip or (step is not None and s != step):
            continue
        holder = next(
            (
                h
                for h, r in enumerate(reports)
                if str(s) in r["own"] or any(str(s) in c for c in r["copies"].values())
            ),
            None,
        )
        if s in durable:
            return {"step": s, "holder": holder, "durable": True, "down": down}
        survives = all(
            (q < size and str(s) in reports[q]["own"])
            or any(str(s) in r["copies"].get(str(q), {}) for r in reports)
            for q in range(worlds[s])
        )
        if survives:
            return {"step": s, "holder": holder, "durable": False, "down": down}
    return {"step": None, "down": down}


def durable_listing(listing: Future[list[int]], url: str) -> tuple[list[int], str]:
    """The durable tier's committed steps, or ``([], why)`` when it cannot be listed (an S3
    endpoint down, say): a restore then takes what the fast tier holds, with a warning."""
    try:
        return listing.result(), ""
    except CALLERS_FAULT:
        raise
    except Exception as err:
        why = f"{url}: {type(err).__name__}: {err}"
        log.warning("the durable tier cannot be listed (%s); restoring from the fast tier", why)
        return [], why
