"""One run on one rank, phase by phase (:class:`Run`), through the library's save pipeline.

Each iteration is one save as the library makes it: rank 0 takes the step's lease and every
rank learns the plan (a :class:`~ckptio.checkpoint.SavePlan`: the step, the attempt's token,
the layout); each process writes its share with the plan's
:class:`~ckptio.checkpoint.RankWriter` (N-N: a shard object per call; N-1: its region of the
shared object placed once, then a pwrite per shard object) from the streaming state source
(:class:`~ckptio.runner.synthetic.SyntheticState`: one recycled buffer per object in
flight); rank 0 commits with :func:`~ckptio.checkpoint.commit_step`, the commit every save
uses. What the runner adds is the timing, the trace and the restore."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from ckptio import errors, units
from ckptio import format as fmt
from ckptio import results as res
from ckptio.checkpoint import RankWriter, SavePlan, WriteOptions, commit_step, crc32c
from ckptio.checkpoint.write import Piece, SharedRegion
from ckptio.dist import Communicator, detect
from ckptio.lease import SaveLease
from ckptio.redact import redact, redact_url
from ckptio.registry import client_versions, emulation_url, open_store
from ckptio.runner.coldreads import check_cache, start_cold_reads
from ckptio.runner.records import (
    HOST,
    IterFigures,
    PhaseTimer,
    RunSummary,
    events_columns,
    gb_per_s,
    hosts_of,
    merge_columns,
    peak_rss,
    phase_row,
    request_table,
    run_rows,
    target_label,
)
from ckptio.runner.settings import RunSettings, check_layout, first_run_step, writer_ranks
from ckptio.runner.synthetic import DataGenerator, RecycledBuffers, SyntheticState
from ckptio.store import Store
from ckptio.workload import ObjectSpec, Plan

__all__ = ["Run", "bounded_map", "delete_run_step", "run_on", "run_workload"]

log = logging.getLogger(__name__)


@dataclass
class _Written:
    """What one process's write phase left behind."""

    report: dict[str, Any]
    """For rank 0's commit: ``ok`` and this process's ``chunks`` and ``objects``, or
    ``error``."""
    owned: dict[str, int]
    """Objects this process counts and deletes (a shared object: its owner only)."""
    failure: BaseException | None
    events: list[Any]
    """The write phase's requests."""


def bounded_map(
    pool: ThreadPoolExecutor, fn: Callable[[Any], Any], items: Iterator[Any], limit: int
) -> Iterator[Any]:
    """``pool.map`` that pulls at most ``limit`` items ahead (the items are lazy), yields
    results in order, and raises the first failure after the work in flight has ended."""
    pending: list[Any] = []
    first: BaseException | None = None
    for item in items:
        pending.append(pool.submit(fn, item))
        while len(pending) >= limit:
            try:
                yield pending.pop(0).result()
            except Exception as err:
                first = err
                break
        if first is not None:
            break
    for fut in pending:
        try:
            result = fut.result()
        except Exception as err:
            first = first or err
            continue
        if first is None:
            yield result
    if first is not None:
        raise first


def delete_run_step(store: Store, comm: Communicator, step: int, my_objects: Sequence[str]) -> None:
    """Remove one iteration's checkpoint: rank 0 deletes the manifest first, then every rank
    deletes its own objects (which also works for per-process stores such as memory://)."""
    prefix = fmt.step_dir(step) + "/"
    try:
        if comm.rank == 0:
            store.delete([fmt.manifest_key(step)])
    except errors.CkptioError as err:  # retention is best effort; a run never hangs on it
        log.warning("could not delete the manifest of step %d: %s", step, err)
    comm.barrier()
    try:
        store.delete([prefix + k for k in my_objects])
    except errors.CkptioError as err:
        log.warning(
            "could not delete the objects of step %d: %s (`ckptio gc` removes them)", step, err
        )


class Run:
    """One run on one rank, phase by phase: :meth:`prepare` once; per iteration
    :meth:`write`, :meth:`commit`, :meth:`restore` and :meth:`cleanup`; :meth:`release`
    whatever happens; :meth:`finish` (gather to rank 0, write the tables). Every rank runs
    the same phases; they meet in the collectives (barriers, gathers, broadcasts)."""

    def __init__(
        self, store: Store, url: str, plan: Plan, comm: Communicator, settings: RunSettings
    ) -> None:
        self.store, self.url, self.plan, self.comm, self.s = store, url, plan, comm, settings
        self.rank = comm.rank
        self.mine = writer_ranks(plan, comm.size)[self.rank]
        self.my_bytes = int(plan.rank_bytes[self.mine].sum()) if len(self.mine) else 0
        self.run_id = ""
        self.step0 = 0
        self.phase_rows: list[dict[str, Any]] = []
        self.request_parts: list[dict[str, list[Any]]] = []
        self.per_iter: list[IterFigures] = []
        self.written_steps: list[int] = []
        self.leases: list[SaveLease] = []  # rank 0's, one per iteration; all released at the end
        self.storage_layout: dict[str, Any] = {}  # rank 0: Store.file_layout of one object
        self.pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # the per-thread CPU seconds summed into an IterFigures
        # every iteration's data is laid out alike: one shard object per chunk
        self.options = WriteOptions(
            settings.layout, settings.key_layout, plan.object_size, plan.object_size
        )

    def execute(self) -> RunSummary:
        self.prepare()
        try:
            for it in range(self.s.iterations):
                info = IterFigures()
                save = self.plan_save(self.step0 + it)
                written = self.write(it, save, info)
                self.commit(it, save, written, info)
                if self.s.read:
                    self.restore(it, save.step, written, info)
                self.per_iter.append(info)
                self.cleanup(it, save.step, written)
        finally:
            self.release()
        return self.finish()

    # -- bookkeeping ---------------------------------------------------------------------
    def row(
        self, it: int, phase: str, timed: tuple[int, float, float, float], cache: str = "n/a"
    ) -> None:
        """A phases-table row of this rank: ``timed`` is (bytes, seconds, start, end)."""
        self.phase_rows.append(
            phase_row(self.run_id, self.s.label, self.rank, it, phase, timed, cache)
        )

    def milestone(self, it: int, phase: str, start: float, end: float) -> None:
        if self.s.say is not None and self.rank == 0:
            secs = end - start
            total = self.plan.total_bytes
            self.s.say(
                f"iteration {it + 1}/{self.s.iterations}: {phase} {units.human_bytes(total)} "
                f"in {secs:.3g} s, {gb_per_s(total, secs):.3g} GB/s"
            )

    # -- prepare -------------------------------------------------------------------------
    def prepare(self) -> None:
        """Check the cache mode, name the run and pick its first step (rank 0:
        :func:`first_run_step`; every rank learns both), make the state source (the data
        generator and the buffers) and the I/O pool."""
        store, s = self.store, self.s
        check_cache(store, s.cache)  # the same verdict on every rank, before any collective
        if self.rank == 0 and s.out_dir is not None and s.write_files:
            res.schema("run")  # load pyarrow now, so the peak RSS measured below includes it
        first = None
        if self.rank == 0:
            try:
                first = {
                    "run_id": s.run_id or res.new_run_id(s.label),
                    "step": first_run_step(store, share_root=s.share_root),
                    "seed": secrets.token_hex(8),
                }
            except errors.InvalidArgumentError as err:  # a root that is not the run's to use
                first = {"refused": str(err)}
            except errors.CkptioError as err:
                first = {"error": f"{type(err).__name__}: {err}"}
        first = self.comm.bcast(first, root=0)
        if "refused" in first:
            raise errors.InvalidArgumentError(first["refused"])
        if "error" in first:
            raise errors.SaveFailedError(
                f"cannot start the run on {redact_url(self.url)}: {first['error']}"
            )
        self.run_id, self.step0 = first["run_id"], int(first["step"])
        self.gen = DataGenerator(first["seed"])
        buffers = RecycledBuffers(s.inflight, self.plan.object_size)
        self.state = SyntheticState(self.plan, self.mine, self.gen, buffers)
        self.state.resolve_dtypes()
        self.metadata = {
            "workload": self.plan.preset.name,
            "scale": self.plan.scale,
            "layout": self.plan.layout.describe(),
            "synthetic": True,
            "generator": self.gen.name,
            "run_id": self.run_id,
        }
        self.prepared = self.state.prepared(self.metadata) if self.rank == 0 else None
        self.pool = ThreadPoolExecutor(s.inflight, thread_name_prefix="ckptio-runner")

    # -- plan ----------------------------------------------------------------------------
    def plan_save(self, step: int) -> SavePlan:
        """The iteration's save plan, as a save makes it: rank 0 takes the step's lease
        (before any rank writes: gc and retention leave the step alone) under a token every
        rank learns; every holder writes its box of every tensor."""
        token = ""
        if self.rank == 0:
            lease = SaveLease(self.store, step, secrets.token_hex(4), purpose="run").acquire()
            self.leases.append(lease)
            token = lease.token
        token = self.comm.bcast(token, root=0)
        writers = {} if self.prepared is None else dict.fromkeys(self.prepared.tensors, -1)
        return SavePlan(step, token, writers, self.options)

    # -- write ---------------------------------------------------------------------------
    def write(self, it: int, save: SavePlan, info: IterFigures) -> _Written:
        """Every rank generates its shard objects and writes them with the plan's writer, as
        shard objects (N-N) or at their places in the shared object (N-1), ``inflight`` at a
        time. A failure is kept for the commit, which tells every rank."""
        store, s, pool = self.store, self.s, self.pool
        assert pool is not None
        self.comm.barrier()
        outcomes: list[dict[str, Any]] = []
        region: SharedRegion | None = None  # N-1: this process's range, placed below
        writers = {int(r): RankWriter(store, save, int(r)) for r in self.mine}

        def write_one(item: tuple[ObjectSpec, int, SharedRegion | None]) -> dict[str, Any]:
            return self._write_object(item, it, writers, info)

        with PhaseTimer(store) as wphase:
            info.write_start = wphase.start
            failure: BaseException | None = None
            try:
                if s.layout == "file-per-shard":
                    items: Iterator[tuple[ObjectSpec, int, SharedRegion | None]] = (
                        (o, 0, None) for o in self.state.specs()
                    )
                else:  # collective: every process takes part, even one with no data
                    region, offsets = RankWriter(store, save, self.rank).place(
                        self.comm, (o.nbytes for o in self.state.specs())
                    )
                    items = (
                        (o, off, region) for o, off in zip(self.state.specs(), offsets, strict=True)
                    )
                for out in bounded_map(pool, write_one, items, s.inflight):
                    outcomes.append(out)
            except Exception as err:  # reported to every rank through the commit
                failure = err
            info.write_done = time.time()
        report: dict[str, Any] = {"ok": failure is None}
        owned: dict[str, int] = {}
        if failure is None:
            chunks: dict[str, list[Any]] = {}
            objects: dict[str, int] = {}
            for out in outcomes:
                for p, cs in out["chunks"].items():
                    chunks.setdefault(p, []).extend(cs)
                objects.update(out["objects"])
            report.update(chunks=chunks, objects=objects)
            # a shared object counts (and is deleted) once: by the lowest rank placed in it
            owned = objects if region is None else (objects if region.owner else {})
            info.objects = len(owned)
        else:
            report["error"] = f"{type(failure).__name__}: {failure}"
        info.bytes = self.my_bytes if failure is None else 0
        return _Written(report, owned, failure, wphase.events)

    def _write_object(
        self,
        item: tuple[ObjectSpec, int, SharedRegion | None],
        it: int,
        writers: dict[int, RankWriter],
        info: IterFigures,
    ) -> dict[str, Any]:
        """Generate one shard object into a recycled buffer and write it with its logical
        rank's writer (N-1: into this process's region); its chunks and objects."""
        spec, offset, shared = item

        def spent(seconds: float) -> None:
            with self._lock:
                info.gen_seconds += seconds

        writer = writers[spec.rank]
        with self.state.filled(spec, it, spent) as local:
            if shared is None:
                out = writer.objects([local], first_index=spec.number)
            else:  # N-1: this object's place in the shared object, durable on return
                piece = Piece(local.path, local.array, local.offsets)
                out = writer.pwrite(shared, [(piece, offset)])
        if self.s.progress is not None:
            self.s.progress(spec.nbytes)
        return out

    # -- commit --------------------------------------------------------------------------
    def commit(self, it: int, save: SavePlan, written: _Written, info: IterFigures) -> None:
        """Rank 0 gathers every process's chunks and commits the plan (the library's
        commit: the manifest validated as a reader will, published, the step listed); every
        rank learns the verdict, and a failed write or commit fails the run on every rank.
        Records the write, generate, flush and commit rows."""
        store, step = self.store, save.step
        gathered = self.comm.gather(written.report, root=0)
        with PhaseTimer(store) as cphase:
            verdict: dict[str, Any] = {}
            if self.rank == 0:
                assert gathered is not None and self.prepared is not None
                verdict = commit_step(
                    store, save, self.prepared, gathered, self.plan.ranks, lease=self.leases[-1]
                )
                self.leases[-1].release()
                if verdict.get("ok") and not self.storage_layout:
                    keys = [k for g in gathered for k in g.get("objects", {})]
                    if keys:  # what the storage made of one object (a PFS's striping)
                        self.storage_layout = store.describe().file_layout(
                            f"{fmt.step_dir(step)}/{keys[0]}"
                        )
        verdict = self.comm.bcast(verdict, root=0)
        if not verdict.get("ok"):
            raise errors.SaveFailedError(
                f"iteration {it} (step {step}) failed, nothing committed: {verdict.get('error')}"
            ) from written.failure
        self.comm.barrier()
        info.write_end = time.time()
        self.milestone(it, "write", info.write_start, info.write_end)
        self.written_steps.append(step)
        events = written.events + cphase.events
        self.request_parts.append(events_columns(events, "write", it, self.rank))
        start, done = info.write_start, info.write_done
        self.row(it, "generate", (info.bytes, info.gen_seconds, start, done))
        self.row(it, "write", (info.bytes, done - start, start, done))
        fs = [e for e in written.events if e.op == "fsync"]
        first_fs = min((e.start for e in fs), default=done)
        last_fs = max((e.end for e in fs), default=done)
        self.row(it, "flush", (info.bytes, sum(e.seconds for e in fs), first_fs, last_fs))
        if self.rank == 0:
            self.row(it, "commit", (0, cphase.end - cphase.start, cphase.start, cphase.end))

    # -- restore -------------------------------------------------------------------------
    def restore(self, it: int, step: int, written: _Written, info: IterFigures) -> None:
        """The restore of the checkpoint just committed (the newest), cold: every rank makes
        the coming reads miss the caches of its machine (:meth:`~ckptio.store.ColdReads.start`,
        as ``cache`` says), then, between barriers, reads its own shard objects back into
        recycled buffers and checks every chunk's CRC32C. Recorded as the ``read`` and
        ``verify`` phases, with how caches were bypassed."""
        store, pool = self.store, self.pool
        assert pool is not None
        mine_objects = [
            (c["key"], c) for cs in written.report.get("chunks", {}).values() for c in cs
        ]
        keys = list(dict.fromkeys(k for k, _ in mine_objects))
        mode = info.cache = start_cold_reads(store, step, keys, self.s.cache)
        self.comm.barrier()

        def read_one(item: tuple[str, dict[str, Any]]) -> int:
            return self._read_chunk(item, step, info)

        with PhaseTimer(store) as rphase:
            rfail: BaseException | None = None
            try:
                nread = sum(bounded_map(pool, read_one, iter(mine_objects), self.s.inflight))
            except Exception as err:
                rfail, nread = err, 0
            info.read_start = rphase.start
            rdone = info.read_done = time.time()
        if not store.describe().cold_reads.end():
            # the filesystem refused O_DIRECT during the reads and the store fell back to
            # buffered reads: they may have come from the page cache; say so
            mode = info.cache = "none"
        oks = self.comm.gather(
            {"ok": rfail is None, "error": f"{type(rfail).__name__}: {rfail}" if rfail else ""},
            root=0,
        )
        report = self.comm.bcast([o["error"] for o in oks if not o["ok"]] if oks else None, root=0)
        if report:
            raise errors.CorruptCheckpointError(
                f"iteration {it}: read-back failed: {'; '.join(report)}"
            ) from rfail
        self.comm.barrier()
        info.read_end = time.time()
        self.milestone(it, "read", rphase.start, info.read_end)
        self.request_parts.append(events_columns(rphase.events, "read", it, self.rank))
        self.row(it, "read", (nread, rdone - rphase.start, rphase.start, rdone), mode)
        self.row(it, "verify", (nread, info.verify_seconds, rphase.start, rdone))

    def _read_chunk(self, item: tuple[str, dict[str, Any]], step: int, info: IterFigures) -> int:
        """Read one chunk into a recycled buffer and check its CRC32C; bytes read."""
        rel, chunk = item
        store = self.store
        key = f"{fmt.step_dir(step)}/{rel}"
        buf = self.state.buffers.take()
        try:
            view = buf.data[: chunk["length"]]  # offset: in the object, not the buffer
            t0 = time.perf_counter()
            n = store.read_into(key, chunk["offset"], view)
            t1 = time.perf_counter()
            if n != chunk["length"]:
                raise errors.CorruptCheckpointError(
                    f"{redact_url(store.url)}/{key}: {n} bytes read, "
                    f"{chunk['length']} expected (truncated object)"
                )
            got = crc32c(view)
            t2 = time.perf_counter()
            if got != chunk["crc32c"]:
                raise errors.ChecksumError(
                    f"{redact_url(store.url)}/{key}: CRC32C mismatch in bytes "
                    f"{chunk['offset']}..{chunk['offset'] + chunk['length']} "
                    f"(expected {chunk['crc32c']:#010x}, read {got:#010x})"
                )
        finally:
            self.state.buffers.give(buf)
        with self._lock:
            info.read_io_seconds += t1 - t0
            info.verify_seconds += t2 - t1
        if self.s.progress is not None:
            self.s.progress(chunk["length"])
        return n

    # -- cleanup -------------------------------------------------------------------------
    def cleanup(self, it: int, step: int, written: _Written) -> None:
        """Retention (``keep``) and the pause before the next iteration."""
        s = self.s
        if s.keep == "none" or (s.keep == "last" and it < s.iterations - 1):
            delete_run_step(self.store, self.comm, step, list(written.owned))
        if s.pause and it < s.iterations - 1:
            time.sleep(s.pause)

    def release(self) -> None:
        """Whatever happened: every lease released, the I/O pool shut down."""
        for lease in self.leases:
            lease.release()
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    # -- finish --------------------------------------------------------------------------
    def finish(self) -> RunSummary:
        """Gather every rank's figures to rank 0, which builds the three tables and writes
        them (with the sidecar) under ``out_dir``."""
        s, store, plan, comm = self.s, self.store, self.plan, self.comm
        mine_summary: dict[str, Any] = {
            "phases": self.phase_rows,
            "requests": merge_columns(self.request_parts),
            "iters": [vars(i) for i in self.per_iter],
            "peak_rss": peak_rss(),
            "host": HOST,
        }
        everything = comm.gather(mine_summary, root=0)
        summary = RunSummary(
            self.run_id,
            self.rank,
            phases=self.phase_rows,
            generator=self.gen.name,
            steps=self.written_steps,
            url=redact_url(self.url),
            target_path=store.describe().local_path,
            cache=self.per_iter[-1].cache if self.per_iter else "",
            client_versions=client_versions(self.url),
        )
        if self.rank != 0:
            summary.peak_rss_bytes = [mine_summary["peak_rss"]]
            return summary
        assert everything is not None
        all_phases = [r for e in everything for r in e["phases"]]
        reqs, n = request_table(everything, self.run_id, s.label)
        runs = run_rows(
            plan,
            everything,
            reqs,
            s,
            run_id=self.run_id,
            url=self.url,
            store=store,
            comm_size=comm.size,
        )
        summary.runs = runs
        summary.phases = all_phases
        summary.requests = n
        summary.peak_rss_bytes = [int(e["peak_rss"]) for e in everything]
        summary.tables = {"requests": reqs, "phases": all_phases, "runs": runs}
        summary.hosts = hosts_of(everything)
        if s.out_dir is not None and s.write_files:
            summary.paths = res.write_run(
                s.out_dir,
                requests=res.table("requests", reqs),
                phases=res.table("phases", all_phases),
                runs=res.table("run", runs),
                sidecar=self._sidecar(summary),
            )
        return summary

    def _sidecar(self, summary: RunSummary) -> dict[str, Any]:
        """The run's JSON sidecar: configuration, machine, versions (the store's clients')."""
        s, plan, comm = self.s, self.plan, self.comm
        return res.sidecar(
            self.run_id,
            config={
                "url": self.url,
                "preset": plan.preset.name,
                "scale": plan.scale,
                "layout": plan.layout.describe(),
                "gpus": plan.ranks,
                "ranks": comm.size,
                "iterations": s.iterations,
                "object_size": plan.object_size,
                "inflight": s.inflight,
                "cache": s.cache,
                "keep": s.keep,
                "key_layout": s.key_layout,
                "checkpoint_layout": s.layout,
                "pause": s.pause,
                "store_options": s.options,
                **s.config,
            },
            target_path=self.store.describe().local_path,
            emulated=s.emulated,
            profile=s.profile,
            mock=s.mock,
            labels={"target": s.label, "site": s.site or ""},
            extra={
                "generator": self.gen.name,
                "peak_rss_bytes": summary.peak_rss_bytes,
                "steps": self.written_steps,
                "cache_bypass": summary.cache,
                "communicator": type(comm).__name__,
                "hosts": summary.hosts,
                "storage_layout": self.storage_layout,
            },
            client_versions=summary.client_versions,
        )


def run_workload(
    url: str,
    plan: Plan,
    settings: RunSettings | None = None,
    comm: Communicator | None = None,
) -> RunSummary:
    """Run ``plan`` against ``url`` as ``settings`` say (default: one iteration, with the
    restore) on every rank of ``comm`` (default: detected from the launcher). Every rank calls
    this with the same arguments. Rank 0 writes the result files under ``settings.out_dir``
    (when given and ``write_files``) and returns the complete :class:`RunSummary`."""
    s = settings if settings is not None else RunSettings()
    comm = comm if comm is not None else detect()
    if comm.size > plan.ranks:
        raise errors.InvalidArgumentError(
            f"{comm.size} ranks exceed the plan's {plan.ranks} GPUs; use at most {plan.ranks} "
            "ranks or more GPUs (--gpus)"
        )
    options = dict(s.options)
    target_url = url
    if s.emulate:
        target_url = emulation_url(url)
        options["profile"] = s.emulate
        options.setdefault("ranks", comm.size)  # the processes share aggregate limits
    profile = s.emulate or str(options.get("profile", ""))
    store = open_store(target_url, **options)
    try:
        check_layout(store, s.layout, url)  # the same verdict on every rank, before any collective
        s = replace(
            s,
            options=options,
            label=redact(s.label) if s.label else target_label(url, s.emulate, s.layout),
            emulated=store.describe().emulated,
            profile=profile,
        )
        return run_on(store, url, plan, comm, s)
    finally:
        store.close()


def run_on(
    store: Store, url: str, plan: Plan, comm: Communicator, settings: RunSettings
) -> RunSummary:
    """Run ``plan`` on the open ``store`` (``url``: how the user named it) on this rank."""
    return Run(store, url, plan, comm, settings).execute()
