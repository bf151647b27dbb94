"""One workload run with ``ckptio run`` to each shared target of a cluster from 1, 2 and 3
nodes (``benchmarks/cluster.py``, ``tests/test_cluster_simulate.py``), and, where asked, from
ONE node with the processes of several and as many storage clients as those nodes would have:
the probe of the storage's aggregate that :func:`ckptio.simulate.fit_storage` takes
(``aggregate=``)."""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptio.testing.cluster.core import START_TIMEOUT, TASKS_PER_NODE, Cluster, ClusterUnavailable

__all__ = [
    "MOUNTED_TARGETS",
    "SHARED_TARGETS",
    "SuiteRun",
    "new_bucket",
    "run_suite",
    "storage_clients",
]

SHARED_TARGETS = ("cephfs", "rgw", "glusterfs")
MOUNTED_TARGETS = ("cephfs", "glusterfs")
"""The targets a node reaches through one client of its own (a FUSE mount) that all its
processes share; an S3 client is each process's own (its store and connection pool)."""


@dataclass(frozen=True)
class SuiteRun:
    """One ``ckptio run``: its target, the nodes it ran on, its processes, its results."""

    target: str
    nodes: int
    processes: int
    out: Path
    clients: int = 0
    """The storage clients a probe reached its target through (a mounted target's mounts;
    on S3, its processes); 0: not a probe (each node through its own)."""

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


@contextlib.contextmanager
def storage_clients(cluster: Cluster, node: str, count: int) -> Iterator[list[int]]:
    """``count`` more storage clients on ``node``, each in a mount namespace of its own inside
    the node, where the cluster's CephFS and GlusterFS (those it has) are mounted at their
    usual paths by a ``ceph-fuse`` and a ``glusterfs`` client of its own, as a site mounts a
    file system several times on one node to measure what several clients reach. Yields each
    namespace's holder PID as the node sees it: a process of the node enters one with
    ``nsenter --mount=/proc/PID/ns/mnt``. On exit each holder unmounts its clients (their
    daemons exit with their mounts) and ends; whatever is left ends with the node."""
    ceph = cluster.state.ceph if cluster.state.ceph and cluster.state.ceph.get("cephfs") else None
    gluster = cluster.state.gluster
    mounts = []
    if ceph is not None:
        from ckptio.rgwserver import CephServer

        conf = CephServer(**ceph).conf
        run = Path(ceph["workdir"]) / "run"
        mounts.append(
            (cluster.cephfs, f"ceph-fuse -c {conf} --pid-file {run}/fuse.$$.pid {cluster.cephfs}")
        )
    if gluster is not None:
        from ckptio.testing.gluster import GlusterVolume

        source = GlusterVolume(**gluster).source
        mounts.append((cluster.gluster, f"mount -t glusterfs {source} {cluster.gluster}"))
    unmount = "; ".join(f"umount {p} || umount -l {p}" for p, _ in mounts) or ":"
    # the node's own clients are not this namespace's: detached here only (a slave copy);
    # on TERM the clients are unmounted and their daemons (this namespace's ceph-fuse and
    # glusterfs) waited for, up to 10 s each (polled: not this shell's children), then killed
    script = "\n".join(
        [
            "set -e",
            *(f"umount -l {p}" for p, _ in mounts),
            *(cmd for _, cmd in mounts),
            "daemons=$(pgrep --ns $$ --nslist mnt -x 'ceph-fuse|glusterfs' || true)",
            "echo $$",
            "exec </dev/null >/dev/null 2>&1",
            f"trap '{unmount}; for p in $daemons; do i=0; while kill -0 $p 2>/dev/null && "
            "[ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; kill -9 $p 2>/dev/null || :; "
            "done; exit 0' TERM INT",
            "while :; do sleep 3600 & wait $!; done",
        ]
    )
    holders: list[tuple[subprocess.Popen[str], int]] = []
    try:
        for _ in range(count):
            proc = cluster.popen(
                node,
                ["unshare", "--mount", "--propagation", "slave", "bash", "-c", script],
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
            line = proc.stdout.readline().strip() if ready else ""
            if not line.isdigit():
                proc.kill()
                _, err = proc.communicate()
                raise ClusterUnavailable(f"a storage client on {node} did not mount: {err[-800:]}")
            holders.append((proc, int(line)))
        yield [pid for _, pid in holders]
    finally:
        for _, pid in holders:
            cluster.run(node, ["kill", str(pid)], check=False, timeout=30)
        for proc, _ in holders:
            try:
                proc.communicate(timeout=START_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


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
    for each count in ``probes`` the processes of that many nodes on one node, ``node0``
    (``srun --overcommit``: what a site measures of a storage's aggregate with one node);
    each run's results in ``out/<target>-<nodes>n[-probe<count>]``. RGW runs write to a new
    bucket. ``options``: more ``ckptio run`` options for every run (``--no-read``).

    A probe reaches a mounted target (:data:`MOUNTED_TARGETS`) through as many clients as
    the nodes it stands for have, each shared by one node's processes
    (:func:`storage_clients`; process ``i`` uses client ``i // TASKS_PER_NODE``), as those
    nodes would; an S3 probe's processes are each their own client already. (Through the
    node's one client, the job's n clients share one, whose own limit the probe would
    measure instead of the storage's.)

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
    probe_clients: bool = True,
) -> SuiteRun:
    """One ``ckptio run URL ARGS`` of ``processes`` processes on ``n`` nodes (a probe through
    one client of each node it stands for; ``probe_clients`` False: through node0's one)."""
    probe = processes > n * TASKS_PER_NODE
    clients = processes // TASKS_PER_NODE if probe and target in MOUNTED_TARGETS else 0
    if not probe_clients and clients:
        clients = 1
    name = f"{target}-{n}n" + (
        f"-probe{processes}{'-1client' if clients == 1 else ''}" if probe else ""
    )
    run = f"{name}-{uuid.uuid4().hex[:6]}"
    url = {
        "cephfs": f"pfs://{cluster.cephfs}/{run}",
        "glusterfs": f"pfs://{cluster.gluster}/{run}",
        "rgw": f"s3://{bucket}/{run}",
    }[target]
    # more processes than the node's slots: -n with --overcommit (Slurm refuses a
    # --ntasks-per-node above the node's CPUs), on node0, where its clients are
    shape = (
        [f"-n{processes}", "--overcommit", f"--nodelist={cluster.nodes[0]}"]
        if probe
        else [f"--ntasks-per-node={processes // n}"]
    )
    command = [
        sys.executable, "-m", "ckptio.cli", "run", url, *args,
        "--label", target, "--out", str(out / name),
    ]  # fmt: skip
    with contextlib.ExitStack() as stack:
        env = {}
        if clients > 1:
            pids = stack.enter_context(storage_clients(cluster, cluster.nodes[0], clients))
            env["CKPTIO_PROBE_CLIENTS"] = " ".join(map(str, pids))
            # each process into its client's mount namespace (SLURM_PROCID: 0, 1, ...)
            command = [
                "/bin/sh", "-c",
                'set -- $CKPTIO_PROBE_CLIENTS "$@"; shift $((SLURM_PROCID / '
                f'{TASKS_PER_NODE})); pid=$1; shift $(({clients} - SLURM_PROCID / '
                f'{TASKS_PER_NODE})); exec nsenter --mount=/proc/$pid/ns/mnt --wd="$PWD" -- "$@"',
                "sh", *command,
            ]  # fmt: skip
        cluster.srun(
            [f"-N{n}", *shape, "--mpi=pmix", *command],
            cwd=str(out),
            timeout=timeout,
            env=env,
        )
    return SuiteRun(
        target, n, processes, out / name, clients=clients or (processes if probe else 0)
    )
