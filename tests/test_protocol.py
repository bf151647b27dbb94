"""The save/gc/retention/reader protocol (``ckptio.lease``) against other real processes.

Each test puts a second process beside a save: a default ``ckptio gc`` while a resumed run
saves an older step, a second job whose retention runs while the first job's save is in
flight, readers loading the newest checkpoint while a trainer saves with ``keep_last=1``.
Savers are held at their commit through a pipe (not by sleeping), so the other process acts
exactly while the save's data is written and its manifest is not yet published.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ckptio
from ckptio import checkpoint as ck
from ckptio import errors
from ckptio.registry import open_store
from ckptio.testing.crash import expected_state, state_mismatch

#: many small objects, as a real sharded save has (and so many for gc to take)
OPTS = {"chunk_size": 32 * 1024, "max_object_size": 64 * 1024}

SAVER = textwrap.dedent(
    """
    import json, sys
    import ckptio
    from ckptio.registry import open_store
    from ckptio.testing.crash import expected_state

    url, step, keep_last, opts = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    from ckptio.checkpoint import commit as checkpoint  # where commit_step finds it
    store = open_store(url)
    check = checkpoint.check_objects_present

    def held(*args):  # every object is written, the commit is next: wait for the parent
        print("at-commit", flush=True)
        assert sys.stdin.readline().strip() == "go"
        return check(*args)

    checkpoint.check_objects_present = held
    kw = {"keep_last": int(keep_last)} if keep_last != "-" else {}
    with ckptio.Checkpointer(store, **kw, **opts) as c:
        c.save(expected_state(step), step)
    print("saved", flush=True)
    """
)


def start_held_saver(
    url: str, step: int, *, keep_last: int | None = None, env=None
) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", SAVER, url, str(step), str(keep_last or "-"), json.dumps(OPTS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    line = proc.stdout.readline().strip()
    assert line == "at-commit", (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


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
    finds it gone before publishing and fails; nothing is committed."""
    url = f"file://{tmp_path}/run"
    saver = start_held_saver(url, 3)
    store = open_store(url)
    victim = next(k for k in store.list("step-0000000003/") if "/data/" in k)
    store.delete([victim])
    _out, err = saver.communicate("go\n", timeout=120)
    assert saver.returncode != 0
    assert "vanished before its commit" in err and victim in err, err
    assert ck.committed_steps(store) == []


def test_a_save_whose_lease_lapsed_does_not_commit(tmp_path, monkeypatch):
    """A save held up longer than half its lease (a stalled host) may have had its data taken
    by a gc elsewhere: it fails instead of publishing."""
    from ckptio.backends.local import LocalStore

    from ckptio import lease as leases

    monkeypatch.setattr(leases, "LEASE_SECONDS", 0.4)
    monkeypatch.setattr(leases, "REFRESH_SECONDS", 60.0)  # no refresh in time

    class Stalled(LocalStore):
        def open_writer(self, key, *, size_hint=None):
            time.sleep(0.3)  # the stall under test (while writing data), not a synchronisation
            return super().open_writer(key, size_hint=size_hint)

    store = Stalled(str(tmp_path / "run"))
    with pytest.raises(errors.SaveFailedError, match="unrefreshed"):
        ckptio.save({"x": np.arange(10)}, store, step=1)
    assert ck.committed_steps(store) == []


def test_leases_are_judged_by_heartbeat_from_another_host(tmp_path):
    """A lease held on another host keeps its step while its heartbeat is younger than the
    lease, and is dead after; a lease that does not parse never blocks gc."""
    url = f"file://{tmp_path}/run"
    store = open_store(url)
    store.put("step-0000000004/data/rank-00000-000-aaaaaaaa.bin", b"x" * 10)

    def lease(heartbeat: float) -> None:
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
        store.publish("step-0000000004/saving-aaaaaaaa.json", json.dumps(doc).encode())

    lease(time.time() - 10)
    assert ckptio.collect_garbage(store, unfinished=True) == []
    lease(time.time() - 400)
    assert sorted(ckptio.collect_garbage(store, unfinished=True)) == [
        "step-0000000004/data/rank-00000-000-aaaaaaaa.bin",
        "step-0000000004/saving-aaaaaaaa.json",
    ]
    store.put("step-0000000005/data/rank-00000-000-bbbbbbbb.bin", b"y")
    store.publish("step-0000000005/saving-bbbbbbbb.json", b"\x00not json")
    assert len(ckptio.collect_garbage(store, unfinished=True)) == 2


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
