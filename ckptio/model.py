"""Why a checkpoint stalls, and what it costs: the stall, cost and interval model.

Units: bytes, seconds, bandwidth in bytes/s (GB/s = 1e9 bytes/s), rates in requests/s.

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
- metadata: ``objects_per_stream * 2 * metadata_latency + metadata_latency`` (create and commit
  of each object, then the manifest), before and after the data, so it adds.

The data phase takes as long as the slowest of (stream path, node link, aggregate, rate,
CPU); metadata adds. The *binding* limit is the slowest one; the attribution splits the total
into the parts on the critical path (their ``contribution_seconds`` sum to the total) and
shows, for every other limit, the time it alone would need (its ``seconds``) — the slack.

**Cost.** With a checkpoint every ``interval`` seconds (wall clock, start to start) and a
blocking save, the GPUs idle ``checkpoint_seconds / interval`` of the time
(``idle_fraction``); idle GPU-hours per day = ``gpus * 24 * idle_fraction``. With an
asynchronous save they idle only for the snapshot (device -> host copy): ``snapshot_seconds``.

**Interval.** Young (1974): ``tau = sqrt(2 * delta * M)``. Daly (2006, the higher-order form
LLNL SCR's ``scr_ckpt_interval.py`` uses): ``tau = sqrt(2 delta M) * (1 + sqrt(delta/2M)/3 +
(delta/2M)/9) - delta`` for ``delta < 2M``, else ``M``. Total overhead at an interval follows
Daly's expected wall time ``T_w = M e^(R/M) (e^((tau+delta)/M) - 1) T_s / tau`` (checkpoints
+ lost work + restarts): ``overhead = T_w / T_s - 1``. ``tau`` is compute time between
checkpoints; ``delta`` the stall per checkpoint; ``M`` the mean time between failures of the
job; ``R`` the restart time.

**Restart.** Unless a restart time is given, ``R = fixed overhead + restore time``: the
overhead (:data:`DEFAULT_RESTART_OVERHEAD`, an assumption) covers rescheduling, process start
and warm-up; the restore is the read of the whole checkpoint back from the storage, projected
like the write from the profile's read side (read request rate; the bandwidth and latency
figures are shared by both directions) as ckptio's reader does it (``estimate(phase=
"restore")``: the steps listed and the manifest read first, a size check of each object
before its data, :data:`RESTORE_READERS` objects in flight per rank), or ``size / read
bandwidth`` when figures are given. The restore reads each writing rank's bytes once, as written (ranks
holding replicas of them are assumed to get them from a peer; their reads are not counted).
``R`` enters Daly's overhead and the cost, and the share of wall time
the GPUs idle restarting, ``R / M`` (``idle_fraction_with_restarts = idle_fraction + R / M``).
Daly's optimal interval does not depend on ``R`` (it scales ``T_w`` by ``e^(R/M)`` only).

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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptio import errors
from ckptio.profiles import Profile
from ckptio.units import (
    human_rate,
    human_seconds,
    human_size,
)

__all__ = [
    "DEFAULT_CLIENT_CPU_BANDWIDTH",
    "DEFAULT_OBJECT_CONCURRENCY",
    "DEFAULT_P_LOSE_NODE",
    "DEFAULT_RESTART_OVERHEAD",
    "DEFAULT_SNAPSHOT_BANDWIDTH",
    "LIMITS",
    "Calibration",
    "CostModel",
    "Limit",
    "PhaseEstimate",
    "Workload",
    "calibrate",
    "calibrate_results",
    "cost_curve",
    "daly_interval",
    "estimate",
    "evaluate",
    "fit_latency_bandwidth",
    "overhead_fraction",
    "preset_workload",
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
#: Metadata operations in series before a restore reads data: list the steps, then the
#: manifest's size twice (the newest complete step, then the read), before its GET.
RESTORE_PREAMBLE_OPS = 3

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
    request in series), and a size check of each object (one metadata operation) before its
    first read).

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
    # a restore lists the steps and reads the manifest first, and checks each object's size
    meta_ops = {"write": 2, "read": 0, "restore": 1}[phase]
    t_meta = groups * meta_ops * meta + (RESTORE_PREAMBLE_OPS * meta + lat if restore else meta)

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
        "metadata": f"{groups * meta_ops + (RESTORE_PREAMBLE_OPS if restore else 1)} "
        f"operations in series {X} {human_seconds(meta)}",
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


# -- cost and interval -----------------------------------------------------------------------


def young_interval(checkpoint_seconds: float, mtbf: float) -> float:
    """Young (1974): ``sqrt(2 * delta * M)`` seconds of compute between checkpoints."""
    return math.sqrt(2 * checkpoint_seconds * mtbf)


def daly_interval(checkpoint_seconds: float, mtbf: float) -> float:
    """Daly (2006), higher-order optimum: seconds of compute between checkpoints."""
    d, m = checkpoint_seconds, mtbf
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def overhead_fraction(
    interval: float, checkpoint_seconds: float, mtbf: float, restart_seconds: float
) -> float:
    """Expected wall time lost per unit of useful compute (checkpoints + lost work +
    restarts), Daly's model: ``M e^(R/M) (e^((tau+delta)/M) - 1) / tau - 1``."""
    tau, d, m, r = interval, checkpoint_seconds, mtbf, restart_seconds
    if tau <= 0:
        return math.inf
    if math.isinf(m):
        return d / tau
    try:
        return m * math.exp(r / m) * math.expm1((tau + d) / m) / tau - 1
    except OverflowError:
        return math.inf


@dataclass(frozen=True, slots=True)
class CostModel:
    """What a stall of ``checkpoint_seconds`` every ``interval`` seconds costs."""

    checkpoint_seconds: float
    """GPU stall per checkpoint: the write time (blocking save) or the snapshot time (async)."""
    interval: float = 7200.0
    """Seconds between checkpoint starts (wall clock)."""
    gpus: int = 1
    price_per_gpu_hour: float = 0.0
    mtbf: float = math.inf
    """Mean time between failures of the whole job, seconds."""
    restart_seconds: float = 0.0
    """Idle time of one restart after a failure (overhead + restore)."""

    def report(self) -> dict[str, Any]:
        """JSON-able figures: ``checkpoint_seconds``, ``idle_fraction``, idle GPU-hours and
        cost per day, Young's and Daly's intervals and the total overhead at the chosen and at
        the optimal interval (``None`` where an MTBF is needed and not given)."""
        d, t = self.checkpoint_seconds, self.interval
        idle = min(1.0, d / t) if t > 0 else 1.0
        idle_h = self.gpus * 24 * idle
        out: dict[str, Any] = {
            "checkpoint_seconds": d,
            "interval_seconds": t,
            "idle_fraction": idle,
            "idle_seconds_per_interval": min(d, t),
            "gpus": self.gpus,
            "idle_gpu_hours_per_day": idle_h,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "idle_cost_per_day": idle_h * self.price_per_gpu_hour,
            "mtbf_seconds": None if math.isinf(self.mtbf) else self.mtbf,
            "restart_seconds": self.restart_seconds,
            "young_interval_seconds": None,
            "daly_interval_seconds": None,
            "overhead_at_interval": None,
            "overhead_at_optimum": None,
            "optimum_interval_seconds": None,
            "restart_fraction": None,
            "idle_fraction_with_restarts": None,
            "idle_gpu_hours_per_day_with_restarts": None,
            "idle_cost_per_day_with_restarts": None,
        }
        if not math.isinf(self.mtbf):
            restarting = self.restart_seconds / self.mtbf  # idle restarting, per second of wall
            with_restarts = min(1.0, idle + restarting)
            out.update(
                restart_fraction=restarting,
                idle_fraction_with_restarts=with_restarts,
                idle_gpu_hours_per_day_with_restarts=self.gpus * 24 * with_restarts,
                idle_cost_per_day_with_restarts=self.gpus
                * 24
                * with_restarts
                * self.price_per_gpu_hour,
            )
            young = young_interval(d, self.mtbf)
            daly = daly_interval(d, self.mtbf)
            compute = max(t - d, 1e-9)  # compute between checkpoints at the chosen interval
            out.update(
                young_interval_seconds=young,
                daly_interval_seconds=daly,
                optimum_interval_seconds=daly + d,
                overhead_at_interval=overhead_fraction(compute, d, self.mtbf, self.restart_seconds),
                overhead_at_optimum=overhead_fraction(daly, d, self.mtbf, self.restart_seconds),
            )
        return out


def cost_curve(
    checkpoint_seconds: float,
    intervals: list[float],
    *,
    gpus: int,
    price_per_gpu_hour: float,
    mtbf: float = math.inf,
    restart_seconds: float = 0.0,
) -> list[dict[str, float]]:
    """Idle GPU-hours and cost per day at each interval (seconds, start to start); with an MTBF
    the lost work and restarts are included (Daly's overhead), else only the stall."""
    rows = []
    for t in intervals:
        if math.isinf(mtbf):
            frac = min(1.0, checkpoint_seconds / t)
        else:
            over = overhead_fraction(
                max(t - checkpoint_seconds, 1e-9), checkpoint_seconds, mtbf, restart_seconds
            )
            frac = over / (1 + over)  # share of wall time not spent on useful compute
        hours = gpus * 24 * frac
        rows.append(
            {
                "interval_seconds": t,
                "lost_fraction": frac,
                "idle_gpu_hours_per_day": hours,
                "cost_per_day": hours * price_per_gpu_hour,
            }
        )
    return rows


# -- calibration -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Calibration:
    """Figures of a measured target, fitted from request records (see :func:`calibrate`)."""

    target: str
    request_latency: float
    stream_bandwidth: float
    aggregate_bandwidth: float
    streams: int
    part_size: int
    requests: int
    emulated: bool = False
    mock: bool = False
    notes: list[str] = field(default_factory=list)
    read_request_latency: float | None = None
    """The read side, fitted from the read phase's GETs as the write side is from its writes
    (None: no reads measured; the profile's reads then use the write side's figures)."""
    read_stream_bandwidth: float | None = None
    read_node_bandwidth: float | None = None
    """The highest ``read_GBps`` of the runs (bytes/s)."""
    read_requests: int = 0

    def as_profile(self, *, name: str | None = None) -> Profile:
        """A :class:`Profile` with the fitted figures. The run's throughput becomes the node
        link (the run was on one node); what one node cannot measure (aggregate, request-rate
        limits) is unbounded and says so."""
        from ckptio.profiles import Figure

        src = f"fitted from measured requests of {self.target} ({self.requests} requests)"
        if self.emulated:
            src += " — emulated target"
        if self.mock:
            src += " — mock target, not a performance figure"
        unmeasured = "not measurable from one node's run (assumption: unbounded)"
        figures = {
            "request_latency": Figure(max(self.request_latency, 1e-6), src),
            "stream_bandwidth": Figure(self.stream_bandwidth, src),
            # a run on one node measures that node's path to the storage, not the aggregate
            "node_bandwidth": Figure(
                self.aggregate_bandwidth, src + " (the highest throughput seen from one node)"
            ),
            "aggregate_bandwidth": Figure(math.inf, unmeasured),
            "write_request_rate": Figure(math.inf, unmeasured),
            "read_request_rate": Figure(math.inf, unmeasured),
            "metadata_latency": Figure(
                max(self.request_latency, 1e-6), src + " (assumption: as request_latency)"
            ),
        }
        if self.read_stream_bandwidth is not None:
            rsrc = src.replace(f"({self.requests} requests)", f"({self.read_requests} reads)")
            figures["read_request_latency"] = Figure(
                max(self.read_request_latency or 0.0, 1e-6), rsrc
            )
            figures["read_stream_bandwidth"] = Figure(self.read_stream_bandwidth, rsrc)
            if self.read_node_bandwidth:
                figures["read_node_bandwidth"] = Figure(
                    self.read_node_bandwidth, rsrc + " (the highest read throughput seen)"
                )
        return Profile(
            name=name or f"measured:{self.target}",
            title=f"fitted from {self.target}",
            kind="object",
            figures=figures,
            streams=self.streams,
            part_size=self.part_size,
            rate_scope="none",
            throttle="",
            sources={"streams": src, "part_size": src},
        )


def fit_latency_bandwidth(nbytes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Least-squares fit of ``seconds = latency + nbytes / bandwidth`` over requests.

    Returns ``(latency seconds >= 0, bandwidth bytes/s)``. Requests of one size seen several
    times are fitted by that size's lower quartile: a busy machine (other work, scheduling)
    only adds time to a request, and a few slow ones would tilt a least-squares line. With one
    request size only, the latency cannot be told from bandwidth: it is taken as the fastest
    request's time minus its transfer at the median bandwidth, at least 0.
    """
    import numpy as np

    x = np.asarray(nbytes, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if len(x) == 0:
        raise errors.InvalidArgumentError("no requests with data to fit")
    sizes, inverse = np.unique(x, return_inverse=True)
    if len(sizes) > 1 and len(sizes) < len(x):
        y_low = np.array([np.quantile(y[inverse == i], 0.25) for i in range(len(sizes))])
        if np.ptp(sizes) > 0.1 * max(sizes.max(), 1):
            slope, intercept = np.polyfit(sizes, y_low, 1)
            if slope > 0:
                return max(float(intercept), 0.0), float(1 / slope)
    if np.ptp(x) > 0.1 * max(x.max(), 1):
        slope, intercept = np.polyfit(x, y, 1)
        if slope > 0:
            return max(float(intercept), 0.0), float(1 / slope)
    bw = float(np.median(x / np.maximum(y, 1e-9)))
    return max(float(y.min() - np.median(x) / bw), 0.0), bw


# -- one call for the CLI and the report -----------------------------------------------------

#: Device -> host copy rate per GPU for an asynchronous save's snapshot (bytes/s).
#: Assumption: ~25 GB/s, a PCIe Gen4 x16 link in practice (Gen5 doubles it).
DEFAULT_SNAPSHOT_BANDWIDTH = 25e9

#: Seconds of a restart besides reading the checkpoint back: reschedule, start the processes,
#: initialise the job, warm up. Assumption: 5 minutes (no published figure fits every cluster).
DEFAULT_RESTART_OVERHEAD = 300.0


#: Probability that a failure loses a node's fast tier (the node is replaced). Assumption: 0.78,
#: the share of unexpected interruptions that the Llama 3 paper (arXiv 2407.21783, section
#: 3.3.4) attributes to confirmed or suspected hardware issues, taken as node replacements.
DEFAULT_P_LOSE_NODE = 0.78


def _tiered_target(
    workload: Workload,
    durable: Profile,
    local: Profile,
    *,
    streams: int | None,
    part_size: int | None,
    persist_every: int,
    p_lose_node: float,
    interval: float,
    async_save: bool,
    snapshot: float,
    restart_seconds: float | None,
    restart_overhead: float,
    cost_kw: Mapping[str, Any],
) -> dict[str, Any]:
    """One tiered target: ``durable`` drained from ``local`` (see the module docstring)."""
    kw: dict[str, Any] = dict(streams=streams, part_size=part_size)
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
    restore = (1 - p_lose_node) * fast_restore.seconds + p_lose_node * durable_r.seconds
    binds = (
        durable_r
        if p_lose_node * durable_r.seconds >= (1 - p_lose_node) * fast_restore.seconds
        else fast_restore
    )
    restart = _restart(
        restart_seconds,
        restart_overhead,
        restore,
        f"expected: {1 - p_lose_node:.0%} from {local.name}, {p_lose_node:.0%} from {durable.name}",
    )
    stall = fast_w.seconds
    cost = CostModel(
        snapshot if async_save else stall, restart_seconds=restart["restart_seconds"], **cost_kw
    ).report()
    return {
        "target": f"{durable.name}+{local.name}",
        "kind": "projected",
        "tiers": {"durable": durable.name, "local": local.name},
        "profile": durable.as_dict(),
        "local_profile": local.as_dict(),
        "write": fast_w.as_dict(),
        "read": fast_restore.as_dict(),
        "write_seconds": stall,
        "read_seconds": fast_restore.seconds,
        "binding": fast_w.binding,
        "binding_detail": fast_w.binding_detail,
        "drain_seconds": drain,
        "drain_binding": drain_binding,
        "persist_every": persist_every,
        "drain_fits_interval": drain <= persist_every * interval,
        "fast_only_window_seconds": (persist_every - 1) * interval + drain,
        "restore_fast_seconds": fast_restore.seconds,
        "restore_durable_seconds": durable_r.seconds,
        "p_lose_node": p_lose_node,
        "p_lose_node_source": "assumption (DEFAULT_P_LOSE_NODE: Llama 3's hardware share of "
        "interruptions)"
        if p_lose_node == DEFAULT_P_LOSE_NODE
        else "given (--p-lose-node)",
        "restore_seconds": restore,
        "restore_binding": binds.binding,
        "restore_binding_detail": binds.binding_detail,
        **restart,
        "async_save": async_save,
        "blocking_stall_seconds": stall,
        "snapshot_seconds": snapshot,
        "snapshot_bandwidth": cost_kw.get("snapshot_bandwidth"),
        "async_fits_interval": stall <= interval,
        **cost,
    }


def _restart(
    given: float | None, overhead: float, restore: float | None, basis: str
) -> dict[str, Any]:
    """How the restart time of a target is made: the given one, or overhead + restore."""
    if given is not None:
        return {
            "restart_seconds": given,
            "restart_basis": "given (--restart)",
            "restart_overhead_seconds": None,
        }
    if restore is None:
        return {
            "restart_seconds": overhead,
            "restart_overhead_seconds": overhead,
            "restart_basis": "fixed overhead only: no read side given (--read-bandwidth with --size)",
        }
    return {
        "restart_seconds": overhead + restore,
        "restart_overhead_seconds": overhead,
        "restart_basis": f"fixed overhead + restore ({basis})",
    }


def evaluate(
    *,
    profiles: list[Profile] | None = None,
    workload: Workload | None = None,
    checkpoint_seconds: float | None = None,
    size: int | None = None,
    write_bandwidth: float | Sequence[float] | None = None,
    interval: float = 7200.0,
    mtbf: float = math.inf,
    restart_seconds: float | None = None,
    restart_overhead: float = DEFAULT_RESTART_OVERHEAD,
    read_bandwidth: float | None = None,
    gpus: int | None = None,
    writing_ranks: int | None = None,
    gpus_from: str | None = None,
    price_per_gpu_hour: float = 0.0,
    streams: int | None = None,
    part_size: int | None = None,
    async_save: bool = False,
    snapshot_bandwidth: float = DEFAULT_SNAPSHOT_BANDWIDTH,
    local: Profile | None = None,
    persist_every: int = 1,
    p_lose_node: float = DEFAULT_P_LOSE_NODE,
) -> dict[str, Any]:
    """The model's answer as JSON-able data.

    Give either figures directly (``checkpoint_seconds``, or ``size`` with one or several
    ``write_bandwidth`` values: one target per bandwidth), or a ``workload`` with
    ``profiles``. ``restart_seconds`` None: each target's restart is ``restart_overhead`` +
    its restore time (projected from the profile's read side, or ``size / read_bandwidth``;
    see the module docstring), and its ``restore_binding`` names the limit of the restore.
    With ``local`` (a fast tier's profile), each profile also gets a tiered target drained to
    it (``<profile>+<local>``) after its own. The result has one entry per target under
    ``targets`` and, at the top level, the first target's figures (``checkpoint_seconds``,
    ``idle_fraction``, ``young_interval_seconds``, ``daly_interval_seconds``, ...). Every
    figure derived from a profile is a projection.

    GPUs: ``gpus``, else the workload's, else 1; ``gpus_from`` says which (``given``,
    ``workload``, ``assumed``) and is in the result with ``gpus``. With ``async_save`` the
    stall (``checkpoint_seconds``) is the snapshot: each GPU copies its share (``size`` over
    ``writing_ranks``, default all GPUs) at ``snapshot_bandwidth``; the write time stays in
    ``blocking_stall_seconds``, and ``async_fits_interval`` says whether the background write
    ends within the interval. Async save with figures given directly needs ``size``.
    """
    targets: list[dict[str, Any]] = []
    n_gpus = gpus or (workload.gpus if workload else 1)
    if gpus_from is None:
        gpus_from = "given" if gpus else "workload" if workload else "assumed"
    cost_kw: dict[str, Any] = dict(
        interval=interval, gpus=n_gpus, price_per_gpu_hour=price_per_gpu_hour, mtbf=mtbf
    )
    bandwidths = (
        []
        if write_bandwidth is None
        else [float(write_bandwidth)]
        if isinstance(write_bandwidth, int | float)
        else [float(b) for b in write_bandwidth]
    )
    given: list[tuple[str, float, float | None]] = []  # (target, write seconds, bandwidth)
    if checkpoint_seconds is not None:
        given = [("given figures", checkpoint_seconds, None)]
    elif size is not None and bandwidths:
        given = [(human_rate(bw), size / bw, bw) for bw in bandwidths]
    if given:
        snapshot = None
        if async_save and math.isinf(snapshot_bandwidth):
            snapshot = 0.0  # an instant snapshot, whatever the size
        elif async_save:
            if size is None:
                raise errors.InvalidArgumentError(
                    "--async-save with --checkpoint-seconds needs --size: the stall is the "
                    "snapshot, each GPU's share of the size at --snapshot-bandwidth"
                )
            snapshot = size / (writing_ranks or n_gpus) / snapshot_bandwidth
        restore = size / read_bandwidth if size is not None and read_bandwidth else None
        restart = _restart(restart_seconds, restart_overhead, restore, "size / read bandwidth")
        for name, write_seconds, bw in given:
            entry: dict[str, Any] = {
                "target": name,
                "kind": "given",
                "restore_seconds": restore,
                "restore_binding": "read bandwidth (given)" if restore is not None else None,
                **restart,
                **CostModel(
                    write_seconds if snapshot is None else snapshot,
                    restart_seconds=restart["restart_seconds"],
                    **cost_kw,
                ).report(),
            }
            entry.update(
                write_seconds=write_seconds,
                async_save=async_save,
                blocking_stall_seconds=write_seconds,
            )
            if snapshot is not None:
                entry.update(
                    snapshot_seconds=snapshot,
                    snapshot_bandwidth=snapshot_bandwidth,
                    async_fits_interval=write_seconds <= interval,
                )
            if size is not None:
                entry["checkpoint_bytes"] = size
            if bw is not None:
                entry["write_bandwidth"] = bw
            targets.append(entry)
    elif workload is not None and profiles:
        for prof in profiles:
            w = estimate(workload, prof, phase="write", streams=streams, part_size=part_size)
            r = estimate(workload, prof, phase="restore", streams=streams, part_size=part_size)
            stall = w.seconds
            snapshot = workload.bytes_per_rank / snapshot_bandwidth
            restart = _restart(
                restart_seconds, restart_overhead, r.seconds, f"projected: {r.binding} binds"
            )
            cost = CostModel(
                snapshot if async_save else stall,
                restart_seconds=restart["restart_seconds"],
                **cost_kw,
            ).report()
            targets.append(
                {
                    "target": prof.name,
                    "kind": "projected",
                    "profile": prof.as_dict(),
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
                    "async_save": async_save,
                    "blocking_stall_seconds": stall,
                    "snapshot_seconds": snapshot,
                    "snapshot_bandwidth": snapshot_bandwidth,
                    "async_fits_interval": stall <= interval,
                    **cost,
                }
            )
            if local is not None:
                targets.append(
                    _tiered_target(
                        workload,
                        prof,
                        local,
                        streams=streams,
                        part_size=part_size,
                        persist_every=persist_every,
                        p_lose_node=p_lose_node,
                        interval=interval,
                        async_save=async_save,
                        snapshot=snapshot,
                        restart_seconds=restart_seconds,
                        restart_overhead=restart_overhead,
                        cost_kw=cost_kw,
                    )
                )
    else:
        raise errors.InvalidArgumentError(
            "model needs figures (--checkpoint-seconds, or --size with --write-bandwidth) or a "
            "workload (--preset/--size with --profile, or --from RESULTS)"
        )
    out: dict[str, Any] = {}
    if workload is not None:
        out["workload"] = asdict(workload)
    out.update(
        {
            k: v
            for k, v in targets[0].items()
            if k not in ("profile", "local_profile", "write", "read")
        }
    )
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


def calibrate(requests: Any, runs: Any) -> list[Calibration]:
    """Fit per-stream bandwidth, request latency and aggregate bandwidth of each measured
    target from result tables (pyarrow tables of the results schema, :mod:`ckptio.results`).

    Per target: data requests of the write phase that succeeded are fitted as ``seconds =
    latency + nbytes / stream_bandwidth``; the aggregate is the highest ``write_GBps`` of its
    runs; ``streams`` the most streams used; ``part_size`` the median request size. The read
    side likewise, where the runs read: the read phase's GETs give ``read_request_latency``
    and ``read_stream_bandwidth``, the highest ``read_GBps`` the ``read_node_bandwidth``.
    """
    import numpy as np

    req = requests.to_pylist() if hasattr(requests, "to_pylist") else list(requests)
    run_rows = runs.to_pylist() if hasattr(runs, "to_pylist") else list(runs)
    out: list[Calibration] = []
    for target in sorted({r["target"] for r in run_rows}):
        rows = [
            r
            for r in req
            if r["target"] == target
            and r["phase"] == "write"
            and r["op"] in ("write", "put")
            and r["outcome"] == "ok"
            and r["nbytes"] > 0
        ]
        mine = [r for r in run_rows if r["target"] == target]
        if not rows:
            continue
        lat, bw = fit_latency_bandwidth([r["nbytes"] for r in rows], [r["seconds"] for r in rows])
        agg = max((r.get("write_GBps") or 0.0) for r in mine) * 1e9
        streams = max(int(r.get("streams") or 1) for r in mine)
        notes = []
        if agg <= 0:
            agg = math.inf
            notes.append("no write throughput in the runs table; aggregate unbounded")
        reads = [
            r
            for r in req
            if r["target"] == target
            and r["phase"] == "read"
            and r["op"] == "get"
            and r["outcome"] == "ok"
            and r["nbytes"] > 0
        ]
        read_side: dict[str, Any] = {}
        if reads:
            rlat, rbw = fit_latency_bandwidth(
                [r["nbytes"] for r in reads], [r["seconds"] for r in reads]
            )
            rnode = max((r.get("read_GBps") or 0.0) for r in mine) * 1e9
            read_side = dict(
                read_request_latency=rlat,
                read_stream_bandwidth=rbw,
                read_node_bandwidth=rnode or None,
                read_requests=len(reads),
            )
        else:
            notes.append("no reads measured; the read side uses the write side's figures")
        out.append(
            Calibration(
                target=target,
                request_latency=lat,
                stream_bandwidth=bw,
                aggregate_bandwidth=agg,
                streams=max(1, streams),
                part_size=int(np.median([r["nbytes"] for r in rows])),
                requests=len(rows),
                emulated=any(bool(r.get("emulated")) for r in mine),
                mock=any(bool(r.get("mock")) for r in mine),
                notes=notes,
                **read_side,
            )
        )
    return out


def calibrate_results(paths: list[str]) -> list[Calibration]:
    """:func:`calibrate` over result files or directories (read with ckptio.results)."""
    from ckptio.results import read_results

    res = read_results(paths)
    cals = calibrate(res.requests, res.runs)
    if not cals:
        raise errors.InvalidArgumentError(
            f"no measured write requests in {', '.join(map(str, paths))} to fit a profile from"
        )
    return cals
