"""A throwaway single-node Ceph cluster with the RADOS Gateway (RGW, Ceph's S3 implementation)
on loopback: for tests (the session fixture ``rgw_server`` and ``s3_target`` in
:mod:`ckptio.testing.moto`), for ``ckptio compare --targets rgw``, for
``benchmarks/s3_peers.py``, and for a person
(``python -m ckptio.rgwserver start DIR`` / ``stop DIR``).

Shape: one monitor, one OSD with the ``memstore`` object store (data in the OSD's memory), one
``radosgw`` with its beast frontend on ``127.0.0.1:<free port>``, authentication off, no
manager daemon, pools of size 1. Everything lives in a private directory (configuration, monitor
store, logs, admin sockets, pid files); every daemon is started directly (no systemd) with its
own pid file and stopped by that PID — the OSD ignores SIGTERM, so it gets SIGKILL after a
grace period. An S3 user with fixed test keys (the same fake keys as the moto fixtures:
:data:`TEST_ACCESS_KEY_ID`, :data:`TEST_SECRET_ACCESS_KEY`) is created with
``radosgw-admin``.

Settings that matter (each found necessary, not tuning): ``ms mon client mode = crc secure``
(with cephx off radosgw otherwise waits 300 s for the monitor); ``paxos propose interval =
0.05`` (each pool RGW creates costs an osdmap epoch: ~2 s to ready instead of ~18 s); RGW's
garbage collection after 5 s instead of 2 h (a memstore OSD otherwise keeps every deleted
object in memory); the monitor's free-disk guard lowered to 1% (it refuses to run below 5%).
The OSD binds 127.0.0.1 in Ceph's default port range (6800-7300) besides the chosen ports.

Needs Debian's ``radosgw``, ``ceph-mon`` and ``ceph-osd`` (``scripts/install-system-deps.sh``).
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
    "INSTALL_HINT",
    "LABEL",
    "RgwServer",
    "RgwUnavailable",
    "empty_bucket",
    "main",
    "start_rgw",
    "stop_rgw",
    "unavailable_reason",
]

INSTALL_HINT = "apt-get install --no-install-recommends radosgw ceph-mon ceph-osd (scripts/install-system-deps.sh)"
TOOLS = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph")
COMMAND_TIMEOUT = 60.0
"""Seconds one ``ceph``/``radosgw-admin`` command may take before it counts as failed."""
READY_TIMEOUT = 90.0
"""Seconds from the first daemon's start to RGW answering a PUT, before giving up."""
STOP_GRACE = 5.0
"""Seconds a daemon gets after SIGTERM before SIGKILL (the OSD always needs the SIGKILL)."""
USER = "ckptio-test"
LABEL = "measured — Ceph RGW on loopback"
"""How results against this server are labelled: a real S3 implementation on this machine."""


_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""The daemons this process started, by PID: kept to reap them (no zombie, no warning)."""


class RgwUnavailable(RuntimeError):
    """This machine cannot run Ceph RGW, or it did not come up; the message says why."""


@dataclass
class RgwServer:
    """A running single-node Ceph with RGW; :attr:`endpoint` is its S3 endpoint URL."""

    workdir: str
    endpoint: str
    fsid: str
    pids: dict[str, int] = field(default_factory=dict)
    """Daemon name (``mon.a``, ``osd.0``, ``client.rgw``) -> PID, in start order."""
    access_key_id: str = TEST_ACCESS_KEY_ID
    secret_access_key: str = TEST_SECRET_ACCESS_KEY
    region: str = TEST_REGION

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


def unavailable_reason() -> str | None:
    """Why RGW cannot be started here, or None if it can (as far as can be told)."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} not found: {INSTALL_HINT}"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(work: Path, fsid: str, mon_port: int, rgw_port: int) -> str:
    return f"""[global]
fsid = {fsid}
mon initial members = a
mon host = v2:127.0.0.1:{mon_port}
ms bind msgr1 = false
public addr = 127.0.0.1
cluster addr = 127.0.0.1
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

[osd]
osd objectstore = memstore
memstore device bytes = 8589934592
osd max object size = 134217728

[client.rgw]
rgw data = {work}/rgw
rgw frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw thread pool size = 64
rgw gc obj min wait = 5
rgw gc processor period = 5
rgw gc processor max time = 5
rgw enable usage log = false
rgw dns name = 127.0.0.1
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


def _spawn(server: RgwServer, name: str, cmd: list[str]) -> None:
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


def _check_alive(server: RgwServer, name: str) -> None:
    if not _alive(server.pids[name]):
        raise RgwUnavailable(f"{name} exited; see {server.workdir}/log/{name}.log and .out")


def _wait(
    what: str, server: RgwServer, daemons: list[str], until: float, probe: Callable[[], bool]
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


def _rgw_answers(server: RgwServer) -> bool:
    try:
        with urllib.request.urlopen(server.endpoint + "/", timeout=5) as resp:
            resp.read()
        return True
    except urllib.error.HTTPError:
        return True  # any S3 answer (403 for an anonymous list) means the frontend is up
    except OSError:
        return False


def _put_works(server: RgwServer) -> bool:
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


def start_rgw(workdir: str | os.PathLike[str] | None = None) -> RgwServer:
    """Start a monitor, a memstore OSD and radosgw under ``workdir`` (a fresh private temp
    directory when None) and create the test S3 user. Returns when a PUT succeeds. Raises
    :class:`RgwUnavailable` (with everything started so far stopped again)."""
    reason = unavailable_reason()
    if reason:
        raise RgwUnavailable(reason)
    if workdir is None:
        work = Path(tempfile.mkdtemp(prefix="ckptio-rgw-"))
    else:  # stop_rgw deletes the directory: never one that holds anything else
        work = Path(workdir).resolve()
        if work.exists() and any(work.iterdir()):
            raise RgwUnavailable(f"{work} is not empty: give a new or empty directory")
        work.mkdir(parents=True, exist_ok=True)
    for sub in ("run", "log", "mon", "osd", "rgw"):
        (work / sub).mkdir(exist_ok=True)
    fsid = str(uuid.uuid4())
    mon_port, rgw_port = _free_port(), _free_port()
    server = RgwServer(str(work), f"http://127.0.0.1:{rgw_port}", fsid)
    Path(server.conf).write_text(_config(work, fsid, mon_port, rgw_port))
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
                f"[v2:127.0.0.1:{mon_port}]",
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
        _wait("the OSD was not up", server, list(server.pids), until, lambda: _osd_up(conf))
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
    except BaseException:
        stop_rgw(server)
        raise
    return server


def _save(server: RgwServer) -> None:
    (Path(server.workdir) / "rgw.json").write_text(json.dumps(asdict(server)))


def _alive(pid: int) -> bool:
    proc = _CHILDREN.get(pid)
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_pid(name: str, pid: int) -> str | None:
    """SIGTERM, then SIGKILL after :data:`STOP_GRACE`; None when gone, else the problem."""
    if not _alive(pid):
        return None
    for sig in (signal.SIGTERM, signal.SIGKILL):  # the OSD ignores SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + STOP_GRACE
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a process that is not ours to wait() for
        if not _alive(pid):
            break
    if _alive(pid):
        return f"{name} (pid {pid}) still runs after SIGKILL"
    _CHILDREN.pop(pid, None)
    return None


def stop_rgw(server: RgwServer, *, keep: bool = False) -> list[str]:
    """Stop every daemon of ``server`` by its PID (radosgw first, the monitor last) and delete
    its directory (``keep``: leave it, for the logs). Best effort: returns the problems met."""
    problems = [
        p for name, pid in reversed(list(server.pids.items())) if (p := _stop_pid(name, pid))
    ]
    if not keep and not problems:
        shutil.rmtree(server.workdir, ignore_errors=True)
    return problems


# -- pytest ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m ckptio.rgwserver start DIR`` (prints the endpoint) / ``stop DIR``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("start", "stop"):
        print("usage: python -m ckptio.rgwserver start DIR | stop DIR", file=sys.stderr)
        return 2
    if args[0] == "start":
        try:
            server = start_rgw(args[1])
        except RgwUnavailable as err:
            print(f"cannot start Ceph RGW: {err}", file=sys.stderr)
            return 1
        print(server.endpoint)
        return 0
    state = Path(args[1]) / "rgw.json"
    if not state.exists():
        print(f"no RGW recorded in {state}", file=sys.stderr)
        return 1
    problems = stop_rgw(RgwServer(**json.loads(state.read_text())))
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
