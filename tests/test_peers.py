"""Peer copies of the fast tier (``replicas=k``), under a real MPI: ranks of this machine
stand for nodes (``$CKPTIO_NODE``), each with its own fast root; a node is lost by removing
the fast roots of its ranks (everything its disk held: its steps and the copies it kept for
others). Every restore is checked bit-identical and the path it took asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_mpi_checkpoint import run_mpi

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "mpi" / "peer_ranks.py"


def ranks(out: str) -> dict[int, dict[str, Any]]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {d["rank"]: d for d in lines}


class Job:
    def __init__(self, tmp: Path, k: int, nodes: int, n: int) -> None:
        self.tmp, self.k, self.nodes, self.n = tmp, k, nodes, n
        self.durable = f"file://{tmp}/durable"
        self.local = f"file://{tmp}/local/{{rank}}"

    def root(self, rank: int) -> Path:
        return self.tmp / "local" / str(rank)

    def save(self) -> dict[int, dict[str, Any]]:
        out = ranks(run_mpi(self.n, str(SCRIPT), *self.args("save", self.n)).stdout)
        assert len(out) == self.n
        for d in out.values():
            # a step whose copies were still being made at a later save's retention stays
            # until the next one: the fast tier may hold step 2 as well
            assert d["tiers"]["local"][-2:] == [3, 4] and d["tiers"]["durable"] == [1, 3], d
            assert d["peers"] == ["replicated"] * 4, d
        return out

    def lose(self, *nodes: int) -> None:
        """The nodes' disks are gone: every fast root of their ranks."""
        for r in range(self.n):
            if r * self.nodes // self.n in nodes:
                shutil.rmtree(self.root(r))

    def load(
        self, n: int | None = None, nodes: int | None = None, mode: str = "load"
    ) -> dict[int, dict[str, Any]]:
        n = n or self.n
        proc = run_mpi(n, str(SCRIPT), *self.args(mode, n, nodes))
        out = ranks(proc.stdout)
        assert len(out) == n, proc.stdout + proc.stderr
        for d in out.values():
            assert d["identical"], d
        self.stderr = proc.stderr
        return out

    def args(self, mode: str, n: int, nodes: int | None = None) -> list[str]:
        return [mode, self.durable, self.local, str(self.k), str(nodes or self.nodes)]


def flip_a_byte(path: Path) -> None:
    """Damage a stored object as a bad disk would: one bit pattern changed, size kept."""
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))


def paths(out: dict[int, dict[str, Any]]) -> dict[int, str]:
    return {r: d["restore"]["path"] for r, d in sorted(out.items())}


def test_a_lost_node_s_ranks_restore_the_newest_step_from_their_peer_copies(tmp_path: Path) -> None:
    """2 nodes x 2 ranks, replicas=1: each rank's copy is on the other node (rank 0's on
    rank 2's root, ...), committed with its own record; node1 lost, its ranks restore step 4
    (never drained) from node0's copies, node0's ranks from their own roots."""
    job = Job(tmp_path, k=1, nodes=2, n=4)
    job.save()
    for src, holder in ((0, 2), (1, 3), (2, 0), (3, 1)):
        for step in (3, 4):
            doc = json.loads(
                (
                    job.root(holder) / f"peers/rank-{src:05d}/step-{step:010d}/peer-copy.json"
                ).read_text()
            )
            assert doc["source_rank"] == src and doc["step"] == step
            assert doc["job"].endswith("/durable") and doc["objects"]
            assert all(o["crc32c"] is not None for o in doc["objects"].values())
        # retention per source rank: the newest keep_last_local (2) copies
        assert sorted(p.name for p in (job.root(holder) / f"peers/rank-{src:05d}").iterdir()) == [
            "step-0000000003",
            "step-0000000004",
        ]
    job.lose(1)
    out = job.load()
    assert {d["step"] for d in out.values()} == {4}
    assert paths(out) == {0: "local", 1: "local", 2: "peer", 3: "peer"}
    assert out[2]["restore"]["sources"] == ["rank 0 (n0)"]
    # the replacement roots hold their step again: a second restore reads them locally
    again = job.load()
    assert paths(again) == {0: "local", 1: "local", 2: "local", 3: "local"}


@pytest.mark.parametrize("mode", ["load", "load-into"])
def test_a_peer_restore_delivers_the_received_bytes_into_the_arrays(
    tmp_path: Path, mode: str
) -> None:
    """node1 lost (2 nodes x 2 ranks, replicas=1): its ranks' rows arrive from node0's copies
    straight into the arrays (the caller's own with ``into=``, filled in place), each chunk's
    CRC32C checked as it arrives; nothing of the step is read back from the fast root they
    were also written to. That copy is whole: a second restore reads it locally."""
    job = Job(tmp_path, k=1, nodes=2, n=4)
    job.save()
    job.lose(1)
    out = job.load(mode=mode)
    assert paths(out) == {0: "local", 1: "local", 2: "peer", 3: "peer"}
    for r in (2, 3):
        assert out[r]["restore"]["nbytes"]["peer"] > 0
        assert out[r]["fast_reads"] == [], out[r]  # received: never read back
    assert out[0]["fast_reads"]  # node0's ranks read their own roots, as before
    if mode == "load-into":
        assert all(d["in_place"] for d in out.values()), out
    again = job.load(mode=mode)
    assert paths(again) == {0: "local", 1: "local", 2: "local", 3: "local"}
    assert again[2]["fast_reads"]


def test_a_damaged_peer_copy_is_detected_and_skipped(tmp_path: Path) -> None:
    """A flipped byte in rank 2's copy of step 4 (on node0): the restore finds the CRC32C
    mismatch, refuses the copy and, no other copy of step 4 being left, restores step 3 from
    the peer copies: never the damaged bytes."""
    job = Job(tmp_path, k=1, nodes=2, n=4)
    job.save()
    flip_a_byte(next((job.root(0) / "peers/rank-00002/step-0000000004/data").iterdir()))
    job.lose(1)
    out = job.load()
    assert {d["step"] for d in out.values()} == {3}
    assert paths(out)[2] == "peer" and paths(out)[3] == "peer"
    assert "CRC32C" in job.stderr and "failed their checks" in job.stderr


def test_a_newer_step_that_fails_to_read_is_kept_not_retired(tmp_path: Path) -> None:
    """Step 4 whole on every fast root but rank 0's read of it failing (a flipped byte in
    its own object: the CRC32C check refuses it): the restore takes step 3, and step 4 stays
    committed on rank 0's root and its copy on the partner (not some lost node's unfinished
    step: a failing disk may come back, and nothing is retired that could still be read)."""
    job = Job(tmp_path, k=1, nodes=2, n=4)
    job.save()
    flip_a_byte(next((job.root(0) / "step-0000000004/data").iterdir()))
    out = job.load()
    assert {d["step"] for d in out.values()} == {3}
    assert (job.root(0) / "step-0000000004/manifest.json").exists()
    assert (job.root(2) / "peers/rank-00000/step-0000000004/peer-copy.json").exists()


def test_another_job_s_copy_is_refused(tmp_path: Path) -> None:
    """A copy whose record names another job (its durable root) is never restored: refused
    with a warning naming that job; the restore takes the newest step that survives in this
    job's own copies."""
    job = Job(tmp_path, k=1, nodes=2, n=4)
    job.save()
    rec = job.root(0) / "peers/rank-00002/step-0000000004/peer-copy.json"
    doc = json.loads(rec.read_text())
    doc["job"] = "/elsewhere/other-job"
    rec.write_text(json.dumps(doc))
    job.lose(1)
    out = job.load()
    assert {d["step"] for d in out.values()} == {3}
    assert "refused" in job.stderr and "/elsewhere/other-job" in job.stderr


def test_two_nodes_lost_with_one_replica_falls_back_to_the_durable_tier(tmp_path: Path) -> None:
    """3 nodes x 1 rank, replicas=1 (rank 1's copy on node2, rank 2's on node0): nodes 1 and
    2 lost, rank 1's step 4 survives nowhere; the restore takes step 3, rank 1 from the
    durable tier, rank 2 from its copy on node0, rank 0 from its own root."""
    job = Job(tmp_path, k=1, nodes=3, n=3)
    job.save()
    job.lose(1, 2)
    out = job.load()
    assert {d["step"] for d in out.values()} == {3}
    assert paths(out) == {0: "local", 1: "durable", 2: "peer"}
    assert out[1]["restore"]["nbytes"]["durable"] > 0


def test_two_nodes_lost_with_two_replicas_restore_from_peers(tmp_path: Path) -> None:
    """3 nodes x 1 rank, replicas=2: every rank's copy is on both other nodes; nodes 1 and 2
    lost, step 4 (never drained) is restored, their ranks from node0's copies."""
    job = Job(tmp_path, k=2, nodes=3, n=3)
    job.save()
    job.lose(1, 2)
    out = job.load()
    assert {d["step"] for d in out.values()} == {4}
    assert paths(out) == {0: "local", 1: "peer", 2: "peer"}
    assert all(d["restore"]["nbytes"]["durable"] == 0 for d in out.values())


def test_the_newest_step_every_rank_replicated_outlives_newer_rounds_that_fail(
    tmp_path: Path,
) -> None:
    """3 nodes x 1 rank, replicas=2, keep_last_local=2, only step 1 drained. Rank 1's copies
    of steps 3 and 4 cannot be made on node0 (a file stands where their directory goes): the
    rounds of 3 and 4 fail, as a round cut short by a kill does, while the other ranks' copies
    of them and the saves go on (the partner reads the stream to its end: no rank is left
    waiting). Step 2 is then the newest step whose every rank's data is on
    both other nodes: node0 keeps it (its own root and its copies) though 3 and 4 are newer.
    Nodes 1 and 2 lost: step 2 is restored from the peers, not step 1 from the durable tier."""
    job = Job(tmp_path, k=2, nodes=3, n=3)
    blocked = job.root(0) / "peers" / "rank-00001"
    blocked.mkdir(parents=True)
    for step in (3, 4):
        (blocked / f"step-{step:010d}").write_text("not a directory")
    saved = ranks(run_mpi(3, str(SCRIPT), *job.args("save-each", 3)).stdout)
    for d in saved.values():
        assert d["peers"] == ["replicated", "replicated", "failed", "failed"], d
        assert d["tiers"]["durable"] == [1], d
        assert d["tiers"]["local"] == [2, 3, 4], d
    assert sorted(p.name for p in (job.root(0) / "peers" / "rank-00002").iterdir()) == [
        "step-0000000002",
        "step-0000000003",
        "step-0000000004",
    ]
    job.lose(1, 2)
    out = job.load()
    assert {d["step"] for d in out.values()} == {2}
    assert paths(out) == {0: "local", 1: "peer", 2: "peer"}
    assert all(d["restore"]["nbytes"]["durable"] == 0 for d in out.values())


@pytest.mark.parametrize("n, nodes", [(2, 1), (6, 3)], ids=["fewer-nodes", "more-nodes"])
def test_a_resharded_restore_gathers_the_peer_copies_it_needs(
    tmp_path: Path, n: int, nodes: int
) -> None:
    """Saved by 4 ranks on 2 nodes (replicas=1), node1 lost; restored by 2 ranks on 1 node,
    or by 6 on 3 nodes: each rank gathers the objects of the rows it reads from the roots
    and copies that hold them; step 4 (never drained) is restored, bit-identical."""
    job = Job(tmp_path, k=1, nodes=2, n=4)
    job.save()
    job.lose(1)
    out = job.load(n, nodes)
    assert {d["step"] for d in out.values()} == {4}
    assert all(d["restore"]["nbytes"]["durable"] == 0 for d in out.values())
    assert "peer" in paths(out).values()


def torchrun(n: int, *args: str, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("torch")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(n),
            str(script),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_copies_travel_over_torch_distributed_gloo(tmp_path: Path) -> None:
    """The same protocol over torch.distributed (gloo send/recv) under torchrun: 2 nodes x 2
    ranks, replicas=1, node1 lost, its ranks restore step 4 from node0's copies."""
    job = Job(tmp_path, k=1, nodes=2, n=4)
    saved = ranks(torchrun(4, *job.args("save", 4)).stdout)
    assert all(d["peers"] == ["replicated"] * 4 for d in saved.values()), saved
    job.lose(1)
    out = ranks(torchrun(4, *job.args("load", 4)).stdout)
    assert all(d["identical"] for d in out.values()), out
    assert {d["step"] for d in out.values()} == {4}
    assert paths(out) == {0: "local", 1: "local", 2: "peer", 3: "peer"}


def test_replicas_need_another_node(tmp_path: Path) -> None:
    """replicas=1 on one node: a clear error naming the node count, at the first save."""
    job = Job(tmp_path, k=1, nodes=1, n=2)
    with pytest.raises(AssertionError, match=r"replicas=1.*1 node\(s\)"):
        run_mpi(2, str(SCRIPT), *job.args("save", 2))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_rank_waiting_for_a_peer_leaves_the_cpu_to_others() -> None:
    """Open MPI's blocking calls spin a core while they wait; on a busy node that CPU is
    taken from the rank whose bytes are awaited (benchmarks/peer_wire.py). The transport's
    receive and the communicator's collectives (a restore's planning: gather, bcast, barrier)
    poll with a sleep: a rank waiting while its peer works uses a small part of the wait's
    CPU time, and each wait ends with what was sent."""
    proc = run_mpi(2, str(Path(__file__).parent / "mpi" / "wire_idle.py"))
    (got,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert got["recv"]["got"] == {"go": True}
    assert got["gather"]["got"] == [{"rank": 0}, {"rank": 1}]
    assert got["bcast"]["got"] == {"go": True}
    for name, wait in got.items():
        assert wait["wall"] >= 0.4, (name, got)  # it did wait for rank 0's half-second of work
        assert wait["cpu"] < 0.25 * wait["wall"], (name, got)


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_a_piece_is_received_where_the_restore_places_it(launcher: str) -> None:
    """The wire's ``recv`` with a ``place``: MPI's Irecv and gloo's recv write the piece into
    the array given (the restore's own, no copy after), bit-identical; a piece ``place``
    declines goes to a new buffer."""
    script = Path(__file__).parent / "mpi" / "wire_place.py"
    proc = run_mpi(2, str(script)) if launcher == "mpiexec" else torchrun(2, script=script)
    got = ranks(proc.stdout)[1]
    assert [g["in_place"] for g in got["got"]] == [True, True, False], got
    assert all(g["equal"] and g["kind"] == 1 for g in got["got"]) and got["dest_equal"], got
