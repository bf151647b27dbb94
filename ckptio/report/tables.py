"""The report's tables as text: one definition of each column (its header, the row key it
shows, its unit), used by the Markdown and HTML pages and by the console alike, so a figure
reads the same wherever it is shown, with its interval beside it.

An interval is shown as a range, ``13.6 min (12.1 min to 15 min)``, or, where width is short
(the console), as a relative half-width, ``13.6 min ±11%``: the same 95% interval
(:mod:`ckptio.intervals`). A figure without one says why in its row's ``basis``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ckptio.units import human_rate, human_seconds

__all__ = [
    "COST_PARTS",
    "RESTORE_COLUMNS",
    "SUMMARY_COLUMNS",
    "Column",
    "cost_key",
    "fig_text",
    "figure_text",
    "md_table",
    "projection_cells",
    "projection_columns",
    "restore_cells",
    "restore_paths",
    "summary_cells",
    "value_text",
]


def fig_text(value: float | None, unit: str) -> str:
    """A profile figure in words: ``unlimited`` for none or inf."""
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "unlimited"
    if unit == "s":
        return human_seconds(value)
    if unit == "B/s":
        return human_rate(value)
    return f"{value:,.0f}/s"


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table; a ``|`` in a cell is escaped, a newline becomes a space."""

    def cell(c: Any) -> str:
        return str(c).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def value_text(x: float, unit: str) -> str:
    """A number in the unit's words: ``s`` (human time), ``GB/s``, ``B/s`` (bytes/s, human),
    ``%`` (a share),
    ``money`` / ``GPU-h`` (per day, whole units)."""
    if unit == "s":
        return human_seconds(x)
    if unit == "GB/s":
        return f"{x:.3g}"
    if unit == "B/s":
        return human_rate(x)
    if unit == "%":
        return f"{x:.2%}" if x == 0 or x >= 1e-3 else f"{x * 100:.2g}%"
    return f"{x:,.0f}" if abs(x) >= 100 or x == 0 else f"{x:.3g}"  # money, GPU-hours


def figure_text(row: Mapping[str, Any], key: str, unit: str, *, short: bool = False) -> str:
    """``row[key]`` in words with its interval (``key_low``/``key_high``) beside it: a range,
    or with ``short`` a relative half-width; ``-`` for none."""
    x = row.get(key)
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    text = value_text(x, unit)
    lo, hi = row.get(f"{key}_low"), row.get(f"{key}_high")
    if lo is None or hi is None:
        return text
    if short:
        rel = (hi - lo) / 2 / x if x else 0.0
        return f"{text} ±{rel:.0%}" if rel >= 0.005 else f"{text} ±<1%"
    low, high = value_text(lo, unit), value_text(hi, unit)
    if low == high == text:  # a figure the rounds do not move (a snapshot, say)
        return f"{text} (±0)"
    return f"{text} ({low} to {high})"


COST_PARTS = ("stall", "rework", "restart", "lost")
"""The parts of the lost GPU time a projection table shows (:data:`ckptio.costmodel.LOSSES`)
and their sum."""


def cost_key(part: str, price: float) -> tuple[str, str]:
    """The row key and unit of a part's cost per day: in price units where a price is given,
    else in GPU-hours."""
    if price:
        return f"{part}_cost_per_day", "money"
    return f"{part}_gpu_hours_per_day", "GPU-h"


class Column:
    """A column: its header, the row key it shows (or a function of the row) and the unit."""

    def __init__(self, header: str, key: str, unit: str = "", text: Any = None) -> None:
        self.header, self.key, self.unit, self.text = header, key, unit, text

    def cell(self, row: Mapping[str, Any], *, short: bool = False) -> str:
        if self.text is not None:
            return str(self.text(row))
        if self.unit:
            return figure_text(row, self.key, self.unit, short=short)
        v = row.get(self.key)
        return "-" if v is None else str(v)


def _drain(p: Mapping[str, Any]) -> str:
    if p.get("drain_seconds") is None:
        return "-"
    fits = " (fits the interval)" if p.get("drain_fits_interval") else " (outlasts the interval)"
    return figure_text(p, "drain_seconds", "s") + fits


def _peers(p: Mapping[str, Any]) -> str:
    if not p.get("peers"):
        return "-"
    fits = (
        "fits the interval"
        if p.get("replication_fits_interval")
        else f"outlasts the interval: +{figure_text(p, 'replication_wait_seconds', 's')} stall"
    )
    return (
        f"{p['peers']} (projected): restore from a peer {figure_text(p, 'restore_peer_seconds', 's')}; "
        f"replication {figure_text(p, 'replication_seconds', 's')} ({fits}); every copy lost in "
        f"{p['restore_durable_probability']:.1%} of failures"
    )


def restore_paths(p: Mapping[str, Any]) -> list[tuple[str, str, float]]:
    """Where a projected target's restores read from after a failure: (in words, the row's
    key of that restore's seconds, its probability), the paths of :func:`ckptio.stallmodel.
    project`; a plain target has one, its storage."""
    if p.get("drain_seconds") is None:
        return [("from the storage", "restore_seconds", 1.0)]
    if not p.get("peers"):
        lose = p["p_lose_node"]
        return [
            ("from its own fast tier", "restore_fast_seconds", 1 - lose),
            ("from the durable tier", "restore_durable_seconds", lose),
        ]
    if p.get("peer_slower_than_durable"):  # a replacement node reads the faster durable tier
        return [
            ("from its own fast tier", "restore_fast_seconds", p["restore_fast_probability"]),
            (
                "from the durable tier (a peer's copy, projected, would be slower)",
                "restore_durable_seconds",
                p["restore_peer_probability"] + p["restore_durable_probability"],
            ),
        ]
    return [
        ("from its own fast tier", "restore_fast_seconds", p["restore_fast_probability"]),
        ("from a peer's copy (projected)", "restore_peer_seconds", p["restore_peer_probability"]),
        ("from the durable tier", "restore_durable_seconds", p["restore_durable_probability"]),
    ]


RESTORE_COLUMNS = ("target", "restores read", "expected restore", "restart", "restart cost/day")
"""The restore table's columns (:func:`restore_cells`)."""


def restore_cells(p: Mapping[str, Any]) -> list[str]:
    """A row of the restore table: each path's time and probability, the expected restore,
    the restart and its cost per day (GPU-hours without a price)."""
    key, unit = cost_key("restart", p["price_per_gpu_hour"])
    paths = "; ".join(
        f"{words} {figure_text(p, k, 's')} ({share:.1%})" for words, k, share in restore_paths(p)
    )
    return [
        p["name"],
        paths,
        figure_text(p, "restore_seconds", "s"),
        figure_text(p, "restart_seconds", "s"),
        figure_text(p, key, unit),
    ]


def _async(p: Mapping[str, Any]) -> str:
    if p.get("async_stall_seconds") is None:
        return "-"
    late = "" if p.get("async_fits_interval", True) else " (write outlasts the interval)"
    return figure_text(p, "async_stall_seconds", "s") + late


def _cost_columns(price: float) -> list[Column]:
    names = {
        "stall": "stall",
        "rework": "rework (work redone)",
        "restart": "restart",
        "lost": "lost in all",
    }
    unit_words = "cost/day" if price else "GPU-h/day"
    out = []
    for part in COST_PARTS:
        key, unit = cost_key(part, price)
        out.append(Column(f"{names[part]} {unit_words}", key, unit))
    return out


def projection_columns(price: float, *, workload: bool = True) -> list[Column]:
    """The full-scale projection table's columns (costs in price units, or GPU-hours without
    a price; the workload column only with ``workload``, when a table holds several)."""
    return [
        *(
            [Column("workload", "", text=lambda p: f"{p['preset']} on {p['gpus']:,} GPUs")]
            if workload
            else []
        ),
        Column("target", "target"),
        Column("basis", "basis"),
        Column("projected with", "profile"),
        Column("stall per checkpoint", "stall_seconds", "s"),
        Column("binding limit", "binding_detail"),
        Column("drain", "", text=_drain),
        Column("restore", "restore_seconds", "s"),
        Column("peer copies", "", text=_peers),
        Column("restart", "restart_seconds", "s"),
        *_cost_columns(price),
        Column("optimal interval (Daly)", "optimum_interval_seconds", "s"),
        Column("stall with async save", "", text=_async),
    ]


def projection_cells(p: Mapping[str, Any], price: float, *, workload: bool = True) -> list[str]:
    """A row of the full-scale projection table (:func:`projection_columns`); a target not
    projected shows why in its binding-limit cell."""
    cols = projection_columns(price, workload=workload)
    if p.get("refusal") or not p.get("write_seconds"):
        why = p.get("refusal") or p.get("binding_detail") or "-"
        return [
            c.cell(p)
            if c.header in ("workload", "target", "basis")
            else why
            if c.header == "binding limit"
            else "-"
            for c in cols
        ]
    return [c.cell(p) for c in cols]


def _phase(key: str, phase: str) -> Any:
    def text(s: Mapping[str, Any]) -> str:
        kinds = s.get("phase_kinds") or {}
        cell = figure_text(s, key, "s")
        return cell + (f" ({kinds[phase]})" if phase in kinds and cell != "-" else "")

    return text


def _kind(s: Mapping[str, Any]) -> str:
    from ckptio.report.data import KIND_NOTE

    if s.get("phase_kinds"):
        return f"tiered: {s['tiers_note']}"
    return KIND_NOTE[s["kind"]] + (f" ({s['profile']})" if s["profile"] else "")


def _rounds(s: Mapping[str, Any]) -> str:
    warm = s.get("warmup_rounds") or 0
    return f"{s['rounds']}" + (f" (+{warm} warm-up)" if warm else "")


SUMMARY_COLUMNS = [
    Column("target", "target"),
    Column("kind", "", text=_kind),
    Column("site", "site"),
    Column("rounds", "", text=_rounds),
    Column("stall (write)", "", text=_phase("write_seconds", "save")),
    Column("drain", "", text=_phase("drain_seconds", "drain")),
    Column("restore (read)", "", text=_phase("read_seconds", "restore")),
    Column("restore from durable", "", text=_phase("restore_durable_seconds", "restore-durable")),
    Column("write GB/s", "write_GBps", "GB/s"),
    Column("read GB/s", "read_GBps", "GB/s"),
    Column("requests", "requests"),
    Column("retries", "retries"),
    Column("throttled", "throttled"),
]
"""The comparison table (this run's scale): one row per target and point."""


def summary_cells(s: Mapping[str, Any], *, point: bool = False) -> list[str]:
    """A row of the comparison table (:data:`SUMMARY_COLUMNS`, with the point after the
    target when asked)."""
    cells = [c.cell(s) for c in SUMMARY_COLUMNS]
    return [*cells[:1], s.get("point") or "", *cells[1:]] if point else cells
