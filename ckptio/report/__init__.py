"""Tables, Markdown, HTML and PNG plots from result files and the model: what was measured,
what it would cost at full scale, and why.

Every figure shown carries what it is: **measured** (on real storage, with its 95% interval
over the rounds), **emulated** (through the ``emulate`` backend: a profile imposed by
sleeping, not the real service; projected deterministically from the profile), **mock**
(moto: tests correctness, not a performance figure) or **projected** (the model at full
scale). The report's page starts with what it found (:mod:`ckptio.report.findings`).

The package, by responsibility: :mod:`~ckptio.report.data` (results grouped into targets,
the figures at the scale that was run), :mod:`~ckptio.report.projections` (full scale),
:mod:`~ckptio.report.tables` (columns and cells, shared with the console),
:mod:`~ckptio.report.plots`, :mod:`~ckptio.report.findings` (the conclusion),
:mod:`~ckptio.report.pages` (Markdown and HTML), and :func:`build_report` here, which puts
them together. A new section of the report is a :class:`~ckptio.report.pages.Section` added
in :func:`sections`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ckptio.report.data import KIND_NOTE, KIND_STYLE, MEASURED_NOTES, measured_note, run_kind
from ckptio.report.pages import Image, Paragraphs, Section, Table
from ckptio.report.plots import plots_unavailable
from ckptio.report.projections import DEFAULT_PROJECTIONS, Scenario
from ckptio.report.tables import fig_text, md_table
from ckptio.stallmodel import DEFAULT_PRICE_PER_GPU_HOUR

__all__ = [
    "DEFAULT_PRICE_PER_GPU_HOUR",
    "DEFAULT_PROJECTIONS",
    "KIND_NOTE",
    "KIND_STYLE",
    "MEASURED_NOTES",
    "Report",
    "Scenario",
    "build_report",
    "fig_text",
    "md_table",
    "measured_note",
    "plots_unavailable",
    "run_kind",
    "sections",
]


@dataclass
class Report:
    """What a report shows, before it is written: the targets, their figures at the scale
    run (``summary``) and at full scale (``projections``), the sensitivity of the first
    workload's answer (per target), and the plots drawn (name -> file and the figures it
    drew)."""

    title: str
    scenario: Scenario
    targets: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    projections: list[dict[str, Any]]
    sensitivity: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    plots: dict[str, tuple[str, Any]] = field(default_factory=dict)
    plots_missing: str | None = None
    sessions: list[str] = field(default_factory=list)
    sites: list[str] = field(default_factory=list)
    simulated: list[dict[str, Any]] = field(default_factory=list)
    """The simulated phases in the result directories (:mod:`ckptio.report.simulated`)."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """Sections on runs over several hosts (:func:`ckptio.pernode.sections`)."""


def _sensitivity(
    targets: Sequence[Mapping[str, Any]], scenario: Scenario
) -> dict[str, list[dict[str, Any]]]:
    """The sensitivity of each projectable target at the scenario's first workload."""
    from ckptio.report.projections import storage_of
    from ckptio.sensitivity import sensitivity
    from ckptio.stallmodel import preset_workload

    preset, gpus = scenario.presets[0]
    w = preset_workload(preset, gpus=gpus)
    c = scenario.conditions(w)
    out = {}
    for t in targets:
        s = storage_of(t)
        if s.profile is not None and not s.refusal:
            out[t["name"]] = sensitivity(w, s.profile, replace(c, peers=s.peers), local=s.local)
    return out


def _plots(r: Report, out_dir: str) -> None:
    """Draws every plot that has something to show; records its file and what it drew."""
    from ckptio.report import plots as pl
    from ckptio.report import simulated

    first = [p for p in r.projections if p["preset"] == r.scenario.presets[0][0]]
    draw = {
        "summary": ("throughput", lambda path: pl.plot_throughput(r.summary, path)),
        "latency": ("latency", lambda path: pl.plot_latency(r.targets, path)),
        "sweep": ("sweep", lambda path: pl.plot_sweep(r.summary, path)),
        "breakdown": ("breakdown", lambda path: pl.plot_breakdown(first, path)),
        "cost": ("cost", lambda path: pl.plot_cost(first, path)),
        "timeline": ("timeline", lambda path: pl.plot_timeline(first, path)),
        "restores": ("restores", lambda path: pl.plot_restores(first, path)),
        "tornado": ("tornado", lambda path: pl.plot_tornado(r.sensitivity, path)),
        "simulated": ("simulated", lambda path: simulated.plot_scale(r.simulated, path)),
    }
    for name, (stem, fn) in draw.items():
        path = os.path.join(out_dir, f"{stem}.png")
        drawn = fn(path)
        if drawn is not None:
            r.plots[name] = (path, drawn)


def compute(paths: Sequence[str], scenario: Scenario, *, title: str) -> Report:
    """Read result files/directories ``paths`` and compute the report's tables (no file is
    written)."""
    from ckptio import errors, pernode
    from ckptio.report import simulated
    from ckptio.report.data import group_targets, summary_rows
    from ckptio.report.projections import projection_rows
    from ckptio.results import read_results

    res = read_results(list(paths))
    runs = res.runs.to_pylist()
    if not runs:
        raise errors.InvalidArgumentError(f"no runs in {', '.join(map(str, paths))}")
    sessions = res.sessions()
    targets = group_targets(
        runs, res.sidecars, res.phases.to_pylist(), res.requests.to_pylist(), sessions
    )
    return Report(
        title=title,
        scenario=scenario,
        targets=targets,
        summary=summary_rows(targets),
        projections=projection_rows(targets, scenario),
        sensitivity=_sensitivity(targets, scenario),
        sessions=sorted(set(sessions.values())),
        sites=sorted({t["site"] for t in targets if t["site"]}),
        simulated=simulated.read(paths),
        nodes=pernode.sections(res),
    )


def _image(r: Report, name: str, caption: str) -> list[Paragraphs | Table | Image]:
    if name not in r.plots:
        return []
    return [Image(os.path.basename(r.plots[name][0]), caption, name)]


def _sensitivity_table(r: Report) -> list[Table]:
    if not r.sensitivity:
        return []
    names = list(r.sensitivity)
    by = {n: {row["assumption"]: row for row in rows} for n, rows in r.sensitivity.items()}
    # every assumption any target varies, in the first target's order (the peer copies'
    # assumptions only move targets with peers: the others show "-")
    every = {row["assumption"]: row for rows in r.sensitivity.values() for row in rows}
    order = [*(row["assumption"] for row in r.sensitivity[names[0]]), *every]
    rows = []
    for key in dict.fromkeys(order):
        a = every[key]
        cells = [f"{a['words']} ({a['value']} as assumed; halved / doubled)"]
        for n in names:
            x = by[n].get(key)
            cells.append(
                "-"
                if x is None
                else f"{x['low']:,.0f} / {x['high']:,.0f} (swing {x['swing']:,.0f})"
            )
        rows.append(cells)
    base = ["as assumed"] + [f"{r.sensitivity[n][0]['base']:,.0f}" for n in names]
    return [Table(["assumption", *names], [base, *rows])]


def _restores(r: Report) -> list[Paragraphs | Table | Image]:
    """Where each target's restores read after a failure (projected): the table and its
    plot, with what the peer copies are."""
    from ckptio.report.tables import RESTORE_COLUMNS, restore_cells

    first = r.scenario.presets[0][0]
    rows = [
        p
        for p in r.projections
        if p["preset"] == first and p.get("write_seconds") and not p.get("refusal")
    ]
    if not rows:
        return []
    from ckptio.costmodel import ASSUMPTIONS

    ran = [p["name"] for p in rows if p.get("peer_link_measured")]
    where = (
        f"the model's projection, with the node link fitted from the restores from a peer "
        f"measured in the runs of {', '.join(sorted(set(ran)))} (`ckptio run --replicas K`)"
        if ran
        else "the model's projection (the runs here made no copies between nodes)"
    )
    text = [
        "After a failure every node restarts and reads the newest checkpoint back. A tiered "
        "target reads its own fast tier unless the failure replaced the node "
        f"({ASSUMPTIONS['p_lose_node']}); a replaced node reads a peer's copy where one "
        f"survives, else the durable tier. Peer copies at full scale are {where}: a ring of "
        "nodes, each node's step on the next k; a failure that loses more nodes at once than "
        "there are copies is counted as losing every copy of one "
        f"({ASSUMPTIONS['p_lose_another']}). The restart is the fixed overhead plus the "
        "expected restore."
    ]
    return [
        Paragraphs(text),
        Table(list(RESTORE_COLUMNS), [restore_cells(p) for p in rows], ["projected"] * len(rows)),
        *_image(r, "restores", "Restore time by where it reads, and how often (projected)."),
    ]


def _profiles(r: Report) -> list[Paragraphs | Table | Image]:
    """Every profile an emulated target was run and projected with, each figure with its
    source."""
    from ckptio import errors
    from ckptio.profiles import FIGURES, load_profile
    from ckptio.units import human_size

    used = sorted(
        {t["profile"] for t in r.targets if t["kind"] == "emulated" and t["profile"]}
        | {
            t["tiers"][w]
            for t in r.targets
            if t.get("tiers")
            for w in ("local", "durable")
            if not t["tiers"].get(f"{w}_measured")
        }
    )
    blocks: list[Paragraphs | Table | Image] = []
    for name in used:
        try:
            prof = load_profile(name)
        except errors.InvalidArgumentError as err:
            blocks.append(Paragraphs([f"{name}: not known here ({err})"]))
            continue
        blocks.append(Paragraphs([f"**{prof.name}**: {prof.title}"]))
        blocks.append(
            Table(
                ["figure", "value", "source"],
                [
                    [k, fig_text(f.value, FIGURES[k]) + (" *" if f.assumption else ""), f.source]
                    for k, f in prof.figures.items()
                ],
            )
        )
        blocks.append(
            Paragraphs(
                [
                    f"* an assumption, not a published figure. Streams per node {prof.streams} "
                    f"({prof.sources.get('streams', '')}); part size {human_size(prof.part_size)};"
                    f" past the rate limit: {prof.throttle or 'n/a'}."
                ]
            )
        )
    return blocks


def sections(r: Report) -> list[Section]:
    """The report's sections, in order: the conclusion first, then the detail."""
    from ckptio.report.findings import assumptions, conclusion
    from ckptio.report.tables import (
        SUMMARY_COLUMNS,
        projection_cells,
        projection_columns,
        summary_cells,
    )

    price = r.scenario.price
    points = any(s["point"] for s in r.summary)
    notes = [n for p in r.projections for n in p.get("notes") or []]
    several = len({(p["preset"], p["gpus"]) for p in r.projections}) > 1
    cols = projection_columns(price, workload=several)
    first = r.projections[0] if r.projections else {}
    workload_words = (
        "" if several or not first else f" — {first['preset']} on {first['gpus']:,} GPUs"
    )
    out = [
        Section(
            "conclusion",
            "What we found",
            [
                Paragraphs(conclusion(r.projections, r.sensitivity)),
                Paragraphs(["The assumptions, with their sources:"]),
                Paragraphs(assumptions(r.projections), bullets=True),
            ],
        ),
        Section(
            "projection",
            f"Full-scale projection (model){workload_words}",
            [
                Paragraphs(
                    [
                        "Every figure here is projected; 'projected with' says from what. "
                        "Measured targets: the figure projected from all steady rounds, and in "
                        "brackets its 95% interval from the spread of the same projection made "
                        "from each round alone (Student's t). Emulated targets: deterministic, "
                        "the profile's figures are the model's inputs. Lost time = stall + "
                        "rework (work redone after a failure) + restart (Daly 2006).",
                        *dict.fromkeys(notes),
                    ]
                ),
                Table(
                    [c.header for c in cols],
                    [projection_cells(p, price, workload=several) for p in r.projections],
                    ["projected"] * len(r.projections),
                ),
            ],
        ),
        Section(
            "cost",
            "What it costs, and which assumption moves it",
            [
                *_image(
                    r, "breakdown", "Lost GPU time per day, stall + rework + restart (projected)."
                ),
                *_image(
                    r, "cost", "Lost GPU time per day against the checkpoint interval (projected)."
                ),
                *_sensitivity_table(r),
                *_image(
                    r, "tornado", "Each assumption halved and doubled, the others held (projected)."
                ),
            ],
        ),
        Section(
            "measured",
            "Comparison (this run's scale)",
            [
                Paragraphs(
                    [
                        "Mean over the steady rounds of each target, with the 95% interval in "
                        "brackets (none with one round); a run's first round is left out when "
                        "it is a warm-up. **measured**: real storage. **emulated** (orange rows): "
                        "the emulate backend imposing a storage profile by sleeping, not the real "
                        "service. **mock** (grey rows): moto, not a performance figure."
                    ]
                ),
                Table(
                    [c.header for c in SUMMARY_COLUMNS][:1]
                    + (["point"] if points else [])
                    + [c.header for c in SUMMARY_COLUMNS][1:],
                    [summary_cells(s, point=points) for s in r.summary],
                    [s["kind"] for s in r.summary],
                ),
                *_image(r, "summary", "Throughput per target and phase at the scale that was run."),
                *_image(r, "latency", "Distribution of data-request latency per target and phase."),
                *_image(r, "sweep", "Throughput against concurrency from sweeps."),
            ],
        ),
        *(  # runs over several hosts: each node, the slowest, the model against more nodes
            Section(
                "nodes" if i == 0 else f"nodes-{i}",
                sec["title"],
                [
                    Paragraphs([sec["intro"]]),
                    Table(sec["header"], sec["rows"], ["measured"] * len(sec["rows"])),
                ],
            )
            for i, sec in enumerate(r.nodes)
        ),
        Section(
            "timeline",
            "Stall, drain and restore at full scale",
            _image(
                r, "timeline", "One checkpoint interval and one restart per target (projected)."
            ),
        ),
        Section("restores", "Restarts by which copy survives", _restores(r)),
        Section("profiles", "Profiles emulated and projected with", _profiles(r)),
    ]
    from ckptio.report.simulated import sections as simulated_sections

    plot = os.path.basename(r.plots["simulated"][0]) if "simulated" in r.plots else None
    out[3:3] = simulated_sections(r.simulated, plot)  # after what the projection costs
    return [s for s in out if s.blocks]


def _intro(r: Report) -> list[str]:
    from ckptio.results import session_name

    text = f"Runs of {len({t['target'] for t in r.targets})} target(s)"
    if r.sites:
        text += f" at {'sites' if len(r.sites) > 1 else 'site'} {', '.join(r.sites)}"
    if len(r.sessions) > 1:
        text += (
            f"; **{len(r.sessions)} separate sessions merged on purpose**: a target measured in "
            "several is shown once per session, labelled with its time, never averaged across "
            "them; sessions: " + ", ".join(session_name(s) for s in r.sessions)
        )
    return [text + "."]


def build_report(
    paths: Sequence[str],
    out_dir: str,
    scenario: Scenario | None = None,
    *,
    title: str = "ckptio report",
) -> dict[str, Any]:
    """Merge result files/directories ``paths`` (from any machines, sites or sessions) into
    ``out_dir``: ``index.html``, ``report.md``, PNG plots and the tables as Parquet
    (``summary.parquet``, ``projections.parquet``, ``sensitivity.parquet``). Returns what it
    wrote and the tables (JSON-able), and per plot the figures it drew (``plots``). Without
    matplotlib the report is written without plots and says why (``plots_missing``)."""
    from ckptio.report.files import write_tables
    from ckptio.report.pages import render_html, render_markdown

    r = compute(paths, scenario or Scenario(), title=title)
    os.makedirs(out_dir, exist_ok=True)
    r.plots_missing = plots_unavailable()
    if not r.plots_missing:
        _plots(r, out_dir)
    secs = sections(r)
    intro = _intro(r)
    if r.plots_missing:
        intro.append(f"Plots not drawn: {r.plots_missing}.")
    with open(os.path.join(out_dir, "report.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(title, intro, secs))
    with open(os.path.join(out_dir, "index.html"), "w", encoding="utf-8") as f:
        f.write(render_html(title, intro, secs))
    written = [os.path.join(out_dir, n) for n in ("index.html", "report.md")]
    written += [path for path, _ in r.plots.values()]
    written += write_tables(out_dir, r.summary, r.projections, r.sensitivity)
    return {
        "out": out_dir,
        "files": written,
        "summary": r.summary,
        "projections": r.projections,
        "sensitivity": r.sensitivity,
        "plots": {name: drawn for name, (_, drawn) in r.plots.items()},
        "sessions": r.sessions,
        "sites": r.sites,
        "plots_missing": r.plots_missing,
        "nodes": r.nodes,
    }
