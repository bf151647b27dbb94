"""Peer copies of the fast tier: each rank's fast-tier step copied to the fast roots of ranks
on ``k`` other nodes, and a restore that takes a lost node's shards from those copies.

**Partners.** The job's nodes are ordered by the rank of their first process (a node's name
is ``$CKPTIO_NODE`` if set, else the host name); a rank on node ``n`` with local index ``l``
(its place among the ranks of its node) sends its copies to the rank of local index ``l`` on
nodes ``n+1 .. n+k`` (mod the node count; ``l`` mod that node's rank count where nodes hold
different counts). A partner is therefore always on another node, and a node's loss leaves
each of its ranks' copies on ``k`` other nodes. ``k`` must be below the node count.

**Transport.** Over the job's own process group (:mod:`ckptio.dist`): point-to-point messages
of MPI (mpi4py ``Isend``/``Irecv`` of bytes, no pickle; one message per piece of an object,
its kind in the tag; waited for by :func:`ckptio.dist.poll`, since Open MPI's blocking calls
spin a core, which on a busy node slows the very transfer waited for) or
torch.distributed (``send``/``recv`` of uint8 tensors, gloo). Local-process ranks (``run_local``) share one node and have no
point-to-point channel: replicas are refused there. Every rank runs the transfers of a round
in one global order, its sends in one thread and its receives in another: the lowest transfer
not yet done always has its sender and its receiver at it, so a round cannot deadlock.

**A copy** of source rank ``q``'s objects of step ``s`` lies at the partner's fast root under
``peers/rank-QQQQQ/step-SSSSSSSSSS/`` (outside ``step-*``: gc and the fast tier's retention
never see it) with the step's own object keys, and is complete only once its own small
manifest, ``peer-copy.json``, is published there: the job (the durable root's location), the
source rank and node, the step, the step's manifest and the size and CRC32C of every object.
The sender checks every chunk's CRC32C as it reads its fast root; the receiver checks each
object's CRC32C as the bytes arrive and publishes the copy's manifest only when all match.
Each partner keeps its newest ``keep_last_local`` copies of each source rank, and the copy of the
newest step every rank's round replicated (:func:`retain_copies`); the fast tier keeps that
step on its own root as well, so a loss of up to ``k`` nodes mid-round leaves it whole.

**Restore** (:func:`plan_restore`, :func:`run_restore`): every rank reports the steps on its
own fast root and the copies it holds (refusing, with a warning, a copy of another job or one
whose objects are not its source rank's); rank 0 picks the newest step whose every source
rank's objects survive somewhere (a fast root, a copy, or the durable tier) and, for each
rank, sends the objects its read needs that its fast root lacks from a rank that holds them
(its owner's fast root, else a copy, the replacement nodes spread over the surviving nodes:
:func:`ckptio.checkpoint.peer_plan.assign`), else from the durable tier. The
bytes are checked against the copy's CRC32C on both ends. As they arrive they go straight
into the restore's arrays (:class:`~ckptio.checkpoint.sink.ObjectSink`: a piece that falls
inside one chunk landing on contiguous bytes of an array is received there, others are
copied there; each chunk's CRC32C checked against the step's manifest as its last byte
passes, as every read checks it) and
onto the rank's own fast root, which is not read back; what the rank does not receive is
read beside the transfers. A copy that fails a check is excluded and the step is planned
again (the arrays are filled anew). What each rank's restore took is :class:`RestoreRecord`.

Why the received bytes are still written to the fast root, and before ``load`` returns:
the restored step must outlive a second node loss before the next round copies a newer one.
With ``k = 1`` the replaced node's shards are otherwise on one partner only, whose loss
would leave them on the durable tier at best (a step not yet drained: nowhere). A write in
the background after ``load`` returns would need the received bytes held past it (the
caller's arrays change once training resumes) and a second commit to track; written as the
bytes arrive, from the same buffers, it costs what the fast root's write takes beyond the
transfer, and the read-back (the other half of what the restore spent on the fast root) is
gone.

Written here rather than taken from a library: the copies are the fast tier's own objects
under its commit protocol and leases; the transfer is the job's communicator's point-to-point
primitives, nothing more.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.checkpoint.drain import copy_object, object_rank
from ckptio.checkpoint.snapshot import crc32c
from ckptio.dist import Communicator, MPICommunicator, poll
from ckptio.lease import SaveLease
from ckptio.store import Store, wait_all

log = logging.getLogger(__name__)

__all__ = [
    "COPY_DOC",
    "COPY_KIND",
    "NODE_ENV",
    "PEERS_PREFIX",
    "NodeRing",
    "PeerResult",
    "RestoreRecord",
    "copy_prefix",
    "drop_copies",
    "held_copies",
    "node_name",
    "replicate_step",
    "retain_copies",
    "wire",
]

NODE_ENV = "CKPTIO_NODE"
"""Environment variable naming this process's node (default: the host name)."""
PEERS_PREFIX = "peers/"
COPY_DOC = "peer-copy.json"
COPY_KIND = "ckptio-peer-copy"
_TAG = 4707


def node_name() -> str:
    return os.environ.get(NODE_ENV) or socket.gethostname()


def copy_prefix(source: int, step: int) -> str:
    return f"{PEERS_PREFIX}rank-{source:05d}/{fmt.step_dir(step)}/"


# -- partners --------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRing:
    """The job's ranks by node (see the module docstring)."""

    nodes: tuple[str, ...]
    ranks: tuple[tuple[int, ...], ...]
    """Per node, its ranks ascending."""

    @classmethod
    def of(cls, names: Sequence[str]) -> NodeRing:
        order: dict[str, list[int]] = {}
        for rank, name in enumerate(names):
            order.setdefault(name, []).append(rank)
        return cls(tuple(order), tuple(tuple(r) for r in order.values()))

    def where(self, rank: int) -> tuple[int, int]:
        for n, ranks in enumerate(self.ranks):
            if rank in ranks:
                return n, ranks.index(rank)
        raise errors.InvalidArgumentError(f"rank {rank} is on no node")

    def partner(self, rank: int, shift: int) -> int:
        n, local = self.where(rank)
        ranks = self.ranks[(n + shift) % len(self.nodes)]
        return ranks[local % len(ranks)]

    def check(self, k: int) -> None:
        if k >= len(self.nodes):
            raise errors.InvalidArgumentError(
                f"replicas={k}: a copy goes to each of {k} other nodes, and this job runs on "
                f"{len(self.nodes)} node(s) ({', '.join(self.nodes)}); use replicas <= "
                f"{len(self.nodes) - 1} (or set ${NODE_ENV} where ranks of one host stand for "
                "different nodes)"
            )


# -- transport -------------------------------------------------------------------------------


_DOC, _DATA = 0, 1
"""What a message is: a JSON document, or a piece of an object's bytes (one message each,
its kind in the MPI tag or the torch size header: no document announces a piece)."""

_Place = Callable[[int, int], "np.ndarray | None"]
"""Where a wire's ``recv`` puts the next message, given its kind and size: a writable
contiguous uint8 array of that size (a restore's array, received into in place), or None
for a new buffer."""


class _MPIWire:
    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self.MPI, self.comm = MPI, comm

    def send(self, dest: int, data: Any, kind: int = _DOC) -> None:
        poll(self.comm.Isend([data, self.MPI.BYTE], dest=dest, tag=_TAG + kind).Test)

    def recv(self, source: int, place: _Place | None = None) -> tuple[int, np.ndarray]:
        status = self.MPI.Status()
        # a matched probe: the message found is the one received (the next from ``source``)
        msg = poll(lambda: self.comm.Improbe(source=source, tag=self.MPI.ANY_TAG, status=status))
        kind, count = status.Get_tag() - _TAG, status.Get_count(self.MPI.BYTE)
        buf = place(kind, count) if place is not None else None
        if buf is None:
            buf = np.empty(count, dtype=np.uint8)
        poll(msg.Irecv([buf, self.MPI.BYTE]).Test)
        return kind, buf


class _TorchWire:
    def __init__(self, comm: Any) -> None:
        import torch

        self.torch, self.dist, self.group = torch, comm._dist, comm.group

    def send(self, dest: int, data: Any, kind: int = _DOC) -> None:
        t = self.torch
        view = np.frombuffer(data, dtype=np.uint8)
        self.dist.send(t.tensor([view.size, kind], dtype=t.int64), dest, group=self.group)
        if view.size:
            self.dist.send(t.from_numpy(view.copy()), dest, group=self.group)

    def recv(self, source: int, place: _Place | None = None) -> tuple[int, np.ndarray]:
        t = self.torch
        head = t.zeros(2, dtype=t.int64)
        self.dist.recv(head, source, group=self.group)
        kind, count = int(head[1].item()), int(head[0].item())
        into = place(kind, count) if place is not None else None
        buf = t.from_numpy(into) if into is not None else t.empty(count, dtype=t.uint8)
        if buf.numel():
            self.dist.recv(buf, source, group=self.group)
        return kind, buf.numpy()


def wire(comm: Communicator) -> Any:
    """Point-to-point bytes over ``comm`` (a dup of the job's: nothing mixes with it)."""
    if isinstance(comm, MPICommunicator):
        return _MPIWire(comm.comm)
    if type(comm).__name__ == "TorchCommunicator":
        return _TorchWire(comm)
    raise errors.InvalidArgumentError(
        f"replicas: peer copies travel over the job's MPI or torch.distributed process group; "
        f"{comm!r} has no point-to-point channel (ranks of one node need no peer copies)"
    )


def _send_doc(w: Any, dest: int, doc: Mapping[str, Any]) -> None:
    w.send(dest, json.dumps(doc, separators=(",", ":")).encode())


def _recv_doc(w: Any, source: int) -> dict[str, Any]:
    return _doc(source, *w.recv(source))


def _doc(source: int, kind: int, data: np.ndarray) -> dict[str, Any]:
    if kind != _DOC:
        raise errors.CkptioError(f"rank {source} sent object bytes where a document was due")
    return json.loads(data.tobytes())  # type: ignore[no-any-return]


class _WireWriter:
    """A writer (for :func:`~ckptio.checkpoint.drain.copy_object`) that streams an object's
    pieces to a peer, with its CRC32C at the end."""

    def __init__(self, w: Any, dest: int) -> None:
        self.w, self.dest, self.crc, self.nbytes = w, dest, 0, 0

    def write(self, data: Any) -> None:
        self.crc = crc32c(data, self.crc)
        self.nbytes += len(data)
        self.w.send(self.dest, data, _DATA)

    def close(self) -> None:
        _send_doc(self.w, self.dest, {"crc32c": self.crc})

    def abort(self) -> None:
        return None


def send_objects(
    w: Any,
    dest: int,
    store: Store,
    prefix: str,
    manifest: mf.Manifest,
    keys: Sequence[str],
    head: Mapping[str, Any],
    expect: Mapping[str, int] | None = None,
) -> tuple[int, str]:
    """Stream ``keys`` (objects of ``manifest``'s step, under ``prefix`` of ``store``) to
    ``dest``, every chunk's CRC32C checked as it is read (and each object's against
    ``expect``, a copy's record). A failure is sent on as ``{"error"}`` (the receiver keeps
    nothing); returns (bytes sent, the error or "")."""
    chunks = _chunks(manifest)
    _send_doc(w, dest, {**head, "objects": [[k, manifest.objects[k]] for k in keys]})
    sent = 0
    for key in keys:
        out = _WireWriter(w, dest)
        try:
            copy_object(
                store,
                store,
                prefix + key,
                manifest.objects[key],
                chunks.get(key, []),
                lambda: False,
                writer=_Deferred(out),
            )
            if expect is not None and out.crc != expect.get(key):
                raise errors.ChecksumError(
                    f"{store.url}/{prefix}{key}: CRC32C {out.crc:#010x}, the copy records "
                    f"{expect.get(key)}"
                )
        except (errors.CkptioError, OSError) as err:
            why = f"{type(err).__name__}: {err}"
            _send_doc(w, dest, {"error": why})
            return sent, why
        out.close()
        sent += out.nbytes
    _send_doc(w, dest, {"end": True})
    return sent, ""


class _Deferred:
    """The wire writer, whose ``close`` (the CRC trailer) the sender sends itself once the
    object's own checks have passed."""

    def __init__(self, out: _WireWriter) -> None:
        self.out = out

    def write(self, data: Any) -> None:
        self.out.write(data)

    def close(self) -> None:
        return None

    def abort(self) -> None:
        return None


def receive_objects(
    w: Any,
    source: int,
    store: Store,
    prefix: str,
    expect: Mapping[str, int] | None = None,
    sinks: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, tuple[int, int]], str]:
    """Receive a stream of :func:`send_objects` into ``store`` under ``prefix``, each object's
    CRC32C checked against the sender's (and ``expect``'s, when given). Returns (the stream's
    head, ``{key: (size, crc32c)}`` of the objects kept, the error or ""); on an error nothing
    of the stream is kept, but the stream is read to its end (the sender is not left
    blocked). ``sinks``: objects whose bytes also go, as they arrive, to a
    :class:`~ckptio.checkpoint.sink.ObjectSink` (a restore's arrays, each chunk's CRC32C
    checked against the manifest there); a sink's failure is the object's."""
    head = _recv_doc(w, source)
    kept: dict[str, tuple[int, int]] = {}
    error = ""
    for key, size in head["objects"]:
        writer = None
        sink = (sinks or {}).get(key)
        if not error:
            try:  # a file where the copy's directory goes, a full disk: the stream is still read
                writer = _open(store, prefix + key, size)
            except (errors.CkptioError, OSError) as err:
                error = f"writing {store.url}/{prefix}{key}: {type(err).__name__}: {err}"
        crc, got = 0, 0
        while True:
            # a piece that lands whole on contiguous bytes of the arrays is received there
            place = None if sink is None or writer is None else partial(_in_place, sink, got)
            kind, data = w.recv(source, place)
            if kind == _DATA:
                crc = crc32c(data, crc)
                if writer is not None:
                    writer.write(memoryview(data))
                if sink is not None and writer is not None:
                    try:
                        sink.write(got, data)
                    except (errors.CkptioError, OSError, MemoryError) as err:
                        writer.abort()
                        writer = None
                        error = error or f"{type(err).__name__}: {err}"
                got += len(data)
                continue
            doc = _doc(source, kind, data)
            if "error" in doc:
                error = error or f"rank {source}: {doc['error']}"
                if writer is not None:
                    writer.abort()
                _discard(store, [prefix + k for k in kept])
                return head, {}, error
            break
        if writer is None:
            continue
        want = doc["crc32c"]
        if got != size or crc != want or (expect is not None and crc != expect.get(key)):
            writer.abort()
            error = (
                f"{prefix}{key} from rank {source}: {got} bytes CRC32C {crc:#010x}, expected "
                f"{size} bytes CRC32C {want:#010x}"
            )
            continue
        try:
            if sink is not None:
                sink.close()
            writer.close()
        except (errors.CkptioError, OSError) as err:
            writer.abort()
            error = f"{store.url}/{prefix}{key}: {type(err).__name__}: {err}"
            continue
        kept[key] = (size, crc)
    end = _recv_doc(w, source)
    if "error" in end:
        error = error or f"rank {source}: {end['error']}"
    if error:
        _discard(store, [prefix + k for k in kept])
        return head, {}, error
    return head, kept, ""


def _in_place(sink: Any, pos: int, kind: int, count: int) -> np.ndarray | None:
    return sink.view(pos, count) if kind == _DATA else None


def _chunks(manifest: mf.Manifest) -> dict[str, list[mf.Chunk]]:
    """Each object's chunks, by offset."""
    out: dict[str, list[mf.Chunk]] = {}
    for entry in manifest.tensors.values():
        for c in entry.chunks:
            out.setdefault(c.key, []).append(c)
    return {k: sorted(v, key=lambda c: c.offset) for k, v in out.items()}


class _CrcWriter:
    """A store writer that also takes the CRC32C of what passes; committed by ``commit``
    once the caller's checks pass (``close`` from the copy is deferred)."""

    def __init__(self, writer: Any) -> None:
        self.writer, self.crc = writer, 0

    def write(self, data: Any) -> None:
        self.crc = crc32c(data, self.crc)
        self.writer.write(data)

    def close(self) -> None:
        return None

    def commit(self) -> None:
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


def _open(store: Store, key: str, size: int) -> Any:
    return store.open_writer(key, size_hint=size)


def _discard(store: Store, keys: Sequence[str]) -> None:
    try:
        store.delete(list(keys))
    except Exception as err:  # debris under peers/: listed again and replaced next time
        log.warning("could not remove %d object(s) of a failed peer copy: %s", len(keys), err)


def run_round(
    rank: int,
    transfers: Sequence[Mapping[str, Any]],
    send: Callable[[Mapping[str, Any]], Any],
    receive: Callable[[Mapping[str, Any]], Any],
) -> tuple[list[Any], list[Any]]:
    """Run this rank's part of ``transfers`` (``{"src", "dst", ...}``, in the one order every
    rank holds): its sends in a thread, its receives here. Returns (send results, receive
    results) in that order."""
    sent: list[Any] = []
    failure: list[BaseException] = []

    def sender() -> None:
        try:
            for t in transfers:
                if t["src"] == rank:
                    sent.append(send(t))
        except BaseException as err:
            failure.append(err)

    thread = threading.Thread(target=sender, name="ckptio-peer-send", daemon=True)
    thread.start()
    try:
        got = [receive(t) for t in transfers if t["dst"] == rank]
    finally:
        thread.join()
    if failure:
        raise failure[0]
    return sent, got


# -- replication -----------------------------------------------------------------------------


@dataclass
class PeerResult:
    """What one step's peer replication did, on this rank."""

    step: int
    status: str
    """``replicated`` (every rank's copies committed on all their partners) or ``failed``."""
    nbytes: int = 0
    """Bytes this rank sent."""
    seconds: float = 0.0
    error: str = ""


def replicate_step(
    comm: Communicator,
    w: Any,
    ring: NodeRing,
    k: int,
    store: Store,
    step: int,
    job: str,
    keep: int | None,
    safe: int | None = None,
) -> PeerResult:
    """Collective (on ``comm``, a dup of the job's): copy every rank's objects of the committed
    ``step`` on its fast root ``store`` to its ``k`` partners (see the module docstring).
    ``keep``: the copies each source rank keeps on a partner (:func:`retain_copies`); ``safe``:
    the newest step whose round this rank saw replicated by every rank (kept whatever the
    count); once this round is, the copies are retained again with ``step`` as the safe one."""
    t0 = time.perf_counter()
    rank = comm.rank
    transfers = [
        {"src": r, "dst": ring.partner(r, j)} for j in range(1, k + 1) for r in range(comm.size)
    ]
    lease = SaveLease(store, step).acquire()  # gc elsewhere leaves the step being read alone
    try:
        text = store.get(fmt.manifest_key(step))
        manifest = mf.parse_manifest(text, expect_step=step)
        mine = sorted(k for k in manifest.objects if object_rank(k) == rank)
        head = {
            "kind": COPY_KIND,
            "job": job,
            "step": step,
            "source_rank": rank,
            "source_node": node_name(),
            "manifest": text.decode(),
        }

        def send(t: Mapping[str, Any]) -> tuple[int, str]:
            return send_objects(w, t["dst"], store, fmt.step_dir(step) + "/", manifest, mine, head)

        def receive(t: Mapping[str, Any]) -> str:
            return _receive_copy(w, t["src"], rank, store, step, job, keep, safe)

        sent, got = run_round(rank, transfers, send, receive)
    finally:
        lease.release()
    mine_errors = [e for _, e in sent if e] + [e for e in got if e]
    outcomes = comm.gather("; ".join(mine_errors), root=0)
    verdict = comm.bcast(None if outcomes is None else [e for e in outcomes if e], root=0)
    if not verdict and keep is not None:
        retain_copies(store, keep, step)
    return PeerResult(
        step,
        "failed" if verdict else "replicated",
        sum(n for n, _ in sent),
        time.perf_counter() - t0,
        "; ".join(verdict),
    )


def _receive_copy(
    w: Any,
    source: int,
    rank: int,
    store: Store,
    step: int,
    job: str,
    keep: int | None,
    safe: int | None,
) -> str:
    prefix = copy_prefix(source, step)
    doc_key = prefix + COPY_DOC
    try:
        if store.exists(doc_key):  # an older copy of this step (a rerun): incomplete from now on
            store.delete([doc_key])
    except (errors.CkptioError, OSError) as err:  # the stream is read all the same
        log.warning("peer copy %s/%s cannot be looked at: %s", store.url, doc_key, err)
    head, kept, error = receive_objects(w, source, store, prefix)
    if error:
        return f"copy of rank {source}'s step {step} on rank {rank}: {error}"
    if head.get("job") != job or head.get("source_rank") != source or head.get("step") != step:
        _discard(store, [prefix + k for k in kept])
        return f"rank {source} sent a copy that is not its own step {step} of this job"
    manifest = mf.parse_manifest(head["manifest"].encode(), expect_step=step)
    doc = {
        "kind": COPY_KIND,
        "job": job,
        "step": step,
        "source_rank": source,
        "source_node": head.get("source_node", ""),
        "world_size": manifest.world_size,
        "manifest": head["manifest"],
        "objects": {k: {"size": s, "crc32c": c} for k, (s, c) in kept.items()},
    }
    store.publish(doc_key, json.dumps(doc, separators=(",", ":")).encode())
    if keep is not None:
        retain_copies(store, keep, safe, source)
    return ""


def retain_copies(store: Store, keep: int, safe: int | None, source: int | None = None) -> None:
    """Retention of the copies on this fast root (of ``source``, else of every source rank):
    the newest ``keep`` complete copies of each source rank stay, and so does its copy of
    ``safe``, the newest step whose round this rank saw replicated by every rank; older ones
    go (their record first, so a half-removed copy is never taken for complete), and so do
    incomplete copies older than the newest complete one (failed or interrupted rounds).

    Why ``safe`` and not the count alone: a partner sees the copies it holds, not whether
    the other ranks' copies of a step are complete. Copies of a newer step can be complete
    here for one source rank and not yet (or never: a failed round) for another; had the
    count retired the older step, the node's loss would leave no step whose every rank's
    data survives on the peers. Which step is complete for every rank is the job's
    agreement (the verdict each round ends with), known to every rank alike."""
    if source is None:
        sources = {
            int(part.removeprefix("rank-"))
            for key in store.list(PEERS_PREFIX)
            if (part := key[len(PEERS_PREFIX) :].partition("/")[0]).startswith("rank-")
            and part.removeprefix("rank-").isdigit()
        }
        for q in sorted(sources):
            retain_copies(store, keep, safe, q)
        return
    base = f"{PEERS_PREFIX}rank-{source:05d}/"
    keys = store.list(base)
    steps = sorted(
        {s for k in keys if (s := fmt.parse_step_dir(k[len(base) :].partition("/")[0])) is not None}
    )
    complete = [s for s in steps if f"{base}{fmt.step_dir(s)}/{COPY_DOC}" in keys]
    doomed = [s for s in (complete[:-keep] if keep else complete) if s != safe]
    newest = complete[-1] if complete else None
    doomed += [s for s in steps if s not in complete and newest is not None and s < newest]
    for s in sorted(set(doomed)):
        p = f"{base}{fmt.step_dir(s)}/"
        _discard(store, [p + COPY_DOC])
        _discard(store, [k for k in keys if k.startswith(p) and not k.endswith(COPY_DOC)])


def drop_copies(store: Store, which: Callable[[int], bool]) -> None:
    """Remove the copies of the steps ``which`` picks on this fast root (record first)."""
    keys = store.list(PEERS_PREFIX)
    doomed: dict[str, list[str]] = {}
    for key in keys:
        parts = key[len(PEERS_PREFIX) :].split("/")
        s = fmt.parse_step_dir(parts[1]) if len(parts) > 2 else None
        if s is not None and which(s):
            doomed.setdefault(f"{PEERS_PREFIX}{parts[0]}/{parts[1]}/", []).append(key)
    for prefix, ks in sorted(doomed.items()):
        _discard(store, [prefix + COPY_DOC])
        _discard(store, [k for k in ks if not k.endswith(COPY_DOC)])


# -- restore ---------------------------------------------------------------------------------


def held_copies(store: Store, job: str) -> dict[int, dict[int, int]]:
    """The complete copies on this fast root: ``{source rank: {step: world size}}``. A copy
    of another job, or whose objects are not its source rank's, is refused with a warning."""
    out: dict[int, dict[int, int]] = {}
    keys = set(store.list(PEERS_PREFIX))
    for key in sorted(keys):
        if not key.endswith("/" + COPY_DOC):
            continue
        parts = key[len(PEERS_PREFIX) :].split("/")
        try:
            source = int(parts[0].removeprefix("rank-"))
            step = fmt.parse_step_dir(parts[1])
            doc = json.loads(store.get(key))
        except (ValueError, IndexError, OSError, errors.CkptioError) as err:
            log.warning("peer copy %s/%s cannot be read (%s): skipped", store.url, key, err)
            continue
        why = _refusal(doc, job, source, step)
        if why:
            log.warning("peer copy %s/%s refused: %s", store.url, key, why)
            continue
        prefix = copy_prefix(source, step or 0)
        if not all(prefix + k in keys for k in doc["objects"]):
            log.warning("peer copy %s/%s lacks objects it records: skipped", store.url, key)
            continue
        out.setdefault(source, {})[int(doc["step"])] = int(doc["world_size"])
    return out


def _refusal(doc: Any, job: str, source: int, step: int | None) -> str:
    if not isinstance(doc, dict) or doc.get("kind") != COPY_KIND:
        return "not a peer copy's record"
    if doc.get("job") != job:
        return f"it is a copy of the job whose durable root is {doc.get('job')!r}, not {job!r}"
    if doc.get("source_rank") != source or doc.get("step") != step:
        return "its record names another rank or step than its place"
    objects = doc.get("objects")
    if not isinstance(objects, dict) or any(object_rank(k) != source for k in objects):
        return f"it holds objects that are not rank {source}'s"
    return ""


def copy_record(store: Store, source: int, step: int) -> dict[str, Any]:
    return json.loads(store.get(copy_prefix(source, step) + COPY_DOC))  # type: ignore[no-any-return]


@dataclass
class RestoreRecord:
    """Where one rank's restore read its data from."""

    step: int
    path: str
    """``local`` (this rank's own fast root), ``peer`` (a copy on another node, or another
    rank's fast root, over the process group) or ``durable``: where this rank's own shard
    came from (resharded: the farthest any of its data came from)."""
    nbytes: dict[str, int] = field(default_factory=dict)
    """Bytes of the objects this rank read, by where they came from."""
    sources: list[str] = field(default_factory=list)
    """The ranks (and nodes) that sent this rank objects, as ``rank N (node)``."""
    from_nodes: dict[str, int] = field(default_factory=dict)
    """Bytes this rank received from each other node (by name), as the plan sent them."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Where this rank's restore spent its time: ``plan`` (what each rank holds, the step,
    the plan: listings and collectives) and ``transfer`` (the copies sent and received, into
    the arrays and onto the fast root, and the read of the rest beside them), each including
    the waits for the other ranks; ``read`` (within ``transfer``: the read of what this rank
    did not receive, from its fast root or the durable tier)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "path": self.path,
            "nbytes": self.nbytes,
            "sources": self.sources,
            "from_nodes": self.from_nodes,
            "seconds": self.seconds,
        }


def run_restore(
    comm: Communicator,
    w: Any,
    store: Store,
    step: int,
    manifest: mf.Manifest,
    text: bytes,
    plan: Mapping[str, Any],
    sinks: Mapping[str, Any] | None = None,
    beside: Callable[[], None] | None = None,
) -> tuple[list[tuple[int, int]], int, list[int], str]:
    """This rank's part of a restore's transfers (:func:`assign`'s plan): send what it holds,
    receive what it lacks onto its own fast root under ``step-*/`` (under a lease), each
    received object's bytes also into its ``sinks`` entry as they arrive (the restore's
    arrays: :class:`~ckptio.checkpoint.sink.ObjectSink`). ``beside`` (the read of what this
    rank does not receive, which records its own failure) runs in a thread once the copies on
    this rank's own root are made, beside the transfers. Returns (failed
    holdings as ``(holder, source rank)``, bytes received, the ranks that sent, the error or
    ""). The step's manifest (``text``) is published on the fast root once what this rank
    received is there."""
    rank = comm.rank
    transfers = plan["transfers"]
    lease = SaveLease(store, step).acquire()
    failed: list[tuple[int, int]] = []
    got = 0
    senders: list[int] = []
    try:

        def send(t: Mapping[str, Any]) -> tuple[int, str]:
            if t["kind"] == "own":
                prefix, expect = fmt.step_dir(step) + "/", None
            else:
                prefix = copy_prefix(t["source"], step)
                rec = copy_record(store, t["source"], step)
                expect = {k: v["crc32c"] for k, v in rec["objects"].items()}
            return send_objects(w, t["dst"], store, prefix, manifest, t["keys"], {}, expect)

        def receive(t: Mapping[str, Any]) -> str:
            _, kept, error = receive_objects(
                w, t["src"], store, fmt.step_dir(step) + "/", sinks=sinks
            )
            if error:
                failed.append((t["src"], t["source"]))
                return error
            nonlocal got
            got += sum(s for s, _ in kept.values())
            senders.append(t["src"])
            return ""

        def copy_here(t: Mapping[str, Any]) -> str:
            rec = copy_record(store, t["source"], step)
            src, dst = copy_prefix(t["source"], step), fmt.step_dir(step) + "/"
            chunks = _chunks(manifest)
            for key in t["keys"]:
                out = _CrcWriter(store.open_writer(dst + key, size_hint=manifest.objects[key]))
                try:
                    copy_object(
                        store,
                        store,
                        src + key,
                        manifest.objects[key],
                        chunks.get(key, []),
                        lambda: False,
                        writer=out,
                    )
                    if out.crc != rec["objects"][key]["crc32c"]:
                        raise errors.ChecksumError(
                            f"{store.url}/{src}{key}: CRC32C {out.crc:#010x}, the copy records "
                            f"{rec['objects'][key]['crc32c']:#010x}"
                        )
                except (errors.CkptioError, OSError) as err:
                    out.abort()
                    failed.append((rank, t["source"]))
                    return f"rank {rank}: {type(err).__name__}: {err}"
                out.commit()
                nonlocal got
                got += manifest.objects[key]
            return ""

        here = [t for t in transfers if t["src"] == t["dst"] == rank]
        errs = [copy_here(t) for t in here]
        with ThreadPoolExecutor(1, thread_name_prefix="ckptio-restore-read") as ex:
            read = ex.submit(beside) if beside is not None else None
            try:
                _, got_errs = run_round(
                    rank, [t for t in transfers if t["src"] != t["dst"]], send, receive
                )
            finally:
                if read is not None:
                    wait_all([read])
        errs += got_errs
        error = "; ".join(e for e in errs if e)
        if not error and (senders or here) and not store.exists(fmt.manifest_key(step)):
            store.publish(fmt.manifest_key(step), text, overwrite=False)
    finally:
        lease.release()
    return failed, got, senders, error
