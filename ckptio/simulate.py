"""Full scale by simulation: every request of a checkpoint's plan, replayed in virtual time.

The model (:mod:`ckptio.stallmodel`) projects a checkpoint with closed-form limits: bandwidths, a
per-request latency, a request rate. At full scale the stall is set by the *slowest* rank, by
the tail of the request latency, by a prefix answering ``503 SlowDown`` past its request rate
and by the client's retries piling onto it, by a straggler node, by storage targets that some
files share, and, after a failure, by every rank reading at once. None of these is linear;
this module replays the plan of :mod:`ckptio.workload` request by request with SimPy (a
discrete-event library: processes, events, queues) to see them. What it prints is
**simulated**: a projection, never a measurement.

**The client** is the one the model describes (so that where the model is exact the two
agree; ``tests/test_simulate.py`` checks it within 5% at 8, 1,536 and 16,384 GPUs): ranks are
packed ``ranks_per_node`` to a node in the plan's order (Megatron's: a tensor-parallel group
per node); a node sends its data requests over ``streams`` connections (a SimPy process
each) that take the node's parts first come, first served; a rank writes
``object_concurrency`` objects at once (the runner's ``--inflight``) and reads
``restore_readers`` at once (:class:`~ckptio.checkpoint.CheckpointReader`'s ``readers``).
An object is created (one metadata request), its parts sent, then completed (another); the
save ends when every rank is done and the manifest is published (one more). A restore lists
the steps, checks the manifest's size twice and reads it (every reading rank: that is the
storm), then checks each object's size before reading its parts. Which ranks read: each
writing rank its own bytes (``readers="writers"``, what the model counts), or every rank
what it holds (``readers="all"``: data-parallel replicas read the same objects).

**A request** waits its latency (drawn from :class:`Latency`: a fixed value, a lognormal with
a given p99, or the residuals of measured requests) and sends its bytes at the stream's
bandwidth. Shared links (a node's link, the aggregate bandwidth, storage targets) are FIFO
pipes: a request's bytes leave a pipe at its capacity after those queued before them (the
Lindley recursion), and the request ends when the slowest of its stream and its pipes is
done. A pipe is work-conserving, so a saturated link drains at exactly its capacity and the
end of a phase is what fair sharing gives; the order within a saturated link is first come,
first served, so which rank ends last can differ from fair sharing. A pipe that cannot bind
(the streams behind it cannot fill it) is left out, which is exact.

**Throttling**: each prefix (the key's parent: one for the ``flat`` layout, 256 for
``hashed``, :func:`ckptio.format.shard_key`) has a token bucket per direction at the
profile's request rate, holding ``burst`` seconds of it (an assumption: S3 publishes the
rate, not the burst). A request that finds it empty is answered ``503 SlowDown`` after its
latency, and the client backs off as ckptio's :class:`~ckptio.store.RetryPolicy` does (the
same object: its ``delay`` and ``max_attempts``); after the last attempt the request fails,
the rank's save fails, and the checkpoint is counted as failed, its time the moment of that
first failure (the simulation of that checkpoint ends there). S3 splits a hot prefix in
minutes; no split happens within a simulated checkpoint.

**Not simulated**: the client's CPU (checksums, copies: the model's ``client CPU`` limit,
5.5 GB/s per rank, binds with none of the shipped profiles; where it would, the simulation is
optimistic), the page cache, and a prefix's split by the service.

**Identical nodes** are simulated once and weighted (their bytes count that many times on
shared pipes) when that is exact: no random input (fixed latencies, no throttling possible,
no storage targets). Otherwise every node is simulated. The result says which.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio.profiles import Profile, load_profile
from ckptio.stallmodel import (
    DEFAULT_OBJECT_CONCURRENCY,
    DEFAULT_P_LOSE_NODE,
    RESTORE_PREAMBLE_OPS,
    RESTORE_READERS,
    Conditions,
    Workload,
    project,
)
from ckptio.store import DEFAULT_RETRY_POLICY, RetryPolicy
from ckptio.units import human_seconds
from ckptio.workload import Plan, get_preset, make_plan

__all__ = [
    "LATENCY_KINDS",
    "PHASES",
    "READERS",
    "Bound",
    "Job",
    "Latency",
    "PhaseResult",
    "Simulation",
    "Storage",
    "fit_layout",
    "fit_storage",
    "median_interval",
    "parse_latency",
    "simulate",
]

LATENCY_KINDS = ("fixed", "lognormal", "empirical")
PHASES = ("save", "restore")
READERS = ("writers", "all")
PLACEMENTS = ("round-robin", "random")

#: The p99/p50 ratio of the default lognormal latency. Assumption: object-store latency is
#: roughly lognormal with a long tail (spiraldb.com, "So you want to use Object Storage",
#: 2025), and a p99 about 4x the median is what S3 users report (~100 ms warm, p99 above
#: 400 ms: llms3.com, "Tail latency on object storage").
DEFAULT_TAIL = 4.0
DEFAULT_LATENCY = f"lognormal:{DEFAULT_TAIL:g}"

#: Seconds of request rate a prefix absorbs at once (the token bucket's depth). Assumption:
#: S3 documents sustained rates per prefix, not a burst.
DEFAULT_BURST = 1.0

_Z99 = NormalDist().inv_cdf(0.99)
_STEP = 1  # the step whose keys the simulation names (any: only the prefix matters)
#: The prefix of the step itself: its listing and its manifest (data objects are under
#: ``data/``, or ``data/<2 hex>/`` in the ``hashed`` layout).
ROOT_PREFIX = "step root (listing, manifest)"


# -- the storage side --------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """A per-request latency distribution, in seconds."""

    kind: str
    """One of :data:`LATENCY_KINDS`."""
    median: float
    p99: float
    """For ``lognormal``: the 99th percentile (sets the tail); ``fixed``: the median."""
    samples: tuple[float, ...] = ()
    """``empirical``: the measured values it resamples (sorted)."""
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in LATENCY_KINDS:
            raise errors.InvalidArgumentError(
                f"latency kind {self.kind!r}; valid: {', '.join(LATENCY_KINDS)}"
            )
        if not (math.isfinite(self.median) and self.median >= 0):
            raise errors.InvalidArgumentError(f"latency median must be >= 0, got {self.median}")
        if self.kind == "lognormal" and not self.p99 >= self.median > 0:
            raise errors.InvalidArgumentError(
                f"lognormal latency needs p99 >= median > 0, got {self.p99} and {self.median}"
            )
        if self.kind == "empirical" and not self.samples:
            raise errors.InvalidArgumentError("empirical latency needs samples")

    @property
    def random(self) -> bool:
        return self.kind != "fixed" and self.p99 > self.median

    @property
    def minimum(self) -> float:
        """The least value a draw can take."""
        if self.kind == "fixed":
            return self.median
        if self.kind == "empirical":
            return self.samples[0]
        return 0.0

    def scaled(self, median: float) -> Latency:
        """The same shape with median ``median`` (metadata requests take the data requests'
        shape at the profile's metadata latency)."""
        k = median / self.median if self.median > 0 else 0.0
        return replace(
            self,
            median=median,
            p99=self.p99 * k if self.median > 0 else median,
            samples=tuple(s * k for s in self.samples),
        )

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed" or not self.random:
            return np.full(n, self.median)
        if self.kind == "lognormal":
            sigma = math.log(self.p99 / self.median) / _Z99
            return self.median * np.exp(sigma * rng.standard_normal(n))
        return rng.choice(np.asarray(self.samples), n)

    def describe(self) -> str:
        if self.kind == "fixed" or not self.random:
            return f"fixed {human_seconds(self.median)}"
        if self.kind == "lognormal":
            return (
                f"lognormal, p99 {self.p99 / self.median:.3g}x the median "
                f"({human_seconds(self.median)}, p99 {human_seconds(self.p99)})"
            )
        return (
            f"resampled from {len(self.samples)} measured "
            f"(median {human_seconds(self.median)}, p99 {human_seconds(self.p99)})"
        )


def parse_latency(text: str, median: float, *, source: str = "") -> Latency:
    """``fixed``, ``lognormal`` (p99 = :data:`DEFAULT_TAIL` x median) or ``lognormal:R`` (p99 =
    R x median, R >= 1) around ``median`` seconds."""
    kind, _, arg = str(text).strip().partition(":")
    if kind == "fixed" and not arg:
        return Latency("fixed", median, median, source=source)
    if kind == "lognormal":
        try:
            ratio = float(arg) if arg else DEFAULT_TAIL
        except ValueError:
            ratio = math.nan
        if not (math.isfinite(ratio) and 1 <= ratio <= 1e6):
            raise errors.InvalidArgumentError(
                f"latency {text!r}: the p99/p50 ratio must be a number from 1 to 1e6"
            )
        tail = "assumption: lognormal" + (
            f" with p99 = {ratio:g} x median" if arg else f" with p99 = {DEFAULT_TAIL:g} x median"
        )
        return Latency(
            "lognormal", median, median * ratio, source=f"{source}; {tail}" if source else tail
        )
    raise errors.InvalidArgumentError(
        f"latency {text!r}: expected fixed, lognormal or lognormal:RATIO (p99/p50, e.g. "
        f"lognormal:4), or fit one from measured requests (--from RESULTS)"
    )


@dataclass(frozen=True)
class Storage:
    """A storage description for the simulation: a profile's figures (bandwidths, request
    rates, its rate scope) and what the closed form has no room for.

    Build one with :meth:`from_profile` (a shipped or user profile) or :func:`fit_storage`
    (fitted from measured result files: latency distributions from the recorded requests)."""

    profile: Profile
    latency: Latency
    """Data requests that write (PUT part, write call)."""
    read_latency: Latency
    """Data requests that read (ranged GET, read call)."""
    metadata: Latency
    """Create, complete, size checks, listing, the manifest."""
    targets: int = 0
    """Storage targets (Lustre OSTs) the aggregate bandwidth is split over, each a FIFO pipe
    of ``aggregate / targets``; 0: not modelled (one aggregate pipe)."""
    stripe_count: int = 1
    stripe_size: int = 2**20
    placement: str = "round-robin"
    """How a file's first target is chosen: ``round-robin`` (Lustre's allocator while the
    targets are balanced) or ``random``."""
    burst: float = DEFAULT_BURST
    """Seconds of request rate a prefix absorbs at once."""
    retry: RetryPolicy = DEFAULT_RETRY_POLICY
    """The client's retry policy (ckptio's own by default)."""
    fitted_from: str = ""

    def __post_init__(self) -> None:
        if self.targets < 0 or self.stripe_count < 1 or self.stripe_size < 1:
            raise errors.InvalidArgumentError(
                "storage targets must be >= 0, stripe count and size >= 1"
            )
        if self.targets and math.isinf(self.profile.aggregate_bandwidth):
            raise errors.InvalidArgumentError(
                f"{self.profile.name}: storage targets split the aggregate bandwidth, which "
                "this profile leaves unbounded; give one (--set aggregate_bandwidth=...)"
            )
        if self.placement not in PLACEMENTS:
            raise errors.InvalidArgumentError(
                f"placement {self.placement!r}; valid: {', '.join(PLACEMENTS)}"
            )
        if not self.burst > 0:
            raise errors.InvalidArgumentError(f"burst must be > 0 seconds, got {self.burst}")

    @classmethod
    def from_profile(
        cls,
        profile: Profile | str,
        *,
        latency: str = DEFAULT_LATENCY,
        overrides: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Storage:
        """The description of a profile (a name, a path, or a :class:`Profile`), its latencies
        drawn as ``latency`` says (:func:`parse_latency`) around the profile's figures."""
        p = load_profile(profile, dict(overrides or {}))
        src = f"{p.name} profile"
        return cls(
            profile=p,
            latency=parse_latency(latency, p.side("request_latency", read=False), source=src),
            read_latency=parse_latency(latency, p.side("request_latency", read=True), source=src),
            metadata=parse_latency(latency, p.value("metadata_latency"), source=src),
            **kwargs,
        )

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def random(self) -> bool:
        """Whether anything but throttling's jitter is drawn at random."""
        return (
            self.latency.random
            or self.read_latency.random
            or self.metadata.random
            or (self.targets > 0 and self.placement == "random")
        )

    def describe(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "latency": self.latency.describe(),
            "read_latency": self.read_latency.describe(),
            "metadata_latency": self.metadata.describe(),
            "latency_source": self.latency.source,
            "targets": self.targets,
            "stripe_count": self.stripe_count,
            "stripe_size": self.stripe_size,
            "placement": self.placement,
            "burst_seconds": self.burst,
            "retry": {
                "max_attempts": self.retry.max_attempts,
                "base_delay": self.retry.base_delay,
                "max_delay": self.retry.max_delay,
            },
            "fitted_from": self.fitted_from,
        }


def _residuals(rows: list[dict[str, Any]], bandwidth: float) -> tuple[float, ...]:
    """What each measured request took beyond its transfer at ``bandwidth``: its latency."""
    out = sorted(max(0.0, r["seconds"] - r["nbytes"] / bandwidth) for r in rows)
    if len(out) > 20000:  # a bounded sample of the distribution, tails kept
        out = [out[i] for i in np.linspace(0, len(out) - 1, 20000).round().astype(int)]
    return tuple(out)


def _empirical(samples: tuple[float, ...], source: str) -> Latency:
    arr = np.asarray(samples)
    return Latency(
        "empirical",
        float(np.median(arr)),
        float(np.quantile(arr, 0.99)),
        samples=samples,
        source=source,
    )


def fit_storage(paths: Sequence[str], *, target: str | None = None) -> list[Storage]:
    """Storage descriptions fitted from measured result files (or directories): the figures
    of :func:`ckptio.calibration.calibrate` (per-stream bandwidth, the node's link from the
    highest throughput seen; one node cannot see an aggregate or a request-rate limit, so
    those stay unbounded), and latencies resampled from the recorded requests — each data
    request's time beyond its transfer at the fitted bandwidth, tails included. ``target``
    keeps one measured target."""
    from ckptio.calibration import calibrate
    from ckptio.results import read_results

    res = read_results(list(paths))
    cals = calibrate(res.requests, res.runs, res.phases)
    if target is not None:
        cals = [c for c in cals if c.target == target]
    if not cals:
        raise errors.InvalidArgumentError(
            f"no measured write requests{f' of {target!r}' if target else ''} in "
            f"{', '.join(map(str, paths))} to fit a storage description from"
        )
    requests = res.requests.to_pylist()
    out = []
    for cal in cals:
        profile = cal.as_profile()
        mine = [r for r in requests if r["target"] == cal.target and r["outcome"] == "ok"]
        writes = [
            r
            for r in mine
            if r["phase"] == "write" and r["op"] in ("write", "put") and r["nbytes"] > 0
        ]
        reads = [r for r in mine if r["phase"] == "read" and r["op"] == "get" and r["nbytes"] > 0]
        src = f"resampled from {len(writes)} measured requests of {cal.target}"
        lat = _empirical(_residuals(writes, profile.stream_bandwidth), src)
        read_lat = (
            _empirical(
                _residuals(reads, profile.side("stream_bandwidth", read=True)),
                f"resampled from {len(reads)} measured reads of {cal.target}",
            )
            if reads
            else lat
        )
        out.append(
            Storage(
                profile=profile,
                latency=lat,
                read_latency=read_lat,
                metadata=lat.scaled(profile.value("metadata_latency")),
                fitted_from=", ".join(map(str, paths)),
            )
        )
    return out


# -- the workload side -----------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What the client does: a plan (:func:`ckptio.workload.make_plan`) and how it is sent."""

    plan: Plan
    ranks_per_node: int = 8
    streams: int | None = None
    """Concurrent data requests per node (the model's ``streams``); None: the profile's."""
    part_size: int | None = None
    """Bytes per data request; None: the profile's."""
    object_concurrency: int = DEFAULT_OBJECT_CONCURRENCY
    restore_readers: int = RESTORE_READERS
    key_layout: str = "flat"
    readers: str = "writers"
    """Who reads in a restore: ``writers`` (each writing rank its own bytes, as the model
    counts) or ``all`` (every rank what it holds: replicas read the same objects)."""
    processes: tuple[tuple[int, ...], ...] | None = None
    """A run's processes (:meth:`for_run`): process ``p`` writes the plan ranks listed;
    None: one process per plan rank (a full-scale job)."""
    layout_note: str = ""
    """Why the layout differs from the preset's (:func:`fit_layout`), or empty."""
    lockstep: bool = False
    """Send objects as the model counts them: every rank of a node its next
    ``object_concurrency`` objects together, the node's next group when the whole group is
    done (so each group's create and complete are in series with its data). False: as
    ckptio's runner does, each rank's next object as soon as one of its own is done, so one
    rank's metadata requests overlap the other ranks' transfers. With fixed latencies and no
    throttling a lockstep simulation is what the model computes; the difference between the
    two is that overlap."""

    def __post_init__(self) -> None:
        for name in ("ranks_per_node", "object_concurrency", "restore_readers"):
            if getattr(self, name) < 1:
                raise errors.InvalidArgumentError(f"{name} must be >= 1")
        if self.streams is not None and self.streams < 1:
            raise errors.InvalidArgumentError("streams must be >= 1")
        if self.part_size is not None and self.part_size < 1:
            raise errors.InvalidArgumentError("part_size must be >= 1 byte")
        if self.key_layout not in fmt.KEY_LAYOUTS:
            raise errors.InvalidArgumentError(
                f"key layout {self.key_layout!r}; valid: {', '.join(fmt.KEY_LAYOUTS)}"
            )
        if self.readers not in READERS:
            raise errors.InvalidArgumentError(
                f"restore readers {self.readers!r}; valid: {', '.join(READERS)}"
            )
        if self.processes is not None and self.readers != "writers":
            raise errors.InvalidArgumentError("a run's processes read back what they wrote")

    @classmethod
    def for_run(
        cls,
        plan: Plan,
        *,
        processes: int,
        processes_per_node: int = 1,
        inflight: int = DEFAULT_OBJECT_CONCURRENCY,
        streams: int,
        part_size: int | None = None,
        key_layout: str = "flat",
    ) -> Job:
        """The job a :func:`ckptio.runner.run_workload` of ``plan`` is: ``processes``
        processes (the runner deals the plan's writing ranks round-robin over them),
        ``processes_per_node`` to a node, each with ``inflight`` objects in flight and its own
        store of ``streams`` streams (so ``streams x processes_per_node`` per node)."""
        writers = [int(r) for r in np.flatnonzero(plan.rank_bytes > 0)]
        procs = tuple(tuple(writers[p::processes]) for p in range(processes))
        return cls(
            plan,
            ranks_per_node=processes_per_node,
            streams=streams * processes_per_node,
            part_size=part_size,
            object_concurrency=inflight,
            key_layout=key_layout,
            processes=procs,
        )

    @property
    def gpus(self) -> int:
        return self.plan.ranks if self.processes is None else len(self.processes)

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.ranks_per_node)

    def workload(self) -> Workload:
        """The model's view of this job (:class:`ckptio.stallmodel.Workload`)."""
        prefixes = 256 if self.key_layout == "hashed" else 1
        if self.processes is not None:
            w = Workload.for_run(
                self.plan, processes=len(self.processes), inflight=self.object_concurrency
            )
            return replace(w, ranks_per_node=self.ranks_per_node, prefixes=prefixes)
        return Workload.from_plan(
            self.plan,
            ranks_per_node=self.ranks_per_node,
            prefixes=prefixes,
            object_concurrency=self.object_concurrency,
        )

    def describe(self) -> dict[str, Any]:
        p = self.plan
        return {
            "preset": p.preset.name,
            "layout": p.layout.describe(),
            "layout_note": self.layout_note,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "checkpoint_bytes": p.total_bytes,
            "writing_ranks": p.writing_ranks if self.processes is None else len(self.processes),
            "object_size": p.object_size,
            "object_concurrency": self.object_concurrency,
            "restore_readers": self.restore_readers,
            "key_layout": self.key_layout,
            "readers": self.readers,
            "scale": p.scale,
        }


def fit_layout(
    preset: str,
    gpus: int,
    *,
    tp: int | None = None,
    pp: int | None = None,
    zero: int | None = None,
    **plan_kwargs: Any,
) -> tuple[Plan, str]:
    """The plan of ``preset`` on ``gpus`` GPUs, and a note. Where the preset's TP x PP does
    not divide ``gpus`` (GPT-3's TP8 x PP16 on 8 GPUs), the parallelism not given is cut to
    the greatest common divisor (TP8 x PP1) and the note says so; given ones are kept (and
    :func:`~ckptio.workload.make_plan` refuses a layout that does not fit)."""
    p = get_preset(preset)
    t = tp or p.layout.tp
    s = pp or p.layout.pp
    note = ""
    if gpus % (t * s):
        t2 = t if tp else math.gcd(t, gpus)
        s2 = s if pp else math.gcd(s, max(1, gpus // t2))
        if (t2, s2) != (t, s):
            note = (
                f"{p.name}'s TP{t}xPP{s} does not divide {gpus:,} GPUs: simulated as TP{t2}xPP{s2}"
            )
        t, s = t2, s2
    return make_plan(p, gpus=gpus, tp=t, pp=s, zero=zero, **plan_kwargs), note


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    """What set one simulated phase's time."""

    rank: int
    """The last rank to finish (a plan rank, or a run's process)."""
    node: int
    prefix: str
    """The prefix that refused the most requests ("" when none was refused)."""
    mechanism: str
    """The binding node's time in words: the largest of its latency, transfer, queueing on a
    shared link, throttling and backoff; and whether it is a straggler."""
    limit: str
    """The model's name for it (:data:`ckptio.stallmodel.LIMITS`) or ``stragglers``/``failed``."""
    weight: int = 1
    """Identical nodes the binding node stands for (aggregated; 1: simulated alone)."""


@dataclass
class PhaseResult:
    """One phase (``save``, ``restore``, or a tiered target's ``drain``) over replications."""

    phase: str
    stalls: list[float] = field(default_factory=list)
    """Seconds per replication (for a failed one: until its first request ran out of
    attempts)."""
    failed: list[bool] = field(default_factory=list)
    bounds: list[Bound] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    """Requests per replication (first attempts, data and metadata)."""
    attempts: list[int] = field(default_factory=list)
    throttled: list[int] = field(default_factory=list)
    retried: list[int] = field(default_factory=list)
    failed_requests: list[int] = field(default_factory=list)
    bytes: int = 0
    modelled: float = math.nan
    """The model's time of the same phase (:func:`ckptio.stallmodel.estimate`), seconds."""
    model_binding: str = ""
    note: str = ""

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]]) -> PhaseResult:
        """A phase read back from the ``simulated`` rows of one simulation and phase."""
        rows = sorted(rows, key=lambda r: r["replication"])
        first = rows[0]
        return cls(
            phase=first["phase"],
            stalls=[r["seconds"] for r in rows],
            failed=[bool(r["failed"]) for r in rows],
            bounds=[
                Bound(
                    r["bound_rank"],
                    r["bound_node"],
                    r["bound_prefix"],
                    r["mechanism"],
                    r["bound_by"],
                    r["bound_weight"],
                )
                for r in rows
            ],
            requests=[r["requests"] for r in rows],
            attempts=[r["attempts"] for r in rows],
            throttled=[r["throttled"] for r in rows],
            retried=[r["retries"] for r in rows],
            failed_requests=[r["failed_requests"] for r in rows],
            bytes=first["checkpoint_bytes"],
            modelled=first["modelled_seconds"],
            model_binding=first["model_binding"],
        )

    def add(self, runs: Sequence[tuple[_Replication, float, Bound]]) -> None:
        """One replication: the runs that make it (one, or a tiered restore's two), the
        slowest of which is its stall; a failed run fails it."""
        end, bound = max(((e, b) for _, e, b in runs), key=lambda eb: eb[0])
        self.stalls.append(end)
        self.bounds.append(bound)
        self.failed.append(any(r.failed for r, _, _ in runs))
        self.requests.append(sum(r.requests for r, _, _ in runs))
        self.attempts.append(sum(r.attempts for r, _, _ in runs))
        self.throttled.append(sum(r.throttled for r, _, _ in runs))
        self.retried.append(sum(r.retried for r, _, _ in runs))
        self.failed_requests.append(sum(r.failed_req for r, _, _ in runs))
        self.bytes = runs[0][0].bytes

    def summary(self) -> dict[str, Any]:
        ok = [s for s, f in zip(self.stalls, self.failed, strict=True) if not f]
        n = len(self.stalls)
        lo, hi, coverage = median_interval(ok)
        bound = _most_common([b.limit for b in self.bounds])
        last = next((b for b in self.bounds if b.limit == bound), None)
        return {
            "phase": self.phase,
            "replications": n,
            "failed": sum(self.failed),
            "p50_seconds": float(np.percentile(ok, 50)) if ok else None,
            "p99_seconds": float(np.percentile(ok, 99)) if ok else None,
            "min_seconds": min(ok) if ok else None,
            "max_seconds": max(ok) if ok else None,
            "p50_low_seconds": lo,
            "p50_high_seconds": hi,
            "p50_coverage": coverage,
            "seconds_to_failure": max(self.stalls) if ok == [] and n else None,
            "modelled_seconds": None if math.isnan(self.modelled) else self.modelled,
            "model_binding": self.model_binding,
            "bound_by": bound,
            "bound_rank": last.rank if last else None,
            "bound_node": last.node if last else None,
            "bound_prefix": last.prefix if last else "",
            "mechanism": last.mechanism if last else "",
            "bound_weight": last.weight if last else 1,
            "requests": int(np.mean(self.requests)) if self.requests else 0,
            "attempts": int(np.mean(self.attempts)) if self.attempts else 0,
            "throttled": int(np.mean(self.throttled)) if self.throttled else 0,
            "retried": int(np.mean(self.retried)) if self.retried else 0,
            "failed_requests": int(np.mean(self.failed_requests)) if self.failed_requests else 0,
            "bytes": self.bytes,
            "note": self.note,
        }


def _most_common(items: list[str]) -> str:
    return max(dict.fromkeys(items), key=items.count) if items else ""


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[Any, Any, Any]:
    """A distribution-free interval for the median of what ``values`` were drawn from: order
    statistics ``x_(j)`` .. ``x_(n+1-j)`` with the largest ``j`` whose coverage (binomial,
    p = 1/2) is at least ``level``; for fewer than 6 values that is not reachable at 95% and
    the interval is the range, with its own coverage. Returns (low, high, coverage), or
    (None, None, None) for no values. One value, or values all equal: that value, coverage 1
    only if nothing was random (the caller knows)."""
    x = sorted(values)
    n = len(x)
    if n == 0:
        return None, None, None
    if n == 1 or x[0] == x[-1]:
        return x[0], x[-1], None

    def coverage(j: int) -> float:  # P(x_(j) <= median <= x_(n+1-j))
        tail = sum(math.comb(n, k) for k in range(j)) / 2**n
        return 1 - 2 * tail

    j = 1
    while j + 1 <= n // 2 and coverage(j + 1) >= level:
        j += 1
    return x[j - 1], x[n - j], coverage(j)


@dataclass
class Simulation:
    """What :func:`simulate` returns: the job, the storage, and each phase's replications."""

    target: str
    job: Job
    storage: Storage
    local: Storage | None
    seed: int
    replications: int
    deterministic: bool
    aggregated: bool
    node_classes: int
    simulated_nodes: int
    stragglers: int
    straggler_slowdown: float
    phases: dict[str, PhaseResult]
    wall_seconds: float = 0.0
    model: dict[str, Any] = field(default_factory=dict)
    """The model's answer for the same job and target (:func:`ckptio.stallmodel.project`)."""
    notes: list[str] = field(default_factory=list)

    def overrides(self) -> str:
        """The profile figures set by the user (``--set``), as ``name=value`` (canonical
        units), or empty."""
        tiers = [self.storage] + ([self.local] if self.local else [])
        return ", ".join(
            f"{name}={s.profile.value(name):g}"
            if name in s.profile.figures
            else f"{name}={getattr(s.profile, name)}"
            for s in tiers
            for name in s.profile.overridden
        )

    def rows(self, run_id: str) -> list[dict[str, Any]]:
        """One row per phase and replication: the ``simulated`` table of
        :mod:`ckptio.results` (:data:`~ckptio.results.SIMULATED_COLUMNS`)."""
        job = self.job.describe()
        out = []
        for ph, res in self.phases.items():
            for i, (sec, failed, b) in enumerate(
                zip(res.stalls, res.failed, res.bounds, strict=True)
            ):
                out.append(
                    {
                        "run_id": run_id,
                        "kind": "simulated",
                        "target": self.target,
                        "preset": job["preset"],
                        "parallel_layout": job["layout"],
                        "gpus": job["gpus"],
                        "nodes": job["nodes"],
                        "phase": ph,
                        "replication": i,
                        "replications": self.replications,
                        "seed": self.seed,
                        "seconds": sec,
                        "failed": failed,
                        "modelled_seconds": res.modelled,
                        "model_binding": res.model_binding,
                        "bound_by": b.limit,
                        "bound_rank": b.rank,
                        "bound_node": b.node,
                        "bound_prefix": b.prefix,
                        "bound_weight": b.weight,
                        "mechanism": b.mechanism,
                        "requests": res.requests[i],
                        "attempts": res.attempts[i],
                        "throttled": res.throttled[i],
                        "retries": res.retried[i],
                        "failed_requests": res.failed_requests[i],
                        "checkpoint_bytes": res.bytes,
                        "latency": self.storage.latency.describe(),
                        "overrides": self.overrides(),
                        "key_layout": job["key_layout"],
                        "readers": job["readers"],
                        "stragglers": self.stragglers,
                        "straggler_slowdown": self.straggler_slowdown,
                        "lockstep": self.job.lockstep,
                        "aggregated": self.aggregated,
                        "deterministic": self.deterministic,
                        "wall_seconds": self.wall_seconds,
                    }
                )
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": "simulated",
            "target": self.target,
            "job": self.job.describe(),
            "storage": self.storage.describe(),
            "local": self.local.describe() if self.local else None,
            "overrides": self.overrides(),
            "seed": self.seed,
            "replications": self.replications,
            "deterministic": self.deterministic,
            "aggregated": self.aggregated,
            "node_classes": self.node_classes,
            "simulated_nodes": self.simulated_nodes,
            "stragglers": self.stragglers,
            "straggler_slowdown": self.straggler_slowdown,
            "wall_seconds": self.wall_seconds,
            "phases": {k: v.summary() for k, v in self.phases.items()},
            "notes": list(self.notes),
        }


# -- the engine ------------------------------------------------------------------------------


class _Pipe:
    """A shared link of ``rate`` bytes/s, first come first served: bytes entering at ``t``
    leave after those queued before them (the Lindley recursion)."""

    __slots__ = ("free", "kind", "rate")

    def __init__(self, rate: float, kind: str) -> None:
        self.rate = rate
        self.free = 0.0
        self.kind = kind

    def finish(self, t: float, nbytes: float) -> float:
        start = t if t > self.free else self.free
        self.free = start + nbytes / self.rate
        return self.free


class _Bucket:
    """A prefix's request rate in one direction: a token bucket of ``rate`` tokens/s holding
    ``depth`` of them."""

    __slots__ = ("depth", "last", "rate", "refused", "tokens")

    def __init__(self, rate: float, depth: float) -> None:
        self.rate, self.depth = rate, max(1.0, depth)
        self.tokens, self.last, self.refused = self.depth, 0.0, 0

    def take(self, now: float) -> bool:
        tokens = self.tokens + (now - self.last) * self.rate
        self.last = now
        if tokens > self.depth:
            tokens = self.depth
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return True
        self.tokens = tokens
        self.refused += 1
        return False


class _Draw:
    """Latencies of one distribution, drawn in blocks (one numpy call per 4,096)."""

    __slots__ = ("buf", "const", "dist", "i", "rng")

    def __init__(self, dist: Latency, rng: np.random.Generator) -> None:
        self.dist, self.rng = dist, rng
        self.const = None if dist.random else dist.median
        self.buf: list[float] = []
        self.i = 0

    def __call__(self) -> float:
        if self.const is not None:
            return self.const
        if self.i >= len(self.buf):
            self.buf = self.dist.draw(self.rng, 4096).tolist()
            self.i = 0
        v = self.buf[self.i]
        self.i += 1
        return v


class _Node:
    __slots__ = (
        "backoff",
        "factor",
        "idle",
        "index",
        "lat",
        "nlat",
        "pipe",
        "queue",
        "rate",
        "straggler",
        "wait",
        "waits",
        "weight",
        "xfer",
    )

    def __init__(self, index: int, weight: int, straggler: bool, factor: float) -> None:
        self.index, self.weight, self.straggler, self.factor = index, weight, straggler, factor
        self.lat = self.xfer = self.wait = self.backoff = 0.0
        self.nlat = 0
        self.waits: dict[str, float] = {}
        self.pipe: _Pipe | None = None
        self.queue: deque[tuple[_Object, int]] = deque()
        self.idle: list[Any] = []
        self.rate = 0.0


class _Object:
    __slots__ = ("bucket", "done", "failed", "left", "pipes", "rank")

    def __init__(self, rank: _Rank, left: int, bucket: _Bucket | None, done: Any) -> None:
        self.rank, self.left, self.bucket, self.done = rank, left, bucket, done
        self.failed = False
        self.pipes: list[tuple[_Pipe, float]] = []


class _Rank:
    __slots__ = ("end", "failed", "index", "node", "todo")

    def __init__(self, index: int, node: _Node, todo: Iterator[tuple[int, int, int]]) -> None:
        self.index, self.node, self.todo = index, node, todo
        self.failed = False
        self.end = 0.0


#: (source rank, number, bytes) of each object a rank writes or reads
_ObjectList = tuple[tuple[int, int, int], ...]


def _objects(plan: Plan, src: int, model: bool, optim: bool) -> _ObjectList:
    """The objects of plan rank ``src`` (numbered as the runner names them: weights first),
    the weights' and/or the optimizer's."""
    size = plan.object_size
    out = []
    number = 0
    for take, nbytes in ((model, int(plan.model_bytes[src])), (optim, int(plan.optim_bytes[src]))):
        for start in range(0, nbytes, size):
            if take:
                out.append((src, number, min(size, nbytes - start)))
            number += 1
    return tuple(out)


def _work(job: Job, phase: str) -> list[_ObjectList]:
    """What each process (a plan rank at full scale) writes, or reads in a restore."""
    plan = job.plan
    if job.processes is not None:
        return [
            tuple(o for r in ranks for o in _objects(plan, r, True, True))
            for ranks in job.processes
        ]
    if phase != "restore" or job.readers == "writers":
        return [_objects(plan, r, True, True) for r in range(plan.ranks)]
    # every rank reads what it holds: the weights of its model-parallel shard (written by
    # data-parallel rank 0 unless ZeRO 3 shards them) and its optimizer state (its own with
    # ZeRO >= 1, else its model-parallel shard's)
    lay = plan.layout
    mp = lay.tp * lay.pp
    out = []
    for r in range(plan.ranks):
        src_m = r if lay.zero == 3 else r % mp
        src_o = r if lay.zero >= 1 else r % mp
        if src_m == src_o:
            out.append(_objects(plan, src_m, True, True))
        else:
            out.append(_objects(plan, src_m, True, False) + _objects(plan, src_o, False, True))
    return out


class _Replication:
    """One phase of one checkpoint in virtual time (a fresh SimPy environment)."""

    def __init__(
        self,
        job: Job,
        storage: Storage,
        phase: str,
        work: list[_ObjectList],
        *,
        rng: np.random.Generator,
        jitter: random.Random,
        stragglers: set[int],
        slowdown: float,
        aggregate: bool,
        only_nodes: set[int] | None = None,
    ) -> None:
        simpy = errors.require("simpy", extra="sim", purpose="simulating a checkpoint")
        self.env = simpy.Environment()
        self.job, self.storage, self.phase = job, storage, phase
        self.reading = phase == "restore"
        p = storage.profile
        self.streams = job.streams or p.streams
        self.part = job.part_size or p.part_size
        self.retry = storage.retry
        self.jitter = jitter.uniform
        self.rng = rng
        self.attempts = self.requests = self.throttled = self.retried = self.failed_req = 0
        self.bytes = 0
        self.failed = False
        self.first_failed: _Rank | None = None
        rpn = job.ranks_per_node
        nodes_work: dict[int, list[tuple[int, _ObjectList]]] = {}
        for r, objs in enumerate(work):
            if objs and (only_nodes is None or r // rpn in only_nodes):
                nodes_work.setdefault(r // rpn, []).append((r, objs))
        # which nodes stand for others: identical work, same straggler status
        classes: dict[Any, list[int]] = {}
        for n, ranks in nodes_work.items():
            key = (
                (n in stragglers, tuple(tuple(b for _, _, b in objs) for _, objs in ranks))
                if aggregate
                else n
            )
            classes.setdefault(key, []).append(n)
        self.classes = len(classes)
        sbw = p.side("stream_bandwidth", read=self.reading)
        nbw = p.side("node_bandwidth", read=self.reading)
        abw = p.value("aggregate_bandwidth")
        rate = p.value("read_request_rate" if self.reading else "write_request_rate")
        lat_dist = storage.read_latency if self.reading else storage.latency
        active_nodes = len(nodes_work)
        # shared pipes only where the streams behind them can fill them (else exact to omit)
        self.agg: _Pipe | None = None
        self.targets: list[_Pipe] = []
        if storage.targets:
            self.targets = [
                _Pipe(abw / storage.targets, "storage target (OST) contention")
                for _ in range(storage.targets)
            ]
        elif not math.isinf(abw) and active_nodes * self.streams * sbw > abw:
            self.agg = _Pipe(abw, "aggregate bandwidth")
        # throttling: buckets when the job could ever exceed a prefix's rate
        self.buckets: dict[tuple[str, bool], _Bucket] | None = None
        if p.rate_scope != "none" and not math.isinf(rate):
            lanes = job.restore_readers if self.reading else job.object_concurrency
            nranks = sum(len(v) for v in nodes_work.values())
            floor = min(lat_dist.minimum, storage.metadata.minimum)
            peak = (
                math.inf if floor <= 0 else (active_nodes * self.streams + nranks * lanes) / floor
            )
            if peak > min(p.value("read_request_rate"), p.value("write_request_rate")):
                self.buckets = {}
        self.rate_scope = p.rate_scope
        self.next_target = 0
        self.nodes: list[_Node] = []
        self.ranks: list[_Rank] = []
        for members in classes.values():
            n = members[0]
            strag = n in stragglers
            factor = slowdown if strag else 1.0
            node = _Node(n, len(members), strag, factor)
            node.rate = sbw / factor
            if not math.isinf(nbw) and self.streams * sbw > nbw:
                node.pipe = _Pipe(nbw / factor, "node link")
            self.nodes.append(node)
            for r, objs in nodes_work[n]:
                self.ranks.append(_Rank(r, node, iter(objs)))
        self.lat = _Draw(lat_dist, rng)
        self.meta = _Draw(storage.metadata, rng)

    # -- requests ----------------------------------------------------------------------------

    def _bucket(self, prefix: str, read: bool) -> _Bucket | None:
        if self.buckets is None:
            return None
        key = ("(the bucket)" if self.rate_scope == "bucket" else prefix, read)
        b = self.buckets.get(key)
        if b is None:
            p = self.storage.profile
            rate = p.value("read_request_rate" if read else "write_request_rate")
            b = self.buckets[key] = _Bucket(rate, rate * self.storage.burst)
        return b

    def _request(
        self,
        node: _Node,
        bucket: _Bucket | None,
        draw: _Draw,
        nbytes: int,
        pipes: list[tuple[_Pipe, float]],
        granted: bool | None = None,
    ) -> Generator[Any, Any, bool]:
        """One request with ckptio's retries; True when it succeeded, False when it ran out
        of attempts (each refused attempt is answered after one latency). ``granted``: what
        the bucket already answered the first attempt, now (None: ask it)."""
        env = self.env
        w = node.weight
        self.requests += w
        attempt = 1
        while True:
            lat = draw() * node.factor
            self.attempts += w
            if granted is None:
                granted = bucket is None or bucket.take(env.now)
            if not granted:
                granted = None
                self.throttled += w
                if attempt >= self.retry.max_attempts:
                    yield env.timeout(lat)
                    node.backoff += lat
                    self.failed_req += w
                    return False
                pause = self.retry.delay(attempt, self.jitter)
                node.backoff += lat + pause
                self.retried += w
                yield env.timeout(lat + pause)
                attempt += 1
                continue
            node.lat += lat
            node.nlat += 1
            if not nbytes:
                yield env.timeout(lat)
                return True
            own = nbytes / node.rate
            node.xfer += own
            if not pipes:
                yield env.timeout(lat + own)
                return True
            yield env.timeout(lat)
            t = env.now
            yield env.timeout(self._through(node, pipes, nbytes, t, own) - t)
            return True

    def _through(
        self, node: _Node, pipes: list[tuple[_Pipe, float]], nbytes: int, t: float, own: float
    ) -> float:
        """When a request whose bytes start at ``t`` is done: the latest of its own transfer
        (``own`` seconds) and each shared pipe it crosses (the node's own link carries its
        bytes once; a shared pipe the bytes of every node it stands for)."""
        end = t + own
        worst = None
        w = node.weight
        for pipe, share in pipes:
            e = pipe.finish(t, nbytes * share * (1 if pipe is node.pipe else w))
            if e > end:
                end, worst = e, pipe
        if worst is not None:
            node.wait += end - t - own
            node.waits[worst.kind] = node.waits.get(worst.kind, 0.0) + end - t - own
        return end

    def _worker(self, node: _Node) -> Generator[Any, Any, None]:
        """One stream of a node: takes the node's queued parts, first come first served, and
        waits on an event of its own while there are none (a SimPy ``Store`` would do the
        same with two more events per part: a third of the run time)."""
        env, queue, idle, draw = self.env, node.queue, node.idle, self.lat
        while True:
            if not queue:
                wake = env.event()
                idle.append(wake)
                yield wake
                continue
            obj, nbytes = queue.popleft()
            if obj.failed:
                continue
            bucket = obj.bucket
            if bucket is None or bucket.take(env.now):
                # the first attempt went through: inline, without a generator (most parts)
                lat = draw() * node.factor
                own = nbytes / node.rate
                node.lat += lat
                node.nlat += 1
                node.xfer += own
                self.requests += node.weight
                self.attempts += node.weight
                if not obj.pipes:
                    yield env.timeout(lat + own)
                else:
                    yield env.timeout(lat)
                    t = env.now
                    yield env.timeout(self._through(node, obj.pipes, nbytes, t, own) - t)
            elif not (
                yield from self._request(node, bucket, draw, nbytes, obj.pipes, granted=False)
            ):
                self._fail(obj)
                continue
            obj.left -= 1
            if obj.left == 0:
                obj.done.succeed()

    def _fail(self, obj: _Object) -> None:
        if not obj.failed:
            obj.failed = True
            obj.rank.failed = True
            self._give_up(obj.rank)
            if not obj.done.triggered:
                obj.done.succeed()

    def _pipes_for(self, node: _Node, nbytes: int) -> list[tuple[_Pipe, float]]:
        """The shared pipes an object's requests cross, with each one's share of a request's
        bytes (a file striped over k targets puts 1/k of each request on each)."""
        pipes: list[tuple[_Pipe, float]] = []
        if node.pipe is not None:
            pipes.append((node.pipe, 1.0))
        if self.agg is not None:
            pipes.append((self.agg, 1.0))
        if self.targets:
            s = self.storage
            n = len(self.targets)
            if s.placement == "random":
                first = int(self.rng.integers(n))
            else:
                first = self.next_target
                self.next_target = (self.next_target + s.stripe_count) % n
            k = min(s.stripe_count, n, max(1, -(-nbytes // s.stripe_size)))
            pipes += [(self.targets[(first + i) % n], 1.0 / k) for i in range(k)]
        return pipes

    def _prefix(self, src: int, number: int) -> str:
        if self.buckets is None or self.job.key_layout == "flat":
            return "data"
        key = fmt.shard_key(_STEP, src, number, key_layout=self.job.key_layout)
        return key.rsplit("/", 1)[0].split("/", 1)[1]

    # -- ranks -------------------------------------------------------------------------------

    def _object(self, rank: _Rank, src: int, number: int, nbytes: int) -> Generator[Any, Any, bool]:
        """One object: created (a write) or its size checked (a restore), its parts queued on
        the node's streams, then completed (a write). False when a request failed."""
        env = self.env
        node = rank.node
        part = self.part
        reading = self.reading
        bucket = self._bucket(self._prefix(src, number), reading)
        if not (yield from self._request(node, bucket, self.meta, 0, [])):
            return False
        obj = _Object(rank, -(-nbytes // part), bucket, env.event())
        obj.pipes = self._pipes_for(node, nbytes)
        self.bytes += nbytes * node.weight
        full, rest = divmod(nbytes, part)
        queue = node.queue
        queue.extend([(obj, part)] * full)
        if rest:
            queue.append((obj, rest))
        idle = node.idle
        for _ in range(obj.left if obj.left < len(idle) else len(idle)):
            idle.pop().succeed()
        yield obj.done
        if obj.failed:
            return False
        return reading or (yield from self._request(node, bucket, self.meta, 0, []))

    def _lane(self, rank: _Rank) -> Generator[Any, Any, None]:
        """One of a rank's objects in flight: the next object as soon as this one is done."""
        for src, number, nbytes in rank.todo:
            if rank.failed:
                return
            if not (yield from self._object(rank, src, number, nbytes)):
                rank.failed = True
                self._give_up(rank)
                return

    def _node_groups(self, ranks: list[_Rank], size: int) -> Generator[Any, Any, None]:
        """The model's client (:attr:`Job.lockstep`): every rank of a node sends its next
        ``size`` objects together, and the node's next group starts when the whole group is
        done."""
        env = self.env
        todo = [list(r.todo) for r in ranks]
        for i in range(0, max(map(len, todo), default=0), size):
            group = [
                (r, env.process(self._object(r, *o)))
                for r, objs in zip(ranks, todo, strict=True)
                for o in objs[i : i + size]
            ]
            yield env.all_of([g for _, g in group])
            for r, g in group:
                r.end = env.now
                if not g.value:
                    r.failed = True
                    self._give_up(r)
            if self.failed:
                return

    def _rank(self, rank: _Rank) -> Generator[Any, Any, None]:
        env = self.env
        node = rank.node
        if self.reading:  # list the steps, check the manifest's size twice, read it
            root = self._bucket(ROOT_PREFIX, True)
            preamble = [self.meta] * RESTORE_PREAMBLE_OPS + [self.lat]
            for draw in preamble:
                if not (yield from self._request(node, root, draw, 0, [])):
                    rank.failed = True
                    self._give_up(rank)
                    return
        if self.job.lockstep:
            return
        lanes = self.job.restore_readers if self.reading else self.job.object_concurrency
        yield env.all_of([env.process(self._lane(rank)) for _ in range(lanes)])
        rank.end = env.now

    def _phase(self) -> Generator[Any, Any, None]:
        env = self.env
        for node in self.nodes:
            for _ in range(self.streams):
                env.process(self._worker(node))
        ranks = [env.process(self._rank(r)) for r in self.ranks]
        if self.job.lockstep:  # after each rank's preamble, the node's groups
            yield env.all_of(ranks)
            lanes = self.job.restore_readers if self.reading else self.job.object_concurrency
            by_node: dict[int, list[_Rank]] = {}
            for r in self.ranks:
                by_node.setdefault(id(r.node), []).append(r)
            ranks = [env.process(self._node_groups(rs, lanes)) for rs in by_node.values()]
        yield env.all_of(ranks)
        if not self.reading and not self.failed and self.ranks:
            first = self.ranks[0].node
            ok = yield from self._request(first, self._bucket(ROOT_PREFIX, False), self.meta, 0, [])
            if not ok:
                self._give_up(self.ranks[0])

    def _give_up(self, rank: _Rank) -> None:
        """A request ran out of attempts: the checkpoint has failed (the commit will not
        publish it), and the replication ends now (what the other ranks do until they hear
        of it changes nothing, and is not simulated)."""
        self.failed = True
        if not self.stop.triggered:
            rank.end = self.env.now
            self.first_failed = rank
            self.stop.succeed()

    def run(self) -> tuple[float, Bound]:
        env = self.env
        self.stop = env.event()
        done = env.process(self._phase())
        env.run(until=env.any_of([done, self.stop]))
        return env.now, self._bound()

    def _bound(self) -> Bound:
        if not self.ranks:
            return Bound(-1, -1, "", "no rank has anything to do", "none")
        last = self.first_failed or max(self.ranks, key=lambda r: (r.end, -r.index))
        node = last.node
        parts = {
            "request latency": node.lat,
            "per-stream bandwidth": node.xfer,
            "request-rate limit": node.backoff,
        }
        for kind, t in node.waits.items():
            parts[kind] = t
        total = sum(parts.values()) or 1.0
        limit = max(parts, key=lambda k: parts[k])
        words = ", ".join(
            f"{k} {v / total:.0%}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v
        )
        mean = node.lat / node.nlat if node.nlat else 0.0
        mech = (
            f"node {node.index}'s request time: {words}; its requests waited "
            f"{human_seconds(mean)} on average for their latency"
        )
        if node.straggler:
            others = [r.end for r in self.ranks if not r.node.straggler]
            ahead = max(others, default=0.0)
            if not others or last.end > 1.02 * ahead:
                limit = "straggler node"
                behind = f", {last.end / ahead - 1:.0%} after the last other node" if ahead else ""
                mech = f"straggler node ({node.factor:g}x slower{behind}); " + mech
            else:  # the straggler ended with the others: a shared limit binds them all
                mech = f"a straggler ({node.factor:g}x slower) ends with the others; " + mech
        prefix = ""
        if self.buckets:
            worst = max(self.buckets.items(), key=lambda kv: kv[1].refused)
            if worst[1].refused:
                prefix = worst[0][0]
                mech += f"; prefix {prefix!r} refused {worst[1].refused:,} requests (503 SlowDown)"
        if self.failed:
            limit = "failed"
            mech = (
                f"a request ran out of its {self.retry.max_attempts} attempts "
                "(503 SlowDown after every backoff): the checkpoint fails; " + mech
            )
        return Bound(last.index, node.index, prefix, mech, limit, node.weight)


# -- the API ---------------------------------------------------------------------------------


def _model(job: Job, storage: Storage, local: Storage | None, p_lose_node: float) -> Any:
    """The model's figures for ``job`` on the target (:func:`ckptio.stallmodel.project`)."""
    conditions = Conditions(streams=job.streams, part_size=job.part_size, p_lose_node=p_lose_node)
    return project(
        job.workload(), storage.profile, conditions, local=local.profile if local else None
    )


def _stragglers(
    rng: np.random.Generator, work: list[_ObjectList], rpn: int, count: int
) -> set[int]:
    nodes = sorted({r // rpn for r, objs in enumerate(work) if objs})
    if not count or not nodes:
        return set()
    pick = rng.choice(len(nodes), size=min(count, len(nodes)), replace=False)
    return {nodes[int(i)] for i in pick}


def simulate(
    job: Job,
    storage: Storage,
    *,
    local: Storage | None = None,
    phases: Sequence[str] = PHASES,
    replications: int = 10,
    seed: int = 0,
    stragglers: int = 0,
    straggler_slowdown: float = 2.0,
    p_lose_node: float = DEFAULT_P_LOSE_NODE,
    aggregate: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Simulation:
    """Simulate ``phases`` of ``job`` on ``storage`` (a tiered target with ``local``: the
    save writes the fast tier, a ``drain`` phase writes the durable tier in the background,
    and a restore reads the fast tier unless the failure lost a node, with probability
    ``p_lose_node``, whose ranks then read the durable tier) over ``replications``
    checkpoints, seeded by ``seed``. ``stragglers`` nodes (drawn per replication among those
    with work) do everything ``straggler_slowdown`` times slower. ``aggregate``: simulate
    identical nodes once where that is exact. Nothing random in the input (fixed latencies,
    no stragglers, no throttling possible): one replication, and the result says so."""
    if replications < 1:
        raise errors.InvalidArgumentError(f"replications must be >= 1, got {replications}")
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases:
        raise errors.InvalidArgumentError(
            f"phases {', '.join(bad) or '(none)'}; valid: {', '.join(PHASES)}"
        )
    if stragglers < 0 or not (math.isfinite(straggler_slowdown) and straggler_slowdown >= 1):
        raise errors.InvalidArgumentError("stragglers must be >= 0 and the slowdown a number >= 1")
    if not 0 <= p_lose_node <= 1:
        raise errors.InvalidArgumentError(f"p_lose_node must be in [0, 1], got {p_lose_node}")
    t0 = time.perf_counter()
    target = f"{storage.name}+{local.name}" if local else storage.name
    tiers = [storage] + ([local] if local else [])
    random_input = any(s.random for s in tiers) or stragglers > 0 or local is not None
    works = {ph: _work(job, ph) for ph in phases}
    rpn = job.ranks_per_node

    def throttling_possible(s: Storage) -> bool:
        p = s.profile
        return p.rate_scope != "none" and not (
            math.isinf(p.value("write_request_rate")) and math.isinf(p.value("read_request_rate"))
        )

    maybe_throttled = any(throttling_possible(s) for s in tiers)
    deterministic = not random_input and not maybe_throttled
    reps = 1 if deterministic else replications
    model = _model(job, storage, local, p_lose_node)
    order = [*phases] + (["drain"] if local is not None and "save" in phases else [])
    results = {ph: PhaseResult(ph) for ph in order}
    seeds = np.random.SeedSequence(seed).spawn(reps)
    classes = simulated = 0
    aggregated = every_node = False
    for i in range(reps):
        rng = np.random.default_rng(seeds[i])
        jitter = random.Random(int(rng.integers(2**63)))
        strag = _stragglers(rng, works.get("save") or works["restore"], rpn, stragglers)
        for ph in order:
            work = works["save" if ph == "drain" else ph]
            with_work = sorted({r // rpn for r, objs in enumerate(work) if objs})
            # which tier each part of the phase runs on (a tiered restore: the fast tier, and
            # the durable tier for the ranks of a node the failure lost)
            runs: list[tuple[Storage, set[int] | None]] = [
                (local if local is not None and ph != "drain" else storage, None)
            ]
            lost = local is not None and ph == "restore" and rng.random() < p_lose_node
            if lost and with_work:
                runs.append((storage, {with_work[int(rng.integers(len(with_work)))]}))
            agg = aggregate and not any(
                s.random or s.targets or throttling_possible(s) for s, _ in runs
            )
            reps_here = []
            for tier, only in runs:
                rep = _Replication(
                    job,
                    tier,
                    "save" if ph == "drain" else ph,
                    work,
                    rng=rng,
                    jitter=jitter,
                    stragglers=strag,
                    slowdown=straggler_slowdown,
                    aggregate=agg,
                    only_nodes=only,
                )
                end, bound = rep.run()
                if only is not None:
                    bound = replace(
                        bound, mechanism=f"lost node reads {tier.name}: {bound.mechanism}"
                    )
                reps_here.append((rep, end, bound))
                classes = max(classes, rep.classes)
                simulated = max(simulated, len(rep.nodes))
                if only is None:
                    aggregated = aggregated or len(rep.nodes) < len(with_work)
                    every_node = every_node or (aggregate and not agg and len(with_work) > 1)
                if rep.failed:
                    break
            results[ph].add(reps_here)
            if progress:
                progress(f"{target} {ph} {i + 1}/{reps}: {human_seconds(results[ph].stalls[-1])}")
    _attach_model(results, model, local is not None)
    notes = []
    if job.layout_note:
        notes.append(job.layout_note)
    if deterministic:
        notes.append(
            "deterministic: no random input (fixed latencies, no throttling, no "
            "stragglers), so one replication is the answer"
        )
    if aggregated:
        notes.append(
            f"identical nodes simulated once and weighted (at most {classes} node classes): "
            "exact where nothing is random and nothing can throttle"
        )
    if every_node:
        notes.append(
            "every node simulated: with random latencies, throttling or storage targets, "
            "identical nodes do not stay identical"
        )
    if job.readers == "all" and "restore" in phases:
        notes.append(
            "restore storm: every rank reads what it holds (replicas read the same "
            "objects); the model counts each byte once"
        )
    sim = Simulation(
        target=target,
        job=job,
        storage=storage,
        local=local,
        seed=seed,
        replications=reps,
        deterministic=deterministic,
        aggregated=aggregated,
        node_classes=classes,
        simulated_nodes=simulated,
        stragglers=stragglers,
        straggler_slowdown=straggler_slowdown,
        phases=results,
        wall_seconds=time.perf_counter() - t0,
        model=model,
        notes=notes,
    )
    return sim


def _attach_model(results: dict[str, PhaseResult], model: dict[str, Any], tiered: bool) -> None:
    """The model's seconds and binding limit beside each simulated phase."""
    if "save" in results:
        results["save"].modelled = float(model["write_seconds"])
        results["save"].model_binding = str(model.get("binding", ""))
    if "restore" in results:
        results["restore"].modelled = float(model["restore_seconds"])
        results["restore"].model_binding = str(model.get("restore_binding", ""))
    if tiered and "drain" in results:
        results["drain"].modelled = float(model["drain_seconds"])
        results["drain"].model_binding = str(model.get("drain_binding", ""))
        results["restore"].note = (
            "the model gives the expected restore, (1 - p) x fast + p x durable, the "
            "durable read being the busiest node's; the simulation draws whether each "
            "failure lost a node, and which (any node that wrote): its ranks read the "
            "durable tier"
        )


# -- result files ----------------------------------------------------------------------------


def write_results(
    sims: Sequence[Simulation], out_dir: str, *, config: Mapping[str, Any] | None = None
) -> list[Any]:
    """Write ``sims`` under ``out_dir`` as one ``<run_id>.simulated.parquet`` (a row per
    phase and replication, :data:`ckptio.results.SIMULATED_COLUMNS`) and its JSON sidecar
    (the configuration and every simulation's summary). Returns the paths."""
    from ckptio.results import new_run_id, sidecar, write_simulated

    label = "simulate-" + "-".join(dict.fromkeys(s.target for s in sims))
    run_id = new_run_id(label)
    rows = [row for s in sims for row in s.rows(run_id)]
    side = sidecar(
        run_id,
        config=dict(config or {}),
        labels={"kind": "simulated"},
        extra={"kind": "simulated", "simulations": [s.as_dict() for s in sims]},
    )
    return write_simulated(out_dir, rows=rows, sidecar=side)


#: The columns that tell one simulated phase's replications from another's.
SUMMARY_KEYS = (
    "run_id",
    "target",
    "preset",
    "parallel_layout",
    "gpus",
    "nodes",
    "phase",
    "key_layout",
    "readers",
    "latency",
    "overrides",
    "stragglers",
    "straggler_slowdown",
    "lockstep",
    "seed",
    "replications",
    "deterministic",
    "aggregated",
    "wall_seconds",
)


def read_summaries(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Per simulated phase in the result files ``paths``: its identifying columns
    (:data:`SUMMARY_KEYS`) and :meth:`PhaseResult.summary` of its replications, the same
    figures ``ckptio simulate`` printed."""
    from ckptio.results import read_simulated

    table, _ = read_simulated(list(paths))
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in table.to_pylist():
        groups.setdefault(tuple(row[k] for k in SUMMARY_KEYS), []).append(row)
    out = []
    for key, rows in groups.items():
        out.append(
            {**dict(zip(SUMMARY_KEYS, key, strict=True)), **PhaseResult.from_rows(rows).summary()}
        )
    return out
