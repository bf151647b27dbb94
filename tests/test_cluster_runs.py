"""``ckptio run`` across the namespace cluster's 3 nodes x 2 ranks, under each real launcher
(srun, the sbatch script of docs/cluster.md as written, mpiexec, torchrun), each to a shared
filesystem (CephFS or GlusterFS), to RGW, and tiered with a node-local fast root per rank
(srun: to all four): every run's rows come from 3 distinct hosts, each node's disk holds its
own ranks' fast roots only, and the report shows each node and the slowest one."""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path

import pytest

from ckptio.results import Results, read_results
from ckptio.testing.cluster import Cluster
from ckptio.testing.cluster.suite import new_bucket

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DOCS = Path(__file__).resolve().parent.parent / "docs" / "cluster.md"
PLAN = ["--preset", "llama3-8b", "--total-size", "48MiB"]
HOSTS = {"node0": [0, 1], "node1": [2, 3], "node2": [4, 5]}
SPREAD = ["-N3", "--ntasks-per-node=2", "--mpi=pmix"]
TARGETS = ["cephfs", "gluster", "rgw", "tiered"]


def ckptio_run(url: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ckptio.cli", "run", url, *PLAN, "--out", str(out), *extra]


@pytest.fixture(scope="module")
def bucket(cluster: Cluster) -> str:
    """A bucket on the cluster's RGW."""
    return new_bucket(cluster, "ckptio-runs")


def target_args(cluster: Cluster, bucket: str, target: str, run: str) -> tuple[str, list[str]]:
    """The URL (and the extra options) of ``target`` for a run named ``run``."""
    if target == "cephfs":
        return f"pfs://{cluster.cephfs}/{run}", ["--label", "cephfs"]
    if target == "gluster":
        return f"pfs://{cluster.gluster}/{run}", ["--label", "glusterfs"]
    if target == "rgw":
        return f"s3://{bucket}/{run}", ["--label", "rgw"]
    # tiered: each rank's fast root on its node's own disk, drained to CephFS (or RGW)
    local = f"file://{cluster.local}/{run}/{{rank}}"
    if target == "tiered-rgw":
        return f"s3://{bucket}/{run}", ["--local", local, "--label", "rgw+local"]
    return f"pfs://{cluster.cephfs}/{run}", ["--local", local, "--label", "cephfs+local"]


def check_node_local(cluster: Cluster, run: str) -> None:
    """Each node's disk holds its own two ranks' fast roots of ``run``, and nobody else's;
    this machine (the login node) none."""
    for node, ranks in HOSTS.items():
        roots = cluster.run(node, ["ls", f"{cluster.local}/{run}"]).stdout.split()
        assert sorted(roots) == [str(r) for r in ranks], (node, roots)
    assert not os.path.exists(f"{cluster.local}/{run}")


def check_target(cluster: Cluster, res: Results, target: str, run: str) -> None:
    """What the target's kind shows in the results: the filesystem and its layout, the
    tiered phases and where the fast roots went."""
    side = res.sidecars[0]
    if target == "cephfs":
        assert side["storage_layout"]["fs"] == "cephfs"
        assert side["machine"]["filesystem"] == "fuse.ceph-fuse"
    if target == "gluster":
        assert side["machine"]["filesystem"] == "fuse.glusterfs"
    if target.startswith("tiered"):
        assert {p["phase"] for p in res.phases.to_pylist()} >= {"save", "drain", "restore"}
        check_node_local(cluster, run)


def check_three_nodes(out: Path, communicator: str) -> Results:
    """One run in ``out``, its rows from node0..2 with ranks 0..5 placed two per node."""
    res = read_results([out])
    assert len(res.sidecars) == 1
    side = res.sidecars[0]
    assert side["hosts"] == HOSTS
    assert side["communicator"] == communicator
    assert {p["host"] for p in res.phases.to_pylist()} == set(HOSTS)
    for p in res.phases.to_pylist():
        assert p["rank"] in HOSTS[p["host"]], p
    assert {q["host"] for q in res.requests.to_pylist()} == set(HOSTS)
    (run,) = res.runs.to_pylist()
    assert run["ranks"] == 6 and run["nodes"] == 3
    return res


def check_report(out: Path, tmp_path: Path, target: str) -> None:
    from ckptio.report import build_report

    rep = build_report([str(out)], str(tmp_path / "report"))
    (nodes,) = [s for s in rep["nodes"] if s["title"] == "Per node"]
    assert [r[2] for r in nodes["rows"]] == ["node0", "node1", "node2"]
    assert all(r[1] == "3" for r in nodes["rows"])
    assert all(r[0] == target for r in nodes["rows"])
    assert sum("slowest node" in r[-1] for r in nodes["rows"]) == 1
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Per node" in md and "slowest node" in md


@pytest.mark.parametrize("target", TARGETS)
def test_srun_three_nodes_two_ranks_each(
    cluster: Cluster, bucket: str, target: str, tmp_path: Path
) -> None:
    run = f"srun-{target}-{uuid.uuid4().hex[:6]}"
    url, extra = target_args(cluster, bucket, target, run)
    out = tmp_path / "out"
    cluster.srun([*SPREAD, *ckptio_run(url, out, *extra)], cwd=str(tmp_path))
    res = check_three_nodes(out, "MPICommunicator")
    check_report(out, tmp_path, extra[-1])
    check_target(cluster, res, target, run)


def test_one_node_local_root_for_every_rank_is_refused_naming_the_fix(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The same path on every node is three directories: the run stops before it saves,
    saying so (it used to fail at the first commit, 'objects vanished')."""
    run = f"plain-local-{uuid.uuid4().hex[:6]}"
    local = f"file://{cluster.local}/{run}"
    done = cluster.srun(
        [*SPREAD, *ckptio_run(f"pfs://{cluster.cephfs}/{run}", tmp_path / "out", "--local", local)],
        cwd=str(tmp_path),
        check=False,
    )
    assert done.returncode != 0
    assert f"{local} is node-local" in done.stderr and "node1, node2 cannot see" in done.stderr
    assert "{rank}" in done.stderr
    assert not os.path.exists(f"{cluster.cephfs}/{run}/step-0000000000/manifest.json")


def docs_sbatch_script() -> str:
    """The batch script docs/cluster.md shows a user: its first sh block with #SBATCH lines."""
    blocks = re.findall(r"```sh\n(.*?)```", DOCS.read_text(), flags=re.S)
    (script,) = [b for b in blocks if "#SBATCH" in b][:1]
    return script


@pytest.mark.parametrize("target", ["cephfs", "rgw"])
def test_the_docs_sbatch_script_runs_as_written(
    cluster: Cluster, bucket: str, target: str, tmp_path: Path
) -> None:
    """The script's two runs (plain, and tiered with ``LOCAL`` per rank on each node's disk)
    to a shared CephFS directory, then to RGW, and its report."""
    script = tmp_path / "ckptio.sbatch"
    script.write_text(docs_sbatch_script())
    run = f"sbatch-{target}-{uuid.uuid4().hex[:6]}"
    out = tmp_path / "results"
    env = {
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]),
        "TARGET": target_args(cluster, bucket, target, run)[0],
        "LOCAL": f"file://{cluster.local}/{run}/{{rank}}",
        "OUT": str(out),
    }
    job = cluster.sbatch(str(script), cwd=str(tmp_path), env=env)
    log = Path(tmp_path / f"ckptio-{job['JobId']}.out")
    assert job["JobState"] == "COMPLETED", log.read_text()[-4000:] if log.exists() else job
    res = read_results([out])
    assert sorted(r["kind"] for r in res.runs.to_pylist()) == ["run", "tiered"]
    for side in res.sidecars:
        assert side["hosts"] == HOSTS and side["communicator"] == "MPICommunicator"
    assert {p["host"] for p in res.phases.to_pylist()} == set(HOSTS)
    check_node_local(cluster, run)
    report = (out / "report" / "report.md").read_text()
    assert "## Per node" in report


@pytest.mark.parametrize("target", ["gluster", "tiered-rgw"])
def test_mpiexec_three_nodes(cluster: Cluster, bucket: str, target: str, tmp_path: Path) -> None:
    """mpiexec (Open MPI's daemons started in each node by the cluster's launch agent) to a
    shared GlusterFS directory, and tiered: node-local fast roots drained to RGW."""
    pytest.importorskip("mpi4py")
    run = f"mpiexec-{target}-{uuid.uuid4().hex[:6]}"
    url, extra = target_args(cluster, bucket, target, run)
    out = tmp_path / "out"
    cluster.mpiexec(ckptio_run(url, out, *extra), cwd=str(tmp_path))
    res = check_three_nodes(out, "MPICommunicator")
    check_target(cluster, res, target, run)


@pytest.mark.parametrize("target", ["rgw", "tiered"])
def test_torchrun_three_nodes(cluster: Cluster, bucket: str, target: str, tmp_path: Path) -> None:
    """torchrun on every node (c10d rendezvous on node0) to RGW, and tiered: node-local fast
    roots drained to CephFS."""
    pytest.importorskip("torch")
    run = f"torchrun-{target}-{uuid.uuid4().hex[:6]}"
    url, extra = target_args(cluster, bucket, target, run)
    out = tmp_path / "out"
    # torchrun's python; `--` ends torchrun's options, as docs/cluster.md shows (without it
    # torchrun takes `--local` for an abbreviation of its own --local-addr and stops)
    cmd = ["-m", "ckptio.cli", "--", *ckptio_run(url, out, *extra)[3:]]
    done = cluster.torchrun(cmd, cwd=str(tmp_path))
    assert len(done) == 3
    res = check_three_nodes(out, "TorchCommunicator")
    check_target(cluster, res, target, run)


def test_the_report_checks_the_model_on_one_two_and_three_nodes(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The same run to CephFS on 1, 2 and 3 nodes (2 ranks each, srun): the report fits the
    model on the 1-node run and sets its prediction for each node count beside the
    measurement; a row more than 25% off is flagged and says why, the others are not."""
    from ckptio import pernode
    from ckptio.report import build_report

    out = tmp_path / "results"
    for n in (1, 2, 3):
        url = f"pfs://{cluster.cephfs}/scaling-{n}n-{uuid.uuid4().hex[:6]}"
        spread = [f"-N{n}", "--ntasks-per-node=2", "--mpi=pmix"]
        cluster.srun([*spread, *ckptio_run(url, out, "--label", "cephfs")], cwd=str(tmp_path))
    res = read_results([out])
    assert sorted({r["nodes"] for r in res.runs.to_pylist()}) == [1, 2, 3]
    rows = pernode.scaling_rows(res)
    assert [(r["target"], r["nodes"]) for r in rows] == [("cephfs", n) for n in (1, 2, 3)]
    for r in rows:
        assert r["measured_GBps"] > 0 and r["predicted_GBps"] > 0, r
        assert r["flagged"] == (abs(r["difference"]) > pernode.DIFFERENCE_SHOWN), r
        assert bool(r["why"]) == r["flagged"], r
    build_report([str(out)], str(tmp_path / "report"))
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## The model against runs on more nodes" in md and "## Per node" in md
