"""Node loss with peer copies of the fast tier (``replicas=k``), on the namespace cluster
(3 nodes x 2 ranks, MPI under srun, the durable tier on CephFS).

A trial set runs one training job (tests/cluster/peer_train.py) per incarnation: it restores,
checks the restore bit for bit, trains (a save per step, each copied to the partner nodes in
the background), and is killed at a random point: the victim node is killed as a machine dies
(every process in it at SIGKILL, its node-local tmpfs and so its fast roots and the copies it
held gone, its CephFS client evicted; :meth:`Cluster.kill_node`), the job's other ranks are
cancelled (``scancel``, as a scheduler ends a job that lost a node), and a replacement node
(same name, empty disk, a new slurmd) is started. The next incarnation restores. The cluster,
its Slurm and Ceph are set up once for the whole session: a trial costs a job start, a kill
and a node replacement, not a new cluster.

Every restore is asserted bit-identical and its path (own fast root / peer copy / durable)
asserted per rank."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ckptio.testing.cluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WORKER = Path(__file__).resolve().parent / "cluster" / "peer_train.py"
NODES = ("node0", "node1", "node2")
NODE_OF = {0: "node0", 1: "node0", 2: "node1", 3: "node1", 4: "node2", 5: "node2"}
TRIALS = int(os.environ.get("CKPTIO_PEER_TRIALS", "30"))
"""Single-node kills in the trial set (30 in CI)."""
EVENT_TIMEOUT = 180.0


class Incarnation:
    """One srun of the training job; its events (JSON lines) as they come."""

    def __init__(
        self, cluster: Cluster, cwd: Path, durable: str, local: str, k: int, per_node: int
    ) -> None:
        self.cluster, self.size = cluster, 3 * per_node
        self.name = f"peers-{uuid.uuid4().hex[:8]}"
        self.tag = durable  # in every rank's argv, and in no other process's
        self.proc = cluster.popen(
            None,
            [
                "srun",
                "-N3",
                f"--ntasks-per-node={per_node}",
                "--mpi=pmix",
                f"--job-name={self.name}",
                sys.executable,
                str(WORKER),
                durable,
                local,
                str(k),
                "100000",
            ],
            cwd=str(cwd),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.events: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self._queue.put(json.loads(line))
        self._queue.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        with contextlib.suppress(ValueError):  # closed by cancel
            self.stderr.extend(self.proc.stderr)

    def until(self, done: Any, timeout: float = EVENT_TIMEOUT) -> None:
        """Take events until ``done(self)`` holds."""
        deadline = time.monotonic() + timeout
        while not done(self):
            left = deadline - time.monotonic()
            assert left > 0, (
                f"timed out; events: {self.events[-12:]}; {''.join(self.stderr)[-3000:]}"
            )
            try:
                event = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            assert event is not None, f"the job ended: {''.join(self.stderr)[-3000:]}"
            self.events.append(event)

    def drain_for(self, seconds: float) -> None:
        """Take the events that come within ``seconds`` (the random instant of a kill)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self._queue.get(timeout=left)
            except queue.Empty:
                return
            if event is None:
                return
            self.events.append(event)

    def restored(self) -> dict[int, dict[str, Any]]:
        return {e["rank"]: e for e in self.events if e["event"] == "restored"}

    def all_ranks(self, kind: str) -> list[int]:
        """Steps for which every rank reported ``kind`` (replicated: successfully)."""
        by_step: dict[int, set[int]] = {}
        for e in self.events:
            if e["event"] == kind and e.get("status", "replicated") == "replicated":
                by_step.setdefault(e["step"], set()).add(e["rank"])
        return sorted(s for s, r in by_step.items() if len(r) == self.size)

    def any_rank(self, kind: str) -> list[int]:
        return sorted({e["step"] for e in self.events if e["event"] == kind})

    def durable(self) -> list[int]:
        return sorted(
            e["step"] for e in self.events if e["event"] == "durable" and e["status"] == "durable"
        )

    def cancel(self, survivors: Sequence[str] = NODES) -> None:
        """The job's other ranks ended, as a scheduler ends a job that lost a node (scancel;
        srun itself, which waits on the dead node's slurmd for the step's end, is killed
        once the survivors' ranks are gone); the events the job wrote before taken."""
        self.cluster.run(None, ["scancel", f"--name={self.name}"], check=False)
        deadline = time.monotonic() + 60
        for node in survivors:  # the ranks of this job (its run's tag is in their argv)
            while self.cluster.run(node, ["pgrep", "-f", self.tag], check=False).stdout.strip():
                assert time.monotonic() < deadline, f"{node} still runs the job's ranks"
                self.cluster.run(node, ["pkill", "-KILL", "-f", self.tag], check=False)
        if self.proc.poll() is None:  # srun waits on the dead node's slurmd: ended here
            self.proc.kill()
        self.proc.wait()
        while (event := self._queue.get(timeout=60)) is not None:
            self.events.append(event)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def incomplete_copies(cluster: Cluster, run: str, nodes: list[str]) -> int:
    """Copies on ``nodes`` whose record was never published (a kill mid-replication)."""
    script = (
        f"find {cluster.local}/{run} -path '*/peers/rank-*/step-*' -prune | "
        'while read d; do [ -e "$d/peer-copy.json" ] || echo "$d"; done'
    )
    return sum(
        len(cluster.run(node, ["sh", "-c", script], check=False).stdout.split()) for node in nodes
    )


class TrialSet:
    """A run on the cluster: its durable root on CephFS, fast roots on each node's disk."""

    def __init__(self, cluster: Cluster, cwd: Path, k: int, per_node: int = 2) -> None:
        self.cluster, self.cwd, self.k, self.per_node = cluster, cwd, k, per_node
        self.node_of = {r: NODES[r // per_node] for r in range(3 * per_node)}
        self.run = f"peers-k{k}-{uuid.uuid4().hex[:6]}"
        self.durable = f"pfs://{cluster.cephfs}/{self.run}"
        self.local = f"file://{cluster.local}/{self.run}/{{rank}}"
        self.log: list[dict[str, Any]] = []

    def start(self) -> Incarnation:
        return Incarnation(self.cluster, self.cwd, self.durable, self.local, self.k, self.per_node)

    def kill(self, job: Incarnation, victims: list[str]) -> dict[str, Any]:
        """Kill ``victims`` at once, end the job, count the copies left half-made on the
        survivors, start the replacements. Returns what the restore may take."""
        t0 = time.monotonic()
        for node in victims:
            self.cluster.kill_node(node)
        t1 = time.monotonic()
        survivors = [n for n in NODES if n not in victims]
        job.cancel(survivors)
        # what the kill left: steps saved by any rank (a step's commit is collective), copies
        # complete on every partner, steps committed on the durable tier
        saved, replicated = job.any_rank("saved"), job.all_ranks("replicated")
        t2 = time.monotonic()
        mid = incomplete_copies(self.cluster, self.run, survivors)
        t3 = time.monotonic()
        for node in victims:
            self.cluster.start_node(node)
        t4 = time.monotonic()
        return {
            "victims": victims,
            "saved": max(saved),
            "replicated": max(replicated),
            "durable": max(job.durable() or [0]),
            "durable_steps": job.durable(),
            "mid_replication": mid,
            "seconds": {"kill": t1 - t0, "end_job": t2 - t1, "replace": t4 - t3},
        }


def check_restore(job: Incarnation, node_of: dict[int, str]) -> dict[int, dict[str, Any]]:
    job.until(lambda j: len(j.restored()) == j.size)
    got = job.restored()
    assert {r: e["host"] for r, e in got.items()} == node_of
    steps = {e["step"] for e in got.values()}
    assert len(steps) == 1, got
    for rank, e in got.items():
        assert e["identical"], (rank, e)
    return got


def paths(got: dict[int, dict[str, Any]]) -> dict[int, str]:
    return {r: e["path"] for r, e in sorted(got.items())}


def test_node_killed_at_random_points_resumes_bit_identical_from_peer_copies(
    cluster: Cluster, tmp_path: Path
) -> None:
    """replicas=1, a rank per node (the two-node tests below run two); TRIALS times: a random node killed at a random point of training (after a
    random number of saves and a random fraction of a second: often while copies are in
    flight), a replacement started, the job restarted. Every restore: bit-identical, a step
    no older than the newest one replicated before the kill and no newer than the newest
    saved; the replacement's ranks restore from peer copies, the others from their own
    disks."""
    rng = random.Random(os.environ.get("CKPTIO_PEER_SEED", "34"))
    trials = TrialSet(cluster, tmp_path, k=1, per_node=1)
    node_of = trials.node_of
    job = trials.start()
    kills: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for i in range(TRIALS + 1):
        if i:
            got = check_restore(job, node_of)
            kill = kills[-1]
            step = next(iter(got.values()))["step"]
            # a step committed just before the kill may not have printed "saved" yet
            assert kill["replicated"] <= step <= kill["saved"] + 1, (kill, got)
            victim = kill["victims"][0]
            for r, e in got.items():
                if node_of[r] == victim:  # its disk is empty: a copy, or the durable tier
                    assert e["path"] == "peer" or step in kill["durable_steps"], (kill, got)
                    assert e["nbytes"]["local"] == 0, (kill, got)
                else:
                    assert e["path"] in ("local", "peer") or step in kill["durable_steps"]
            kill["paths"] = paths(got)
            kill["restored"] = step
        if i == TRIALS:
            job.cancel()
            break
        start = max(job.restored().get(0, {}).get("step", 0), 0)
        # at least one new step copied to every partner: a peer copy to restore from
        job.until(lambda j, s=start: any(x > s for x in j.all_ranks("replicated")))
        extra = rng.randint(0, 2)
        job.until(lambda j, n=extra, s=start: len([x for x in j.any_rank("saved") if x > s]) >= n)
        job.drain_for(rng.uniform(0, 0.6))
        victim = rng.choice(NODES)
        kills.append(trials.kill(job, [victim]))
        job = trials.start()
    seconds = time.monotonic() - t0
    mid = sum(1 for k in kills if k["mid_replication"])
    victims_by_path: dict[str, int] = {}
    for k in kills:
        for r, p in k["paths"].items():
            if node_of[r] == k["victims"][0]:
                victims_by_path[p] = victims_by_path.get(p, 0) + 1
    summary = {
        "trials": len(kills),
        "seconds": round(seconds, 1),
        "mid_replication": mid,
        "victim_ranks_by_path": victims_by_path,
    }
    print(json.dumps(summary))
    Path(os.environ.get("CKPTIO_PEER_LOG", os.devnull)).write_text(json.dumps(kills, indent=1))
    assert len(kills) == TRIALS
    assert mid >= 1, "no kill landed while copies were in flight"


@pytest.mark.parametrize("k", [1, 2])
def test_two_nodes_lost_at_once(cluster: Cluster, tmp_path: Path, k: int) -> None:
    """node1 and node2 killed together. With replicas=1, node1's ranks had their copies on
    node2: their data survives only on the durable tier, so the restore takes the newest
    durable step and they read it from there. With replicas=2 every rank's copies are on
    both other nodes: the lost ranks restore from node0's copies, a step no older than the
    newest replicated before the kill."""
    trials = TrialSet(cluster, tmp_path, k=k)
    job = trials.start()
    job.until(lambda j: bool(j.durable()) and any(s > 1 for s in j.all_ranks("replicated")))
    kill = trials.kill(job, ["node1", "node2"])
    job = trials.start()
    got = check_restore(job, NODE_OF)
    job.cancel()
    step = next(iter(got.values()))["step"]
    if k == 1:
        assert kill["durable"] <= step <= kill["saved"] + 1, (kill, got)
        assert paths(got)[2] == paths(got)[3] == "durable", got
        assert got[2]["nbytes"]["durable"] > 0
    else:
        assert kill["replicated"] <= step <= kill["saved"] + 1, (kill, got)
        assert paths(got) == {0: "local", 1: "local", 2: "peer", 3: "peer", 4: "peer", 5: "peer"}
        assert all(e["nbytes"]["durable"] == 0 for e in got.values())


def test_ckptio_run_times_the_restore_from_peer_copies(cluster: Cluster, tmp_path: Path) -> None:
    """``ckptio run --local ... --replicas 1`` across 3 nodes x 2 ranks under srun (durable
    tier on CephFS): every rank records the ``replicate`` and ``restore-peer`` phases; in
    ``restore-peer`` the last node's ranks (node2: their fast roots emptied, the loss
    emulated and said so in the sidecar) restore from their copies on node0, all their bytes
    from peers, the others from their own disks; ``restore-durable`` reads the durable tier.
    Then ``--replicas 2 --lose 2``: node1 and node2 lost at once (neighbours on the ring),
    every byte of their four ranks sent by node0, bit-identical (the run checks every
    restore against the stream it saved), and the rows give fan-in 2. About 20 s + 15 s."""
    from ckptio.calibration import fit_peer_link
    from ckptio.results import read_results
    from ckptio.tierbench import LOSS_NOTE, PEER_PHASES, PHASES

    run = f"run-peers-{uuid.uuid4().hex[:6]}"
    out = tmp_path / "out"
    argv = [
        "-N3", "--ntasks-per-node=2", "--mpi=pmix", sys.executable, "-m", "ckptio.cli", "run",
        f"pfs://{cluster.cephfs}/{run}", "--local", f"file://{cluster.local}/{run}/{{rank}}",
        "--replicas", "1", "--preset", "llama3-8b", "--total-size", "48MiB", "--out", str(out),
    ]  # fmt: skip
    cluster.srun(argv, cwd=str(tmp_path))
    res = read_results([out])
    (side,) = res.sidecars
    assert side["peers"] == {
        "replicas": 1,
        "lost": {"nodes": ["node2"], "ranks": [4, 5]},
        "loss": LOSS_NOTE,
    }
    phases = res.phases.to_pylist()
    assert {(p["rank"], p["phase"]) for p in phases} == {
        (r, ph) for r in range(6) for ph in (*PHASES, *PEER_PHASES)
    }
    peer = {p["rank"]: p for p in phases if p["phase"] == "restore-peer"}
    for rank, p in peer.items():
        assert p["host"] == NODE_OF[rank] and p["seconds"] > 0
        if NODE_OF[rank] == "node2":
            assert p["restore_path"] == "peer" and p["peer_bytes"] >= p["bytes"] > 0, p
        else:
            assert p["restore_path"] == "local" and p["peer_bytes"] == 0, p
        assert p["durable_bytes"] == 0, p
    for p in phases:
        if p["phase"] == "restore-durable":
            assert p["restore_path"] == "durable" and p["durable_bytes"] >= p["bytes"] > 0, p
        if p["phase"] == "restore":
            assert p["restore_path"] == "local", p
    assert {q["phase"] for q in res.requests.to_pylist()} >= {"replicate", "restore-peer"}
    # the model's node link to peers, fitted from node2's restore: its two ranks' peer bytes
    # over the slower's seconds
    link = fit_peer_link(res.phases)
    assert link is not None and link.fan_in == 1 and len(link.per_round) == 1
    node2 = [p for p in peer.values() if NODE_OF[p["rank"]] == "node2"]
    want = sum(p["peer_bytes"] for p in node2) / max(p["seconds"] for p in node2)
    assert link.bandwidth == pytest.approx(want)
    for p in node2:
        assert (p["node"], p["lost_nodes"]) == ("node2", "node2"), p
        assert json.loads(p["peer_sources"]) == {"node0": p["peer_bytes"]}, p
    # two neighbours lost with two copies: the one survivor, node0, serves both
    two = tmp_path / "two"
    argv[argv.index("--replicas") + 1] = "2"
    argv[argv.index("--out") + 1] = str(two)
    argv[argv.index("--total-size") + 1] = "24MiB"
    argv[argv.index(f"pfs://{cluster.cephfs}/{run}")] += "-two"
    argv[argv.index(f"file://{cluster.local}/{run}/{{rank}}")] = (
        f"file://{cluster.local}/{run}-two/{{rank}}"
    )
    cluster.srun([*argv, "--lose", "2"], cwd=str(tmp_path))
    res2 = read_results([two])
    assert res2.sidecars[0]["peers"]["lost"] == {"nodes": ["node1", "node2"], "ranks": [2, 3, 4, 5]}
    peer2 = {p["rank"]: p for p in res2.phases.to_pylist() if p["phase"] == "restore-peer"}
    assert {r: p["restore_path"] for r, p in peer2.items()} == {
        0: "local",
        1: "local",
        2: "peer",
        3: "peer",
        4: "peer",
        5: "peer",
    }
    for rank in (2, 3, 4, 5):
        p = peer2[rank]
        assert json.loads(p["peer_sources"]) == {"node0": p["peer_bytes"]} and p["peer_bytes"] > 0
        assert p["durable_bytes"] == 0 and p["lost_nodes"] == "node1,node2", p
    link2 = fit_peer_link(res2.phases)
    assert link2 is not None and link2.fan_in == 2
