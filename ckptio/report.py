"""Tables, Markdown, HTML and PNG plots from result files and the model.

Every figure shown carries what it is: **measured** (on real storage), **emulated** (through
the ``shaped`` backend: a profile imposed by sleeping, not the real service), **mock** (moto:
tests correctness, not a performance figure) or **projected** (the model at full scale).
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from ckptio.model import human_rate, human_seconds
from ckptio.profiles import FIGURES, Profile


def _fig(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "unlimited"
    if unit == "s":
        return human_seconds(value)
    if unit == "B/s":
        return human_rate(value)
    return f"{value:,.0f}/s"


def profiles_table(profiles: list[Profile]) -> Table:
    """One row per figure, one column per profile; ``*`` marks an assumption."""
    from ckptio.model import human_size

    table = Table(title="storage profiles (* = assumption, no published figure)")
    table.add_column("figure")
    for p in profiles:
        table.add_column(p.name, justify="right")
    for name, unit in FIGURES.items():
        cells = []
        for p in profiles:
            f = p.figures[name]
            cells.append(_fig(f.value, unit) + ("*" if f.assumption else ""))
        table.add_row(name.replace("_", " "), *cells)
    table.add_row("streams per node", *[str(p.streams) for p in profiles])
    table.add_row("part size", *[human_size(p.part_size) for p in profiles])
    table.add_row("rate limit per", *[p.rate_scope for p in profiles])
    table.add_row("past the rate limit",
                  *[(p.throttle.split(";")[0].split(":")[0] or "-") for p in profiles])
    return table


def print_model(result: dict[str, Any], console: Console) -> None:
    """The model's answer for people: per target, time, binding limit, idle cost, intervals."""
    targets = result["targets"]
    if "workload" in result:
        w = result["workload"]
        from ckptio.model import human_size

        console.print(
            f"workload {w['name'] or ''}: {human_size(w['total_bytes'])} per checkpoint, "
            f"{w['writing_ranks']} writing ranks of {max(w['ranks'], w['writing_ranks'])} GPUs, "
            f"{human_size(w['bytes_per_rank'])} per rank ({w['ranks_per_node']} per node)"
        )
    table = Table(title="checkpoint stall and cost (projected by the model)")
    for col in ("target", "write", "read", "binding limit", "idle", "idle GPU-h/day",
                "cost/day"):
        table.add_column(col, justify="left" if col in ("target", "binding limit") else "right")
    for t in targets:
        table.add_row(
            t["target"],
            human_seconds(t.get("write_seconds", t["checkpoint_seconds"])),
            human_seconds(t["read_seconds"]) if "read_seconds" in t else "-",
            t.get("binding_detail", "-"),
            f"{t['idle_fraction']:.2%}",
            f"{t['idle_gpu_hours_per_day']:,.1f}",
            f"{t['idle_cost_per_day']:,.0f}" if t["price_per_gpu_hour"] else "-",
        )
    console.print(table)
    first = targets[0]
    if first.get("async_save"):
        for t in targets:
            console.print(
                f"{t['target']}: async save stalls {human_seconds(t['snapshot_seconds'])} "
                f"(snapshot) instead of {human_seconds(t['blocking_stall_seconds'])}"
                + ("" if t["async_fits_interval"] else
                   " — but the background write is longer than the interval")
            )
    if first.get("young_interval_seconds") is not None:
        for t in targets:
            console.print(
                f"{t['target']}: optimal interval Young {human_seconds(t['young_interval_seconds'])}"
                f", Daly {human_seconds(t['daly_interval_seconds'])} of compute; total overhead "
                f"{t['overhead_at_interval']:.2%} at {human_seconds(t['interval_seconds'])}, "
                f"{t['overhead_at_optimum']:.2%} at the optimum"
            )
