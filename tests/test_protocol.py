"""The save/gc/retention/reader protocol (``ckptio.lease``) against other real processes.

Each test puts a second process beside a save: a default ``ckptio gc`` while a resumed run
saves an older step, a second job whose retention runs while the first job's save is in
flight, readers loading the newest checkpoint while a trainer saves with ``keep_last=1``.
Savers are held at their commit through a pipe (not by sleeping), so the other process acts
exactly while the save's data is written and its manifest is not yet published.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import ckptio
from ckptio import checkpoint as ck
from ckptio import errors, lease
from ckptio import format as fmt
from ckptio.registry import open_store
from ckptio.testing.crash import expected_state, state_mismatch

#: many small objects, as a real sharded save has (and so many for gc to take)
OPTS = {"chunk_size": 32 * 1024, "max_object_size": 64 * 1024}

SAVER = textwrap.dedent(
    """
    import json, os, signal, sys, threading
    import ckptio
    from ckptio import lease
    from ckptio.registry import open_store
    from ckptio.testing.crash import expected_state

    url, step, keep_last, opts, hold = sys.argv[1:6]
    step, opts = int(step), json.loads(opts)
    if hold == "stop":  # a lease that lapses within seconds of the pause under test
        lease.LEASE_SECONDS, lease.REFRESH_SECONDS = 2.0, 0.25
    local = opts.pop("local", None)
    kw = {"keep_last": int(keep_last)} if keep_last != "-" else {}
    ck = ckptio.Checkpointer(url, local=local, **kw, **opts) if local else None
    store = ck.store if ck else open_store(url)  # the durable tier, where a drain commits
    publish = store.publish

    def held(key, data, **options):  # every object is written, the manifest is next
        if key.endswith("/manifest.json"):
            print("at-commit", os.getpid(), flush=True)
            if hold == "stop":  # every thread stops, the lease's too; sent to this thread,
                # which stops before it goes on (a signal to the process may be taken by
                # another thread, and this one run on until that one is scheduled)
                signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            else:
                assert sys.stdin.readline().strip() == "go"
        return publish(key, data, **options)

    store.publish = held
    try:
        if ck is None:
            with ckptio.Checkpointer(store, **kw, **opts) as c:
                c.save(expected_state(step), step)
        else:
            with ck:
                drain = ck.save(expected_state(step), step).wait_drain()
            if drain.status != "durable":
                raise ckptio.errors.SaveFailedError(f"drain {drain.status}: {drain.error}")
    except ckptio.errors.SaveFailedError as err:
        print("failed", err, flush=True)
        sys.exit(3)
    print("saved", flush=True)
    """
)

ELSEWHERE = ("unshare", "--uts", "sh", "-c", 'hostname elsewhere && exec "$@"', "sh")
"""A command prefix that runs a process as if on another host (its own UTS namespace, so
``socket.gethostname()`` differs): leases are then judged as a remote host's are, by time,
not by whether the process runs here."""


def elsewhere() -> tuple[str, ...]:
    """:data:`ELSEWHERE`, or a skip (a failure under ``CI=true``) where namespaces are
    refused (not root)."""
    probe = subprocess.run([*ELSEWHERE, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        reason = f"cannot make a UTS namespace (root needed): {probe.stderr.strip()}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return ELSEWHERE


def start_held_saver(
    url: str,
    step: int,
    *,
    keep_last: int | None = None,
    env=None,
    hold: str = "stdin",
    prefix: tuple[str, ...] = (),
    local: str | None = None,
) -> subprocess.Popen:
    """A process saving ``expected_state(step)`` under ``url`` (through a tiered checkpointer
    with fast tier ``local``), held just before it publishes its manifest: until it reads
    ``go`` (``hold="stdin"``), or stopped by SIGSTOP with a 2 s lease (``hold="stop"``: its
    pid in ``proc.saver_pid``)."""
    opts = {**OPTS, **({"local": local} if local else {})}
    args = [url, str(step), str(keep_last or "-"), json.dumps(opts), hold]
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", SAVER, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    line = proc.stdout.readline().split()
    assert line[:1] == ["at-commit"], (line, proc.stderr.read() if proc.poll() is not None else "")
    proc.saver_pid = int(line[1])  # type: ignore[attr-defined]
    if hold == "stop":
        wait_until(lambda: _state(proc.saver_pid) == "T", "the saver to stop")  # type: ignore[attr-defined]
    return proc


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_until(done, what: str, timeout: float = 60.0) -> None:
    """Poll ``done()`` until it is true (a condition, not a guess at a duration)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, err
    assert out.strip() == "saved", (out, err)


def committed_whole(url: str, step: int) -> None:
    """The step is committed, every object its manifest names is there, every CRC matches and
    the state is exactly the one saved."""
    assert ckptio.verify(url, step) == []
    assert state_mismatch(ckptio.load(url, step), expected_state(step)) is None


TARGETS = pytest.mark.parametrize(
    ("target", "s3_target"),
    [
        pytest.param("file", "moto", id="file"),
        pytest.param("s3", "moto", marks=pytest.mark.s3, id="s3-moto"),
        pytest.param("s3", "rgw", marks=[pytest.mark.s3, pytest.mark.rgw], id="s3-rgw"),
    ],
    indirect=True,
)
"""A root on ``file://``, and on ``s3://`` against the moto server and against Ceph RGW (a
real S3 implementation; one server for the session, ``s3_target``)."""


@pytest.fixture
def target(request, tmp_path, s3_target):
    """``(url, environment)`` of a fresh root of the kind the test is parametrized with."""
    if request.param == "file":
        return f"file://{tmp_path}/run", None
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/run", request.getfixturevalue("s3_env")


@TARGETS
def test_default_gc_spares_a_resumed_runs_older_save(target):
    """Steps 100 and 50 are committed; a resumed run saves step 60 (older than the newest) while
    ``ckptio gc URL`` runs with its default settings: gc takes none of the save's objects, and
    the save commits a checkpoint that verifies."""
    url, env = target
    for step in (100, 50):
        ckptio.save(expected_state(step), url, step=step, **OPTS)
    saver = start_held_saver(url, 60, env=env)
    with open_store(url) as store:
        written = [k for k in store.list("step-0000000060/") if "/data/" in k]
    assert len(written) > 20
    gc = subprocess.run(
        [sys.executable, "-m", "ckptio.cli", "gc", url, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
    assert gc.returncode == 0, gc.stderr
    assert not [k for k in json.loads(gc.stdout)["removed"] if k.startswith("step-0000000060/")]
    finish(saver)
    committed_whole(url, 60)
    assert ckptio.Checkpointer(url).steps() == [50, 60, 100]


@TARGETS
def test_another_jobs_retention_spares_a_save_in_flight(target, caplog):
    """Two jobs with ``keep_last=2`` on one root: job B's save of step 7 is in flight while job
    A saves steps 8-10 with retention. A's retention leaves B's data alone, B commits whole,
    and A is told that another process saves under its root."""
    url, env = target
    saver = start_held_saver(url, 7, keep_last=2, env=env)
    with (
        caplog.at_level("WARNING", logger="ckptio.checkpoint"),
        ckptio.Checkpointer(url, keep_last=2, **OPTS) as a,
    ):
        for step in (8, 9, 10):
            a.save(expected_state(step), step)
    assert any(
        "another process is saving" in r.getMessage() and f"pid {saver.pid}" in r.getMessage()
        for r in caplog.records
    ), caplog.text
    finish(saver)
    committed_whole(url, 7)


def test_a_manifest_never_names_a_missing_object(tmp_path):
    """Whatever deletes an object behind the protocol's back (a person, an old tool): the save
    finds it gone when it lists its step after publishing, withdraws its manifest and fails."""
    url = f"file://{tmp_path}/run"
    saver = start_held_saver(url, 3)
    store = open_store(url)
    victim = next(k for k in store.list("step-0000000003/") if "/data/" in k)
    store.delete([victim])
    out, err = saver.communicate("go\n", timeout=120)
    assert saver.returncode == 3, err
    assert "lost 1 object(s) before its commit" in out and victim in out, out
    assert "manifest was withdrawn" in out, out
    assert ck.committed_steps(store) == []


def run_gc_until(url: str, env, removed: str) -> list[str]:
    """Run ``ckptio gc URL`` (default settings, a real process each time) until one run
    removes an object whose key starts with ``removed``; the keys that run removed."""
    got: list[str] = []

    def once() -> bool:
        gc = subprocess.run(
            [sys.executable, "-m", "ckptio.cli", "gc", url, "--json"],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=120,
        )
        assert gc.returncode == 0, gc.stderr
        got[:] = json.loads(gc.stdout)["removed"]
        return any(k.startswith(removed) for k in got)

    try:
        wait_until(once, f"gc to remove {removed}*")
    except AssertionError as err:
        with open_store(url) as store:
            listing = store.list(removed.partition("/")[0] + "/")
            leases = [lease.read_lease(store, k) for k in listing if lease.is_holder_key(k)]
        others = [k for k in listing if "/data/" not in k]
        raise AssertionError(
            f"{err}; last gc removed {got}; {len(listing) - len(others)} data objects, "
            f"{others}, {leases}"
        ) from None
    return got


def loads_cleanly(url: str, step: int) -> None:
    """``load(url)`` returns ``step``, exact, with no warning (no damaged step above it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert state_mismatch(ckptio.load(url), expected_state(step)) is None


@TARGETS
@pytest.mark.parametrize("tiered", [False, True], ids=["save", "drain"])
def test_a_save_paused_past_its_lease_while_gc_takes_its_data_fails(target, tiered, tmp_path):
    """A save (or a tiered checkpoint's drain to the durable tier) on another host, every
    object written, is stopped (SIGSTOP) just before it publishes its manifest, for longer than
    its (2 s) lease; meanwhile a default ``ckptio gc`` removes the step's data. Resumed (SIGCONT),
    it publishes, lists its step, finds its objects gone, withdraws the manifest and fails:
    nothing names a missing object, and ``load`` returns the previous step, undamaged."""
    url, env = target
    prefix = elsewhere()
    local = f"file://{tmp_path}/fast" if tiered else None
    ckptio.save(expected_state(1), url, step=1, **OPTS)
    saver = start_held_saver(url, 2, env=env, hold="stop", prefix=prefix, local=local)
    try:
        removed = run_gc_until(url, env, "step-0000000002/data/")
    except AssertionError as failure:
        os.kill(saver.saver_pid, signal.SIGCONT)
        raise AssertionError(f"{failure}; the saver: {saver.communicate(timeout=120)}") from None
    os.kill(saver.saver_pid, signal.SIGCONT)
    out, err = saver.communicate(timeout=120)
    assert saver.returncode == 3, (out, err)
    # withdrawn after publishing (gc removed the objects), or refused at the publish (gc
    # removed the step's directory with them)
    assert out.startswith("failed"), out
    assert len(removed) > 5
    with open_store(url) as store:
        assert ck.committed_steps(store) == [1]
        assert [s.state for s in ck.list_steps(store) if s.step == 1] == ["complete"]
    loads_cleanly(url, 1)


GC_HELD = textwrap.dedent(
    """
    import sys
    from ckptio import checkpoint
    from ckptio.registry import open_store

    store = open_store(sys.argv[1])
    delete = store.delete

    def held(keys):  # the fence is up, the step listed again: the deletes are next
        keys = list(keys)
        if any("/data/" in k for k in keys):
            print("fenced", flush=True)
            assert sys.stdin.readline().strip() == "go"
        return delete(keys)

    store.delete = held
    while not checkpoint.collect_garbage(store):
        pass  # until the saver's lease has lapsed (2 s) and its step is collected
    print("collected", flush=True)
    """
)


def test_a_save_resumed_while_gc_holds_its_fence_withdraws(tmp_path):
    """The other order: a stopped save's lease lapses, a gc publishes its fence and lists the
    step (no manifest: it may delete) and is held there; the save resumes, publishes its
    manifest, lists its step, meets the fence and withdraws. Then gc deletes. Neither the
    save's pre-pause checks nor a manifest published a moment before the deletes commit it."""
    url = f"file://{tmp_path}/run"
    ckptio.save(expected_state(1), url, step=1, **OPTS)
    saver = start_held_saver(url, 2, hold="stop", prefix=elsewhere())
    gc = subprocess.Popen(
        [sys.executable, "-c", GC_HELD, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert gc.stdout.readline().strip() == "fenced", gc.stderr.read()
    finally:
        os.kill(saver.saver_pid, signal.SIGCONT)
        out, err = saver.communicate(timeout=120)
        gc_out, gc_err = gc.communicate("go\n", timeout=120)
    assert gc.returncode == 0 and gc_out.strip() == "collected", gc_err
    assert saver.returncode == 3, (out, err)
    assert "fenced by a gc" in out and "manifest was withdrawn" in out, out
    with open_store(url) as store:
        assert ck.committed_steps(store) == [1]
        assert not store.list("step-0000000002/")
    loads_cleanly(url, 1)


SKEWED_SAVER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import ckptio

    url, seconds = sys.argv[1], float(sys.argv[2])
    ok, failed, step = [], [], 1
    deadline = time.monotonic() + seconds
    with ckptio.Checkpointer(url, chunk_size=16384, max_object_size=16384) as c:
        while time.monotonic() < deadline:
            try:
                c.save({"w": np.full(16384, step, np.int32), "step": step}, step)
                ok.append(step)
            except ckptio.errors.SaveFailedError as err:
                failed.append(f"step {step}: {err}"[:300])
            step += 1
    print(json.dumps({"ok": ok, "failed": failed, "clock": time.time()}))
    """
)

GC_LOOP = textwrap.dedent(
    """
    import json, sys
    from ckptio import checkpoint
    from ckptio.registry import open_store

    store, sweeps, removed = open_store(sys.argv[1]), 0, 0
    while not sys.stdin.closed and not __import__("select").select([sys.stdin], [], [], 0)[0]:
        # ckptio gc's defaults: temp files younger than an hour stay (they may be a save's)
        removed += len(checkpoint.collect_garbage(store, older_than=3600))
        sweeps += 1
    print(json.dumps({"sweeps": sweeps, "removed": removed}))
    """
)

SKEW_SECONDS = 10.0
"""How long the clock-skewed saver saves beside the gc loop: on a disk and on moto, dozens of
saves and sweeps (a judge of leases by the saver's clock takes the first save a sweep meets)."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "s3_target"),
    [
        pytest.param("file", "moto", id="file"),
        pytest.param("s3", "moto", marks=pytest.mark.s3, id="s3-moto"),
    ],
    indirect=True,
)
def test_a_saver_ten_minutes_behind_saves_beside_a_gc_loop(target):
    """A saver on another host whose clock runs 10 minutes behind (libfaketime; the machine's
    clock is untouched) saves step after step for SKEW_SECONDS while a gc loop (default settings)
    sweeps the root. Its leases are judged by the storage's clock, so gc never takes a save in
    flight: every save returns OK, and every step it committed is complete."""
    url, env = target
    if shutil.which("faketime") is None:
        reason = "faketime is not installed (apt-get install faketime)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    full_env = {**os.environ, **(env or {})}
    gc = subprocess.Popen(
        [sys.executable, "-c", GC_LOOP, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    skewed = ("env", "DONT_FAKE_MONOTONIC=1", "faketime", "-f", "-600")
    try:
        saver = subprocess.run(
            [*elsewhere(), *skewed, sys.executable, "-c", SKEWED_SAVER, url, str(SKEW_SECONDS)],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=SKEW_SECONDS + 300,
        )
    finally:
        gc_out, gc_err = gc.communicate("stop\n", timeout=300)
    assert saver.returncode == 0, saver.stderr
    assert gc.returncode == 0, gc_err
    result, sweeps = json.loads(saver.stdout), json.loads(gc_out)
    print(len(result["ok"]), "saves;", sweeps)
    assert abs(result["clock"] + 600 - time.time()) < 60, "the saver's clock was not skewed"
    assert result["failed"] == [], result["failed"][:5]
    assert len(result["ok"]) >= 10 and sweeps["sweeps"] >= 10, (len(result["ok"]), sweeps)
    with open_store(url) as store:
        steps = {s.step: s for s in ck.list_steps(store)}
    damaged = [s for s in result["ok"] if steps.get(s) is None or steps[s].state != "complete"]
    assert damaged == [], [steps.get(s) for s in damaged[:3]]
    assert ckptio.verify(url, result["ok"][-1]) == []


def test_leases_are_judged_by_the_storage_clock_from_another_host(tmp_path):
    """A lease held on another host keeps its step while the storage wrote it less than a
    lease ago, whatever its holder's heartbeat says (a clock minutes off), and is dead after;
    a lease that does not parse never blocks gc."""
    url = f"file://{tmp_path}/run"
    store = open_store(url)
    store.put("step-0000000004/data/rank-00000-000-aaaaaaaa.bin", b"x" * 10)
    key = "step-0000000004/saving-aaaaaaaa.json"

    def lease(heartbeat: float, written_ago: float) -> None:
        doc = {
            "kind": "ckptio-save-lease",
            "version": 1,
            "step": 4,
            "token": "aaaaaaaa",
            "host": "elsewhere",
            "boot_id": "",
            "pid": 1,
            "start_ticks": None,
            "heartbeat": heartbeat,
            "lease_seconds": 300.0,
        }
        store.publish(key, json.dumps(doc).encode())
        when = time.time() - written_ago  # the storage's stamp (the filesystem's mtime)
        os.utime(tmp_path / "run" / key, (when, when))

    lease(time.time() - 3600, written_ago=10)  # a holder an hour behind, refreshed 10 s ago
    assert ckptio.collect_garbage(store, unfinished=True) == []
    lease(time.time() + 3600, written_ago=400)  # a holder an hour ahead, silent for 400 s
    assert sorted(ckptio.collect_garbage(store, unfinished=True)) == [
        "step-0000000004/data/rank-00000-000-aaaaaaaa.bin",
        "step-0000000004/saving-aaaaaaaa.json",
    ]
    store.put("step-0000000005/data/rank-00000-000-bbbbbbbb.bin", b"y")
    store.publish("step-0000000005/saving-bbbbbbbb.json", b"\x00not json")
    assert len(ckptio.collect_garbage(store, unfinished=True)) == 2
    assert not [k for k in store.list("") if "fence-" in k], "a gc left its fence behind"


def test_a_step_left_half_retired_stays_whole_until_retention_retires_it_again(tmp_path):
    """A retention killed between a step's retired mark and its manifest's removal leaves the
    step marked and committed: it still loads whole, gc past the grace keeps every object its
    manifest names, and the next retention finishes retiring it."""
    url = f"file://{tmp_path}/run"
    with ckptio.Checkpointer(url, keep_last=None) as ck_:
        for step in (1, 2, 3):
            ck_.save({"w": np.full(1000, step, dtype=np.float32)}, step)
    with open_store(url) as store:
        mark = {"retired": time.time() - 3600, "host": "elsewhere", "boot_id": ""}
        store.publish(lease.retired_key(1), json.dumps(mark).encode())  # the kill: no delete
        assert ckptio.collect_garbage(store, grace=0) == []
        assert np.all(ckptio.load(url, 1)["w"] == 1)
        assert ck.committed_steps(store) == [1, 2, 3]
        ck.retention.retain(store, 3, keep_last=2, grace=0)
        assert ck.committed_steps(store) == [2, 3]
        assert not store.list(fmt.step_dir(1) + "/")


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
def test_debris_stamped_in_the_future_is_removed_at_any_age(tmp_path, direct):
    """A temp file whose time is ahead of this host's clock (its writer's clock runs ahead,
    or its last write landed after cleanup read the clock) is young by any ``older_than``
    above zero and removed by ``older_than=0``, which means "whatever its age"."""
    from ckptio.backends.local import LocalStore

    store = LocalStore(str(tmp_path), direct=direct)
    w = store.open_writer("crash/obj.bin", size_hint=1 << 20)
    w.write(np.ones(1 << 20, dtype=np.uint8))
    try:
        (debris,) = store.list_incomplete("crash/")
        (path,) = (tmp_path / "crash").iterdir()
        ahead = time.time() + 60
        os.utime(path, (ahead, ahead))
        assert store.cleanup_incomplete("crash/", older_than=1) == 0
        assert store.list_incomplete("crash/") == [debris]
        assert store.cleanup_incomplete("crash/") == 1
        assert store.list_incomplete("crash/") == []
    finally:
        with contextlib.suppress(errors.CkptioError):
            w.abort()
        store.close()


# -- readers beside a trainer that saves with keep_last=1 ---------------------------------------

TRAINER = textwrap.dedent(
    """
    import sys, numpy as np, ckptio
    url, grace = sys.argv[1], float(sys.argv[2])
    kw = {} if grace < 0 else {"retire_grace": grace}
    with ckptio.Checkpointer(url, keep_last=1, max_object_size=4096, **kw) as c:
        step = 1
        while True:
            c.save({"a": np.full(1024, step, np.int32), "b": np.full(512, -step, np.int64),
                    "c": np.full(1024, step, np.float32), "step": step}, step)
            if step == 1:
                print("first", flush=True)
            step += 1
            import select
            if select.select([sys.stdin], [], [], 0)[0]:
                break
    """
)

READER = textwrap.dedent(
    """
    import collections, json, sys, numpy as np, ckptio
    url, n = sys.argv[1], int(sys.argv[2])
    failures, steps = collections.Counter(), set()
    store = ckptio.open_store(url)  # an evaluation job keeps its store (and S3 client)
    for _ in range(n):
        try:
            s = ckptio.load(store)
        except Exception as err:
            failures[f"{type(err).__name__}: {str(err)[:120]}"] += 1
            continue
        k = s["step"]
        ok = (np.all(s["a"] == k) and np.all(s["b"] == -k) and np.all(s["c"] == k)
              and s["a"].shape == (1024,) and s["b"].shape == (512,))
        if not ok:
            failures["a state mixed from several steps"] += 1
        steps.add(k)
    print(json.dumps({"loads": n, "failures": dict(failures), "steps": len(steps)}))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "loads", "grace", "s3_target"),
    [
        pytest.param("file", 2000, -1, "moto", id="file-2000"),
        pytest.param("file", 600, 0.0, "moto", id="file-no-grace-600"),
        pytest.param("s3", 200, -1, "moto", marks=pytest.mark.s3, id="s3-moto-200"),
        # the 200 loads the guarantee is measured with run on moto; on RGW, 60 check the same
        # protocol against a real S3 implementation within CI's time budget
        pytest.param("s3", 60, -1, "rgw", marks=[pytest.mark.s3, pytest.mark.rgw], id="s3-rgw-60"),
    ],
    indirect=["s3_target"],
)
def test_loads_beside_saves_with_retention_never_fail(
    request, tmp_path, kind, loads, grace, s3_target
):
    """A trainer saves step after step with ``keep_last=1`` (so each commit retires the previous
    step) while a reader loads the newest checkpoint ``loads`` times: every load returns a
    complete checkpoint of one step, never an error. ``grace=0`` removes retired data at once,
    so readers must fall back to the newest step when it goes under them."""
    env = {}
    if kind == "file":
        url = f"file://{tmp_path}/run"
    else:
        url = f"s3://{request.getfixturevalue('s3_bucket')}/run"
        env = request.getfixturevalue("s3_env")
    full_env = {**os.environ, **env}
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, url, str(grace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    try:
        assert trainer.stdout.readline().strip() == "first", trainer.stderr.read()
        reader = subprocess.run(
            [sys.executable, "-c", READER, url, str(loads)],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=900,
        )
        assert reader.returncode == 0, reader.stderr
        summary = json.loads(reader.stdout)
    finally:
        _out, err = trainer.communicate("stop\n", timeout=120)
    assert trainer.returncode == 0, err
    print(summary)
    assert summary["failures"] == {}, summary
    assert summary["steps"] >= 10, f"the trainer did not save beside the reader: {summary}"


def test_a_listing_that_missed_every_manifest_is_taken_again(tmp_path):
    """A local listing scans one step directory after another, so a save that commits step 2
    and retires step 1 between the two scans hides both manifests from it (the race behind
    rare failures of the test above). The reader lists again instead of reporting that there is
    no checkpoint; here the first listing is made to miss the manifest."""
    from ckptio.backends.local import LocalStore

    url = f"file://{tmp_path}/run"
    ckptio.save(expected_state(1), url, step=1)

    class RacedListing(LocalStore):
        raced = 0

        def list(self, prefix: str = "") -> list[str]:
            keys = super().list(prefix)
            if prefix == "step-" and not self.raced:
                self.raced += 1
                return [k for k in keys if not k.endswith("/manifest.json")]
            return keys

    store = RacedListing(url)
    assert state_mismatch(ckptio.load(store), expected_state(1)) is None
    assert store.raced == 1
    with pytest.raises(errors.NotFoundError, match="no complete checkpoint"):
        ckptio.load(f"file://{tmp_path}/empty")


def test_retention_leaves_young_temp_files_of_other_saves(tmp_path):
    """A save's lease is a temp file for the instant before it is published, and its first data
    objects are temp files until closed: retention, which runs beside other jobs' saves, leaves
    temp files younger than ``TEMP_MIN_AGE_SECONDS`` alone (a killed save's, beside its dead
    lease, go at once)."""
    url = f"file://{tmp_path}/run"
    store = open_store(url)
    w = store.open_writer("step-0000000009/data/rank-00000-000-cafecafe.bin")
    w.write(b"another job, starting its save")
    w._wait()
    assert store.list_incomplete("step-0000000009/")
    with ckptio.Checkpointer(url, keep_last=1) as c:
        for step in (1, 2):
            c.save({"x": np.arange(4) + step}, step)
    assert store.list_incomplete("step-0000000009/"), "retention removed another save's temp file"
    w.abort()


# -- a damaged step: load falls back, ls says so ------------------------------------------------


def _damaged_root(tmp_path, how: str) -> tuple[str, str]:
    """Steps 1 and 2 committed, then one object of step 2 removed (``missing``) or one byte
    of it flipped (``flipped``); the URL and the object's key."""
    url = f"file://{tmp_path}/run"
    for step in (1, 2):
        ckptio.save(expected_state(step), url, step=step, **OPTS)
    with open_store(url) as store:
        victim = sorted(k for k in store.list("step-0000000002/") if "/data/" in k)[3]
        if how == "missing":
            store.delete([victim])
        else:
            path = tmp_path / "run" / victim
            data = bytearray(path.read_bytes())
            data[100] ^= 0xFF
            path.write_bytes(bytes(data))
    return url, victim


@pytest.mark.parametrize("how", ["missing", "flipped"])
def test_load_falls_back_past_a_damaged_step_and_says_so(tmp_path, how):
    """The newest step's manifest names an object that is missing (or damaged): ``load`` and
    ``Checkpointer.load`` return the newest step that loads, warning which step they skipped
    and why; an explicit ``step`` still raises; ``ckptio ls`` calls the step damaged and
    ``verify`` names the object."""
    url, victim = _damaged_root(tmp_path, how)
    why = "missing" if how == "missing" else "CRC32C mismatch"
    with pytest.warns(errors.DamagedCheckpointWarning, match=f"step 2.*{victim}.*{why}"):
        assert state_mismatch(ckptio.load(url), expected_state(1)) is None
    with (
        pytest.warns(errors.DamagedCheckpointWarning, match="skipping step 2"),
        ckptio.Checkpointer(url) as c,
    ):
        assert state_mismatch(c.load(), expected_state(1)) is None
    with pytest.raises(errors.CorruptCheckpointError, match=victim):
        ckptio.load(url, step=2)
    assert any(victim in p for p in ckptio.verify(url, 2))
    ls = subprocess.run(
        [sys.executable, "-m", "ckptio.cli", "ls", url, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ls.returncode == 0, ls.stderr
    rows = {r["step"]: r for r in json.loads(ls.stdout)}
    assert rows[1]["state"] == "complete" and rows[1]["complete"]
    if how == "missing":  # ls lists and sizes objects; it does not read them (verify does)
        assert rows[2]["state"] == "damaged" and not rows[2]["complete"], rows[2]
        assert victim in rows[2]["problem"] and "missing" in rows[2]["problem"], rows[2]
        table = subprocess.run(
            [sys.executable, "-m", "ckptio.cli", "ls", url], capture_output=True, text=True
        )
        (line,) = [ln for ln in table.stdout.splitlines() if ln.strip("| ").startswith("2 ")]
        assert "damaged" in line and "complete" not in line, table.stdout


def test_a_root_of_damaged_steps_raises_the_newest_damage(tmp_path):
    """When no step loads, ``load`` raises the newest step's damage (after warning about
    it), never a checkpoint in part."""
    url, victim = _damaged_root(tmp_path, "missing")
    with open_store(url) as store:
        store.delete([next(k for k in store.list("step-0000000001/") if "/data/" in k)])
    with (
        pytest.warns(errors.DamagedCheckpointWarning),
        pytest.raises(errors.CorruptCheckpointError, match=victim),
    ):
        ckptio.load(url)


# -- a benchmark run beside a training job's save ----------------------------------------------

RUN = ["--preset", "llama3-8b", "--total-size", "8MiB", "--object-size", "1MiB", "--no-read"]


def run_cli(url: str, tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    """``ckptio run URL`` (a small workload), its result files under ``tmp_path``."""
    out = str(tmp_path / "out")
    return subprocess.run(
        [sys.executable, "-m", "ckptio.cli", "run", url, *RUN, "--out", out, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_benchmark_run_never_takes_a_step_a_save_holds(tmp_path):
    """A training job committed step 300 and its slow save of step 301 is in flight.
    ``ckptio run ROOT`` refuses the root (its synthetic step would be newer than the job's,
    and load() returns the newest), naming the save in flight; with ``--share-root`` it
    numbers its step after 301 and deletes it once read, the job's save then commits, and
    ``load(ROOT)`` returns the job's step 301."""
    url = f"file://{tmp_path}/run"
    ckptio.save(expected_state(300), url, step=300, **OPTS)
    saver = start_held_saver(url, 301)
    try:
        refused = run_cli(url, tmp_path)
        assert refused.returncode != 0, refused.stdout
        assert "a save in flight at step 301" in refused.stderr, refused.stderr
        assert f"pid {saver.saver_pid}" in refused.stderr and "--share-root" in refused.stderr
        shared = run_cli(url, tmp_path, "--share-root", "--json")
        assert shared.returncode == 0, shared.stderr
    finally:
        finish(saver)
    with open_store(url) as store:
        assert ck.committed_steps(store) == [300, 301]
        runs = {s for s in ck.list_steps(store) if s.step > 301}
    assert not runs, runs  # --keep none: nothing of the run is left
    loads_cleanly(url, 301)


def test_a_run_into_a_root_of_runs_goes_on_and_keeps_its_last_step(tmp_path):
    """A root that holds only earlier runs' checkpoints is a run's to use: a second run
    numbers its step after the first one's kept step, and keeps its own last one."""
    url = f"file://{tmp_path}/bench"
    for _ in range(2):
        r = run_cli(url, tmp_path)
        assert r.returncode == 0, r.stderr
    with open_store(url) as store:
        assert ck.committed_steps(store) == [0, 1]
    assert ckptio.open_checkpoint(url).metadata["synthetic"] is True
