"""What several nodes add to a report: each node's figures and the slowest node of a run, and
the model checked against runs of one target on 1, 2, 3... writing nodes.

**Per node** (:func:`node_rows`). Every phase and request row names its host (the
``host`` column, :mod:`ckptio.results`). For each run whose ranks ran on more than one host,
a node's write (read) time in an iteration is its slowest rank's ``write`` (``read``) phase,
the time from that rank's first byte to its last durable one (for a tiered run, ``save`` and
``restore``); its throughput is the bytes of its ranks over that time, summed over the
iterations. The *slowest node* is the one with the longest write time; ``x fastest`` is its
time over the fastest node's. One run per row: measured, no interval.

**Scaling** (:func:`scaling_rows`). For each measured target run on several node counts
(runs of kind ``run``, the runs table's ``nodes``: the hosts whose ranks wrote), the model
(:func:`ckptio.stallmodel.estimate`) is fitted from the runs on the fewest nodes
(:func:`fitted_profile`: :func:`ckptio.calibration.calibrate` on those runs' requests — request
latency, per-stream bandwidth, and the run's throughput as one node's link; what one node
cannot measure, the storage's aggregate bandwidth, is unbounded there, an assumption) and
predicts the write of every node count's run from its own workload (bytes, ranks, ranks per
node, objects in flight). Where the measured throughput differs from the prediction by more
than :data:`DIFFERENCE_SHOWN` the row says so and why (:func:`why_different`). A second
prediction gives the model the aggregate measured on the most nodes, to show what the first
one lacked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

__all__ = [
    "DIFFERENCE_SHOWN",
    "fitted_profile",
    "markdown",
    "node_rows",
    "scaling_rows",
    "sections",
    "why_different",
]

DIFFERENCE_SHOWN = 0.25
"""Relative difference between measured and predicted throughput past which a scaling row
says the model and the measurement disagree, and why."""

#: kind of run -> (its write phase, its read phase) in the phases table
PHASES = {"run": ("write", "read"), "tiered": ("save", "restore")}


def _tables(res: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    return res.runs.to_pylist(), res.phases.to_pylist(), res.requests.to_pylist()


def node_rows(res: Any) -> list[dict[str, Any]]:
    """One row per (run, host) for every run whose ranks ran on more than one host (``res``:
    :class:`ckptio.results.Results`): ``target``, ``run_id``, ``nodes`` (the run's hosts),
    ``host``, ``ranks``,
    ``write_bytes``, ``write_seconds``, ``write_GBps``, ``read_seconds``, ``read_GBps``,
    ``requests``, ``slowest`` (the run's slowest writer) and ``vs_fastest`` (its write time
    over the fastest node's; on the slowest node's row)."""
    runs, phases, requests = _tables(res)
    kind = {r["run_id"]: r.get("kind") or "run" for r in runs}
    target = {r["run_id"]: r["target"] for r in runs}
    req_count: dict[tuple[str, str], int] = {}
    for q in requests:
        key = (q["run_id"], q.get("host") or "")
        req_count[key] = req_count.get(key, 0) + 1
    by_run: dict[str, list[dict[str, Any]]] = {}
    for p in phases:
        by_run.setdefault(p["run_id"], []).append(p)
    out: list[dict[str, Any]] = []
    for run_id, rows in by_run.items():
        hosts = sorted({p.get("host") or "" for p in rows})
        if len(hosts) < 2 or run_id not in kind:
            continue
        write, read = PHASES.get(kind[run_id], PHASES["run"])
        mine = []
        for host in hosts:
            on = [p for p in rows if (p.get("host") or "") == host]
            fig = {"write": [0, 0.0], "read": [0, 0.0]}
            for name, phase in (("write", write), ("read", read)):
                per_iter: dict[int, list[dict[str, Any]]] = {}
                for p in on:
                    if p["phase"] == phase:
                        per_iter.setdefault(p["iteration"], []).append(p)
                fig[name] = [
                    sum(p["bytes"] for ps in per_iter.values() for p in ps),
                    sum(max(p["seconds"] for p in ps) for ps in per_iter.values()),
                ]
            (wb, ws), (rb, rs) = fig["write"], fig["read"]
            mine.append(
                {
                    "target": target[run_id],
                    "run_id": run_id,
                    "nodes": len(hosts),
                    "host": host,
                    "ranks": sorted({p["rank"] for p in on}),
                    "write_bytes": int(wb),
                    "write_seconds": float(ws),
                    "write_GBps": wb / ws / 1e9 if ws > 0 else None,
                    "read_seconds": float(rs),
                    "read_GBps": rb / rs / 1e9 if rs > 0 else None,
                    "requests": req_count.get((run_id, host), 0),
                    "slowest": False,
                    "vs_fastest": None,
                }
            )
        timed = [m for m in mine if m["write_seconds"] > 0]
        if timed:
            slow = max(timed, key=lambda m: m["write_seconds"])
            fast = min(timed, key=lambda m: m["write_seconds"])
            slow["slowest"] = True
            slow["vs_fastest"] = slow["write_seconds"] / fast["write_seconds"]
        out += mine
    return out


def fitted_profile(res: Any, target: str, *, nodes: int | None = None) -> Any:
    """The storage profile the model fits from the measured runs of ``target`` on ``nodes``
    writing nodes (None: the fewest it was run on): :meth:`ckptio.calibration.Calibration.as_profile`
    of :func:`ckptio.calibration.calibrate` over those runs' requests, its streams per node those of
    every process on a node (the runs table records one process's). Raises
    :class:`~ckptio.errors.InvalidArgumentError` when there are no such runs."""
    from ckptio import errors
    from ckptio.calibration import calibrate

    runs, phases, requests = _tables(res)
    mine = [r for r in runs if r["target"] == target and (r.get("kind") or "run") == "run"]
    if nodes is None and mine:
        nodes = min(int(r.get("nodes") or 1) for r in mine)
    base = [r for r in mine if int(r.get("nodes") or 1) == nodes]
    ids = {r["run_id"] for r in base}
    cals = calibrate(
        [q for q in requests if q["run_id"] in ids],
        base,
        [p for p in phases if p["run_id"] in ids],
    )
    if not cals:
        raise errors.InvalidArgumentError(
            f"no measured write requests of {target!r} on {nodes} node(s) to fit a profile from"
        )
    profile = cals[0].as_profile(name=f"fitted:{target}@{nodes}node")
    # the runs record each process's streams; the model counts a node's: the processes of
    # a node each drive their own
    per_node = max(-(-int(r["ranks"] or 1) // max(1, int(r.get("nodes") or 1))) for r in base)
    return replace(profile, streams=profile.streams * per_node)


def _workload(run: dict[str, Any], phases: Sequence[dict[str, Any]], inflight: int) -> Any:
    """The model's workload of one iteration of a run: its bytes, its processes dealt onto
    its writing nodes, the busiest process's bytes and objects, ``inflight`` objects in
    flight per process."""
    from ckptio.stallmodel import Workload

    mine = [p for p in phases if p["run_id"] == run["run_id"] and p["phase"] == "write"]
    per_rank = max((p["bytes"] for p in mine), default=0) or run["checkpoint_bytes"]
    ranks = max(1, int(run["ranks"] or 1))
    nodes = max(1, int(run.get("nodes") or 1))
    return Workload(
        total_bytes=int(run["checkpoint_bytes"]),
        writing_ranks=ranks,
        bytes_per_rank=int(per_rank),
        objects_per_rank=max(1, -(-int(run["objects"] or ranks) // ranks)),
        ranks=ranks,
        ranks_per_node=-(-ranks // nodes),
        name=f"{run['preset']} on {nodes} node(s)",
        object_concurrency=max(1, inflight),
    )


def why_different(
    measured: float, predicted: float, nodes: int, base: int, binding: str, widest_GBps: float
) -> str:
    """Why a measurement and the model disagree (by more than :data:`DIFFERENCE_SHOWN`), from
    which way and where: the model fitted on ``base`` nodes predicting ``nodes`` nodes, with
    ``binding`` its binding limit there."""
    if nodes == base:
        return (
            "the model does not reproduce the run it was fitted from: its fitted request "
            f"latency and per-stream bandwidth miss what bound that run (it predicts "
            f"{binding}); metadata, commit and client queueing are outside those figures"
        )
    if measured < predicted:
        return (
            f"fitted from {base} node(s), the model has only per-node limits ({binding} binds), "
            "so it scales with the nodes: a limit the nodes share cannot be measured from one "
            "node (aggregate bandwidth unbounded: an assumption). The nodes did share one — "
            "the storage servers, or a network or CPUs all nodes use — measured at "
            f"{widest_GBps:.3g} GB/s on the most nodes"
        )
    return (
        f"the run on {nodes} node(s) beat the model fitted from {base}: the fitted run was "
        "slowed by something that did not scale with it (a busy machine, a cold cache, "
        "client queueing), or more nodes brought more servers or caches into play"
    )


def scaling_rows(res: Any) -> list[dict[str, Any]]:
    """One row per (measured target, node count) for targets run on several node counts:
    ``target``, ``nodes``, ``runs`` (steady iterations: rows of the runs table, less the
    warm-ups the fit leaves out too, :func:`ckptio.calibration.warmups`; ``warmups``: how
    many), ``measured_GBps`` (mean; ``measured_range``: min and max over them), ``predicted_GBps`` and ``binding`` (the model fitted on the fewest nodes),
    ``difference`` (measured / predicted - 1), ``with_aggregate_GBps`` (the model given the
    aggregate measured on the most nodes), ``flagged`` (|difference| >
    :data:`DIFFERENCE_SHOWN`) and ``why``."""
    from ckptio import errors
    from ckptio.calibration import read_rounds, warmups
    from ckptio.profiles import Figure
    from ckptio.stallmodel import estimate

    runs, phases, requests = _tables(res)
    inflight = {
        s.get("run_id"): int((s.get("config") or {}).get("inflight") or 2) for s in res.sidecars
    }
    measured = [
        r
        for r in runs
        if (r.get("kind") or "run") == "run"
        and not r.get("emulated")
        and not r.get("mock")
        and int(r.get("nodes") or 0) > 0
    ]
    out: list[dict[str, Any]] = []
    for target in sorted({r["target"] for r in measured}):
        mine = [r for r in measured if r["target"] == target]
        counts = sorted({int(r["nodes"]) for r in mine})
        if len(counts) < 2:
            continue
        try:
            profile = fitted_profile(res, target, nodes=counts[0])
        except errors.InvalidArgumentError:
            continue
        steady: dict[int, list[dict[str, Any]]] = {}
        for n in counts:
            at = [r for r in mine if int(r["nodes"]) == n]
            ids = {r["run_id"] for r in at}
            warm = {
                (w.run_id, w.iteration)
                for w in warmups(
                    read_rounds(
                        [q for q in requests if q["run_id"] in ids],
                        at,
                        [p for p in phases if p["run_id"] in ids],
                    )
                )
            }
            steady[n] = [r for r in at if (r["run_id"], r["iteration"]) not in warm] or at
        widest = [float(r["write_GBps"]) for r in steady[counts[-1]]]
        widest_GBps = sum(widest) / len(widest)
        src = f"measured: {target} on {counts[-1]} nodes, {len(widest)} steady iteration(s)"
        with_agg = replace(
            profile,
            figures={**profile.figures, "aggregate_bandwidth": Figure(widest_GBps * 1e9, src)},
        )
        for n in counts:
            at = [r for r in mine if int(r["nodes"]) == n]
            gbps = [float(r["write_GBps"]) for r in steady[n]]
            # the model takes the iteration's workload; runs at one node count share it
            work = _workload(at[0], phases, inflight.get(at[0]["run_id"], 2))
            est = estimate(work, profile, phase="write")
            est2 = estimate(work, with_agg, phase="write")
            mean = sum(gbps) / len(gbps)
            diff = mean / est.GBps - 1 if est.GBps and math.isfinite(est.GBps) else math.nan
            flagged = abs(diff) > DIFFERENCE_SHOWN
            out.append(
                {
                    "target": target,
                    "nodes": n,
                    "runs": len(steady[n]),
                    "warmups": len(at) - len(steady[n]),
                    "measured_GBps": mean,
                    "measured_range": (min(gbps), max(gbps)),
                    "predicted_GBps": est.GBps,
                    "binding": est.binding,
                    "difference": diff,
                    "with_aggregate_GBps": est2.GBps,
                    "flagged": flagged,
                    "why": why_different(mean, est.GBps, n, counts[0], est.binding, widest_GBps)
                    if flagged
                    else "",
                }
            )
    return out


def _g(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.3g}"


def sections(res: Any) -> list[dict[str, Any]]:
    """The report's sections on nodes: per node, and the scaling check, each a dict of
    ``title``, ``intro`` (text), ``header`` and ``rows`` (every cell a string); none when no run
    spanned several hosts and no target ran on several node counts."""
    from ckptio.units import human_size

    out: list[dict[str, Any]] = []
    nodes = node_rows(res)
    if nodes:
        out.append(
            {
                "title": "Per node",
                "intro": "Each node of every run whose ranks ran on several hosts: its ranks' "
                "bytes over its slowest rank's time (GB/s = 1e9 bytes/s); the run's slowest "
                "node marked, with its write time over the fastest node's. Measured, one run "
                "per row (no interval).",
                "header": [
                    "target",
                    "nodes",
                    "host",
                    "ranks",
                    "written",
                    "write s",
                    "write GB/s",
                    "read s",
                    "read GB/s",
                    "requests",
                    "slowest",
                ],
                "rows": [
                    [
                        r["target"],
                        str(r["nodes"]),
                        r["host"],
                        ",".join(map(str, r["ranks"])),
                        human_size(r["write_bytes"]),
                        _g(r["write_seconds"]),
                        _g(r["write_GBps"]),
                        _g(r["read_seconds"]),
                        _g(r["read_GBps"]),
                        str(r["requests"]),
                        f"slowest node, {r['vs_fastest']:.2f}x the fastest's time"
                        if r["slowest"]
                        else "",
                    ]
                    for r in nodes
                ],
            }
        )
    scaling = scaling_rows(res)
    if scaling:
        out.append(
            {
                "title": "The model against runs on more nodes",
                "intro": "Write throughput of each target run on several node counts, measured "
                "and predicted by the model (projected) fitted from the runs on the fewest "
                "nodes (as `ckptio model --from` fits one); the last but one column gives the "
                "model the aggregate bandwidth measured on the most nodes. Past "
                f"±{DIFFERENCE_SHOWN:.0%} the row says why they differ. Measured: the mean of "
                "the steady iterations (a run's first is left out when it is a warm-up, as "
                "the fit leaves it out; min to max where there are several).",
                "header": [
                    "target",
                    "nodes",
                    "measured GB/s",
                    "model GB/s",
                    "binding (model)",
                    "difference",
                    "model with the measured aggregate GB/s",
                    "why they differ",
                ],
                "rows": [
                    [
                        r["target"],
                        str(r["nodes"]),
                        _g(r["measured_GBps"])
                        + (
                            f" ({_g(r['measured_range'][0])} to {_g(r['measured_range'][1])}, "
                            f"{r['runs']} iterations"
                            + (f", {r['warmups']} warm-up left out)" if r["warmups"] else ")")
                            if r["runs"] > 1
                            else " (1 iteration" + (", warm-up left out)" if r["warmups"] else ")")
                        ),
                        _g(r["predicted_GBps"]),
                        r["binding"],
                        f"{r['difference']:+.0%}" if math.isfinite(r["difference"]) else "—",
                        _g(r["with_aggregate_GBps"]),
                        r["why"] or f"within ±{DIFFERENCE_SHOWN:.0%}",
                    ]
                    for r in scaling
                ],
            }
        )
    return out


def markdown(res: Any) -> list[str]:
    """:func:`sections` as Markdown lines (nothing when there are none)."""
    lines: list[str] = []
    for sec in sections(res):
        lines += [f"## {sec['title']}", "", sec["intro"], ""]
        lines.append("| " + " | ".join(sec["header"]) + " |")
        lines.append("|" + "---|" * len(sec["header"]))
        lines += [
            "| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in sec["rows"]
        ]
        lines.append("")
    return lines
