"""The tiered workload of ``ckptio compare``: a workload's state saved through
:class:`~ckptio.tiered.TieredCheckpointer`, with its save, drain and restore timed.

A tiered target is named ``DURABLE+LOCAL`` (:func:`parse_tiered`):

- ``DURABLE`` is a profile (``cloud-s3``, ``abci-lustre``, ...), emulated through the shaped
  backend over ``memory://``, as the plain emulated targets are;
- ``LOCAL`` is the node-local fast tier: ``disk`` (a ``file://`` directory on this machine:
  **measured**), or a profile (``local-nvme``: the shaped backend over such a directory,
  **emulated**).

Each iteration writes the plan's state (per writing rank a bf16 ``model`` and an fp32
``optim`` tensor of random bytes, held in memory by this one process, which writes every
logical rank) and times four phases, recorded in the phases table under these names:

- ``save``: what ``save`` blocked the caller for (the fast tier's commit): the stall;
- ``drain``: the drain's own time, from its first copy to the durable tier's commit;
- ``restore``: a fresh Checkpointer's ``load`` of the newest step, from the fast tier (its
  files' page cache dropped first where the store can);
- ``restore-durable``: the same load with an empty fast root (a replaced node): from the
  durable tier.

The runs table gets one row per iteration in the ordinary schema: ``write_seconds`` is the
stall, ``read_seconds`` the fast-tier restore, ``kind`` is ``tiered``, ``profile`` the durable
profile, ``emulated`` true (the durable tier always is). Requests carry the phase they belong
to (``save``, ``drain``, ``restore``, ``restore-durable``). The sidecar's ``tiers`` entry says
what each tier was and whether it was measured or emulated (:func:`tier_kinds` reads it).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptio import errors
from ckptio.registry import emulation_url, open_store
from ckptio.store import Store

#: The fast tier that is this machine's own disk (measured).
DISK = "disk"
#: Phases of a tiered run, in the order they run.
PHASES = ("save", "drain", "restore", "restore-durable")
_WRITE_OPS = ("write", "put", "create", "commit", "fsync", "rename")


__all__ = ["TieredSpec", "parse_tiered", "plan_state", "run_tiered", "tier_kinds"]


@dataclass(frozen=True)
class TieredSpec:
    """A tiered target: a durable profile (emulated) and a fast tier (``disk`` or a profile)."""

    durable: str
    local: str

    @property
    def name(self) -> str:
        return f"{self.durable}+{self.local}"

    @property
    def local_measured(self) -> bool:
        return self.local == DISK

    @property
    def note(self) -> str:
        """What each part is, in words (tables and plot labels)."""
        fast = (
            "fast tier this machine's disk, measured"
            if self.local_measured
            else f"fast tier emulated {self.local}"
        )
        return f"{fast}; durable tier emulated {self.durable}"


def parse_tiered(spec: str) -> TieredSpec:
    """``cloud-s3+disk`` or ``cloud-s3+local-nvme`` -> :class:`TieredSpec`; unknown profiles
    raise an error listing the valid ones."""
    from ckptio.profiles import load_profile

    durable, plus, local = spec.partition("+")
    if not plus or not durable or not local:
        raise errors.InvalidArgumentError(
            f"tiered target {spec!r}: give DURABLE+LOCAL, a durable profile and a fast tier "
            f"({DISK!r}: this machine's disk, measured; or a profile such as 'local-nvme', "
            "emulated), e.g. cloud-s3+disk"
        )
    load_profile(durable)
    if local != DISK:
        load_profile(local)
    return TieredSpec(durable, local)


def tier_kinds(sidecar: dict[str, Any] | None) -> dict[str, str] | None:
    """Per phase, ``measured`` or ``emulated``, from a tiered run's sidecar; None if the run is
    not tiered."""
    tiers = (sidecar or {}).get("tiers")
    if not tiers:
        return None
    fast = "measured" if tiers.get("local_measured") else "emulated"
    return {"save": fast, "restore": fast, "drain": "emulated", "restore-durable": "emulated"}


def plan_state(plan: Any, seed: int = 0) -> dict[str, Any]:
    """The plan's state as numpy arrays of random (incompressible) bytes: per writing rank a
    bf16 ``model`` tensor (as uint16) and an fp32 ``optim`` one."""
    rng = np.random.default_rng(seed)
    state: dict[str, Any] = {}
    for r in np.flatnonzero(plan.rank_bytes > 0).tolist():
        sub: dict[str, Any] = {}
        for comp, elems, dtype in (
            ("model", plan.model_elements[r], np.uint16),
            ("optim", plan.optim_elements[r], np.float32),
        ):
            if elems > 0:
                n = int(elems) * np.dtype(dtype).itemsize
                sub[comp] = np.frombuffer(rng.bytes(n), dtype=dtype)
        state[f"rank-{r:05d}"] = sub
    return state


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def _drop_cache(store: Store) -> str:
    """Drop the page cache of every object under ``store`` where it can (the contract's
    ``fadvise`` cold-read mode): ``fadvise`` or ``none``."""
    if "fadvise" not in store.cold_read_modes:
        return "none"
    return store.start_cold_reads(store.list(""), "fadvise") or "none"


def run_tiered(
    spec: TieredSpec,
    plan: Any,
    *,
    out_dir: str,
    iterations: int = 1,
    label: str | None = None,
    site: str | None = None,
    config: dict[str, Any] | None = None,
    tmp: str | None = None,
    say: Callable[[str], None] | None = None,
) -> str:
    """Run the tiered workload (see the module docstring); write the result files under
    ``out_dir``; return the run id."""
    from ckptio import results as res
    from ckptio.dist import SingleProcess
    from ckptio.tiered import TieredCheckpointer

    if iterations < 1:
        raise errors.InvalidArgumentError(f"iterations must be >= 1, got {iterations}")
    label = label or spec.name
    run_id = res.new_run_id(label)
    base = tempfile.mkdtemp(prefix="ckptio-tiered-", dir=tmp)
    space = f"ckptio-tiered-{run_id}"
    memory_url = f"memory://{space}"
    durable_url = f"{emulation_url(memory_url)}?profile={spec.durable}"

    def fast_url(name: str) -> str:
        path = os.path.join(base, name)
        return path if spec.local_measured else f"{emulation_url(path)}?profile={spec.local}"

    state = plan_state(plan)
    nbytes = sum(a.nbytes for sub in state.values() for a in sub.values())
    opts = dict(max_object_size=plan.object_size, comm=SingleProcess(), keep_last_local=1)
    requests: list[dict[str, Any]] = []
    phases: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    site = site or socket.gethostname()
    cache = "n/a"

    def record(events: Any, phase: str, it: int) -> None:
        for ev in events:
            requests.append(
                {
                    "run_id": run_id,
                    "target": label,
                    "rank": 0,
                    "iteration": it,
                    "phase": phase,
                    "op": ev.op,
                    "key": ev.key,
                    "nbytes": int(ev.nbytes),
                    "start": float(ev.start),
                    "end": float(ev.end),
                    "seconds": float(ev.end - ev.start),
                    "attempt": int(ev.attempt),
                    "outcome": ev.outcome,
                    "backend": ev.backend,
                    "thread": int(ev.thread),
                }
            )

    def phase_row(it: int, phase: str, start: float, seconds: float, how: str = "n/a") -> None:
        phases.append(
            {
                "run_id": run_id,
                "target": label,
                "rank": 0,
                "iteration": it,
                "phase": phase,
                "bytes": nbytes,
                "seconds": seconds,
                "start": start,
                "end": start + seconds,
                "cache": how,
            }
        )

    try:
        with TieredCheckpointer(durable_url, local=fast_url("fast"), **opts) as ck:
            for it in range(iterations):
                step = it + 1
                ck.store.trace.clear()
                ck.fast.store.trace.clear()
                t0 = time.time()
                handle = ck.save(state, step)
                stall = handle.blocking_seconds
                drain = handle.wait_drain()
                if drain is None or drain.status != "durable":
                    raise errors.CkptioError(f"the drain of step {step} did not commit: {drain}")
                save_end = t0 + stall
                fast_events = ck.fast.store.trace.events()
                record(
                    [e for e in fast_events if e.op in _WRITE_OPS and e.end <= save_end + 1e-3],
                    "save",
                    it,
                )
                record(
                    [
                        e
                        for e in fast_events
                        if not (e.op in _WRITE_OPS and e.end <= save_end + 1e-3)
                    ]
                    + list(ck.store.trace.events()),
                    "drain",
                    it,
                )
                phase_row(it, "save", t0, stall)
                phase_row(it, "drain", time.time() - drain.seconds, drain.seconds)
                if say:
                    say(
                        f"iteration {it + 1}/{iterations}: save (stall) {stall:.2f} s, "
                        f"drain {drain.seconds:.2f} s ({_gbps(nbytes, drain.seconds):.2f} GB/s)"
                    )
                restore = {}
                for phase, root in (("restore", "fast"), ("restore-durable", f"lost-{it}")):
                    with TieredCheckpointer(durable_url, local=fast_url(root), **opts) as reader:
                        how = _drop_cache(reader.fast.store) if phase == "restore" else "n/a"
                        cache = how if phase == "restore" else cache
                        reader.store.trace.clear()
                        reader.fast.store.trace.clear()
                        t = time.time()
                        loaded = reader.load()
                        restore[phase] = time.time() - t
                        record(
                            [*reader.fast.store.trace.events(), *reader.store.trace.events()],
                            phase,
                            it,
                        )
                    if set(loaded) != set(state):
                        raise errors.CorruptCheckpointError(f"{phase} read another state")
                    del loaded
                    phase_row(it, phase, t, restore[phase], how)
                if say:
                    say(
                        f"iteration {it + 1}/{iterations}: restore {restore['restore']:.2f} s "
                        f"from the fast tier, {restore['restore-durable']:.2f} s from the "
                        "durable tier"
                    )
                mine = [r for r in requests if r["iteration"] == it]
                outcomes = [r["outcome"] for r in mine]
                runs.append(
                    {
                        "run_id": run_id,
                        "target": label,
                        "url": durable_url,
                        "backend": ck.store.name,
                        "preset": plan.preset.name,
                        "scale": float(plan.scale),
                        "ranks": 1,
                        "writing_ranks": plan.writing_ranks,
                        "iteration": it,
                        "checkpoint_bytes": nbytes,
                        "objects": sum(
                            1
                            for r in mine
                            if r["phase"] == "save" and r["op"] == "commit" and "/data/" in r["key"]
                        ),
                        "write_seconds": stall,
                        "write_GBps": _gbps(nbytes, stall),
                        "min_rank_write_GBps": _gbps(nbytes, stall),
                        "read_seconds": restore["restore"],
                        "read_GBps": _gbps(nbytes, restore["restore"]),
                        "min_rank_read_GBps": _gbps(nbytes, restore["restore"]),
                        "requests": len(mine),
                        "retries": outcomes.count("retry"),
                        "throttled": outcomes.count("throttled"),
                        "errors": outcomes.count("error"),
                        "generate_GBps": 0.0,
                        "streams": ck.store.streams,
                        "part_size": ck.store.request_size,
                        "emulated": True,
                        "profile": spec.durable,
                        "mock": False,
                        "site": site,
                        "kind": "tiered",
                        "sweep_streams": 0,
                        "sweep_part_size": 0,
                        "layout": "file-per-shard",
                    }
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
        with open_store(memory_url) as space_store:  # the emulated durable tier's bytes
            space_store.delete(space_store.list(""))
    side = res.sidecar(
        run_id,
        config={
            "preset": plan.preset.name,
            "scale": plan.scale,
            "gpus": plan.ranks,
            "iterations": iterations,
            "object_size": plan.object_size,
            **(config or {}),
        },
        emulated=True,
        profile=spec.durable,
        labels={"target": label, "site": site},
        extra={
            "tiers": {
                "durable": spec.durable,
                "durable_url": durable_url,
                "local": spec.local,
                "local_measured": spec.local_measured,
                "note": spec.note,
            },
            "cache_bypass": cache,
        },
    )
    res.write_run(
        out_dir,
        requests=res.table("requests", requests),
        phases=res.table("phases", phases),
        runs=res.table("run", runs),
        sidecar=side,
    )
    return run_id
