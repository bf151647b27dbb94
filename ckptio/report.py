"""Tables, Markdown, HTML and PNG plots from result files and the model.

Every figure shown carries what it is: **measured** (on real storage), **emulated** (through
the ``shaped`` backend: a profile imposed by sleeping, not the real service), **mock** (moto:
tests correctness, not a performance figure) or **projected** (the model at full scale).
"""

from __future__ import annotations

import math
from typing import Any

from ckptio.profiles import FIGURES, Profile
from ckptio.units import human_rate, human_seconds, human_size

__all__ = [
    "DEFAULT_PRICE_PER_GPU_HOUR",
    "DEFAULT_PROJECTIONS",
    "DEFAULT_RESTART_SECONDS",
    "KIND_NOTE",
    "KIND_STYLE",
    "MEASURED_NOTES",
    "REFERENCE_MTTF_GPUS",
    "REFERENCE_MTTF_SECONDS",
    "build_report",
    "fig_text",
    "md_table",
    "measured_note",
    "plot_cost",
    "plot_latency",
    "plot_sweep",
    "plot_throughput",
    "plot_timeline",
    "plots_unavailable",
    "point_text",
    "projection_rows",
    "run_kind",
    "run_point",
    "summary_rows",
]


def fig_text(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "unlimited"
    if unit == "s":
        return human_seconds(value)
    if unit == "B/s":
        return human_rate(value)
    return f"{value:,.0f}/s"


# -- merged results -> report ----------------------------------------------------------------

#: Colours per kind of figure, used in every plot and legend.
KIND_STYLE = {
    "measured": {"color": "#1f77b4", "hatch": ""},
    "emulated": {"color": "#ff7f0e", "hatch": "//"},
    "mock": {"color": "#9e9e9e", "hatch": "xx"},
    "projected": {"color": "#2ca02c", "hatch": ".."},
}
KIND_NOTE = {
    "measured": "measured",
    "emulated": "emulated (shaped backend: a profile imposed by sleeping)",
    "mock": "mock — not a performance figure",
    "projected": "projected by the model",
}

#: Default failure rate for the cost curves: Meta research clusters, job mean time to failure
#: 7.9 h at 1,024 GPUs (arXiv 2410.21680, secondary quote), scaled inversely with GPU count.
REFERENCE_MTTF_SECONDS = 7.9 * 3600
REFERENCE_MTTF_GPUS = 1024
#: Assumption: a restart (reschedule, load the checkpoint, warm up) takes 10 minutes.
DEFAULT_RESTART_SECONDS = 600.0
#: Assumption: price of one GPU-hour (on-demand H100-class cloud capacity, order of magnitude).
DEFAULT_PRICE_PER_GPU_HOUR = 2.0

#: Full-scale projection used when none is asked for: GPT-3 175B as its preset lays it out.
DEFAULT_PROJECTIONS = ("gpt3-175b",)


MEASURED_NOTES = {"rgw": "measured — Ceph RGW on loopback"}
"""What a measured target of ``ckptio compare`` is, where its name alone does not say: ``rgw``
is a real S3 implementation run on this machine (:mod:`ckptio.rgwserver`), not a cloud
service."""


def measured_note(target: str) -> str:
    """``measured``, or what :data:`MEASURED_NOTES` says about ``target``."""
    return MEASURED_NOTES.get(target, "measured")


def run_kind(row: dict[str, Any]) -> str:
    """``mock``, ``emulated`` or ``measured`` for a row of the runs table."""
    if row.get("mock"):
        return "mock"
    if row.get("emulated"):
        return "emulated"
    return "measured"


def _targets(
    runs: list[dict[str, Any]],
    sidecars: list[dict[str, Any]] | None = None,
    phases: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One entry per (site, target): its label, kind, and its run rows. A tiered target
    (:mod:`ckptio.tierbench`) also has ``tiers`` (its sidecar's), ``phase_kinds`` (measured or
    emulated, per phase) and ``phase_seconds`` (mean seconds of each phase)."""
    from ckptio.tierbench import tier_kinds

    by_id = {s.get("run_id"): s for s in sidecars or []}
    sites = {r.get("site") or "" for r in runs}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r.get("site") or "", r["target"]), []).append(r)
    out = []
    for (site, target), rows in groups.items():
        kind = run_kind(rows[0])
        name = f"{target} @ {site}" if len(sites) > 1 and site else target
        tag = {
            "mock": "mock",
            "emulated": f"emulated {rows[0].get('profile') or ''}".strip(),
            "measured": measured_note(target),
        }[kind]
        entry = {
            "name": name,
            "label": f"{name} ({tag})",
            "kind": kind,
            "site": site,
            "target": target,
            "rows": rows,
            "profile": rows[0].get("profile") or "",
            "backend": rows[0].get("backend") or "",
        }
        side = by_id.get(rows[0]["run_id"])
        kinds = tier_kinds(side) if rows[0].get("kind") == "tiered" else None
        if side and kinds:
            ids = {r["run_id"] for r in rows}
            mine = [p for p in phases or [] if p["run_id"] in ids]
            entry.update(
                label=f"{name} ({side['tiers']['note']})",
                tiers=side["tiers"],
                phase_kinds=kinds,
                phase_seconds={
                    ph: _finite(_mean([p["seconds"] for p in mine if p["phase"] == ph]))
                    for ph in kinds
                },
            )
        out.append(entry)
    order = {"measured": 0, "emulated": 1, "mock": 2}
    return sorted(out, key=lambda t: (order[t["kind"]], t["name"]))


def _mean(values: list[float]) -> float:
    vals = [v for v in values if v is not None and v == v and v > 0]
    return sum(vals) / len(vals) if vals else float("nan")


def _finite(x: float) -> float | None:
    """``None`` for NaN/inf, so JSON output stays valid."""
    return x if isinstance(x, int | float) and math.isfinite(x) else None


def _g(x: float | None, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def _target_profile(
    t: dict[str, Any], requests: list[dict[str, Any]]
) -> tuple[Profile | None, str]:
    """The profile a target is projected with: its emulated profile, or figures fitted from
    its measured requests; mock targets are not projected."""
    from ckptio import errors
    from ckptio.profiles import load_profile

    if t["kind"] == "mock":
        return None, "mock — not projected"
    if t["kind"] == "emulated":
        try:
            return load_profile(t["profile"]), f"profile {t['profile']} (emulated)"
        except errors.InvalidArgumentError as err:  # a profile from another install: say so
            return None, f"profile {t['profile']!r} unknown here ({err})"
    ids = {r["run_id"] for r in t["rows"]}
    mine = [r for r in requests if r["run_id"] in ids]
    runs = [{**r, "target": t["target"]} for r in t["rows"]]
    return _fitted(mine, runs, t["name"], "fitted", "no measured requests to fit")


def _fitted(
    requests: list[dict[str, Any]], runs: list[dict[str, Any]], name: str, how: str, none: str
) -> tuple[Profile | None, str]:
    """The profile :func:`ckptio.model.calibrate` fits to one target's requests and runs, and
    how it was made in words (``how``: the start of them; ``none``: said when nothing fits)."""
    from ckptio.model import calibrate

    cals = calibrate(requests, runs)
    if not cals:
        return None, none
    c = cals[0]
    return c.as_profile(name=name), (
        f"{how}: {human_seconds(c.request_latency)} latency, {human_rate(c.stream_bandwidth)} "
        f"per stream, {human_rate(c.aggregate_bandwidth)} seen from one node"
    )


def _fast_tier_profile(t: dict[str, Any], requests: list[dict[str, Any]]) -> tuple[Any, str]:
    """A tiered target's fast-tier profile: the emulated one, or figures fitted from the
    requests of its measured saves (this machine's disk)."""
    from ckptio.model import Calibration, fit_latency_bandwidth
    from ckptio.profiles import load_profile

    tiers = t["tiers"]
    if not tiers.get("local_measured"):
        return load_profile(tiers["local"]), f"profile {tiers['local']} (emulated)"
    ids = {r["run_id"] for r in t["rows"]}
    rows = [
        r
        for r in requests
        if r["run_id"] in ids
        and r["phase"] == "save"
        and r["op"] in ("write", "put")
        and r["outcome"] == "ok"
        and r["nbytes"] > 0
    ]
    if not rows:
        return None, "no measured fast-tier requests to fit"
    lat, bw = fit_latency_bandwidth([r["nbytes"] for r in rows], [r["seconds"] for r in rows])
    node = _mean([r["write_GBps"] for r in t["rows"]]) * 1e9
    import statistics

    c = Calibration(
        target=f"{t['name']} fast tier",
        request_latency=lat,
        stream_bandwidth=bw,
        aggregate_bandwidth=node,
        streams=max(1, len({r["thread"] for r in rows})),
        part_size=int(statistics.median(r["nbytes"] for r in rows)),
        requests=len(rows),
    )
    return c.as_profile(name=f"{tiers['local']} (fitted)"), (
        f"this machine's disk, fitted (measured): {human_rate(node)} per node"
    )


def _durable_tier_profile(
    t: dict[str, Any], requests: list[dict[str, Any]]
) -> tuple[Profile | None, str]:
    """A tiered target's durable-tier profile: the emulated one, or figures fitted from the
    requests of its measured drains (writes) and restores from that tier (reads)."""
    from ckptio.profiles import load_profile

    tiers = t["tiers"]
    if not tiers.get("durable_measured"):
        return load_profile(tiers["durable"]), f"profile {tiers['durable']} (emulated)"
    ids = {r["run_id"] for r in t["rows"]}
    seconds = t.get("phase_seconds") or {}
    # the drain is the durable tier's write, the restore from it its read
    as_run = {"drain": "write", "restore-durable": "read"}
    mine = [
        {**r, "phase": as_run[r["phase"]], "target": t["target"]}
        for r in requests
        if r["run_id"] in ids and r["phase"] in as_run
    ]

    def rate(row: dict[str, Any], phase: str) -> float:
        s = seconds.get(phase)
        return row["checkpoint_bytes"] / s / 1e9 if s else 0.0

    runs = [
        {
            **r,
            "target": t["target"],
            "write_GBps": rate(r, "drain"),
            "read_GBps": rate(r, "restore-durable"),
        }
        for r in t["rows"]
    ]
    return _fitted(
        mine,
        runs,
        tiers["durable"],
        f"{tiers['durable']}, fitted from its drains (measured)",
        "no measured drain requests to fit",
    )


def projection_rows(
    targets: list[dict[str, Any]],
    requests: list[dict[str, Any]],
    presets: list[tuple[str, int | None]],
    *,
    interval: float,
    price: float,
    restart: float | None,
) -> list[dict[str, Any]]:
    """Full-scale projections: for each preset and target, the stall, its binding limit in
    words, the restore and the restart (``restart`` None: the model's fixed overhead plus the
    projected restore; else ``restart`` seconds), idle fractions and cost per day. A tiered
    target (see :mod:`ckptio.tierbench`) is projected with the model's tiered projection: its
    durable profile drained from its fast tier (``drain_seconds``, ``drain_fits_interval``),
    a restore from either tier weighted by the probability that a failure loses the node."""
    from ckptio.model import (
        DEFAULT_P_LOSE_NODE,
        DEFAULT_RESTART_OVERHEAD,
        DEFAULT_SNAPSHOT_BANDWIDTH,
        CostModel,
        _restart,
        _tiered_target,
        estimate,
        preset_workload,
    )

    rows = []
    for preset, gpus in presets:
        w = preset_workload(preset, gpus=gpus)
        mtbf = REFERENCE_MTTF_SECONDS * REFERENCE_MTTF_GPUS / w.gpus
        snapshot = w.bytes_per_rank / DEFAULT_SNAPSHOT_BANDWIDTH
        base = {
            "preset": preset,
            "gpus": w.gpus,
            "writing_ranks": w.writing_ranks,
            "checkpoint_bytes": w.total_bytes,
        }
        for t in targets:
            head = {**base, "target": t["label"], "name": t["name"], "kind": t["kind"]}
            if t.get("tiers"):
                durable, durable_how = _durable_tier_profile(t, requests)
                local, how = _fast_tier_profile(t, requests)
                if local is None or durable is None:
                    why = how if local is None else durable_how
                    rows.append(
                        {**head, "profile": why, "write_seconds": None, "binding_detail": why}
                    )
                    continue
                tier = _tiered_target(
                    w,
                    durable,
                    local,
                    streams=None,
                    part_size=None,
                    persist_every=1,
                    p_lose_node=DEFAULT_P_LOSE_NODE,
                    interval=interval,
                    async_save=False,
                    snapshot=snapshot,
                    restart_seconds=restart,
                    restart_overhead=DEFAULT_RESTART_OVERHEAD,
                    cost_kw=dict(
                        interval=interval, gpus=w.gpus, price_per_gpu_hour=price, mtbf=mtbf
                    ),
                )
                rows.append(
                    {
                        **{k: v for k, v in tier.items() if k not in ("write", "read", "target")},
                        **head,
                        "kind": {2: "measured", 1: "measured + emulated", 0: "emulated"}[
                            bool(t["tiers"].get("local_measured"))
                            + bool(t["tiers"].get("durable_measured"))
                        ],
                        "profile": f"durable: {durable_how}; fast: {how}",
                        "stall_seconds": tier["write_seconds"],
                        "write_GBps": w.total_bytes / tier["write_seconds"] / 1e9,
                        "remedy": "",
                        "async_stall_seconds": snapshot,
                    }
                )
                continue
            prof, how = _target_profile(t, requests)
            if prof is None:
                rows.append({**head, "profile": how, "write_seconds": None, "binding_detail": how})
                continue
            e = estimate(w, prof)
            r = estimate(w, prof, phase="restore")
            rs = _restart(restart, DEFAULT_RESTART_OVERHEAD, r.seconds, f"projected: {r.binding}")
            cost = CostModel(
                e.seconds,
                interval=interval,
                gpus=w.gpus,
                price_per_gpu_hour=price,
                mtbf=mtbf,
                restart_seconds=rs["restart_seconds"],
            ).report()
            rows.append(
                {
                    **head,
                    "profile": how,
                    "write_seconds": e.seconds,
                    "stall_seconds": e.seconds,
                    "write_GBps": e.GBps,
                    "binding": e.binding,
                    "binding_detail": e.binding_detail,
                    "remedy": e.remedy,
                    "drain_seconds": None,
                    "drain_fits_interval": None,
                    "restore_seconds": r.seconds,
                    "restore_binding": r.binding,
                    "restore_binding_detail": r.binding_detail,
                    **rs,
                    **cost,
                    # async save: GPUs wait only for the device->host snapshot (assumed 25 GB/s
                    # per GPU), if the background write finishes within the interval
                    "async_stall_seconds": snapshot,
                    "async_fits_interval": e.seconds <= interval,
                }
            )
    return rows


# -- plots -------------------------------------------------------------------------------------


def plots_unavailable() -> str | None:
    """Why plots cannot be drawn here (matplotlib is not installed, with the pip extra that
    installs it), or None. Checked before any work, so that a report (or ``ckptio compare``,
    before its measurements) says so up front and is written without plots."""
    from ckptio import errors

    try:
        errors.require("matplotlib.pyplot", extra="report", purpose="the report's plots")
    except errors.BackendUnavailableError as err:
        return str(err)
    return None


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 12, "figure.dpi": 110})
    return plt


def _kind_legend(ax: Any, kinds: set[str], *, loc: str = "lower right", **where: Any) -> None:
    """The measured / emulated / mock key; ``ax`` may be an Axes or a Figure."""
    from matplotlib.patches import Patch

    handles = [
        Patch(
            facecolor=KIND_STYLE[k]["color"],
            hatch=KIND_STYLE[k]["hatch"],
            edgecolor="black",
            label=KIND_NOTE[k],
        )
        for k in KIND_STYLE
        if k in kinds
    ]
    ax.legend(handles=handles, loc=loc, fontsize=8, framealpha=0.9, **where)


def plot_throughput(summary: list[dict[str, Any]], path: str) -> str:
    """Bars of write and read throughput (GB/s, mean over iterations) per row of
    :func:`summary_rows`: one per target and point, never points averaged together."""
    plt = _plt()
    rows = [
        (
            {**s, "label": f"{s['label']} {s['point']}".strip()},
            s["write_GBps"] if s["write_GBps"] is not None else float("nan"),
            s["read_GBps"] if s["read_GBps"] is not None else float("nan"),
        )
        for s in summary
    ]
    import textwrap

    n = len(rows)
    height = 1.6 + 0.9 * n
    fig, ax = plt.subplots(figsize=(9, height))
    for i, (t, wgb, rgb) in enumerate(rows):
        st = KIND_STYLE[t["kind"]]
        y = n - 1 - i
        # a tiered target's write is its save's stall, its read the restore from the fast tier
        words = ("save (stall)", "restore") if t.get("tiered") else ("write", "read")
        for dy, val, phase, alpha in ((0.2, wgb, words[0], 1.0), (-0.2, rgb, words[1], 0.55)):
            if val == val:  # not NaN
                ax.barh(
                    y + dy,
                    val,
                    height=0.38,
                    color=st["color"],
                    hatch=st["hatch"],
                    edgecolor="black",
                    alpha=alpha,
                )
                ax.text(val, y + dy, f" {phase} {val:.3g} GB/s", va="center", fontsize=8)
    ax.set_yticks(range(n))
    ax.set_yticklabels([textwrap.fill(t["label"], 34) for t, _, _ in reversed(rows)], fontsize=8)
    top = max([v for _, a, b in rows for v in (a, b) if v == v] or [1])
    ax.set_xlim(0, top * 1.45)
    ax.set_xlabel("throughput, GB/s (1e9 bytes/s); dark: write, light: read")
    ax.set_title("Checkpoint throughput per target (this run's scale)")
    kinds = {t["kind"] for t, _, _ in rows}
    _kind_legend(fig, kinds, loc="lower center", ncol=len(kinds))
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


_DATA_OPS = ("write", "put", "get")


def plot_latency(
    targets: list[dict[str, Any]], requests: list[dict[str, Any]], path: str
) -> str | None:
    """Distributions (box plots, log scale) of data-request latency per target and phase."""
    plt = _plt()
    series = []
    for t in targets:
        ids = {r["run_id"] for r in t["rows"]}
        for phase in ("write", "read"):
            vals = [
                r["seconds"] * 1e3
                for r in requests
                if r["run_id"] in ids
                and r["phase"] == phase
                and r["op"] in _DATA_OPS
                and r["nbytes"] > 0
                and r["outcome"] == "ok"
            ]
            if vals:
                series.append((f"{t['label']} {phase}", vals, t["kind"]))
    if not series:
        return None
    height = 1.5 + 0.5 * len(series)
    fig, ax = plt.subplots(figsize=(9, height))
    series.reverse()
    import inspect

    # matplotlib >= 3.10 says orientation=, older ones vert= (deprecated since 3.11)
    horizontal = (
        {"orientation": "horizontal"}
        if "orientation" in inspect.signature(ax.boxplot).parameters
        else {"vert": False}
    )
    bp = ax.boxplot(
        [s[1] for s in series],
        whis=(1, 99),
        showfliers=False,
        patch_artist=True,
        widths=0.6,
        **horizontal,
    )
    for patch, (_, _, kind) in zip(bp["boxes"], series, strict=True):
        patch.set_facecolor(KIND_STYLE[kind]["color"])
        patch.set_hatch(KIND_STYLE[kind]["hatch"])
    lows, highs = [], []
    for i, (_, vals, _) in enumerate(series, start=1):
        vals_sorted = sorted(vals)
        p50 = vals_sorted[len(vals) // 2]
        p99 = vals_sorted[min(len(vals) - 1, int(len(vals) * 0.99))]
        lows.append(vals_sorted[int(len(vals) * 0.01)])
        highs.append(p99)
        ax.text(max(p99, p50), i, f"  p50 {p50:.3g} ms, n={len(vals)}", va="center", fontsize=8)
    ax.set_yticks(range(1, len(series) + 1))
    ax.set_yticklabels([s[0] for s in series], fontsize=8)
    ax.set_xscale("log")
    # the data's own span, with room on the right (a decade and a half, log scale) for the
    # labels; the key goes below the axes, where it hides no box
    ax.set_xlim(max(min(lows), 1e-6) / 1.5, max(highs) * 40)
    ax.set_xlabel("request latency, ms (log scale; box: quartiles, whiskers: 1st-99th percentile)")
    ax.set_title("Data request latency per target and phase")
    kinds = {s[2] for s in series}
    _kind_legend(fig, kinds, loc="lower center", ncol=len(kinds))
    fig.tight_layout(rect=(0, 0.4 / height, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_sweep(targets: list[dict[str, Any]], path: str) -> str | None:
    """Throughput against streams (log2) for sweep results: per-stream limits show as a
    slope, shared limits as a plateau."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    drawn = False
    kinds = set()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    all_streams: set[int] = set()
    n_series = 0
    for t in targets:
        sweep = [r for r in t["rows"] if r.get("kind") == "sweep"]
        for part in sorted({r.get("sweep_part_size") or r.get("part_size") or 0 for r in sweep}):
            pts: dict[int, list[float]] = {}
            for r in sweep:
                if (r.get("sweep_part_size") or r.get("part_size") or 0) == part:
                    pts.setdefault(int(r.get("sweep_streams") or r.get("streams") or 1), []).append(
                        r["write_GBps"]
                    )
            if not pts:
                continue
            xs = sorted(pts)
            all_streams.update(xs)
            ax.plot(
                xs,
                [_mean(pts[x]) for x in xs],
                marker="o",
                color=colors[n_series % len(colors)],
                linestyle={"measured": "-", "emulated": "--", "mock": ":"}[t["kind"]],
                label=f"{t['label']}, {human_size(part)} parts",
            )
            n_series += 1
            drawn = True
            kinds.add(t["kind"])
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(all_streams))
    ax.set_xticklabels([str(x) for x in sorted(all_streams)])
    ax.set_xlabel("streams (concurrent requests per rank; log scale)")
    ax.set_title(
        "Throughput against concurrency (sweep)\n(solid: measured, dashed: emulated, "
        "dotted: mock — not a performance figure)",
        fontsize=10,
    )
    ax.set_ylabel("write throughput, GB/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_timeline(proj: list[dict[str, Any]], interval: float, path: str) -> str | None:
    """Per target at full scale (projected), two lanes on one time axis: one checkpoint
    interval (the save's stall, GPUs idle; then training, with a tiered target's drain to
    the durable tier running beneath it) and one restart after a failure (the fixed overhead,
    then the restore)."""
    rows = [p for p in proj if p.get("write_seconds")]
    if not rows:
        return None
    plt = _plt()
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(11, 1.9 + 1.1 * len(rows)))
    ticks, labels = [], []
    ends = [interval / 60]
    for i, p in enumerate(reversed(rows)):
        y = 2 * i
        stall = min(p["write_seconds"], interval)
        ax.barh(y + 0.5, stall / 60, height=0.6, color="#e53935", edgecolor="black")
        ax.barh(
            y + 0.5,
            (interval - stall) / 60,
            left=stall / 60,
            height=0.6,
            color="#4caf50",
            edgecolor="black",
        )
        text = f"save: GPUs idle {human_seconds(stall)} ({stall / interval:.1%})"
        drain = p.get("drain_seconds")
        if drain:
            ax.barh(
                y + 0.5 - 0.22,
                drain / 60,
                left=stall / 60,
                height=0.16,
                color="#1e88e5",
                hatch="//",
                edgecolor="black",
            )
            text += f"; drain {human_seconds(drain)}" + (
                "" if p.get("drain_fits_interval") else " (outlasts the interval)"
            )
        ax.text(interval / 60 * 1.01, y + 0.5, text, va="center", fontsize=8)
        over = p.get("restart_overhead_seconds")
        restore = p.get("restore_seconds")
        if over is not None and restore is not None:
            ax.barh(y - 0.3, over / 60, height=0.5, color="#bdbdbd", edgecolor="black")
            ax.barh(
                y - 0.3,
                restore / 60,
                left=over / 60,
                height=0.5,
                color="#8e24aa",
                edgecolor="black",
            )
            rtext = f"restart {human_seconds(over + restore)}: restore {human_seconds(restore)}"
            ends.append((over + restore) / 60)
        else:
            ax.barh(
                y - 0.3, p["restart_seconds"] / 60, height=0.5, color="#bdbdbd", edgecolor="black"
            )
            rtext = f"restart {human_seconds(p['restart_seconds'])} (given)"
        ax.text(
            max(p["restart_seconds"] / 60, 1) * 1.02 + 0.5, y - 0.3, rtext, va="center", fontsize=8
        )
        ticks += [y + 0.5, y - 0.3]
        labels += [f"{p['name']}: one interval", f"{p['name']}: one restart"]
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, max(ends) * 1.45)
    ax.set_xlabel("minutes")
    first = rows[0]
    ax.set_title(
        f"Save, drain and restore — projected, {first['preset']} on {first['gpus']} GPUs, "
        f"a checkpoint every {human_seconds(interval)} (blocking save)",
        fontsize=10,
    )
    handles = [
        Patch(facecolor="#e53935", edgecolor="black", label="save: GPUs idle (stall)"),
        Patch(facecolor="#4caf50", edgecolor="black", label="training"),
        Patch(
            facecolor="#1e88e5", hatch="//", edgecolor="black", label="drain (background, tiered)"
        ),
        Patch(facecolor="#bdbdbd", edgecolor="black", label="restart overhead (assumption)"),
        Patch(facecolor="#8e24aa", edgecolor="black", label="restore (read back)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.5 / (1.9 + 1.1 * len(rows)), 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def _stall_at(p: dict[str, Any], interval: float) -> float:
    """A target's stall at a checkpoint interval: a tiered target whose drain outlasts the
    interval waits for it at the next save (backpressure ``wait``)."""
    drain = p.get("drain_seconds") or 0.0
    return p["write_seconds"] + max(0.0, drain - interval)


def plot_cost(proj: list[dict[str, Any]], *, price: float, path: str) -> str | None:
    """Lost GPU-hours and cost per day against the checkpoint interval, each target's
    optimum (Daly) marked. Lost time = checkpoint stalls + work redone after failures +
    restarts (each target's own restart: overhead + its restore), projected. A tiered
    target's stall grows by what its drain outlasts a shorter interval (:func:`_stall_at`)."""
    from ckptio.model import cost_curve

    rows = [p for p in proj if p.get("write_seconds")]
    if not rows:
        return None
    plt = _plt()
    import numpy as np

    intervals = list(np.geomspace(300, 24 * 3600, 80))
    fig, ax = plt.subplots(figsize=(9, 5.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, p in enumerate(rows):
        mtbf = p["mtbf_seconds"]

        def lost(ts: list[float], p: dict[str, Any] = p, mtbf: float = mtbf) -> list[float]:
            return [
                cost_curve(
                    _stall_at(p, t),
                    [t],
                    gpus=p["gpus"],
                    price_per_gpu_hour=price,
                    mtbf=mtbf,
                    restart_seconds=p["restart_seconds"],
                )[0]["idle_gpu_hours_per_day"]
                for t in ts
            ]

        c = colors[i % len(colors)]
        opt = p["optimum_interval_seconds"]
        ax.plot(
            [x / 3600 for x in intervals],
            lost(intervals),
            color=c,
            linestyle="--" if p.get("drain_seconds") else "-",
            label=f"{p['name']} — restart {human_seconds(p['restart_seconds'])}, "
            f"optimum {human_seconds(opt)}",
        )
        ax.plot(
            [opt / 3600], lost([opt]), marker="o", color=c, markersize=8, markeredgecolor="black"
        )
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = [300, 900, 1800, 3600, 7200, 4 * 3600, 8 * 3600, 24 * 3600]
    ax.set_xticks([t / 3600 for t in ticks])
    ax.set_xticklabels(["5 min", "15 min", "30 min", "1 h", "2 h", "4 h", "8 h", "24 h"])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("checkpoint interval (log scale)")
    ax.set_ylabel("lost GPU-hours per day (log scale)")
    if price:
        sec = ax.secondary_yaxis("right", functions=(lambda h: h * price, lambda c: c / price))
        sec.set_ylabel(f"cost per day at {price:g} price units per GPU-hour (no currency assumed)")
        sec.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        sec.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        sec.yaxis.set_minor_formatter(NullFormatter())
    first = rows[0]
    ax.set_title(
        f"Lost GPU time against checkpoint interval — projected, {first['preset']} on "
        f"{first['gpus']} GPUs\n(stalls + work redone after failures + restarts; MTBF "
        f"{human_seconds(first['mtbf_seconds'])}; dot: optimum)\ndashed: tiered (its stall "
        "grows where the drain outlasts the interval)",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# -- the report ------------------------------------------------------------------------------

_CSS = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
    "table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:4px 8px;font-size:14px}"
    "tr.emulated td{background:#fff3e0}tr.mock td{background:#eeeeee;color:#555}"
    "tr.projected td{background:#e8f5e9}img{max-width:100%;border:1px solid #ddd}"
)


def run_point(row: dict[str, Any]) -> tuple[str, int, int, int, int]:
    """What a row of the runs table measured: (kind, streams, part size, checkpoint bytes,
    ranks). Iterations of one point are averaged in summaries; different points never are."""
    sweep = row.get("kind") == "sweep"
    streams = (row.get("sweep_streams") if sweep else None) or row.get("streams") or 0
    part = (row.get("sweep_part_size") if sweep else None) or row.get("part_size") or 0
    return (
        "sweep" if sweep else "run",
        int(streams),
        int(part),
        int(row.get("checkpoint_bytes") or 0),
        int(row.get("ranks") or 0),
    )


def point_text(
    point: tuple[str, int, int, int, int], *, size: bool = False, ranks: bool = False
) -> str:
    """``sweep: 4 streams, 8 MiB parts`` (with the checkpoint size and the ranks when asked:
    the things that differ between a target's points)."""
    kind, streams, part, nbytes, n_ranks = point
    bits = [
        f"{streams} stream{'s' if streams != 1 else ''}" if streams else "",
        f"{human_size(part)} parts" if part else "",
        human_size(nbytes) if size else "",
        f"{n_ranks} rank{'s' if n_ranks != 1 else ''}" if ranks else "",
    ]
    text = ", ".join(b for b in bits if b)
    return f"sweep: {text}" if kind == "sweep" else text


def summary_rows(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per target and point (:func:`run_point`): its kind and mean figures over the
    iterations of that point. A target run at several points (a sweep; runs with other
    streams, part sizes, sizes or ranks) gets one row per point, named in ``point``; runs come
    before sweep points."""
    out = []
    for t in targets:
        points: dict[tuple[str, int, int, int, int], list[dict[str, Any]]] = {}
        for r in t["rows"]:
            points.setdefault(run_point(r), []).append(r)
        order = sorted(points, key=lambda p: (p[0] == "sweep", p[3], p[4], p[1], p[2]))
        several = len(points) > 1
        size = len({p[3] for p in points}) > 1
        ranks = len({p[4] for p in points}) > 1
        for key in order:
            rows = points[key]
            r0 = rows[0]
            point = point_text(key, size=size, ranks=ranks) if several or key[0] == "sweep" else ""
            out.append(
                {
                    "target": t["name"],
                    "label": t["label"],
                    "kind": t["kind"],
                    "site": t["site"],
                    "backend": t["backend"],
                    "profile": t["profile"],
                    "point": point,
                    "streams": key[1],
                    "part_size": key[2],
                    "sweep": key[0] == "sweep",
                    "preset": r0.get("preset"),
                    "scale": r0.get("scale"),
                    "ranks": r0.get("ranks"),
                    "checkpoint_bytes": r0.get("checkpoint_bytes"),
                    "write_seconds": _finite(_mean([r["write_seconds"] for r in rows])),
                    "read_seconds": _finite(_mean([r["read_seconds"] for r in rows])),
                    # tiered targets: the stall is the fast tier's save, the restore is from
                    # the fast tier; drain and the restore from the durable tier are phases
                    "tiered": bool(t.get("tiers")),
                    "tiers_note": (t.get("tiers") or {}).get("note", ""),
                    "phase_kinds": t.get("phase_kinds"),
                    "drain_seconds": (t.get("phase_seconds") or {}).get("drain"),
                    "restore_durable_seconds": (t.get("phase_seconds") or {}).get(
                        "restore-durable"
                    ),
                    "write_GBps": _finite(_mean([r["write_GBps"] for r in rows])),
                    "read_GBps": _finite(_mean([r["read_GBps"] for r in rows])),
                    "min_rank_write_GBps": _finite(_mean([r["min_rank_write_GBps"] for r in rows])),
                    "requests": sum(int(r.get("requests") or 0) for r in rows),
                    "retries": sum(int(r.get("retries") or 0) for r in rows),
                    "throttled": sum(int(r.get("throttled") or 0) for r in rows),
                    "iterations": len(rows),
                    "note": KIND_NOTE[t["kind"]],
                }
            )
    return out


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table; a ``|`` in a cell is escaped, a newline becomes a space."""

    def cell(c: Any) -> str:
        return str(c).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


PROJECTION_COLUMNS = [
    "workload",
    "target",
    "projected with",
    "stall (write)",
    "binding limit",
    "drain",
    "restore",
    "restart",
    "idle (stall)",
    "idle with restarts",
    "cost/day with restarts",
    "optimal interval (Daly)",
    "stall with async save",
]


def projection_cells(p: dict[str, Any]) -> list[str]:
    """A row of the full-scale projection table (:data:`PROJECTION_COLUMNS`)."""
    if not p.get("write_seconds"):
        return [f"{p['preset']} on {p['gpus']} GPUs", p["target"], p["profile"]] + ["-"] * 10
    drain = p.get("drain_seconds")
    with_restarts = p.get("idle_fraction_with_restarts")
    cost = p.get("idle_cost_per_day_with_restarts")
    return [
        f"{p['preset']} on {p['gpus']} GPUs",
        p["target"],
        p["profile"],
        human_seconds(p["write_seconds"]),
        p["binding_detail"],
        "-"
        if drain is None
        else human_seconds(drain)
        + (" (fits the interval)" if p.get("drain_fits_interval") else " (outlasts the interval)"),
        human_seconds(p["restore_seconds"]) if p.get("restore_seconds") is not None else "-",
        human_seconds(p["restart_seconds"]),
        f"{p['idle_fraction']:.2%}",
        "-" if with_restarts is None else f"{with_restarts:.2%}",
        "-" if cost is None else f"{cost:,.0f}",
        human_seconds(p["optimum_interval_seconds"]) if p.get("optimum_interval_seconds") else "-",
        human_seconds(p["async_stall_seconds"])
        + ("" if p.get("async_fits_interval", True) else " (write outlasts the interval)"),
    ]


def kind_text(s: dict[str, Any]) -> str:
    """What a summary row is: its kind (and profile), or, for a tiered target, which of its
    phases are measured and which emulated."""
    kinds = s.get("phase_kinds")
    if not kinds:
        return KIND_NOTE[s["kind"]] + (f" ({s['profile']})" if s["profile"] else "")
    return f"tiered: {s['tiers_note']}"


def phase_cells(s: dict[str, Any]) -> list[str]:
    """Stall, drain, restore and restore from the durable tier of a summary row, in seconds;
    a tiered target's each tagged measured or emulated."""
    kinds = s.get("phase_kinds") or {}

    def cell(value: float | None, phase: str) -> str:
        if value is None:
            return "-"
        return _g(value) + (f" ({kinds[phase]})" if phase in kinds else "")

    return [
        cell(s["write_seconds"], "save"),
        cell(s.get("drain_seconds"), "drain"),
        cell(s.get("read_seconds"), "restore"),
        cell(s.get("restore_durable_seconds"), "restore-durable"),
    ]


def build_report(
    paths: list[str],
    out_dir: str,
    *,
    presets: list[tuple[str, int | None]] | None = None,
    interval: float = 7200.0,
    price: float = DEFAULT_PRICE_PER_GPU_HOUR,
    restart: float | None = None,
    title: str = "ckptio report",
) -> dict[str, Any]:
    """Merge result files/directories ``paths`` (from any machines or sites) into
    ``out_dir``: ``index.html``, ``report.md`` and PNG plots. Returns what it wrote and the
    tables (JSON-able). Without matplotlib the report is written without plots, and says why
    (``plots_missing`` in the result: the message with the pip extra; None when drawn).
    ``restart`` None: each target's restart is the model's fixed overhead
    (:data:`ckptio.model.DEFAULT_RESTART_OVERHEAD`) plus its projected restore."""
    import html
    import os

    from ckptio import errors
    from ckptio.model import DEFAULT_P_LOSE_NODE, DEFAULT_RESTART_OVERHEAD
    from ckptio.results import read_results

    res = read_results(paths)
    runs = res.runs.to_pylist()
    if not runs:
        raise errors.InvalidArgumentError(f"no runs in {', '.join(map(str, paths))}")
    requests = res.requests.to_pylist()
    os.makedirs(out_dir, exist_ok=True)
    targets = _targets(runs, res.sidecars, res.phases.to_pylist())
    summary = summary_rows(targets)
    presets = presets or [(p, None) for p in DEFAULT_PROJECTIONS]
    proj = projection_rows(
        targets, requests, presets, interval=interval, price=price, restart=restart
    )
    first_preset = [p for p in proj if p["preset"] == presets[0][0]]
    restart_text = (
        f"restart {human_seconds(restart)} (given)"
        if restart is not None
        else f"restart = {human_seconds(DEFAULT_RESTART_OVERHEAD)} overhead (assumption) + "
        "the projected restore"
    )
    no_plots = plots_unavailable()
    plots: dict[str, str | None] = (
        {}
        if no_plots
        else {
            "throughput": plot_throughput(summary, os.path.join(out_dir, "throughput.png")),
            "latency": plot_latency(targets, requests, os.path.join(out_dir, "latency.png")),
            "sweep": plot_sweep(targets, os.path.join(out_dir, "sweep.png")),
            "timeline": plot_timeline(
                first_preset, interval, os.path.join(out_dir, "timeline.png")
            ),
            "cost": plot_cost(first_preset, price=price, path=os.path.join(out_dir, "cost.png")),
        }
    )
    sites = sorted({t["site"] for t in targets if t["site"]})
    captions = {
        "throughput": "Throughput per target and phase at the scale that was run.",
        "latency": "Distribution of data-request latency per target and phase.",
        "sweep": "Throughput against concurrency from sweeps.",
        "timeline": "Save, drain and restore at full scale: one checkpoint interval and one "
        "restart (projected).",
        "cost": "Lost GPU-hours and cost per day against the checkpoint interval (projected).",
    }

    # Markdown
    md = [
        f"# {title}",
        "",
        f"Runs: {len(runs)} from {len(targets)} target(s)"
        + (f" at sites {', '.join(sites)}" if sites else "")
        + ".",
        "",
        "Kinds: **measured** — real storage; **emulated** — the shaped backend imposing a "
        "storage profile by sleeping (not the real service); **mock** — moto, tests "
        "correctness, *not a performance figure*; **projected** — the model at full scale.",
        "",
        "## Comparison (this run's scale)",
        "",
    ]
    # a target measured at several points (a sweep) has one row per point, named here
    points = any(s["point"] for s in summary)

    def pt(s: dict[str, Any]) -> list[str]:
        return [s["point"]] if points else []

    md.append(
        md_table(
            [
                "target",
                *(["point"] if points else []),
                "kind",
                "site",
                "size",
                "stall (write) s",
                "drain s",
                "restore (read) s",
                "restore from durable s",
                "write GB/s",
                "read GB/s",
                "min rank write GB/s",
                "requests",
                "retries",
                "throttled",
            ],
            [
                [
                    s["target"],
                    *pt(s),
                    kind_text(s),
                    s["site"],
                    human_size(s["checkpoint_bytes"] or 0),
                    *phase_cells(s),
                    _g(s["write_GBps"]),
                    _g(s["read_GBps"]),
                    _g(s["min_rank_write_GBps"]),
                    s["requests"],
                    s["retries"],
                    s["throttled"],
                ]
                for s in summary
            ],
        )
    )
    md += [
        "",
        "## Full-scale projection (model)",
        "",
        f"Interval {human_seconds(interval)}; price {price:g} per GPU-hour (assumption); "
        f"MTBF scaled from 7.9 h at 1,024 GPUs (arXiv 2410.21680); {restart_text}. "
        "Tiered targets: the stall is the fast tier's write, the drain (to the durable tier, "
        "in the background) must fit the interval, the restore reads the fast tier unless the "
        f"failure lost the node ({DEFAULT_P_LOSE_NODE:.0%} of failures, an assumption: "
        "Llama 3's hardware share), then the durable tier. Every figure here is projected; "
        "'projected with' says from what (measured or emulated runs, profiles).",
        "",
    ]
    md.append(md_table(PROJECTION_COLUMNS, [projection_cells(p) for p in proj]))
    md += [
        "",
        "Async save: the GPUs wait only for the snapshot to host memory (assumed 25 GB/s "
        "per GPU); the write goes on in the background.",
        "",
        "What would fix it:",
        "",
    ]
    md += [f"- {p['target']}: {p['remedy']}" for p in proj if p.get("remedy")]
    md += [""]
    from ckptio.report_sim import section as simulated_section

    # ckptio simulate --out: simulated beside modelled
    simulated = simulated_section(paths, out_dir, md_table=md_table, plots_missing=no_plots)
    if simulated is not None:
        md += [*simulated.markdown, ""]
    used = sorted(
        {t["profile"] for t in targets if t["kind"] == "emulated" and t["profile"]}
        | {
            t["tiers"]["local"]
            for t in targets
            if t.get("tiers") and not t["tiers"].get("local_measured")
        }
    )
    if used:
        from ckptio.profiles import load_profile

        md += ["", "## Profiles emulated and projected with", ""]
        for name in used:
            try:
                prof = load_profile(name)
            except errors.InvalidArgumentError as err:
                md += [f"- {name}: not known here ({err})"]
                continue
            md += [f"### {prof.name}: {prof.title}", ""]
            md.append(
                md_table(
                    ["figure", "value", "source"],
                    [
                        [
                            k,
                            fig_text(f.value, FIGURES[k]) + (" *" if f.assumption else ""),
                            f.source,
                        ]
                        for k, f in prof.figures.items()
                    ],
                )
            )
            md += ["", "\\* an assumption, not a published figure."]
            md += [
                "",
                f"Streams per node {prof.streams} ({prof.sources.get('streams', '')}); "
                f"part size {human_size(prof.part_size)}; past the rate limit: "
                f"{prof.throttle or 'n/a'}.",
                "",
            ]
    md += ["", "## Plots", ""]
    if no_plots:
        md += [f"_Plots not drawn: {no_plots}._", ""]
    for name, path in plots.items():
        if path:
            md += [f"### {captions[name]}", "", f"![{name}]({os.path.basename(path)})", ""]
        else:
            md += [f"### {captions[name]}", "", "_No data for this plot in these results._", ""]
    with open(os.path.join(out_dir, "report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")

    # HTML (self-contained apart from the PNGs beside it)
    def table_html(header: list[str], rows: list[list[Any]], kinds: list[str]) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join(
            f'<tr class="{k}">' + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
            for r, k in zip(rows, kinds, strict=True)
        )
        return f"<table><tr>{head}</tr>{body}</table>"

    comp_rows = [
        [
            s["target"],
            *pt(s),
            kind_text(s),
            s["site"],
            human_size(s["checkpoint_bytes"] or 0),
            *phase_cells(s),
            _g(s["write_GBps"]),
            _g(s["read_GBps"]),
            s["requests"],
            s["throttled"],
        ]
        for s in summary
    ]
    proj_rows = [projection_cells(p) for p in proj]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<p><b>measured</b>: real storage. <b>emulated</b> (orange rows): the shaped backend "
        "imposing a storage profile by sleeping, not the real service. <b>mock</b> (grey rows):"
        " moto, <i>not a performance figure</i>. <b>projected</b> (green): the model at full "
        "scale.</p>",
        "<h2>Comparison (this run's scale)</h2>",
        table_html(
            [
                "target",
                *(["point"] if points else []),
                "kind",
                "site",
                "size",
                "stall (write) s",
                "drain s",
                "restore (read) s",
                "restore from durable s",
                "write GB/s",
                "read GB/s",
                "requests",
                "throttled",
            ],
            comp_rows,
            [s["kind"] for s in summary],
        ),
        "<h2>Full-scale projection (model)</h2>",
        f"<p>Interval {human_seconds(interval)}, price {price:g} per GPU-hour (assumption), "
        f"{html.escape(restart_text)}; every figure in this table is projected; report.md "
        "has every profile figure with its source.</p>",
        table_html(
            PROJECTION_COLUMNS,
            proj_rows,
            ["projected"] * len(proj_rows),
        ),
    ]
    if simulated is not None:
        parts += simulated.html
    if no_plots:
        parts.append(f"<h2>Plots</h2><p><i>Plots not drawn: {html.escape(no_plots)}.</i></p>")
    for name, path in plots.items():
        if path:
            parts.append(
                f"<h2>{html.escape(captions[name])}</h2>"
                f"<img src='{os.path.basename(path)}' alt='{name}'>"
            )
    parts.append("</body></html>")
    with open(os.path.join(out_dir, "index.html"), "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")
    written = [os.path.join(out_dir, n) for n in ("index.html", "report.md")]
    written += [p for p in plots.values() if p]
    written += simulated.files if simulated is not None else []
    return {
        "out": out_dir,
        "files": written,
        "summary": summary,
        "projections": proj,
        "sites": sites,
        "plots_missing": no_plots,
    }
