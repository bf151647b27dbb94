"""Run records as Arrow tables, written as Parquet with a JSON sidecar.

A result directory holds, per run, ``<run_id>.requests.parquet`` (one row per storage
request, from every rank's trace), ``<run_id>.phases.parquet`` (one row per rank x iteration
x phase), ``<run_id>.run.parquet`` (one row per iteration of the run, with the aggregate
figures) and ``<run_id>.json`` (machine, versions, configuration, UTC time). No credential
is written: every string of the tables and of the sidecar goes through :mod:`ckptio.redact`
on its way to the file. Several runs may share a directory; :func:`read_results` merges any set of files
or directories, from any machine or site, into one :class:`Results` (the schemas are fixed
here, so tables concatenate; the ``site`` column tells sites apart).

Units: bytes, seconds (``start``/``end`` are Unix seconds), GB/s = 1e9 bytes/s (columns
``*_GBps``: gigabytes, never gigabits, per second). Every column carries its unit in the
Parquet field metadata (key ``unit``, :data:`UNITS`), so a file read without ckptio says
what its numbers mean.
"""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckptio import errors
from ckptio.redact import redact, redact_obj, redact_strings

__all__ = [
    "ADDED_COLUMNS",
    "GBPS",
    "PHASE_COLUMNS",
    "RENAMED_COLUMNS",
    "REQUEST_COLUMNS",
    "RUN_COLUMNS",
    "SIMULATED_COLUMNS",
    "TABLES",
    "UNITS",
    "Results",
    "filesystem_type",
    "machine_info",
    "new_run_id",
    "read_results",
    "read_simulated",
    "schema",
    "session_name",
    "sidecar",
    "table",
    "versions",
    "write_run",
    "write_simulated",
]


def _pa() -> Any:
    errors.require("pyarrow.parquet", extra="report", purpose="result files (Parquet)")
    import pyarrow

    return pyarrow


# -- schemas ----------------------------------------------------------------------------------

REQUEST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "string"),
    ("target", "string"),
    ("rank", "int32"),
    ("iteration", "int32"),
    ("phase", "string"),
    ("op", "string"),
    ("key", "string"),
    ("nbytes", "int64"),
    ("start", "float64"),
    ("end", "float64"),
    ("seconds", "float64"),
    ("attempt", "int32"),
    ("outcome", "string"),
    ("backend", "string"),
    ("thread", "int64"),
    ("host", "string"),
)
"""One storage request (or retry attempt). ``phase`` is ``write`` or ``read``; ``host``: the
hostname of the rank's node."""

PHASE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "string"),
    ("target", "string"),
    ("rank", "int32"),
    ("iteration", "int32"),
    ("phase", "string"),
    ("bytes", "int64"),
    ("seconds", "float64"),
    ("start", "float64"),
    ("end", "float64"),
    ("cache", "string"),
    ("host", "string"),
    ("restore_path", "string"),
    ("peer_bytes", "int64"),
    ("durable_bytes", "int64"),
    ("node", "string"),
    ("lost_nodes", "string"),
    ("peer_sources", "string"),
)
"""One phase of one rank in one iteration: generate, write, flush, commit, read, verify.
``cache`` says how the read phase bypassed the page cache (o_direct, fadvise, drop_caches,
none) and is ``n/a`` elsewhere; ``host``: the hostname of the rank's node. A restore of a
tiered run with peer copies (``ckptio run --local --replicas``) records where the rank's
restore read its own shard from (``restore_path``: ``local``, ``peer`` or ``durable``) and
the bytes it took from peers and from the durable tier; ``n/a`` and 0 elsewhere. Its
``restore-peer`` rows also name the rank's node in the job's ring (``node``), the nodes whose
loss was emulated (``lost_nodes``, comma-separated) and the bytes each other node sent the
rank (``peer_sources``, a JSON object ``{node: bytes}``); "" elsewhere."""

RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "string"),
    ("target", "string"),
    ("url", "string"),
    ("backend", "string"),
    ("preset", "string"),
    ("scale", "float64"),
    ("ranks", "int32"),
    ("writing_ranks", "int32"),
    ("iteration", "int32"),
    ("checkpoint_bytes", "int64"),
    ("objects", "int64"),
    ("write_seconds", "float64"),
    ("write_GBps", "float64"),
    ("min_rank_write_GBps", "float64"),
    ("read_seconds", "float64"),
    ("read_GBps", "float64"),
    ("min_rank_read_GBps", "float64"),
    ("requests", "int64"),
    ("retries", "int64"),
    ("throttled", "int64"),
    ("errors", "int64"),
    ("generate_GBps", "float64"),
    ("streams", "int32"),
    ("part_size", "int64"),
    ("emulated", "bool_"),
    ("profile", "string"),
    ("mock", "bool_"),
    ("site", "string"),
    ("kind", "string"),
    ("sweep_streams", "int32"),
    ("sweep_part_size", "int64"),
    ("layout", "string"),
    ("nodes", "int32"),
)
"""One iteration of a run. ``write_seconds``: the maximum over ranks from the start barrier
to the commit (write + durable flush + commit); ``write_GBps = checkpoint_bytes /
write_seconds / 1e9``; ``min_rank_*_GBps``: the slowest rank's own bytes over its own time
(MLPerf Storage's metric); ``generate_GBps``: synthetic data generated per CPU second of
generation work (throughput per core; compare it with write_GBps / cores to see whether
generation could limit a run). ``layout``: how the checkpoint was laid out on the target
(``file-per-shard``, ``shared-file``, ``shared-file-per-node``; see
:data:`ckptio.checkpoint.LAYOUTS`). ``nodes``: the distinct hosts whose ranks wrote (0 in
files written before it was recorded)."""

GBPS = "GB/s (1e9 bytes/s)"

UNITS: dict[str, str] = {
    # labels and identifiers
    **dict.fromkeys(
        (
            "run_id",
            "target",
            "phase",
            "op",
            "key",
            "outcome",
            "backend",
            "cache",
            "url",
            "preset",
            "profile",
            "site",
            "kind",
            "layout",
            "parallel_layout",
            "model_binding",
            "bound_by",
            "bound_prefix",
            "mechanism",
            "latency",
            "overrides",
            "key_layout",
            "readers",
            "host",
            "restore_path",
            "node",
            "lost_nodes",
            "peer_sources",
        ),
        "text",
    ),
    **dict.fromkeys(
        ("emulated", "mock", "failed", "lockstep", "aggregated", "deterministic"), "boolean"
    ),
    **dict.fromkeys(
        ("rank", "iteration", "replication", "bound_rank", "bound_node"), "index (from 0)"
    ),
    "seed": "integer (the random seed)",
    "straggler_slowdown": "ratio (times slower)",
    **dict.fromkeys(("modelled_seconds", "wall_seconds"), "seconds"),
    "attempt": "index (1 = the first attempt)",
    "thread": "thread id",
    # sizes, times, rates
    **dict.fromkeys(
        (
            "nbytes",
            "bytes",
            "checkpoint_bytes",
            "part_size",
            "sweep_part_size",
            "peer_bytes",
            "durable_bytes",
        ),
        "bytes",
    ),
    **dict.fromkeys(("seconds", "write_seconds", "read_seconds"), "seconds"),
    **dict.fromkeys(("start", "end"), "Unix seconds (UTC)"),
    **dict.fromkeys(("write_GBps", "min_rank_write_GBps", "read_GBps", "min_rank_read_GBps"), GBPS),
    "generate_GBps": "GB/s (1e9 bytes/s) per CPU core",
    "scale": "ratio to the preset's full size",
    # counts
    **dict.fromkeys(
        (
            "ranks",
            "writing_ranks",
            "objects",
            "requests",
            "retries",
            "throttled",
            "errors",
            "streams",
            "sweep_streams",
            "gpus",
            "nodes",
            "replications",
            "bound_weight",
            "attempts",
            "failed_requests",
            "stragglers",
        ),
        "count",
    ),
}
"""The unit of every column (of every table: a name means the same in each), stored as
the Parquet field metadata ``unit`` by :func:`schema`."""

RENAMED_COLUMNS: dict[str, dict[str, str]] = {
    "run": {
        "write_gbps": "write_GBps",
        "min_rank_write_gbps": "min_rank_write_GBps",
        "read_gbps": "read_GBps",
        "min_rank_read_gbps": "min_rank_read_GBps",
        "generate_gbps": "generate_GBps",
    }
}
"""Old column name -> today's, per table: :func:`read_results` reads files written before a
rename (``*_gbps`` read as gigabits; the values were always 1e9 bytes/s)."""

ADDED_COLUMNS: dict[str, dict[str, Any]] = {
    "run": {"layout": "file-per-shard", "nodes": 0},
    "phases": {
        "host": "",
        "restore_path": "n/a",
        "peer_bytes": 0,
        "durable_bytes": 0,
        "node": "",
        "lost_nodes": "",
        "peer_sources": "",
    },
    "requests": {"host": ""},
}
"""Columns added to a table after result files were first written, with the value that
files written before them imply (the runner wrote only file-per-shard checkpoints before
it had a layout; a host and a node count were not recorded: empty, 0; no restore read from
peers before peer copies: ``n/a``, 0); :func:`read_results`
fills them in, so old files stay readable."""

SIMULATED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "string"),
    ("kind", "string"),
    ("target", "string"),
    ("preset", "string"),
    ("parallel_layout", "string"),
    ("gpus", "int32"),
    ("nodes", "int32"),
    ("phase", "string"),
    ("replication", "int32"),
    ("replications", "int32"),
    ("seed", "int64"),
    ("seconds", "float64"),
    ("failed", "bool_"),
    ("modelled_seconds", "float64"),
    ("model_binding", "string"),
    ("bound_by", "string"),
    ("bound_rank", "int32"),
    ("bound_node", "int32"),
    ("bound_prefix", "string"),
    ("bound_weight", "int32"),
    ("mechanism", "string"),
    ("requests", "int64"),
    ("attempts", "int64"),
    ("throttled", "int64"),
    ("retries", "int64"),
    ("failed_requests", "int64"),
    ("checkpoint_bytes", "int64"),
    ("latency", "string"),
    ("overrides", "string"),
    ("key_layout", "string"),
    ("readers", "string"),
    ("stragglers", "int32"),
    ("straggler_slowdown", "float64"),
    ("lockstep", "bool_"),
    ("aggregated", "bool_"),
    ("deterministic", "bool_"),
    ("wall_seconds", "float64"),
)
"""One phase (``save``, ``restore``, a tiered target's ``drain``) of one simulated checkpoint
(:mod:`ckptio.simulate`; ``kind`` is always ``simulated``: a projection, never a
measurement). ``seconds``: the stall (for a ``failed`` one, until its first request ran out
of attempts); ``modelled_seconds``: the model's figure for the same phase; ``bound_*``: the
last rank, its node, the prefix that refused most requests, the limit and the mechanism;
``overrides``: the profile figures the user set (``write_request_rate=200``), or empty."""

TABLES = {
    "requests": REQUEST_COLUMNS,
    "phases": PHASE_COLUMNS,
    "run": RUN_COLUMNS,
    "simulated": SIMULATED_COLUMNS,
}


def schema(name: str) -> Any:
    """The Arrow schema of table ``requests``, ``phases`` or ``run``; each field's metadata
    holds its ``unit`` (:data:`UNITS`)."""
    pa = _pa()
    return pa.schema(
        [
            pa.field(col, getattr(pa, typ)(), metadata={"unit": UNITS[col]})
            for col, typ in TABLES[name]
        ]
    )


def table(name: str, columns: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]) -> Any:
    """An Arrow table of schema ``name`` from a dict of columns or a list of row dicts.
    Missing columns are an error (a schema that drifts would break merging)."""
    pa = _pa()
    sch = schema(name)
    if isinstance(columns, Mapping):
        cols = columns
    else:
        rows = list(columns)
        cols = {c: [r.get(c) for r in rows] for c, _ in TABLES[name]}
        for c, _ in TABLES[name]:
            if rows and any(c not in r for r in rows):
                raise errors.InvalidArgumentError(f"{name} row lacks column {c!r}")
    missing = [c for c in sch.names if c not in cols]
    if missing:
        raise errors.InvalidArgumentError(f"{name} table lacks column(s) {missing}")
    return pa.table({c: pa.array(cols[c], type=sch.field(c).type) for c in sch.names}, schema=sch)


# -- identifiers, machine ----------------------------------------------------------------


def new_run_id(label: str, *, now: datetime | None = None) -> str:
    """``<UTC yyyymmddTHHMMSS>-<label>-<6 hex>``; the label is reduced to ``[A-Za-z0-9.-]``."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S")
    clean = re.sub(r"[^A-Za-z0-9.-]+", "-", redact(label)).strip("-")[:48] or "run"
    return f"{stamp}-{clean}-{secrets.token_hex(3)}"


def session_name(session: str) -> str:
    """A session id (``20261205T050112-compare-ab12cd``, :func:`new_run_id`) as people read it:
    ``2026-12-05 05:01:12 UTC``; other ids as they are."""
    m = re.match(r"(\d{4})(\d\d)(\d\d)T(\d\d)(\d\d)(\d\d)-", session)
    if not m:
        return session
    y, mo, d, h, mi, sec = m.groups()
    return f"{y}-{mo}-{d} {h}:{mi}:{sec} UTC"


def filesystem_type(path: str) -> str:
    """The mounted filesystem type holding ``path`` (from /proc/mounts), or ``""``."""
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            mounts = [line.split()[:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return ""
    real = os.path.realpath(path)
    best, fstype = "", ""
    for _dev, mnt, typ in mounts:
        mnt = mnt.replace("\\040", " ")
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, typ
    return fstype


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(target_path: str | None = None) -> dict[str, Any]:
    """Hostname, CPU, cores, memory (bytes), kernel, and the filesystem type of a file://
    target."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 0
    return {
        "hostname": socket.gethostname(),
        "cpu": _cpu_name(),
        "cores": os.cpu_count() or 0,
        "memory_bytes": int(memory),
        "kernel": platform.release(),
        "os": platform.platform(),
        "filesystem": filesystem_type(target_path) if target_path else "",
    }


_VERSIONED = ("ckptio", "numpy", "pyarrow", "crc32c", "cryptography", "mpi4py", "torch", "moto")
"""The packages of every run whose versions shape a result; the store adds its client
libraries' (:func:`ckptio.registry.client_versions`)."""


def versions(client_versions: Mapping[str, str] | None = None) -> dict[str, str]:
    """Python and the versions of the packages that shape a result (absent ones omitted):
    ckptio's own, and ``client_versions``, those of the store's client libraries."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    out.update(client_versions or {})
    return out


def sidecar(
    run_id: str,
    *,
    config: Mapping[str, Any],
    target_path: str | None = None,
    emulated: bool = False,
    profile: str = "",
    mock: bool = False,
    labels: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    client_versions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON sidecar of a run (``config``, ``labels`` and ``extra`` through
    :func:`ckptio.redact.redact_obj`: credentials hidden, environment dumps left out).
    ``client_versions``: the store's (:func:`ckptio.registry.client_versions`)."""
    doc: dict[str, Any] = {
        "run_id": run_id,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "machine": machine_info(target_path),
        "versions": versions(client_versions),
        "config": redact_obj(dict(config)),
        "emulated": bool(emulated),
        "profile": profile,
        "mock": bool(mock),
        "labels": redact_obj(dict(labels or {})),
    }
    if extra:
        doc.update(redact_obj(dict(extra)))
    return doc


# -- writing and reading ----------------------------------------------------------------------


def write_run(
    out_dir: str | os.PathLike[str],
    *,
    requests: Any,
    phases: Any,
    runs: Any,
    sidecar: Mapping[str, Any],
) -> list[Path]:
    """Write the three tables (Arrow tables of :func:`schema`) and the sidecar of one run
    under ``out_dir`` (created). Files appear complete or not at all (temp + rename).
    Returns the paths written."""
    run_id = _checked_run_id(sidecar)
    paths = [
        _write_table(out_dir, run_id, name, tbl)
        for name, tbl in (("requests", requests), ("phases", phases), ("run", runs))
    ]
    paths.append(_write_sidecar(out_dir, run_id, sidecar))
    return paths


def write_simulated(
    out_dir: str | os.PathLike[str], *, rows: Any, sidecar: Mapping[str, Any]
) -> list[Path]:
    """Write the ``simulated`` table (:data:`SIMULATED_COLUMNS`, an Arrow table or row dicts)
    of one ``ckptio simulate`` and its sidecar under ``out_dir``, as
    ``<run_id>.simulated.parquet`` and ``<run_id>.json``: beside runs, never mistaken for
    one (:func:`read_results` reads runs only; :func:`read_simulated` reads these)."""
    run_id = _checked_run_id(sidecar)
    return [
        _write_table(out_dir, run_id, "simulated", rows),
        _write_sidecar(out_dir, run_id, sidecar),
    ]


def read_simulated(paths: Sequence[str | os.PathLike[str]]) -> tuple[Any, list[dict[str, Any]]]:
    """The ``simulated`` rows of every ``*.simulated.parquet`` named by ``paths`` (files or
    directories; other files there are ignored) and their sidecars; an empty table when
    there are none."""
    pa = _pa()
    import pyarrow.parquet as pq

    files: list[Path] = []
    for p in map(Path, [paths] if isinstance(paths, str | os.PathLike) else paths):
        if p.is_dir():
            files.extend(sorted(p.glob("*.simulated.parquet")))
        elif p.name.endswith(".simulated.parquet"):
            if not p.exists():
                raise errors.NotFoundError(f"result file {p} is missing")
            files.append(p)
    tables, sidecars = [], []
    sch = schema("simulated")
    for f in dict.fromkeys(files):
        tables.append(_redacted(pq.read_table(f).select(sch.names).cast(sch)))
        side = f.with_name(f.name[: -len(".simulated.parquet")] + ".json")
        if side.exists():
            try:
                sidecars.append(redact_obj(json.loads(side.read_text(encoding="utf-8"))))
            except json.JSONDecodeError as err:
                raise errors.InvalidArgumentError(f"{side} is not valid JSON: {err}") from None
    return (pa.concat_tables(tables) if tables else sch.empty_table()), sidecars


def _checked_run_id(sidecar: Mapping[str, Any]) -> str:
    run_id = str(sidecar["run_id"])
    if not re.fullmatch(r"[A-Za-z0-9.-]+", run_id):
        raise errors.InvalidArgumentError(f"run_id {run_id!r} must be [A-Za-z0-9.-]")
    return run_id


def _write_table(out_dir: str | os.PathLike[str], run_id: str, name: str, tbl: Any) -> Path:
    """``<run_id>.<name>.parquet`` under ``out_dir`` (created): complete or absent (temp +
    rename), strings redacted."""
    pa = _pa()
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not isinstance(tbl, pa.Table):
        tbl = table(name, tbl)
    tbl = _redacted(tbl.select(schema(name).names).cast(schema(name)))
    path = out / f"{run_id}.{name}.parquet"
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(tbl, tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def _write_sidecar(
    out_dir: str | os.PathLike[str], run_id: str, sidecar: Mapping[str, Any]
) -> Path:
    path = Path(out_dir) / f"{run_id}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(redact_obj(sidecar), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _redacted(tbl: Any, *, skip: Iterable[str] = ()) -> Any:
    """``tbl`` with every string column but those in ``skip`` through
    :func:`ckptio.redact.redact_strings`, once per distinct value."""
    pa = _pa()
    import pyarrow.compute as pc

    for i, f in enumerate(tbl.schema):
        if not pa.types.is_string(f.type) or tbl.num_rows == 0 or f.name in skip:
            continue
        distinct = pc.unique(tbl.column(i)).to_pylist()
        shown = redact_strings(distinct)
        changed = {a: b for a, b in zip(distinct, shown, strict=True) if a != b}
        if changed:
            col = [changed.get(v, v) for v in tbl.column(i).to_pylist()]
            tbl = tbl.set_column(i, f, pa.array(col, type=f.type))
    return tbl


@dataclass
class Results:
    """Merged result tables of any number of runs."""

    requests: Any
    phases: Any
    runs: Any
    sidecars: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_ids(self) -> list[str]:
        return sorted(set(self.runs.column("run_id").to_pylist()))

    def sessions(self) -> dict[str, str]:
        """run_id -> the session the run belongs to: its sidecar's ``config.session`` (every
        target and round of one ``ckptio compare`` share one), else the run_id itself. Runs of
        different sessions are separate measurements: a report never averages them together."""
        given = {s.get("run_id"): (s.get("config") or {}).get("session") for s in self.sidecars}
        return {rid: given.get(rid) or rid for rid in self.run_ids}


def _run_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():  # and its subdirectories: a folder of ckptio compare's reports
            found.extend(sorted(p.rglob("*.run.parquet")))
        elif p.name.endswith(".run.parquet"):
            found.append(p)
        elif p.suffix == ".json" or p.name.endswith((".requests.parquet", ".phases.parquet")):
            stem = p.name.split(".")[0]
            found.append(p.with_name(f"{stem}.run.parquet"))
        elif not p.exists():
            raise errors.NotFoundError(f"no result file or directory {p}")
        else:
            raise errors.InvalidArgumentError(
                f"{p} is not a result file (*.run.parquet, *.requests.parquet, "
                "*.phases.parquet, <run_id>.json) or a directory of them"
            )
    unique = list({f.resolve(): f for f in found}.values())
    for f in unique:
        if not f.exists():
            raise errors.NotFoundError(f"result file {f} is missing")
    return unique


def read_results(paths: Sequence[str | os.PathLike[str]]) -> Results:
    """Read and concatenate the results of every run named by ``paths`` (files or
    directories, scanned for ``*.run.parquet``). Missing request/phase files give empty
    tables for that run; a missing sidecar gives no sidecar entry."""
    pa = _pa()
    import pyarrow.parquet as pq

    files = _run_files([paths] if isinstance(paths, str | os.PathLike) else paths)
    parts: dict[str, list[Any]] = {"requests": [], "phases": [], "run": []}
    sidecars: list[dict[str, Any]] = []
    for run_file in files:
        run_id = run_file.name[: -len(".run.parquet")]
        for name in parts:
            f = run_file.with_name(f"{run_id}.{name}.parquet")
            if f.exists():
                t = pq.read_table(f)
                renamed = RENAMED_COLUMNS.get(name, {})
                t = t.rename_columns([renamed.get(c, c) for c in t.column_names])
                for col, value in ADDED_COLUMNS.get(name, {}).items():
                    if col not in t.column_names:
                        t = t.append_column(
                            col, pa.array([value] * t.num_rows, type=schema(name).field(col).type)
                        )
                # files of older versions may hold credentials in labels and URLs (object
                # keys are ckptio's own)
                parts[name].append(
                    _redacted(t.select(schema(name).names).cast(schema(name)), skip=("key",))
                )
        side = run_file.with_name(f"{run_id}.json")
        if side.exists():
            try:
                sidecars.append(redact_obj(json.loads(side.read_text(encoding="utf-8"))))
            except json.JSONDecodeError as err:
                raise errors.InvalidArgumentError(f"{side} is not valid JSON: {err}") from None

    def cat(name: str) -> Any:
        tables = parts[name]
        return pa.concat_tables(tables) if tables else schema(name).empty_table()

    return Results(cat("requests"), cat("phases"), cat("run"), sidecars)
