"""Run a checkpoint plan against a store, phase by phase, on every rank, and record it.

Every rank (process) calls :func:`run_workload` with the same arguments. The logical ranks
(GPUs) of the plan that write something are dealt round-robin over the processes, so 4
processes can play the 1,024 GPUs of ``llama3-1t`` (each writes the shards of 256 of them).

One iteration::

    barrier                                     (all ranks)
    plan:    rank 0 takes the step's lease; every rank learns the save plan (its token)
    write:   for each of my shard objects, in a pool of ``inflight`` workers:
             generate synthetic data into a recycled buffer (AES-CTR keystream: incompressible
             and unique per object, so compression and deduplication gain nothing), write it
             with the plan's writer, the library's (CRC32C of every chunk), close = durable
             (fsync where the store has it) and visible
    commit:  gather chunk lists at rank 0; rank 0 validates and publishes the manifest
             (exactly the library's commit: a ckptio checkpoint that ``ckptio verify`` reads)
    barrier                                     write time = max over ranks, barrier to barrier
    restore: the checkpoint just committed (the newest) read back cold by every rank: make
             the reads miss the caches of this machine (the store's cold-read modes:
             O_DIRECT, else posix_fadvise DONTNEED; else drop_caches when asked and root),
             barrier, read every object back into recycled buffers, verify every CRC32C,
             barrier                            read time = max over ranks
    cleanup: retention (``keep``), the pause (the compute time between checkpoints)

The run saves through the library's save pipeline, not a copy of it: each iteration is a
:class:`~ckptio.checkpoint.SavePlan` (rank 0's lease and token), written by its
:class:`~ckptio.checkpoint.RankWriter` and committed by :func:`~ckptio.checkpoint.commit_step`,
as ``ckptio.save`` does; what differs is the state source, streamed
(:class:`~ckptio.runner.synthetic.SyntheticState`: generated a shard object at a time into
recycled buffers) instead of held.

The package, by responsibility: :mod:`~ckptio.runner.settings` (:class:`RunSettings`, the
first step, retention, layouts), :mod:`~ckptio.runner.synthetic` (the state source),
:mod:`~ckptio.runner.coldreads` (bypassing the page cache), :mod:`~ckptio.runner.phases`
(the run's phases: :class:`~ckptio.runner.phases.Run`, ``prepare``, then per iteration
``plan_save``, ``write``, ``commit``, ``restore``, ``cleanup``, and ``finish``),
:mod:`~ckptio.runner.records` (the tables' rows, :class:`RunSummary`) and
:mod:`~ckptio.runner.sweep`. The tiered workload (:mod:`ckptio.tierbench`) records through
the same :mod:`~ckptio.runner.records`. The restore is recorded as the ``read`` and
``verify`` phases and the runs table's ``read_*`` columns; it times the data (what a restore
reads), not finding the newest step and reading its manifest.

Phases recorded per rank: ``generate`` (CPU seconds of the data generator, summed over the
worker threads: ``bytes / seconds`` is the generation throughput per core), ``write`` (wall time from the start barrier until this rank's last object
is durable and visible), ``flush`` (seconds spent in fsync requests, summed, from the trace;
0 where the store is durable on close without fsync), ``commit`` (rank 0: validating and
publishing the manifest), ``read`` (the restore: wall time of this rank's cold read-back,
with how the page cache was bypassed) and ``verify`` (seconds computing CRC32C, summed over threads).

Memory per rank is bounded by ``inflight x object_size`` plus the store's own bounded
buffers: it does not grow with the checkpoint's size.

Checkpoint layouts (``layout``, :data:`ckptio.checkpoint.LAYOUTS`): ``file-per-shard`` (N-N,
the default) writes each shard object as its own object, as above. ``shared-file`` (N-1) and
``shared-file-per-node`` use the library's N-1 writer (:meth:`RankWriter.place
<ckptio.checkpoint.RankWriter.place>`, :meth:`~ckptio.checkpoint.RankWriter.pwrite`): at the start of the write phase rank 0 places every process's byte range
(all its shard objects packed, 4 KiB aligned, the range aligned to the store's
``positional_alignment``) in one object per checkpoint (or per host) and creates it; each
process then generates its objects into the same ring of buffers and pwrites each at its
place, through its own handle on the shared object that is closed (durable) before the buffer
is reused. So memory stays bounded, at the cost of one open/fsync/close of the shared object
per shard object (the library's save, which holds all its data, opens it once per rank).

Duration is the maximum over ranks, throughput the checkpoint's bytes over that duration;
the slowest rank's own throughput is kept too (MLPerf Storage's metric). Every storage
request of every rank is gathered to rank 0 and written to the requests table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ckptio.dist import Communicator
from ckptio.runner.coldreads import CACHE_MODES
from ckptio.runner.phases import run_on, run_workload
from ckptio.runner.records import HOST, RunSummary
from ckptio.runner.settings import (
    KEEP,
    RunSettings,
    check_layout,
    default_keep,
    first_run_step,
    writer_ranks,
)
from ckptio.runner.sweep import (
    DEFAULT_SWEEP_MEMORY,
    SweepPoint,
    sweep,
    sweep_points,
    sweep_warnings,
)
from ckptio.runner.synthetic import GEN_BLOCK, DataGenerator
from ckptio.workload import Plan

__all__ = [
    "CACHE_MODES",
    "DEFAULT_SWEEP_MEMORY",
    "GEN_BLOCK",
    "HOST",
    "KEEP",
    "PROGRESS_HOOK",
    "SAY_HOOK",
    "DataGenerator",
    "RunSettings",
    "RunSummary",
    "SweepPoint",
    "check_layout",
    "default_keep",
    "first_run_step",
    "rank_main",
    "run_on",
    "run_workload",
    "sweep",
    "sweep_points",
    "sweep_warnings",
    "writer_ranks",
]

_run = run_on  # the name the tests of a failing store have called since before the split


def rank_main(
    comm: Communicator,
    url: str,
    plan: Plan,
    settings: RunSettings,
    sweep_points_of: Mapping[str, Any] | None = None,
) -> RunSummary:
    """What every local-process rank runs (:func:`ckptio.dist.run_local` target): the run,
    or with ``sweep_points_of`` (:func:`sweep`'s ``streams``, ``part_sizes``, ...) the sweep."""
    if comm.rank == 0 and PROGRESS_HOOK is not None:
        settings = replace(settings, progress=PROGRESS_HOOK)
    if comm.rank == 0 and SAY_HOOK is not None:
        settings = replace(settings, say=SAY_HOOK)
    if sweep_points_of is not None:
        return sweep(url, plan, settings, comm, **sweep_points_of)
    return run_workload(url, plan, settings, comm)


PROGRESS_HOOK: Callable[[int], None] | None = None
"""Set by the CLI in rank 0's process: called with bytes done (a callback cannot travel to
spawned ranks, so it is looked up here)."""


SAY_HOOK: Callable[[str], None] | None = None
"""Set likewise: called with a line per phase (and sweep point) done."""
