"""The report's plots (PNG, matplotlib's Agg backend).

Each plot draws rows of the report's tables, never figures of its own making, and returns
the figures it drew (``{label: {key: value}}``), so a test can hold every plot to the table
beside it. Error bars are the rows' 95% intervals (``<figure>_low``/``_high``); a row without
one (an emulated target: deterministic) has none.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from ckptio.report.data import KIND_NOTE, KIND_STYLE
from ckptio.report.tables import cost_key, restore_paths
from ckptio.units import human_seconds, human_size

__all__ = [
    "plot_breakdown",
    "plot_cost",
    "plot_latency",
    "plot_restores",
    "plot_sweep",
    "plot_throughput",
    "plot_timeline",
    "plot_tornado",
    "plots_unavailable",
]

Drawn = dict[str, dict[str, float]]
"""What a plot drew: per label, the figures (row keys) it shows."""


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


def pyplot() -> Any:
    """matplotlib's pyplot, headless (Agg), in the report's style: every plot of the report
    (and of :mod:`ckptio.report.simulated`) draws with it."""
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


def _err(row: Mapping[str, Any], key: str, scale: float = 1.0) -> list[list[float]] | None:
    """matplotlib's ``xerr`` for ``row[key]`` from its interval, or None without one."""
    v, lo, hi = row.get(key), row.get(f"{key}_low"), row.get(f"{key}_high")
    if v is None or lo is None or hi is None:
        return None
    return [[(v - lo) / scale], [(hi - v) / scale]]


def _save(fig: Any, path: str) -> None:
    fig.savefig(path)
    pyplot().close(fig)


def plot_throughput(summary: Sequence[Mapping[str, Any]], path: str) -> Drawn:
    """Bars of write and read throughput (GB/s, mean over rounds, error bars: the interval)
    per row of the comparison table: one per target and point, never points together."""
    plt = pyplot()
    rows = [(f"{s['label']} {s['point']}".strip(), s) for s in summary]
    n = len(rows)
    height = 1.6 + 0.9 * n
    fig, ax = plt.subplots(figsize=(9, height))
    drawn: Drawn = {}
    for i, (label, s) in enumerate(rows):
        st = KIND_STYLE[s["kind"]]
        y = n - 1 - i
        # a tiered target's write is its save's stall, its read the restore from the fast tier
        words = ("save (stall)", "restore") if s.get("tiered") else ("write", "read")
        drawn[label] = {}
        for dy, key, phase, alpha in (
            (0.2, "write_GBps", words[0], 1.0),
            (-0.2, "read_GBps", words[1], 0.55),
        ):
            val = s.get(key)
            if val is None:
                continue
            drawn[label][key] = val
            ax.barh(
                y + dy,
                val,
                height=0.38,
                color=st["color"],
                hatch=st["hatch"],
                edgecolor="black",
                alpha=alpha,
                xerr=_err(s, key),
                capsize=3,
            )
            top = s.get(f"{key}_high") or val
            ax.text(top, y + dy, f" {phase} {val:.3g} GB/s", va="center", fontsize=8)
    ax.set_yticks(range(n))
    ax.set_yticklabels([textwrap.fill(label, 34) for label, _ in reversed(rows)], fontsize=8)
    tops = [s.get(f"{k}_high") or s.get(k) for _, s in rows for k in ("write_GBps", "read_GBps")]
    ax.set_xlim(0, max([v for v in tops if v] or [1]) * 1.45)
    ax.set_xlabel("throughput, GB/s (1e9 bytes/s); dark: write, light: read; bars: 95% interval")
    ax.set_title("Checkpoint throughput per target (this run's scale)")
    kinds = {s["kind"] for _, s in rows}
    _kind_legend(fig, kinds, loc="lower center", ncol=len(kinds))
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))
    _save(fig, path)
    return drawn


_DATA_OPS = ("write", "put", "get")


def plot_latency(targets: Sequence[Mapping[str, Any]], path: str) -> Drawn | None:
    """Distributions (box plots, log scale) of data-request latency per target and phase."""
    plt = pyplot()
    series = []
    for t in targets:
        for phase in ("write", "read"):
            vals = [
                r["seconds"] * 1e3
                for r in t["requests"]
                if r["phase"] == phase
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
    drawn: Drawn = {}
    for i, (label, vals, _) in enumerate(series, start=1):
        vals_sorted = sorted(vals)
        p50 = vals_sorted[len(vals) // 2]
        p99 = vals_sorted[min(len(vals) - 1, int(len(vals) * 0.99))]
        lows.append(vals_sorted[int(len(vals) * 0.01)])
        highs.append(p99)
        drawn[label] = {"p50_ms": p50, "n": len(vals)}
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
    _save(fig, path)
    return drawn


def plot_sweep(summary: Sequence[Mapping[str, Any]], path: str) -> Drawn | None:
    """Throughput against streams (log2) for sweep points of the comparison table, with their
    intervals: per-stream limits show as a slope, shared limits as a plateau."""
    sweeps = [s for s in summary if s.get("sweep")]
    if not sweeps:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    series: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for s in sweeps:
        series.setdefault((s["label"], s["part_size"]), []).append(s)
    drawn: Drawn = {}
    all_streams: set[int] = set()
    for i, ((label, part), pts) in enumerate(series.items()):
        pts = sorted(pts, key=lambda s: s["streams"])
        xs = [s["streams"] for s in pts]
        ys = [s["write_GBps"] or math.nan for s in pts]
        errs = [_err(s, "write_GBps") or [[0.0], [0.0]] for s in pts]
        all_streams.update(xs)
        name = f"{label}, {human_size(part)} parts"
        ax.errorbar(
            xs,
            ys,
            yerr=[[e[0][0] for e in errs], [e[1][0] for e in errs]],
            marker="o",
            capsize=3,
            color=colors[i % len(colors)],
            linestyle={"measured": "-", "emulated": "--", "mock": ":"}[pts[0]["kind"]],
            label=name,
        )
        drawn[name] = {f"{x} streams": y for x, y in zip(xs, ys, strict=True)}
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(all_streams))
    ax.set_xticklabels([str(x) for x in sorted(all_streams)])
    ax.set_xlabel("streams (concurrent requests per rank; log scale)")
    ax.set_title(
        "Throughput against concurrency (sweep)\n(solid: measured, dashed: emulated, "
        "dotted: mock — not a performance figure; bars: 95% interval)",
        fontsize=10,
    )
    ax.set_ylabel("write throughput, GB/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    return drawn


def _projected(proj: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in proj if p.get("write_seconds") and not p.get("refusal")]


def plot_timeline(proj: Sequence[Mapping[str, Any]], path: str) -> Drawn | None:
    """Per target at full scale (projected), two lanes on one time axis: one checkpoint
    interval (the stall, GPUs idle; then training, with a tiered target's drain to the
    durable tier running beneath it) and one restart after a failure (the fixed overhead,
    then the restore); error bars: the stall's and the restart's intervals."""
    rows = _projected(proj)
    if not rows:
        return None
    plt = pyplot()
    from matplotlib.patches import Patch

    interval = rows[0]["interval_seconds"]
    fig, ax = plt.subplots(figsize=(11, 1.9 + 1.1 * len(rows)))
    ticks, labels = [], []
    ends = [interval / 60]
    drawn: Drawn = {}
    for i, p in enumerate(reversed(rows)):
        y = 2 * i
        stall = min(p["stall_seconds"], interval)
        drawn[p["name"]] = {
            "stall_seconds": p["stall_seconds"],
            "restart_seconds": p["restart_seconds"],
        }
        ax.barh(
            y + 0.5,
            stall / 60,
            height=0.6,
            color="#e53935",
            edgecolor="black",
            xerr=_err(p, "stall_seconds", 60),
            capsize=3,
        )
        ax.barh(
            y + 0.5,
            (interval - stall) / 60,
            left=stall / 60,
            height=0.6,
            color="#4caf50",
            edgecolor="black",
        )
        text = f"stall: GPUs idle {human_seconds(p['stall_seconds'])}"
        drain = p.get("drain_seconds")
        if drain:
            drawn[p["name"]]["drain_seconds"] = drain
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
            drawn[p["name"]]["restore_seconds"] = restore
            ax.barh(y - 0.3, over / 60, height=0.5, color="#bdbdbd", edgecolor="black")
            ax.barh(
                y - 0.3,
                restore / 60,
                left=over / 60,
                height=0.5,
                color="#8e24aa",
                edgecolor="black",
                xerr=_err(p, "restart_seconds", 60),
                capsize=3,
            )
            rtext = (
                f"restart {human_seconds(p['restart_seconds'])}: restore {human_seconds(restore)}"
            )
        else:
            ax.barh(
                y - 0.3, p["restart_seconds"] / 60, height=0.5, color="#bdbdbd", edgecolor="black"
            )
            rtext = f"restart {human_seconds(p['restart_seconds'])} (given)"
        ends.append((p.get("restart_seconds_high") or p["restart_seconds"]) / 60)
        ax.text(
            max(p["restart_seconds"] / 60, 1) * 1.02 + 0.5, y - 0.3, rtext, va="center", fontsize=8
        )
        ticks += [y + 0.5, y - 0.3]
        labels += [f"{p['name']}: one interval", f"{p['name']}: one restart"]
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, max(ends) * 1.45)
    ax.set_xlabel("minutes (bars: 95% interval of a measured target)")
    first = rows[0]
    ax.set_title(
        f"Stall, drain and restore — projected, {first['preset']} on {first['gpus']:,} GPUs, "
        f"a checkpoint every {human_seconds(interval)} (blocking save)",
        fontsize=10,
    )
    handles = [
        Patch(facecolor="#e53935", edgecolor="black", label="stall: GPUs idle"),
        Patch(facecolor="#4caf50", edgecolor="black", label="training"),
        Patch(
            facecolor="#1e88e5", hatch="//", edgecolor="black", label="drain (background, tiered)"
        ),
        Patch(facecolor="#bdbdbd", edgecolor="black", label="restart overhead (assumption)"),
        Patch(facecolor="#8e24aa", edgecolor="black", label="restore (read back)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.5 / (1.9 + 1.1 * len(rows)), 1, 1))
    _save(fig, path)
    return drawn


def plot_restores(proj: Sequence[Mapping[str, Any]], path: str) -> Drawn | None:
    """Per target at full scale (projected), the restore after a failure by where it reads
    (:func:`ckptio.report.tables.restore_paths`: its own fast tier, a peer's copy, the
    durable tier or, untiered, the storage), each bar labelled with how often that path is
    taken, and a tiered target's expected restore (hatched): the restore table's rows."""
    rows = _projected(proj)
    if not rows:
        return None
    plt = pyplot()
    from matplotlib.patches import Patch

    colors = {
        "from its own fast tier": "#43a047",
        "from a peer's copy": "#fdd835",
        "from the durable tier": "#8e24aa",
        "from the storage": "#8e24aa",
    }
    bars = [(p, restore_paths(p)) for p in rows]
    n = sum(len(paths) + (len(paths) > 1) for _, paths in bars)
    height = 1.8 + 0.42 * n + 0.3 * len(rows)
    fig, ax = plt.subplots(figsize=(10, height))
    drawn: Drawn = {}
    ticks, labels = [], []
    y, top = 0.0, 0.0
    for p, paths in reversed(bars):
        drawn[p["name"]] = {"restore_seconds": p["restore_seconds"]}
        lanes = [
            (words, key, share, colors[words.partition(" (")[0]], "") for words, key, share in paths
        ]
        if len(paths) > 1:  # the expected restore, what the restart waits on average
            lanes.append(("expected", "restore_seconds", 1.0, "white", "xx"))
        ys = []
        for words, key, share, color, hatch in reversed(lanes):
            drawn[p["name"]][key] = p[key]
            ax.barh(
                y,
                p[key] / 60,
                height=0.7,
                color=color,
                hatch=hatch,
                edgecolor="black",
                xerr=_err(p, key, 60),
                capsize=3,
            )
            text = (
                f"expected: {human_seconds(p[key])}"
                if words == "expected"
                else f"{human_seconds(p[key])}, {share:.1%} of failures"
            )
            ax.text(p[key] / 60 * 1.02 + 0.05, y, text, va="center", fontsize=8)
            top = max(top, (p.get(f"{key}_high") or p[key]) / 60)
            ys.append(y)
            y += 0.8
        ticks.append(sum(ys) / len(ys))
        labels.append("\n".join(textwrap.wrap(p["name"], 28)))
        y += 0.6
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, top * 1.55 + 0.5)
    ax.set_xlabel("minutes to read the checkpoint back (bars: 95% interval of a measured target)")
    first = rows[0]
    ax.set_title(
        f"Restore after a failure, by which copy survives — projected, {first['preset']} on "
        f"{first['gpus']:,} GPUs",
        fontsize=10,
    )
    handles = [
        Patch(facecolor="#43a047", edgecolor="black", label="from its own fast tier"),
        Patch(facecolor="#fdd835", edgecolor="black", label="from a peer's copy (projected)"),
        Patch(facecolor="#8e24aa", edgecolor="black", label="from the durable tier / the storage"),
        Patch(facecolor="white", hatch="xx", edgecolor="black", label="expected restore"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))
    _save(fig, path)
    return drawn


def plot_breakdown(proj: Sequence[Mapping[str, Any]], path: str) -> Drawn | None:
    """Per target at full scale, what the lost GPU time is made of: stall, rework and restart
    stacked (the projection table's three cost columns), their sum's interval as an error
    bar."""
    rows = _projected(proj)
    if not rows:
        return None
    plt = pyplot()
    price = rows[0]["price_per_gpu_hour"]
    colors = {"stall": "#e53935", "rework": "#fb8c00", "restart": "#8e24aa"}
    height = 1.8 + 0.6 * len(rows)
    fig, ax = plt.subplots(figsize=(9, height))
    drawn: Drawn = {}
    for i, p in enumerate(reversed(rows)):
        left = 0.0
        drawn[p["name"]] = {}
        for part in ("stall", "rework", "restart"):
            key, _ = cost_key(part, price)
            ax.barh(i, p[key], left=left, color=colors[part], edgecolor="black", height=0.6)
            drawn[p["name"]][key] = p[key]
            left += p[key]
        total, _ = cost_key("lost", price)
        drawn[p["name"]][total] = p[total]
        ax.errorbar(p[total], i, xerr=_err(p, total), fmt="none", ecolor="black", capsize=4)
        ax.text(
            (p.get(f"{total}_high") or p[total]) * 1.01,
            i,
            f" {p[total]:,.0f}",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([p["name"] for p in reversed(rows)], fontsize=8)
    unit = f"cost per day at {price:g} price units per GPU-hour" if price else "GPU-hours per day"
    ax.set_xlabel(f"lost {unit} (bar: 95% interval of the sum, measured targets)")
    first = rows[0]
    ax.set_title(
        f"What checkpointing costs — projected, {first['preset']} on {first['gpus']:,} GPUs, "
        f"every {human_seconds(first['interval_seconds'])}, MTBF {human_seconds(first['mtbf_seconds'])}",
        fontsize=10,
    )
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(
                facecolor=colors["stall"], edgecolor="black", label="stall (GPUs wait for the save)"
            ),
            Patch(
                facecolor=colors["rework"],
                edgecolor="black",
                label="rework (work redone after a failure)",
            ),
            Patch(
                facecolor=colors["restart"], edgecolor="black", label="restart (overhead + restore)"
            ),
        ],
        fontsize=8,
        loc="lower right",
    )
    right = max(
        (p.get(f"{cost_key('lost', price)[0]}_high") or p[cost_key("lost", price)[0]]) for p in rows
    )
    ax.set_xlim(0, right * 1.25)
    fig.tight_layout()
    _save(fig, path)
    return drawn


def plot_cost(proj: Sequence[Mapping[str, Any]], path: str) -> Drawn | None:
    """Lost GPU time per day (stall + rework + restart, :func:`ckptio.costmodel.cost_curve`)
    against the checkpoint interval, per target at full scale; the chosen interval marked with
    its interval bar (the projection table's figure), each target's optimum (Daly) a dot. A
    tiered target's drain (an async save's write) that outlasts a short interval adds to its
    stall (backpressure)."""
    from ckptio.costmodel import cost_curve

    rows = _projected(proj)
    if not rows:
        return None
    plt = pyplot()
    import numpy as np

    price = rows[0]["price_per_gpu_hour"]
    key, _ = cost_key("lost", price)
    intervals = list(np.geomspace(300, 24 * 3600, 80))
    fig, ax = plt.subplots(figsize=(9, 5.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn: Drawn = {}
    for i, p in enumerate(rows):
        background = p.get("drain_seconds") or (
            p["blocking_stall_seconds"] if p.get("async_save") else 0.0
        )
        base = float(p["snapshot_seconds"] if p.get("async_save") else p["write_seconds"])

        def lost(
            ts: list[float], p: Mapping[str, Any] = p, base: float = base, bg: float = background
        ) -> list[float]:
            return [
                r[key]
                for r in cost_curve(
                    base,
                    ts,
                    gpus=p["gpus"],
                    price_per_gpu_hour=price,
                    mtbf=p["mtbf_seconds"] or math.inf,
                    restart_seconds=p["restart_seconds"],
                    background_seconds=bg,
                )
            ]

        c = colors[i % len(colors)]
        opt = p["optimum_interval_seconds"]
        chosen = p["interval_seconds"]
        at = lost([chosen])[0]
        drawn[p["name"]] = {key: at}
        ax.plot(
            [x / 3600 for x in intervals],
            lost(intervals),
            color=c,
            linestyle="--" if p.get("drain_seconds") else "-",
            label=f"{p['name']} — {at:,.0f} at {human_seconds(chosen)}, optimum {human_seconds(opt)}",
        )
        err = _err(p, key)
        ax.errorbar(
            [chosen / 3600],
            [at],
            yerr=err,
            fmt="s",
            color=c,
            markersize=6,
            capsize=4,
            markeredgecolor="black",
        )
        if opt:
            ax.plot(
                [opt / 3600],
                lost([opt]),
                marker="o",
                color=c,
                markersize=8,
                markeredgecolor="black",
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
    if price:
        ax.set_ylabel(f"lost cost per day at {price:g} price units per GPU-hour (log scale)")
        sec = ax.secondary_yaxis("right", functions=(lambda c: c / price, lambda h: h * price))
        sec.set_ylabel("lost GPU-hours per day (no currency assumed)")
        sec.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        sec.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        sec.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylabel("lost GPU-hours per day (log scale)")
    first = rows[0]
    ax.set_title(
        f"Lost GPU time against checkpoint interval — projected, {first['preset']} on "
        f"{first['gpus']:,} GPUs\n(stall + rework + restart; MTBF "
        f"{human_seconds(first['mtbf_seconds'])}; square: the chosen interval with its 95% "
        "interval, dot: optimum)\ndashed: tiered (its stall grows where the drain outlasts the "
        "interval)",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    return drawn


def plot_tornado(sens: Mapping[str, Sequence[Mapping[str, Any]]], path: str) -> Drawn | None:
    """Sensitivity (:func:`ckptio.sensitivity.sensitivity`): per target, the lost cost per day
    with each assumption halved and doubled, the largest swing on top; the line is the answer
    as assumed."""
    if not sens:
        return None
    plt = pyplot()
    n = len(sens)
    per = max(len(rows) for rows in sens.values())
    fig, axes = plt.subplots(n, 1, figsize=(9, 1.2 + (0.45 * per + 0.8) * n), squeeze=False)
    drawn: Drawn = {}
    for ax, (name, rows) in zip(axes[:, 0], sens.items(), strict=True):
        base = rows[0]["base"]
        drawn[name] = {"base": base}
        for i, r in enumerate(reversed(rows)):
            lo, hi = r["low"], r["high"]
            ax.barh(i, lo - base, left=base, color="#42a5f5", edgecolor="black", height=0.6)
            ax.barh(i, hi - base, left=base, color="#ef5350", edgecolor="black", height=0.6)
            drawn[name][f"{r['assumption']} low"] = lo
            drawn[name][f"{r['assumption']} high"] = hi
            ax.text(
                max(lo, hi),
                i,
                f" {min(lo, hi):,.0f} to {max(lo, hi):,.0f}",
                va="center",
                fontsize=7,
            )
        ax.axvline(base, color="black", linewidth=1)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"{r['words']} ({r['value']})" for r in reversed(rows)], fontsize=8)
        ax.set_title(f"{name}: {base:,.0f} as assumed", fontsize=9)
        right = max(max(r["low"], r["high"]) for r in rows)
        left = min(min(r["low"], r["high"]) for r in rows)
        ax.set_xlim(left * 0.9, right * 1.3)
    axes[-1, 0].set_xlabel("lost cost per day (blue: the assumption halved, red: doubled)")
    fig.suptitle("Which assumption moves the answer most (projected, one at a time)", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return drawn
