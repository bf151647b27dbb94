"""What a cluster is made of, written down so that any process can take it apart: the state
file, the registry of live clusters, and :func:`teardown`, which removes everything a state
names (used by :meth:`Cluster.down <ckptio.testing.cluster.Cluster.down>`, by the reaper
after its owner died, by ``python -m ckptio.testing.cluster down`` and by the stale sweep at
every fixture start).

Every cluster has one state file in :data:`REGISTRY` (``<id>.json``), rewritten after every
change (temp + rename). Processes are recorded with their start time (``/proc/<pid>/stat``
field 22) so that a PID reused by another program after a crash is never signalled. Whatever
the cluster launches carries ``CKPTIO_CLUSTER=<id>`` in its environment, so a teardown also
finds the launchers the owner left behind (an ``srun``, an ``mpiexec``, an ``nsenter``)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ENV",
    "REGISTRY",
    "ClusterState",
    "Node",
    "leftovers",
    "load_state",
    "proc_start",
    "registered",
    "stale",
    "teardown",
]

REGISTRY = Path(os.environ.get("CKPTIO_CLUSTER_REGISTRY", "/run/ckptio-clusters"))
"""Directory of the state files of live clusters (``/run``: cleared at boot, as the clusters
are)."""
ENV = "CKPTIO_CLUSTER"
"""Environment variable set to the cluster's id in every process the cluster launches."""
KILL_WAIT = 30.0
"""Seconds a node's processes get to vanish after its init was killed (FUSE clients in D
state take a moment)."""


@dataclass
class Node:
    """One node: its namespaces, held open by a holder process (PID 1 of its PID namespace)."""

    name: str
    """Its hostname (``node0``, ...; ``head`` runs slurmctld)."""
    index: int
    ip: str
    netns: str
    """The network namespace's name (``ip netns``)."""
    veth: str
    """The host end of its veth pair (on the bridge); ``eth0`` inside."""
    pid: int = 0
    """The holder's PID as the host sees it: ``nsenter -t PID`` enters the node."""
    start: int = 0
    """The holder's start time (``/proc/PID/stat``), so a reused PID is never taken for it."""


@dataclass
class ClusterState:
    """Everything one cluster holds on this machine (see the module docstring)."""

    id: str
    workdir: str
    subnet: str
    """The first three octets of the bridge's /24 (``10.213.7``)."""
    bridge: str
    nodes: dict[str, Node] = field(default_factory=dict)
    owner: int = 0
    """PID of the process whose death ends the cluster (0: none, ``up`` from the command line)."""
    owner_start: int = 0
    reaper: int = 0
    reaper_start: int = 0
    munged: int = 0
    munged_start: int = 0
    ceph: dict[str, Any] | None = None
    """:class:`ckptio.rgwserver.CephServer` as a dict."""
    gluster: dict[str, Any] | None = None
    """:class:`ckptio.testing.gluster.GlusterVolume` as a dict."""
    options: dict[str, Any] = field(default_factory=dict)
    """How it was started (nodes, services), for ``status``."""

    @property
    def path(self) -> Path:
        return REGISTRY / f"{self.id}.json"

    def save(self) -> None:
        REGISTRY.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.path)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ClusterState:
        nodes = {k: Node(**v) for k, v in doc.pop("nodes", {}).items()}
        return cls(nodes=nodes, **doc)


def load_state(cluster_id: str) -> ClusterState:
    path = REGISTRY / f"{cluster_id}.json"
    if not path.exists():
        raise FileNotFoundError(f"no cluster {cluster_id!r} recorded in {REGISTRY}")
    return ClusterState.from_dict(json.loads(path.read_text()))


def registered() -> list[ClusterState]:
    """Every cluster recorded in :data:`REGISTRY` (unreadable files skipped)."""
    out = []
    for path in sorted(REGISTRY.glob("*.json")) if REGISTRY.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, TypeError):
            out.append(ClusterState.from_dict(json.loads(path.read_text())))
    return out


@contextlib.contextmanager
def registry_lock() -> Iterator[None]:
    """Held while a subnet and names are chosen, so two clusters starting at once never pick
    the same."""
    REGISTRY.mkdir(parents=True, exist_ok=True)
    with open(REGISTRY / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# -- processes --------------------------------------------------------------------------------


def proc_start(pid: int) -> int:
    """The start time of ``pid`` (clock ticks since boot), 0 if it does not run (a zombie,
    dead but not yet waited for by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return 0
    # the command name (field 2) may hold spaces and parentheses: split after its last ")"
    fields = stat[stat.rindex(b")") + 2 :].split()
    return 0 if fields[0] in (b"Z", b"X") else int(fields[19])


def same_process(pid: int, start: int) -> bool:
    """Whether ``pid`` still runs and is the process that started at ``start``."""
    return pid > 0 and start > 0 and proc_start(pid) == start


def stale(state: ClusterState) -> bool:
    """Whether the cluster's owner is gone (a cluster started without one never is)."""
    return state.owner > 0 and not same_process(state.owner, state.owner_start)


def _pids_where(part: str, holds: Callable[[bytes], bool]) -> list[int]:
    """Processes whose ``/proc/PID/<part>`` ``holds`` (one scan of ``/proc``), this process
    excepted; a process that ends during the scan is left out."""
    found = []
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/{part}", "rb") as fh:
                if holds(fh.read()):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _pids_with_env(cluster_id: str) -> list[int]:
    """Processes whose environment carries ``CKPTIO_CLUSTER=<id>`` (what the cluster launched),
    this process excepted."""
    mark = f"{ENV}={cluster_id}".encode()
    return _pids_where("environ", lambda env: mark in env.split(b"\0"))


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line holds ``text`` (daemons started with a path of the
    cluster's), this process excepted."""
    mark = text.encode()
    return _pids_where("cmdline", lambda cmdline: mark in cmdline)


def netns_pids(netns: str) -> list[int]:
    """Processes in network namespace ``netns`` (``ip netns pids``), zombies left out; []
    when it is gone."""
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    pids = [int(p) for p in done.stdout.split()] if done.returncode == 0 else []
    return [p for p in pids if proc_start(p)]


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = pids
    while left and time.monotonic() < deadline:
        time.sleep(0.05)  # polling processes that are not this process's children
        left = [p for p in left if proc_start(p)]
    return left


def kill_node(node: Node) -> list[str]:
    """SIGKILL the node's init: the kernel then kills every process of its PID namespace
    (slurmd, FUSE clients, ranks). Waits until its network namespace holds no process; the
    node's private mounts (its local tmpfs, its FUSE mounts) go with the last of them.
    Returns the problems met."""
    if same_process(node.pid, node.start):
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.pid, signal.SIGKILL)
    left = _wait_gone(netns_pids(node.netns), KILL_WAIT)
    for pid in left:  # a process that entered the netns without the PID namespace
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    left = _wait_gone(left, KILL_WAIT)
    return [f"{node.name}: processes {left} outlived its init"] if left else []


def remove_node_net(node: Node) -> None:
    """Delete the node's network namespace and veth (the peer goes with either)."""
    subprocess.run(["ip", "netns", "del", node.netns], capture_output=True)
    subprocess.run(["ip", "link", "del", node.veth], capture_output=True)


# -- teardown ---------------------------------------------------------------------------------


def _mounts_under(path: str) -> list[str]:
    """Mount points at or under ``path`` in this mount namespace, deepest first."""
    prefix = path.rstrip("/") + "/"
    points = []
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            point = parts[1].replace("\\040", " ") if len(parts) > 1 else ""
            if point == path or point.startswith(prefix):
                points.append(point)
    return sorted(set(points), key=len, reverse=True)


def teardown(state: ClusterState) -> list[str]:
    """Remove everything ``state`` names, in the order that leaves nothing hanging: the
    launchers it left (by their ``CKPTIO_CLUSTER`` environment), the nodes (all their
    processes and private mounts), Ceph (its host mount first, then its daemons), the
    GlusterFS volume, munged, the network (namespaces, veths, bridge), any mount left under
    the work directory, the directory and the state file. Idempotent and best effort: returns
    the problems met (empty when all went well)."""
    problems: list[str] = []
    if same_process(state.reaper, state.reaper_start) and state.reaper != os.getpid():
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.reaper, signal.SIGTERM)
    launched = _pids_with_env(state.id)
    for pid in launched:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for node in state.nodes.values():
        problems += kill_node(node)
    if _wait_gone(launched, KILL_WAIT):
        problems.append(f"launched processes {launched} outlived SIGKILL")
    if state.ceph is not None:
        from ckptio.rgwserver import CephServer, stop_ceph

        problems += stop_ceph(CephServer(**state.ceph), keep=True)
    if state.gluster is not None:
        from ckptio.testing.gluster import GlusterVolume, stop_volume

        problems += stop_volume(GlusterVolume(**state.gluster))
    if same_process(state.munged, state.munged_start):
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.munged, signal.SIGTERM)
    for pid in _wait_gone(_pids_mentioning(state.workdir), 5.0):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    left = _wait_gone(_pids_mentioning(state.workdir), KILL_WAIT)
    if left:
        problems.append(f"processes {left} of {state.workdir} outlived SIGKILL")
    for node in state.nodes.values():
        remove_node_net(node)
    subprocess.run(["ip", "link", "del", state.bridge], capture_output=True)
    for point in _mounts_under(state.workdir):
        done = subprocess.run(["umount", point], capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)
            problems.append(f"umount {point}: {done.stderr.strip()} (lazily unmounted)")
    if not _mounts_under(state.workdir):
        shutil.rmtree(state.workdir, ignore_errors=True)
    state.path.unlink(missing_ok=True)
    (REGISTRY / f"{state.id}.reaper.log").unlink(missing_ok=True)
    return problems


def leftovers(state: ClusterState) -> list[str]:
    """What of ``state`` is still on this machine (after :func:`teardown`: nothing): network
    namespaces, the bridge, veths, mounts under its directory, processes mentioning the
    directory or carrying its ``CKPTIO_CLUSTER``."""
    out = []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out += [f"netns {line.split()[0]}" for line in names.splitlines() if state.id in line]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    out += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if state.id in line]
    out += [f"mount {p}" for p in _mounts_under(state.workdir)]
    pids = set(_pids_mentioning(state.workdir)) | set(_pids_with_env(state.id))
    pids.discard(state.reaper)
    out += [f"process {p}" for p in sorted(pids) if proc_start(p)]
    if Path(state.workdir).exists():
        out.append(f"directory {state.workdir}")
    if state.path.exists():
        out.append(f"state file {state.path}")
    return out
