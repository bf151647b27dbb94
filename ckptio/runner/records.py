"""What a run records: the per-rank figures of its phases (:class:`IterFigures`,
:class:`PhaseTimer`), the request trace as columns (:func:`events_columns`), the runs table's
rows (:func:`run_rows`), and what :func:`~ckptio.runner.run_workload` returns
(:class:`RunSummary`). The tiered runs (:mod:`ckptio.tierbench`) record through the same
functions, so both write one schema (:mod:`ckptio.results`)."""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ckptio import results as res
from ckptio.redact import redact_url
from ckptio.registry import split_url
from ckptio.runner.settings import RunSettings
from ckptio.store import Store
from ckptio.workload import Plan

__all__ = [
    "HOST",
    "IterFigures",
    "PhaseTimer",
    "RunSummary",
    "events_columns",
    "gb_per_s",
    "hosts_of",
    "merge_columns",
    "peak_rss",
    "phase_row",
    "request_table",
    "run_rows",
    "target_label",
]


@dataclass
class RunSummary:
    """What :func:`run_workload` returns (complete on rank 0; other ranks get their own
    figures only)."""

    run_id: str
    rank: int
    runs: list[dict[str, Any]] = field(default_factory=list)
    """Rows of the runs table (rank 0)."""
    phases: list[dict[str, Any]] = field(default_factory=list)
    """Rows of the phases table (rank 0: every rank's; others: their own)."""
    requests: int = 0
    """Request rows written (rank 0)."""
    paths: list[Path] = field(default_factory=list)
    """Result files written (rank 0, when ``out_dir`` was given)."""
    peak_rss_bytes: list[int] = field(default_factory=list)
    """Resident-set high-water mark of every rank's process, bytes (rank 0: all ranks)."""
    cache: str = ""
    """How the read phase bypassed the page cache."""
    generator: str = ""
    steps: list[int] = field(default_factory=list)
    """Checkpoint steps written, one per iteration."""
    url: str = ""
    target_path: str | None = None
    """The store's local directory, if it has one (:attr:`~ckptio.store.StoreInfo.local_path`; for the
    sidecar's filesystem type)."""
    tables: dict[str, Any] = field(default_factory=dict)
    """Rank 0: the three tables as columns/rows, before writing (sweeps merge them)."""
    client_versions: dict[str, str] = field(default_factory=dict)
    """Versions of the client libraries the store ran on (:func:`ckptio.registry.client_versions`)."""
    hosts: dict[str, list[int]] = field(default_factory=dict)
    """Rank 0: host -> its ranks (the sidecar's ``hosts``)."""
    tiered: list[dict[str, Any]] = field(default_factory=list)
    """Rank 0 of a tiered run (:mod:`ckptio.tierbench`): per iteration the slowest rank's
    stall, drain, restore from the fast tier and from the durable one (seconds, GB/s)."""


def peak_rss() -> int:
    """This process's resident-set high-water mark in bytes (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


HOST = socket.gethostname()
"""This process's node, as every phase and request row names it (``host``)."""


def events_columns(
    events: Sequence[Any], phase: str, iteration: int, rank: int
) -> dict[str, list[Any]]:
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "rank",
            "iteration",
            "phase",
            "op",
            "key",
            "nbytes",
            "start",
            "end",
            "attempt",
            "outcome",
            "backend",
            "thread",
        )
    }
    cols["host"] = [HOST] * len(events)
    for ev in events:
        cols["rank"].append(rank)
        cols["iteration"].append(iteration)
        cols["phase"].append(phase)
        cols["op"].append(ev.op)
        cols["key"].append(ev.key)
        cols["nbytes"].append(int(ev.nbytes))
        cols["start"].append(float(ev.start))
        cols["end"].append(float(ev.end))
        cols["attempt"].append(int(ev.attempt))
        cols["outcome"].append(ev.outcome)
        cols["backend"].append(ev.backend)
        cols["thread"].append(int(ev.thread))
    return cols


def merge_columns(parts: Sequence[dict[str, list[Any]]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for p in parts:
        for k, v in p.items():
            out.setdefault(k, []).extend(v)
    return out


def target_label(url: str, emulate: str | None, layout: str = "file-per-shard") -> str:
    """The default target label; a shared (N-1) layout is part of it, so reports, which
    group runs by target, keep N-1 and N-N runs of one target apart."""
    scheme, bare, _ = split_url(url)
    bare = redact_url(bare)
    tail = (
        bare.split("://", 1)[-1].rstrip("/").rsplit("/", 1)[-1]
        if "://" in bare
        else Path(bare).name
    )
    label = scheme if not tail else f"{scheme}-{tail}"
    label = f"{label}-{emulate}" if emulate else label
    return label if layout == "file-per-shard" else f"{label}-{layout}"


@dataclass
class IterFigures:
    """Per-rank figures of one iteration."""

    write_start: float = 0.0
    write_done: float = 0.0
    write_end: float = 0.0
    read_start: float = 0.0
    read_done: float = 0.0
    read_end: float = 0.0
    bytes: int = 0
    gen_seconds: float = 0.0
    read_io_seconds: float = 0.0
    verify_seconds: float = 0.0
    cache: str = "n/a"
    objects: int = 0


class PhaseTimer:
    """Times one phase of one rank and collects the trace events it caused."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> PhaseTimer:
        self.store.trace.clear()
        self.start = time.time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = time.time()
        self.events = self.store.trace.events()
        self.store.trace.clear()


def hosts_of(everything: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """Host -> the ranks that ran there, from every rank's gathered summary (in rank order):
    the sidecar's ``hosts``."""
    out: dict[str, list[int]] = {}
    for rank, e in enumerate(everything):
        out.setdefault(str(e.get("host", "")), []).append(rank)
    return out


def gb_per_s(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def run_rows(
    plan: Plan,
    everything: Sequence[dict[str, Any]],
    reqs: dict[str, list[Any]],
    s: RunSettings,
    *,
    run_id: str,
    url: str,
    store: Store,
    comm_size: int,
) -> list[dict[str, Any]]:
    import socket

    rows = []
    iterations = len(everything[0]["iters"])
    req_iter = np.asarray(reqs.get("iteration", []), dtype=np.int64)
    req_outcome = np.asarray(reqs.get("outcome", []), dtype=object)
    for it in range(iterations):
        iters = [e["iters"][it] for e in everything]
        total = sum(i["bytes"] for i in iters)
        write_s = max(i["write_end"] - i["write_start"] for i in iters)
        read_s = max((i["read_end"] - i["read_start"] for i in iters if i["read_end"]), default=0.0)
        writers = [i for i in iters if i["bytes"] > 0]
        min_w = min(
            (gb_per_s(i["bytes"], i["write_done"] - i["write_start"]) for i in writers),
            default=0.0,
        )
        min_r = min(
            (
                gb_per_s(i["bytes"], i["read_done"] - i["read_start"])
                for i in writers
                if i["read_end"]
            ),
            default=0.0,
        )
        gen_s = sum(i["gen_seconds"] for i in iters)
        nodes = len(
            {e.get("host", "") for e, i in zip(everything, iters, strict=True) if i["bytes"] > 0}
        )
        sel = req_iter == it
        outcomes = req_outcome[sel]
        rows.append(
            {
                "run_id": run_id,
                "target": s.label,
                "url": redact_url(url),
                "backend": store.name,
                "preset": plan.preset.name,
                "scale": float(plan.scale),
                "ranks": comm_size,
                "writing_ranks": plan.writing_ranks,
                "iteration": it,
                "checkpoint_bytes": total,
                "objects": sum(i["objects"] for i in iters),
                "write_seconds": write_s,
                "write_GBps": gb_per_s(total, write_s),
                "min_rank_write_GBps": min_w,
                "read_seconds": read_s,
                "read_GBps": gb_per_s(total, read_s) if read_s else 0.0,
                "min_rank_read_GBps": min_r,
                "requests": int(sel.sum()),
                "retries": int((outcomes == "retry").sum()),
                "throttled": int((outcomes == "throttled").sum()),
                "errors": int((outcomes == "error").sum()),
                "generate_GBps": gb_per_s(total, gen_s),
                "streams": store.describe().streams,
                "part_size": store.describe().request_size,
                "emulated": s.emulated,
                "profile": s.profile,
                "mock": s.mock,
                "site": s.site or socket.gethostname(),
                "kind": s.kind,
                "sweep_streams": s.sweep_streams,
                "sweep_part_size": s.sweep_part_size,
                "layout": s.layout,
                "nodes": nodes,
            }
        )
    return rows


def phase_row(
    run_id: str,
    target: str,
    rank: int,
    iteration: int,
    phase: str,
    timed: tuple[int, float, float, float],
    cache: str = "n/a",
    restored: Any = None,
) -> dict[str, Any]:
    """A row of the phases table: ``timed`` is (bytes, seconds, start, end); ``restored``:
    a restore's :class:`~ckptio.checkpoint.peers.RestoreRecord` (where it read from), if
    it has one."""
    nbytes, seconds, start, end = timed
    return {
        "run_id": run_id,
        "target": target,
        "rank": rank,
        "iteration": iteration,
        "phase": phase,
        "bytes": int(nbytes),
        "seconds": float(seconds),
        "start": float(start),
        "end": float(end),
        "cache": cache,
        "host": HOST,
        "restore_path": restored.path if restored is not None else "n/a",
        "peer_bytes": int(restored.nbytes.get("peer", 0)) if restored is not None else 0,
        "durable_bytes": int(restored.nbytes.get("durable", 0)) if restored is not None else 0,
        "node": "",
        "lost_nodes": "",
        "peer_sources": json.dumps(restored.from_nodes, sort_keys=True)
        if restored is not None and restored.from_nodes
        else "",
    }


def request_table(
    everything: Sequence[dict[str, Any]], run_id: str, target: str
) -> tuple[dict[str, list[Any]], int]:
    """Rank 0: the requests table of every rank's gathered ``requests`` columns, with the run
    and target named and each request's seconds; and its row count."""
    reqs = merge_columns([e["requests"] for e in everything])
    n = len(reqs.get("op", []))
    reqs.update(
        run_id=[run_id] * n,
        target=[target] * n,
        seconds=[e - b for b, e in zip(reqs.get("start", []), reqs.get("end", []), strict=True)],
    )
    if n == 0:
        reqs = {c: [] for c, _ in res.REQUEST_COLUMNS}
    return reqs, n
