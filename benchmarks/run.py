#!/usr/bin/env python
"""ckptio against its peers on one local disk: the same bytes, the same directory, alternating,
several rounds; prints medians and the ratios between them and writes JSON + Markdown.

::

    python benchmarks/run.py --size 3GiB --rounds 5 --dir /var/tmp/ckptio-bench

Cases (every write is durable: fsynced before its clock stops):

- ``fio-write`` / ``fio-read``: fio sequential write / read, O_DIRECT, bs 4 MiB, 2 jobs,
  iodepth 16 (libaio, else io_uring), fio's defaults otherwise (it preallocates files);
  ``fio-write-nofalloc`` is the same write with ``--fallocate=none`` (new files written as
  ckptio writes them). fio's own bandwidth figure is used (its start-up is not counted).
  ``fio-write-hugepages`` / ``fio-read-hugepages`` (diagnostic): the same with buffers on
  hugetlb pages (``--iomem=shmhuge``), the disk's limit; they run where enough are reserved.
- ``torch-dcp``: ``torch.distributed.checkpoint.save`` with
  ``FileSystemWriter(thread_count=4, sync_files=True)``.
- ``safetensors``: ``safetensors.torch.save_file`` + fsync; ``safetensors-load``: cold
  ``load_file`` (mmap-backed) and a touch of every page, which is when its bytes are read.
- ``torch-save``: ``torch.save`` + fsync.
- ``ckptio-sync``: ``ckptio.save(state, "file://...", step)`` (defaults).
- ``ckptio-async``: ``Checkpointer(async_save=True)``, its second save timed (the first,
  untimed, allocates the snapshot memory): ``blocking`` is what ``save`` held the caller,
  ``seconds`` until committed; the Checkpointer is closed after the case.
  ``ckptio-async-numpy-copy`` (diagnostic): the same with the snapshot copied by
  ``numpy.copyto`` instead of ckptio's streaming-store copy.
- ``ckptio-async-fork``: the same with ``snapshot="fork"`` (a copy-on-write child process
  writes); also times writing every page of the state while the child writes, after it
  ended, and with no snapshot: the cost the fork moves out of ``save`` into the training step.
- ``ckptio-load``: cold ``ckptio.load`` (page cache dropped first), every CRC32C checked.
- ``ckptio-load-hugetlb``: the same load with ``hugetlb=True``: its new arrays on pages of the
  hugetlb pool (run only where the pool has the pages free).
- ``ckptio-load-hugetlb-depth8`` (diagnostic): the same with ``read_depth=8``, the number of
  O_DIRECT reads in flight before it became 16: what the deeper queue buys, side by side.
- ``ckptio-load-into``: the same load into arrays the process already holds
  (``ckptio.load(url, into=state)``, as torch DCP loads and a resumed job restores): numpy's
  own arrays, made and written untimed before the case and freed after it.
- ``memcpy``: one single-threaded copy of the state into memory already touched: the
  reference for the async blocking time. ``memcpy-fresh`` copies into new memory of 4 KiB
  pages (as ``ckptio.load`` allocates), ``memcpy-fresh-numpy`` into numpy's new memory.
- ``manifest-100k``: ``parse_manifest`` (JSON + validation) of a 100,000-chunk manifest.

The state is ``--tensors`` float32 tensors of random (incompressible) bytes, sizes varying
around their mean, plus a few small ones; torch peers see the same memory
(``torch.from_numpy``). Peers that are not installed are skipped and listed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as cm

import ckptio

try:
    from ckptio import manifest as mf
except ImportError:  # a revision before ckptio.manifest (benchmarks/revisions.py runs old trees)
    from ckptio import format as mf  # type: ignore[no-redef]
from ckptio.units import human_bytes, parse_size

ROW = 4096
"""float32 elements per row of the large tensors (a hidden size)."""


# -- the state --------------------------------------------------------------------------------


def make_state(nbytes: int, tensors: int, seed: int = 0) -> dict[str, Any]:
    """About ``nbytes`` of float32 tensors (random bits), ``tensors`` large ones of 0.5-1.5x
    the mean size, plus small biases; a flat dict (what every peer accepts)."""
    rng = np.random.default_rng(seed)
    row_bytes = ROW * 4
    weights = np.linspace(0.5, 1.5, tensors)
    rng.shuffle(weights)
    rows = np.maximum(1, (weights / weights.sum() * nbytes / row_bytes).astype(np.int64))
    state: dict[str, Any] = {}
    for i, r in enumerate(rows.tolist()):
        words = rng.integers(0, 2**63, size=r * ROW // 2, dtype=np.uint64)
        state[f"layers.{i}.weight"] = words.view(np.float32).reshape(r, ROW)
        state[f"layers.{i}.bias"] = rng.standard_normal(ROW, dtype=np.float32)
    return state


def state_nbytes(state: dict[str, Any]) -> int:
    return sum(a.nbytes for a in state.values())


# -- cases ------------------------------------------------------------------------------------


@dataclass
class Ctx:
    state: dict[str, Any]
    nbytes: int
    directory: str
    caches: cm.CacheDropper
    fio_engine: str | None
    round: int = 0
    _torch_state: dict[str, Any] | None = None
    _aligned_state: dict[str, Any] | None = None
    _into_state: dict[str, Any] | None = None
    _fork_checkpointer: Any = None

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def aligned_state(self) -> dict[str, Any]:
        """The same state in page-aligned memory (made untimed before the case that uses it,
        freed after it; see :func:`_free_case_memory`): what a job restarted
        from a ckptio checkpoint holds (``ckptio.load`` returns page-aligned arrays), what
        ``ckptio.aligned_empty`` allocates, and what async snapshots write from. numpy's own
        large arrays do not start on a page, which the disk (512-byte DMA alignment) cannot
        take directly."""
        if self._aligned_state is None:
            from ckptio.checkpoint import aligned_empty

            self._aligned_state = {}
            for k, v in self.state.items():
                a = aligned_empty(v.shape, v.dtype)
                np.copyto(a, v)
                self._aligned_state[k] = a
        return self._aligned_state

    @property
    def into_state(self) -> dict[str, Any]:
        """Arrays shaped like the state, allocated by numpy and written once (untimed, before
        the case that uses them, freed after it): the state of a job that built its model and
        now restores it in place."""
        if self._into_state is None:
            self._into_state = {k: np.zeros_like(v) for k, v in self.state.items()}
            for v in self._into_state.values():
                v.fill(0)  # np.zeros_like may map untouched zero pages; write every page
        return self._into_state

    @property
    def torch_state(self) -> dict[str, Any]:
        if self._torch_state is None:
            import torch

            self._torch_state = {k: torch.from_numpy(v) for k, v in self.state.items()}
        return self._torch_state


@dataclass
class Case:
    name: str
    kind: str  # "write", "read", "memory", "cpu"
    run: Callable[[Ctx], cm.Sample]
    needs: tuple[str, ...] = ()
    """Importable modules or executables ("exe:fio") the case needs."""
    after: str | None = None
    """A read case runs right after this write case (it reads what that wrote)."""
    output: str | None = None
    """What a write case leaves for its read case (removed when that case does not run)."""


def _have(need: str, nbytes: int = 0) -> bool:
    if need.startswith("exe:"):
        return shutil.which(need[4:]) is not None
    if need == "hugepages":
        return cm.free_huge_pages() >= FIO_HUGE_PAGES
    if need == "hugepages-load":
        return cm.free_huge_pages() >= _load_huge_pages(nbytes)
    import importlib.util

    return importlib.util.find_spec(need) is not None


def _fio(ctx: Ctx, rw: str, *extra: str) -> cm.Sample:
    assert ctx.fio_engine is not None
    per_job = max(4 << 20, ctx.nbytes // 2 // (4 << 20) * (4 << 20))
    cmd = [
        "fio",
        "--name=ckptio-bench",
        f"--directory={ctx.path('fio')}",
        f"--rw={rw}",
        "--bs=4M",
        "--numjobs=2",
        "--iodepth=16",
        f"--ioengine={ctx.fio_engine}",
        "--direct=1",
        f"--size={per_job}",
        "--end_fsync=1",
        "--group_reporting",
        "--output-format=json",
        *extra,
    ]
    os.makedirs(ctx.path("fio"), exist_ok=True)
    with cm.timed() as t:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"fio failed: {out.stderr.strip() or out.stdout.strip()}")
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]
    side = "read" if rw == "read" else "write"
    bw = job[side]["bw_bytes"]
    moved = job[side]["io_bytes"]
    return cm.Sample.of(t, seconds=moved / bw, bytes=moved, wall_with_startup=t["seconds"])


def case_fio_write(ctx: Ctx) -> cm.Sample:
    cm.remove(ctx.path("fio"))
    return _fio(ctx, "write")


def case_fio_write_nofalloc(ctx: Ctx) -> cm.Sample:
    cm.remove(ctx.path("fio"))
    return _fio(ctx, "write", "--fallocate=none")


def case_fio_read(ctx: Ctx) -> cm.Sample:
    return _fio(ctx, "read")


FIO_HUGE_PAGES = 2 * 16 * 2 + 8
"""2 MiB hugetlb pages the ``-hugepages`` fio cases need: 2 jobs x 16 buffers of 4 MiB, and
some slack for fio's own rounding."""


def case_fio_write_hugepages(ctx: Ctx) -> cm.Sample:
    """fio's write with its buffers on hugetlb pages (``--iomem=shmhuge``): physically
    contiguous, so each 4 MiB transfer reaches the device as one request. fio's default
    buffers are 4 KiB pages as scattered as free memory happens to be; this is the disk's
    limit without that handicap."""
    cm.remove(ctx.path("fio"))
    return _fio(ctx, "write", "--iomem=shmhuge")


def case_fio_read_hugepages(ctx: Ctx) -> cm.Sample:
    return _fio(ctx, "read", "--iomem=shmhuge")


def case_dcp(ctx: Ctx) -> cm.Sample:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    path = ctx.path("dcp")
    cm.remove(path)
    with cm.timed() as t:
        writer = FileSystemWriter(path, thread_count=4, sync_files=True)
        dcp.save(ctx.torch_state, storage_writer=writer, no_dist=True)
        cm.fsync_path(path)
    written = cm.tree_bytes(path)
    cm.remove(path)
    return cm.Sample.of(t, bytes=written)


def case_safetensors(ctx: Ctx) -> cm.Sample:
    from safetensors.torch import save_file

    path = ctx.path("state.safetensors")
    cm.remove(path)
    with cm.timed() as t:
        save_file(ctx.torch_state, path)
        cm.fsync_path(path)
        cm.fsync_path(ctx.directory)
    return cm.Sample.of(t, bytes=cm.tree_bytes(path))


def case_safetensors_load(ctx: Ctx) -> cm.Sample:
    import torch
    from safetensors.torch import load_file

    path = ctx.path("state.safetensors")
    ctx.caches.drop()
    with cm.timed() as t:
        loaded = load_file(path)  # mmap-backed: bytes are read when first touched...
        for v in loaded.values():  # ...so touch one byte per page, as a user's first use does
            v.reshape(-1).view(torch.uint8)[::4096].max()
    del loaded
    return cm.Sample.of(t)


def case_torch_save(ctx: Ctx) -> cm.Sample:
    import torch

    path = ctx.path("state.pt")
    cm.remove(path)
    with cm.timed() as t:
        with open(path, "wb") as f:
            torch.save(ctx.torch_state, f)
            f.flush()
            os.fsync(f.fileno())
        cm.fsync_path(ctx.directory)
    written = cm.tree_bytes(path)
    cm.remove(path)
    return cm.Sample.of(t, bytes=written)


def _ckptio_url(ctx: Ctx, name: str) -> str:
    return "file://" + ctx.path(name)


def case_ckptio_sync(ctx: Ctx) -> cm.Sample:
    cm.remove(ctx.path("ckptio"))
    with cm.timed() as t:
        ckptio.save(ctx.state, _ckptio_url(ctx, "ckptio"), step=ctx.round + 1)
    return cm.Sample.of(t, bytes=cm.tree_bytes(ctx.path("ckptio")))


def _free_case_memory(ctx: Ctx) -> None:
    """Free the aligned copy and the ``into=`` arrays after the case that used them; the
    next round makes them again, untimed. So between cases the process holds the state
    alone, as a job restarted from a checkpoint does, not several copies of it: on this
    project's VM page faults grew dearer while the process held more (see
    :func:`case_ckptio_async`)."""
    ctx._aligned_state = None
    ctx._into_state = None


def case_ckptio_sync_aligned(ctx: Ctx) -> cm.Sample:
    """Diagnostic: the same save from page-aligned memory, which goes to the disk with no
    staging copy. The difference from ``ckptio-sync`` is what copying numpy's unaligned
    memory into aligned blocks costs."""
    state = ctx.aligned_state  # made before the clock starts
    cm.remove(ctx.path("ckptio-aligned"))
    with cm.timed() as t:
        ckptio.save(state, _ckptio_url(ctx, "ckptio-aligned"), step=ctx.round + 1)
    out = {"bytes": cm.tree_bytes(ctx.path("ckptio-aligned"))}
    cm.remove(ctx.path("ckptio-aligned"))
    _free_case_memory(ctx)
    return cm.Sample.of(t, **out)


def case_ckptio_load(ctx: Ctx) -> cm.Sample:
    ctx.caches.drop()
    with cm.timed() as t:
        loaded = ckptio.load(_ckptio_url(ctx, "ckptio"))
    if ctx.round == 0:  # check the bytes once, outside the clock
        bad = [
            k
            for k, v in ctx.state.items()
            if not np.array_equal(loaded[k].view(np.uint32), v.view(np.uint32))
        ]
        if bad:
            raise RuntimeError(f"ckptio.load returned different bytes for {bad[:3]}")
    del loaded
    return cm.Sample.of(t)


def _load_huge_pages(nbytes: int, tensors: int = 64) -> int:
    """2 MiB hugetlb pages a ``hugetlb=True`` load of ``nbytes`` in up to ``tensors`` arrays
    takes (each array rounded up to whole pages)."""
    return -(-nbytes // (2 << 20)) + tensors


def _touch_huge_pool() -> None:
    """Write every free page of the hugetlb pool once (untimed): the first touch of a pool
    just reserved waits for the VM's host to back it (seconds for 3 GiB), which would land
    in whichever hugetlb case ran first."""
    from ckptio.arrays import hugetlb_pages

    free = cm.free_huge_pages()
    pool = hugetlb_pages(free * (2 << 20)) if free else None
    if pool is not None:
        np.frombuffer(pool, dtype=np.uint8)[::4096] = 1
        pool.close()


def case_ckptio_load_hugetlb(ctx: Ctx, **options: Any) -> cm.Sample:
    """Cold ``ckptio.load(..., hugetlb=True)``: the new arrays on the hugetlb pool's pages
    (reserved before the run, as fio's ``-hugepages`` cases need theirs). The pool's free
    count is read during the load, so a load that fell back to ordinary pages is an error,
    not a figure. ``options`` go to the store (``read_depth``)."""
    ctx.caches.drop()
    free_before = cm.free_huge_pages()
    with cm.timed() as t:
        loaded = ckptio.load(_ckptio_url(ctx, "ckptio"), hugetlb=True, **options)
    taken = free_before - cm.free_huge_pages()
    if taken * (2 << 20) < ctx.nbytes:
        raise RuntimeError(
            f"hugetlb=True load took {taken} hugetlb pages for {ctx.nbytes} bytes: the pool ran short"
        )
    if ctx.round == 0:
        bad = [
            k
            for k, v in ctx.state.items()
            if not np.array_equal(loaded[k].view(np.uint32), v.view(np.uint32))
        ]
        if bad:
            raise RuntimeError(f"ckptio.load(hugetlb=True) returned different bytes for {bad[:3]}")
    del loaded
    return cm.Sample.of(t)


def case_ckptio_load_into(ctx: Ctx) -> cm.Sample:
    into = ctx.into_state  # made before the clock starts
    ctx.caches.drop()
    with cm.timed() as t:
        ckptio.load(_ckptio_url(ctx, "ckptio"), into=into)
    if ctx.round == 0:  # check the bytes once, outside the clock (into held zeros before)
        bad = [
            k
            for k, v in ctx.state.items()
            if not np.array_equal(into[k].view(np.uint32), v.view(np.uint32))
        ]
        if bad:
            raise RuntimeError(f"ckptio.load(into=) left different bytes in {bad[:3]}")
    _free_case_memory(ctx)
    return cm.Sample.of(t)


def case_ckptio_load_warm_memory(ctx: Ctx) -> cm.Sample:
    """Diagnostic: the same cold load, but the process touched and freed as much memory just
    before (untimed), so the arrays it allocates get pages the kernel still holds instead of
    pages handed back to a VM's host. Not a target: it shows what fresh memory costs."""
    ctx.caches.drop()
    warm = np.empty(ctx.nbytes, dtype=np.uint8)
    warm.fill(1)
    del warm
    with cm.timed() as t:
        loaded = ckptio.load(_ckptio_url(ctx, "ckptio"))
    del loaded
    return cm.Sample.of(t)


def case_ckptio_async(ctx: Ctx, name: str = "ckptio-async") -> cm.Sample:
    """``Checkpointer(async_save=True)`` (copy snapshot): ``blocking`` is the copy, ``seconds``
    until committed. The timed save is the Checkpointer's second, as most of a training job's
    are: its first, untimed (its blocking time is kept as ``first_blocking``), allocates the
    snapshot memory that later saves reuse. The Checkpointer is closed after the case, which
    frees that memory, so the other cases run in a process that holds the state alone (a job
    restarted from a checkpoint holds no snapshot). On this project's VM a process holding
    those 3 GiB more paid 7-12x more kernel time per page fault for as long as it held them:
    a cold load took 13 s of kernel CPU instead of 1.8 s (README, "Performance", cold
    load)."""
    with ckptio.Checkpointer(_ckptio_url(ctx, name), async_save=True) as ck:
        first = ck.save(ctx.state, step=2 * ctx.round + 1)
        first.wait()
        with cm.timed() as t:
            handle = ck.save(ctx.state, step=2 * ctx.round + 2)
            handle.wait()
        for step in ck.steps():
            ckptio.checkpoint.delete_step(ck.store, step)
    return cm.Sample.of(t, blocking=handle.blocking_seconds, first_blocking=first.blocking_seconds)


def case_ckptio_async_numpy_copy(ctx: Ctx) -> cm.Sample:
    """``ckptio-async`` with the snapshot copied by ``numpy.copyto`` instead of ckptio's
    streaming-store copy (``ckptio._memcopy``): what that copy gains, side by side."""
    import ckptio.arrays

    streaming, ckptio.arrays._stream_copy = ckptio.arrays._stream_copy, None
    try:
        return case_ckptio_async(ctx, "ckptio-async-numpy-copy")
    finally:
        ckptio.arrays._stream_copy = streaming


def case_ckptio_async_fork(ctx: Ctx) -> cm.Sample:
    """``Checkpointer(async_save=True, snapshot="fork")``: ``blocking`` is the fork, ``seconds``
    until committed. The cost moved out of ``save`` is timed too, by writing one byte of every
    page of the state: ``touch_plain`` with no snapshot; ``touch_after`` once the child has
    ended (a fault per page, or per 2 MiB where numpy's memory is on transparent huge pages;
    no copy); ``touch_during`` while the child writes (a fault and a 4 KiB copy per page;
    this splits huge pages, so it is timed on a fresh copy of the state, untimed to make)."""
    if ctx._fork_checkpointer is None:
        ctx._fork_checkpointer = ckptio.Checkpointer(
            _ckptio_url(ctx, "ckptio-async-fork"), async_save=True, snapshot="fork"
        )
    ck = ctx._fork_checkpointer
    plain = cm.touch_pages(ctx.state)
    with cm.timed() as t:
        handle = ck.save(ctx.state, step=2 * ctx.round + 1)
        handle.wait()
    after = cm.touch_pages(ctx.state)
    scratch = {k: v.copy() for k, v in ctx.state.items()}
    pending = ck.save(scratch, step=2 * ctx.round + 2)
    during = cm.touch_pages(scratch)
    pending.wait()
    del scratch
    for step in ck.steps():
        ckptio.checkpoint.delete_step(ck.store, step)
    return cm.Sample.of(
        t,
        blocking=handle.blocking_seconds,
        touch_during=during,
        touch_after=after,
        touch_plain=plain,
    )


def case_memcpy(ctx: Ctx) -> cm.Sample:
    dst = {k: np.empty_like(v) for k, v in ctx.state.items()}
    for k, v in ctx.state.items():
        np.copyto(dst[k], v)  # touch every page once, outside the clock
    with cm.timed() as t:
        for k, v in ctx.state.items():
            np.copyto(dst[k], v)
    del dst  # not kept: the peers' memory needs stay as they would be alone
    return cm.Sample.of(t)


def _memcpy_fresh(ctx: Ctx, alloc: Callable[[np.ndarray], np.ndarray]) -> cm.Sample:
    with cm.timed() as t:
        dst = {k: alloc(v) for k, v in ctx.state.items()}
        for k, v in ctx.state.items():
            np.copyto(dst[k], v)
    del dst
    return cm.Sample.of(t)


def case_memcpy_fresh(ctx: Ctx) -> cm.Sample:
    """A copy into new memory of 4 KiB pages, as ``ckptio.load`` allocates its arrays
    (``aligned_empty``): what the cold load's page faults cost, without its I/O."""
    from ckptio.checkpoint import aligned_empty

    return _memcpy_fresh(ctx, lambda v: aligned_empty(v.shape, v.dtype))


def case_memcpy_fresh_numpy(ctx: Ctx) -> cm.Sample:
    """A copy into new memory as numpy allocates it (``np.empty_like``: on Linux, large
    arrays are advised to transparent huge pages), as a load into numpy's arrays pays."""
    return _memcpy_fresh(ctx, np.empty_like)


def manifest_100k() -> bytes:
    """A manifest of 100,000 chunks: 1,000 tensors of 100 chunks, 100 objects."""
    per, rows = 100, 64
    objects = {f"data/rank-{r:05d}-000-0000abcd.bin": 1 << 40 for r in range(per)}
    tensors = {}
    for t in range(1000):
        chunks = tuple(
            mf.Chunk(
                (c * rows, 0),
                (rows, 1024),
                f"data/rank-{c:05d}-000-0000abcd.bin",
                t * rows * 4096,
                rows * 4096,
                0x12345678,
            )
            for c in range(per)
        )
        tensors[f"model/layers/{t}/w"] = mf.TensorEntry("float32", (rows * per, 1024), chunks)
    tree = {"d": {p: {"t": p} for p in tensors}}
    return mf.Manifest(
        step=1, world_size=per, tensors=tensors, objects=objects, tree=tree
    ).to_json()


def case_manifest(ctx: Ctx) -> cm.Sample:
    data = manifest_100k()
    with cm.timed() as t:
        m = mf.parse_manifest(data, expect_step=1)
    chunks = sum(len(e.chunks) for e in m.tensors.values())
    return cm.Sample.of(t, chunks=chunks, manifest_bytes=len(data))


CASES: list[Case] = [
    Case("memcpy", "memory", case_memcpy),
    Case("memcpy-fresh", "memory", case_memcpy_fresh),
    Case("memcpy-fresh-numpy", "memory", case_memcpy_fresh_numpy),
    Case("fio-write", "write", case_fio_write, ("exe:fio",), output="fio"),
    Case("fio-read", "read", case_fio_read, ("exe:fio",), after="fio-write"),
    Case("fio-write-nofalloc", "write", case_fio_write_nofalloc, ("exe:fio",), output="fio"),
    Case(
        "fio-write-hugepages",
        "write",
        case_fio_write_hugepages,
        ("exe:fio", "hugepages"),
        output="fio",
    ),
    Case(
        "fio-read-hugepages",
        "read",
        case_fio_read_hugepages,
        ("exe:fio", "hugepages"),
        after="fio-write-hugepages",
    ),
    Case("torch-dcp", "write", case_dcp, ("torch",)),
    Case(
        "safetensors",
        "write",
        case_safetensors,
        ("torch", "safetensors"),
        output="state.safetensors",
    ),
    Case(
        "safetensors-load",
        "read",
        case_safetensors_load,
        ("torch", "safetensors"),
        after="safetensors",
    ),
    Case("torch-save", "write", case_torch_save, ("torch",)),
    Case("ckptio-sync", "write", case_ckptio_sync, output="ckptio"),
    Case("ckptio-sync-aligned", "write", case_ckptio_sync_aligned),
    Case("ckptio-load", "read", case_ckptio_load, after="ckptio-sync"),
    Case("ckptio-load-into", "read", case_ckptio_load_into, after="ckptio-sync"),
    Case(
        "ckptio-load-hugetlb",
        "read",
        case_ckptio_load_hugetlb,
        ("hugepages-load",),
        after="ckptio-sync",
    ),
    Case(
        "ckptio-load-hugetlb-depth8",
        "read",
        lambda ctx: case_ckptio_load_hugetlb(ctx, read_depth=8),
        ("hugepages-load",),
        after="ckptio-sync",
    ),
    Case("ckptio-load-warm-memory", "read", case_ckptio_load_warm_memory, after="ckptio-sync"),
    Case("ckptio-async", "write", case_ckptio_async),
    Case("ckptio-async-numpy-copy", "write", case_ckptio_async_numpy_copy),
    Case("ckptio-async-fork", "write", case_ckptio_async_fork),
    Case("manifest-100k", "cpu", case_manifest),
]
BY_NAME = {c.name: c for c in CASES}


# -- targets ----------------------------------------------------------------------------------

# (label, numerator case, denominator case, what to compare, target); ratio = speed of the
# first over the second (time of the second / time of the first), unless "time" says the
# ratio is of times (lower is better)
TARGETS: list[tuple[str, str, str, str, float]] = [
    ("durable save vs fio O_DIRECT seq write", "ckptio-sync", "fio-write", "speed", 0.90),
    (
        "durable save vs fio write, no preallocation",
        "ckptio-sync",
        "fio-write-nofalloc",
        "speed",
        0.90,
    ),
    (
        "durable save from page-aligned memory vs fio write (diagnostic)",
        "ckptio-sync-aligned",
        "fio-write",
        "speed",
        0.90,
    ),
    (
        "durable save vs fio write from hugetlb buffers (diagnostic)",
        "ckptio-sync",
        "fio-write-hugepages",
        "speed",
        0.90,
    ),
    ("durable save vs torch DCP", "ckptio-sync", "torch-dcp", "speed", 1.5),
    ("durable save vs safetensors + fsync", "ckptio-sync", "safetensors", "speed", 1.2),
    ("durable save vs torch.save + fsync", "ckptio-sync", "torch-save", "speed", 3.0),
    ("cold load vs fio O_DIRECT seq read", "ckptio-load", "fio-read", "speed", 0.90),
    (
        "cold load in place (into=) vs fio O_DIRECT seq read",
        "ckptio-load-into",
        "fio-read",
        "speed",
        0.90,
    ),
    (
        "cold load vs fio read into hugetlb buffers (diagnostic)",
        "ckptio-load",
        "fio-read-hugepages",
        "speed",
        0.90,
    ),
    (
        "cold load in place (into=) vs fio read into hugetlb buffers (diagnostic)",
        "ckptio-load-into",
        "fio-read-hugepages",
        "speed",
        0.90,
    ),
    (
        "cold load onto hugetlb pages (hugetlb=True) vs fio read into hugetlb buffers",
        "ckptio-load-hugetlb",
        "fio-read-hugepages",
        "speed",
        0.90,
    ),
    (
        "the same with 8 reads in flight, the default before 2026-12-05 (diagnostic)",
        "ckptio-load-hugetlb-depth8",
        "fio-read-hugepages",
        "speed",
        0.90,
    ),
    ("async blocking / one memcpy of the state", "ckptio-async:blocking", "memcpy", "time", 1.5),
    ("async blocking / sync save time", "ckptio-async:blocking", "ckptio-sync", "time", 0.10),
    (
        "async blocking / the same with numpy's copy (diagnostic)",
        "ckptio-async:blocking",
        "ckptio-async-numpy-copy:blocking",
        "time",
        1.0,
    ),
    (
        "async blocking, snapshot=fork / one memcpy",
        "ckptio-async-fork:blocking",
        "memcpy",
        "time",
        1.5,
    ),
    (
        "async blocking, snapshot=fork / sync save time",
        "ckptio-async-fork:blocking",
        "ckptio-sync",
        "time",
        0.10,
    ),
]


# -- running ----------------------------------------------------------------------------------


def plan(selected: list[str], rounds: int) -> list[list[str]]:
    """Per round, the order of cases: write cases rotate (alternation), each read case right
    after the write that produced its data."""
    writes = [n for n in selected if BY_NAME[n].after is None and BY_NAME[n].kind == "write"]
    reads: dict[str, list[str]] = {}
    for n in selected:
        after = BY_NAME[n].after
        if after:
            reads.setdefault(after, []).append(n)
    fixed = [n for n in selected if BY_NAME[n].kind in ("memory", "cpu")]
    order = []
    for r in range(rounds):
        k = r % len(writes) if writes else 0
        rotated = writes[k:] + writes[:k]
        seq = list(fixed)
        for w in rotated:
            seq.append(w)
            seq.extend(reads.get(w, []))
        order.append(seq)
    return order


def pick_fio_engine() -> str | None:
    if shutil.which("fio") is None:
        return None
    for engine in ("libaio", "io_uring"):
        out = subprocess.run(
            ["fio", f"--enghelp={engine}"], capture_output=True, text=True, check=False
        )
        if out.returncode == 0:
            return engine
    return "psync"


def run(args: argparse.Namespace) -> dict[str, Any]:
    nbytes_target = parse_size(args.size, field="--size")
    os.makedirs(args.dir, exist_ok=True)
    wanted = [c.name for c in CASES]
    if args.only:
        wanted = [n for n in args.only.split(",") if n]
    unknown = [
        n for n in wanted + (args.skip.split(",") if args.skip else []) if n and n not in BY_NAME
    ]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; valid: {', '.join(BY_NAME)}")
    skipped: dict[str, str] = {}
    selected = []
    for name in wanted:
        case = BY_NAME[name]
        if args.skip and name in args.skip.split(","):
            skipped[name] = "--skip"
            continue
        missing = [n for n in case.needs if not _have(n, nbytes_target)]
        if missing:
            load_pages = _load_huge_pages(nbytes_target)
            skipped[name] = "; ".join(
                f"needs {FIO_HUGE_PAGES} free 2 MiB hugetlb pages (as root: echo {FIO_HUGE_PAGES} > /proc/sys/vm/nr_hugepages)"
                if m == "hugepages"
                else f"needs {load_pages} free 2 MiB hugetlb pages (as root: echo {load_pages} > /proc/sys/vm/nr_hugepages)"
                if m == "hugepages-load"
                else "not installed: " + m.removeprefix("exe:")
                for m in missing
            )
            continue
        if case.after and case.after not in wanted:
            skipped[name] = f"needs {case.after}"
            continue
        selected.append(name)
    print(f"building a {human_bytes(nbytes_target)} state ...", file=sys.stderr, flush=True)
    state = make_state(nbytes_target, args.tensors)
    caches = cm.CacheDropper(args.dir, allow_global=args.cache_drop == "auto")
    cm.watch_device(args.dir)
    ctx = Ctx(state, state_nbytes(state), os.path.abspath(args.dir), caches, pick_fio_engine())
    args.started_utc = cm.utc_now()
    samples: dict[str, list[cm.Sample]] = {n: [] for n in selected}
    failed: dict[str, str] = {}
    started = time.perf_counter()
    if args.warmup and selected:
        # one untimed ckptio save: thread pools, imports and the first touch of memory are
        # paid here for every case alike (each peer's first call is warm in the same way)
        print("warm-up ...", file=sys.stderr, flush=True)
        ckptio.save(state, "file://" + ctx.path("warmup"), step=0)
        cm.remove(ctx.path("warmup"))
        _touch_huge_pool()
    for r, seq in enumerate(plan(selected, args.rounds)):
        ctx.round = r
        for i, name in enumerate(seq):
            case = BY_NAME[name]
            producer = BY_NAME[case.after or name]
            following = seq[i + 1] if i + 1 < len(seq) else None
            if name in failed or producer.name in failed:
                continue
            gc.collect()
            time.sleep(args.settle)  # let the previous case's aftermath pass (see --settle)
            ctx.caches.drop()
            try:
                s = case.run(ctx)
            except Exception as err:  # a failing peer is reported, the other cases still run
                failed[name] = f"{type(err).__name__}: {err}"[:300]
                print(
                    f"round {r + 1}/{args.rounds} {name}: FAILED {failed[name]}",
                    file=sys.stderr,
                    flush=True,
                )
                if producer.output:
                    cm.remove(ctx.path(producer.output))
                continue
            s.extra["loadavg"] = os.getloadavg()  # the machine may be shared: its load beside
            samples[name].append(s)
            if producer.output and (following is None or BY_NAME[following].after != producer.name):
                cm.remove(ctx.path(producer.output))  # its last reader is done
            shown = f" (blocking {s.extra['blocking']:.3f} s)" if "blocking" in s.extra else ""
            if s.machine:
                m = s.machine
                shown += (
                    f"  [machine: user {m.get('cpu_user', 0):.2f} sys {m.get('cpu_system', 0):.2f}"
                    f" steal {m.get('cpu_steal', 0):.2f} s"
                )
                for side in ("read", "write"):
                    if m.get(f"disk_{side}s"):
                        shown += f"; {side}s of {m[f'disk_{side}_bytes'] / m[f'disk_{side}s'] / 1024:.0f} KiB"
                shown += "]"
            print(
                f"round {r + 1}/{args.rounds} {name:20s} {s.seconds:8.3f} s  {cm.gb_per_s(ctx.nbytes, s.seconds):6.2f} GB/s{shown}",
                file=sys.stderr,
                flush=True,
            )
    if ctx._fork_checkpointer is not None:
        ctx._fork_checkpointer.close()
    cm.remove(ctx.path("ckptio-async"))
    cm.remove(ctx.path("ckptio-async-fork"))
    for name, why in failed.items():
        skipped[name] = f"failed: {why}"
        if not samples[name]:
            del samples[name]
    return summarize(args, ctx, samples, skipped, time.perf_counter() - started)


def _per_round(samples: dict[str, list[cm.Sample]], ref: str) -> list[float]:
    """A case's figure (``name`` or ``name:extra-field``) round by round. A case's samples
    start at round 1 and run without a gap (a failing case is not run again), so index i of
    two cases is the same round."""
    name, _, field = ref.partition(":")
    return [s.extra[field] if field else s.seconds for s in samples.get(name, [])]


def _median_of(samples: dict[str, list[cm.Sample]], ref: str) -> float | None:
    xs = _per_round(samples, ref)
    return cm.median(xs) if xs else None


def summarize(
    args: argparse.Namespace,
    ctx: Ctx,
    samples: dict[str, list[cm.Sample]],
    skipped: dict[str, str],
    wall: float,
) -> dict[str, Any]:
    rows = []
    for name, ss in samples.items():
        case = BY_NAME[name]
        med = cm.median([s.seconds for s in ss])
        row: dict[str, Any] = {
            "case": name,
            "kind": case.kind,
            "rounds": len(ss),
            "median_seconds": med,
            "min_seconds": min(s.seconds for s in ss),
            "max_seconds": max(s.seconds for s in ss),
            "median_cpu_seconds": cm.median([s.cpu_seconds for s in ss]),
            "median_sys_seconds": cm.median([s.sys_seconds for s in ss]),
            "seconds": [s.seconds for s in ss],
        }
        if case.kind in ("write", "read", "memory"):
            row["GBps"] = cm.gb_per_s(ctx.nbytes, med)
        if "blocking" in ss[0].extra:  # the async cases
            bl = [s.extra["blocking"] for s in ss]
            row["blocking_seconds"] = bl
            row["median_blocking_seconds"] = cm.median(bl)
            row["first_blocking_seconds"] = ss[0].extra.get("first_blocking", bl[0])
        for extra in ("touch_during", "touch_after", "touch_plain"):
            if extra in ss[0].extra:
                row[f"median_{extra}_seconds"] = cm.median([s.extra[extra] for s in ss])
        if name == "manifest-100k":
            row["chunks"] = ss[0].extra["chunks"]
        row["loadavg"] = [s.extra.get("loadavg") for s in ss]  # (1, 5, 15 min) after each
        if ss[0].machine:  # what the whole machine did meanwhile: steal, faults, compaction
            row["median_machine"] = {
                k: cm.median([s.machine.get(k, 0) for s in ss]) for k in ss[0].machine
            }
            row["machine"] = [s.machine for s in ss]
        rows.append(row)
    targets = []
    for label, num, den, how, target in TARGETS:
        a, b = _median_of(samples, num), _median_of(samples, den)
        if a is None or b is None:
            continue
        ratio = b / a if how == "speed" else a / b
        ok = ratio >= target if how == "speed" else ratio <= target
        # the same ratio within each round, then its median: the two cases ran minutes apart
        # at most, so a disk whose speed drifts over the run moves both
        pairs = list(
            zip(_per_round(samples, num), _per_round(samples, den), strict=False)
        )  # a case that failed has fewer rounds
        per_round = [y / x if how == "speed" else x / y for x, y in pairs]
        paired = cm.median(per_round)
        targets.append(
            {
                "target": label,
                "of": num,
                "against": den,
                "ratio": ratio,
                "paired_ratio": paired,
                "paired_range": [min(per_round), max(per_round)],
                "goal": (">=" if how == "speed" else "<=") + f" {target}",
                "met": ok,
            }
        )
    if "manifest-100k" in samples:
        m = _median_of(samples, "manifest-100k")
        assert m is not None
        targets.append(
            {
                "target": "manifest of 100,000 chunks loads",
                "of": "manifest-100k",
                "against": "1 s",
                "ratio": m,
                "goal": "<= 1.0 s",
                "met": m <= 1.0,
            }
        )
    return {
        "benchmark": "ckptio local peers",
        "command": " ".join(["python", "benchmarks/run.py", *args.argv]),
        "started_utc": args.started_utc,
        "config": {
            "size_bytes": ctx.nbytes,
            "tensors": len(ctx.state),
            "rounds": args.rounds,
            "settle_seconds": args.settle,
            "fio_engine": ctx.fio_engine,
            "cache_drop": ctx.caches.method,
            "warmup": args.warmup,
        },
        "machine": cm.machine_info(ctx.directory),
        "wall_seconds": wall,
        "cases": rows,
        "targets": targets,
        "skipped": skipped,
        "notes": [
            "medians over rounds; GB/s = 1e9 bytes/s of the state's bytes",
            "fio figures are fio's own bandwidth (its start-up excluded); fio-write preallocates its files (fio default), fio-write-nofalloc does not",
            "ratios: speed ratios (peer time / ckptio time) or time ratios as the goal says, all from this run",
        ],
    }


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [
        f"Run {result['started_utc']} to {result['machine']['utc']} on {result['machine']['cpus']} CPUs, "
        f"{human_bytes(cfg['size_bytes'])} state in {cfg['tensors']} tensors, {cfg['rounds']} rounds, "
        f"page cache dropped with {cfg['cache_drop']}; `{result['command']}`",
        "",
        "| case | median s | GB/s | min-max s | CPU s (sys) |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in result["cases"]:
        g = f"{row['GBps']:.2f}" if "GBps" in row else ""
        name = row["case"]
        if "median_blocking_seconds" in row:
            name += f" (blocking {row['median_blocking_seconds']:.3f} s, first save {row['first_blocking_seconds']:.3f} s"
            if "median_touch_during_seconds" in row:
                name += (
                    f"; then writing every page of the state took {row['median_touch_during_seconds']:.3f} s "
                    f"while the child wrote, {row['median_touch_after_seconds']:.3f} s after it ended, "
                    f"{row['median_touch_plain_seconds']:.3f} s with no snapshot"
                )
            name += ")"
        lines.append(
            f"| {name} | {row['median_seconds']:.3f} | {g} | {row['min_seconds']:.3f}-{row['max_seconds']:.3f} | {row['median_cpu_seconds']:.2f} ({row['median_sys_seconds']:.2f}) |"
        )
    lines += [
        "",
        "| target | ratio of medians | median of per-round ratios (range) | goal | met |",
        "|---|---:|---:|---|---|",
    ]
    for t in result["targets"]:
        unit = " s" if t["against"] == "1 s" else "x"
        paired = f"{t['paired_ratio']:.2f}x" if "paired_ratio" in t else ""
        if "paired_range" in t:
            paired += " ({:.2f}-{:.2f})".format(*t["paired_range"])
        lines.append(
            f"| {t['target']} | {t['ratio']:.2f}{unit} | {paired} | {t['goal']} | {'yes' if t['met'] else '**no**'} |"
        )
    if result["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{k} ({v})" for k, v in result["skipped"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size", default="3GiB", help="bytes of state (default 3GiB)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; medians are reported (default 5)")
    p.add_argument(
        "--tensors", type=int, default=24, help="large tensors in the state (default 24)"
    )
    p.add_argument(
        "--dir", default="/var/tmp/ckptio-bench", help="scratch directory on the disk under test"
    )
    p.add_argument("--only", default="", help=f"comma-separated cases; valid: {', '.join(BY_NAME)}")
    p.add_argument("--skip", default="", help="comma-separated cases to leave out")
    p.add_argument(
        "--no-warmup", dest="warmup", action="store_false", help="no untimed warm-up save"
    )
    p.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="seconds of idle before each case (default 3): memory a case freed is handed back "
        "to a VM's host about 2 s later (virtio-balloon free page reporting), which would "
        "otherwise slow whichever case runs next",
    )
    p.add_argument(
        "--cache-drop",
        choices=("auto", "fadvise"),
        default="auto",
        help="auto: drop the whole page cache where permitted (root), else fadvise; fadvise: "
        "only this benchmark's files (posix_fadvise DONTNEED, which the kernel may honour in part)",
    )
    p.add_argument(
        "--json",
        default="benchmarks/results/latest.json",
        help="write the result document here ('' for none)",
    )
    p.add_argument(
        "--markdown",
        default="benchmarks/results/latest.md",
        help="write the Markdown table here ('' for none)",
    )
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.rounds < 1 or args.tensors < 1:
        p.error("--rounds and --tensors must be >= 1")
    result = run(args)
    md = markdown(result)
    print(md)
    for path, text in ((args.json, json.dumps(result, indent=1)), (args.markdown, md)):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
