"""Sweeps: throughput versus concurrency, one run per (streams, part size) point, written as
one run (``kind = "sweep"``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ckptio import errors, units
from ckptio import results as res
from ckptio.dist import Communicator, detect
from ckptio.registry import backend_for
from ckptio.runner.phases import run_workload
from ckptio.runner.records import RunSummary, merge_columns
from ckptio.runner.settings import RunSettings, writer_ranks
from ckptio.units import parse_size
from ckptio.workload import Plan

__all__ = ["DEFAULT_SWEEP_MEMORY", "SweepPoint", "sweep", "sweep_points", "sweep_warnings"]

log = logging.getLogger(__name__)

DEFAULT_SWEEP_MEMORY = 2 * 2**30
"""Bytes of shard objects a rank may hold in flight during a sweep point."""


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep as the plan lets it run (:func:`sweep_points`)."""

    streams: int
    """Streams asked for."""
    part_size: int
    inflight: int
    """Shard objects each process keeps in flight."""
    parts_in_flight: int
    """Requests (parts, blocks) the busiest process can have in flight at once: the most
    streams this point can keep busy."""
    objects: int
    """Shard objects of the busiest process, in all."""
    memory_capped: bool = False
    """The objects in flight were capped by the memory budget."""

    @property
    def capped(self) -> bool:
        """More streams asked for than there are parts in flight: the extra ones idle."""
        return self.streams > self.parts_in_flight


def sweep_points(
    plan: Plan,
    processes: int,
    streams: Sequence[int],
    part_sizes: Sequence[int],
    *,
    inflight: int = 2,
    max_memory: int = DEFAULT_SWEEP_MEMORY,
) -> list[SweepPoint]:
    """The (streams, part size) points of a sweep of ``plan`` over ``processes`` processes, in
    order, each with as many shard objects in flight per process as its streams need (at
    least ``inflight``; at most what ``max_memory`` holds at ``plan.object_size`` per object)
    and the parts that puts in flight.

    A point whose ``streams`` exceed its ``parts_in_flight`` cannot use them all: with 64 MiB
    over 8 writing ranks each rank has a few objects of about 1 and 7 MiB, one 8 MiB part
    each, and 1, 4 and 16 streams measure the same thing. Such points are ``capped``."""
    cap = max(1, max_memory // plan.object_size)
    # per process: its objects' sizes, largest first (the runner deals writing ranks round-robin)
    shares = []
    for ranks in writer_ranks(plan, processes):
        sizes = []
        for nbytes in (plan.model_bytes[ranks], plan.optim_bytes[ranks]):
            full, rest = np.divmod(nbytes, plan.object_size)
            sizes += [np.full(int(full.sum()), plan.object_size, dtype=np.int64), rest[rest > 0]]
        shares.append(-np.sort(-np.concatenate(sizes)) if sizes else np.zeros(0, np.int64))
    out = []
    for s in streams:
        for p in part_sizes:
            cum = [np.cumsum(-(-sz // p)) for sz in shares]
            # objects each process needs in flight so that s requests of p bytes can go at once
            need = max(
                (min(int(np.searchsorted(c, s)) + 1, len(c)) for c in cum if len(c)), default=1
            )
            want = max(inflight, need)
            n = max(1, min(want, cap))
            parts = max((int(c[min(n, len(c)) - 1]) for c in cum if len(c)), default=0)
            out.append(
                SweepPoint(
                    s, p, n, parts, max(len(c) for c in cum) if cum else 0, memory_capped=n < want
                )
            )
    return out


def sweep_warnings(
    points: Sequence[SweepPoint],
    plan: Plan,
    processes: int,
    *,
    max_memory: int = DEFAULT_SWEEP_MEMORY,
) -> list[str]:
    """One line per part size whose requested stream counts exceed what the points put in
    flight (the extra streams idle, so those points measure the same concurrency): because of
    the layout (too little data per process) or of the memory budget."""
    human_bytes = units.human_bytes
    lines = []
    for part in dict.fromkeys(p.part_size for p in points):
        capped = [p for p in points if p.part_size == part and p.capped]
        if not capped:
            continue
        most = max(p.parts_in_flight for p in capped)
        head = (
            f"--streams {','.join(str(p.streams) for p in capped)} with {human_bytes(part)} parts: "
        )
        tail = (
            f"so at most {most} stream(s) can be busy and these points measure the same "
            f"concurrency as {most} stream(s)."
        )
        if any(p.memory_capped for p in capped):
            n = max(p.inflight for p in capped)
            lines.append(
                f"{head}the sweep's memory budget ({human_bytes(max_memory)} per process) holds "
                f"{n} object(s) of up to {human_bytes(plan.object_size)} in flight, {most} "
                f"part(s), {tail} A smaller --part-size or --object-size lets more streams work."
            )
        else:
            share = plan.total_bytes / max(1, min(processes, plan.writing_ranks))
            lines.append(
                f"{head}each of the {processes} writing process(es) has at most {most} part(s) in "
                f"flight (about {human_bytes(share)} each, in {max(p.objects for p in capped)} "
                f"object(s)), {tail} A larger --total-size, fewer --ranks or a smaller "
                "--part-size lets more streams work."
            )
    return lines


def sweep(
    url: str,
    plan: Plan,
    settings: RunSettings | None = None,
    comm: Communicator | None = None,
    *,
    streams: Sequence[int],
    part_sizes: Sequence[int | str],
    max_memory: int | str = DEFAULT_SWEEP_MEMORY,
    warn: bool = True,
) -> RunSummary:
    """Throughput versus concurrency: run ``plan`` once per (streams, part size) pair, with
    enough shard objects in flight to keep every stream busy where the plan has them
    (:func:`sweep_points`, within ``max_memory`` per process), and write all points as one run
    (``kind = "sweep"``) under ``settings.out_dir``. Each point runs as ``settings`` say (its
    ``inflight``, streams and part size set by the point). With ``warn`` (rank 0) a point whose
    streams exceed the parts the layout puts in flight is logged as a warning
    (:func:`sweep_warnings`); the sidecar lists every point with its ``parts_in_flight``.
    ``settings.say`` (rank 0) gets a line per point and phase."""
    base = settings if settings is not None else RunSettings()
    comm = comm if comm is not None else detect()
    if not streams or not part_sizes:
        raise errors.InvalidArgumentError(
            "a sweep needs at least one streams value and one part size"
        )
    parts = [parse_size(p, field="part_size") for p in part_sizes]
    if any(s < 1 for s in streams) or any(p <= 0 for p in parts):
        raise errors.InvalidArgumentError(
            f"streams must be >= 1 and part sizes > 0; got {list(streams)}, {list(part_sizes)}"
        )
    part_option = backend_for(url).request_size_option
    memory = parse_size(max_memory, field="max_memory")
    # enough objects in flight that s streams of p-byte requests can all be busy, within the
    # memory budget (a client needs streams x part size in flight to use them all)
    points = sweep_points(
        plan, comm.size, streams, parts, inflight=base.inflight, max_memory=memory
    )
    if warn and comm.rank == 0:
        for line in sweep_warnings(points, plan, comm.size, max_memory=memory):
            log.warning("%s", line)
    run_id = None
    merged: RunSummary | None = None
    tables: dict[str, Any] = {"requests": [], "phases": [], "runs": []}
    for n, point in enumerate(points):
        s, p, inflight = point.streams, point.part_size, point.inflight
        if base.say is not None and comm.rank == 0:
            base.say(
                f"sweep point {n + 1}/{len(points)}: {s} stream(s), "
                f"{units.human_bytes(p)} parts, {inflight} object(s) in flight per process"
            )
        point_settings = replace(
            base,
            out_dir=None,
            run_id=run_id,
            kind="sweep",
            sweep_streams=s,
            sweep_part_size=p,
            options={**base.options, "streams": s, part_option: p},
            keep=base.keep if n == len(points) - 1 else "none",
            inflight=inflight,
        )
        summary = run_workload(url, plan, point_settings, comm)
        run_id = summary.run_id
        if comm.rank == 0:
            t = summary.tables
            tables["requests"].append(t["requests"])
            tables["phases"].extend(t["phases"])
            tables["runs"].extend(t["runs"])
            merged = merged or summary
            if merged is not summary:
                merged.runs.extend(summary.runs)
                merged.phases.extend(summary.phases)
                merged.requests += summary.requests
                merged.peak_rss_bytes = [
                    max(a, b)
                    for a, b in zip(merged.peak_rss_bytes, summary.peak_rss_bytes, strict=True)
                ]
    assert run_id is not None
    if comm.rank != 0:
        return RunSummary(run_id, comm.rank)
    assert merged is not None
    if base.out_dir is not None:
        side = res.sidecar(
            run_id,
            config={
                "url": url,
                "preset": plan.preset.name,
                "scale": plan.scale,
                "streams": list(streams),
                "part_sizes": parts,
                "iterations": base.iterations,
                "ranks": comm.size,
                "kind": "sweep",
                "points": [{**vars(pt), "capped": pt.capped} for pt in points],
                "checkpoint_layout": base.layout,
            },
            target_path=merged.target_path,
            emulated=any(r["emulated"] for r in merged.runs),
            profile=merged.runs[0]["profile"],
            mock=merged.runs[0]["mock"],
            extra={"peak_rss_bytes": merged.peak_rss_bytes},
            client_versions=merged.client_versions,
        )
        merged.paths = res.write_run(
            base.out_dir,
            requests=res.table("requests", merge_columns(tables["requests"])),
            phases=res.table("phases", tables["phases"]),
            runs=res.table("run", tables["runs"]),
            sidecar=side,
        )
    return merged
