"""A measured target's figures, fitted from its request records round by round, and whether
they may be projected to full scale.

A **round** is one iteration of a run: one checkpoint written (and read back). From each
round's records this module takes the figures the model needs (:class:`Calibration`):

- per-stream bandwidth and request latency: ``seconds = latency + nbytes / bandwidth`` fitted
  over the round's data requests (:func:`fit_latency_bandwidth`);
- the node's **steady data throughput**: the bytes of the data requests over the time from
  the first data request to the last request of the write before its commit (what one node
  sustains while it writes; the checkpoint's fixed costs — the lease, the manifest — are the
  model's metadata term, not bandwidth), and the read side's likewise.

**Steady state.** A projection multiplies these figures by a checkpoint thousands of times
larger, so they must be the storage's steady figures, not a start-up's:

- *warm-up*: the first round of a run that is slower than every other round by more than
  :data:`WARMUP_FACTOR` carries one-time costs (connections, first-touch of buffers): it is
  kept in the results and shown, not fitted;
- *halves*: within each round, the second half of the bytes must go at the first half's
  rate, within :data:`HALVES_TOLERANCE` (geometric mean over the rounds); a run still
  speeding up or slowing down has not reached steady state;
- *size*: a round must write at least :data:`MIN_ROUND_BYTES`, for at least
  :data:`MIN_ROUND_SECONDS`, in at least :data:`MIN_ROUND_REQUESTS` data requests. Smaller
  rounds write objects of a few MiB whose fixed costs (create, fsync, rename: milliseconds
  each on a busy machine) weigh several times more than in a full-scale checkpoint's, and a
  busy machine can stretch such a round past the time floor while making it slower, not
  steadier; and the halves cannot be told from the timing noise.

**Rounds and intervals.** At least :data:`MIN_ROUNDS` steady rounds are needed: each is
projected on its own, and the spread of those projections gives the interval of the
projection of all rounds pooled (:func:`ckptio.intervals.spread_interval`). A projection whose
write time is uncertain by more than :data:`MAX_RELATIVE_INTERVAL` is refused as too noisy.
Every refusal says why and what would do (a size, a number of rounds).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ckptio import errors
from ckptio.intervals import (
    Interval,
    rounds_needed,
    spread_interval,
    t_quantile,
)
from ckptio.profiles import Profile
from ckptio.units import human_rate, human_seconds, human_size

__all__ = [
    "HALVES_TOLERANCE",
    "MAX_RELATIVE_INTERVAL",
    "MIN_ROUNDS",
    "MIN_ROUND_BYTES",
    "MIN_ROUND_REQUESTS",
    "MIN_ROUND_SECONDS",
    "WARMUP_FACTOR",
    "Calibration",
    "FanInCheck",
    "PeerLinkFit",
    "PeerRound",
    "Round",
    "TargetFit",
    "calibrate",
    "calibrate_results",
    "check_fan_in",
    "fit_latency_bandwidth",
    "fit_peer_link",
    "fit_profiles",
    "fit_target",
    "fit_targets",
    "peer_rounds",
    "project_rounds",
    "read_rounds",
    "with_intervals",
]

MIN_ROUNDS = 3
"""Steady rounds needed for an interval (two give one degree of freedom: t = 12.7)."""
MIN_ROUND_BYTES = 128 * 2**20
"""Bytes a round must write (a floor, an assumption: on the project's 2-core VM a 32 MiB run
of the local disk projected 3.7x slower than a 256 MiB one, its 2 MiB objects dominated by
fsync latency; 128 MiB is half of ``ckptio compare``'s default)."""
MIN_ROUND_SECONDS = 0.1
"""A round's data must take at least this long: shorter, a scheduler's time slices and the
page cache's writeback bursts on a busy machine are as long as the halves compared."""
MIN_ROUND_REQUESTS = 8
"""Data requests a round needs so that each half holds several."""
HALVES_TOLERANCE = 1.5
"""The second half of a round's bytes may go at most this much faster or slower than the
first (geometric mean over the rounds) for the round to count as steady."""
WARMUP_FACTOR = 0.9
"""A run's first round is a warm-up when its throughput is below this share of every other
round's."""
MAX_RELATIVE_INTERVAL = 0.5
"""A projection whose write time's interval is wider than ±50% is refused as too noisy."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """Figures of a measured target, fitted from request records (see the module docstring)."""

    target: str
    request_latency: float
    stream_bandwidth: float
    aggregate_bandwidth: float
    """The node's steady data throughput (bytes/s): a run on one node measures its path to the
    storage, which becomes the profile's node link."""
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
    """The node's steady read throughput (bytes/s)."""
    read_requests: int = 0
    rounds: int = 1
    """Rounds the figures are fitted from."""

    def as_profile(self, *, name: str | None = None) -> Profile:
        """A :class:`Profile` with the fitted figures. The run's throughput becomes the node
        link (the run was on one node); what one node cannot measure (aggregate, request-rate
        limits) is unbounded and says so."""
        from ckptio.profiles import Figure

        rounds = f", {self.rounds} rounds" if self.rounds > 1 else ""
        src = f"fitted from measured requests of {self.target} ({self.requests} requests{rounds})"
        if self.emulated:
            src += " — emulated target"
        if self.mock:
            src += " — mock target, not a performance figure"
        unmeasured = "not measurable from one node's run (assumption: unbounded)"
        figures = {
            "request_latency": Figure(max(self.request_latency, 1e-6), src),
            "stream_bandwidth": Figure(self.stream_bandwidth, src),
            "node_bandwidth": Figure(
                self.aggregate_bandwidth, src + " (the steady data throughput of one node)"
            ),
            "aggregate_bandwidth": Figure(math.inf, unmeasured),
            "write_request_rate": Figure(math.inf, unmeasured),
            "read_request_rate": Figure(math.inf, unmeasured),
            "metadata_latency": Figure(
                max(self.request_latency, 1e-6), src + " (assumption: as request_latency)"
            ),
        }
        if self.read_stream_bandwidth is not None:
            rsrc = src.replace(f"({self.requests} requests", f"({self.read_requests} reads")
            figures["read_request_latency"] = Figure(
                max(self.read_request_latency or 0.0, 1e-6), rsrc
            )
            figures["read_stream_bandwidth"] = Figure(self.read_stream_bandwidth, rsrc)
            if self.read_node_bandwidth:
                figures["read_node_bandwidth"] = Figure(
                    self.read_node_bandwidth, rsrc + " (the steady read throughput of one node)"
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


# -- rounds ------------------------------------------------------------------------------------

_WRITES = ("write", "put")


@dataclass(frozen=True, slots=True)
class Round:
    """One round (an iteration of a run) of a target, as the steady-state checks see it."""

    run_id: str
    iteration: int
    writes: list[dict[str, Any]]
    """The write phase's successful data requests (request rows)."""
    reads: list[dict[str, Any]]
    """The read phase's successful data requests (GETs)."""
    write_bytes: int
    write_span: float
    """Seconds from the first data request to the last request before the commit."""
    read_bytes: int
    read_span: float
    halves: float
    """Throughput of the second half of the bytes over the first's (NaN: cannot tell)."""
    run: dict[str, Any]
    """The round's row of the runs table."""

    @property
    def throughput(self) -> float:
        """Steady data throughput of the write, bytes/s (0 with no data)."""
        return self.write_bytes / self.write_span if self.write_span > 0 else 0.0

    @property
    def read_throughput(self) -> float:
        return self.read_bytes / self.read_span if self.read_span > 0 else 0.0


def _halves(writes: list[dict[str, Any]], start: float, end: float) -> float:
    """Throughput of the second half of the bytes (by completion) over the first half's."""
    total = sum(r["nbytes"] for r in writes)
    done = 0
    for r in sorted(writes, key=lambda r: r["end"]):
        done += r["nbytes"]
        if done >= total / 2:
            first, second = r["end"] - start, end - r["end"]
            if first <= 0 or second <= 0 or done >= total:
                return math.nan
            return ((total - done) / second) / (done / first)
    return math.nan


def read_rounds(
    requests: Sequence[Mapping[str, Any]],
    runs: Sequence[Mapping[str, Any]],
    phases: Sequence[Mapping[str, Any]] = (),
    *,
    phase_names: tuple[str, str] = ("write", "read"),
) -> list[Round]:
    """The rounds of ``runs`` (rows of the runs table) with their requests, in run order.
    ``phase_names``: the request phases that are the write and the read (a tiered run's fast
    tier: ``save`` and ``restore``)."""
    wname, rname = phase_names
    commits = {
        (p["run_id"], p["iteration"]): p["start"] for p in phases if p.get("phase") == "commit"
    }
    by_round: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in requests:
        by_round.setdefault((r["run_id"], int(r["iteration"])), []).append(r)
    out = []
    for row in runs:
        key = (row["run_id"], int(row["iteration"]))
        mine = by_round.get(key, [])
        ok = [r for r in mine if r["outcome"] == "ok"]
        writes = [dict(r) for r in ok if r["phase"] == wname and r["op"] in _WRITES and r["nbytes"]]
        reads = [dict(r) for r in ok if r["phase"] == rname and r["op"] == "get" and r["nbytes"]]
        w_bytes, w_span, halves = 0, 0.0, math.nan
        if writes:
            start = min(r["start"] for r in writes)
            commit = commits.get(key, math.inf)
            end = max(r["end"] for r in mine if r["phase"] == wname and r["start"] < commit)
            w_bytes, w_span = sum(r["nbytes"] for r in writes), end - start
            halves = _halves(writes, start, end)
        r_bytes = sum(r["nbytes"] for r in reads)
        r_span = (max(r["end"] for r in reads) - min(r["start"] for r in reads)) if reads else 0.0
        out.append(
            Round(
                row["run_id"],
                key[1],
                writes,
                reads,
                w_bytes,
                w_span,
                r_bytes,
                r_span,
                halves,
                dict(row),
            )
        )
    return sorted(out, key=lambda r: min((w["start"] for w in r.writes), default=0.0))


def warmups(rounds: Sequence[Round]) -> list[Round]:
    """The rounds that are warm-ups: a run's first round slower than :data:`WARMUP_FACTOR`
    of every other round of the target."""
    out = []
    for r in rounds:
        others = [o.throughput for o in rounds if o is not r and o.throughput > 0]
        if r.iteration == 0 and is_warmup(r.throughput, others):
            out.append(r)
    return out


def is_warmup(first: float, others: Sequence[float]) -> bool:
    """Whether a run's first round, at rate ``first``, is a warm-up: slower than
    :data:`WARMUP_FACTOR` of every one of the ``others`` (the rule of :func:`warmups` and
    :func:`fit_peer_link`)."""
    return bool(others) and 0 < first < WARMUP_FACTOR * min(others)


# -- one target --------------------------------------------------------------------------------


@dataclass
class TargetFit:
    """A measured target's rounds, the figures fitted from its steady ones, and whether it may
    be projected (``refusal`` None) or why not."""

    target: str
    rounds: list[Round]
    used: list[Round]
    """The steady rounds the figures come from (``rounds`` less the warm-ups)."""
    pooled: Calibration | None
    """Fitted from every used round together (None: nothing to fit)."""
    per_round: list[Calibration]
    """Fitted from each used round alone."""
    refusal: str | None = None
    """Why the target is not projected (None: it is)."""
    notes: list[str] = field(default_factory=list)
    halves: float = math.nan
    """Geometric mean over the used rounds of :attr:`Round.halves`."""

    @property
    def warmup(self) -> list[Round]:
        return [r for r in self.rounds if r not in self.used]


def _calibration(target: str, rounds: Sequence[Round], *, flags: Mapping[str, bool]) -> Calibration:
    import statistics

    writes = [r for rd in rounds for r in rd.writes]
    reads = [r for rd in rounds for r in rd.reads]
    lat, bw = fit_latency_bandwidth([r["nbytes"] for r in writes], [r["seconds"] for r in writes])
    span = sum(rd.write_span for rd in rounds)
    read_side: dict[str, Any] = {}
    notes = []
    if reads:
        rlat, rbw = fit_latency_bandwidth(
            [r["nbytes"] for r in reads], [r["seconds"] for r in reads]
        )
        rspan = sum(rd.read_span for rd in rounds)
        read_side = dict(
            read_request_latency=rlat,
            read_stream_bandwidth=rbw,
            read_node_bandwidth=sum(rd.read_bytes for rd in rounds) / rspan if rspan > 0 else None,
            read_requests=len(reads),
        )
    else:
        notes.append("no reads measured; the read side uses the write side's figures")
    return Calibration(
        target=target,
        request_latency=lat,
        stream_bandwidth=bw,
        aggregate_bandwidth=sum(rd.write_bytes for rd in rounds) / span if span > 0 else math.inf,
        streams=max(1, max(int(rd.run.get("streams") or 1) for rd in rounds)),
        part_size=int(statistics.median(r["nbytes"] for r in writes)),
        requests=len(writes),
        emulated=flags.get("emulated", False),
        mock=flags.get("mock", False),
        notes=notes,
        rounds=len(rounds),
        **read_side,
    )


def _size_text(nbytes: float) -> str:
    """A size to ask for: rounded up to a power of two MiB (``--total-size 512MiB``)."""
    mib = 2 ** math.ceil(math.log2(max(nbytes / 2**20, 1)))
    return human_size(mib * 2**20).replace(" ", "")


def _refusal(target: str, used: Sequence[Round], halves: float) -> str | None:
    """Why ``used`` rounds cannot be projected, with what would do; None when they can."""
    import statistics

    n = len(used)
    if n < MIN_ROUNDS:
        return (
            f"{n} steady round{'s' if n != 1 else ''} of {target}: the spread between rounds is "
            f"unknown, so a projection would have no interval; run at least {MIN_ROUNDS} "
            f"(--iterations {MIN_ROUNDS + 1}: the first may be a warm-up)"
        )
    span = statistics.median(r.write_span for r in used)
    reqs = statistics.median(len(r.writes) for r in used)
    per_round = statistics.median(r.write_bytes for r in used)
    rate = statistics.median(r.throughput for r in used)
    if per_round < MIN_ROUND_BYTES or span < MIN_ROUND_SECONDS or reqs < MIN_ROUND_REQUESTS:
        need = max(
            MIN_ROUND_BYTES,
            per_round * 2 * MIN_ROUND_SECONDS / max(span, 1e-9),
            per_round * MIN_ROUND_REQUESTS / max(reqs, 1),
        )
        return (
            f"each round of {target} wrote {human_size(per_round)} in {human_seconds(span)} and "
            f"{reqs:g} data requests: too small to show its steady bandwidth (a round needs "
            f"{human_size(MIN_ROUND_BYTES)}, {human_seconds(MIN_ROUND_SECONDS)} and "
            f"{MIN_ROUND_REQUESTS} requests); about {_size_text(need)} per round would do "
            f"(--total-size {_size_text(need)})"
        )
    if math.isfinite(halves) and not 1 / HALVES_TOLERANCE <= halves <= HALVES_TOLERANCE:
        how = "faster" if halves > 1 else "slower"
        if halves > 1:  # a ramp: the first half lost about this much to starting up
            lost = span / 2 * (1 - 1 / halves)
            need = 10 * lost * rate * halves
        else:  # slowing down: a cache filling up; only a larger run shows where it ends
            need = 4 * per_round
        return (
            f"{target} was not at steady state: within each round the second half of the bytes "
            f"went {halves:.2f}x as fast as the first ({how}); about {_size_text(need)} per "
            f"round would do (--total-size {_size_text(need)})"
        )
    return None


def fit_target(
    target: str,
    requests: Sequence[Mapping[str, Any]],
    runs: Sequence[Mapping[str, Any]],
    phases: Sequence[Mapping[str, Any]] = (),
    *,
    phase_names: tuple[str, str] = ("write", "read"),
) -> TargetFit:
    """The rounds of one target (``runs``: its rows of the runs table, ``requests`` and
    ``phases`` theirs), its warm-ups, the figures of its steady rounds, pooled and per round,
    and the refusal when they cannot be projected (see the module docstring)."""
    rounds = [r for r in read_rounds(requests, runs, phases, phase_names=phase_names) if r.writes]
    flags = {
        "emulated": any(bool(r.get("emulated")) for r in runs),
        "mock": any(bool(r.get("mock")) for r in runs),
    }
    if not rounds:
        return TargetFit(
            target, [], [], None, [], refusal=f"no measured data requests of {target} to fit"
        )
    warm = warmups(rounds)
    used = [r for r in rounds if r not in warm]
    logs = [math.log(r.halves) for r in used if math.isfinite(r.halves) and r.halves > 0]
    halves = math.exp(sum(logs) / len(logs)) if logs else math.nan
    notes = [
        f"round {r.iteration + 1} of {r.run_id} left out: a warm-up ({r.throughput / 1e9:.3g} GB/s "
        f"against {min(o.throughput for o in used) / 1e9:.3g} GB/s or more in the others)"
        for r in warm
    ]
    return TargetFit(
        target,
        rounds,
        used,
        _calibration(target, used, flags=flags),
        [_calibration(target, [r], flags=flags) for r in used],
        refusal=_refusal(target, used, halves),
        notes=notes,
        halves=halves,
    )


def with_intervals(
    central: dict[str, Any],
    per_round: Sequence[Mapping[str, Any]],
    *,
    guard: str = "write_seconds",
    what: str = "",
) -> dict[str, Any]:
    """``central`` (a projection from pooled rounds) with ``<key>_low`` and ``<key>_high``
    beside every number that each of ``per_round`` (the same projection from each round
    alone) has too (:func:`ckptio.intervals.spread_interval`), ``rounds`` and ``interval``
    (how the intervals were made). When ``guard``'s interval is wider than
    :data:`MAX_RELATIVE_INTERVAL`, the projection is refused as too noisy: the result has
    ``refusal`` (saying how many rounds would do) and no figures; ``what`` names the target."""
    out = dict(central)
    n = len(per_round)
    for key, value in central.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        vals = [p.get(key) for p in per_round]
        if any(not isinstance(v, int | float) or isinstance(v, bool) for v in vals):
            continue
        iv: Interval | None = spread_interval(float(value), [float(v) for v in vals])  # type: ignore[arg-type]
        if iv is not None:
            out[f"{key}_low"], out[f"{key}_high"] = iv.low, iv.high
    out["rounds"] = n
    out["interval"] = f"95% interval over {n} rounds (Student's t)"
    g = central.get(guard)
    if isinstance(g, int | float) and g > 0 and f"{guard}_high" in out:
        rel = (out[f"{guard}_high"] - g) / g
        if rel > MAX_RELATIVE_INTERVAL:
            need = rounds_needed(rel * math.sqrt(n) / t_quantile(n - 1), 0.2)
            words = {k: v for k, v in central.items() if isinstance(v, str | bool | None)}
            return {
                **words,
                "rounds": n,
                "refusal": f"too noisy to project {what or central.get('target', '')}: "
                f"±{rel:.0%} over {n} rounds; about {need} rounds would give ±20% "
                f"(--iterations {need + 1})",
            }
    return out


def project_rounds(
    workload: Any,
    conditions: Any,
    pooled: tuple[Profile, Profile | None],
    rounds: Sequence[tuple[Profile, Profile | None]],
    *,
    what: str = "",
    peer_link: PeerLinkFit | None = None,
) -> dict[str, Any]:
    """:func:`ckptio.stallmodel.project` of ``workload`` with the ``pooled`` (profile, fast
    tier or None) and with each round's, the first's figures with the others' intervals
    (:func:`with_intervals`): a measured target at full scale. Without ``rounds``: the
    pooled projection alone (deterministic). ``peer_link``: the node link to peers fitted
    from measured restores (:func:`fit_peer_link`), pooled for the figures and each of its
    rounds beside each round of the profiles (in order, its rounds repeated where fewer),
    so that its spread reaches the intervals too."""
    from ckptio.stallmodel import project

    def cond(i: int | None) -> Any:
        if peer_link is None or not conditions.peers or conditions.peer_bandwidth is not None:
            return conditions  # no peers, no measured restore, or a figure given: as it is
        link = peer_link.per_round[i % len(peer_link.per_round)] if i is not None else None
        return replace(
            conditions,
            peer_bandwidth=peer_link.bandwidth if link is None else link,
            peer_bandwidth_source=peer_link.source(),
        )

    central = project(workload, pooled[0], cond(None), local=pooled[1])
    if not rounds:
        if peer_link is not None and len(peer_link.per_round) > 1 and cond(0) is not conditions:
            rounds = [pooled] * len(peer_link.per_round)  # the profile's exact, the link's not
        else:
            return central
    per = [project(workload, p, cond(i), local=loc) for i, (p, loc) in enumerate(rounds)]
    return with_intervals(central, per, what=what)


def fit_profiles(
    fit: TargetFit, overrides: Mapping[str, Any] | None = None
) -> tuple[Profile, list[Profile]]:
    """A projectable fit's profiles: pooled and per round, with ``overrides`` (``--set``)."""
    if fit.pooled is None or fit.refusal:
        raise errors.InvalidArgumentError(f"{fit.target} cannot be projected: {fit.refusal}")
    name = f"measured:{fit.target}"
    return (
        fit.pooled.as_profile(name=name).with_overrides(dict(overrides or {})),
        [c.as_profile(name=name).with_overrides(dict(overrides or {})) for c in fit.per_round],
    )


def calibrate(requests: Any, runs: Any, phases: Any = ()) -> list[Calibration]:
    """The pooled :class:`Calibration` of each target of result tables (pyarrow tables of the
    results schema, :mod:`ckptio.results`, or lists of row dicts): one per target with
    measured data requests, whether or not it may be projected (:func:`fit_target` says)."""
    return [f.pooled for f in fit_targets(requests, runs, phases) if f.pooled is not None]


def fit_targets(
    requests: Any, runs: Any, phases: Any = (), sessions: Mapping[str, str] | None = None
) -> list[TargetFit]:
    """:func:`fit_target` of each target in result tables, separately per session
    (``sessions``: run_id -> session, :meth:`ckptio.results.Results.sessions`; a target
    measured in several is named with each session's time)."""
    from ckptio.results import session_name

    def rows(t: Any) -> list[dict[str, Any]]:
        return t.to_pylist() if hasattr(t, "to_pylist") else list(t)

    req, run_rows, phase_rows = rows(requests), rows(runs), rows(phases)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in run_rows:
        session = (sessions or {}).get(r["run_id"], "")
        groups.setdefault((r["target"], session), []).append(r)
    several = {t for t, _ in groups if sum(1 for u, _ in groups if u == t) > 1}
    out = []
    for (target, session), mine in sorted(groups.items()):
        ids = {r["run_id"] for r in mine}
        name = f"{target} [{session_name(session)}]" if target in several else target
        out.append(
            fit_target(
                name,
                [r for r in req if r["run_id"] in ids],
                mine,
                [p for p in phase_rows if p["run_id"] in ids],
            )
        )
    return out


def calibrate_results(paths: list[str]) -> list[TargetFit]:
    """:func:`fit_targets` over result files or directories (read with ckptio.results)."""
    from ckptio.results import read_results

    res = read_results(paths)
    fits = fit_targets(res.requests, res.runs, res.phases, res.sessions())
    fits = [f for f in fits if f.pooled is not None]
    if not fits:
        raise errors.InvalidArgumentError(
            f"no measured write requests in {', '.join(map(str, paths))} to fit a profile from"
        )
    return fits


@dataclass(frozen=True)
class PeerRound:
    """One measured restore from peer copies (a ``restore-peer`` round of one run): who was
    replaced, who sent them what, and the round's time (:func:`peer_rounds`)."""

    run: str
    iteration: int
    seconds: float
    """The slowest rank's restore among those that received bytes from peers."""
    received: dict[str, float]
    """Bytes each replaced node received from peers (by node; by host, or all together,
    in result files older than the ``node`` column)."""
    sent: dict[str, float]
    """Bytes each sending node sent (empty in files older than ``peer_sources``)."""
    serves: dict[str, frozenset[str]]
    """The replaced nodes each sending node sent to."""

    @property
    def fan_in(self) -> int:
        """The most replaced nodes one sending node served (without senders recorded: the
        replaced nodes of the round, all served by one sender as the older runs lost one)."""
        return max((len(v) for v in self.serves.values()), default=len(self.received))

    @property
    def busiest(self) -> float:
        """Bytes the busiest sending node sent (without senders recorded: the most one
        replaced node received, one sender each)."""
        return max(self.sent.values(), default=max(self.received.values()))

    @property
    def link(self) -> float:
        """Bytes/s of the busiest sending node's link: its bytes over the round's time."""
        return self.busiest / self.seconds

    @property
    def node_bytes(self) -> float:
        """Bytes of one replaced node's restore from peers (their mean)."""
        return sum(self.received.values()) / len(self.received)


def peer_rounds(phases: Any) -> list[PeerRound]:
    """The measured restores from peer copies in result tables (the ``restore-peer`` rows of a
    ``ckptio run --replicas K [--lose N]``): per run and iteration, the ranks whose restore
    took bytes from peers, by their node, and the nodes that sent them (``peer_sources``)."""
    rows = phases.to_pylist() if hasattr(phases, "to_pylist") else list(phases)
    acc: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        if r.get("phase") != "restore-peer" or not int(r.get("peer_bytes") or 0) > 0:
            continue
        if r.get("restore_path") != "peer" and not r.get("peer_sources"):
            continue  # a rank that only took another rank's objects (resharded)
        if not float(r.get("seconds") or 0) > 0:
            continue
        got = acc.setdefault(
            (r["run_id"], int(r["iteration"])),
            {"seconds": 0.0, "received": {}, "sent": {}, "serves": {}},
        )
        node = str(r.get("node") or r.get("host") or "")
        got["seconds"] = max(got["seconds"], float(r["seconds"]))
        got["received"][node] = got["received"].get(node, 0.0) + float(r["peer_bytes"])
        for sender, nbytes in (json.loads(r.get("peer_sources") or "{}") or {}).items():
            got["sent"][sender] = got["sent"].get(sender, 0.0) + float(nbytes)
            got["serves"].setdefault(sender, set()).add(node)
    return [
        PeerRound(
            run,
            it,
            g["seconds"],
            g["received"],
            g["sent"],
            {k: frozenset(v) for k, v in g["serves"].items()},
        )
        for (run, it), g in sorted(acc.items())
    ]


@dataclass(frozen=True)
class PeerLinkFit:
    """A node's link to its peers as measured restores from a peer copy showed it
    (:func:`fit_peer_link`): per round, the bytes the busiest sending node sent over the
    round's time (the slowest restoring rank's), so that rounds where a sender served one
    replaced node and rounds where it served two give the same figure for the same link.
    That time holds the restore's planning, the sender's read of the copy and both ends'
    CRC32C checks as well as the transfer: an effective figure, a lower bound on the link
    itself."""

    bandwidth: float
    """Bytes/s: the rounds' busiest senders' bytes over their seconds, pooled."""
    per_round: tuple[float, ...]
    """Bytes/s of each round alone."""
    interval: Interval | None
    """``bandwidth`` with the 95% interval the spread of ``per_round`` gives it (None with
    one round)."""
    fan_in: int
    """The replaced nodes one sending node served at most in the rounds fitted, as the rows
    record it: what the figure was measured at."""
    runs: tuple[str, ...]
    warmup: int = 0
    """Rounds left out as warm-ups (a run's first, much slower than its others)."""
    check: str = ""
    """:meth:`FanInCheck.text` where the rounds hold fan-in 1 and a higher one ("" else)."""

    def source(self) -> str:
        """Where the figure comes from, with its uncertainty, in words."""
        n = len(self.per_round)
        spread = (
            f"95% interval {human_rate(self.interval.low)}-{human_rate(self.interval.high)}"
            if self.interval is not None
            else "no interval: one round"
        )
        return (
            f"fitted from {n} measured restore-peer round{'s' if n != 1 else ''} "
            f"({', '.join(self.runs)}; {spread}"
            + (f"; {self.warmup} warm-up round(s) left out" if self.warmup else "")
            + f"; at measured fan-in {self.fan_in}: the busiest sender's bytes over the round's "
            "time; effective: the restore's planning and CRC32C checks included)"
            + (f"; {self.check}" if self.check else "")
        )


def _steady(rounds: Sequence[PeerRound]) -> tuple[list[PeerRound], int]:
    """``rounds`` less each run's first where it is much slower than the run's others (one-time
    costs: connections, first-touch of buffers; as in fit_target), and how many were left."""
    kept: list[PeerRound] = []
    warm = 0
    for run in sorted({r.run for r in rounds}):
        its = sorted((r for r in rounds if r.run == run), key=lambda r: r.iteration)
        if is_warmup(its[0].link, [r.link for r in its[1:]]):
            its, warm = its[1:], warm + 1
        kept += its
    return kept, warm


def fit_peer_link(phases: Any, fan_in: int | None = None) -> PeerLinkFit | None:
    """The node link to peers from the ``restore-peer`` rows of result tables
    (:func:`peer_rounds`): one figure per round, the busiest sending node's bytes over the
    round's time, pooled over the steady rounds; only rounds at ``fan_in`` where given, else
    at the lowest fan-in the rows hold (one sender, one replaced node: what the model's
    ``link`` is; rounds at a higher one check the model's ``f * node / link`` against it,
    :func:`check_fan_in`, said in the fit's source). None where no round restored bytes from
    a peer."""
    every = peer_rounds(phases)
    if fan_in is None and every:
        fan_in = min(r.fan_in for r in every)
        checked = check_fan_in(phases)
    else:
        checked = None
    rounds = [r for r in every if r.fan_in == fan_in]
    if not rounds:
        return None
    kept, warm = _steady(rounds)
    pooled = sum(r.busiest for r in kept) / sum(r.seconds for r in kept)
    return PeerLinkFit(
        check=checked.text() if checked is not None else "",
        bandwidth=pooled,
        per_round=tuple(r.link for r in kept),
        interval=spread_interval(pooled, [r.link for r in kept]),
        fan_in=max(r.fan_in for r in kept),
        runs=tuple(sorted({r.run for r in kept})),
        warmup=warm,
    )


@dataclass(frozen=True)
class FanInCheck:
    """The model's peer restore term, ``f * node / link``, against measured restores at a
    fan-in ``f`` above 1 (:func:`check_fan_in`): the link fitted from the rounds at fan-in 1,
    the prediction for each round at ``f``, and the measured time over the predicted."""

    fan_in: int
    link: PeerLinkFit
    """The link at fan-in 1 the predictions use."""
    predicted: tuple[float, ...]
    measured: tuple[float, ...]
    ratio: float
    """The rounds' measured seconds over their predicted seconds, pooled (1: the term holds;
    above 1: the restore at ``f`` is slower than ``f`` times a node over the link)."""
    interval: Interval | None
    """``ratio``'s 95% interval from the spread of the rounds' ratios (None with one round);
    the fan-in-1 link's own interval is not folded in (:attr:`link` holds it)."""
    runs: tuple[str, ...]

    def text(self) -> str:
        spread = (
            f"95% interval {self.interval.low:.2f}-{self.interval.high:.2f}"
            if self.interval is not None
            else "no interval: one round"
        )
        n = len(self.measured)
        return (
            f"measured restores at fan-in {self.fan_in} took {self.ratio:.2f}x the model's "
            f"{self.fan_in} x node / link ({spread}; {n} round{'s' if n != 1 else ''} of "
            f"{', '.join(self.runs)}; the link fitted at fan-in 1: "
            f"{human_rate(self.link.bandwidth)})"
        )


def check_fan_in(phases: Any) -> FanInCheck | None:
    """The model's ``f * node / link`` against the measured restores from peers at the
    highest fan-in above 1 in result tables, the link fitted from their rounds at fan-in 1
    (:func:`fit_peer_link`); None without rounds at both."""
    rounds = peer_rounds(phases)
    link = fit_peer_link(phases, fan_in=1)
    high = max((r.fan_in for r in rounds), default=1)
    if link is None or high < 2:
        return None
    kept, _ = _steady([r for r in rounds if r.fan_in == high])
    predicted = [high * r.node_bytes / link.bandwidth for r in kept]
    measured = [r.seconds for r in kept]
    ratio = sum(measured) / sum(predicted)
    return FanInCheck(
        fan_in=high,
        link=link,
        predicted=tuple(predicted),
        measured=tuple(measured),
        ratio=ratio,
        interval=spread_interval(ratio, [m / p for m, p in zip(measured, predicted, strict=True)]),
        runs=tuple(sorted({r.run for r in kept})),
    )
