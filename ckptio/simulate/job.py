"""The workload side of a simulation: what the client does and how it sends it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio.simulate.storage import READERS
from ckptio.stallmodel import (
    DEFAULT_OBJECT_CONCURRENCY,
    RESTORE_READERS,
    Workload,
)
from ckptio.workload import Plan, get_preset, make_plan

__all__ = ["Job", "fit_layout"]

# -- the workload side -----------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What the client does: a plan (:func:`ckptio.workload.make_plan`) and how it is sent."""

    plan: Plan
    ranks_per_node: int = 8
    streams: int | None = None
    """Concurrent data requests per node (the model's ``streams``); None: the profile's."""
    part_size: int | None = None
    """Bytes per data request; None: the profile's."""
    object_concurrency: int = DEFAULT_OBJECT_CONCURRENCY
    restore_readers: int = RESTORE_READERS
    key_layout: str = "flat"
    readers: str = "writers"
    """Who reads in a restore: ``writers`` (each writing rank its own bytes, as the model
    counts) or ``all`` (every rank what it holds: replicas read the same objects)."""
    processes: tuple[tuple[int, ...], ...] | None = None
    """A run's processes (:meth:`for_run`): process ``p`` writes the plan ranks listed;
    None: one process per plan rank (a full-scale job)."""
    layout_note: str = ""
    """Why the layout differs from the preset's (:func:`fit_layout`), or empty."""
    lockstep: bool = False
    """Send objects as the model counts them: every rank of a node its next
    ``object_concurrency`` objects together, the node's next group when the whole group is
    done (so each group's create and complete are in series with its data). False: as
    ckptio's runner does, each rank's next object as soon as one of its own is done, so one
    rank's metadata requests overlap the other ranks' transfers. With fixed latencies and no
    throttling a lockstep simulation is what the model computes; the difference between the
    two is that overlap."""

    def __post_init__(self) -> None:
        for name in ("ranks_per_node", "object_concurrency", "restore_readers"):
            if getattr(self, name) < 1:
                raise errors.InvalidArgumentError(f"{name} must be >= 1")
        if self.streams is not None and self.streams < 1:
            raise errors.InvalidArgumentError("streams must be >= 1")
        if self.part_size is not None and self.part_size < 1:
            raise errors.InvalidArgumentError("part_size must be >= 1 byte")
        if self.key_layout not in fmt.KEY_LAYOUTS:
            raise errors.InvalidArgumentError(
                f"key layout {self.key_layout!r}; valid: {', '.join(fmt.KEY_LAYOUTS)}"
            )
        if self.readers not in READERS:
            raise errors.InvalidArgumentError(
                f"restore readers {self.readers!r}; valid: {', '.join(READERS)}"
            )
        if self.processes is not None and self.readers != "writers":
            raise errors.InvalidArgumentError("a run's processes read back what they wrote")

    @classmethod
    def for_run(
        cls,
        plan: Plan,
        *,
        processes: int,
        processes_per_node: int = 1,
        inflight: int = DEFAULT_OBJECT_CONCURRENCY,
        streams: int,
        part_size: int | None = None,
        key_layout: str = "flat",
    ) -> Job:
        """The job a :func:`ckptio.runner.run_workload` of ``plan`` is: ``processes``
        processes (the runner deals the plan's writing ranks round-robin over them),
        ``processes_per_node`` to a node, each with ``inflight`` objects in flight and its own
        store of ``streams`` streams (so ``streams x processes_per_node`` per node)."""
        writers = [int(r) for r in np.flatnonzero(plan.rank_bytes > 0)]
        procs = tuple(tuple(writers[p::processes]) for p in range(processes))
        return cls(
            plan,
            ranks_per_node=processes_per_node,
            streams=streams * processes_per_node,
            part_size=part_size,
            object_concurrency=inflight,
            key_layout=key_layout,
            processes=procs,
        )

    @property
    def gpus(self) -> int:
        return self.plan.ranks if self.processes is None else len(self.processes)

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.ranks_per_node)

    def workload(self) -> Workload:
        """The model's view of this job (:class:`ckptio.stallmodel.Workload`)."""
        prefixes = 256 if self.key_layout == "hashed" else 1
        if self.processes is not None:
            w = Workload.for_run(
                self.plan, processes=len(self.processes), inflight=self.object_concurrency
            )
            return replace(w, ranks_per_node=self.ranks_per_node, prefixes=prefixes)
        return Workload.from_plan(
            self.plan,
            ranks_per_node=self.ranks_per_node,
            prefixes=prefixes,
            object_concurrency=self.object_concurrency,
        )

    def describe(self) -> dict[str, Any]:
        p = self.plan
        return {
            "preset": p.preset.name,
            "layout": p.layout.describe(),
            "layout_note": self.layout_note,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "checkpoint_bytes": p.total_bytes,
            "writing_ranks": p.writing_ranks if self.processes is None else len(self.processes),
            "object_size": p.object_size,
            "object_concurrency": self.object_concurrency,
            "restore_readers": self.restore_readers,
            "key_layout": self.key_layout,
            "readers": self.readers,
            "scale": p.scale,
        }


def fit_layout(
    preset: str,
    gpus: int,
    *,
    tp: int | None = None,
    pp: int | None = None,
    zero: int | None = None,
    **plan_kwargs: Any,
) -> tuple[Plan, str]:
    """The plan of ``preset`` on ``gpus`` GPUs, and a note. Where the preset's TP x PP does
    not divide ``gpus`` (GPT-3's TP8 x PP16 on 8 GPUs), the parallelism not given is cut to
    the greatest common divisor (TP8 x PP1) and the note says so; given ones are kept (and
    :func:`~ckptio.workload.make_plan` refuses a layout that does not fit)."""
    p = get_preset(preset)
    t = tp or p.layout.tp
    s = pp or p.layout.pp
    note = ""
    if gpus % (t * s):
        t2 = t if tp else math.gcd(t, gpus)
        s2 = s if pp else math.gcd(s, max(1, gpus // t2))
        if (t2, s2) != (t, s):
            note = (
                f"{p.name}'s TP{t}xPP{s} does not divide {gpus:,} GPUs: simulated as TP{t2}xPP{s2}"
            )
        t, s = t2, s2
    return make_plan(p, gpus=gpus, tp=t, pp=s, zero=zero, **plan_kwargs), note
