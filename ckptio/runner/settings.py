"""What a run is given and what it checks before it starts: :class:`RunSettings` (every
option of a run, checked when made), retention (:data:`KEEP`), the first step a run may take
in a root (:func:`first_run_step`), whether a store can hold a layout (:func:`check_layout`),
and which process plays which logical ranks (:func:`writer_ranks`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint import LAYOUTS, read_manifest
from ckptio.lease import StorageClock, is_lease_key, read_lease
from ckptio.redact import redact_url
from ckptio.runner.coldreads import CACHE_MODES
from ckptio.store import Store
from ckptio.workload import Plan

__all__ = [
    "KEEP",
    "RunSettings",
    "check_layout",
    "default_keep",
    "first_run_step",
    "writer_ranks",
]

KEEP = ("last", "all", "none")
"""Which iterations' checkpoints stay on the target after the run."""


def writer_ranks(plan: Plan, size: int) -> list[np.ndarray]:
    """Logical ranks that write, dealt round-robin over ``size`` processes."""
    writers = np.flatnonzero(plan.rank_bytes > 0)
    return [writers[p::size] for p in range(size)]


@dataclass
class RunSettings:
    """How a run goes: every option of :func:`run_workload` (and :func:`sweep`), checked when
    made, and what the run derived from the target (``emulated``, ``profile``, ``label``):
    the one object every phase of :class:`~ckptio.runner.phases.Run` reads."""

    iterations: int = 1
    out_dir: str | os.PathLike[str] | None = None
    """Rank 0 writes the result files here (when given and ``write_files``)."""
    pause: float = 0.0
    """Seconds between iterations (the compute time)."""
    inflight: int = 2
    """Shard objects each rank has in flight (memory per rank ~ inflight x object size)."""
    read: bool = True
    """Run the restore phase after each commit."""
    cache: str = "auto"
    """How the restore bypasses caches: one of :data:`CACHE_MODES`."""
    keep: str | None = None
    """One of :data:`KEEP`; None: ``last``, or ``none`` with ``share_root``
    (:func:`default_keep`)."""
    share_root: bool = False
    """Run beside checkpoints that are not a run's (see :func:`first_run_step`)."""
    key_layout: str = "flat"
    layout: str = "file-per-shard"
    """One of :data:`ckptio.checkpoint.LAYOUTS` (the shared ones need positional writes)."""
    label: str = ""
    """The target's name in the results (default: from the URL)."""
    site: str | None = None
    emulate: str | None = None
    """A profile name: the target is wrapped in the backend that emulates profiles
    (:func:`ckptio.registry.emulation_url`) and every figure is marked emulated."""
    mock: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    """Store options (``streams``, ``part_size``, ...; recorded in the sidecar)."""
    progress: Callable[[int], None] | None = None
    """Rank 0: called with bytes done."""
    say: Callable[[str], None] | None = None
    """Rank 0: called with a line per phase done (``iteration 1/3: write 64.0 MiB in 0.21 s,
    0.32 GB/s``)."""
    run_id: str | None = None
    kind: str = "run"
    sweep_streams: int = 0
    sweep_part_size: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    """More configuration for the sidecar (the command that ran it, ...)."""
    write_files: bool = True
    emulated: bool = False
    """Derived: the store the run opened is emulated."""
    profile: str = ""
    """Derived: the profile it emulates."""

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise errors.InvalidArgumentError(f"iterations must be >= 1, got {self.iterations}")
        if self.inflight < 1:
            raise errors.InvalidArgumentError(f"inflight must be >= 1, got {self.inflight}")
        if self.cache not in CACHE_MODES:
            raise errors.InvalidArgumentError(
                f"unknown cache mode {self.cache!r}; valid: {', '.join(CACHE_MODES)}"
            )
        self.keep = default_keep(self.keep, self.share_root)
        if self.key_layout not in fmt.KEY_LAYOUTS:
            raise errors.InvalidArgumentError(
                f"unknown key_layout {self.key_layout!r}; valid: {', '.join(fmt.KEY_LAYOUTS)}"
            )
        if self.pause < 0:
            raise errors.InvalidArgumentError(f"pause must be >= 0 seconds, got {self.pause}")
        if self.layout not in LAYOUTS:
            raise errors.InvalidArgumentError(
                f"unknown layout {self.layout!r}; valid: {', '.join(LAYOUTS)}"
            )


def default_keep(keep: str | None, share_root: bool) -> str:
    """``keep`` checked (one of :data:`KEEP`); None: ``last``, or ``none`` in a shared root
    (a run's step left there would be newer than the training job's, and ``load(root)``
    returns the newest: it is kept only when ``keep`` asks)."""
    if keep is None:
        return "none" if share_root else "last"
    if keep not in KEEP:
        raise errors.InvalidArgumentError(f"unknown keep {keep!r}; valid: {', '.join(KEEP)}")
    return keep


def first_run_step(store: Store, *, share_root: bool = False) -> int:
    """The first step of a benchmark run on ``store``: one past every step under the root,
    committed or not, so a run never takes a number that a save in flight holds (its lease is
    published before its data) nor one that an interrupted save left debris under.

    A run writes synthetic checkpoints, and ``load(root)`` returns the newest one: a root that
    holds a checkpoint a run did not write, or a save in flight that is not a run's, is
    refused with :class:`~ckptio.errors.InvalidArgumentError` naming it, unless
    ``share_root`` (``ckptio run --share-root``; the run's steps are then deleted as they are
    read unless ``keep`` says otherwise: :func:`default_keep`). A root of earlier runs' steps
    is the run's to use. Reads the manifests of committed steps, newest first, until one that
    is not a run's (a root of many kept runs: all of them), and the leases of steps in flight."""
    by_step: dict[int, list[str]] = {}
    for key in store.list("step-"):
        step = fmt.parse_step_dir(key.partition("/")[0])
        if step is not None:
            by_step.setdefault(step, []).append(key)
    if not share_root:
        other = _not_a_runs(store, by_step)
        if other:
            raise errors.InvalidArgumentError(
                f"{store.url} holds {other}: a run's checkpoints would be newer than it and "
                "load() would return them; run into a root of its own, or pass --share-root "
                "(share_root=True) to run beside it (its steps are then numbered after every "
                "step there and deleted as they are read: --keep none)"
            )
    return max(by_step, default=-1) + 1


def _not_a_runs(store: Store, by_step: Mapping[int, Sequence[str]]) -> str:
    """What under the root a benchmark run did not write (a checkpoint, a save in flight), or
    empty."""
    clock = StorageClock.of(store)
    for step in sorted(by_step, reverse=True):
        keys = by_step[step]
        if fmt.manifest_key(step) in keys:
            try:
                metadata = read_manifest(store, step).metadata
            except FileNotFoundError:
                continue  # retired or deleted meanwhile
            except errors.CkptioError:
                return f"a checkpoint at step {step} whose manifest does not validate"
            if not (isinstance(metadata, dict) and metadata.get("synthetic") is True):
                return f"a checkpoint at step {step} that no benchmark run wrote"
            continue
        for key in filter(is_lease_key, keys):
            lease = read_lease(store, key)
            if lease is not None and lease.purpose != "run" and lease.live(clock):
                return f"a save in flight at step {step} ({lease.holder()})"
    return ""


def check_layout(store: Store, layout: str, url: str) -> None:
    """Raise :class:`~ckptio.errors.InvalidArgumentError` unless ``store`` can hold a
    checkpoint of ``layout`` (the shared layouts need ``capabilities.positional_writes``)."""
    if layout not in LAYOUTS:
        raise errors.InvalidArgumentError(f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}")
    if layout != "file-per-shard" and not store.capabilities.positional_writes:
        raise errors.InvalidArgumentError(
            f"layout {layout!r} needs positional writes (several writers in one object), which "
            f"the {store.name} store at {redact_url(url)} does not offer; valid layouts "
            "there: file-per-shard (shared-file and shared-file-per-node need a filesystem "
            "target: file://, pfs://)"
        )
