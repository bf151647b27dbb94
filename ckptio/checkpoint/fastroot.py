"""The fast tier of a tiered checkpointer: its checkpointer (retention that keeps what drains
need; a save with a root per rank), and the claim that makes a fast root one job's (see
:mod:`ckptio.checkpoint.tiered`)."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint.checkpointer import StoreCheckpointer
from ckptio.checkpoint.commit import (
    SaveResult,
    build_manifest,
    discard_objects,
    plan_writers,
    publish_manifest,
    write_mine,
)
from ckptio.checkpoint.read import committed_steps
from ckptio.checkpoint.snapshot import PreparedState
from ckptio.checkpoint.write import error_text
from ckptio.dist import Communicator
from ckptio.forked import ForkedWriter
from ckptio.lease import SaveLease
from ckptio.redact import redact_url
from ckptio.store import Store

log = logging.getLogger(__name__)

__all__ = [
    "OWNER_KEY",
    "OWNER_KIND",
    "FastTier",
    "check_one_root_reaches_every_node",
    "claim_fast_root",
    "fast_roots",
    "save_own_roots",
]


class FastTier(StoreCheckpointer):
    """The fast tier's checkpointer: its retention also keeps what the drains need
    (``protected()``); with a root per rank (``per_rank``), each rank saves on its own root
    (:func:`save_own_roots`) and applies retention to it."""

    protected: Any = staticmethod(set)
    per_rank = False

    def _doomed(self, steps: Sequence[int], newest: int) -> list[int]:
        keep = self.protected()
        return [s for s in super()._doomed(steps, newest) if s not in keep]

    def _retains(self, comm: Communicator) -> bool:
        return self.per_rank or super()._retains(comm)

    def _commit(
        self, prepared: PreparedState, step: int, comm: Communicator, forked: ForkedWriter | None
    ) -> SaveResult:
        if not self.per_rank:
            return super()._commit(prepared, step, comm, forked)
        return save_own_roots(self, prepared, step, comm, forked)


def save_own_roots(
    ck: StoreCheckpointer,
    prepared: PreparedState,
    step: int,
    comm: Communicator,
    forked: ForkedWriter | None,
) -> SaveResult:
    """A save with a fast root per rank: rank 0 plans as usual; each rank publishes its lease
    on its own root, writes its shards there, and checks them listed; the manifest, built by
    rank 0, is committed on every rank's root (:func:`publish_manifest`); if any rank's commit
    fails, every rank withdraws its manifest and discards its data."""
    t0 = time.perf_counter()
    store, mkey = ck.store, fmt.manifest_key(step)
    offer = (
        {"error": error_text(prepared.error)}
        if prepared.error
        else {"metas": prepared.metas(), "exists": store.exists(mkey)}
    )
    gathered = comm.gather(offer, root=0)
    plan: dict[str, Any] = {}
    if gathered is not None:
        try:
            refused = [f"rank {r}: {o['error']}" for r, o in enumerate(gathered) if "error" in o]
            if refused:
                raise errors.SaveFailedError("; ".join(refused))
            there = [r for r, o in enumerate(gathered) if o["exists"]]
            if there:
                raise errors.AlreadyExistsError(
                    f"step {step} is already committed on the fast root of rank(s) {there}"
                )
            plan = {
                "ok": True,
                "token": secrets.token_hex(4),
                "writers": plan_writers([o["metas"] for o in gathered]),
            }
        except errors.CkptioError as err:
            plan = {"ok": False, "error": error_text(err)}
    plan = comm.bcast(plan, root=0)
    if not plan["ok"]:
        raise errors.SaveFailedError(
            f"save of step {step} refused, nothing committed: {plan['error']}"
        ) from prepared.error
    lease = SaveLease(store, step, plan["token"])
    mine: list[Any] = []
    written: dict[str, Any] = {"objects": {}, "chunks": {}}
    local_error: BaseException | None = None
    try:
        try:
            lease.acquire()  # before any data: gc and retention leave the step alone
        except Exception as err:
            local_error = err
            outcome: dict[str, Any] = {"ok": False, "error": error_text(err)}
        else:
            mine, outcome, local_error = write_mine(
                store,
                prepared,
                step,
                comm,
                plan,
                layout="file-per-shard",
                key_layout=ck.key_layout,
                chunk_size=ck.chunk_size,
                max_object_size=ck.max_object_size,
                forked=forked,
            )
            if outcome["ok"]:
                written = outcome
        results = comm.gather(outcome, root=0)
        doc: dict[str, Any] = {}
        if results is not None:
            failed = [f"rank {r}: {o['error']}" for r, o in enumerate(results) if not o["ok"]]
            try:
                if failed:
                    raise errors.SaveFailedError("; ".join(failed))
                data, objects = build_manifest(
                    step, prepared, plan, results, comm.size, ck.layout, ck.key_layout
                )
                doc = {"ok": True, "manifest": data.decode(), "nbytes": sum(objects.values())}
            except Exception as err:
                doc = {"ok": False, "error": error_text(err)}
        doc = comm.bcast(doc, root=0)
        # each rank commits on its own root (publish, then list: withdrawn if fenced or an
        # object is missing); if any rank could not, every rank withdraws its manifest
        committed: dict[str, Any] = {"ok": True}
        if doc["ok"]:
            try:
                publish_manifest(store, step, doc["manifest"].encode(), written["objects"])
            except Exception as err:
                local_error = local_error or err
                committed = {"ok": False, "error": f"rank {comm.rank}: {error_text(err)}"}
        checks = comm.gather(committed, root=0)
        verdict = doc
        if checks is not None and doc["ok"]:
            bad = [c["error"] for c in checks if not c["ok"]]
            verdict = {"ok": False, "error": "; ".join(bad)} if bad else doc
        verdict = comm.bcast({k: v for k, v in verdict.items() if k != "manifest"}, root=0)
        prefix = fmt.step_dir(step) + "/"
        if not verdict["ok"]:
            if doc["ok"] and committed["ok"]:
                discard_objects(store, [mkey])  # this rank's commit, withdrawn with the others
            discard_objects(store, [prefix + k for k in written["objects"]])
            raise errors.SaveFailedError(
                f"save of step {step} failed, nothing committed: {verdict['error']}"
            ) from local_error
    finally:
        lease.release()
    return SaveResult(
        step, sum(t.array.nbytes for t in mine), time.perf_counter() - t0, doc.get("nbytes", 0)
    )


def fast_roots(local: Any, size: int) -> list[str]:
    """One fast-tier URL per rank from ``local`` (a URL, a URL with ``{rank}``, or a list)."""
    if isinstance(local, str):
        if "{rank}" in local:
            return [local.replace("{rank}", str(r)) for r in range(size)]
        return [local] * size
    if isinstance(local, Sequence) and all(isinstance(u, str) for u in local):
        if len(local) != size:
            raise errors.InvalidArgumentError(
                f"local: {len(local)} fast-tier roots for {size} ranks; give one per rank"
            )
        return list(local)
    raise errors.InvalidArgumentError(
        f"local: expected a URL, a URL with {{rank}}, or a list of one URL per rank; got {local!r}"
    )


OWNER_KEY = "fast-tier-owner.json"
"""The object at a fast root that names the durable root it serves (outside every step: gc
and retention, which look under ``step-*``, never touch it)."""
OWNER_KIND = "ckptio-fast-tier"
_MAX_OWNER_BYTES = 64 << 10


def claim_fast_root(store: Store, owner: str) -> str:
    """Make the fast root ``store`` this job's: ``""`` when its owner record names ``owner``
    (the durable root's :func:`~ckptio.registry.location`), or did not exist and now does
    (published create-if-absent, so of two jobs claiming a new root at once one wins); else
    why it is not. A root with steps but no record (an older ckptio's) is adopted, with a
    warning naming its steps."""
    for _ in range(3):
        try:
            size = store.size(OWNER_KEY)
            data = store.get(OWNER_KEY) if size <= _MAX_OWNER_BYTES else b""
        except errors.NotRegularFileError:
            raise
        except FileNotFoundError:
            steps = committed_steps(store)
            doc = {"kind": OWNER_KIND, "durable": owner}
            try:
                store.publish(OWNER_KEY, json.dumps(doc).encode(), overwrite=False)
            except errors.AlreadyExistsError:
                continue  # another job (or rank) claimed it meanwhile: read its record
            if steps:
                log.warning(
                    "the fast root %s holds steps %s with no owner record (an older ckptio's); "
                    "this job, whose durable root is %s, takes them as its own",
                    store.url,
                    steps,
                    owner,
                )
            return ""
        try:
            doc = json.loads(data)
            recorded = doc["durable"] if doc.get("kind") == OWNER_KIND else None
        except (ValueError, TypeError, KeyError, AttributeError):
            recorded = None
        if not isinstance(recorded, str):
            return (
                f"local: {store.url}/{OWNER_KEY} is not a fast tier's owner record; whose "
                "fast root this is cannot be told: give this job a fast root of its own"
            )
        if recorded != owner:
            return (
                f"local: the fast root {store.url} belongs to the job whose durable root is "
                f"{redact_url(recorded)}, not {redact_url(owner)}: a fast root serves one job "
                "(its steps, retention and drains are that job's); give each job its own (a "
                "directory per job on the node's disk)"
            )
        return ""
    return f"local: {store.url}/{OWNER_KEY} keeps changing; is another job claiming it?"


def check_one_root_reaches_every_node(store: Store, comm: Communicator) -> None:
    """Collective, where every rank was given one fast-tier root: when the ranks run on more
    than one host and name the same URL, check that it is one place for all of them (a shared
    filesystem), not a node-local path that names a different directory on each node (rank 0's
    commit would find the other nodes' objects missing). Rank 0 publishes a marker there and
    every rank looks for it; a rank that cannot see it raises
    :class:`~ckptio.errors.InvalidArgumentError` on every rank, naming the fix (``{rank}``)."""
    import socket

    given = comm.gather((socket.gethostname(), store.url), root=0)
    probe = None
    if given is not None and len({h for h, _ in given}) > 1 and len({u for _, u in given}) == 1:
        probe = f".ckptio-root-probe-{secrets.token_hex(6)}"
    probe = comm.bcast(probe, root=0)
    if probe is None:  # one node (one root), or each rank named a root of its own
        return
    if comm.rank == 0:
        store.publish(probe, b"1")
    comm.barrier()
    seen = comm.gather((socket.gethostname(), store.exists(probe)), root=0)
    comm.barrier()
    if comm.rank == 0:
        store.delete([probe])
    blind = comm.bcast(None if seen is None else sorted({h for h, ok in seen if not ok}), root=0)
    if blind:
        raise errors.InvalidArgumentError(
            f"local: {store.url} is node-local (a different directory on each node: "
            f"{', '.join(blind)} cannot see what rank 0 writes there), yet every rank was given "
            "it as one root; give each rank its own root with {rank} "
            f"({store.url.rstrip('/')}/{{rank}})"
        )
