"""A throwaway single-node Ceph cluster: the RADOS Gateway (RGW, Ceph's S3 implementation) and,
when asked, CephFS (a striped parallel filesystem, mounted with ``ceph-fuse``) from the same
OSD. The one Ceph launcher of ckptio: for tests (the session fixture ``rgw_server`` and
``s3_target`` in :mod:`ckptio.testing.moto`; the namespace cluster of
:mod:`ckptio.testing.cluster`, which binds it to its bridge), for ``ckptio compare --targets
rgw,cephfs``, for ``benchmarks/s3_peers.py``, and for a person (``python -m ckptio.rgwserver
start DIR [--cephfs]`` / ``stop DIR``).

Shape: one monitor, one OSD with the ``memstore`` object store (data in the OSD's memory), one
``radosgw`` with its beast frontend on ``<addr>:<free port>`` (``addr`` 127.0.0.1 unless
given), with ``cephfs`` one MDS and a filesystem ``cephfs`` on two pools of the same OSD,
authentication off, no manager daemon (``ceph fs new`` needs none; ``df`` then shows 0 bytes),
pools of size 1. Everything lives in a private directory (configuration, monitor
store, logs, admin sockets, pid files); every daemon is started directly (no systemd) with its
own pid file and stopped by that PID — the OSD ignores SIGTERM, so it gets SIGKILL after a
grace period. An S3 user with fixed test keys (the same fake keys as the moto fixtures:
:data:`TEST_ACCESS_KEY_ID`, :data:`TEST_SECRET_ACCESS_KEY`) is created with
``radosgw-admin``.

Settings that matter (each found necessary, not tuning): ``ms mon client mode = crc secure``
(with cephx off radosgw otherwise waits 300 s for the monitor); ``paxos propose interval =
0.05`` (each pool RGW creates costs an osdmap epoch: ~2 s to ready instead of ~18 s); RGW's
garbage collection after 5 s instead of 2 h (a memstore OSD otherwise keeps every deleted
object in memory); the monitor's free-disk guard lowered to 1% (it refuses to run below 5%);
for CephFS an MDS beacon every second (it goes active in ~1 s, not ~4 s) and ``$pid`` in the
clients' admin socket and pid file (two ``ceph-fuse`` mounts otherwise share one pid file and
the second fails with "(33) Numerical argument out of domain").
The OSD binds ``addr`` in Ceph's default port range (6800-7300) besides the chosen ports.

Needs Debian's ``radosgw``, ``ceph-mon`` and ``ceph-osd``, and for CephFS ``ceph-mds`` and
``ceph-fuse`` (``scripts/install-system-deps.sh``).
The test fixture (:func:`ckptio.testing.rgw.server_or_skip`) skips with that hint where they
are missing — except under ``CI=true`` (:func:`ckptio.testing.services.in_ci`), where it fails: CI must run these tests,
not skip them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ckptio.mockserver import TEST_ACCESS_KEY_ID, TEST_REGION, TEST_SECRET_ACCESS_KEY

__all__ = [
    "CEPHFS_INSTALL_HINT",
    "CEPHFS_LABEL",
    "INSTALL_HINT",
    "LABEL",
    "CephServer",
    "RgwServer",
    "RgwUnavailable",
    "cephfs_sessions",
    "empty_bucket",
    "evict_cephfs_clients",
    "main",
    "mount_cephfs",
    "start_ceph",
    "start_rgw",
    "stop_ceph",
    "stop_rgw",
    "unavailable_reason",
    "unmount_cephfs",
]

INSTALL_HINT = "apt-get install --no-install-recommends radosgw ceph-mon ceph-osd (scripts/install-system-deps.sh)"
CEPHFS_INSTALL_HINT = (
    "apt-get install --no-install-recommends ceph-mds ceph-fuse (scripts/install-system-deps.sh)"
)
TOOLS = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph")
CEPHFS_TOOLS = ("ceph-mds", "ceph-fuse")
COMMAND_TIMEOUT = 60.0
"""Seconds one ``ceph``/``radosgw-admin`` command may take before it counts as failed."""
READY_TIMEOUT = 90.0
"""Seconds from the first daemon's start to RGW answering a PUT, before giving up."""
STOP_GRACE = 5.0
"""Seconds a ``ceph-fuse`` client gets after SIGTERM before SIGKILL."""
USER = "ckptio-test"
LABEL = "measured — Ceph RGW on loopback"
"""How results against this server are labelled: a real S3 implementation on this machine."""
CEPHFS_LABEL = "measured — CephFS (ceph-fuse) on loopback"
"""How CephFS results are labelled: a real parallel filesystem on this machine, on the same
OSD as RGW."""


_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""The daemons this process started, by PID: kept to reap them (no zombie, no warning)."""


class RgwUnavailable(RuntimeError):
    """This machine cannot run Ceph (RGW or CephFS), or it did not come up; the message says
    why."""


@dataclass
class CephServer:
    """A running single-node Ceph: :attr:`endpoint` is its S3 endpoint URL (``""`` without
    RGW); with :attr:`cephfs`, :func:`mount_cephfs` mounts its filesystem."""

    workdir: str
    endpoint: str
    fsid: str
    pids: dict[str, int] = field(default_factory=dict)
    """Daemon name (``mon.a``, ``osd.0``, ``mds.a``, ``client.rgw``) -> PID, in start order."""
    access_key_id: str = TEST_ACCESS_KEY_ID
    secret_access_key: str = TEST_SECRET_ACCESS_KEY
    region: str = TEST_REGION
    addr: str = "127.0.0.1"
    """The address every daemon binds (a bridge's, for clients in network namespaces)."""
    cephfs: bool = False
    """An MDS runs and the filesystem ``cephfs`` exists."""
    mounts: dict[str, int] = field(default_factory=dict)
    """CephFS mount point -> its ``ceph-fuse`` PID, for the mounts :func:`mount_cephfs` made
    in this mount namespace (unmounted by :func:`stop_ceph`)."""

    @property
    def conf(self) -> str:
        return str(Path(self.workdir) / "ceph.conf")

    def env(self) -> dict[str, str]:
        """The AWS environment variables that point every client library at this server."""
        from ckptio.mockserver import aws_env

        return aws_env(self.endpoint)

    def client(self) -> Any:
        """A boto3 client on this server."""
        from ckptio.mockserver import boto3_client

        return boto3_client(self.endpoint)


RgwServer = CephServer
"""The name tests and benchmarks have used since RGW was the only service."""


def empty_bucket(client: Any, bucket: str, *, delete: bool = True) -> None:
    """With the boto3 S3 ``client``: abort the open multipart uploads of ``bucket``, delete its
    objects and (``delete``) the bucket. RGW's garbage collection frees the data seconds later."""
    c = client
    for page in c.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for u in page.get("Uploads", []):
            with contextlib.suppress(Exception):
                c.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            c.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    if delete:
        c.delete_bucket(Bucket=bucket)


def unavailable_reason(*, cephfs: bool = False) -> str | None:
    """Why RGW (with ``cephfs``: CephFS too) cannot be started here, or None if it can (as far
    as can be told)."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} not found: {INSTALL_HINT}"
    if cephfs:
        if os.geteuid() != 0:
            return "CephFS through ceph-fuse needs root (mount)"
        if not os.path.exists("/dev/fuse"):
            return "CephFS through ceph-fuse needs FUSE: /dev/fuse is missing"
        for tool in CEPHFS_TOOLS:
            if shutil.which(tool) is None:
                return f"{tool} not found: {CEPHFS_INSTALL_HINT}"
    return None


def _free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def _config(work: Path, fsid: str, mon_port: int, rgw_port: int, addr: str) -> str:
    return f"""[global]
fsid = {fsid}
mon initial members = a
mon host = v2:{addr}:{mon_port}
ms bind msgr1 = false
public addr = {addr}
cluster addr = {addr}
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc secure
run dir = {work}/run
admin socket = {work}/run/$name.asok
pid file = {work}/run/$name.pid
log file = {work}/log/$name.log
log to stderr = false
err to stderr = true
mon cluster log file = {work}/log/cluster.log
mon data = {work}/mon/$cluster-$id
osd data = {work}/osd/$cluster-$id
mds data = {work}/mds/$cluster-$id
keyring = {work}/keyring
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
mon data avail warn = 2
mon data avail crit = 1
paxos propose interval = 0.05
client mount timeout = 30
rados mon op timeout = 30
rados osd op timeout = 30
mds beacon interval = 1

[client]
admin socket = {work}/run/$name.$pid.asok
pid file = {work}/run/$name.$pid.pid

[osd]
osd objectstore = memstore
memstore device bytes = 8589934592
osd max object size = 134217728

[client.rgw]
rgw data = {work}/rgw
rgw frontends = beast endpoint={addr}:{rgw_port}
rgw thread pool size = 64
rgw gc obj min wait = 5
rgw gc processor period = 5
rgw gc processor max time = 5
rgw enable usage log = false
rgw dns name = {addr}
"""


def _run(cmd: list[str], *, timeout: float = COMMAND_TIMEOUT) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        raise RgwUnavailable(f"`{' '.join(cmd)}` did not finish in {timeout:.0f} s") from err
    if done.returncode != 0:
        raise RgwUnavailable(
            f"`{' '.join(cmd)}` exited {done.returncode}: {(done.stdout + done.stderr).strip()[-800:]}"
        )
    return done.stdout


def _spawn(server: CephServer, name: str, cmd: list[str]) -> None:
    """Start a daemon in the foreground (``-f``) as our child, its own session, output to its
    log directory; its PID goes to its pid file (written by the daemon too) and ``server``."""
    log = Path(server.workdir) / "log" / f"{name}.out"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*cmd, "-f", "-c", server.conf],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    server.pids[name] = proc.pid
    (Path(server.workdir) / "run" / f"{name}.ckptio.pid").write_text(str(proc.pid))
    _save(server)


def _check_alive(server: CephServer, name: str) -> None:
    if not _alive(server.pids[name]):
        raise RgwUnavailable(f"{name} exited; see {server.workdir}/log/{name}.log and .out")


def _wait(
    what: str, server: CephServer, daemons: list[str], until: float, probe: Callable[[], bool]
) -> None:
    while True:
        for name in daemons:
            _check_alive(server, name)
        if probe():
            return
        if time.monotonic() > until:
            raise RgwUnavailable(
                f"{what} within {READY_TIMEOUT:.0f} s of start; logs in {server.workdir}/log"
            )
        time.sleep(0.1)


def _osd_up(conf: str) -> bool:
    try:
        out = _run(["ceph", "-c", conf, "osd", "dump", "--format", "json"], timeout=15)
    except RgwUnavailable:
        return False
    return any(o.get("up") == 1 for o in json.loads(out).get("osds", []))


def _rgw_answers(server: CephServer) -> bool:
    try:
        with urllib.request.urlopen(server.endpoint + "/", timeout=5) as resp:
            resp.read()
        return True
    except urllib.error.HTTPError:
        return True  # any S3 answer (403 for an anonymous list) means the frontend is up
    except OSError:
        return False


def _put_works(server: CephServer) -> bool:
    client = server.client()
    bucket = f"ckptio-ready-{uuid.uuid4().hex[:8]}"
    try:
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="probe", Body=b"ready")
        client.delete_object(Bucket=bucket, Key="probe")
        client.delete_bucket(Bucket=bucket)
        return True
    except Exception:
        return False
    finally:
        client.close()


def _mds_active(conf: str) -> bool:
    try:
        out = _run(["ceph", "-c", conf, "fs", "dump", "--format", "json"], timeout=15)
    except RgwUnavailable:
        return False
    for fs in json.loads(out).get("filesystems", []):
        infos = fs.get("mdsmap", {}).get("info", {})
        if any(i.get("state") == "up:active" for i in infos.values()):
            return True
    return False


def start_rgw(workdir: str | os.PathLike[str] | None = None) -> CephServer:
    """:func:`start_ceph` with RGW only, on loopback (the S3 tests' and ``compare``'s)."""
    return start_ceph(workdir)


def start_ceph(
    workdir: str | os.PathLike[str] | None = None,
    *,
    addr: str = "127.0.0.1",
    rgw: bool = True,
    cephfs: bool = False,
) -> CephServer:
    """Start a monitor and a memstore OSD under ``workdir`` (a fresh private temp directory
    when None), bound to ``addr``; with ``rgw`` radosgw and the test S3 user, with ``cephfs``
    an MDS and the filesystem ``cephfs`` (its metadata and data pools on the same OSD).
    Returns when a PUT succeeds (RGW) and the MDS is active (CephFS): mount it with
    :func:`mount_cephfs`. Raises :class:`RgwUnavailable` (with everything started so far
    stopped again)."""
    reason = unavailable_reason(cephfs=cephfs)
    if reason:
        raise RgwUnavailable(reason)
    if workdir is None:
        work = Path(tempfile.mkdtemp(prefix="ckptio-ceph-"))
    else:  # stop_ceph deletes the directory: never one that holds anything else
        work = Path(workdir).resolve()
        if work.exists() and any(work.iterdir()):
            raise RgwUnavailable(f"{work} is not empty: give a new or empty directory")
        work.mkdir(parents=True, exist_ok=True)
    for sub in ("run", "log", "mon", "osd", "rgw", "mds"):
        (work / sub).mkdir(exist_ok=True)
    fsid = str(uuid.uuid4())
    mon_port, rgw_port = _free_port(addr), _free_port(addr)
    endpoint = f"http://{addr}:{rgw_port}" if rgw else ""
    server = CephServer(str(work), endpoint, fsid, addr=addr, cephfs=cephfs)
    Path(server.conf).write_text(_config(work, fsid, mon_port, rgw_port, addr))
    conf = server.conf
    until = time.monotonic() + READY_TIMEOUT
    try:
        monmap = str(work / "monmap")
        _run(
            [
                "monmaptool",
                "--create",
                "--fsid",
                fsid,
                "--addv",
                "a",
                f"[v2:{addr}:{mon_port}]",
                monmap,
            ]
        )
        _run(["ceph-mon", "-c", conf, "--mkfs", "-i", "a", "--monmap", monmap])
        _spawn(server, "mon.a", ["ceph-mon", "-i", "a"])
        osd_uuid = str(uuid.uuid4())
        osd_id = _run(["ceph", "-c", conf, "osd", "create", osd_uuid]).strip()
        (work / "osd" / f"ceph-{osd_id}").mkdir(exist_ok=True)
        _run(["ceph-osd", "-c", conf, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid])
        _spawn(server, f"osd.{osd_id}", ["ceph-osd", "-i", osd_id])
        if cephfs:
            (work / "mds" / "ceph-a").mkdir(exist_ok=True)
            _spawn(server, "mds.a", ["ceph-mds", "-i", "a"])
        _wait("the OSD was not up", server, list(server.pids), until, lambda: _osd_up(conf))
        if cephfs:
            for pool in ("cephfs_metadata", "cephfs_data"):
                _run(["ceph", "-c", conf, "osd", "pool", "create", pool, "8"])
            _run(["ceph", "-c", conf, "fs", "new", "cephfs", "cephfs_metadata", "cephfs_data"])
        if rgw:
            _run(
                [
                    "radosgw-admin",
                    "-c",
                    conf,
                    "user",
                    "create",
                    f"--uid={USER}",
                    f"--display-name={USER}",
                    f"--access-key={TEST_ACCESS_KEY_ID}",
                    f"--secret-key={TEST_SECRET_ACCESS_KEY}",
                ]
            )
            _spawn(server, "client.rgw", ["radosgw", "-n", "client.rgw"])
            _wait(
                "radosgw did not answer HTTP",
                server,
                list(server.pids),
                until,
                lambda: _rgw_answers(server),
            )
            _wait(
                "a PUT to RGW did not succeed",
                server,
                list(server.pids),
                until,
                lambda: _put_works(server),
            )
        if cephfs:
            _wait(
                "the MDS was not active",
                server,
                list(server.pids),
                until,
                lambda: _mds_active(conf),
            )
    except BaseException:
        stop_ceph(server)
        raise
    return server


MOUNT_TIMEOUT = 60.0
"""Seconds ``ceph-fuse`` may take to mount, and a mount's client to exit after ``umount``."""


def mount_cephfs(
    server: CephServer,
    path: str | os.PathLike[str],
    *,
    enter: list[str] | None = None,
    record: bool = True,
) -> int:
    """Mount ``server``'s CephFS at ``path`` (created) with ``ceph-fuse``; returns the client's
    PID. ``enter``: a command prefix that runs ``ceph-fuse`` elsewhere (``nsenter -t PID
    --mount ...``: inside a node's namespaces, where the mount stays private to that node).
    ``record``: remember the mount so that :func:`stop_ceph` unmounts it (mounts made inside
    a node go away with the node instead)."""
    if not server.cephfs:
        raise RgwUnavailable("this Ceph was started without CephFS (start_ceph(cephfs=True))")
    point = str(Path(path).resolve())
    os.makedirs(point, exist_ok=True)
    pidfile = Path(server.workdir) / "run" / f"fuse.{uuid.uuid4().hex[:8]}.pid"
    _run(
        [*(enter or []), "ceph-fuse", "-c", server.conf, "--pid-file", str(pidfile), point],
        timeout=MOUNT_TIMEOUT,
    )
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while not pidfile.exists() or not pidfile.read_text().strip():
        if time.monotonic() > deadline:
            raise RgwUnavailable(f"ceph-fuse wrote no pid file for {point}")
        time.sleep(0.05)
    pid = int(pidfile.read_text().strip())
    if record:
        server.mounts[point] = pid
        _save(server)
    return pid


def unmount_cephfs(server: CephServer, path: str) -> str | None:
    """Unmount a mount :func:`mount_cephfs` recorded and wait for its client to exit (before
    the MDS stops: a client whose MDS is gone hangs on). None when done, else the problem."""
    pid = server.mounts.pop(path, None)
    done = subprocess.run(["umount", path], capture_output=True, text=True, check=False)
    problem = None
    if done.returncode != 0 and os.path.ismount(path):
        subprocess.run(["umount", "-l", path], capture_output=True, check=False)
        problem = f"umount {path}: {done.stderr.strip()} (lazily unmounted)"
    if pid is not None:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while _alive(pid, server.conf) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a process that is not our child
        gone = _stop_pid(f"ceph-fuse {path}", pid, server.conf)
        problem = problem or gone
    _save(server)
    return problem


def cephfs_sessions(server: CephServer) -> list[dict[str, Any]]:
    """The MDS's client sessions: ``id``, ``hostname`` (the client's), ``state``."""
    out = _run(["ceph", "-c", server.conf, "tell", "mds.a", "session", "ls", "--format", "json"])
    return [
        {
            "id": int(s["id"]),
            "hostname": str(s.get("client_metadata", {}).get("hostname", "")),
            "state": str(s.get("state", "")),
        }
        for s in json.loads(out)
    ]


def evict_cephfs_clients(server: CephServer, hostname: str) -> list[int]:
    """Evict the CephFS client sessions of host ``hostname`` (a node that died, as a
    cluster's failure handling fences it): otherwise the MDS keeps the capabilities they held
    until it closes the session itself (``mds session autoclose``, 300 s), and every other
    client that needs one of them (to create a file in a directory the dead client had open)
    waits that long. Returns the session ids evicted."""
    ids = [s["id"] for s in cephfs_sessions(server) if s["hostname"] == hostname]
    for i in ids:
        _run(["ceph", "-c", server.conf, "tell", "mds.a", "client", "evict", f"id={i}"])
    return ids


def _save(server: CephServer) -> None:
    (Path(server.workdir) / "rgw.json").write_text(json.dumps(asdict(server)))


def _alive(pid: int, mark: str | None = None) -> bool:
    """Whether ``pid`` runs (and, with ``mark``, is still the process whose command line holds
    ``mark``: after a crash a recorded PID may have been reused by another program)."""
    proc = _CHILDREN.get(pid)
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    if mark is not None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                return mark.encode() in fh.read()
        except OSError:
            return False
    return True


def _stop_pid(name: str, pid: int, mark: str | None = None, *, graceful: bool = True) -> str | None:
    """SIGTERM, then SIGKILL after :data:`STOP_GRACE` (``graceful``; else SIGKILL at once);
    None when gone, else the problem."""
    if not _alive(pid, mark):
        return None
    for sig in (signal.SIGTERM, signal.SIGKILL) if graceful else (signal.SIGKILL,):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + STOP_GRACE
        while _alive(pid, mark) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a process that is not ours to wait() for
        if not _alive(pid, mark):
            break
    if _alive(pid, mark):
        return f"{name} (pid {pid}) still runs after SIGKILL"
    _CHILDREN.pop(pid, None)
    return None


def stop_ceph(server: CephServer, *, keep: bool = False) -> list[str]:
    """Unmount the CephFS mounts :func:`mount_cephfs` recorded (each client gone before the
    MDS stops), kill every daemon of ``server`` by its PID (radosgw first, the monitor last;
    SIGKILL: the cluster is thrown away, and a clean stop took ~4 s for radosgw and the MDS
    each, the OSD ignores SIGTERM)
    and delete its directory (``keep``: leave it, for the logs). Works on a server read back
    from its ``rgw.json`` by another process (after a crash). Best effort: returns the
    problems met."""
    problems = [p for point in list(server.mounts) if (p := unmount_cephfs(server, point))]
    problems += [
        p
        for name, pid in reversed(list(server.pids.items()))
        if (p := _stop_pid(name, pid, server.conf, graceful=False))
    ]
    if not keep and not problems:
        shutil.rmtree(server.workdir, ignore_errors=True)
    return problems


stop_rgw = stop_ceph
"""The name tests and benchmarks have used since RGW was the only service."""


# -- command line --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m ckptio.rgwserver start DIR [--cephfs]`` (prints the endpoint; with
    ``--cephfs`` CephFS is mounted at ``DIR/cephfs`` too, and its path printed) / ``stop DIR``."""
    args = sys.argv[1:] if argv is None else argv
    cephfs = "--cephfs" in args
    args = [a for a in args if a != "--cephfs"]
    if len(args) != 2 or args[0] not in ("start", "stop"):
        print("usage: python -m ckptio.rgwserver start DIR [--cephfs] | stop DIR", file=sys.stderr)
        return 2
    if args[0] == "start":
        try:
            server = start_ceph(args[1], cephfs=cephfs)
            if cephfs:
                mount_cephfs(server, Path(server.workdir) / "cephfs")
        except RgwUnavailable as err:
            print(f"cannot start Ceph: {err}", file=sys.stderr)
            return 1
        print(server.endpoint)
        for point in server.mounts:
            print(point)
        return 0
    state = Path(args[1]) / "rgw.json"
    if not state.exists():
        print(f"no RGW recorded in {state}", file=sys.stderr)
        return 1
    problems = stop_ceph(CephServer(**json.loads(state.read_text())))
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
