"""The collective save: plan, write, gather, commit; every rank calls :func:`save_collective`.

1. Plan (rank 0): who writes each tensor (a replicated one once, by the lowest rank holding
   it; every holder its box of a sharded one); refuses ranks that disagree about a tensor and
   a step already committed; publishes the save's lease (:mod:`ckptio.lease`) before any
   rank writes, so gc and retention leave the step alone.
2. Write: each rank its share (:mod:`ckptio.checkpoint.write`, or a forked child).
3. Commit (rank 0, :func:`commit_step`): build the manifest and validate it exactly as a reader
   will, publish it create-if-absent, then list the step once (:func:`publish_manifest`): a gc's
   fence there, or an object the manifest names missing, and the manifest is withdrawn and the
   save fails. The manifest is the commit point: before it nothing of the step is visible, and
   a save that returns OK has a manifest whose every object was there after it was published,
   with no gc able to delete them since (see :mod:`ckptio.lease`).

Any failure, on any rank, is broadcast so every rank raises
:class:`~ckptio.errors.SaveFailedError`; nothing stays published and the attempt's data is
discarded (what a discard misses, ``ckptio gc`` removes)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.checkpoint.snapshot import LocalTensor, PreparedState
from ckptio.checkpoint.write import (
    PARALLEL_OBJECTS,
    RankWriter,
    SavePlan,
    WriteOptions,
    error_text,
)
from ckptio.dist import Communicator
from ckptio.forked import ForkedWriter
from ckptio.lease import SaveLease, is_fence_key
from ckptio.store import Store

log = logging.getLogger(__name__)

__all__ = [
    "SaveResult",
    "build_manifest",
    "commit_step",
    "discard_objects",
    "lease_new_step",
    "publish_manifest",
    "write_share",
]


def lease_new_step(store: Store, step: int) -> SaveLease:
    """A live :class:`~ckptio.lease.SaveLease` on ``step``, which must not be committed yet
    (:class:`~ckptio.errors.AlreadyExistsError` otherwise, the lease released). The question
    is asked while the lease is published: on an object store each is a round trip, and the
    save waits for both before its first byte."""
    mkey = fmt.manifest_key(step)
    with ThreadPoolExecutor(1, thread_name_prefix="ckptio-exists") as ex:
        there = ex.submit(store.exists, mkey)
        lease = SaveLease(store, step).acquire()
        try:
            committed = there.result()
        except BaseException:
            lease.release()
            raise
    if committed:
        lease.release()
        raise errors.AlreadyExistsError(
            f"{store.url}: step {step} already has a committed checkpoint ({mkey})"
        )
    return lease


@dataclass
class SaveResult:
    """What a finished save did (on this rank)."""

    step: int
    nbytes: int
    """Bytes of tensor data written by this rank."""
    seconds: float
    """Wall time of the write and commit on this rank."""
    committed_bytes: int = 0
    """Bytes of the whole checkpoint (every rank), known on rank 0."""


def save_collective(
    store: Store,
    prepared: PreparedState,
    step: int,
    comm: Communicator,
    options: WriteOptions,
    *,
    forked: ForkedWriter | None = None,
) -> SaveResult:
    """Plan, write, gather, commit: every rank calls this; rank 0 publishes the manifest.
    With ``forked`` (file-per-shard only), that child process writes this rank's shards from
    its copy-on-write snapshot (see :mod:`ckptio.forked`); the caller ends it afterwards."""
    t0 = time.perf_counter()
    # 1. plan: rank 0 decides who writes what (replicated tensors once), refuses conflicts
    offer = {"error": error_text(prepared.error)} if prepared.error else {"metas": prepared.metas()}
    gathered = comm.gather(offer, root=0)
    doc: dict[str, Any] = {}
    lease: SaveLease | None = None
    refusal: BaseException | None = prepared.error  # chained to the error every rank raises
    try:
        if comm.rank == 0:
            assert gathered is not None
            try:
                refused = [
                    f"rank {r}: {o['error']}" for r, o in enumerate(gathered) if "error" in o
                ]
                if refused:
                    raise errors.SaveFailedError("; ".join(refused))
                writers = plan_writers([o["metas"] for o in gathered])
                # the lease is published before any rank writes: gc and retention leave the
                # step alone while it is live (see ckptio.lease)
                lease = lease_new_step(store, step)
                doc = SavePlan(step, lease.token, writers, options).doc()
            except errors.CkptioError as err:
                doc = {"ok": False, "error": error_text(err)}
                refusal = refusal or err
        doc = comm.bcast(doc, root=0)
        if not doc["ok"]:
            raise errors.SaveFailedError(
                f"save of step {step} refused, nothing committed: {doc['error']}"
            ) from refusal
        return _write_and_commit(
            store, SavePlan.of(doc, step, options), prepared, comm, lease, t0, forked
        )
    finally:
        if lease is not None:
            lease.release()


def _write_and_commit(
    store: Store,
    plan: SavePlan,
    prepared: PreparedState,
    comm: Communicator,
    lease: SaveLease | None,
    t0: float,
    forked: ForkedWriter | None,
) -> SaveResult:
    """Steps 2 and 3 of a save every rank has the ``plan`` of."""
    # 2. write this rank's shards
    mine, outcome, local_error = write_share(store, plan, prepared, comm, forked)
    # 3. gather, commit on rank 0
    results = comm.gather(outcome, root=0)
    verdict: dict[str, Any] = {}
    if comm.rank == 0:
        assert results is not None
        verdict = commit_step(store, plan, prepared, results, comm.size, lease=lease)
        if lease is not None:
            lease.release()  # before the other ranks return: the save is over when they do
    verdict = comm.bcast(verdict, root=0)
    if not verdict["ok"]:
        raise errors.SaveFailedError(
            f"save of step {plan.step} failed, nothing committed: {verdict['error']}"
        ) from local_error
    nbytes = sum(t.array.nbytes for t in mine)
    return SaveResult(plan.step, nbytes, time.perf_counter() - t0, verdict.get("nbytes", 0))


def write_share(
    store: Store,
    plan: SavePlan,
    prepared: PreparedState,
    comm: Communicator,
    forked: ForkedWriter | None = None,
) -> tuple[list[LocalTensor], dict[str, Any], BaseException | None]:
    """This rank's part of ``plan``: its tensors written (by ``forked``'s child, as shard
    objects, or by a :class:`~ckptio.checkpoint.write.RankWriter`). Returns the tensors it
    wrote, the outcome every rank gathers to rank 0 (``ok`` with what was written, or the
    error's text) and the error itself, raised after the verdict."""
    mine = plan.mine(prepared.tensors, comm.rank)
    try:
        if forked is not None:
            written = forked.run({"token": plan.token, "paths": [t.path for t in mine]})
        else:
            written = RankWriter(store, plan, comm.rank).write(
                comm, mine, parallel=PARALLEL_OBJECTS
            )
    except Exception as err:  # reported to every rank by the caller, then raised
        log.debug("rank %d failed writing step %d", comm.rank, plan.step, exc_info=True)
        return mine, {"ok": False, "error": error_text(err)}, err
    return mine, {"ok": True, **written}, None


def write_mine(
    store: Store,
    prepared: PreparedState,
    step: int,
    comm: Communicator,
    plan: Mapping[str, Any],
    *,
    layout: str,
    key_layout: str,
    chunk_size: int,
    max_object_size: int,
    forked: ForkedWriter | None,
) -> tuple[list[LocalTensor], dict[str, Any], BaseException | None]:
    """:func:`write_share` of a plan document (``token``, ``writers``) as the collectives
    carry it (the fast tier's save plans with its own checks)."""
    options = WriteOptions(layout, key_layout, chunk_size, max_object_size)
    return write_share(store, SavePlan.of(plan, step, options), prepared, comm, forked)


def plan_writers(gathered: Sequence[Mapping[str, list[Any]]]) -> dict[str, int]:
    """path -> writing rank (replicated: lowest rank that has it) or -1 (sharded: every
    holder writes its box). Raises if ranks disagree about a tensor."""
    writers: dict[str, int] = {}
    seen: dict[str, list[Any]] = {}
    for rank, metas in enumerate(gathered):
        for path, (dtype, gshape, _offs, _shape, replicated) in metas.items():
            if path in seen:
                d0, g0, rep0 = seen[path][0], seen[path][1], seen[path][4]
                if (d0, g0, rep0) != (dtype, gshape, replicated):
                    raise errors.InvalidArgumentError(
                        f"ranks disagree about tensor {path!r}: {d0}{g0}{' replicated' if rep0 else ' sharded'}"
                        f" vs {dtype}{gshape}{' replicated' if replicated else ' sharded'} on rank {rank}"
                    )
                continue
            seen[path] = [dtype, gshape, _offs, _shape, replicated]
            writers[path] = rank if replicated else -1
    return writers


def build_manifest(
    step: int,
    prepared: PreparedState,
    plan: SavePlan | Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    world_size: int,
    layout: str,
    key_layout: str,
) -> tuple[bytes, dict[str, int]]:
    """Rank 0: the manifest of a step whose data every rank reported written (``results``),
    validated exactly as a reader will validate it, and the objects it names."""
    objects: dict[str, int] = {}
    chunk_lists: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        objects.update(r["objects"])
        for path, cs in r["chunks"].items():
            chunk_lists.setdefault(path, []).extend(cs)
    metas = prepared.metas()
    tensors: dict[str, mf.TensorEntry] = {}
    for path in plan.writers if isinstance(plan, SavePlan) else plan["writers"]:
        meta = metas.get(path)
        if meta is None:
            raise errors.SaveFailedError(
                f"tensor {path!r} is held by another rank but not by rank 0; rank 0's state "
                "must name every tensor (its structure is the checkpoint's)"
            )
        tensors[path] = mf.TensorEntry(
            meta[0], tuple(meta[1]), mf.chunks_of(chunk_lists.get(path, []))
        )
    manifest = mf.Manifest(
        step=step,
        world_size=world_size,
        tensors=tensors,
        objects=objects,
        tree=prepared.tree,
        metadata=prepared.metadata,
        layout={"kind": layout, "key_layout": key_layout},
    )
    data = mf.encode_manifest(manifest)
    return data, objects


def commit_step(
    store: Store,
    plan: SavePlan,
    prepared: PreparedState,
    results: Sequence[Mapping[str, Any]],
    world_size: int,
    *,
    lease: SaveLease | None = None,
) -> dict[str, Any]:
    """Rank 0: publish the manifest of ``plan`` (``prepared`` describes its state: the
    tensors' dtypes and shapes, the tree, the metadata) whose data every rank reported written
    (:func:`publish_manifest`: withdrawn again if a gc fenced the step or an object is
    missing), or discard that data. ``lease`` (the save's) is held by the caller until the
    verdict; it is not consulted here: the check after publishing is what decides."""
    step = plan.step
    prefix = fmt.step_dir(step) + "/"
    written = [prefix + k for r in results if r.get("ok") for k in r["objects"]]
    failed = [(rank, r["error"]) for rank, r in enumerate(results) if not r.get("ok")]
    if failed:
        # a shared (N-1) object was created by rank 0 for every rank: find it by the token
        strays = _attempt_keys(store, prefix, plan.token)
        discard_objects(store, sorted(set(written) | set(strays)))
        return {"ok": False, "error": "; ".join(f"rank {rank}: {e}" for rank, e in failed)}
    try:
        o = plan.options
        data, objects = build_manifest(
            step, prepared, plan, results, world_size, o.layout, o.key_layout
        )
        publish_manifest(store, step, data, objects)
    except Exception as err:  # reported to every rank; the data is discarded
        log.debug("commit of step %d failed", step, exc_info=True)
        if isinstance(err, errors.AlreadyExistsError):
            # create-if-absent refused: another writer committed this step first; its
            # checkpoint stands, ours (objects named by our own token) is left for gc
            return {
                "ok": False,
                "error": f"another writer already committed step {step} ({error_text(err)})",
            }
        discard_objects(store, written)
        return {"ok": False, "error": error_text(err)}
    return {"ok": True, "nbytes": sum(objects.values())}


def publish_manifest(
    store: Store, step: int, data: bytes, objects: Iterable[str], *, overwrite: bool = False
) -> None:
    """The commit of ``step``: publish its manifest ``data`` (create-if-absent unless
    ``overwrite``), then list the step once; if a gc's fence is there or an object the
    manifest names (``objects``, keys relative to the step directory) is missing, withdraw
    (delete) the manifest and raise :class:`~ckptio.errors.SaveFailedError`.

    The listing comes *after* the publish, so a gc that fences the step after it finds the
    manifest and spares the data, and one that fenced it before is seen here (see
    :mod:`ckptio.lease`): a commit that returns names only objects no gc can take. It costs what
    a check before publishing cost (one LIST), no request and no fsync more. Every commit
    (saves, the DCP writer, tiered saves and drains, the runner) goes through here."""
    mkey = fmt.manifest_key(step)
    store.publish(mkey, data, overwrite=overwrite)
    if not store.capabilities.shared:
        return  # other processes' objects are not visible here (memory://), nor is a gc
    try:
        problem = _commit_problem(store, step, objects)
    except Exception as err:  # unknown: withdrawn as if lost (a save that fails is safe)
        problem = f"its step could not be listed after publishing ({error_text(err)})"
    if problem is None:
        return
    try:
        store.delete([mkey])
    except Exception as err:  # loud: a manifest naming a missing object stays behind
        log.error(
            "could not withdraw the manifest %s/%s (%s): loads skip that step as damaged, "
            "`ckptio gc` does not remove it; delete it by hand",
            store.url,
            mkey,
            err,
        )
    raise errors.SaveFailedError(f"step {step} {problem}; its manifest was withdrawn")


def _commit_problem(store: Store, step: int, objects: Iterable[str]) -> str | None:
    """Why the just-published manifest of ``step`` must be withdrawn (one listing of the
    step), or None."""
    prefix = fmt.step_dir(step) + "/"
    present = set(store.list(prefix))
    fences = sorted(k for k in present if is_fence_key(k))
    if fences:
        return f"was fenced by a gc ({fences[0]}) while it was saved (its lease had lapsed)"
    missing = sorted(k for k in objects if prefix + k not in present)
    if missing:
        return (
            f"lost {len(missing)} object(s) before its commit (deleted by another process?), "
            f"e.g. {prefix}{missing[0]}"
        )
    return None


def _attempt_keys(store: Store, prefix: str, token: str) -> list[str]:
    """Data objects of the save attempt with ``token`` under a step's ``prefix``."""
    try:
        return [k for k in store.list(prefix + "data/") if f"-{token}." in k.rsplit("/", 1)[-1]]
    except Exception as err:  # best effort, like discard_objects
        log.warning("could not list data of a failed save (%s); `ckptio gc` will remove it", err)
        return []


def discard_objects(store: Store, keys: Sequence[str]) -> None:
    try:
        store.delete(keys)
    except Exception as err:  # best effort: what remains is garbage that gc removes
        log.warning("could not delete data of a failed save (%s); `ckptio gc` will remove it", err)
