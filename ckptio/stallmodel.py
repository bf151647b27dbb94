"""Why a checkpoint stalls, and what it costs: the stall, cost and interval model.

Units: bytes, seconds, bandwidth in bytes/s (GB/s = 1e9 bytes/s), rates in requests/s.

:func:`project` gives a target's stall and cost (JSON-able; tiered with ``local``), given a
workload, a profile and one :class:`Conditions`; :func:`evaluate` answers ``ckptio model``.

**Time of one checkpoint.** A checkpoint is a :class:`Workload`: ``writing_ranks`` ranks each
write up to ``bytes_per_rank`` bytes as ``objects_per_rank`` objects, cut into data requests of
``part_size`` bytes; ranks are packed ``ranks_per_node`` to a node, and each node drives
``streams`` concurrent streams (connections / writer threads). Against a storage
:class:`~ckptio.profiles.Profile`, each limit alone would take:

- per-stream bandwidth: ``node_bytes / (streams_used * stream_bandwidth)``
- request latency: ``requests_per_stream * request_latency`` (paid in series with the above
  on each stream, so the two add: one stream's time is their sum)
- node link: ``node_bytes / node_bandwidth``
- aggregate bandwidth: ``total_bytes / aggregate_bandwidth``
- request-rate limit: ``requests / (request_rate * partitions)``
- client CPU (checksums, copies): ``node_bytes / (client_cpu_bandwidth * writers_per_node)``
- metadata: ``objects_per_stream * 2 * metadata_latency + protocol * metadata_latency`` (adds).

The data phase takes as long as the slowest of (stream path, node link, aggregate, rate,
CPU), the *binding* limit; metadata adds. The attribution splits the total into the parts on
the critical path (their ``contribution_seconds`` sum to it) and gives every other limit's
time alone (its ``seconds``): the slack.

**Lost time and its cost** (stall + rework + restart), the optimal interval: :mod:`ckptio.costmodel`.

**Restart.** Unless a restart time is given, ``R = fixed overhead + restore time``: the
overhead (:data:`DEFAULT_RESTART_OVERHEAD`, an assumption) covers rescheduling, process start
and warm-up; the restore is the read of the whole checkpoint back from the storage, projected
like the write from the profile's read side (read request rate; the bandwidth and latency
figures are shared by both directions) as ckptio's reader does it (``estimate(phase=
"restore")``: the steps listed and the manifest read first, each object's size checked
beside its data, :data:`RESTORE_READERS` objects in flight per rank), or ``size / read
bandwidth`` when figures are given. The restore reads each writing rank's bytes once, as
written (ranks holding replicas of them are assumed to get them from a peer; their reads are
not counted).

**Tiers** (``local``: a fast tier's profile, as :class:`ckptio.tiered.TieredCheckpointer`
uses one): the stall is the write to the fast tier (or the snapshot, async); every
``persist_every``-th checkpoint is drained to the durable tier in the background, which takes
as long as the slower of the durable write and the fast read of the same objects, and fits
when it ends before the next drain is due (``persist_every * interval``). The restore reads the
fast tier unless a failure lost a node's fast tier, with probability ``p_lose_node``
(:data:`DEFAULT_P_LOSE_NODE`, an assumption with its source), when the durable tier is read:
``restore = (1 - p) * fast read + p * durable read``. The newest checkpoint exists on the fast
tier only for ``(persist_every - 1) * interval + drain`` at most (the *fast-only window*); a
failure that loses a node in that window loses the work since the newest drained step.

**Peer copies** (``peers = k`` > 0, the target ``<durable>+<local>+peer``): after each save
to the fast tier, each node's step is copied in the background to the fast tiers of the next
``k`` nodes of a ring (nodes, not ranks: a copy on the same node dies with it). The
*replication* takes as long as the slower of the node link, which carries the ``k`` copies
sent (and ``k`` received, full duplex) with the drain's bytes to the durable tier, and the
fast tier, which writes the ``k`` copies received and reads the step once to send it; the
link is ``peer_bandwidth``, by default the durable profile's ``node_bandwidth`` (the same
node's link to its storage: an assumption that peers and storage share one link). It blocks
the next save when the save and it outlast the interval (the excess is added to the stall);
each fast tier holds ``(1 + k)`` steps' worth per node. After a failure that loses nodes, a
replacement node restores from a surviving peer: the peer reads its own step (its own
restart) and the copies of the ``f`` replacement nodes it serves (the *fan-in*) from its
fast tier, and sends those copies over its link (``f * node / link``); the replacement places
the bytes in its arrays as they arrive and writes them onto its own fast tier (not read
back); the slowest of the three is the peer restore. The fan-in is ``peer_fan_in`` where
given, else the restore planner's on the job's ring when ``k`` neighbouring nodes are lost
(:func:`peer_fan_in`: the real :func:`ckptio.checkpoint.peer_plan.assign` on the holdings such a
ring has, every placement; fewer nodes lost are served no worse): 2 on a ring of 3 nodes with
``k = 2``, 1 on rings of a few nodes more. The link is ``peer_bandwidth`` where given or
fitted from measured restores from a peer (:func:`ckptio.calibration.fit_peer_link`: a
sending node's bytes over the round's time, an effective figure, the measured restore's
planning and checks included; :func:`ckptio.calibration.check_fan_in` checks
``f * node / link`` against measured restores at fan-in 2), else the node link above. A
failure loses a node with probability ``p_lose_node``; the count of nodes lost at once is
geometric: each further node with probability ``p_lose_another``
(:data:`DEFAULT_P_LOSE_ANOTHER`, an assumption). With ``k`` copies, losing up to ``k`` nodes
at once leaves a copy of each; losing more is taken to lose every copy of one of them (the
worst placement, neighbours on the ring), and the durable tier is read. The expected restore
is ``(1 - p) * fast + p (1 - q^k) * peer + p q^k * durable`` (``q = p_lose_another``), with
the peer restore capped at the durable one (a restorer would read the durable tier where it
is faster; ``peer_slower_than_durable`` says when that happens). With ``k = 0`` this is the
tiered restore above, exactly. Not modelled: the replication slowing a drain that shares the
fast tier and the link (a drain bound by its durable write, as to S3, leaves both mostly
idle), and the copies made again after a node is replaced (background, after the restart).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ckptio import errors
from ckptio.costmodel import (
    ASSUMPTIONS,
    DEFAULT_INTERVAL,
    DEFAULT_P_LOSE_ANOTHER,
    DEFAULT_P_LOSE_NODE,
    DEFAULT_PRICE_PER_GPU_HOUR,
    DEFAULT_RESTART_OVERHEAD,
    DEFAULT_SNAPSHOT_BANDWIDTH,
    LOSSES,
    REFERENCE_MTTF_GPUS,
    REFERENCE_MTTF_SECONDS,
    CostModel,
    backpressure,
    cost_curve,
    daly_interval,
    lost_shares,
    overhead_fraction,
    reference_mtbf,
    young_interval,
)
from ckptio.peermodel import peer_figures, peer_link
from ckptio.profiles import Profile
from ckptio.protocol import save_protocol_requests
from ckptio.units import (
    human_rate,
    human_seconds,
    human_size,
)

__all__ = [
    "ASSUMPTIONS",
    "DEFAULT_CLIENT_CPU_BANDWIDTH",
    "DEFAULT_INTERVAL",
    "DEFAULT_OBJECT_CONCURRENCY",
    "DEFAULT_PRICE_PER_GPU_HOUR",
    "DEFAULT_P_LOSE_ANOTHER",
    "DEFAULT_P_LOSE_NODE",
    "DEFAULT_RESTART_OVERHEAD",
    "DEFAULT_SNAPSHOT_BANDWIDTH",
    "LIMITS",
    "LOSSES",
    "PHASES",
    "REFERENCE_MTTF_GPUS",
    "REFERENCE_MTTF_SECONDS",
    "Conditions",
    "CostModel",
    "Figures",
    "Limit",
    "PhaseEstimate",
    "Workload",
    "backpressure",
    "cost_curve",
    "daly_interval",
    "estimate",
    "evaluate",
    "lost_shares",
    "overhead_fraction",
    "peer_fan_in",
    "peer_link",
    "preset_workload",
    "project",
    "reference_mtbf",
    "restart_time",
    "young_interval",
]

# -- workload -------------------------------------------------------------------------------

#: Client-side processing rate per writing rank (bytes/s): CRC32C through the crc32c package
#: runs at ~11 GB/s per core on this project's 2-core VM; copies and framing cost about as
#: much again, so half of it is assumed (an assumption, not a measurement of your client).
DEFAULT_CLIENT_CPU_BANDWIDTH = 5.5e9


@dataclass(frozen=True, slots=True)
class Workload:
    """What one checkpoint asks of the storage (one iteration of a plan)."""

    total_bytes: int
    """Bytes of one checkpoint, all ranks."""
    writing_ranks: int
    """Ranks that write data (replicated state is written once)."""
    bytes_per_rank: int
    """Bytes the busiest writing rank writes (the slowest rank sets the time)."""
    objects_per_rank: int = 1
    """Objects (files) the busiest writing rank writes."""
    ranks: int = 0
    """All ranks (GPUs) of the job; 0 = ``writing_ranks``."""
    ranks_per_node: int = 8
    """Ranks (GPUs) per node; writing ranks are packed onto as few nodes as this allows."""
    name: str = ""
    prefixes: int = 1
    """Key prefixes the objects spread over (``flat`` layout 1, ``hashed`` up to 256): request
    rates that apply per prefix multiply with it."""
    object_concurrency: int = 1
    """Objects a rank writes at once (each object's parts still go out in parallel)."""
    objects: int = (
        0  # all ranks' (a commit lists them; save_protocol_requests); 0: writing x per rank
    )

    def __post_init__(self) -> None:
        for f in (
            "total_bytes",
            "writing_ranks",
            "bytes_per_rank",
            "objects_per_rank",
            "ranks_per_node",
            "prefixes",
            "object_concurrency",
        ):
            if getattr(self, f) < (0 if f == "total_bytes" else 1):
                raise errors.InvalidArgumentError(
                    f"workload: {f} must be >= 1, got {getattr(self, f)}"
                )

    @property
    def gpus(self) -> int:
        return max(self.ranks, self.writing_ranks)

    @property
    def writers_per_node(self) -> int:
        return min(self.ranks_per_node, self.writing_ranks)

    @property
    def writing_nodes(self) -> int:
        return -(-self.writing_ranks // self.writers_per_node)

    @property
    def node_bytes(self) -> int:
        return self.bytes_per_rank * self.writers_per_node

    @classmethod
    def from_plan(
        cls, plan: Any, *, ranks_per_node: int = 8, prefixes: int = 1, object_concurrency: int = 1
    ) -> Workload:
        """A workload from a :class:`ckptio.workload.Plan` (or its ``summary()`` dict)."""
        d = plan if isinstance(plan, Mapping) else _plan_dict(plan)
        objects_per_rank = d.get("objects_per_rank_max")
        per_rank = getattr(plan, "_objects_per_rank", None)
        if objects_per_rank is None and callable(per_rank):
            objects_per_rank = int(per_rank()[0].max())
        try:
            writing = int(d["writing_ranks"])
            return cls(
                total_bytes=int(d["total_bytes"]),
                writing_ranks=writing,
                bytes_per_rank=int(d.get("bytes_per_rank_max") or d["total_bytes"] // writing),
                objects_per_rank=max(
                    1, int(objects_per_rank or -(-int(d.get("objects", writing)) // writing))
                ),
                ranks=int(d.get("ranks", writing)),
                ranks_per_node=ranks_per_node,
                name=str(d.get("preset") or d.get("name") or ""),
                prefixes=prefixes,
                object_concurrency=object_concurrency,
                objects=int(d.get("objects") or 0),
            )
        except KeyError as err:
            raise errors.InvalidArgumentError(f"plan lacks field {err.args[0]!r}") from None

    @classmethod
    def for_run(cls, plan: Any, *, processes: int = 1, inflight: int = 2) -> Workload:
        """The workload a :func:`ckptio.runner.run_workload` of ``plan`` puts on the storage
        from ``processes`` processes (each one a node of its own; the runner deals the
        plan's writing ranks round-robin over them) with ``inflight`` objects per process."""
        import numpy as np

        writers = np.flatnonzero(plan.rank_bytes > 0)
        objects = plan._objects_per_rank()[0]
        shares = [writers[p::processes] for p in range(processes)]
        busiest = max(shares, key=lambda ws: int(plan.rank_bytes[ws].sum()))
        return cls(
            total_bytes=int(plan.total_bytes),
            writing_ranks=min(processes, len(writers)),
            bytes_per_rank=int(plan.rank_bytes[busiest].sum()),
            objects_per_rank=max(1, int(objects[busiest].sum())),
            ranks=processes,
            ranks_per_node=1,
            name=f"{plan.preset.name} x{plan.scale:g} on {processes} process(es)",
            object_concurrency=inflight,
            objects=int(objects.sum()),
        )


def _plan_dict(plan: Any) -> dict[str, Any]:
    for attr in ("summary", "as_dict", "to_dict"):
        fn = getattr(plan, attr, None)
        if callable(fn):
            d = fn()
            if isinstance(d, Mapping):
                return dict(d)
    raise errors.InvalidArgumentError(f"cannot read a workload from {type(plan).__name__}")


# -- the model ------------------------------------------------------------------------------

PHASES = ("write", "read", "restore")
#: Objects a rank's restore reads at once: :class:`ckptio.checkpoint.CheckpointReader`'s
#: default ``readers``.
RESTORE_READERS = 8
#: Metadata operations in series before a restore reads data: listing the steps, before the
#: manifest's one read (:func:`ckptio.checkpoint.read.read_manifest`).
RESTORE_PREAMBLE_OPS = 1


X = "\u00d7"  # the multiplication sign, as in "8 writing nodes x 16 streams x 50 MB/s"

LIMITS = (
    "per-stream bandwidth",
    "request latency",
    "request-rate limit",
    "node link",
    "aggregate bandwidth",
    "metadata",
    "client CPU",
)


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit's share of a checkpoint's time."""

    limit: str
    """One of :data:`LIMITS`."""
    seconds: float
    """Time this limit alone would impose (for stream path parts: its part of the path)."""
    contribution_seconds: float
    """Its part of the critical path; the contributions sum to the total time."""
    binding: bool
    detail: str
    """The limit in words, with the figures that make it."""


@dataclass(frozen=True, slots=True)
class PhaseEstimate:
    """Time of one write (or read) of a checkpoint and why."""

    phase: str
    seconds: float
    GBps: float
    """``total_bytes / seconds / 1e9``."""
    binding: str
    """The binding limit (one of :data:`LIMITS`)."""
    binding_detail: str
    limits: list[Limit]
    requests: int
    throttled: bool
    """True if the request rate binds: the service answers part of the requests with a
    throttling error and the client retries (the estimate counts the rate, not the backoff)."""
    remedy: str = ""
    """What would move the binding limit, in words."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(
    workload: Workload,
    profile: Profile,
    *,
    phase: str = "write",
    streams: int | None = None,
    part_size: int | None = None,
    client_cpu_bandwidth: float = DEFAULT_CLIENT_CPU_BANDWIDTH,
) -> PhaseEstimate:
    """Time of one ``phase`` of ``workload`` on ``profile``: ``write``, ``read`` (the bytes
    read back by a reader that knows every offset, as the runner's read phase) or ``restore``
    (a load of the newest checkpoint by :class:`~ckptio.checkpoint.CheckpointReader`: the
    read, with :data:`RESTORE_READERS` objects in flight per rank, after listing the steps
    and reading the manifest (:data:`RESTORE_PREAMBLE_OPS` metadata operations and one small
    request in series); each object's size check goes out beside its first reads).

    ``streams`` (per node) and ``part_size`` (bytes) default to the profile's.
    """
    if phase not in PHASES:
        raise errors.InvalidArgumentError(
            f"phase must be one of {', '.join(PHASES)}, got {phase!r}"
        )
    restore = phase == "restore"
    w, p = workload, profile
    streams = streams or p.streams
    part = part_size or p.part_size
    obj_bytes = -(-w.bytes_per_rank // w.objects_per_rank)
    parts_per_object = max(1, -(-obj_bytes // part))
    total_requests = w.writing_ranks * w.objects_per_rank * parts_per_object
    # objects go out in groups of object_concurrency per rank; a group's parts share the streams
    in_flight_objects = min(
        RESTORE_READERS if restore else w.object_concurrency, w.objects_per_rank
    )
    groups = -(-w.objects_per_rank // in_flight_objects)
    in_flight = w.writers_per_node * in_flight_objects * parts_per_object
    used = max(1, min(streams, in_flight))
    rounds = groups * -(-in_flight // used)  # requests each stream sends, one after another
    reading = phase != "write"  # the read side's own figures where the profile has them
    lat = p.side("request_latency", read=reading)
    sbw = p.side("stream_bandwidth", read=reading)
    nbw = p.side("node_bandwidth", read=reading)
    abw = p.value("aggregate_bandwidth")
    rate = p.value("write_request_rate" if phase == "write" else "read_request_rate")
    meta = p.value("metadata_latency")

    t_stream = w.node_bytes / (used * sbw)
    t_latency = rounds * lat
    # a shared link carries a group's bytes after its first request's latency; groups of
    # objects go one after another, so each pays that latency once
    t_node = w.node_bytes / nbw + (groups * lat if not math.isinf(nbw) else 0.0)
    t_agg = w.total_bytes / abw + (groups * lat if not math.isinf(abw) else 0.0)
    partitions = 1 if p.rate_scope == "bucket" else w.prefixes
    t_rate = 0.0 if p.rate_scope == "none" else total_requests / (rate * partitions)
    t_cpu = w.node_bytes / (client_cpu_bandwidth * w.writers_per_node)
    # a write creates and commits each object (in series with its data), then the manifest;
    # a read needs no per-object metadata (the manifest has every offset), only the manifest;
    # a restore lists the steps and reads the manifest first; it checks each object's size
    # beside the object's first reads (CheckpointReader.read_many), not before them
    meta_ops = {"write": 2, "read": 0, "restore": 0}[phase]
    proto = save_protocol_requests(w.objects or w.writing_ranks * w.objects_per_rank)
    once = proto if phase == "write" else (RESTORE_PREAMBLE_OPS if restore else 1)
    t_meta = groups * meta_ops * meta + once * meta + (lat if restore else 0.0)

    path = t_stream + t_latency
    others = {
        "node link": t_node,
        "aggregate bandwidth": t_agg,
        "request-rate limit": t_rate,
        "client CPU": t_cpu,
    }
    slowest_other = max(others, key=lambda k: others[k])
    data = max(path, others[slowest_other])
    total = data + t_meta

    n_w, s_used = w.writing_nodes, used
    doing = "writing" if phase == "write" else "reading"
    details = {
        "per-stream bandwidth": f"{n_w} {doing} node{'s' if n_w != 1 else ''} {X} {s_used} "
        f"stream{'s' if s_used != 1 else ''} {X} {human_rate(sbw)}",
        "request latency": f"{rounds} requests per stream {X} "
        f"{human_seconds(lat)} ({human_size(part)} parts)",
        "node link": f"{n_w} {doing} node{'s' if n_w != 1 else ''} {X} {human_rate(nbw)}",
        "aggregate bandwidth": f"{human_rate(abw)} shared by all {w.writing_ranks} "
        f"{'writers' if phase == 'write' else 'readers'}",
        "request-rate limit": f"{total_requests} requests at {rate:g}/s per {p.rate_scope}"
        + (f" {X} {partitions} prefixes" if partitions > 1 else "")
        + (f" ({p.throttle.split(';')[0]} past it)" if p.throttle else ""),
        "client CPU": f"{w.writers_per_node} ranks per node {X} {human_rate(client_cpu_bandwidth)} "
        "(checksums, copies)",
        "metadata": f"{groups * meta_ops + once} operations in series {X} {human_seconds(meta)}",
    }
    path_binds = path >= others[slowest_other]
    if path_binds:
        binding = "per-stream bandwidth" if t_stream >= t_latency else "request latency"
        contrib = {"per-stream bandwidth": t_stream, "request latency": t_latency}
    else:
        binding = slowest_other
        contrib = {slowest_other: data}
    if t_meta > data:
        binding = "metadata"
    contrib["metadata"] = t_meta
    alone = {
        "per-stream bandwidth": t_stream,
        "request latency": t_latency,
        "metadata": t_meta,
        **others,
    }
    limits = [
        Limit(name, alone[name], contrib.get(name, 0.0), name == binding, details[name])
        for name in LIMITS
    ]
    # what would fix it: the next limit is what the binding one could be relieved down to
    next_limit = max([v for k, v in others.items() if k != binding] + [1e-9])
    if binding == "per-stream bandwidth":
        need = math.ceil(used * path / max(next_limit, t_meta, 1e-3))  # path ~ 1/streams
        remedy = (
            f"more concurrent streams per node: ~{need} (now {used}) until the next "
            f"limit, or async save (stall {human_seconds(w.bytes_per_rank / 25e9)})"
        )
    elif binding == "request latency":
        remedy = "larger parts (fewer requests per stream) or more concurrent streams"
    elif binding == "request-rate limit":
        remedy = (
            "spread keys over more prefixes (key_layout='hashed'), or larger parts/"
            "objects (fewer requests)"
        )
    elif binding == "node link":
        remedy = "spread the writing over more nodes (shard the optimizer state), or async save"
    elif binding == "aggregate bandwidth":
        remedy = (
            "async save (the stall becomes the snapshot), or a faster tier to absorb the "
            "burst (node-local NVMe, then drain)"
        )
    elif binding == "metadata":
        remedy = "fewer, larger objects (object size), or more objects in flight per rank"
    else:
        remedy = "more client threads for checksums and copies, or async save"
    return PhaseEstimate(
        phase=phase,
        seconds=total,
        remedy=remedy,
        GBps=w.total_bytes / total / 1e9 if total > 0 else math.inf,
        binding=binding,
        binding_detail=f"{p.name}: {binding} — {details[binding]}",
        limits=limits,
        requests=total_requests,
        throttled=t_rate >= path and t_rate > 0 and slowest_other == "request-rate limit",
    )


# -- projections ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Conditions:
    """What a projection depends on besides the workload and the storage: the job's interval,
    failures, restart, price and way of saving. Defaults: no failures and no price (the model
    needs them given); :meth:`reference` gives the report's stated assumptions."""

    interval: float = DEFAULT_INTERVAL
    """Seconds between checkpoint starts (wall clock)."""
    mtbf: float = math.inf
    """The job's mean time between failures, seconds (inf: none)."""
    gpus: int | None = None
    """GPUs of the job (None: the workload's)."""
    price_per_gpu_hour: float = 0.0
    restart_seconds: float | None = None
    """One restart, seconds (None: ``restart_overhead`` + the projected restore)."""
    restart_overhead: float = DEFAULT_RESTART_OVERHEAD
    async_save: bool = False
    """The stall is the snapshot (device -> host copy), the write goes on in the background."""
    snapshot_bandwidth: float = DEFAULT_SNAPSHOT_BANDWIDTH
    """Bytes/s per GPU of an asynchronous save's snapshot."""
    persist_every: int = 1
    """Tiered: every N-th checkpoint is drained to the durable tier."""
    p_lose_node: float = DEFAULT_P_LOSE_NODE
    """Tiered: the probability that a failure loses a node's fast tier."""
    peers: int = 0
    """Tiered: peer copies of each node's fast-tier step, on the next ``peers`` nodes of a
    ring (0: none)."""
    peer_fan_in: int | None = None
    """Tiered with peers: replacement nodes that read from one surviving peer at once (None:
    what the restore planner does on the job's ring when ``peers`` neighbouring nodes are
    lost, :func:`peer_fan_in`)."""
    p_lose_another: float = DEFAULT_P_LOSE_ANOTHER
    """Tiered with peers: the probability that a failure which loses a node loses another one
    at once (and so on: the count of nodes lost is geometric)."""
    peer_bandwidth: float | None = None
    """Tiered with peers: bytes/s of a node's network link to the other nodes (None: the
    durable profile's ``node_bandwidth``, the same node's link to the storage)."""
    peer_bandwidth_source: str = ""
    """Where ``peer_bandwidth`` comes from, in words ("": given by the user); a figure
    fitted from measured restores from peers says so (:func:`ckptio.calibration.fit_peer_link`)."""
    streams: int | None = None
    """Concurrent streams per node (None: the profile's)."""
    part_size: int | None = None
    """Bytes per data request (None: the profile's)."""

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise errors.InvalidArgumentError(f"interval must be > 0 s, got {self.interval}")
        if not self.mtbf > 0:
            raise errors.InvalidArgumentError(f"MTBF must be > 0 s, got {self.mtbf}")
        if not 0 <= self.p_lose_node <= 1:
            raise errors.InvalidArgumentError(
                f"p_lose_node: a probability in [0, 1], got {self.p_lose_node}"
            )
        if self.persist_every < 1:
            raise errors.InvalidArgumentError(
                f"persist_every must be >= 1, got {self.persist_every}"
            )
        if not 0 <= self.p_lose_another < 1:
            raise errors.InvalidArgumentError(
                f"p_lose_another: a probability in [0, 1), got {self.p_lose_another}"
            )
        if self.peers < 0:
            raise errors.InvalidArgumentError(f"peers must be >= 0, got {self.peers}")
        if self.peer_fan_in is not None and self.peer_fan_in < 1:
            raise errors.InvalidArgumentError(f"peer_fan_in must be >= 1, got {self.peer_fan_in}")
        if self.peer_bandwidth is not None and not self.peer_bandwidth > 0:
            raise errors.InvalidArgumentError(
                f"peer_bandwidth must be > 0 bytes/s, got {self.peer_bandwidth}"
            )

    @classmethod
    def reference(cls, gpus: int, **changes: Any) -> Conditions:
        """The report's stated assumptions (:data:`ASSUMPTIONS`) for a job of ``gpus`` GPUs:
        a 2 h interval, the reference MTBF scaled to ``gpus``, a price of 2 per GPU-hour;
        ``changes`` override any field."""
        base = cls(
            interval=DEFAULT_INTERVAL,
            mtbf=reference_mtbf(gpus),
            gpus=gpus,
            price_per_gpu_hour=DEFAULT_PRICE_PER_GPU_HOUR,
        )
        return replace(base, **changes)

    def with_gpus(self, workload: Workload | None) -> int:
        return self.gpus or (workload.gpus if workload else 1)

    def costs(self, stall: float, restart: float, gpus: int) -> dict[str, Any]:
        """:meth:`CostModel.report` of a stall of ``stall`` seconds per checkpoint."""
        return CostModel(
            stall,
            interval=self.interval,
            gpus=gpus,
            price_per_gpu_hour=self.price_per_gpu_hour,
            mtbf=self.mtbf,
            restart_seconds=restart,
        ).report()


def restart_time(c: Conditions, restore: float | None, basis: str) -> dict[str, Any]:
    """How the restart time of a target is made: the one ``c`` gives, or ``c``'s overhead +
    ``restore`` (None: no read side known: the overhead only); ``basis`` says how the restore
    was made."""
    if c.restart_seconds is not None:
        return {
            "restart_seconds": c.restart_seconds,
            "restart_basis": "given (--restart)",
            "restart_overhead_seconds": None,
        }
    if restore is None:
        return {
            "restart_seconds": c.restart_overhead,
            "restart_overhead_seconds": c.restart_overhead,
            "restart_basis": "fixed overhead only: no read side given (--read-bandwidth with --size)",
        }
    return {
        "restart_seconds": c.restart_overhead + restore,
        "restart_overhead_seconds": c.restart_overhead,
        "restart_basis": f"fixed overhead + restore ({basis})",
    }


def _saving(c: Conditions, write: float, snapshot: float | None) -> dict[str, Any]:
    """The stall of a save that writes for ``write`` seconds: that write (blocking), or the
    ``snapshot`` plus the backpressure of the background write (async)."""
    out: dict[str, Any] = {
        "async_save": c.async_save,
        "blocking_stall_seconds": write,
        "async_fits_interval": write <= c.interval,
    }
    if snapshot is not None:
        out.update(
            snapshot_seconds=snapshot,
            snapshot_bandwidth=c.snapshot_bandwidth,
            async_stall_seconds=snapshot + backpressure(write, c.interval),
        )
    out["stall_seconds"] = out["async_stall_seconds"] if c.async_save else write
    return out


def project(
    workload: Workload,
    profile: Profile,
    conditions: Conditions | None = None,
    *,
    local: Profile | None = None,
) -> dict[str, Any]:
    """The model's answer for one target: ``workload`` saved on the storage ``profile`` under
    ``conditions`` (default :class:`Conditions`'s), or, with ``local`` (a fast tier's
    profile), saved there and drained to ``profile`` (see the module docstring).

    JSON-able: ``write_seconds`` and ``binding`` (the limit that binds the write, in words in
    ``binding_detail``), ``restore_seconds`` and ``restart_seconds``, ``stall_seconds`` (what
    the GPUs wait per checkpoint: the write, or an async save's snapshot, with backpressure),
    and :meth:`CostModel.report`'s figures for that stall (``stall_*``, ``rework_*``,
    ``restart_*``, ``lost_*``). Every figure is a projection."""
    c = conditions or Conditions()
    if local is not None:
        return _project_tiered(workload, profile, local, c)
    kw: dict[str, Any] = dict(streams=c.streams, part_size=c.part_size)
    w = estimate(workload, profile, phase="write", **kw)
    r = estimate(workload, profile, phase="restore", **kw)
    saving = _saving(c, w.seconds, workload.bytes_per_rank / c.snapshot_bandwidth)
    restart = restart_time(c, r.seconds, f"projected: {r.binding} binds")
    return {
        "target": profile.name,
        "kind": "projected",
        "profile": profile.as_dict(),
        "write": w.as_dict(),
        "read": r.as_dict(),
        "write_seconds": w.seconds,
        "read_seconds": r.seconds,
        "restore_seconds": r.seconds,
        "restore_binding": r.binding,
        "restore_binding_detail": r.binding_detail,
        **restart,
        "binding": w.binding,
        "binding_detail": w.binding_detail,
        "remedy": w.remedy,
        "drain_seconds": None,
        "drain_fits_interval": None,
        **saving,
        **c.costs(saving["stall_seconds"], restart["restart_seconds"], c.with_gpus(workload)),
    }


def _times(w: Workload, factor: int) -> Workload:
    """``w`` with each node holding ``factor`` times its bytes and objects (a node's own step
    and the peer copies it holds)."""
    return replace(
        w,
        total_bytes=w.total_bytes * factor,
        bytes_per_rank=w.bytes_per_rank * factor,
        objects_per_rank=w.objects_per_rank * factor,
    )


def _peers(
    workload: Workload,
    durable: Profile,
    local: Profile,
    c: Conditions,
    kw: dict[str, Any],
    fast_r: PhaseEstimate,
    save: float,
) -> dict[str, Any]:
    """The peer copies of a tiered target (``c.peers`` > 0; see the module docstring):
    :func:`ckptio.peermodel.peer_figures` of the fast tier's times it needs: the ``k``
    copies written and the step read (the replication), and the ``1 + f`` steps a surviving
    peer reads (its own and the copies it sends)."""
    k = c.peers
    f, f_source = peer_fan_in(workload, c)
    written = estimate(_times(workload, k), local, phase="write", **kw).seconds
    peer_read = estimate(_times(workload, 1 + f), local, phase="restore", **kw).seconds
    return peer_figures(
        c,
        durable,
        local.name,
        workload.node_bytes,
        written + fast_r.seconds,
        peer_read,
        save,
        (f, f_source),
    )


def peer_fan_in(workload: Workload, c: Conditions) -> tuple[int, str]:
    """The fan-in of the peer restore (``c.peers`` > 0) and where it comes from:
    ``c.peer_fan_in`` where given, else the restore planner's on the job's ring (its nodes:
    the GPUs over ``ranks_per_node``) when ``c.peers`` neighbouring nodes are lost at once,
    the most a copy of each survives (:func:`ckptio.checkpoint.peer_plan.ring_fan_in`, the worst
    placement; fewer nodes lost are served no worse)."""
    from ckptio.checkpoint.peer_plan import ring_fan_in

    if c.peer_fan_in is not None:
        return c.peer_fan_in, "given (--peer-fan-in)"
    gpus = c.gpus or workload.gpus
    per_node = min(workload.ranks_per_node, gpus)
    nodes = -(-gpus // per_node)
    if c.peers >= nodes:
        raise errors.InvalidArgumentError(
            f"peers={c.peers}: a copy goes to each of {c.peers} other nodes, and the job has "
            f"{nodes} node(s) ({gpus} GPUs, {per_node} a node)"
        )
    ring = ring_fan_in(nodes, per_node, c.peers, c.peers)
    return ring.fan_in, ring.source()


def _project_tiered(
    workload: Workload, durable: Profile, local: Profile, c: Conditions
) -> dict[str, Any]:
    """One tiered target: ``durable`` drained from ``local``, with ``c.peers`` peer copies of
    the fast tier (see the module docstring)."""
    kw: dict[str, Any] = dict(streams=c.streams, part_size=c.part_size)
    fast_w = estimate(workload, local, phase="write", **kw)
    fast_r = estimate(workload, local, phase="read", **kw)  # the drain's read
    fast_restore = estimate(workload, local, phase="restore", **kw)
    durable_w = estimate(workload, durable, phase="write", **kw)
    durable_r = estimate(workload, durable, phase="restore", **kw)
    drain = max(durable_w.seconds, fast_r.seconds)
    drain_binding = (
        f"{durable.name} write: {durable_w.binding}"
        if durable_w.seconds >= fast_r.seconds
        else f"{local.name} read: {fast_r.binding}"
    )
    p = c.p_lose_node
    peers: dict[str, Any] = {}
    if c.peers == 0:
        restore = (1 - p) * fast_restore.seconds + p * durable_r.seconds
        binds = (
            durable_r if p * durable_r.seconds >= (1 - p) * fast_restore.seconds else fast_restore
        )
        basis = f"expected: {1 - p:.0%} from {local.name}, {p:.0%} from {durable.name}"
        binding, binding_detail = binds.binding, binds.binding_detail
    else:
        peers = _peers(workload, durable, local, c, kw, fast_r, fast_w.seconds)
        # a failure that loses more nodes at once than there are copies is taken to lose
        # every copy of one of them (the worst placement: neighbours on the ring): the
        # durable tier; a restorer reads a peer only where that is faster than the durable tier
        gone = c.p_lose_another**c.peers
        peer_path = min(peers["restore_peer_seconds"], durable_r.seconds)
        shares = {"fast": 1 - p, "peer": p * (1 - gone), "durable": p * gone}
        parts = {
            "fast": shares["fast"] * fast_restore.seconds,
            "peer": shares["peer"] * peer_path,
            "durable": shares["durable"] * durable_r.seconds,
        }
        # the durable read, less what the peer copies save where one survives: written so
        # that a copy more never adds time, not even a rounding error
        saved = (1 - gone) * (durable_r.seconds - peer_path)
        restore = shares["fast"] * fast_restore.seconds + p * (durable_r.seconds - saved)
        most = max(parts, key=lambda t: parts[t])
        if most == "peer" and peers["restore_peer_seconds"] <= durable_r.seconds:
            binding = peers["restore_peer_binding"]
            binding_detail = f"peer copy: {binding} — {peers['restore_peer_detail']}"
        else:
            binds = fast_restore if most == "fast" else durable_r
            binding, binding_detail = binds.binding, binds.binding_detail
        basis = (
            f"expected: {shares['fast']:.0%} from {local.name}, {shares['peer']:.0%} from a "
            f"peer's copy, {shares['durable']:.1%} from {durable.name}"
        )
        peers.update(
            restore_fast_probability=shares["fast"],
            restore_peer_probability=shares["peer"],
            restore_durable_probability=shares["durable"],
            peer_slower_than_durable=peers["restore_peer_seconds"] > durable_r.seconds,
        )
    restart = restart_time(c, restore, basis)
    wait = backpressure(drain, c.interval, c.persist_every)
    saving = _saving(c, fast_w.seconds, workload.bytes_per_rank / c.snapshot_bandwidth)
    saving["stall_seconds"] += wait + peers.get("replication_wait_seconds", 0.0)
    from ckptio.tierbench import peer_suffix  # the targets' names, as compare spells them

    return {
        "target": f"{durable.name}+{local.name}{peer_suffix(c.peers)}",
        "kind": "projected",
        "tiers": {"durable": durable.name, "local": local.name},
        "profile": durable.as_dict(),
        "local_profile": local.as_dict(),
        "write": fast_w.as_dict(),
        "read": fast_restore.as_dict(),
        "write_seconds": fast_w.seconds,
        "read_seconds": fast_restore.seconds,
        "binding": fast_w.binding,
        "binding_detail": fast_w.binding_detail,
        "remedy": "",
        "drain_seconds": drain,
        "drain_binding": drain_binding,
        "drain_wait_seconds": wait,
        "persist_every": c.persist_every,
        "drain_fits_interval": drain <= c.persist_every * c.interval,
        "fast_only_window_seconds": (c.persist_every - 1) * c.interval + drain,
        "restore_fast_seconds": fast_restore.seconds,
        "restore_durable_seconds": durable_r.seconds,
        "p_lose_node": p,
        "p_lose_node_source": "assumption (DEFAULT_P_LOSE_NODE: Llama 3's hardware share of "
        "interruptions)"
        if p == DEFAULT_P_LOSE_NODE
        else "given (--p-lose-node)",
        **peers,
        "restore_seconds": restore,
        "restore_binding": binding,
        "restore_binding_detail": binding_detail,
        **restart,
        **saving,
        **c.costs(saving["stall_seconds"], restart["restart_seconds"], c.with_gpus(workload)),
    }


@dataclass(frozen=True, slots=True)
class Figures:
    """A checkpoint given by figures instead of a workload on a profile (``ckptio model
    --checkpoint-seconds`` / ``--size --write-bandwidth``)."""

    checkpoint_seconds: float | None = None
    """The write time of one checkpoint, seconds."""
    size: int | None = None
    """Bytes of one checkpoint."""
    write_bandwidths: tuple[float, ...] = ()
    """Bytes/s; one target per bandwidth (with ``size``)."""
    read_bandwidth: float | None = None
    """Bytes/s of the restore (with ``size``)."""
    writing_ranks: int | None = None
    """Ranks sharing ``size`` for an async save's snapshot (None: all GPUs)."""


def _given_targets(f: Figures, c: Conditions, gpus: int) -> list[dict[str, Any]]:
    """One target per figure given: the write time, or ``size`` at each bandwidth."""
    given: list[tuple[str, float, float | None]] = []  # (target, write seconds, bandwidth)
    if f.checkpoint_seconds is not None:
        given = [("given figures", f.checkpoint_seconds, None)]
    elif f.size is not None:
        given = [(human_rate(bw), f.size / bw, bw) for bw in f.write_bandwidths]
    snapshot = None
    if c.async_save and math.isinf(c.snapshot_bandwidth):
        snapshot = 0.0  # an instant snapshot, whatever the size
    elif c.async_save:
        if f.size is None:
            raise errors.InvalidArgumentError(
                "--async-save with --checkpoint-seconds needs --size: the stall is the "
                "snapshot, each GPU's share of the size at --snapshot-bandwidth"
            )
        snapshot = f.size / (f.writing_ranks or gpus) / c.snapshot_bandwidth
    restore = f.size / f.read_bandwidth if f.size is not None and f.read_bandwidth else None
    restart = restart_time(c, restore, "size / read bandwidth")
    targets = []
    for name, write_seconds, bw in given:
        saving = _saving(c, write_seconds, snapshot)
        entry: dict[str, Any] = {
            "target": name,
            "kind": "given",
            "write_seconds": write_seconds,
            "restore_seconds": restore,
            "restore_binding": "read bandwidth (given)" if restore is not None else None,
            **restart,
            **saving,
            **c.costs(saving["stall_seconds"], restart["restart_seconds"], gpus),
        }
        if f.size is not None:
            entry["checkpoint_bytes"] = f.size
        if bw is not None:
            entry["write_bandwidth"] = bw
        targets.append(entry)
    return targets


def evaluate(
    *,
    workload: Workload | None = None,
    profiles: Sequence[Profile] = (),
    figures: Figures | None = None,
    conditions: Conditions | None = None,
    local: Profile | None = None,
    gpus_from: str | None = None,
    measured: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The model's answer as JSON-able data (``ckptio model``).

    Give either ``figures`` (the write time, or a size with one or several bandwidths: one
    target per bandwidth), or a ``workload`` with ``profiles`` (one target per profile,
    :func:`project`; with ``local``, a fast tier's profile, each also gets a tiered target
    drained to it, ``<profile>+<local>``, after its own). The result has one entry per target
    under ``targets`` and, at the top level, the first projected target's figures. Every
    figure derived from a profile is a projection.

    GPUs: ``conditions.gpus``, else the workload's, else 1; ``gpus_from`` says which
    (``given``, ``workload``, ``assumed``) and is in the result with ``gpus``. ``measured``:
    targets projected already (measured ones, with their intervals or their refusal:
    :func:`ckptio.calibration.project_rounds`), put first.
    """
    c = conditions or Conditions()
    gpus = c.with_gpus(workload)
    if gpus_from is None:
        gpus_from = "given" if c.gpus else "workload" if workload else "assumed"
    c = replace(c, gpus=gpus)
    targets: list[dict[str, Any]] = [dict(m) for m in measured]
    if figures is not None and (
        figures.checkpoint_seconds is not None or (figures.size and figures.write_bandwidths)
    ):
        targets = _given_targets(figures, c, gpus)
    elif workload is not None and (profiles or targets):
        for prof in profiles:
            targets.append(project(workload, prof, c))
            if local is not None:  # tiered, then with its peer copies (c.peers) beside it
                targets.append(project(workload, prof, replace(c, peers=0), local=local))
                if c.peers:
                    targets.append(project(workload, prof, c, local=local))
    else:
        raise errors.InvalidArgumentError(
            "model needs figures (--checkpoint-seconds, or --size with --write-bandwidth) or a "
            "workload (--preset/--size with --profile, or --from RESULTS)"
        )
    out: dict[str, Any] = {}
    if workload is not None:
        out["workload"] = asdict(workload)
    shown = next((t for t in targets if "refusal" not in t), targets[0])
    out.update(
        {k: v for k, v in shown.items() if k not in ("profile", "local_profile", "write", "read")}
    )
    out["gpus"] = gpus
    out["gpus_from"] = gpus_from
    out["targets"] = targets
    return out


#: Objects each rank writes at once in projections: what ckptio's runner does by default
#: (``--inflight 2``), so a projection and a run of the same plan describe the same client.
DEFAULT_OBJECT_CONCURRENCY = 2


def preset_workload(
    preset: str,
    *,
    gpus: int | None = None,
    ranks_per_node: int = 8,
    prefixes: int = 1,
    object_concurrency: int = DEFAULT_OBJECT_CONCURRENCY,
) -> Workload:
    """A full-scale :class:`Workload` for a :mod:`ckptio.workload` preset."""
    from ckptio import workload as wl

    kwargs: dict[str, Any] = {}
    if gpus:
        kwargs["gpus"] = gpus
    plan = wl.make_plan(preset, **kwargs)
    return Workload.from_plan(
        plan,
        ranks_per_node=ranks_per_node,
        prefixes=prefixes,
        object_concurrency=object_concurrency,
    )
