"""One workload run with ``ckptio run`` to each shared target of a cluster from 1, 2 and 3
nodes (``benchmarks/cluster.py``, ``tests/test_cluster_simulate.py``), and, where asked, from
ONE node with the processes of several: the probe of the storage's aggregate that
:func:`ckptio.simulate.fit_storage` takes (``aggregate=``)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptio.testing.cluster.core import TASKS_PER_NODE, Cluster

__all__ = ["SHARED_TARGETS", "SuiteRun", "new_bucket", "run_suite"]

SHARED_TARGETS = ("cephfs", "rgw", "glusterfs")


@dataclass(frozen=True)
class SuiteRun:
    """One ``ckptio run``: its target, the nodes it ran on, its processes, its results."""

    target: str
    nodes: int
    processes: int
    out: Path

    @property
    def probe(self) -> bool:
        """Whether it ran the processes of several nodes on one (an aggregate probe)."""
        return self.processes > self.nodes * TASKS_PER_NODE


def new_bucket(cluster: Cluster, prefix: str) -> str:
    """A new bucket ``<prefix>-<8 hex digits>`` on the cluster's RGW, created from this
    machine with the cluster's credentials; its name."""
    import boto3

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    env = cluster.env()
    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"),
    )
    try:
        client.create_bucket(Bucket=name)
    finally:
        client.close()
    return name


def run_suite(
    cluster: Cluster,
    out: Path,
    *,
    targets: Sequence[str] = SHARED_TARGETS,
    nodes: Sequence[int] = (1, 2, 3),
    probes: Sequence[int] = (),
    preset: str = "llama3-8b",
    gpus: int = 12,
    size: str = "48MiB",
    iterations: int = 4,
    repeats: int = 1,
    options: Sequence[str] = (),
    timeout: float = 900,
) -> list[SuiteRun]:
    """``ckptio run`` of the workload to each of ``targets`` on each count of ``nodes``
    (:data:`~ckptio.testing.cluster.TASKS_PER_NODE` processes per node, under ``srun``), then
    for each count in ``probes`` the processes of that many nodes on one node (``srun
    --overcommit``: what a site measures of a storage's aggregate with one node); each run's
    results in ``out/<target>-<nodes>n[-probe<count>]``. RGW runs write to a new bucket.
    ``options``: more ``ckptio run`` options for every run (``--no-read``).

    ``repeats``: the whole sequence of runs that many times, forwards, then backwards, then
    forwards again, each repeat's results beside the others' in the same directory (which
    :func:`ckptio.results.read_results` pools). On a machine whose load drifts over minutes
    (other work beside it), two runs of one shape minutes apart can land far apart; in
    mirrored order the runs of every shape lie symmetric about the middle of the suite, so a
    drift linear in time falls alike on each shape's pooled iterations."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    bucket = new_bucket(cluster, "ckptio-suite") if "rgw" in targets else ""
    sequence = [
        (target, n, processes)
        for target in targets
        for n, processes in [(n, n * TASKS_PER_NODE) for n in nodes]
        + [(1, n * TASKS_PER_NODE) for n in probes]
    ]
    runs = []
    for repeat in range(repeats):
        for target, n, processes in sequence if repeat % 2 == 0 else sequence[::-1]:
            runs.append(
                _run_one(
                    cluster, out, bucket, target, n, processes,
                    args=[
                        "--preset", preset, "--gpus", str(gpus), "--total-size", size,
                        "--iterations", str(iterations), *options,
                    ],
                    timeout=timeout,
                )
            )  # fmt: skip
    return runs


def _run_one(
    cluster: Cluster,
    out: Path,
    bucket: str,
    target: str,
    n: int,
    processes: int,
    *,
    args: Sequence[str],
    timeout: float,
) -> SuiteRun:
    """One ``ckptio run URL ARGS`` of ``processes`` processes on ``n`` nodes."""
    name = f"{target}-{n}n" + ("" if processes == n * TASKS_PER_NODE else f"-probe{processes}")
    run = f"{name}-{uuid.uuid4().hex[:6]}"
    url = {
        "cephfs": f"pfs://{cluster.cephfs}/{run}",
        "glusterfs": f"pfs://{cluster.gluster}/{run}",
        "rgw": f"s3://{bucket}/{run}",
    }[target]
    # more processes than the node's slots: -n with --overcommit (Slurm refuses a
    # --ntasks-per-node above the node's CPUs)
    shape = (
        [f"-n{processes}", "--overcommit"]
        if processes > n * TASKS_PER_NODE
        else [f"--ntasks-per-node={processes // n}"]
    )
    cluster.srun(
        [
            f"-N{n}", *shape, "--mpi=pmix",
            sys.executable, "-m", "ckptio.cli", "run", url, *args,
            "--label", target, "--out", str(out / name),
        ],
        cwd=str(out),
        timeout=timeout,
    )  # fmt: skip
    return SuiteRun(target, n, processes, out / name)
