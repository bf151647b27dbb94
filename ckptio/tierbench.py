"""The tiered workload: a plan's state saved through :class:`~ckptio.checkpoint.tiered.TieredCheckpointer`
on every rank, with its save, drain and restore timed.

Two ways in:

- ``ckptio run DURABLE --local FAST`` (:func:`run_tiered_workload`): real targets, e.g.
  ``s3://bucket/run`` drained from ``file:///nvme/run`` (``{rank}`` in ``FAST`` gives each
  rank its own fast root, as node-local disks are), on the ranks of the launcher or of
  ``--ranks``; ``--emulate`` / ``--emulate-local`` wrap either tier in the shaped backend.
- ``ckptio compare``'s tiered targets ``DURABLE+LOCAL`` (:func:`parse_tiered`,
  :func:`run_tiered`): ``DURABLE`` is a profile (``cloud-s3``, ``abci-lustre``, ...),
  emulated over ``memory://``; ``LOCAL`` is ``disk`` (a directory on this machine:
  **measured**) or a profile (``local-nvme``: the shaped backend over such a directory,
  **emulated**). One process writes every logical rank.

Each process holds its share of the plan (the logical ranks dealt to it, as the runner deals
them): a bf16 ``model`` and an fp32 ``optim`` tensor, each one box of a global flat tensor
(:class:`~ckptio.checkpoint.Shard`), of incompressible bytes (the runner's
:class:`~ckptio.runner.DataGenerator`), refilled every iteration. Training holds its state
in memory, and so does this workload: each process needs its share and a little more,
checked before anything is written (:func:`check_tiered`). The restores read into the same
arrays (cleared first), and each is checked against the stream generated again.

Each iteration times four phases, recorded in the phases table under these names (per rank;
the runs table takes the slowest rank):

- ``save``: what ``save`` blocked the caller for (the fast tier's commit): the stall;
- ``drain``: the drain's own time, from its first copy to the durable tier's commit;
- ``restore``: a fresh Checkpointer's ``load`` of the newest step into the state's arrays,
  each rank reading its own box from its fast root (the page cache of those objects
  bypassed first as ``cache`` says, as the runner does);
- ``restore-durable``: the same load with an empty fast root (a replaced node): from the
  durable tier.

The runs table gets one row per iteration in the ordinary schema (the runner's own rows): ``write_seconds`` is the stall, ``read_seconds`` the fast-tier
restore, ``kind`` is ``tiered``. Requests carry the phase they belong to (``save``,
``drain`` (the durable tier's side), ``drain-read`` (the fast tier's side of the drain),
``restore``, ``restore-durable``). The sidecar's ``tiers`` entry says what each tier was and
whether it was measured or emulated (:func:`tier_kinds` reads it).

``keep`` works as the runner's: this run's older steps are removed from both tiers (manifest
first), never the steps of another run in the same roots.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint import Shard, delete_step
from ckptio.dist import Communicator
from ckptio.redact import redact, redact_url
from ckptio.registry import client_versions, emulation_url, open_store
from ckptio.runner import (
    CACHE_MODES,
    HOST,
    DataGenerator,
    RunSettings,
    RunSummary,
    _events_columns,
    _merge_columns,
    _peak_rss,
    _run_rows,
    _start_cold_reads,
    _target_label,
    _valid_cache,
    default_keep,
    first_run_step,
    hosts_of,
    log,
    writer_ranks,
)
from ckptio.store import Store
from ckptio.units import MAX_PEERS

#: The fast tier that is this machine's own disk (measured).
DISK = "disk"
#: Phases of a tiered run, in the order they run.
PHASES = ("save", "drain", "restore", "restore-durable")
_WRITE_OPS = ("write", "put", "create", "commit", "fsync", "rename")
#: Share of the memory available that a tiered run's processes on one node may hold.
MEMORY_SHARE = 0.8


__all__ = [
    "PEER_NOTE",
    "TieredSpec",
    "check_tiered",
    "parse_tiered",
    "peer_suffix",
    "run_tiered",
    "run_tiered_workload",
    "tier_kinds",
]


@dataclass(frozen=True)
class TieredSpec:
    """A tiered target: a durable profile (emulated) and a fast tier (``disk`` or a profile)."""

    durable: str
    local: str
    peers: int = 0
    """Peer copies the full-scale projection gives each node's fast tier (``+peer``,
    ``+peerK``); the run itself has no peer node (one process): the same phases are run."""

    @property
    def name(self) -> str:
        return f"{self.durable}+{self.local}{peer_suffix(self.peers)}"

    @property
    def local_measured(self) -> bool:
        return self.local == DISK

    @property
    def note(self) -> str:
        """What each part is, in words (tables and plot labels)."""
        return tiers_note(self.durable, False, self.local, self.local_measured) + (
            f"; {PEER_NOTE}" if self.peers else ""
        )


PEER_NOTE = "peer copies projected by the model (not run here: one process has no peer node)"
"""What a tiered target's peer copies are, in words, wherever they are shown."""


def peer_suffix(peers: int) -> str:
    """A tiered target name's suffix for ``peers`` copies: ``+peer`` (1), ``+peerK``."""
    return "" if peers == 0 else "+peer" if peers == 1 else f"+peer{peers}"


def tiers_note(durable: str, durable_measured: bool, local: str, local_measured: bool) -> str:
    """What each tier is, in words (tables and plot labels)."""
    where = "this machine's disk" if local == DISK else local
    fast = f"fast tier {where}, measured" if local_measured else f"fast tier emulated {local}"
    slow = (
        f"durable tier {durable}, measured"
        if durable_measured
        else f"durable tier emulated {durable}"
    )
    return f"{fast}; {slow}"


def parse_tiered(spec: str) -> TieredSpec:
    """``cloud-s3+disk`` or ``cloud-s3+local-nvme`` (``+peer`` or ``+peerK`` after it: with
    peer copies) -> :class:`TieredSpec`; unknown profiles raise an error listing the valid
    ones."""
    from ckptio.profiles import load_profile

    peers = 0
    head, plus, last = spec.rpartition("+")
    if plus and last.startswith("peer"):
        count = last[len("peer") :] or "1"
        if not count.isdigit() or not 1 <= int(count) <= MAX_PEERS:
            raise errors.InvalidArgumentError(
                f"tiered target {spec!r}: '+peer' or '+peerK' with K from 1 to {MAX_PEERS} "
                "peer copies, e.g. cloud-s3+local-nvme+peer2"
            )
        spec, peers = head, int(count)
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
    return TieredSpec(durable, local, peers)


def tier_kinds(sidecar: dict[str, Any] | None) -> dict[str, str] | None:
    """Per phase, ``measured`` or ``emulated``, from a tiered run's sidecar; None if the run is
    not tiered."""
    tiers = (sidecar or {}).get("tiers")
    if not tiers:
        return None
    fast = "measured" if tiers.get("local_measured") else "emulated"
    durable = "measured" if tiers.get("durable_measured") else "emulated"
    return {"save": fast, "restore": fast, "drain": durable, "restore-durable": durable}


# -- the state each process holds -------------------------------------------------------------

_COMPONENTS = (("model", "model_elements", np.uint16), ("optim", "optim_elements", np.float32))
"""Tensor name, the plan's per-rank element counts, dtype (bf16 is held as uint16)."""


@dataclass(frozen=True)
class _Box:
    name: str
    dtype: Any
    total: int
    """Elements of the global tensor."""
    offset: int
    count: int
    """This process's elements."""


def _boxes(plan: Any, size: int, rank: int) -> list[_Box]:
    """This process's box of each global tensor (components no rank holds are left out)."""
    assigned = writer_ranks(plan, size)
    out = []
    for name, field, dtype in _COMPONENTS:
        counts = [int(getattr(plan, field)[a].sum()) for a in assigned]
        if sum(counts) > 0:
            out.append(_Box(name, dtype, sum(counts), sum(counts[:rank]), counts[rank]))
    return out


def _process_bytes(plan: Any, size: int) -> list[int]:
    """Bytes of state each of ``size`` processes holds."""
    return [
        sum(b.count * np.dtype(b.dtype).itemsize for b in _boxes(plan, size, r))
        for r in range(size)
    ]


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_tiered(plan: Any, size: int, comm: Communicator | None = None) -> None:
    """Refuse a tiered run of ``size`` processes (the ranks of ``comm``, or local processes)
    with more processes than the plan has GPUs that write (a drain copies each rank's own
    objects), or whose processes on this node would hold more than :data:`MEMORY_SHARE` of
    the memory available (each holds its share of the state; its restores read into the
    same arrays)."""
    from ckptio.units import human_bytes

    writers = int((plan.rank_bytes > 0).sum())
    if size > writers:
        raise errors.InvalidArgumentError(
            f"{size} ranks (--ranks, or the launcher's): a tiered run (--local) needs at most "
            f"one rank per GPU that writes, {writers} in this layout of {plan.preset.name}; use "
            f"at most {writers} (or more --gpus)"
        )
    avail = _available_memory()
    if avail is None:
        return
    need = max(_process_bytes(plan, size)) * (size if comm is None else _ranks_here(comm))
    if need > MEMORY_SHARE * avail:
        raise errors.InvalidArgumentError(
            f"a tiered run holds the state in memory, as training does: {human_bytes(need)} on "
            f"this node exceeds {MEMORY_SHARE:.0%} of the {human_bytes(avail)} available; lower "
            "--scale or --total-size"
        )


def _ranks_here(comm: Communicator) -> int:
    """Processes of this run on this node: the launcher's local size, else every rank."""
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return comm.size


# -- one run ----------------------------------------------------------------------------------


def _gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def _delete_step(store: Store, step: int) -> None:
    """Remove one step of this run from one tier's root (:func:`ckptio.checkpoint.delete_step`:
    the manifest first)."""
    try:
        delete_step(store, step)
    except errors.CkptioError as err:  # retention is best effort; a run never hangs on it
        log.warning("could not delete step %d from %s: %s", step, redact_url(store.url), err)


def run_tiered_workload(
    url: str,
    local: str,
    plan: Any,
    *,
    comm: Communicator | None = None,
    iterations: int = 1,
    out_dir: str | os.PathLike[str] | None = None,
    pause: float = 0.0,
    read: bool = True,
    cache: str = "auto",
    keep: str | None = None,
    share_root: bool = False,
    key_layout: str | None = None,
    label: str | None = None,
    site: str | None = None,
    emulate: str | None = None,
    emulate_local: str | None = None,
    local_label: str | None = None,
    store_options: dict[str, Any] | None = None,
    local_options: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    tmp: str | None = None,
    progress: Callable[[int], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> RunSummary:
    """Run ``plan`` through a :class:`~ckptio.checkpoint.tiered.TieredCheckpointer` with durable tier
    ``url`` and fast tier ``local`` (a URL; ``{rank}`` in it gives each rank its own root) for
    ``iterations`` iterations on every rank of ``comm`` (see the module docstring). Every rank
    calls it with the same arguments. ``emulate`` / ``emulate_local``: profiles that wrap the
    durable / fast tier in the shaped backend (marked emulated). ``local_label``: how the
    fast tier is named in results (default: its URL). ``tmp``: where the empty fast roots of
    ``restore-durable`` are made. The other arguments are :func:`ckptio.runner.run_workload`'s.
    Returns this rank's :class:`~ckptio.runner.RunSummary` (complete on rank 0)."""
    from ckptio import results as res
    from ckptio.checkpoint.tiered import tiered_checkpointer
    from ckptio.dist import detect

    if iterations < 1:
        raise errors.InvalidArgumentError(f"iterations must be >= 1, got {iterations}")
    keep = default_keep(keep, share_root)
    if cache not in CACHE_MODES:
        raise errors.InvalidArgumentError(
            f"unknown cache mode {cache!r}; valid: {', '.join(CACHE_MODES)}"
        )
    if pause < 0:
        raise errors.InvalidArgumentError(f"pause must be >= 0 seconds, got {pause}")
    comm = comm if comm is not None else detect()
    durable_url = emulation_url(url) if emulate else url
    durable_opts = dict(store_options or {})
    if emulate:
        durable_opts.update(profile=emulate, ranks=comm.size)
    fast_url = emulation_url(local) if emulate_local else local
    fast_opts = dict(local_options or {})
    if emulate_local:
        fast_opts["profile"] = emulate_local
    label = redact(label) if label else _target_label(url, emulate) + "-tiered"
    opts: dict[str, Any] = dict(
        comm=comm,
        max_object_size=plan.object_size,
        keep_last=None,  # this run's retention is ``keep``'s (other runs' steps stay)
        keep_last_local=None,
        key_layout=key_layout,
        local_options=fast_opts,
        **durable_opts,
    )
    boxes = _boxes(plan, comm.size, comm.rank)
    mine = sum(b.count * np.dtype(b.dtype).itemsize for b in boxes)
    rank = comm.rank
    first: dict[str, Any] = {}
    base = tempfile.mkdtemp(prefix="ckptio-tiered-", dir=tmp)
    try:
        if rank == 0:
            try:
                check_tiered(plan, comm.size, comm)
            except errors.CkptioError as err:
                first = {"error": str(err)}
        first = comm.bcast(first, root=0)  # the same verdict on every rank
        if "error" in first:
            raise errors.InvalidArgumentError(first["error"])
        with tiered_checkpointer(durable_url, local=fast_url, **opts) as ck:
            _valid_cache(ck.fast.store, cache)
            steps = comm.gather(ck.steps(), root=0)
            if rank == 0:
                assert steps is not None
                newest = max((s for part in steps for s in part), default=-1)
                try:  # the durable root is refused as a run's is (first_run_step)
                    first = {
                        "run_id": res.new_run_id(label),
                        "step": max(newest + 1, first_run_step(ck.store, share_root=share_root)),
                        "seed": secrets.token_hex(8),
                    }
                except errors.InvalidArgumentError as err:
                    first = {"refused": str(err)}
            first = comm.bcast(first, root=0)
            if "refused" in first:
                raise errors.InvalidArgumentError(first["refused"])
            run_id, step0 = first["run_id"], int(first["step"])
            gen = DataGenerator(first["seed"])

            def ident(it: int, b: _Box) -> str:
                return f"{it}/{b.name}/{rank}"

            state, raws = {}, {}
            for b in boxes:
                nbytes = b.count * np.dtype(b.dtype).itemsize
                raws[b.name] = np.empty(nbytes + DataGenerator.SLACK, dtype=np.uint8)
                arr = raws[b.name][:nbytes].view(b.dtype)
                state[b.name] = Shard(arr, (b.total,), (b.offset,))
            rows: list[dict[str, Any]] = []  # phases
            parts: list[dict[str, list[Any]]] = []  # requests
            iters: list[dict[str, Any]] = []
            cache_used = "n/a"
            written: list[int] = []

            def phase_row(it: int, phase: str, start: float, seconds: float, how: str = "n/a"):
                rows.append(
                    {
                        "run_id": run_id,
                        "target": label,
                        "rank": rank,
                        "iteration": it,
                        "phase": phase,
                        "bytes": mine,
                        "seconds": seconds,
                        "start": start,
                        "end": start + seconds,
                        "cache": how,
                        "host": HOST,
                    }
                )

            for it in range(iterations):
                step = step0 + it
                for b in boxes:  # fresh bytes every iteration (nothing to deduplicate)
                    gen.fill(raws[b.name], state[b.name].array.nbytes, ident(it, b))
                ck.store.trace.clear()
                ck.fast.store.trace.clear()
                comm.barrier()
                t0 = time.time()
                handle = ck.save(state, step, metadata={"synthetic": True, "run_id": run_id})
                stall = handle.blocking_seconds
                drain = handle.wait_drain()
                drained_at = time.time()
                if drain is None or drain.status != "durable":
                    raise errors.SaveFailedError(
                        f"the drain of step {step} to {redact_url(url)} did not commit: "
                        f"{drain.error if drain else 'not drained'}"
                    )
                written.append(step)
                save_end = t0 + stall
                fast_events = ck.fast.store.trace.events()
                in_save = [e.op in _WRITE_OPS and e.end <= save_end + 1e-3 for e in fast_events]
                saved = [e for e, s in zip(fast_events, in_save, strict=True) if s]
                parts.append(_events_columns(saved, "save", it, rank))
                parts.append(
                    _events_columns(
                        [e for e, s in zip(fast_events, in_save, strict=True) if not s],
                        "drain-read",
                        it,
                        rank,
                    )
                )
                parts.append(_events_columns(ck.store.trace.events(), "drain", it, rank))
                phase_row(it, "save", t0, stall)
                phase_row(it, "drain", drained_at - drain.seconds, drain.seconds)
                fig = {
                    "bytes": mine,
                    "stall": stall,
                    "drain": drain.seconds,
                    "restore": 0.0,
                    "restore-durable": 0.0,
                    "objects": len({e.key for e in saved if e.op in ("write", "put") and e.nbytes}),
                }
                if progress:
                    progress(2 * mine)
                if say and rank == 0:
                    say(
                        f"iteration {it + 1}/{iterations}: save (stall) {stall:.2f} s, drain "
                        f"{drain.seconds:.2f} s (rank 0)"
                    )
                if read:
                    lost = os.path.join(base, f"lost-{it}-{rank}")  # an empty fast root
                    lost = emulation_url(lost) if emulate_local else lost
                    for phase, roots in (("restore", fast_url), ("restore-durable", lost)):
                        with tiered_checkpointer(durable_url, local=roots, **opts) as reader:
                            cold = reader.fast.store if phase == "restore" else reader.store
                            prefix = fmt.step_dir(step) + "/"
                            keys = [k[len(prefix) :] for k in cold.list(prefix)]
                            how = _start_cold_reads(cold, step, keys, cache)
                            reader.store.trace.clear()
                            reader.fast.store.trace.clear()
                            for b in boxes:  # a restore that reads nothing cannot pass
                                state[b.name].array.view(np.uint8).fill(0)
                            comm.barrier()
                            t = time.time()
                            try:
                                reader.load(into=state)  # the newest: what a restart reads
                            finally:
                                if not cold.describe().cold_reads.end():
                                    how = "none"  # O_DIRECT refused: reads went buffered
                            fig[phase] = time.time() - t
                            events = [
                                *reader.fast.store.trace.events(),
                                *reader.store.trace.events(),
                            ]
                            parts.append(_events_columns(events, phase, it, rank))
                        if phase == "restore":
                            cache_used = how
                        for b in boxes:
                            got = state[b.name].array
                            if not gen.matches(got, got.nbytes, ident(it, b)):
                                raise errors.CorruptCheckpointError(
                                    f"the {phase} of step {step} read other bytes than were "
                                    f"saved ({b.name}, rank {rank})"
                                )
                        phase_row(it, phase, t, fig[phase], how)
                        if progress:
                            progress(mine)
                    if say and rank == 0:
                        say(
                            f"iteration {it + 1}/{iterations}: restore {fig['restore']:.2f} s "
                            f"from the fast tier, {fig['restore-durable']:.2f} s from the "
                            "durable tier (rank 0)"
                        )
                iters.append(fig)
                comm.barrier()
                if keep == "none" or (keep == "last" and it < iterations - 1):
                    if rank == 0:
                        _delete_step(ck.store, step)
                    if rank == 0 or ck.per_rank:
                        _delete_step(ck.fast.store, step)
                if pause and it < iterations - 1:
                    time.sleep(pause)
            durable, fast_name = ck.store, ck.fast.store.name
            versions = client_versions(durable_url)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    everything = comm.gather(
        {
            "phases": rows,
            "requests": _merge_columns(parts),
            "iters": iters,
            "rss": _peak_rss(),
            "host": HOST,
        },
        root=0,
    )
    summary = RunSummary(
        run_id,
        rank,
        phases=rows,
        steps=written,
        url=redact_url(url),
        cache=cache_used,
        generator=gen.name,
        client_versions=versions,
    )
    if everything is None:
        summary.peak_rss_bytes = [_peak_rss()]
        return summary
    reqs = _merge_columns([e["requests"] for e in everything])
    n = len(reqs.get("op", []))
    reqs.update(
        run_id=[run_id] * n,
        target=[label] * n,
        seconds=[e - b for b, e in zip(reqs.get("start", []), reqs.get("end", []), strict=True)],
    )
    if n == 0:
        reqs = {c: [] for c, _ in res.REQUEST_COLUMNS}
    emulated = bool(emulate or emulate_local)
    # the runs table in the runner's own rows: the stall as the write, the fast tier's
    # restore as the read (each the slowest rank's)
    as_run = [
        {
            "iters": [
                {
                    "bytes": f["bytes"],
                    "objects": f["objects"],
                    "write_start": 0.0,
                    "write_end": f["stall"],
                    "write_done": f["stall"],
                    "read_start": 0.0,
                    "read_end": f["restore"],
                    "read_done": f["restore"],
                    "gen_seconds": 0.0,
                }
                for f in e["iters"]
            ],
            "host": e["host"],
        }
        for e in everything
    ]
    runs = _run_rows(
        plan,
        as_run,
        reqs,
        RunSettings(
            label=label,
            site=site,
            emulated=emulated,
            profile=emulate or "",
            kind="tiered",
        ),
        run_id=run_id,
        url=url,
        store=durable,
        comm_size=comm.size,
    )
    tiered = []
    for it in range(iterations):
        per = [e["iters"][it] for e in everything]
        total = sum(p["bytes"] for p in per)
        worst = {ph: max(p[ph] for p in per) for ph in ("stall", "drain", *PHASES[2:])}
        tiered.append(
            {
                "iteration": it,
                "checkpoint_bytes": total,
                "stall_seconds": worst["stall"],
                "drain_seconds": worst["drain"],
                "drain_GBps": _gbps(total, worst["drain"]),
                "restore_seconds": worst["restore"],
                "restore_GBps": _gbps(total, worst["restore"]),
                "restore_durable_seconds": worst["restore-durable"],
                "restore_durable_GBps": _gbps(total, worst["restore-durable"]),
            }
        )
    all_phases = [r for e in everything for r in e["phases"]]
    summary.runs, summary.phases, summary.requests = runs, all_phases, n
    summary.peak_rss_bytes = [int(e["rss"]) for e in everything]
    summary.tiered = tiered
    summary.tables = {"requests": reqs, "phases": all_phases, "runs": runs}
    if out_dir is not None:
        durable_name_shown = emulate or redact_url(url)
        fast_shown = local_label or emulate_local or redact_url(local)
        side = res.sidecar(
            run_id,
            config={
                "url": redact_url(url),
                "local": redact_url(local),
                "preset": plan.preset.name,
                "scale": plan.scale,
                "layout": plan.layout.describe(),
                "gpus": plan.ranks,
                "ranks": comm.size,
                "iterations": iterations,
                "object_size": plan.object_size,
                "cache": cache,
                "keep": keep,
                "pause": pause,
                "store_options": durable_opts,
                "local_options": fast_opts,
                **(config or {}),
            },
            emulated=emulated,
            profile=emulate or "",
            labels={"target": label, "site": site or ""},
            extra={
                "tiers": {
                    "durable": durable_name_shown,
                    "durable_url": redact_url(durable_url),
                    "durable_measured": not emulate,
                    "local": fast_shown,
                    "local_url": redact_url(fast_url),
                    "local_measured": not emulate_local,
                    "local_backend": fast_name,
                    "note": tiers_note(
                        durable_name_shown, not emulate, fast_shown, not emulate_local
                    ),
                },
                "generator": gen.name,
                "peak_rss_bytes": summary.peak_rss_bytes,
                "steps": written,
                "cache_bypass": cache_used,
                "communicator": type(comm).__name__,
                "hosts": hosts_of(everything),
            },
            client_versions=versions,
        )
        summary.paths = res.write_run(
            out_dir,
            requests=res.table("requests", reqs),
            phases=res.table("phases", all_phases),
            runs=res.table("run", runs),
            sidecar=side,
        )
    return summary


def rank_main(comm: Communicator, url: str, plan: Any, kwargs: dict[str, Any]) -> RunSummary:
    """What every local-process rank of ``ckptio run --local`` runs (as
    :func:`ckptio.runner.rank_main`; ``kwargs`` holds ``local``)."""
    from ckptio import runner

    kwargs = dict(kwargs)
    if comm.rank == 0 and runner.PROGRESS_HOOK is not None:
        kwargs["progress"] = runner.PROGRESS_HOOK
    if comm.rank == 0 and runner.SAY_HOOK is not None:
        kwargs["say"] = runner.SAY_HOOK
    return run_tiered_workload(url, kwargs.pop("local"), plan, comm=comm, **kwargs)


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
    """``ckptio compare``'s tiered target ``spec`` in this one process: the durable profile
    emulated over a fresh ``memory://`` space, the fast tier a fresh directory (under
    ``tmp``), both removed afterwards; the result files go under ``out_dir``. Returns the
    run id."""
    from ckptio.dist import SingleProcess

    base = tempfile.mkdtemp(prefix="ckptio-tiered-", dir=tmp)
    memory_url = f"memory://ckptio-tiered-{secrets.token_hex(6)}"
    try:
        summary = run_tiered_workload(
            memory_url,
            os.path.join(base, "fast"),
            plan,
            comm=SingleProcess(),
            iterations=iterations,
            out_dir=out_dir,
            cache="auto",
            keep="last",
            label=label or spec.name,
            site=site,
            emulate=spec.durable,
            emulate_local=None if spec.local_measured else spec.local,
            local_label=DISK if spec.local_measured else None,
            config=config,
            tmp=base,
            say=say,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
        with open_store(memory_url) as space:  # the emulated durable tier's bytes
            space.delete(space.list(""))
    return str(summary.run_id)
