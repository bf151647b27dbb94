"""The report's tables as Parquet beside its pages, each figure with its interval columns
(``<figure>_low`` / ``<figure>_high``) and every column's unit in its field metadata (key
``unit``), as the result files have (:mod:`ckptio.results`)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["unit_of", "write_tables"]

_SUFFIXES = (
    ("_seconds", "seconds"),
    ("_GBps", "GB/s (1e9 bytes/s)"),
    ("_share", "share of wall time (0 to 1)"),
    ("_gpu_hours_per_day", "GPU-hours per day"),
    ("_cost_per_day", "price units per day (no currency)"),
    ("_bytes", "bytes"),
    ("_per_gpu_hour", "price units per GPU-hour"),
    ("_interval", "ratio"),
    ("_probability", "probability (0 to 1)"),
)


def unit_of(column: str) -> str:
    """A report column's unit, from its name (an interval's ends have their figure's)."""
    base = column.removesuffix("_low").removesuffix("_high")
    for suffix, unit in _SUFFIXES:
        if base.endswith(suffix):
            return unit
    if base in ("low", "high", "base", "swing"):
        return "price units per day (no currency), or GPU-hours per day without a price"
    if base in (
        "gpus",
        "rounds",
        "warmup_rounds",
        "requests",
        "retries",
        "throttled",
        "iterations",
        "writing_ranks",
        "streams",
        "ranks",
        "peers",
        "peer_fan_in",
    ):
        return "count"
    if base == "peer_bandwidth":
        return "bytes/s"
    if base in ("p_lose_node", "p_lose_another"):
        return "probability (0 to 1)"
    return "text"


def _cell(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, list | dict | tuple):
        return str(v)
    return v


def _write(path: str, rows: Sequence[Mapping[str, Any]]) -> str | None:
    if not rows:
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = list(dict.fromkeys(k for r in rows for k in r))
    data = {c: [_cell(r.get(c)) for r in rows] for c in cols}
    fields = []
    arrays = []
    for c in cols:
        arr = (
            pa.array(data[c])
            if any(v is not None for v in data[c])
            else pa.nulls(len(rows), pa.string())
        )
        if pa.types.is_null(arr.type):
            arr = arr.cast(pa.string())
        arrays.append(arr)
        fields.append(pa.field(c, arr.type, metadata={"unit": unit_of(c)}))
    tmp = path + ".tmp"
    pq.write_table(pa.Table.from_arrays(arrays, schema=pa.schema(fields)), tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def write_tables(
    out_dir: str,
    summary: Sequence[Mapping[str, Any]],
    projections: Sequence[Mapping[str, Any]],
    sensitivity: Mapping[str, Sequence[Mapping[str, Any]]],
) -> list[str]:
    """``summary.parquet``, ``projections.parquet`` and ``sensitivity.parquet`` under
    ``out_dir`` (those with rows); returns their paths."""
    from ckptio.errors import require

    require("pyarrow.parquet", extra="report", purpose="the report's tables (Parquet)")
    sens = [{"target": name, **row} for name, rows in sensitivity.items() for row in rows]
    summ = [
        {k: v for k, v in s.items() if k != "phase_kinds"}
        | {"phase_kinds": str(s.get("phase_kinds") or "")}
        for s in summary
    ]
    out = []
    for name, rows in (("summary", summ), ("projections", projections), ("sensitivity", sens)):
        path = _write(os.path.join(out_dir, f"{name}.parquet"), rows)
        if path:
            out.append(path)
    return out
