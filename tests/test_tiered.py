"""Tiered checkpoints (ckptio.tiered): saves on a fast tier, drains to a durable one, per-tier
retention, backpressure, and restore from the newest step complete on either tier.

A drain is held at a chosen moment by a *gate* on the durable store (its ``open_writer``
blocks until the test opens the gate), so what runs concurrently is decided by the test, not
by timing."""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest

import ckptio
from ckptio import checkpoint as ck
from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.checkpoint.drain import object_rank
from ckptio.registry import open_store
from ckptio.testing.crash import expected_state, state_mismatch

SMALL = {"chunk_size": 256 * 1024, "max_object_size": 768 * 1024}  # 3 objects per step


class Gate:
    """Wraps ``store.open_writer``: the ``after``-th call and later ones block until ``open``."""

    def __init__(self, store, after: int = 1) -> None:
        self.store, self.after, self.calls = store, after, 0
        self.entered = threading.Event()
        self.gate = threading.Event()
        inner = store.open_writer

        def open_writer(key, **kw):
            if "/data/" in key:
                self.calls += 1
                if self.calls >= self.after:
                    self.entered.set()
                    assert self.gate.wait(60), "the test never opened the gate"
            return inner(key, **kw)

        store.open_writer = open_writer

    def open(self) -> None:
        self.gate.set()


def tiered(tmp_path, durable=None, **kw) -> ckptio.Checkpointer:
    opts = {**SMALL, "keep_last_local": 2, **kw}
    c = ckptio.Checkpointer(
        durable or f"file://{tmp_path}/durable", local=f"file://{tmp_path}/fast", **opts
    )
    assert c.tiered
    return c


def test_every_nth_step_drained_retention_per_tier(tmp_path):
    with tiered(tmp_path, keep_last=2, keep_last_local=2, persist_every=3) as c:
        handles = [c.save(expected_state(s), s) for s in range(1, 9)]
        results = c.wait_drains()
        assert [h.step for h in handles if h.drain is not None] == [1, 4, 7]
        assert all(r.status == "durable" for r in results)
        assert c.tiers() == {"local": [7, 8], "durable": [4, 7]}
        # the durable manifest is the fast one, byte for byte; every object copied whole
        fast, durable = c.engine.fast.store, c.store
        assert fast.get(fmt.manifest_key(7)) == durable.get(fmt.manifest_key(7))
        m = ck.read_manifest(durable, 7)
        for key in m.objects:
            assert durable.get(f"{fmt.step_dir(7)}/{key}") == fast.get(f"{fmt.step_dir(7)}/{key}")
        r = handles[6].wait_drain()
        assert r.nbytes == m.nbytes and r.lag_seconds >= r.seconds > 0
        assert state_mismatch(c.load(), expected_state(8)) is None
        assert state_mismatch(c.load(7), expected_state(7)) is None
    # each tier is an ordinary ckptio root
    assert state_mismatch(ckptio.load(f"file://{tmp_path}/durable"), expected_state(7)) is None
    assert ck.verify(f"file://{tmp_path}/durable", 4) == []


def test_restore_reads_the_durable_tier_when_the_fast_one_is_gone(tmp_path):
    with tiered(tmp_path, persist_every=2) as c:
        for s in range(1, 5):
            c.save(expected_state(s), s)
    shutil.rmtree(tmp_path / "fast")  # a replaced node
    with tiered(tmp_path) as c:
        assert c.latest() == 3
        assert state_mismatch(c.load(), expected_state(3)) is None


def test_restore_falls_back_past_a_damaged_fast_copy(tmp_path):
    """A CRC mismatch on the fast tier: the same step from the durable tier if it was
    drained, else the next older complete one."""
    with tiered(tmp_path, persist_every=2, keep_last_local=3) as c:
        for s in range(1, 4):
            c.save(expected_state(s), s)
    store = open_store(f"file://{tmp_path}/fast")

    def damage(step):
        key = next(k for k in store.list(fmt.step_dir(step) + "/data/"))
        data = bytearray(store.get(key))
        data[100] ^= 0xFF
        store.put(key, bytes(data))

    damage(3)  # drained (steps 1 and 3 are)
    with tiered(tmp_path) as c:
        assert state_mismatch(c.load(), expected_state(3)) is None
    shutil.rmtree(tmp_path / "durable")
    with tiered(tmp_path) as c:
        assert state_mismatch(c.load(), expected_state(2)) is None


def test_backpressure_skip_leaves_the_step_on_the_fast_tier(tmp_path):
    durable = open_store(f"file://{tmp_path}/durable")
    gate = Gate(durable)
    with tiered(tmp_path, durable, drain_backpressure="skip") as c:
        h1 = c.save(expected_state(1), 1)
        assert gate.entered.wait(60)
        h2 = c.save(expected_state(2), 2)
        assert (h2.backpressure, h2.drain) == ("skipped", None)
        assert not h1.drain.done()
        gate.open()
        assert h1.wait_drain().status == "durable"
        h3 = c.save(expected_state(3), 3)
        assert h3.backpressure == "" and h3.wait_drain().status == "durable"
        assert c.tiers()["durable"] == [1, 3]


def test_backpressure_cancel_abandons_the_older_drain(tmp_path):
    durable = open_store(f"file://{tmp_path}/durable")
    gate = Gate(durable)
    with tiered(tmp_path, durable, drain_backpressure="cancel") as c:
        h1 = c.save(expected_state(1), 1)
        assert gate.entered.wait(60)
        h2 = c.save(expected_state(2), 2)
        assert h2.backpressure == "cancelled" and h2.drain_lag_seconds > 0
        gate.open()
        assert h1.wait_drain().status == "cancelled"
        assert h2.wait_drain().status == "durable"
        assert c.tiers()["durable"] == [2]
        # the cancelled drain left nothing behind on the durable tier
        assert durable.list(fmt.step_dir(1)) == []
        assert durable.list_incomplete("step-") == []


def test_backpressure_wait_stalls_the_save_until_the_drain_ends(tmp_path):
    durable = open_store(f"file://{tmp_path}/durable")
    gate = Gate(durable)
    with tiered(tmp_path, durable, drain_backpressure="wait") as c:
        h1 = c.save(expected_state(1), 1)
        assert gate.entered.wait(60)
        agree = c.engine._agree_running

        def agree_then_open():  # the save has seen the drain running; now let it end
            verdict = agree()
            gate.open()
            return verdict

        c.engine._agree_running = agree_then_open
        h2 = c.save(expected_state(2), 2)
        assert h2.backpressure == "waited"
        assert h1.drain.done() and h1.wait_drain().status == "durable"
        assert h2.wait_drain().status == "durable"
        assert c.tiers()["durable"] == [1, 2]


def test_fast_retention_keeps_a_step_whose_drain_is_in_flight(tmp_path):
    durable = open_store(f"file://{tmp_path}/durable")
    gate = Gate(durable)
    with tiered(tmp_path, durable, keep_last_local=1, drain_backpressure="skip") as c:
        h1 = c.save(expected_state(1), 1)
        assert gate.entered.wait(60)
        c.save(expected_state(2), 2)
        c.save(expected_state(3), 3)
        assert c.tiers()["local"] == [1, 3]  # 2 retired; 1 is being drained
        gate.open()
        assert h1.wait_drain().status == "durable"
        c.save(expected_state(4), 4)
        c.wait_drains()
        assert c.tiers() == {"local": [4], "durable": [1, 4]}


def test_fast_retention_keeps_the_newest_chosen_step_until_it_is_durable(tmp_path):
    durable = open_store(f"file://{tmp_path}/durable")

    def refuse(key, **kw):
        raise errors.StorageError("the durable tier is down")

    durable.open_writer = refuse
    with tiered(tmp_path, durable, keep_last_local=1, persist_every=3) as c:
        h1 = c.save(expected_state(1), 1)
        r = h1.wait_drain()
        assert r.status == "failed" and "down" in r.error
        c.save(expected_state(2), 2)
        c.save(expected_state(3), 3)
        assert c.tiers() == {"local": [1, 3], "durable": []}
        c.save(expected_state(4), 4)  # chosen: 1 is no longer the newest chosen step
        c.wait_drains()
        assert c.tiers()["local"] == [4]
        assert durable.list("step-") == []  # failed drains left nothing (no lease, no data)


def test_a_drain_refuses_a_damaged_fast_copy(tmp_path):
    durable = open_store(f"file://{tmp_path}/durable")
    gate = Gate(durable)
    with tiered(tmp_path, durable) as c:
        h1 = c.save(expected_state(1), 1)
        assert gate.entered.wait(60)
        fast = c.engine.fast.store
        for key in fast.list(fmt.step_dir(1) + "/data/"):
            data = bytearray(fast.get(key))
            data[5000] ^= 1
            fast.put(key, bytes(data))
        gate.open()
        r = h1.wait_drain()
        assert r.status == "failed" and "CRC32C mismatch" in r.error
        assert durable.list("step-") == [] and durable.list_incomplete("step-") == []


def test_a_drain_of_a_step_the_durable_tier_has_already_fails_and_leaves_it_alone(tmp_path):
    ck.save(expected_state(1), f"file://{tmp_path}/durable", step=1)
    with open_store(f"file://{tmp_path}/durable") as d:
        before = {k: d.get(k) for k in d.list("step-")}
    with tiered(tmp_path) as c:
        r = c.save(expected_state(2), 1).wait_drain()
    assert r.status == "failed" and "step 1 already has a committed checkpoint" in r.error
    with open_store(f"file://{tmp_path}/durable") as d:
        assert {k: d.get(k) for k in d.list("step-")} == before  # no lease left, nothing added
    with open_store(f"file://{tmp_path}/fast") as f:
        assert [k for k in f.list("step-") if "saving-" in k] == []


def test_a_drain_holds_leases_on_both_tiers(tmp_path):
    """While a drain copies step 1, gc of either root and retention by another process on the
    fast root delete nothing it needs; it then commits."""
    durable = open_store(f"file://{tmp_path}/durable")
    gate = Gate(durable, after=2)  # one object copied, the second one held
    with tiered(tmp_path, durable) as c:
        h1 = c.save(expected_state(1), 1)
        assert gate.entered.wait(60)
        d_url, f_url = f"file://{tmp_path}/durable", f"file://{tmp_path}/fast"
        with open_store(d_url) as d:
            assert ck.collect_garbage(d, unfinished=True, older_than=0, grace=0) == []
            (info,) = ck.list_steps(d)
            assert "save in progress" in info.problem
        with ck.Checkpointer(f_url, keep_last=1, retire_grace=0) as other:
            other.save(expected_state(9), 9)  # its retention retires step 1 on the fast tier
        with open_store(f_url) as f:
            assert ck.collect_garbage(f, unfinished=True, older_than=0, grace=0) == []
        gate.open()
        assert h1.wait_drain().status == "durable"
    with open_store(f"file://{tmp_path}/durable") as d:
        assert state_mismatch(ck.open_checkpoint(d, 1).state(), expected_state(1)) is None
        assert [k for k in d.list(fmt.step_dir(1)) if "saving-" in k] == []


def test_async_saves_drain_after_their_fast_commit(tmp_path):
    with tiered(tmp_path, async_save=True, keep_last=1) as c:
        hs = [c.save(expected_state(s), s) for s in range(1, 4)]
        for h in hs:
            h.wait()
        c.wait_drains()
        assert c.tiers()["durable"][-1] == 3
        assert state_mismatch(c.load(), expected_state(3)) is None


def test_options_are_checked(tmp_path):
    with pytest.raises(errors.InvalidArgumentError, match="drain_backpressure"):
        tiered(tmp_path, drain_backpressure="later")
    with pytest.raises(errors.InvalidArgumentError, match="file-per-shard"):
        tiered(tmp_path, layout="shared-file")
    with pytest.raises(errors.InvalidArgumentError, match="persist_every"):
        tiered(tmp_path, persist_every=0)
    with pytest.raises(errors.InvalidArgumentError, match="one per rank"):
        ckptio.Checkpointer(f"file://{tmp_path}/d", local=["file:///a", "file:///b"])
    assert object_rank("data/rank-00003-000-abcd1234.bin") == 3
    assert object_rank("data/7f/rank-00012-001-abcd1234.bin") == 12


def test_load_with_no_checkpoint_names_both_tiers(tmp_path):
    with tiered(tmp_path) as c, pytest.raises(errors.NotFoundError, match=r"fast.*durable"):
        c.load()
    with tiered(tmp_path) as c:
        assert c.latest() is None


@pytest.mark.s3
def test_drain_to_s3(tmp_path, s3_bucket, s3_env, monkeypatch):
    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    url = f"s3://{s3_bucket}/run"
    with tiered(tmp_path, url, keep_last=2) as c:
        for s in range(1, 4):
            c.save(expected_state(s), s)
        assert [r.status for r in c.wait_drains()] == ["durable"]
        assert c.tiers()["durable"] == [2, 3]
    shutil.rmtree(tmp_path / "fast")
    assert state_mismatch(ckptio.load(url), expected_state(3)) is None


# -- crash consistency across tiers -----------------------------------------------------------

#: SIGKILL trials over file:// -> s3:// (moto): 15 sync + 15 async = 30 in CI (a kill costs
#: about 1-2 s on moto); CKPTIO_CRASH_SCALE=4 runs four times as many
CRASH_TRIALS = 15 * int(__import__("os").environ.get("CKPTIO_CRASH_SCALE", "1"))


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkill_mid_drain(tmp_path, s3_bucket, s3_env, s3_client, mode):
    """A worker saves step after step on a local fast tier, every 2nd step drained to S3
    (moto), until SIGKILLed at a random moment; the next worker restores. After every kill
    (ckptio.testing.crash): the tiered restore is exact and not older than the last save that
    returned, the durable tier alone is exact and not older than the last drain that
    committed, every manifest on both tiers validates. Then: kills landed mid-drain (the
    durable tier held debris), some left the newest step on the fast tier only, retention
    kept both tiers bounded, and gc of each tier removes exactly the debris."""
    from test_crash import check_gc

    from ckptio.testing.crash import CrashHarness, lease_published

    url, fast = f"s3://{s3_bucket}/run", f"file://{tmp_path}/fast"
    seen: set[str] = set()

    def new_debris() -> bool:
        """The kill left debris on the durable tier that no earlier kill had left: it landed
        inside a drain (data copied, no manifest)."""
        with open_store(url) as store:
            stray = set(ck.collect_garbage(store, unfinished=True, dry_run=True))
            stray |= set(store.list_incomplete("step-"))
        fresh = bool(stray - seen)
        seen.update(stray)
        return fresh

    # sync: a drain per save, the next save waits for it; async: drains skip while one runs,
    # so one is nearly always in flight while the saves go on at the fast tier's pace;
    # retire_grace=0 keeps retention's share of a drain (and of a kill's chances) small
    harness = CrashHarness(
        url,
        mode,
        str(tmp_path),
        seed={"sync": 7, "async": 8}[mode],
        min_delay=0.15,
        max_delay=0.8,
        env=s3_env,
        has_debris=new_debris,
        keep_last=2,
        store_options={
            "local": fast,
            "keep_last_local": 2,
            "persist_every": 1,
            "retire_grace": 0,
            "drain_backpressure": {"sync": "wait", "async": "skip"}[mode],
        },
    )
    trials = harness.run(CRASH_TRIALS)
    for _ in range(4):  # kills that missed the drains (machine speed varies): aimed ones
        if sum(t.debris for t in harness.trials) >= 2:
            break
        trials = harness.run(2, aim=lease_published)  # a drain's lease on the durable tier
    print(harness.summary())
    mid_drain = sum(t.debris for t in trials)
    assert mid_drain >= 2, [(t.delay, t.debris) for t in trials]
    assert trials[-1].loaded is not None and trials[-1].loaded > CRASH_TRIALS // 2
    assert trials[-1].durable_loaded is not None
    # the newest step existed on the fast tier only at some kills (restored from there)
    assert any(t.loaded > (t.durable_loaded or 0) for t in trials if t.loaded is not None)
    # retention kept both tiers bounded: the durable tier keep_last=2 (+1: a kill between a
    # commit and its retention); the fast tier keep_last_local=2, +1 the same way, + the steps
    # a drain needed (queued or running, and the newest chosen step not yet durable) when the
    # last worker was killed
    for root, most in ((url, 3), (fast, 5)):
        with open_store(root) as store:
            steps = ck.committed_steps(store)
            assert len(steps) <= most, (root, steps)
    check_gc(url, plain_first=False)
    check_gc(fast)
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


# -- several ranks (real processes under mpiexec) ---------------------------------------------


def run_ranks(n: int, *args: str) -> str:
    from test_mpi_checkpoint import run_mpi

    return run_mpi(n, str(MPI_SCRIPT), *args).stdout


MPI_SCRIPT = __import__("pathlib").Path(__file__).parent / "mpi" / "tiered_ranks.py"


@pytest.mark.mpi
def test_two_ranks_with_their_own_fast_roots_and_one_node_replaced(tmp_path):
    """Two ranks as two nodes (a fast root each): each root holds the manifest and that
    rank's objects only; with both roots the newest step is restored from them (the
    replicated tensor, written by rank 0, from rank 0's root); with rank 1's root gone, the
    newest drained step: rank 0 from its root, rank 1 from the durable tier."""
    import json

    durable, local = f"file://{tmp_path}/durable", f"file://{tmp_path}/fast-{{rank}}"
    out = run_ranks(2, "save", durable, local)
    tiers = {d["rank"]: d for d in map(json.loads, out.strip().splitlines())}
    assert tiers[0]["local"] == tiers[1]["local"] == [2, 3, 4]
    assert tiers[0]["durable"] == [1, 3]
    for rank in (0, 1):
        with open_store(f"file://{tmp_path}/fast-{rank}") as store:
            keys = store.list(fmt.step_dir(4) + "/data/")
            assert keys and {object_rank(k.rsplit("/", 1)[1]) for k in keys} == {rank}
            assert [k for k in store.list("step-") if "saving-" in k] == []
    assert "rank 1 restored step 4 OK" in run_ranks(2, "load", durable, local, "4")
    shutil.rmtree(tmp_path / "fast-1")
    out = run_ranks(2, "load", durable, local, "3")
    assert out.count("restored step 3 OK") == 2


@pytest.mark.mpi
def test_a_run_resumed_after_a_node_loss_saves_the_step_numbers_the_lost_node_left_unfinished(
    tmp_path,
):
    """Rank 1's fast root lost after step 4 (drained: 1 and 3): the resume restores step 3,
    and step 4 on rank 0's fast root, which can never be whole again, is retired, so the
    resumed run's save of step 4 commits (it used to be refused: "already committed on the
    fast root of rank(s) [0]") and its new contents are what loads."""
    durable, local = f"file://{tmp_path}/durable", f"file://{tmp_path}/fast-{{rank}}"
    run_ranks(2, "save", durable, local)
    shutil.rmtree(tmp_path / "fast-1")
    out = run_ranks(2, "resume", durable, local, "3")
    assert out.count("resumed and saved step 4 OK") == 2, out
    with open_store(durable) as store:
        assert 4 in ck.committed_steps(store)


@pytest.mark.mpi
def test_two_ranks_one_fast_root_async(tmp_path):
    durable, local = f"file://{tmp_path}/durable", f"file://{tmp_path}/fast"
    run_ranks(2, "save", durable, local, "async")
    assert run_ranks(2, "load", durable, local, "4").count("OK") == 2
    shutil.rmtree(tmp_path / "fast")
    assert run_ranks(2, "load", durable, local, "3").count("OK") == 2


def test_torch_checkpointer_tiered(tmp_path):
    torch = pytest.importorskip("torch")
    from ckptio import torch as ct

    sd = {
        "layers": {0: torch.arange(12.0).reshape(3, 4), 1: torch.ones(5, dtype=torch.bfloat16)},
        "step": 2,
    }
    with ct.Checkpointer(f"file://{tmp_path}/durable", local=f"file://{tmp_path}/fast") as c:
        assert isinstance(c, ct.Checkpointer) and isinstance(c, ckptio.Checkpointer) and c.tiered
        assert c.save(sd, 2).wait_drain().status == "durable"
    shutil.rmtree(tmp_path / "fast")
    with ct.Checkpointer(f"file://{tmp_path}/durable", local=f"file://{tmp_path}/fast") as c:
        got = c.load()
    assert torch.equal(got["layers"][0], sd["layers"][0]) and torch.equal(
        got["layers"][1], sd["layers"][1]
    )
    assert got["step"] == 2


def test_a_copy_reads_ahead_of_its_writer_by_a_bounded_amount(tmp_path, monkeypatch):
    """Writers queue buffers without copying them: a copy reads at most its budget ahead of
    what its writer has let go of, and a writer that holds everything until close still
    finishes (past BUFFER_WAIT_SECONDS the copy reads on)."""
    from ckptio.checkpoint import drain as t

    monkeypatch.setattr(t, "COPY_PIECE_BYTES", 64 * 1024)
    monkeypatch.setattr(t, "DRAIN_BUFFER_BYTES", 256 * 1024)  # a budget of 4 pieces
    src, dst = open_store(f"file://{tmp_path}/a"), open_store("memory://bounded-copy")
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()  # 16 pieces
    src.put("obj", data)
    chunk = mf.Chunk((0,), (len(data),), "obj", 0, len(data), ck.crc32c(data))
    inner = dst.open_writer
    wrote = [threading.Event() for _ in range(17)]

    class Holding:  # holds every buffer until let go of (or until close)
        def __init__(self, key, **kw):
            self.w, self.n, self.held, self.through = inner(key, **kw), 0, [], False

        def write(self, buf):
            self.held.append(buf)
            self.n += 1
            if self.through:
                self.let_go(len(self.held))
            wrote[self.n].set()

        def let_go(self, n):  # a copy to the (memory) store: the buffer itself is dropped
            for _ in range(n):
                self.w.write(bytes(self.held.pop(0)))

        def close(self):
            self.let_go(len(self.held))
            self.w.close()

        def abort(self):
            self.w.abort()

    writers: list = []
    dst.open_writer = lambda key, **kw: writers.append(Holding(key, **kw)) or writers[-1]
    result: list = []
    copier = threading.Thread(
        target=lambda: result.append(
            t.copy_object(src, dst, "obj", len(data), [chunk], lambda: False)
        )
    )
    copier.start()
    assert wrote[4].wait(30)
    assert not wrote[5].wait(0.5), "the copy read past its budget while the writer held it all"
    (w,) = writers
    w.let_go(1)  # written and dropped: the copy may read one more piece
    assert wrote[5].wait(30)
    assert not wrote[6].wait(0.2)
    w.through = True
    w.let_go(len(w.held))
    copier.join(60)
    assert result == [len(data)] and dst.get("obj") == data

    monkeypatch.setattr(t, "BUFFER_WAIT_SECONDS", 0.05)  # a writer that lets go at close only
    writers.clear()
    assert t.copy_object(src, dst, "obj", len(data), [chunk], lambda: False) == len(data)
    assert writers[0].n == 16 and dst.get("obj") == data


def test_a_copy_reads_into_the_buffers_its_writer_let_go_of(tmp_path, monkeypatch):
    """A drain's copy reuses the buffers its writer has let go of instead of allocating a
    fresh one per piece (fresh memory costs a page fault per page: on a busy machine the drain
    fell to 0.84x a direct save's throughput): an object of 16 pieces needs at most its read-
    ahead budget of buffers, and arrives intact."""
    from ckptio.checkpoint import drain as t

    monkeypatch.setattr(t, "COPY_PIECE_BYTES", 64 * 1024)
    monkeypatch.setattr(t, "DRAIN_BUFFER_BYTES", 256 * 1024)  # a budget of 4 pieces
    allocated = []
    real = t.aligned_empty
    monkeypatch.setattr(t, "aligned_empty", lambda *a, **k: allocated.append(a) or real(*a, **k))
    src, dst = open_store(f"file://{tmp_path}/a"), open_store("memory://reused-buffers")
    data = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    src.put("obj", data)
    chunk = mf.Chunk((0,), (len(data),), "obj", 0, len(data), ck.crc32c(data))
    inner = dst.open_writer

    class LettingGo:  # sends each buffer's bytes at once and lets go of the buffer
        def __init__(self, key, **kw):
            self.w = inner(key, **kw)

        def write(self, buf):
            self.w.write(bytes(buf))

        def close(self):
            self.w.close()

        def abort(self):
            self.w.abort()

    dst.open_writer = LettingGo
    assert t.copy_object(src, dst, "obj", len(data), [chunk], lambda: False) == len(data)
    assert dst.get("obj") == data
    assert 1 <= len(allocated) <= 4, f"{len(allocated)} buffers allocated for 16 pieces"


def test_a_copy_never_reuses_a_buffer_whose_bytes_its_writer_still_holds(tmp_path, monkeypatch):
    """Writers keep views of what they are given until the bytes are written (the local
    store's writer queues ``as_byte_view(data)`` pieces for its I/O threads). A view derived
    from a numpy slice references the slice's base, not the slice: when the copy tied the
    reuse of a buffer to the slice it handed over, the buffer was read into again while its
    bytes were still queued, and a drain to file:// committed an object with other bytes in it
    (found by ``ckptio run --local``'s restore from the durable tier)."""
    from ckptio.checkpoint import drain as t
    from ckptio.store import as_byte_view

    monkeypatch.setattr(t, "COPY_PIECE_BYTES", 64 * 1024)
    monkeypatch.setattr(t, "DRAIN_BUFFER_BYTES", 1 << 20)  # room for every piece: no waiting
    src, dst = open_store(f"file://{tmp_path}/a"), open_store("memory://queued-views")
    data = np.random.default_rng(2).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    src.put("obj", data)
    chunk = mf.Chunk((0,), (len(data),), "obj", 0, len(data), ck.crc32c(data))
    inner = dst.open_writer

    class Queueing:  # keeps a byte view of each buffer, as the local writer does, until close
        def __init__(self, key, **kw):
            self.w, self.queued = inner(key, **kw), []

        def write(self, buf):
            self.queued.append(as_byte_view(buf))

        def close(self):
            for view in self.queued:
                self.w.write(bytes(view))
            self.queued.clear()
            self.w.close()

        def abort(self):
            self.w.abort()

    dst.open_writer = Queueing
    assert t.copy_object(src, dst, "obj", len(data), [chunk], lambda: False) == len(data)
    assert dst.get("obj") == data, "a buffer was read into again while its bytes were queued"


def _save_with_every_channel_taken(comm, durable: str, local: str) -> str:
    while comm._spare:  # every spare channel taken: the drain cannot have one of its own
        comm.dup()
    c = ckptio.Checkpointer(durable, local=local, comm=comm, **SMALL)
    try:
        c.save(expected_state(1), 1)
    except errors.InvalidArgumentError as err:
        said = str(err)
    else:
        said = "saved"
    closing = threading.Thread(target=c.close, daemon=True)
    closing.start()
    closing.join(30)
    return f"{said} | {'hangs' if closing.is_alive() else 'closed'}"


def test_local_ranks_drain_on_a_channel_of_their_own_and_a_drain_that_cannot_start_fails(
    tmp_path,
):
    """Local-process ranks (``ckptio run --ranks N``) give a drain a channel of its own
    (``dup``); where none is left, the save says so and ``close`` returns (the drain that
    never started is not waited for forever)."""
    from ckptio.dist import run_local

    durable, local = f"file://{tmp_path}/durable", f"file://{tmp_path}/fast-{{rank}}"
    said = run_local(2, _save_with_every_channel_taken, durable, local)
    assert "channels, all in use" in said and said.endswith("| closed")


def test_a_drain_lease_that_lost_its_temp_file_is_published_again(tmp_path):
    """A retention sweeping the fast tier can remove the temp file of a drain's lease being
    published (temp files under a step with no live lease are debris to it); the drain
    publishes its lease again while the step is committed, and commits."""
    with tiered(tmp_path, persist_every=2) as c:
        publish, lost = c.engine.fast.store.publish_transient, []  # how leases are published

        def publish_once_lost(key, data):
            if "/saving-" in key and not lost and c.engine.fast.store.exists(fmt.manifest_key(1)):
                lost.append(key)
                raise errors.NotFoundError(f"cannot publish {key}: its temp file is gone")
            publish(key, data)

        c.engine.fast.store.publish_transient = publish_once_lost
        assert c.save(expected_state(1), 1).wait_drain().status == "durable"
        assert lost


# -- restore: any read failure of the fast tier falls back ---------------------------------------


def _warnings(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")


@pytest.mark.fuse
def test_an_eio_on_the_fast_tier_falls_back_to_the_durable_tier_then_to_older_steps(
    tmp_path, caplog
):
    """The fast tier on a failing disk (a FUSE mount whose data reads fail with a real EIO from
    the kernel): the same step from the durable tier where it was drained; a step on the fast
    tier only is skipped for the next older one; each with a warning naming the tier, the
    step and the cause. Without faults the fast tier serves the newest step again."""
    from ckptio.testing import faultyfs

    fs = faultyfs.start_or_skip(tmp_path)
    try:
        opts = {**SMALL, "keep_last_local": 4, "persist_every": 2}
        fast, durable = f"file://{fs.mountpoint}/fast", f"file://{tmp_path}/durable"
        with ckptio.Checkpointer(durable, local=fast, **opts) as c:
            for s in range(1, 5):
                c.save(expected_state(s), s)
        assert c.tiers() == {"local": [1, 2, 3, 4], "durable": [1, 3]}
        step3 = fs.faults(["read"], match=f"/{fmt.step_dir(3)}/data/")
        with step3, caplog.at_level("WARNING"), ckptio.Checkpointer(durable, local=fast) as c:
            assert state_mismatch(c.load(3), expected_state(3)) is None
        said = _warnings(caplog)
        assert "step 3 cannot be read from the fast tier" in said, said
        assert "Input/output error" in said and "reading it from the durable tier" in said, said
        caplog.clear()
        every = fs.faults(["read"], match="/data/")
        with every, caplog.at_level("WARNING"), ckptio.Checkpointer(durable, local=fast) as c:
            assert state_mismatch(c.load(), expected_state(3)) is None
        said = _warnings(caplog)
        assert "restoring step 4 failed" in said and "Input/output error" in said, said
        with ckptio.Checkpointer(durable, local=fast) as c:
            assert state_mismatch(c.load(), expected_state(4)) is None
    finally:
        fs.stop()


def test_a_fast_object_that_is_a_symlink_out_of_the_root_falls_back(tmp_path, caplog):
    """A fast-tier data object replaced by a symlink to a file outside the root (the same
    bytes): refused there, read from the durable tier, with a warning; never followed."""
    with tiered(tmp_path, persist_every=1) as c:
        c.save(expected_state(1), 1)
        c.save(expected_state(2), 2)
    data = tmp_path / "fast" / fmt.step_dir(2) / "data"
    victim = sorted(data.iterdir())[0]
    outside = tmp_path / "outside.bin"
    victim.rename(outside)
    victim.symlink_to(outside)
    with caplog.at_level("WARNING"), tiered(tmp_path) as c:
        assert state_mismatch(c.load(), expected_state(2)) is None
    said = _warnings(caplog)
    assert "step 2 cannot be read from the fast tier" in said, said
    assert "outside the root" in said and "reading it from the durable tier" in said, said
    shutil.rmtree(tmp_path / "durable")
    with caplog.at_level("WARNING"), tiered(tmp_path) as c:  # nowhere else: the next older
        assert state_mismatch(c.load(), expected_state(1)) is None


@pytest.mark.s3
def test_a_restore_with_the_durable_tier_down_reads_the_fast_tier(tmp_path, monkeypatch, caplog):
    """The durable tier an S3 endpoint that refuses connections (a moto server the test
    started, then stopped; then a port nobody listens on): a restore takes the newest step
    complete on the fast tier, with a warning that the durable tier cannot be listed; with the
    fast tier empty too it fails naming the durable tier's failure."""
    from ckptio.testing.motoserver import aws_env, boto3_client, start_moto_server

    server, endpoint = start_moto_server()
    try:
        for k, v in aws_env(endpoint).items():
            monkeypatch.setenv(k, v)
        boto3_client(endpoint).create_bucket(Bucket="ckpt")
        with tiered(tmp_path, "s3://ckpt/run", persist_every=2) as c:
            for s in range(1, 4):
                c.save(expected_state(s), s)
            assert [r.status for r in c.wait_drains()] == ["durable"]
    finally:
        server.stop()
    with caplog.at_level("WARNING"), tiered(tmp_path, "s3://ckpt/run") as c:
        assert state_mismatch(c.load(), expected_state(3)) is None
    said = _warnings(caplog)
    assert "the durable tier cannot be listed" in said and "s3://ckpt/run" in said, said
    import socket

    with socket.socket() as sock:  # a port that refuses connections: bound, never listening
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{sock.getsockname()[1]}")
        with tiered(tmp_path, "s3://ckpt/run") as c:
            assert state_mismatch(c.load(2), expected_state(2)) is None
        shutil.rmtree(tmp_path / "fast")
        with (
            tiered(tmp_path, "s3://ckpt/run") as c,
            pytest.raises(
                errors.StorageError,
                match=r"no checkpoint complete .* the durable tier cannot be listed: s3://ckpt/run",
            ),
        ):
            c.load()


# -- a fast root belongs to one job ----------------------------------------------------------------


def test_a_second_job_on_the_same_fast_root_is_refused_and_the_first_keeps_its_steps(tmp_path):
    """Job A's fast root named by job B (another durable root): B is refused at once, naming
    both durable roots, before it saves, retires or restores anything there; A restores its
    own newest step and its drains go on. Before, B's save became what A restored, and B's
    retention retired steps A was draining."""
    shared = f"file://{tmp_path}/shared"
    a_url, b_url = f"file://{tmp_path}/job-a", f"file://{tmp_path}/job-b"
    with ckptio.Checkpointer(a_url, local=shared, keep_last_local=1) as a:
        first = a.save(expected_state(1), 1)
        with pytest.raises(
            errors.InvalidArgumentError,
            match=rf"the fast root {shared} belongs to the job whose durable root is "
            rf"file://{tmp_path}/job-a, not file://{tmp_path}/job-b: a fast root serves one job",
        ):
            ckptio.Checkpointer(b_url, local=shared, keep_last_local=1)
        second = a.save(expected_state(2), 2)
        assert [h.wait_drain().status for h in (first, second)] == ["durable", "durable"]
        assert state_mismatch(a.load(), expected_state(2)) is None
    assert not (tmp_path / "job-b").exists() or not any((tmp_path / "job-b").rglob("*.json"))
    # the same job under another spelling of its durable root is the same job
    with ckptio.Checkpointer(str(tmp_path / "job-a") + "/", local=shared) as again:
        assert state_mismatch(again.load(), expected_state(2)) is None


def _claim_in_a_process(durable: str, roots: list[str], barrier, results) -> None:
    for fast in roots:
        barrier.wait(60)  # both processes claim the same new root at once
        try:
            ckptio.Checkpointer(durable, local=fast).close()
            results.put((fast, durable, ""))
        except errors.InvalidArgumentError as err:
            results.put((fast, durable, str(err)))


def test_two_jobs_claiming_a_new_fast_root_at_once_one_wins(tmp_path):
    """Two processes (two jobs) construct their tiered checkpointers on the same new fast
    root at the same moment, round after round: each time exactly one owns it and the other
    is refused naming the winner's durable root."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    roots = [f"file://{tmp_path}/fast-{i}" for i in range(6)]
    barrier, results = ctx.Barrier(2), ctx.Queue()
    jobs = [
        ctx.Process(
            target=_claim_in_a_process, args=(f"file://{tmp_path}/{n}", roots, barrier, results)
        )
        for n in ("job-a", "job-b")
    ]
    for p in jobs:
        p.start()
    got = [results.get(timeout=120) for _ in range(2 * len(roots))]
    for p in jobs:
        p.join(60)
        assert p.exitcode == 0
    for fast in roots:
        outcome = {durable: err for root, durable, err in got if root == fast}
        winners = [d for d, err in outcome.items() if not err]
        assert len(winners) == 1, outcome
        loser = next(err for err in outcome.values() if err)
        assert f"durable root is {winners[0]}" in loser, loser


def test_a_fast_root_without_an_owner_record(tmp_path, caplog):
    """Steps of an older ckptio's fast root (no owner record) are adopted with a warning that
    names them; an owner record that is not one is refused, not overwritten."""
    with tiered(tmp_path) as c:
        c.save(expected_state(1), 1)
    (tmp_path / "fast" / "fast-tier-owner.json").unlink()
    with caplog.at_level("WARNING"), tiered(tmp_path) as c:
        assert state_mismatch(c.load(), expected_state(1)) is None
    assert "holds steps [1] with no owner record" in _warnings(caplog)
    (tmp_path / "fast" / "fast-tier-owner.json").write_text('{"kind": "something else"}')
    with pytest.raises(errors.InvalidArgumentError, match="is not a fast tier's owner record"):
        tiered(tmp_path)


def test_the_framework_twin_classes_are_deprecated_aliases(tmp_path):
    """Before codecs, ``ckptio.torch``/``ckptio.jax`` each had a ``TieredCheckpointer`` twin;
    the name still works, warns, and is the framework's ``Checkpointer`` (which takes local=)."""
    torch = pytest.importorskip("torch")
    from ckptio import torch as ct

    with pytest.warns(DeprecationWarning, match=r"ckptio.torch.Checkpointer\(url, local=...\)"):
        twin = ct.TieredCheckpointer
    assert twin is ct.Checkpointer
    with twin(f"file://{tmp_path}/durable", local=f"file://{tmp_path}/fast") as c:
        assert c.tiered and isinstance(c, ckptio.Checkpointer)
        c.save({"w": torch.ones(3)}, 1).wait_drain()
        assert torch.equal(c.load()["w"], torch.ones(3))
    with pytest.raises(AttributeError, match="no attribute 'Tiered'"):
        ct.Tiered  # noqa: B018
