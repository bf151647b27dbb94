"""What a second node changes, on the namespace cluster: a node's local tier that the others
cannot see, a rank restored on a replacement node (its disk empty) from the durable tier
bit for bit, gc and retention run from another node beside a save, and leases judged on a
host with another name and a clock that differs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio.checkpoint import committed_steps
from ckptio.registry import open_store
from ckptio.testing.cluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WORKERS = Path(__file__).resolve().parent / "cluster"
SPREAD = ["-N3", "--ntasks-per-node=2", "--mpi=pmix"]
NODE_OF = {0: "node0", 1: "node0", 2: "node1", 3: "node1", 4: "node2", 5: "node2"}


def rank_lines(out: str) -> dict[int, dict[str, Any]]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {d["rank"]: d for d in lines}


def test_a_rank_restored_on_a_replacement_node_reads_the_durable_tier_bit_identical(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Steps 1 (drained) and 2 (fast tier only) saved on 3 nodes; node2 dies and a new node2
    (same name, empty disk) replaces it. The restore takes step 1, the newest step every rank
    still has somewhere: node0's and node1's ranks from their own disks, node2's from the
    durable tier; every rank's box is bit-identical to what was saved."""
    run = f"replace-{uuid.uuid4().hex[:6]}"
    durable = f"pfs://{cluster.cephfs}/{run}"
    local = f"file://{cluster.local}/{run}/{{rank}}"
    worker = [sys.executable, str(WORKERS / "tiered_node.py")]
    saved = rank_lines(
        cluster.srun([*SPREAD, *worker, "save", durable, local], cwd=str(tmp_path)).stdout
    )
    assert {r: d["host"] for r, d in saved.items()} == NODE_OF
    for d in saved.values():
        assert d["tiers"] == {"local": [1, 2], "durable": [1]}, d

    cluster.kill_node("node2")
    cluster.start_node("node2")
    assert cluster.run("node2", ["ls", "-A", cluster.local]).stdout == ""

    restored = rank_lines(
        cluster.srun([*SPREAD, *worker, "restore", durable, local], cwd=str(tmp_path)).stdout
    )
    assert {r: d["host"] for r, d in restored.items()} == NODE_OF
    for rank, d in restored.items():
        assert d["step"] == 1 and d["sha"] == saved[rank]["sha"]["1"], (rank, d)
        if NODE_OF[rank] == "node2":  # the replacement: nothing of its own to read
            assert d["fast_bytes"] == 0 and d["durable_bytes"] > 0, d
        else:
            assert d["fast_bytes"] > 0 and d["durable_bytes"] == 0, d


def test_every_node_making_one_new_directory_at_once_on_glusterfs(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Four processes on each of the three nodes publish into the same new directories at
    the same moment, 60 rounds: every publish succeeds and lands. GlusterFS's DHT creates a
    directory brick by brick, and a ``mkdir`` that loses that race answers EEXIST while the
    directory cannot yet be looked up, or ESTALE, or ENODATA; before the store waited for
    it, a few publishes in 60 rounds failed so (and a 3-node save with "File exists")."""
    rounds, procs = 60, 4
    url = f"pfs://{cluster.gluster}/new-dirs-{uuid.uuid4().hex[:6]}"
    start = time.time() + 5  # every node's processes started and waiting
    workers = [
        cluster.popen(
            node,
            [
                sys.executable,
                str(WORKERS / "new_dirs.py"),
                url,
                str(start),
                str(rounds),
                str(procs),
            ],
            cwd=str(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for node in cluster.nodes
    ]
    failures = []
    for node, w in zip(cluster.nodes, workers, strict=True):
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, (node, err)
        failures += [f"{node}: {f}" for f in json.loads(out.splitlines()[-1])["failures"]]
    assert failures == []
    store = open_store(url)
    landed = store.list("")
    assert len(landed) == rounds * procs * len(cluster.nodes)


@pytest.mark.parametrize("fs", ["cephfs", "gluster"])
def test_gc_and_retention_from_another_node_beside_a_save(
    cluster: Cluster, tmp_path: Path, fs: str
) -> None:
    """Saves on node0 and node1 (4 ranks) while node2 applies retention (keep 1) and gc with
    no grace, round after round: every save commits with every object its manifest names,
    and what remains is the newest checkpoint, whole (every CRC32C checked). On CephFS (one
    metadata server) and on GlusterFS (no metadata server: each client hashes names to
    bricks, and a directory is made and removed brick by brick)."""
    point = cluster.cephfs if fs == "cephfs" else cluster.gluster
    url = f"pfs://{point}/beside-{uuid.uuid4().hex[:6]}"
    done = tmp_path / "done"
    other = cluster.popen(
        "node2",
        [sys.executable, str(WORKERS / "other_node.py"), url, str(done)],
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        saves = cluster.srun(
            [
                "-N2",
                "-w",
                "node0,node1",
                "--ntasks-per-node=2",
                "--mpi=pmix",
                sys.executable,
                str(WORKERS / "save_loop.py"),
                url,
                "5",
                str(done),
            ],
            cwd=str(tmp_path),
        )
        out, err = other.communicate(timeout=120)
    finally:
        done.touch()
        if other.poll() is None:
            other.kill()
            other.wait()
    assert other.returncode == 0, err
    steps = [json.loads(line) for line in saves.stdout.splitlines() if line.startswith("{")]
    assert [s["step"] for s in steps] == list(range(1, 6))
    assert all(s["missing"] == [] for s in steps), steps
    beside = json.loads(out.strip().splitlines()[-1])
    assert beside["rounds"] > 0 and beside["first"] < steps[-1]["start"]  # it ran beside them
    assert any("step-0000000001/" in k for k in beside["removed"])  # retention did remove
    left = committed_steps(open_store(url))
    assert left[-1] == 5 and 1 not in left, left  # how far retention got: the machine's pace
    assert ckptio.verify(url, step=5) == []


# -- leases across hosts ---------------------------------------------------------------------


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def stopped_child(saver: subprocess.Popen[str]) -> int:
    """The pid of the process ``saver`` (an nsenter into a node) forked, once it has stopped
    itself (SIGSTOP) at its pause."""
    deadline = time.monotonic() + 120
    pid = 0
    while not pid or not _stopped(pid):
        assert saver.poll() is None, saver.communicate()
        assert time.monotonic() < deadline, "the save did not reach its pause"
        time.sleep(0.05)  # polling another process's state: no event to wait on
        kids = Path(f"/proc/{saver.pid}/task/{saver.pid}/children").read_text().split()
        pid = pid or (int(kids[0]) if kids else 0)  # nsenter forks it into the node
    return pid


def resume(saver: subprocess.Popen[str], pid: int) -> tuple[str, str]:
    """SIGCONT to the stopped save and its nsenter; its output once it has ended. nsenter
    stops itself when its child stops (as a shell's job would), and resumes the child when it
    is resumed: both get SIGCONT."""
    for stopped in (saver.pid, pid):
        os.kill(stopped, signal.SIGCONT)
    return saver.communicate(timeout=120)


def paused_save_beside_gc(cluster: Cluster, tmp_path: Path, skew: str) -> dict[str, Any]:
    """A save on node0 stops itself mid-save (its lease published, one object complete); gc
    runs on node1 (``skew``: ``gc+10min`` puts gc's wall clock 10 minutes ahead,
    ``saver-10min`` the saver's 10 minutes behind: tests/cluster/skewed.py); the save resumes.
    Returns whether it returned OK, what gc removed, and whether the step then verifies."""
    url = f"pfs://{cluster.cephfs}/lease-{uuid.uuid4().hex[:6]}"

    def python(offset: float) -> list[str]:
        return [sys.executable, str(WORKERS / "skewed.py"), str(offset)]

    saver = cluster.popen(
        "node0",
        [
            *python(-600 if skew == "saver-10min" else 0),
            str(WORKERS / "paused_save.py"),
            url,
            "1",
            "data",
        ],
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pid = 0
    try:
        pid = stopped_child(saver)
        gc = cluster.run(
            "node1",
            [
                *python(600 if skew == "gc+10min" else 0),
                "-m",
                "ckptio.cli",
                "gc",
                url,
                "--older-than",
                "0",
                "--grace",
                "0",
                "--json",
            ],
            cwd=str(tmp_path),
        )
        out, err = resume(saver, pid)
    finally:
        if saver.poll() is None:  # failed on the way: the save too, not only its nsenter
            if pid:
                os.kill(pid, signal.SIGKILL)
            saver.kill()
            saver.wait()
    ok = out.strip() == "OK"
    return {
        "ok": ok,
        "output": out + err,
        "removed": json.loads(gc.stdout)["removed"],
        "committed": committed_steps(open_store(url)),
        "damaged": ckptio.verify(url) if ok else None,
    }


@pytest.fixture(scope="module")
def lease_outcomes(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The paused save beside gc once per clock setting (shared by the tests below)."""
    return {
        skew: paused_save_beside_gc(cluster, tmp_path_factory.mktemp(skew), skew)
        for skew in ("same-clocks", "gc+10min", "saver-10min")
    }


@pytest.mark.parametrize("skew", ["same-clocks", "gc+10min", "saver-10min"])
def test_no_save_returns_ok_with_an_object_missing(
    lease_outcomes: dict[str, Any], skew: str
) -> None:
    """Whatever the clocks, a save that gc ran into either fails, committing nothing, or
    commits a checkpoint that is whole."""
    got = lease_outcomes[skew]
    if got["ok"]:
        assert got["committed"] == [1] and got["damaged"] == [], got
    else:
        assert "FAILED: SaveFailedError: save of step 1 failed, nothing committed" in got["output"]
        assert got["committed"] == [], got


def test_a_live_lease_on_another_host_is_respected(lease_outcomes: dict[str, Any]) -> None:
    got = lease_outcomes["same-clocks"]
    assert got["ok"] and got["removed"] == [] and got["damaged"] == [], got


@pytest.mark.parametrize("skew", ["gc+10min", "saver-10min"])
def test_a_live_lease_on_another_host_is_respected_with_a_clock_offset(
    lease_outcomes: dict[str, Any], skew: str
) -> None:
    """The lease's age is judged by the storage's clock (the write time CephFS stamps on the
    lease and on gc's own clock object), not by the saver's or gc's: ten minutes between
    them, far past the lease's length, change nothing. (Before that protocol, a lease judged
    by gc's clock against the saver's stamp looked dead, and gc took the save's data.)"""
    got = lease_outcomes[skew]
    assert got["ok"] and got["removed"] == [] and got["damaged"] == [], got


def test_a_save_stopped_past_its_lease_on_one_node_fails_when_gc_on_another_took_its_data(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The fence across nodes: step 1 saved; a save of step 2 on node0 (a 2 s lease) stops
    with every object written, just before its manifest; on node1, ``ckptio gc`` (default
    settings, a new process each round) runs until the lease has lapsed and it removes the
    step's data. Resumed, the save publishes, lists its step through node0's own CephFS
    client, finds its objects gone, withdraws the manifest and fails: nothing names a missing
    object, and step 1 loads, whole."""
    url = f"pfs://{cluster.cephfs}/fence-{uuid.uuid4().hex[:6]}"
    ckptio.save({"w": np.arange(4 << 20, dtype=np.float32) + 1}, url, step=1)
    saver = cluster.popen(
        "node0",
        [sys.executable, str(WORKERS / "paused_save.py"), url, "2", "manifest"],
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pid = 0
    try:
        pid = stopped_child(saver)
        gc = [sys.executable, "-m", "ckptio.cli", "gc", url, "--json"]
        deadline = time.monotonic() + 120
        removed: list[str] = []
        while not any(k.startswith("step-0000000002/data/") for k in removed):
            assert time.monotonic() < deadline, f"gc on node1 never took step 2: {removed}"
            removed = json.loads(cluster.run("node1", gc, cwd=str(tmp_path)).stdout)["removed"]
        out, err = resume(saver, pid)
    finally:
        if saver.poll() is None:  # failed on the way: the save too, not only its nsenter
            if pid:
                os.kill(pid, signal.SIGKILL)
            saver.kill()
            saver.wait()
    assert out.startswith("FAILED: SaveFailedError"), out + err
    with open_store(url) as store:
        assert committed_steps(store) == [1]
    assert ckptio.verify(url) == []
    np.testing.assert_array_equal(ckptio.load(url)["w"], np.arange(4 << 20, dtype=np.float32) + 1)
