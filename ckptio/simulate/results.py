"""What a simulation returns, and its result files."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptio.simulate.job import Job
from ckptio.simulate.storage import Storage

if TYPE_CHECKING:
    pass

__all__ = [
    "SUMMARY_KEYS",
    "Bound",
    "PhaseResult",
    "Simulation",
    "median_interval",
    "read_summaries",
    "write_results",
]

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

    def add(self, runs: Sequence[tuple[Any, float, Bound]]) -> None:
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
