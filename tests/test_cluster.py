"""The namespace cluster itself (ckptio.testing.cluster): nodes that are separate machines as
far as a program can tell (hostname, network, processes, a node-local directory nobody else
sees), the shared storage every node reaches with its own client, the launchers, a node
killed and replaced, and a teardown that leaves nothing — after a crash of the test session
too. ckptio's own runs on the cluster are in test_cluster_runs.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ckptio.testing.cluster import Cluster, ClusterState, ClusterUnavailable, leftovers
from ckptio.testing.cluster.fixture import start_or_raise
from ckptio.testing.cluster.state import REGISTRY, load_state
from ckptio.testing.services import service_or_skip

pytestmark = pytest.mark.cluster


def test_nodes_are_separate_machines(cluster: Cluster) -> None:
    assert [cluster.hostname(n) for n in cluster.nodes] == ["node0", "node1", "node2"]
    for n in cluster.nodes:
        cluster.run(n, ["ping", "-c1", "-W5", "node2" if n != "node2" else "node0"])
    # the node-local directory: the same path everywhere, each node's own
    mark = f"{cluster.local}/only-on-node1"
    cluster.run("node1", ["sh", "-c", f"echo node1 > {mark}"])
    try:
        assert cluster.run("node1", ["cat", mark]).stdout == "node1\n"
        for n in ("node0", "node2"):
            assert cluster.run(n, ["test", "-e", mark], check=False).returncode == 1
        assert not os.path.exists(mark)  # nor on this machine
    finally:
        cluster.run("node1", ["rm", "-f", mark])
    # the shared directory: one
    Path(cluster.shared, "from-host").write_text("host\n")
    assert cluster.run("node2", ["cat", f"{cluster.shared}/from-host"]).stdout == "host\n"
    # each node sees its own processes only
    sleeper = cluster.popen("node0", ["sleep", "600"])
    try:
        ps0 = cluster.run("node0", ["ps", "-eo", "args"]).stdout
        ps1 = cluster.run("node1", ["ps", "-eo", "args"]).stdout
        assert "sleep 600" in ps0 and "sleep 600" not in ps1
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("fs", ["cephfs", "gluster"])
def test_every_node_mounts_the_shared_filesystem_with_its_own_client(
    cluster: Cluster, fs: str
) -> None:
    point = cluster.cephfs if fs == "cephfs" else cluster.gluster
    mount_type = "fuse.ceph-fuse" if fs == "cephfs" else "fuse.glusterfs"
    client = "ceph-fuse" if fs == "cephfs" else "glusterfs"
    for n in cluster.nodes:
        mounts = cluster.run(n, ["cat", "/proc/self/mounts"]).stdout
        assert f" {point} {mount_type} " in mounts, mounts
        assert mounts.count(f" {point} ") == 1, mounts  # its own, not this machine's beneath
        # the client is a process of this node (its own PID namespace shows it)
        assert client in cluster.run(n, ["ps", "-eo", "comm"]).stdout
    name = f"probe-{fs}-{os.getpid()}"
    data = os.urandom(1 << 20).hex()
    cluster.run("node2", ["sh", "-c", f"cat > {point}/{name}"], input=data)
    try:
        for n in ("node0", "node1"):
            assert cluster.run(n, ["cat", f"{point}/{name}"]).stdout == data
        assert Path(point, name).read_text() == data  # this machine's own client
    finally:
        cluster.run("node0", ["rm", "-f", f"{point}/{name}"])


def test_storage_clients_of_one_node_are_clients_of_their_own(cluster: Cluster) -> None:
    """:func:`~ckptio.testing.cluster.suite.storage_clients`: on one node, more CephFS and
    GlusterFS clients, each a process of that node with its own mounts in a mount namespace
    of its own, at the usual paths; what one client writes, another and the node's own read;
    on exit they are gone and the node's own mounts are left as they were."""
    from ckptio.testing.cluster.suite import storage_clients

    def clients() -> list[str]:
        comms = cluster.run("node0", ["ps", "-eo", "comm"]).stdout.split()
        return sorted(c for c in comms if c in ("ceph-fuse", "glusterfs"))

    def mounts(pid: int | None) -> str:
        enter = [] if pid is None else ["nsenter", f"--mount=/proc/{pid}/ns/mnt"]
        return cluster.run("node0", [*enter, "cat", "/proc/self/mounts"]).stdout

    before, node_mounts = clients(), mounts(None)
    name = f"clients-{os.getpid()}"
    with storage_clients(cluster, "node0", 2) as pids:
        assert len(set(pids)) == 2
        assert clients() == sorted(before * 3)  # two more of each, in node0
        for pid in pids:
            mine = mounts(pid)
            for point, kind in (
                (cluster.cephfs, "fuse.ceph-fuse"),
                (cluster.gluster, "fuse.glusterfs"),
            ):
                assert mine.count(f" {point} ") == 1, mine  # its own, not the node's beneath
                assert f" {point} {kind} " in mine
        assert mounts(None) == node_mounts  # the node's own untouched
        data = os.urandom(1 << 16).hex()
        try:
            for point in (cluster.cephfs, cluster.gluster):
                cluster.run(
                    "node0",
                    [
                        "nsenter",
                        f"--mount=/proc/{pids[0]}/ns/mnt",
                        "sh",
                        "-c",
                        f"cat > {point}/{name}",
                    ],
                    input=data,
                )
                for enter in (["nsenter", f"--mount=/proc/{pids[1]}/ns/mnt"], []):
                    assert cluster.run("node0", [*enter, "cat", f"{point}/{name}"]).stdout == data
        finally:
            for point in (cluster.cephfs, cluster.gluster):
                cluster.run("node0", ["rm", "-f", f"{point}/{name}"])
    assert clients() == before
    assert mounts(None) == node_mounts


def test_rgw_answers_every_node(cluster: Cluster) -> None:
    script = textwrap.dedent(
        """
        import socket, boto3
        c = boto3.client("s3")
        b = "probe-" + socket.gethostname()
        c.create_bucket(Bucket=b)
        c.put_object(Bucket=b, Key="k", Body=b"x" * (1 << 20))
        n = len(c.get_object(Bucket=b, Key="k")["Body"].read())
        c.delete_object(Bucket=b, Key="k")
        c.delete_bucket(Bucket=b)
        print(socket.gethostname(), n)
        """
    )
    for n in cluster.nodes:
        out = cluster.run(n, [sys.executable, "-c", script]).stdout.split()
        assert out == [n, str(1 << 20)]


def test_srun_sbatch_and_mpiexec_place_two_ranks_on_each_node(
    cluster: Cluster, tmp_path: Path
) -> None:
    out = cluster.srun(["-N3", "--ntasks-per-node=2", "hostname"]).stdout.split()
    assert sorted(out) == ["node0", "node0", "node1", "node1", "node2", "node2"]

    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH -N 3\n#SBATCH --ntasks-per-node=2\n"
        f"#SBATCH -o {tmp_path}/job-%j.out\nsrun hostname\n"
    )
    job = cluster.sbatch(str(script))
    assert job["JobState"] == "COMPLETED", job
    assert sorted(Path(job["StdOut"]).read_text().split()) == sorted(out)

    hello = tmp_path / "hello.py"
    hello.write_text(
        "import os, socket\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
        "os.write(1, f'{c.Get_rank()} {socket.gethostname()} {c.allreduce(c.Get_rank())}\\n'.encode())\n"
    )
    pytest.importorskip("mpi4py")
    lines = cluster.mpiexec([sys.executable, str(hello)]).stdout.splitlines()
    ranks = sorted(tuple(line.split()) for line in lines)
    assert ranks == [(str(r), f"node{r // 2}", "15") for r in range(6)]


def test_a_failed_srun_says_what_slurm_saw(cluster: Cluster) -> None:
    """An srun that fails (or hangs past its timeout) names each node's state and the queue,
    so that a node Slurm holds back shows in the error."""
    with pytest.raises(ClusterUnavailable) as failed:
        cluster.srun(["-N3", "--ntasks-per-node=2", "false"])
    text = str(failed.value)
    assert "--- Slurm" in text and "$ squeue" in text
    sinfo = text.split("$ sinfo")[1].split("$ squeue")[0].splitlines()[2:]  # past the header
    states = dict(line.split()[:2] for line in sinfo if line.strip())
    assert sorted(states) == cluster.nodes, text  # idle, or completing the job just ended


def test_a_killed_node_is_replaced_by_an_empty_one(cluster: Cluster) -> None:
    """What issue-34 tests build on: kill_node takes every process of the node with it (its
    CephFS client too) and its node-local directory; start_node brings up a node of the same
    name and address with an empty one, which Slurm takes back."""
    cluster.run("node2", ["sh", "-c", f"echo before > {cluster.local}/mark"])
    old = cluster.state.nodes["node2"].pid
    cluster.kill_node("node2")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ckc{cluster.id}-node2" not in netns
    with pytest.raises(ClusterUnavailable, match="not running"):
        cluster.run("node2", ["true"])
    from ckptio.rgwserver import CephServer, cephfs_sessions

    ceph = CephServer(**cluster.state.ceph)  # type: ignore[arg-type]
    assert "node2" not in [s["hostname"] for s in cephfs_sessions(ceph)]  # evicted: fenced
    cluster.start_node("node2")
    assert [s["hostname"] for s in cephfs_sessions(ceph)].count("node2") == 1
    assert cluster.state.nodes["node2"].pid != old
    assert cluster.hostname("node2") == "node2"
    assert cluster.run("node2", ["ls", "-A", cluster.local]).stdout == ""
    mounts = cluster.run("node2", ["cat", "/proc/self/mounts"]).stdout
    # its own CephFS client, the login node's (copied in at its start) unmounted
    assert mounts.count(f" {cluster.cephfs} fuse.ceph-fuse ") == 1, mounts
    assert "ceph-fuse" in cluster.run("node2", ["ps", "-eo", "comm"]).stdout
    out = cluster.srun(["-N3", "--ntasks-per-node=1", "hostname"]).stdout.split()
    assert sorted(out) == ["node0", "node1", "node2"]


def _wait_for(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s")
        time.sleep(0.2)  # polling another process's progress: files and /proc, no event


@pytest.mark.slow
def test_a_test_session_killed_mid_run_leaves_nothing(cluster: Cluster, tmp_path: Path) -> None:
    """A pytest process holding its own cluster is SIGKILLed (no finalizer, no atexit): its
    reaper tears the cluster down; no network namespace, bridge, mount, daemon or directory is
    left. The session's own cluster, running beside it all along, is untouched."""
    ident = tmp_path / "id"
    (tmp_path / "test_hold.py").write_text(
        textwrap.dedent(
            f"""
            import threading

            def test_hold(cluster):
                open({str(ident)!r}, "w").write(cluster.id)
                threading.Event().wait()  # held until the session is killed
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for(
            "the inner session's cluster came up",
            lambda: (ident.exists() and ident.read_text()) or proc.poll() is not None,
            180,
        )
        assert proc.poll() is None, proc.communicate()[0]
        state = load_state(ident.read_text())
        assert state.id != cluster.id and state.subnet != cluster.state.subnet
        assert state.bridge in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    _wait_for("the reaper tore the cluster down", lambda: not state.path.exists(), 120)
    assert leftovers(state) == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ckc{state.id}" not in netns
    assert state.workdir not in Path("/proc/self/mounts").read_text()
    assert not (REGISTRY / f"{state.id}.reaper.log").exists()
    # the session's cluster is whole
    assert cluster.leftovers() and cluster.hostname("node0") == "node0"


@pytest.mark.slow
def test_the_command_brings_a_cluster_up_and_down_leaving_nothing(cluster: Cluster) -> None:
    """``python -m ckptio.testing.cluster up --gluster`` starts every part (nodes, Slurm,
    Ceph with a CephFS client per node, GlusterFS); ``down`` removes it all: no network
    namespace (``ip netns list``), no link, no mount, no process and no directory of it is
    left. The session's cluster, beside it, is untouched."""
    tool = [sys.executable, "-m", "ckptio.testing.cluster"]
    up = subprocess.run([*tool, "up", "-n", "2", "--gluster"], capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    ident = up.stdout.split()[1].rstrip(":")
    try:
        state = load_state(ident)
        assert state.id != cluster.id
        mounts = Path("/proc/mounts").read_text()
        assert f"{state.workdir}/mnt/cephfs fuse.ceph-fuse" in mounts
        assert f"{state.workdir}/mnt/gluster fuse.glusterfs" in mounts
        exec_ = [*tool, "exec", ident, "node1", "--", "hostname"]
        assert subprocess.run(exec_, capture_output=True, text=True).stdout == "node1\n"
        daemons = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True)
        assert f"slurmd -f {state.workdir}" in daemons.stdout, daemons.stdout
    finally:
        down = subprocess.run([*tool, "down", ident], capture_output=True, text=True)
    assert down.returncode == 0, down.stderr
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ckc{ident}" not in netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"ckc{ident}" not in links
    assert state.workdir not in Path("/proc/mounts").read_text()
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert [line for line in ps.splitlines() if state.workdir in line] == []
    assert not Path(state.workdir).exists() and leftovers(state) == []
    assert cluster.hostname("node0") == "node0" and cluster.leftovers()


def test_without_root_it_skips_naming_the_install_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match=r"needs root.*install-system-deps\.sh"):
        next(service_or_skip("namespace cluster", start_or_raise, Cluster.down, ClusterUnavailable))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="could not be started in CI"):
        next(service_or_skip("namespace cluster", start_or_raise, Cluster.down, ClusterUnavailable))


def test_state_round_trips(cluster: Cluster) -> None:
    again = load_state(cluster.id)
    assert again == cluster.state and isinstance(again, ClusterState)


def test_a_slurm_that_cannot_load_pmix_is_named_before_the_cluster_starts(tmp_path: Path) -> None:
    """Slurm's pmix plugin without the unversioned libpmix.so it opens (libpmix-dev not
    installed): the cluster says so and names the package, instead of every srun failing."""
    from ckptio.testing.cluster.core import pmix_reason

    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    assert pmix_reason(str(tmp_path)) is None  # no Debian Slurm plugin: not judged
    (lib / "slurm-wlm").mkdir(parents=True)
    (lib / "slurm-wlm/mpi_pmix_v4.so").touch()
    (lib / "pmix2/lib").mkdir(parents=True)
    (lib / "pmix2/lib/libpmix.so.2").touch()  # libpmix2 alone: only the versioned name
    reason = pmix_reason(str(tmp_path))
    assert reason is not None and "libpmix-dev" in reason and "mpi_pmix_v4.so" in reason
    (lib / "pmix2/lib/libpmix.so").symlink_to("libpmix.so.2")
    assert pmix_reason(str(tmp_path)) is None
    assert pmix_reason() is None, "this machine's srun --mpi=pmix cannot load PMIx"
