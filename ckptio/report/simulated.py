"""The report's sections on **simulated** figures (:mod:`ckptio.simulate`): simulated beside
modelled stall for each target and scale, a plot of both against scale, where and why they
part, and what checkpoints cost a 16,384-GPU job that is interrupted as often as Llama 3's.

:func:`read` takes the ``*.simulated.parquet`` files that ``ckptio simulate --out`` writes,
from the same directories as the runs; :func:`sections` gives the sections
:func:`ckptio.report.build_report` adds, and :func:`build` writes a report of simulations
alone. Every figure here is labelled simulated (with its seed and replications) or modelled.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from ckptio.report.pages import Image, Paragraphs, Section, Table
from ckptio.units import human_seconds

__all__ = [
    "COST_COLUMNS",
    "LLAMA3_DAYS",
    "LLAMA3_GPUS",
    "LLAMA3_INTERRUPTIONS",
    "LLAMA3_SOURCE",
    "LLAMA3_UNPLANNED",
    "SIMULATED_COLUMNS",
    "build",
    "cost_cells",
    "divergence",
    "interruption_costs",
    "plot_scale",
    "read",
    "seconds_text",
    "sections",
    "simulated_cells",
    "simulated_text",
]

#: Llama 3 405B's pre-training: 466 job interruptions in a 54-day snapshot on 16,384 H100
#: GPUs, 419 of them unexpected (Dubey et al. 2024, "The Llama 3 Herd of Models",
#: arXiv 2407.21783, section 3.3.4).
LLAMA3_INTERRUPTIONS = 466
LLAMA3_UNPLANNED = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_SOURCE = "Dubey et al. 2024 (Llama 3, arXiv 2407.21783, section 3.3.4)"

#: |simulated / modelled - 1| above which the report says why the two part.
AGREE = 0.05


def seconds_text(x: float | None) -> str:
    """``5.5 min``, or ``-`` for none."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else human_seconds(x)


def simulated_text(s: dict[str, Any]) -> str:
    """``5.5 min [5.49 min, 5.52 min]``, or ``failed 10/10``."""
    if s["p50_seconds"] is None:
        return f"failed {s['failed']}/{s['replications']}"
    text = seconds_text(s["p50_seconds"])
    if s["p50_coverage"] is not None:
        text += f" [{seconds_text(s['p50_low_seconds'])}, {seconds_text(s['p50_high_seconds'])}]"
        if s["p50_coverage"] < 0.95:
            text += f" ({s['p50_coverage']:.0%})"
    if s["failed"]:
        text += f", {s['failed']} failed"
    return text


def _scenario(s: dict[str, Any], *, shape: bool = False) -> str:
    """What the simulation assumed beyond the profile, in words; ``shape``: the latency's
    shape only (``lognormal, p99 4x the median``), the same for every profile."""
    latency = s["latency"]
    if shape:
        latency = "fixed latency" if latency.startswith("fixed") else latency.split(" (")[0]
    parts = [latency, f"{s['key_layout']} keys"]
    if s.get("overrides"):
        parts.append(f"set {s['overrides']}")
    if s["readers"] == "all":
        parts.append("every rank restores")
    if s["stragglers"]:
        parts.append(f"{s['stragglers']} straggler(s) {s['straggler_slowdown']:g}x slower")
    if s["lockstep"]:
        parts.append("lockstep (the model's client)")
    return "; ".join(parts)


def _runs_text(s: dict[str, Any]) -> str:
    if s["deterministic"]:
        return "deterministic (one replication)"
    return f"{s['replications']} replications, seed {s['seed']}"


def divergence(s: dict[str, Any]) -> str:
    """Why a simulated phase parts from the model (empty when they agree within
    :data:`AGREE`), from what the simulation recorded."""
    sim, mod = s["p50_seconds"], s["modelled_seconds"]
    if sim is not None and mod and abs(sim / mod - 1) <= AGREE:
        return ""
    why = []
    if s["failed"]:
        why.append(
            f"{s['failed_requests']:,} requests ran out of ckptio's retry attempts "
            f"({s['throttled']:,} answered 503 SlowDown): the model counts the throttled "
            "requests as served at the prefix's rate, ckptio's client gives up after its last "
            "backoff and the checkpoint fails"
        )
    elif s["throttled"]:
        why.append(
            f"{s['throttled']:,} requests answered 503 SlowDown and retried after ckptio's "
            "jittered backoff; the model counts only the rate"
        )
    if s["bound_by"] == "straggler node":
        why.append("a straggler node sets the end; the model has every node alike")
    if s["readers"] == "all" and s["phase"] == "restore":
        why.append(
            "every rank reads what it holds (replicas the same objects); the model "
            "counts each byte once"
        )
    if s["latency"].startswith(("lognormal", "resampled")):
        why.append(
            "request latency is drawn from a distribution: requests wait its mean, above the "
            "median the model uses, and the slowest rank meets its tail"
        )
    if sim is not None and mod and sim < mod and not s["lockstep"] and s["phase"] != "drain":
        why.append(
            "ckptio's client starts a rank's next object as soon as one is done, so one rank's "
            "create and complete requests overlap other ranks' transfers; the model puts each "
            "group's metadata in series (--lockstep simulates the model's client)"
        )
    if s["phase"] == "restore" and "+" in s["target"]:
        why.append(
            "the model gives the expected restore ((1 - p) x fast tier + p x durable tier, "
            "the durable read being the busiest node's); each simulated failure either lost "
            "a node, any that wrote, whose ranks then read the durable tier (a node holding "
            "less than the busiest reads it sooner), or did not"
        )
    if not why:
        why.append(s["mechanism"])
    return "; ".join(why)


def _order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    phase = {"save": 0, "restore": 1, "drain": 2}
    return sorted(
        rows,
        key=lambda s: (s["preset"], s["target"], _scenario(s), s["gpus"], phase[s["phase"]]),
    )


def plot_scale(rows: list[dict[str, Any]], path: str) -> dict[str, dict[str, float]] | None:
    """Simulated (p50, bar to p99; a failed point is an ``x`` at the top) and modelled
    (dashed) stall against GPUs, log-log: a row of two panels (save, restore) per preset and
    scenario, one colour per target. Returns what it drew (per ``target preset scenario phase
    GPUs``, the scenario's latency by its shape:
    the simulated p50 and p99 and the modelled seconds), or None (nothing drawn) when nothing
    was simulated at two scales or more."""
    series: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for s in rows:
        if s["phase"] in ("save", "restore"):
            key = (s["preset"], _scenario(s, shape=True), s["target"], s["phase"])
            series.setdefault(key, []).append(s)
    if not any(len({p["gpus"] for p in pts}) > 1 for pts in series.values()):
        return None
    from matplotlib.lines import Line2D

    from ckptio.report.plots import pyplot

    plt = pyplot()
    drawn: dict[str, dict[str, float]] = {}

    panels = sorted({k[:2] for k in series})[:4]
    targets = sorted({k[2] for k in series})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {t: colours[i % len(colours)] for i, t in enumerate(targets)}
    top = max(
        (p[k] or 0)
        for pts in series.values()
        for p in pts
        for k in ("p99_seconds", "modelled_seconds")
    )
    fig, axes = plt.subplots(
        len(panels), 2, figsize=(12, 3.8 * len(panels) + 1), sharey=True, squeeze=False
    )
    for row, (preset, scenario) in enumerate(panels):
        for col, phase in enumerate(("save", "restore")):
            ax = axes[row][col]
            for target in targets:
                pts = sorted(
                    series.get((preset, scenario, target, phase), []), key=lambda p: p["gpus"]
                )
                if not pts:
                    continue
                c = colour[target]
                for p in pts:
                    drawn[f"{target} {preset} {scenario} {phase} {p['gpus']}"] = {
                        k: p[k]
                        for k in ("p50_seconds", "p99_seconds", "modelled_seconds")
                        if p[k] is not None
                    }
                ok = [p for p in pts if p["p50_seconds"] is not None]
                if ok:
                    ax.errorbar(
                        [p["gpus"] for p in ok],
                        [p["p50_seconds"] for p in ok],
                        yerr=[[0.0] * len(ok), [p["p99_seconds"] - p["p50_seconds"] for p in ok]],
                        color=c,
                        marker="o",
                        capsize=3,
                    )
                bad = [p for p in pts if p["p50_seconds"] is None]
                if bad:
                    ax.scatter(
                        [p["gpus"] for p in bad], [top * 1.5] * len(bad), color=c, marker="x", s=80
                    )
                ax.plot(
                    [p["gpus"] for p in pts],
                    [p["modelled_seconds"] for p in pts],
                    color=c,
                    linestyle="--",
                    alpha=0.8,
                )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("GPUs")
            ax.set_title(f"{preset}, {phase}\n{scenario}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
        axes[row][0].set_ylabel("stall per checkpoint, s")
    handles = [Line2D([], [], color=colour[t], lw=3, label=t) for t in targets] + [
        Line2D([], [], color="black", marker="o", label="simulated p50 (bar to p99)"),
        Line2D([], [], color="black", linestyle="--", label="modelled"),
        Line2D([], [], color="black", marker="x", lw=0, label="simulated: failed (503 SlowDown)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08 if len(panels) > 1 else 0.12, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return drawn


def interruption_costs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each target simulated at :data:`LLAMA3_GPUS` GPUs with both phases: the share of
    GPU time that checkpoints cost a job interrupted as Llama 3's was (466 restarts, 419 of
    them unplanned, in 54 days). The interval is Daly's optimum for the simulated save
    (p50) and the unplanned failures' MTBF; saves cost ``stall / (interval + stall)``;
    restores cost every restart's simulated restore (p50); the work redone after each
    unplanned failure (half an interval on average) is shown beside them."""
    from ckptio.costmodel import daly_interval

    span = LLAMA3_DAYS * 86400.0
    mtbf = span / LLAMA3_UNPLANNED
    by: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for s in rows:
        if s["gpus"] == LLAMA3_GPUS and s["phase"] in ("save", "restore", "drain"):
            key = (s["run_id"], s["preset"], s["target"], _scenario(s))
            by.setdefault(key, {})[s["phase"]] = s
    out = []
    for (_, preset, target, scenario), phases in sorted(by.items(), key=lambda kv: kv[0][1:]):
        save, restore, drain = phases.get("save"), phases.get("restore"), phases.get("drain")
        if not save or not restore:
            continue
        row: dict[str, Any] = {
            "preset": preset,
            "target": target,
            "scenario": scenario,
            "runs": _runs_text(save),
            "save_seconds": save["p50_seconds"],
            "restore_seconds": restore["p50_seconds"],
            "mtbf_seconds": mtbf,
            "drain": None if drain is None else simulated_text(drain),
            "drain_seconds": None if drain is None else drain["p50_seconds"],
        }
        if save["p50_seconds"] is None or restore["p50_seconds"] is None:
            row.update(failed=True)
            out.append(row)
            continue
        stall = save["p50_seconds"]
        tau = daly_interval(stall, mtbf)
        saves = stall / (tau + stall)
        restores = LLAMA3_INTERRUPTIONS * restore["p50_seconds"] / span
        rework = LLAMA3_UNPLANNED * (tau + stall) / 2 / span
        if row["drain_seconds"] is not None:
            fits = row["drain_seconds"] <= tau + stall
            row["drain"] += "" if fits else " (longer than the interval: the durable copy lags)"
        row.update(
            failed=False,
            interval_seconds=tau,
            save_share=saves,
            restore_share=restores,
            checkpoint_share=saves + restores,
            rework_share=rework,
        )
        out.append(row)
    return out


SIMULATED_COLUMNS = [
    "target",
    "preset",
    "GPUs",
    "phase",
    "modelled",
    "simulated p50 [interval]",
    "simulated p99",
    "sim/model",
    "bound by (simulated)",
    "binding (model)",
    "throttled",
    "retried",
    "scenario",
    "runs",
]


def simulated_cells(s: dict[str, Any]) -> list[str]:
    """One row of the simulated table (:data:`SIMULATED_COLUMNS`)."""
    ratio = (
        f"{s['p50_seconds'] / s['modelled_seconds']:.2f}"
        if s["p50_seconds"] and s["modelled_seconds"]
        else "-"
    )
    return [
        s["target"],
        s["preset"],
        f"{s['gpus']:,}",
        s["phase"],
        seconds_text(s["modelled_seconds"]),
        simulated_text(s),
        seconds_text(s["p99_seconds"]),
        ratio,
        s["bound_by"],
        s["model_binding"] or "-",
        f"{s['throttled']:,}",
        f"{s['retried']:,}",
        _scenario(s),
        _runs_text(s),
    ]


def read(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The simulated phases (:func:`ckptio.simulate.read_summaries`) in ``paths``, in the
    report's order."""
    from ckptio.simulate import read_summaries

    return _order(read_summaries(paths))


def sections(rows: list[dict[str, Any]], plot: str | None = None) -> list[Section]:
    """The report's sections on simulated figures (none without ``rows``): simulated beside
    modelled, the plot (``plot``: its file name, when drawn), where and why they part, and
    the cost at Llama 3's interruption rate."""
    if not rows:
        return []
    intro = (
        "Every request of the checkpoint's plan replayed in virtual time (ckptio.simulate, "
        "SimPy): latency drawn from a distribution, per-prefix request rates with 503 SlowDown "
        "and ckptio's own retries, stragglers, a restore storm. **Simulated** figures are "
        "projections from storage profiles, not measurements: each is the p50 over its "
        "replications (the runs column: how many, and the seed) with a distribution-free "
        "interval [low, high] (95% or more unless shown), and the p99; **modelled** is the "
        "closed form (ckptio.stallmodel) for the same job."
    )
    blocks: list[Paragraphs | Table | Image] = [
        Paragraphs([intro]),
        Table(SIMULATED_COLUMNS, [simulated_cells(s) for s in rows], ["simulated"] * len(rows)),
    ]
    if plot:
        blocks.append(
            Image(
                plot,
                "Stall against scale: simulated (p50, bar to p99; x: failed) and modelled "
                "(dashed).",
                "simulated",
            )
        )
    apart = [(s, why) for s in rows if (why := divergence(s))]
    items = [
        f"{s['target']}, {s['preset']} on {s['gpus']:,} GPUs, {s['phase']} "
        f"({_scenario(s)}): simulated "
        f"{simulated_text(s)} vs modelled {seconds_text(s['modelled_seconds'])}. Why: {why}. Last: "
        f"rank {s['bound_rank']} on node {s['bound_node']}"
        + (f", prefix {s['bound_prefix']!r}" if s["bound_prefix"] else "")
        + f" ({s['mechanism']})."
        for s, why in apart
    ]
    parting: list[Paragraphs | Table | Image] = (
        [Paragraphs(items, bullets=True)]
        if items
        else [Paragraphs([f"They agree within {AGREE:.0%} everywhere here."])]
    )
    out = [
        Section("simulated", "Simulated vs modelled (full scale)", blocks),
        Section("simulated-apart", "Where simulation and model part, and why", parting, level=3),
    ]
    costs = interruption_costs(rows)
    if costs:
        out.append(
            Section(
                "simulated-llama3",
                "What checkpoints cost at Llama 3's interruption rate (simulated)",
                [
                    Paragraphs([_llama3_intro()]),
                    Table(COST_COLUMNS, [cost_cells(c) for c in costs]),
                ],
                level=3,
            )
        )
    return out


def _llama3_intro() -> str:
    return (
        f"{LLAMA3_GPUS:,} GPUs interrupted as Llama 3 405B's pre-training was: "
        f"{LLAMA3_INTERRUPTIONS} interruptions in {LLAMA3_DAYS} days, {LLAMA3_UNPLANNED} "
        f"unplanned ({LLAMA3_SOURCE}); every interruption restarts from the newest checkpoint. "
        "Interval: Daly's optimum for the simulated save (p50) and the unplanned failures' "
        f"MTBF ({seconds_text(LLAMA3_DAYS * 86400 / LLAMA3_UNPLANNED)}). Shares of GPU time: saves "
        "(stall / (interval + stall)) and restores (every restart's simulated restore); the "
        "work redone after each unplanned failure (half an interval) is shown beside them, not "
        "included. A tiered target's drain runs in the background: when it fails, no durable "
        "copy is made and a failure that loses a node loses its newest checkpoint."
    )


COST_COLUMNS = [
    "target",
    "preset",
    "save p50",
    "restore p50",
    "drain (background)",
    "interval",
    "saves",
    "restores",
    "saves + restores",
    "work redone",
    "scenario",
    "runs",
]


def cost_cells(c: dict[str, Any]) -> list[str]:
    """One row of the Llama 3 table (:data:`COST_COLUMNS`)."""
    if c["failed"]:
        cells = ["-", "-", "a save or restore fails (see above)", "-", "-"]
    else:
        cells = [
            seconds_text(c["interval_seconds"]),
            f"{c['save_share']:.2%}",
            f"{c['restore_share']:.2%}",
            f"{c['checkpoint_share']:.2%}",
            f"{c['rework_share']:.2%}",
        ]
    return [
        c["target"],
        c["preset"],
        seconds_text(c["save_seconds"]),
        seconds_text(c["restore_seconds"]),
        c["drain"] or "-",
        *cells,
        c["scenario"],
        c["runs"],
    ]


def build(paths: Sequence[str], out_dir: str, *, title: str = "ckptio simulation") -> list[str]:
    """A report of the simulations alone (``index.html``, ``report.md``, the plot) in
    ``out_dir``, rendered as :func:`ckptio.report.build_report` renders its pages; the files
    written. Raises when ``paths`` hold no simulation."""
    from ckptio import errors
    from ckptio.report.pages import render_html, render_markdown
    from ckptio.report.plots import plots_unavailable

    rows = read(paths)
    if not rows:
        raise errors.InvalidArgumentError(
            f"no simulated results (*.simulated.parquet) in {', '.join(map(str, paths))}"
        )
    os.makedirs(out_dir, exist_ok=True)
    missing = plots_unavailable()
    plot = None if missing else plot_scale(rows, os.path.join(out_dir, "simulated.png"))
    secs = sections(rows, "simulated.png" if plot is not None else None)
    intro = [f"Plots not drawn: {missing}."] if missing else []
    files = []
    for name, render in (("index.html", render_html), ("report.md", render_markdown)):
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(render(title, intro, secs))
        files.append(path)
    return files + ([os.path.join(out_dir, "simulated.png")] if plot is not None else [])
