"""The tiered workload: a plan's state saved through :class:`~ckptio.checkpoint.tiered.TieredCheckpointer`
on every rank, with its save, drain and restore timed.

Two ways in:

- ``ckptio run DURABLE --local FAST`` (:func:`run_tiered_workload`): real targets, e.g.
  ``s3://bucket/run`` drained from ``file:///nvme/run`` (``{rank}`` in ``FAST`` gives each
  rank its own fast root, as node-local disks are), on the ranks of the launcher or of
  ``--ranks``; ``--emulate`` / ``--emulate-local`` wrap either tier in the emulate backend.
- ``ckptio compare``'s tiered targets ``DURABLE+LOCAL`` (:func:`parse_tiered`,
  :func:`run_tiered`): ``DURABLE`` is a profile (``cloud-s3``, ``abci-lustre``, ...),
  emulated over ``memory://``; ``LOCAL`` is ``disk`` (a directory on this machine:
  **measured**) or a profile (``local-nvme``: the emulate backend over such a directory,
  **emulated**). One process writes every logical rank.

A tiered run has the runner's shape (:class:`TieredRun`, as :class:`ckptio.runner.phases.Run`:
``prepare``, per iteration ``save``, ``restore`` and ``cleanup``, then ``finish``), takes the
runner's :class:`~ckptio.runner.RunSettings` (plus :class:`Tiers`, the fast tier), bypasses
caches as it does (:mod:`ckptio.runner.coldreads`) and records through the same functions
(:mod:`ckptio.runner.records`), so both write one schema.

Each process holds its share of the plan (the logical ranks dealt to it, as the runner deals
them): a bf16 ``model`` and an fp32 ``optim`` tensor, each one box of a global flat tensor
(:class:`~ckptio.checkpoint.Shard`), of incompressible bytes (the runner's
:class:`~ckptio.runner.DataGenerator`), refilled every iteration. Training holds its state
in memory, and so does this workload: each process needs its share and a little more,
checked before anything is written (:func:`check_tiered`). The restores read into the same
arrays (cleared first), and each is checked against the stream generated again.

Each iteration times four phases, recorded in the phases table under these names (per rank;
the runs table takes the slowest rank):

- ``save``: what ``save`` blocked the caller for (the fast tier's commit): the stall;
- ``drain``: the drain's own time, from its first copy to the durable tier's commit;
- ``restore``: a fresh Checkpointer's ``load`` of the newest step into the state's arrays,
  each rank reading its own box from its fast root (the page cache of those objects
  bypassed first as ``cache`` says, as the runner does);
- ``restore-durable``: the same load with an empty fast root (a replaced node): from the
  durable tier.

With peer copies (``ckptio run --local ... --replicas K``, on ranks of at least two nodes:
:mod:`ckptio.checkpoint.peers`), two more:

- ``replicate``: the step's peer copies, each rank's to its ``K`` partners on other nodes,
  from the round's start to its commit (in the background, beside the drain);
- ``restore-peer``: ``--lose N`` nodes lost at once (default 1), then the same load on
  every rank. The loss is **emulated**: the ranks of the last ``N`` nodes in the job's node
  order (neighbours on the ring: the worst placement, where the first one's copies are on
  the others) remove everything their fast roots hold (their steps and the copies they kept
  for others), as a replaced node's empty disk; the nodes are not killed and their processes
  go on (a real node loss, its processes killed, is tested in
  ``tests/test_cluster_peers.py``). Those ranks restore from the copies on the surviving
  partners (what no copy holds, ``N`` above ``K``, from the durable tier), the others from
  their own fast roots (cold as ``cache`` says; the copies a partner sends are read through
  its page cache). Every restore row records where the rank's data came from
  (``restore_path``: ``local``, ``peer`` or ``durable``) and the bytes taken from peers and
  from the durable tier (with ``--replicas``, for each of the three restores); a
  ``restore-peer`` row also names the rank's node, the nodes lost and the bytes each other
  node sent it (``node``, ``lost_nodes``, ``peer_sources``), from which
  :func:`ckptio.calibration.fit_peer_link` takes the fan-in that happened.

The runs table gets one row per iteration in the ordinary schema (the runner's own rows):
``write_seconds`` is the stall, ``read_seconds`` the fast-tier restore, ``kind`` is ``tiered``. Requests carry the phase they belong to (``save``,
``drain`` (the durable tier's side), ``drain-read`` (the fast tier's side of the drain),
``restore``, ``restore-durable``; with peer copies ``replicate`` for the copies' own objects
(the reads of the step sent to partners stay with ``drain-read``) and ``restore-peer``). The
sidecar's ``tiers`` entry says what each tier was and whether it was measured or emulated
(:func:`tier_kinds` reads it); its ``peers`` entry, with ``--replicas``, the copies and the
node whose loss was emulated.

``keep`` works as the runner's: this run's older steps are removed from both tiers (manifest
first), never the steps of another run in the same roots.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint import Shard, delete_step
from ckptio.checkpoint.peers import PEERS_PREFIX, drop_copies
from ckptio.dist import Communicator
from ckptio.redact import redact, redact_url
from ckptio.registry import client_versions, emulation_url, open_store
from ckptio.runner import RunSettings, RunSummary, first_run_step
from ckptio.runner.coldreads import check_cache, start_cold_reads
from ckptio.runner.records import (
    HOST,
    events_columns,
    gb_per_s,
    hosts_of,
    merge_columns,
    peak_rss,
    phase_row,
    request_table,
    run_rows,
    target_label,
)
from ckptio.runner.settings import writer_ranks
from ckptio.runner.synthetic import DataGenerator
from ckptio.store import Store
from ckptio.units import MAX_PEERS

log = logging.getLogger(__name__)

#: The fast tier that is this machine's own disk (measured).
DISK = "disk"
#: Phases of a tiered run, in the order they run.
PHASES = ("save", "drain", "restore", "restore-durable")
#: The phases a tiered run with peer copies adds.
PEER_PHASES = ("replicate", "restore-peer")
#: How ``restore-peer`` loses a node, in words (results, console).
LOSS_NOTE = (
    "node loss emulated: the ranks of the lost node(s) (--lose, neighbours on the ring) removed "
    "everything on their fast roots (their steps and the copies they held) before the restore; "
    "the nodes were not killed"
)
_WRITE_OPS = ("write", "put", "create", "commit", "fsync", "rename")
#: Share of the memory available that a tiered run's processes on one node may hold.
MEMORY_SHARE = 0.8


__all__ = [
    "LOSS_NOTE",
    "PEER_NOTE",
    "PEER_PHASES",
    "TieredRun",
    "TieredSpec",
    "Tiers",
    "check_tiered",
    "parse_tiered",
    "peer_suffix",
    "ran_peers_note",
    "run_tiered",
    "run_tiered_workload",
    "tier_kinds",
]


@dataclass(frozen=True)
class TieredSpec:
    """A tiered target: a durable profile (emulated) and a fast tier (``disk`` or a profile)."""

    durable: str
    local: str
    peers: int = 0
    """Peer copies the full-scale projection gives each node's fast tier (``+peer``,
    ``+peerK``); the run itself has no peer node (one process): the same phases are run."""

    @property
    def name(self) -> str:
        return f"{self.durable}+{self.local}{peer_suffix(self.peers)}"

    @property
    def local_measured(self) -> bool:
        return self.local == DISK

    @property
    def note(self) -> str:
        """What each part is, in words (tables and plot labels)."""
        return tiers_note(self.durable, False, self.local, self.local_measured) + (
            f"; {PEER_NOTE}" if self.peers else ""
        )


PEER_NOTE = "peer copies projected by the model (not run here: one process has no peer node)"
"""What a tiered target's peer copies are, in words, wherever they are shown."""


def ran_peers_note(peers: Mapping[str, Any]) -> str:
    """What the peer copies of a ``ckptio run --replicas K`` were, in words, from its
    sidecar's ``peers``: made and restored from, the loss emulated."""
    lost = peers.get("lost") or {}
    nodes = lost.get("nodes") or ([lost["node"]] if lost.get("node") else [])  # older: "node"
    where = (
        f" (node {nodes[0]}'s loss emulated)"
        if len(nodes) == 1
        else f" (nodes {', '.join(nodes)} lost at once, emulated)"
        if nodes
        else ""
    )
    return (
        f"{peers.get('replicas')} peer cop{'y' if peers.get('replicas') == 1 else 'ies'} run "
        f"and restored from{where}; at full scale projected by the model, with the node link "
        "fitted from these restores"
    )


def peer_suffix(peers: int) -> str:
    """A tiered target name's suffix for ``peers`` copies: ``+peer`` (1), ``+peerK``."""
    return "" if peers == 0 else "+peer" if peers == 1 else f"+peer{peers}"


def tiers_note(durable: str, durable_measured: bool, local: str, local_measured: bool) -> str:
    """What each tier is, in words (tables and plot labels)."""
    where = "this machine's disk" if local == DISK else local
    fast = f"fast tier {where}, measured" if local_measured else f"fast tier emulated {local}"
    slow = (
        f"durable tier {durable}, measured"
        if durable_measured
        else f"durable tier emulated {durable}"
    )
    return f"{fast}; {slow}"


def parse_tiered(spec: str) -> TieredSpec:
    """``cloud-s3+disk`` or ``cloud-s3+local-nvme`` (``+peer`` or ``+peerK`` after it: with
    peer copies) -> :class:`TieredSpec`; unknown profiles raise an error listing the valid
    ones."""
    from ckptio.profiles import load_profile

    peers = 0
    head, plus, last = spec.rpartition("+")
    if plus and last.startswith("peer"):
        count = last[len("peer") :] or "1"
        if not count.isdigit() or not 1 <= int(count) <= MAX_PEERS:
            raise errors.InvalidArgumentError(
                f"tiered target {spec!r}: '+peer' or '+peerK' with K from 1 to {MAX_PEERS} "
                "peer copies, e.g. cloud-s3+local-nvme+peer2"
            )
        spec, peers = head, int(count)
    durable, plus, local = spec.partition("+")
    if not plus or not durable or not local:
        raise errors.InvalidArgumentError(
            f"tiered target {spec!r}: give DURABLE+LOCAL, a durable profile and a fast tier "
            f"({DISK!r}: this machine's disk, measured; or a profile such as 'local-nvme', "
            "emulated), e.g. cloud-s3+disk"
        )
    load_profile(durable)
    if local != DISK:
        load_profile(local)
    return TieredSpec(durable, local, peers)


def tier_kinds(sidecar: dict[str, Any] | None) -> dict[str, str] | None:
    """Per phase, ``measured`` or ``emulated``, from a tiered run's sidecar; None if the run is
    not tiered."""
    tiers = (sidecar or {}).get("tiers")
    if not tiers:
        return None
    fast = "measured" if tiers.get("local_measured") else "emulated"
    durable = "measured" if tiers.get("durable_measured") else "emulated"
    kinds = {"save": fast, "restore": fast, "drain": durable, "restore-durable": durable}
    if (sidecar or {}).get("peers"):  # copies between the fast tiers of the nodes
        kinds.update(dict.fromkeys(PEER_PHASES, fast))
    return kinds


# -- the state each process holds -------------------------------------------------------------

_COMPONENTS = (("model", "model_elements", np.uint16), ("optim", "optim_elements", np.float32))
"""Tensor name, the plan's per-rank element counts, dtype (bf16 is held as uint16)."""


@dataclass(frozen=True)
class _Box:
    name: str
    dtype: Any
    total: int
    """Elements of the global tensor."""
    offset: int
    count: int
    """This process's elements."""


def _boxes(plan: Any, size: int, rank: int) -> list[_Box]:
    """This process's box of each global tensor (components no rank holds are left out)."""
    assigned = writer_ranks(plan, size)
    out = []
    for name, counts_of, dtype in _COMPONENTS:
        counts = [int(getattr(plan, counts_of)[a].sum()) for a in assigned]
        if sum(counts) > 0:
            out.append(_Box(name, dtype, sum(counts), sum(counts[:rank]), counts[rank]))
    return out


def _process_bytes(plan: Any, size: int) -> list[int]:
    """Bytes of state each of ``size`` processes holds."""
    return [
        sum(b.count * np.dtype(b.dtype).itemsize for b in _boxes(plan, size, r))
        for r in range(size)
    ]


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_tiered(plan: Any, size: int, comm: Communicator | None = None) -> None:
    """Refuse a tiered run of ``size`` processes (the ranks of ``comm``, or local processes)
    with more processes than the plan has GPUs that write (a drain copies each rank's own
    objects), or whose processes on this node would hold more than :data:`MEMORY_SHARE` of
    the memory available (each holds its share of the state; its restores read into the
    same arrays)."""
    from ckptio.units import human_bytes

    writers = int((plan.rank_bytes > 0).sum())
    if size > writers:
        raise errors.InvalidArgumentError(
            f"{size} ranks (--ranks, or the launcher's): a tiered run (--local) needs at most "
            f"one rank per GPU that writes, {writers} in this layout of {plan.preset.name}; use "
            f"at most {writers} (or more --gpus)"
        )
    avail = _available_memory()
    if avail is None:
        return
    need = max(_process_bytes(plan, size)) * (size if comm is None else _ranks_here(comm))
    if need > MEMORY_SHARE * avail:
        raise errors.InvalidArgumentError(
            f"a tiered run holds the state in memory, as training does: {human_bytes(need)} on "
            f"this node exceeds {MEMORY_SHARE:.0%} of the {human_bytes(avail)} available; lower "
            "--scale or --total-size"
        )


def _ranks_here(comm: Communicator) -> int:
    """Processes of this run on this node: the launcher's local size, else every rank."""
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return comm.size


# -- one run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tiers:
    """The fast tier of a tiered run (its durable tier is the run's URL, as the runner's)."""

    local: str
    """Its URL; ``{rank}`` in it gives each rank its own root."""
    emulate_local: str | None = None
    """A profile that wraps the fast tier in the emulate backend (marked emulated)."""
    local_label: str | None = None
    """How the fast tier is named in results (default: its URL)."""
    local_options: dict[str, Any] = field(default_factory=dict)
    tmp: str | None = None
    """Where the empty fast roots of ``restore-durable`` are made."""
    replicas: int = 0
    """Peer copies of each rank's fast-tier steps on other nodes (``--replicas``): adds the
    ``replicate`` and ``restore-peer`` phases."""
    lose: int = 1
    """Nodes lost at once before ``restore-peer`` (``--lose``): neighbours on the ring, the
    last ``lose`` in the job's node order."""


def _delete_step(store: Store, step: int) -> None:
    """Remove one step of this run from one tier's root (:func:`ckptio.checkpoint.delete_step`:
    the manifest first)."""
    try:
        delete_step(store, step)
    except errors.CkptioError as err:  # retention is best effort; a run never hangs on it
        log.warning("could not delete step %d from %s: %s", step, redact_url(store.url), err)


class TieredRun:
    """One tiered run on one rank, phase by phase, as the runner's :class:`~ckptio.runner.
    phases.Run`: :meth:`prepare` (the verdict on memory and ranks, the first step, the
    state), per iteration :meth:`save` (the stall and the drain), :meth:`restore` (from each
    tier) and :meth:`cleanup`, then :meth:`finish` (the runner's tables, the tiers in the
    sidecar)."""

    def __init__(
        self, url: str, tiers: Tiers, plan: Any, comm: Communicator, settings: RunSettings
    ) -> None:
        s = settings
        self.url, self.tiers, self.plan, self.comm, self.s = url, tiers, plan, comm, s
        self.rank = comm.rank
        self.durable_url = emulation_url(url) if s.emulate else url
        self.durable_opts = dict(s.options)
        if s.emulate:
            self.durable_opts.update(profile=s.emulate, ranks=comm.size)
        self.fast_url = emulation_url(tiers.local) if tiers.emulate_local else tiers.local
        self.fast_opts = dict(tiers.local_options)
        if tiers.emulate_local:
            self.fast_opts["profile"] = tiers.emulate_local
        self.label = redact(s.label) if s.label else target_label(url, s.emulate) + "-tiered"
        self.opts: dict[str, Any] = dict(
            comm=comm,
            max_object_size=plan.object_size,
            keep_last=None,  # this run's retention is ``keep``'s (other runs' steps stay)
            keep_last_local=None,
            key_layout=s.key_layout,
            local_options=self.fast_opts,
            replicas=tiers.replicas,
            **self.durable_opts,
        )
        self.boxes = _boxes(plan, comm.size, comm.rank)
        self.mine = sum(b.count * np.dtype(b.dtype).itemsize for b in self.boxes)
        self.rows: list[dict[str, Any]] = []  # phases
        self.parts: list[dict[str, list[Any]]] = []  # requests
        self.iters: list[dict[str, Any]] = []
        self.cache_used = "n/a"
        self.written: list[int] = []
        self.lost: dict[str, Any] = {}  # restore-peer: the nodes whose loss is emulated
        self.node = ""  # this rank's node in the ring (with peer copies)

    def execute(self) -> RunSummary:
        from ckptio.checkpoint.tiered import tiered_checkpointer

        s, comm = self.s, self.comm
        self.base = tempfile.mkdtemp(prefix="ckptio-tiered-", dir=self.tiers.tmp)
        try:
            verdict: dict[str, Any] = {}
            if self.rank == 0:
                try:
                    check_tiered(self.plan, comm.size, comm)
                except errors.CkptioError as err:
                    verdict = {"error": str(err)}
            verdict = comm.bcast(verdict, root=0)  # the same verdict on every rank
            if "error" in verdict:
                raise errors.InvalidArgumentError(verdict["error"])
            with tiered_checkpointer(self.durable_url, local=self.fast_url, **self.opts) as ck:
                self.prepare(ck)
                for it in range(s.iterations):
                    step = self.step0 + it
                    fig = self.save(ck, it, step)
                    if s.read:
                        for phase in self.restores:
                            self.restore(ck, it, step, phase, fig)
                        if s.say and self.rank == 0:
                            peer = (
                                f"{fig['restore-peer']:.2f} s after "
                                f"{', '.join(self.lost['nodes'])} lost (emulated), "
                                if self.lost
                                else ""
                            )
                            s.say(
                                f"iteration {it + 1}/{s.iterations}: restore "
                                f"{fig['restore']:.2f} s from the fast tier, {peer}"
                                f"{fig['restore-durable']:.2f} s from the durable tier (rank 0)"
                            )
                    self.iters.append(fig)
                    self.cleanup(ck, it, step)
                self.durable, self.fast_name = ck.store, ck.fast.store.name
                self.versions = client_versions(self.durable_url)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
        return self.finish()

    @property
    def restores(self) -> tuple[str, ...]:
        """The restore phases of each iteration, in order."""
        if self.tiers.replicas:
            return ("restore", "restore-peer", "restore-durable")
        return ("restore", "restore-durable")

    # -- phases --------------------------------------------------------------------------
    def prepare(self, ck: Any) -> None:
        """Check the cache mode on the fast tier, name the run and pick its first step (past
        every step of either tier; the durable root is refused as a run's is), make the
        state: this process's box of each tensor, refilled every iteration."""
        comm = self.comm
        check_cache(ck.fast.store, self.s.cache)
        if self.tiers.replicas:  # a copy goes to another node: refused here if there is none
            ring, lose = ck.ring, self.tiers.lose
            ring.check(self.tiers.replicas)
            if lose >= len(ring.nodes):
                raise errors.InvalidArgumentError(
                    f"--lose {lose}: the job runs on {len(ring.nodes)} node(s) "
                    f"({', '.join(ring.nodes)}) and at least one must survive; use --lose <= "
                    f"{len(ring.nodes) - 1}"
                )
            self.node = ring.nodes[ring.where(self.rank)[0]]
            self.lost = {
                "nodes": list(ring.nodes[-lose:]),
                "ranks": [r for ranks in ring.ranks[-lose:] for r in ranks],
            }
        steps = comm.gather(ck.steps(), root=0)
        first: dict[str, Any] = {}
        if self.rank == 0:
            assert steps is not None
            newest = max((s for part in steps for s in part), default=-1)
            try:  # the durable root is refused as a run's is (first_run_step)
                from ckptio import results as res

                first = {
                    "run_id": res.new_run_id(self.label),
                    "step": max(newest + 1, first_run_step(ck.store, share_root=self.s.share_root)),
                    "seed": secrets.token_hex(8),
                }
            except errors.InvalidArgumentError as err:
                first = {"refused": str(err)}
        first = comm.bcast(first, root=0)
        if "refused" in first:
            raise errors.InvalidArgumentError(first["refused"])
        self.run_id, self.step0 = first["run_id"], int(first["step"])
        self.gen = DataGenerator(first["seed"])
        self.state, self.raws = {}, {}
        for b in self.boxes:
            nbytes = b.count * np.dtype(b.dtype).itemsize
            self.raws[b.name] = np.empty(nbytes + DataGenerator.SLACK, dtype=np.uint8)
            arr = self.raws[b.name][:nbytes].view(b.dtype)
            self.state[b.name] = Shard(arr, (b.total,), (b.offset,))

    def ident(self, it: int, b: _Box) -> str:
        return f"{it}/{b.name}/{self.rank}"

    def row(
        self,
        it: int,
        phase: str,
        start: float,
        seconds: float,
        how: str = "n/a",
        restored: Any = None,
    ) -> None:
        timed = (self.mine, seconds, start, start + seconds)
        row = phase_row(self.run_id, self.label, self.rank, it, phase, timed, how, restored)
        if phase == "restore-peer":
            row.update(node=self.node, lost_nodes=",".join(self.lost["nodes"]))
        self.rows.append(row)

    def save(self, ck: Any, it: int, step: int) -> dict[str, Any]:
        """Fresh bytes into the state, then the save (its stall: what ``save`` blocked the
        caller for) and its drain; the requests of each, by the tier they went to."""
        for b in self.boxes:  # fresh bytes every iteration (nothing to deduplicate)
            self.gen.fill(self.raws[b.name], self.state[b.name].array.nbytes, self.ident(it, b))
        ck.store.trace.clear()
        ck.fast.store.trace.clear()
        self.comm.barrier()
        t0 = time.time()
        handle = ck.save(self.state, step, metadata={"synthetic": True, "run_id": self.run_id})
        stall = handle.blocking_seconds
        drain = handle.wait_drain()
        drained_at = time.time()
        if drain is None or drain.status != "durable":
            raise errors.SaveFailedError(
                f"the drain of step {step} to {redact_url(self.url)} did not commit: "
                f"{drain.error if drain else 'not drained'}"
            )
        copies = None
        if self.tiers.replicas:
            copies = handle.wait_peers()
            replicated_at = time.time()
            if copies.status != "replicated":
                raise errors.SaveFailedError(
                    f"the peer copies of step {step} did not commit: {copies.error}"
                )
        self.written.append(step)
        save_end = t0 + stall
        fast_events = ck.fast.store.trace.events()
        in_save = [e.op in _WRITE_OPS and e.end <= save_end + 1e-3 for e in fast_events]
        saved = [e for e, s in zip(fast_events, in_save, strict=True) if s]
        unsaved = [e for e, s in zip(fast_events, in_save, strict=True) if not s]
        copied = [e for e in unsaved if e.key.startswith(PEERS_PREFIX)]
        unsaved = [e for e in unsaved if not e.key.startswith(PEERS_PREFIX)]
        self.parts.append(events_columns(saved, "save", it, self.rank))
        self.parts.append(events_columns(unsaved, "drain-read", it, self.rank))
        self.parts.append(events_columns(ck.store.trace.events(), "drain", it, self.rank))
        self.row(it, "save", t0, stall)
        self.row(it, "drain", drained_at - drain.seconds, drain.seconds)
        if copies is not None:
            self.parts.append(events_columns(copied, "replicate", it, self.rank))
            self.row(it, "replicate", replicated_at - copies.seconds, copies.seconds)
        if self.s.progress:
            self.s.progress(2 * self.mine)
        if self.s.say and self.rank == 0:
            self.s.say(
                f"iteration {it + 1}/{self.s.iterations}: save (stall) {stall:.2f} s, drain "
                f"{drain.seconds:.2f} s (rank 0)"
            )
        return {
            "bytes": self.mine,
            "stall": stall,
            "drain": drain.seconds,
            **({"replicate": copies.seconds, "restore-peer": 0.0} if copies else {}),
            "restore": 0.0,
            "restore-durable": 0.0,
            "objects": len({e.key for e in saved if e.op in ("write", "put") and e.nbytes}),
        }

    def restore(self, ck: Any, it: int, step: int, phase: str, fig: dict[str, Any]) -> None:
        """A fresh Checkpointer's ``load`` of the newest step into the state's arrays
        (cleared first), from the fast tier (``restore``), after one node's loss from the
        peer copies (``restore-peer``, see the module docstring) or, with an empty fast root
        (a replaced node), from the durable one (``restore-durable``); the page cache of the
        objects read bypassed first as ``cache`` says; the bytes checked against the stream
        generated again."""
        from ckptio.checkpoint.tiered import tiered_checkpointer

        roots = self.fast_url
        if phase == "restore-peer":
            if self.rank in self.lost["ranks"]:  # the emulated loss: this node's disk emptied
                fast = ck.fast.store
                fast.delete(fast.list(""))
            self.comm.barrier()
        if phase == "restore-durable":
            roots = os.path.join(self.base, f"lost-{it}-{self.rank}")  # an empty fast root
            if self.tiers.replicas:  # each rank's own (peer copies need a root per rank)
                roots = os.path.join(self.base, f"lost-{it}-{{rank}}")
            roots = emulation_url(roots) if self.tiers.emulate_local else roots
        with tiered_checkpointer(self.durable_url, local=roots, **self.opts) as reader:
            cold = reader.store if phase == "restore-durable" else reader.fast.store
            prefix = fmt.step_dir(step) + "/"
            keys = [k[len(prefix) :] for k in cold.list(prefix)]
            how = start_cold_reads(cold, step, keys, self.s.cache)
            reader.store.trace.clear()
            reader.fast.store.trace.clear()
            for b in self.boxes:  # a restore that reads nothing cannot pass
                self.state[b.name].array.view(np.uint8).fill(0)
            self.comm.barrier()
            t = time.time()
            try:
                reader.load(into=self.state)  # the newest: what a restart reads
            finally:
                if not cold.describe().cold_reads.end():
                    how = "none"  # O_DIRECT refused: reads went buffered
            fig[phase] = time.time() - t
            restored = reader.last_restore  # where it read from (with peer copies)
            events = [*reader.fast.store.trace.events(), *reader.store.trace.events()]
            self.parts.append(events_columns(events, phase, it, self.rank))
        if phase == "restore":
            self.cache_used = how
        for b in self.boxes:
            got = self.state[b.name].array
            if not self.gen.matches(got, got.nbytes, self.ident(it, b)):
                raise errors.CorruptCheckpointError(
                    f"the {phase} of step {step} read other bytes than were "
                    f"saved ({b.name}, rank {self.rank})"
                )
        self.row(it, phase, t, fig[phase], how, restored)
        if self.s.progress:
            self.s.progress(self.mine)

    def cleanup(self, ck: Any, it: int, step: int) -> None:
        """Retention (``keep``: this run's older steps, from both tiers, manifest first) and
        the pause before the next iteration."""
        s = self.s
        self.comm.barrier()
        if s.keep == "none" or (s.keep == "last" and it < s.iterations - 1):
            if self.rank == 0:
                _delete_step(ck.store, step)
            if self.rank == 0 or ck.per_rank:
                _delete_step(ck.fast.store, step)
            if self.tiers.replicas:  # and the copies of it this rank holds
                drop_copies(ck.fast.store, lambda s: s == step)
        if s.pause and it < s.iterations - 1:
            time.sleep(s.pause)

    # -- finish --------------------------------------------------------------------------
    def finish(self) -> RunSummary:
        """Gather every rank's figures to rank 0, which builds the runner's three tables (the
        stall as the write, the fast tier's restore as the read) and the per-iteration tiered
        figures, and writes them with the sidecar under ``out_dir``."""
        comm, s = self.comm, self.s
        everything = comm.gather(
            {
                "phases": self.rows,
                "requests": merge_columns(self.parts),
                "iters": self.iters,
                "rss": peak_rss(),
                "host": HOST,
            },
            root=0,
        )
        summary = RunSummary(
            self.run_id,
            self.rank,
            phases=self.rows,
            steps=self.written,
            url=redact_url(self.url),
            cache=self.cache_used,
            generator=self.gen.name,
            client_versions=self.versions,
        )
        if everything is None:
            summary.peak_rss_bytes = [peak_rss()]
            return summary
        reqs, n = request_table(everything, self.run_id, self.label)
        runs = run_rows(
            self.plan,
            _as_run_rows(everything),
            reqs,
            RunSettings(
                label=self.label,
                site=s.site,
                emulated=bool(s.emulate or self.tiers.emulate_local),
                profile=s.emulate or "",
                kind="tiered",
            ),
            run_id=self.run_id,
            url=self.url,
            store=self.durable,
            comm_size=comm.size,
        )
        all_phases = [r for e in everything for r in e["phases"]]
        summary.runs, summary.phases, summary.requests = runs, all_phases, n
        summary.peak_rss_bytes = [int(e["rss"]) for e in everything]
        summary.tiered = _tiered_rows(everything, s.iterations)
        summary.tables = {"requests": reqs, "phases": all_phases, "runs": runs}
        if s.out_dir is not None:
            from ckptio import results as res

            summary.paths = res.write_run(
                s.out_dir,
                requests=res.table("requests", reqs),
                phases=res.table("phases", all_phases),
                runs=res.table("run", runs),
                sidecar=self._sidecar(summary, everything),
            )
        return summary

    def _sidecar(self, summary: RunSummary, everything: list[dict[str, Any]]) -> dict[str, Any]:
        """The run's JSON sidecar: the runner's, with what each tier was."""
        from ckptio import results as res

        s, t = self.s, self.tiers
        durable_shown = s.emulate or redact_url(self.url)
        fast_shown = t.local_label or t.emulate_local or redact_url(t.local)
        return res.sidecar(
            self.run_id,
            config={
                "url": redact_url(self.url),
                "local": redact_url(t.local),
                "preset": self.plan.preset.name,
                "scale": self.plan.scale,
                "layout": self.plan.layout.describe(),
                "gpus": self.plan.ranks,
                "ranks": self.comm.size,
                "iterations": s.iterations,
                "object_size": self.plan.object_size,
                "cache": s.cache,
                "keep": s.keep,
                "pause": s.pause,
                "store_options": self.durable_opts,
                "local_options": self.fast_opts,
                **s.config,
            },
            emulated=bool(s.emulate or t.emulate_local),
            profile=s.emulate or "",
            labels={"target": self.label, "site": s.site or ""},
            extra={
                "tiers": {
                    "durable": durable_shown,
                    "durable_url": redact_url(self.durable_url),
                    "durable_measured": not s.emulate,
                    "local": fast_shown,
                    "local_url": redact_url(self.fast_url),
                    "local_measured": not t.emulate_local,
                    "local_backend": self.fast_name,
                    "note": tiers_note(
                        durable_shown, not s.emulate, fast_shown, not t.emulate_local
                    ),
                },
                "generator": self.gen.name,
                "peak_rss_bytes": summary.peak_rss_bytes,
                "steps": self.written,
                "cache_bypass": self.cache_used,
                **(
                    {"peers": {"replicas": t.replicas, "lost": self.lost, "loss": LOSS_NOTE}}
                    if t.replicas
                    else {}
                ),
                "communicator": type(self.comm).__name__,
                "hosts": hosts_of(everything),
            },
            client_versions=self.versions,
        )


def _as_run_rows(everything: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's figures as the runner's (:func:`ckptio.runner.records.run_rows` reads
    them): the stall as the write, the fast tier's restore as the read."""
    return [
        {
            "iters": [
                {
                    "bytes": f["bytes"],
                    "objects": f["objects"],
                    "write_start": 0.0,
                    "write_end": f["stall"],
                    "write_done": f["stall"],
                    "read_start": 0.0,
                    "read_end": f["restore"],
                    "read_done": f["restore"],
                    "gen_seconds": 0.0,
                }
                for f in e["iters"]
            ],
            "host": e["host"],
        }
        for e in everything
    ]


def _tiered_rows(everything: list[dict[str, Any]], iterations: int) -> list[dict[str, Any]]:
    """Per iteration the slowest rank's stall, drain and restores (:attr:`RunSummary.tiered`)."""
    out = []
    for it in range(iterations):
        per = [e["iters"][it] for e in everything]
        total = sum(p["bytes"] for p in per)
        worst = {ph: max(p[ph] for p in per) for ph in ("stall", "drain", *PHASES[2:])}
        peers = {}
        if "restore-peer" in per[0]:  # with peer copies
            seconds = {ph: max(p[ph] for p in per) for ph in PEER_PHASES}
            peers = {
                "replicate_seconds": seconds["replicate"],
                "restore_peer_seconds": seconds["restore-peer"],
                "restore_peer_GBps": gb_per_s(total, seconds["restore-peer"]),
            }
        out.append(
            {
                **peers,
                "iteration": it,
                "checkpoint_bytes": total,
                "stall_seconds": worst["stall"],
                "drain_seconds": worst["drain"],
                "drain_GBps": gb_per_s(total, worst["drain"]),
                "restore_seconds": worst["restore"],
                "restore_GBps": gb_per_s(total, worst["restore"]),
                "restore_durable_seconds": worst["restore-durable"],
                "restore_durable_GBps": gb_per_s(total, worst["restore-durable"]),
            }
        )
    return out


def run_tiered_workload(
    url: str,
    local: str | Tiers,
    plan: Any,
    settings: RunSettings | None = None,
    comm: Communicator | None = None,
) -> RunSummary:
    """Run ``plan`` through a :class:`~ckptio.checkpoint.tiered.TieredCheckpointer` with
    durable tier ``url`` and fast tier ``local`` (a URL, ``{rank}`` in it giving each rank
    its own root, or a :class:`Tiers`) as ``settings`` say (:class:`~ckptio.runner.RunSettings`,
    the runner's: ``emulate`` wraps the durable tier, ``options`` are its store's; ``inflight``
    and ``layout`` do not apply) on every rank of ``comm`` (see the module docstring). Every
    rank calls it with the same arguments. Returns this rank's
    :class:`~ckptio.runner.RunSummary` (complete on rank 0)."""
    from ckptio.dist import detect

    tiers = local if isinstance(local, Tiers) else Tiers(local)
    s = settings if settings is not None else RunSettings()
    comm = comm if comm is not None else detect()
    return TieredRun(url, tiers, plan, comm, s).execute()


def rank_main(
    comm: Communicator, url: str, plan: Any, settings: RunSettings, tiers: Tiers
) -> RunSummary:
    """What every local-process rank of ``ckptio run --local`` runs (as
    :func:`ckptio.runner.rank_main`)."""
    from ckptio import runner

    if comm.rank == 0 and runner.PROGRESS_HOOK is not None:
        settings = replace(settings, progress=runner.PROGRESS_HOOK)
    if comm.rank == 0 and runner.SAY_HOOK is not None:
        settings = replace(settings, say=runner.SAY_HOOK)
    return run_tiered_workload(url, tiers, plan, settings, comm)


def run_tiered(
    spec: TieredSpec,
    plan: Any,
    *,
    out_dir: str,
    iterations: int = 1,
    label: str | None = None,
    site: str | None = None,
    config: dict[str, Any] | None = None,
    tmp: str | None = None,
    say: Callable[[str], None] | None = None,
) -> str:
    """``ckptio compare``'s tiered target ``spec`` in this one process: the durable profile
    emulated over a fresh ``memory://`` space, the fast tier a fresh directory (under
    ``tmp``), both removed afterwards; the result files go under ``out_dir``. Returns the
    run id."""
    from ckptio.dist import SingleProcess

    base = tempfile.mkdtemp(prefix="ckptio-tiered-", dir=tmp)
    memory_url = f"memory://ckptio-tiered-{secrets.token_hex(6)}"
    try:
        tiers = Tiers(
            os.path.join(base, "fast"),
            emulate_local=None if spec.local_measured else spec.local,
            local_label=DISK if spec.local_measured else None,
            tmp=base,
        )
        settings = RunSettings(
            iterations=iterations,
            out_dir=out_dir,
            cache="auto",
            keep="last",
            label=label or spec.name,
            site=site,
            emulate=spec.durable,
            config=config or {},
            say=say,
        )
        summary = run_tiered_workload(memory_url, tiers, plan, settings, SingleProcess())
    finally:
        shutil.rmtree(base, ignore_errors=True)
        with open_store(memory_url) as space:  # the emulated durable tier's bytes
            space.delete(space.list(""))
    return str(summary.run_id)
