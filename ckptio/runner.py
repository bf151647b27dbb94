"""Run a checkpoint plan against a store, phase by phase, on every rank, and record it.

Every rank (process) calls :func:`run_workload` with the same arguments. The logical ranks
(GPUs) of the plan that write something are dealt round-robin over the processes, so 4
processes can play the 1,024 GPUs of ``llama3-1t`` (each writes the shards of 256 of them).

One iteration::

    barrier                                     (all ranks)
    write:   for each of my shard objects, in a pool of ``inflight`` workers:
             generate synthetic data into a recycled buffer (AES-CTR keystream: incompressible
             and unique per object, so compression and deduplication gain nothing), write it
             through ckptio's own shard writer (CRC32C of every chunk), close = durable
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

Each phase is a method of the run object (:class:`_Run`: ``prepare``, then per iteration
``write``, ``commit``, ``restore``, ``cleanup``, and ``finish``), and the run's parameters are
one :class:`RunSettings`. The restore is recorded as the ``read`` and ``verify`` phases and
the runs table's ``read_*`` columns; it times the data (what a restore reads), not finding
the newest step and reading its manifest.

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
``shared-file-per-node`` use the library's N-1 code (:func:`ckptio.checkpoint.place_shared_region`,
``pwrite_pieces``): at the start of the write phase rank 0 places every process's byte range
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

import hashlib
import logging
import os
import queue
import resource
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ckptio import errors, units
from ckptio import format as fmt
from ckptio import results as res
from ckptio.checkpoint import (
    LAYOUTS,
    LocalTensor,
    Piece,
    PreparedState,
    SharedRegion,
    commit_step,
    crc32c,
    pack_pieces,
    place_shared_region,
    pwrite_pieces,
    read_manifest,
    write_rank_shards,
)
from ckptio.dist import Communicator, detect
from ckptio.lease import SaveLease, StorageClock, is_lease_key, read_lease
from ckptio.redact import redact, redact_url
from ckptio.registry import backend_for, client_versions, emulation_url, open_store, split_url
from ckptio.store import Store
from ckptio.units import (
    parse_size,
)
from ckptio.workload import ObjectSpec, Plan

__all__ = [
    "CACHE_MODES",
    "DEFAULT_SWEEP_MEMORY",
    "GEN_BLOCK",
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
    "run_workload",
    "sweep",
    "sweep_points",
    "sweep_warnings",
    "writer_ranks",
]

log = logging.getLogger(__name__)

CACHE_MODES = ("auto", "o_direct", "fadvise", "drop_caches", "none")
"""How the restore bypasses the page cache. ``auto``: O_DIRECT where the store can read that
way, else ``posix_fadvise(DONTNEED)`` of each object (the store's
:attr:`~ckptio.store.ColdReads.modes` of its description); stores without a local page cache (object
stores, memory) record ``n/a``."""

KEEP = ("last", "all", "none")
"""Which iterations' checkpoints stay on the target after the run."""

GEN_BLOCK = 1 << 20
"""Bytes generated per call of the keystream (small enough to stay in cache)."""

_ZEROS = bytes(GEN_BLOCK)


# -- synthetic data ---------------------------------------------------------------------------


class DataGenerator:
    """Fills buffers with incompressible bytes, unique per (run, iteration, rank, object).

    AES-256-CTR keystream (``cryptography``; ~4-7 GB/s per core) with a key derived from the
    object's identity; without ``cryptography``, numpy's PCG64 (~2.8 GB/s per core). Buffers
    must have :data:`SLACK` spare bytes after the part filled (AES ``update_into``)."""

    SLACK = 16

    def __init__(self, seed: str) -> None:
        self.seed = seed.encode()
        try:
            from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        except ImportError:
            self.name = "pcg64"
            self._cipher = None
        else:
            self.name = "aes-ctr"
            self._cipher = (Cipher, algorithms, modes)

    def fill(self, buf: np.ndarray, nbytes: int, ident: str) -> None:
        """Fill ``buf[:nbytes]`` with the stream of ``ident`` (``buf`` has SLACK more bytes)."""
        view = buf.data
        for _ in self._stream(nbytes, ident, lambda off, k: view[off : off + k + self.SLACK]):
            pass

    def matches(self, buf: np.ndarray, nbytes: int, ident: str) -> bool:
        """Whether ``buf[:nbytes]`` holds the stream of ``ident`` (generated again, a block at
        a time: no second copy of the whole)."""
        scratch = np.empty(GEN_BLOCK + self.SLACK, dtype=np.uint8)
        data = buf.reshape(-1).view(np.uint8)[:nbytes]
        for off, k in self._stream(nbytes, ident, lambda off, k: scratch.data):
            if not np.array_equal(scratch[:k], data[off : off + k]):
                return False
        return True

    def _stream(
        self, nbytes: int, ident: str, place: Callable[[int, int], memoryview]
    ) -> Iterator[tuple[int, int]]:
        """Generate the stream of ``ident`` a block at a time into ``place(offset, length)``
        (a buffer of length + SLACK bytes), yielding each block's offset and length."""
        key = hashlib.blake2b(self.seed + b"/" + ident.encode(), digest_size=32).digest()
        if self._cipher is not None:
            cipher, algorithms, modes = self._cipher
            enc = cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
            for off in range(0, nbytes, GEN_BLOCK):
                k = min(GEN_BLOCK, nbytes - off)
                enc.update_into(_ZEROS[:k], place(off, k))
                yield off, k
            return
        bitgen = np.random.PCG64(int.from_bytes(key[:16], "little"))
        for off in range(0, nbytes, GEN_BLOCK):
            k = min(GEN_BLOCK, nbytes - off)
            words = bitgen.random_raw(-(-k // 8)).view(np.uint8)
            np.frombuffer(place(off, k), dtype=np.uint8)[:k] = words[:k]
            yield off, k


class _Buffers:
    """A fixed set of reusable buffers: what bounds a rank's memory."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        for _ in range(count):
            self._free.put(np.empty(size + DataGenerator.SLACK, dtype=np.uint8))

    def take(self) -> np.ndarray:
        return self._free.get()

    def give(self, buf: np.ndarray) -> None:
        self._free.put(buf)


# -- results of one run -----------------------------------------------------------------------


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


def _peak_rss() -> int:
    """This process's resident-set high-water mark in bytes (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


HOST = socket.gethostname()
"""This process's node, as every phase and request row names it (``host``)."""


def _events_columns(
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


def _merge_columns(parts: Sequence[dict[str, list[Any]]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for p in parts:
        for k, v in p.items():
            out.setdefault(k, []).extend(v)
    return out


# -- the run ----------------------------------------------------------------------------------


def writer_ranks(plan: Plan, size: int) -> list[np.ndarray]:
    """Logical ranks that write, dealt round-robin over ``size`` processes."""
    writers = np.flatnonzero(plan.rank_bytes > 0)
    return [writers[p::size] for p in range(size)]


def _target_label(url: str, emulate: str | None, layout: str = "file-per-shard") -> str:
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
class _Iter:
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


def _tensor_path(rank: int, component: str) -> str:
    return f"rank-{rank:05d}/{component}"


def _synthetic_prepared(plan: Plan, metadata: dict[str, Any]) -> PreparedState:
    """The state description rank 0 commits: per writing logical rank a ``model`` (bf16) and
    an ``optim`` (fp32) tensor, flat, holding that rank's share."""
    tensors: dict[str, LocalTensor] = {}
    tree: dict[str, Any] = {}
    for r in np.flatnonzero(plan.rank_bytes > 0).tolist():
        sub: dict[str, Any] = {}
        for comp, elems, dtype in (
            ("model", plan.model_elements[r], "bfloat16"),
            ("optim", plan.optim_elements[r], "float32"),
        ):
            if elems <= 0:
                continue
            path = _tensor_path(r, comp)
            tensors[path] = LocalTensor(
                path, np.empty(0, dtype=fmt.DTYPES[dtype]), (int(elems),), (0,), replicated=False
            )
            sub[comp] = {"t": path}
        tree[f"rank-{r:05d}"] = {"d": sub}
    return PreparedState({"d": tree}, tensors, metadata)


@dataclass
class RunSettings:
    """How a run goes: every option of :func:`run_workload` (and :func:`sweep`), checked when
    made, and what the run derived from the target (``emulated``, ``profile``, ``label``):
    the one object every phase of :class:`_Run` reads."""

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
            label=redact(s.label) if s.label else _target_label(url, s.emulate, s.layout),
            emulated=store.describe().emulated,
            profile=profile,
        )
        return _run(store, url, plan, comm, s)
    finally:
        store.close()


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


def _run(
    store: Store, url: str, plan: Plan, comm: Communicator, settings: RunSettings
) -> RunSummary:
    """Run ``plan`` on the open ``store`` (``url``: how the user named it) on this rank."""
    return _Run(store, url, plan, comm, settings).execute()


class _Phase:
    """Times one phase of one rank and collects the trace events it caused."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> _Phase:
        self.store.trace.clear()
        self.start = time.time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = time.time()
        self.events = self.store.trace.events()
        self.store.trace.clear()


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


class _Run:
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
        self.per_iter: list[_Iter] = []
        self.written_steps: list[int] = []
        self.leases: list[SaveLease] = []  # rank 0's, one per iteration; all released at the end
        self.storage_layout: dict[str, Any] = {}  # rank 0: Store.file_layout of one object
        self.pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # the per-thread CPU seconds summed into an _Iter

    def execute(self) -> RunSummary:
        self.prepare()
        try:
            for it in range(self.s.iterations):
                step = self.step0 + it
                info = _Iter()
                token = secrets.token_hex(4)
                written = self.write(it, step, token, info)
                self.commit(it, step, token, written, info)
                if self.s.read:
                    self.restore(it, step, written, info)
                self.per_iter.append(info)
                self.cleanup(it, step, written)
        finally:
            self.release()
        return self.finish()

    # -- bookkeeping ---------------------------------------------------------------------
    def row(
        self,
        it: int,
        phase: str,
        nbytes: int,
        seconds: float,
        start: float,
        end: float,
        cache_mode: str = "n/a",
    ) -> None:
        self.phase_rows.append(
            {
                "run_id": self.run_id,
                "target": self.s.label,
                "rank": self.rank,
                "iteration": it,
                "phase": phase,
                "bytes": int(nbytes),
                "seconds": float(seconds),
                "start": float(start),
                "end": float(end),
                "cache": cache_mode,
                "host": HOST,
            }
        )

    def milestone(self, it: int, phase: str, start: float, end: float) -> None:
        if self.s.say is not None and self.rank == 0:
            secs = end - start
            total = self.plan.total_bytes
            self.s.say(
                f"iteration {it + 1}/{self.s.iterations}: {phase} {units.human_bytes(total)} "
                f"in {secs:.3g} s, {_gb_per_s(total, secs):.3g} GB/s"
            )

    # -- prepare -------------------------------------------------------------------------
    def prepare(self) -> None:
        """Check the cache mode, name the run and pick its first step (rank 0:
        :func:`first_run_step`; every rank learns both), make the data generator, the buffers
        and the I/O pool."""
        store, s = self.store, self.s
        _valid_cache(store, s.cache)  # the same verdict on every rank, before any collective
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
        # what the writes look up on first need is resolved now, outside every timed phase:
        # a bfloat16 weight imports ml_dtypes (about a second on a busy 2-core machine), which
        # would otherwise land in the first iteration's write time
        for r in self.mine:
            for spec in self.plan.rank_objects(int(r)):
                fmt.DTYPES[spec.dtype]
                break
        self.buffers = _Buffers(s.inflight, self.plan.object_size)
        self.metadata = {
            "workload": self.plan.preset.name,
            "scale": self.plan.scale,
            "layout": self.plan.layout.describe(),
            "synthetic": True,
            "generator": self.gen.name,
            "run_id": self.run_id,
        }
        self.pool = ThreadPoolExecutor(s.inflight, thread_name_prefix="ckptio-runner")

    # -- write ---------------------------------------------------------------------------
    def write(self, it: int, step: int, token: str, info: _Iter) -> _Written:
        """Every rank generates its shard objects and writes them through the library's
        shard writer (N-N), or pwrites them at their places in the shared object (N-1),
        ``inflight`` at a time. A failure is kept for the commit, which tells every rank."""
        store, s, pool = self.store, self.s, self.pool
        assert pool is not None
        if self.rank == 0:  # before any rank writes: gc and retention leave the step alone
            self.leases.append(SaveLease(store, step, token, purpose="run").acquire())
        self.comm.barrier()
        outcomes: list[dict[str, Any]] = []
        region: SharedRegion | None = None  # N-1: this process's range, placed below

        def my_specs() -> Iterator[ObjectSpec]:
            return (o for r in self.mine for o in self.plan.rank_objects(int(r)))

        def write_one(item: tuple[ObjectSpec, int, SharedRegion | None]) -> dict[str, Any]:
            return self._write_object(item, it, step, token, info)

        with _Phase(store) as wphase:
            info.write_start = wphase.start
            failure: BaseException | None = None
            try:
                if s.layout == "file-per-shard":
                    items: Iterator[tuple[ObjectSpec, int, SharedRegion | None]] = (
                        (o, 0, None) for o in my_specs()
                    )
                else:  # collective: every process takes part, even one with no data
                    offsets, need = pack_pieces(o.nbytes for o in my_specs())
                    region = place_shared_region(
                        store,
                        step,
                        self.comm,
                        token,
                        need,
                        per_node=s.layout == "shared-file-per-node",
                    )
                    items = ((o, off, region) for o, off in zip(my_specs(), offsets, strict=True))
                for out in _bounded_map(pool, write_one, items, s.inflight):
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
        step: int,
        token: str,
        info: _Iter,
    ) -> dict[str, Any]:
        """Generate one shard object into a recycled buffer and write it; its chunks."""
        spec, offset, shared = item
        plan = self.plan
        buf = self.buffers.take()
        try:
            t0 = time.thread_time()  # CPU seconds: the cost per core, not the wait
            self.gen.fill(buf, spec.nbytes, f"{it}/{spec.rank}/{spec.component}/{spec.index}")
            t1 = time.thread_time()
            dtype = fmt.DTYPES[spec.dtype]
            arr = buf[: spec.nbytes].view(dtype)
            total = (
                int(plan.model_elements[spec.rank])
                if spec.component == "model"
                else int(plan.optim_elements[spec.rank])
            )
            local = LocalTensor(
                _tensor_path(spec.rank, spec.component),
                arr,
                (total,),
                (spec.element_offset,),
                replicated=False,
            )
            if shared is None:
                out = write_rank_shards(
                    self.store,
                    step,
                    spec.rank,
                    token,
                    [local],
                    key_layout=self.s.key_layout,
                    chunk_size=plan.object_size,
                    max_object_size=plan.object_size,
                    first_index=spec.number,
                )
            else:  # N-1: this object's place in the shared object, durable on return
                piece = Piece(local.path, arr, local.offsets)
                out = {
                    "chunks": pwrite_pieces(self.store, step, shared, [(piece, offset)]),
                    "objects": {shared.key: shared.size},
                }
        finally:
            self.buffers.give(buf)
        with self._lock:
            info.gen_seconds += t1 - t0
        if self.s.progress is not None:
            self.s.progress(spec.nbytes)
        return out

    # -- commit --------------------------------------------------------------------------
    def commit(self, it: int, step: int, token: str, written: _Written, info: _Iter) -> None:
        """Rank 0 gathers every process's chunks, validates them and publishes the manifest
        (the library's commit); every rank learns the verdict, and a failed write or commit
        fails the run on every rank. Records the write, generate, flush and commit rows."""
        store = self.store
        gathered = self.comm.gather(written.report, root=0)
        with _Phase(store) as cphase:
            verdict: dict[str, Any] = {}
            if self.rank == 0:
                assert gathered is not None
                prepared = _synthetic_prepared(self.plan, self.metadata)
                # the token names rank 0's shared object: a failed commit finds it by it
                plan_doc = {"writers": {p: -1 for p in prepared.tensors}, "token": token}
                verdict = commit_step(
                    store,
                    step,
                    prepared,
                    plan_doc,
                    gathered,
                    self.plan.ranks,
                    self.s.layout,
                    self.s.key_layout,
                    lease=self.leases[-1],
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
        self.request_parts.append(_events_columns(events, "write", it, self.rank))
        start, done = info.write_start, info.write_done
        self.row(it, "generate", info.bytes, info.gen_seconds, start, done)
        self.row(it, "write", info.bytes, done - start, start, done)
        fs = [e for e in written.events if e.op == "fsync"]
        self.row(
            it,
            "flush",
            info.bytes,
            sum(e.seconds for e in fs),
            min((e.start for e in fs), default=done),
            max((e.end for e in fs), default=done),
        )
        if self.rank == 0:
            self.row(it, "commit", 0, cphase.end - cphase.start, cphase.start, cphase.end)

    # -- restore -------------------------------------------------------------------------
    def restore(self, it: int, step: int, written: _Written, info: _Iter) -> None:
        """The restore of the checkpoint just committed (the newest), cold: every rank makes
        the coming reads miss the caches of its machine (:meth:`~ckptio.store.ColdReads.start`,
        as ``cache`` says), then, between barriers, reads its own shard objects back into
        recycled buffers and checks every chunk's CRC32C. Recorded as the ``read`` and
        ``verify`` phases, with how caches were bypassed."""
        store, pool = self.store, self.pool
        assert pool is not None
        mine_objects = [
            (k, c)
            for p, cs in written.report.get("chunks", {}).items()
            for c in cs
            for k in [c["key"]]
        ]
        mode = _start_cold_reads(
            store, step, list(dict.fromkeys(k for k, _ in mine_objects)), self.s.cache
        )
        info.cache = mode
        self.comm.barrier()

        def read_one(item: tuple[str, dict[str, Any]]) -> int:
            return self._read_chunk(item, step, info)

        with _Phase(store) as rphase:
            rfail: BaseException | None = None
            try:
                nread = sum(_bounded_map(pool, read_one, iter(mine_objects), self.s.inflight))
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
        self.request_parts.append(_events_columns(rphase.events, "read", it, self.rank))
        self.row(it, "read", nread, rdone - rphase.start, rphase.start, rdone, mode)
        self.row(it, "verify", nread, info.verify_seconds, rphase.start, rdone)

    def _read_chunk(self, item: tuple[str, dict[str, Any]], step: int, info: _Iter) -> int:
        """Read one chunk into a recycled buffer and check its CRC32C; bytes read."""
        rel, chunk = item
        store = self.store
        key = f"{fmt.step_dir(step)}/{rel}"
        buf = self.buffers.take()
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
            self.buffers.give(buf)
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
            _delete_step(self.store, self.comm, step, list(written.owned))
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
            "requests": _merge_columns(self.request_parts),
            "iters": [vars(i) for i in self.per_iter],
            "peak_rss": _peak_rss(),
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
        reqs = _merge_columns([e["requests"] for e in everything])
        n = len(reqs.get("op", []))
        reqs.update(
            run_id=[self.run_id] * n,
            target=[s.label] * n,
            seconds=[
                e - b for b, e in zip(reqs.get("start", []), reqs.get("end", []), strict=True)
            ],
        )
        if n == 0:
            reqs = {c: [] for c, _ in res.REQUEST_COLUMNS}
        runs = _run_rows(
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
            side = self._sidecar(summary)
            summary.paths = res.write_run(
                s.out_dir,
                requests=res.table("requests", reqs),
                phases=res.table("phases", all_phases),
                runs=res.table("run", runs),
                sidecar=side,
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


def _bounded_map(
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


def _start_cold_reads(store: Store, step: int, keys: Sequence[str], cache: str) -> str:
    """Make the coming reads miss the page cache; return how (a :data:`CACHE_MODES` value
    other than auto, or ``n/a`` for stores without a local page cache). The store's
    :meth:`ColdReads.end <ckptio.store.ColdReads.end>` follows the reads."""
    prefix = fmt.step_dir(step) + "/"
    cold = store.describe().cold_reads
    modes = cold.modes
    has_direct, has_fadvise = "o_direct" in modes, "fadvise" in modes
    if cache == "none":
        return "none"
    if cache in ("auto", "o_direct") and has_direct:
        return cold.start([prefix + k for k in keys], "o_direct")
    if cache == "o_direct":
        raise errors.InvalidArgumentError(
            f"{store.name}:// cannot read with O_DIRECT; "
            f"valid cache modes here: {_valid_modes(store)}"
        )
    if cache in ("auto", "fadvise") and has_fadvise:
        done = cold.start([prefix + k for k in keys], "fadvise")
        if done:
            return done  # "fadvise", or "none": only some objects could be dropped
        has_fadvise = False  # e.g. an emulated store over memory: no page cache to drop
    if cache == "drop_caches":
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
        except OSError as err:
            raise errors.StoragePermissionError(
                f"cannot drop the page cache ({err}); it needs root. Valid cache modes here: "
                f"{_valid_modes(store)}"
            ) from err
        return "drop_caches"
    if cache == "fadvise":
        raise errors.InvalidArgumentError(
            f"{store.name}:// has no local page cache to advise; "
            f"valid cache modes here: {_valid_modes(store)}"
        )
    return "n/a" if not (has_direct or has_fadvise) else "none"


def _valid_cache(store: Store, cache: str) -> None:
    modes = store.describe().cold_reads.modes
    if cache == "o_direct" and "o_direct" not in modes:
        raise errors.InvalidArgumentError(
            f"{store.name}:// cannot read with O_DIRECT; "
            f"valid cache modes here: {_valid_modes(store)}"
        )
    if cache == "fadvise" and "fadvise" not in modes:
        raise errors.InvalidArgumentError(
            f"{store.name}:// has no local page cache to advise; "
            f"valid cache modes here: {_valid_modes(store)}"
        )


def _valid_modes(store: Store) -> str:
    modes = ["auto", "none"]
    offered = store.describe().cold_reads.modes
    if "o_direct" in offered:
        modes.append("o_direct")
    if "fadvise" in offered:
        modes.append("fadvise")
    modes.append("drop_caches (root)")
    return ", ".join(modes)


def _delete_step(store: Store, comm: Communicator, step: int, my_objects: Sequence[str]) -> None:
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


def hosts_of(everything: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """Host -> the ranks that ran there, from every rank's gathered summary (in rank order):
    the sidecar's ``hosts``."""
    out: dict[str, list[int]] = {}
    for rank, e in enumerate(everything):
        out.setdefault(str(e.get("host", "")), []).append(rank)
    return out


def _gb_per_s(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def _run_rows(
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
            (_gb_per_s(i["bytes"], i["write_done"] - i["write_start"]) for i in writers),
            default=0.0,
        )
        min_r = min(
            (
                _gb_per_s(i["bytes"], i["read_done"] - i["read_start"])
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
                "write_GBps": _gb_per_s(total, write_s),
                "min_rank_write_GBps": min_w,
                "read_seconds": read_s,
                "read_GBps": _gb_per_s(total, read_s) if read_s else 0.0,
                "min_rank_read_GBps": min_r,
                "requests": int(sel.sum()),
                "retries": int((outcomes == "retry").sum()),
                "throttled": int((outcomes == "throttled").sum()),
                "errors": int((outcomes == "error").sum()),
                "generate_GBps": _gb_per_s(total, gen_s),
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


# -- sweeps -----------------------------------------------------------------------------------


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
            requests=res.table("requests", _merge_columns(tables["requests"])),
            phases=res.table("phases", tables["phases"]),
            runs=res.table("run", tables["runs"]),
            sidecar=side,
        )
    return merged


# -- entry point for local-process ranks ------------------------------------------------------


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
