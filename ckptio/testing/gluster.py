"""A throwaway GlusterFS volume: glusterd, a distributed volume on local brick directories,
mounted through FUSE. For tests (the session fixture ``gluster_volume``) and for CI or a
person (``python -m ckptio.testing.gluster start|stop DIR``, wrapped by
``scripts/gluster.sh``).

Needs root, ``/dev/fuse`` and Debian's ``glusterfs-server`` + ``glusterfs-client``. No
systemd: ``glusterd`` is started directly (and stopped again only if this module started it).
Bricks live at ``127.0.0.2`` — a loopback address (gluster refuses ``localhost`` and
``127.0.0.1`` as brick hosts), so nothing leaves the machine.

Where root, FUSE or gluster is missing the fixture skips with the reason — except under
``CI=true``, where it fails: CI must run these tests, not skip them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from ckptio.testing.services import service_or_skip

__all__ = [
    "BRICK_HOST",
    "COMMAND_TIMEOUT",
    "GlusterUnavailable",
    "GlusterVolume",
    "gluster_volume",
    "main",
    "start_volume",
    "stop_volume",
    "unavailable_reason",
]

BRICK_HOST = "127.0.0.2"
"""Loopback, but not one of the addresses gluster refuses for a brick."""
COMMAND_TIMEOUT = 90.0
"""Seconds one gluster command may take before it counts as failed."""


class GlusterUnavailable(RuntimeError):
    """This machine cannot run a GlusterFS volume; the message says why."""


@dataclass
class GlusterVolume:
    """A running volume and where it is mounted."""

    name: str
    bricks: list[str]
    """Brick directories (on the local disk): what the volume stores, file by file."""
    mount: str
    """The FUSE mount point of the volume (read-write)."""
    workdir: str
    started_glusterd: bool
    glusterd_pid: int = 0
    extra_mounts: list[str] = field(default_factory=list)
    host: str = BRICK_HOST
    """The address of the bricks and of glusterd that clients mount from (a bridge's, for
    clients in network namespaces)."""

    @property
    def source(self) -> str:
        """What ``mount -t glusterfs`` mounts: ``host:/name``."""
        return f"{self.host}:/{self.name}"

    def mount_again(
        self, path: str, *, readonly: bool = False, enter: list[str] | None = None
    ) -> str:
        """Mount the volume a second time at ``path`` (``readonly``: with ``-o ro``).
        ``enter``: a command prefix that runs the mount elsewhere (``nsenter -t PID --mount
        ...``: inside a node's namespaces, where it stays private and goes away with the node;
        such a mount is not recorded for :func:`stop_volume`)."""
        os.makedirs(path, exist_ok=True)
        opts = ["-o", "ro"] if readonly else []
        _run([*(enter or []), "mount", "-t", "glusterfs", *opts, self.source, path])
        if enter is None:
            self.extra_mounts.append(path)
        return path

    def unmount(self, path: str) -> None:
        """Unmount a mount made by :meth:`mount_again`."""
        _run(["umount", path])
        self.extra_mounts.remove(path)


def unavailable_reason() -> str | None:
    """Why a volume cannot be started here, or None if it can (as far as can be told)."""
    if os.geteuid() != 0:
        return "GlusterFS tests need root (glusterd, mount)"
    if not os.path.exists("/dev/fuse"):
        return "GlusterFS tests need FUSE: /dev/fuse is missing"
    for tool in ("glusterd", "gluster", "mount.glusterfs"):
        if shutil.which(tool) is None:
            return f"{tool} not found: apt-get install glusterfs-server glusterfs-client (scripts/install-system-deps.sh)"
    return None


def _run(cmd: list[str], *, timeout: float = COMMAND_TIMEOUT) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        raise GlusterUnavailable(f"`{' '.join(cmd)}` did not finish in {timeout:.0f} s") from err
    if done.returncode != 0:
        raise GlusterUnavailable(
            f"`{' '.join(cmd)}` exited {done.returncode}: {(done.stdout + done.stderr).strip()[:800]}"
        )
    return done.stdout


def _glusterd_answers() -> bool:
    try:
        done = subprocess.run(
            ["gluster", "--mode=script", "pool", "list"],
            capture_output=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def start_volume(
    workdir: str | os.PathLike[str],
    *,
    bricks: int = 2,
    name: str | None = None,
    host: str = BRICK_HOST,
    mount: str | os.PathLike[str] | None = None,
) -> GlusterVolume:
    """Start glusterd if needed, create and start a distributed volume of ``bricks`` bricks
    under ``workdir`` served at ``host`` (an address of this machine: a loopback one, or a
    bridge's for clients in network namespaces), and mount it at ``mount`` (default
    ``workdir/mnt``). Raises :class:`GlusterUnavailable`."""
    reason = unavailable_reason()
    if reason:
        raise GlusterUnavailable(reason)
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    name = name or f"ckptio-{secrets.token_hex(3)}"
    started, pid = False, 0
    if not _glusterd_answers():
        pidfile = work / "glusterd.pid"
        _run(["glusterd", "-p", str(pidfile), f"--log-file={work / 'glusterd.log'}"])
        started = True
        deadline = time.monotonic() + 60
        while not _glusterd_answers():
            if time.monotonic() > deadline:
                raise GlusterUnavailable(
                    f"glusterd did not answer within 60 s; see {work / 'glusterd.log'}"
                )
            time.sleep(0.2)
        pid = int(pidfile.read_text().strip() or 0) if pidfile.exists() else 0
    brick_dirs = [str(work / f"brick{i}") for i in range(bricks)]
    for b in brick_dirs:
        os.makedirs(b, exist_ok=True)
    point = str(Path(mount).resolve()) if mount is not None else str(work / "mnt")
    vol = GlusterVolume(name, brick_dirs, point, str(work), started, pid, host=host)
    try:
        _run(
            [
                "gluster",
                "--mode=script",
                "volume",
                "create",
                name,
                *(f"{host}:{b}" for b in brick_dirs),
                "force",
            ]
        )
        _run(["gluster", "--mode=script", "volume", "start", name])
        os.makedirs(vol.mount, exist_ok=True)
        _run(["mount", "-t", "glusterfs", vol.source, vol.mount])
    except BaseException:
        stop_volume(vol)
        raise
    (work / "volume.json").write_text(json.dumps(asdict(vol)))
    return vol


def stop_volume(vol: GlusterVolume) -> list[str]:
    """Unmount, stop and delete the volume, and stop glusterd if :func:`start_volume`
    started it. Best effort: returns the problems met (empty when all went well)."""
    problems: list[str] = []
    for point in [*vol.extra_mounts, vol.mount]:
        if os.path.ismount(point):
            try:
                _run(["umount", point])
            except GlusterUnavailable as err:
                problems.append(str(err))
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    for cmd in (["volume", "stop", vol.name, "force"], ["volume", "delete", vol.name]):
        try:
            _run(["gluster", "--mode=script", *cmd])
        except GlusterUnavailable as err:
            if "does not exist" not in str(err):
                problems.append(str(err))
    if vol.started_glusterd and vol.glusterd_pid and not _other_volumes(vol.name):
        # glusterd runs hook scripts after a delete that call back into it: let them finish
        deadline = time.monotonic() + 20
        while _hooks_running(vol.name) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.kill(vol.glusterd_pid, signal.SIGTERM)
    return problems


def _other_volumes(volume: str) -> list[str]:
    """Volumes glusterd still serves besides ``volume`` (another test session's, say): while
    there are any, glusterd keeps running."""
    try:
        out = _run(["gluster", "--mode=script", "volume", "list"], timeout=30)
    except GlusterUnavailable:
        return []
    if "No volumes present" in out:
        return []
    return [v for v in out.split() if v != volume]


def _hooks_running(volume: str) -> bool:
    mark = f"--volname={volume}".encode()
    with os.scandir("/proc") as entries:
        pids = [e.name for e in entries if e.name.isdigit()]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if mark in fh.read():
                    return True
        except OSError:
            continue
    return False


# -- pytest --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gluster_volume(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GlusterVolume]:
    """A GlusterFS volume (2 bricks, distributed) mounted through FUSE for the whole session.

    Skips with the reason where root, FUSE or gluster is missing; fails instead under
    ``CI=true``.
    """
    yield from service_or_skip(
        "GlusterFS volume",
        lambda: start_volume(tmp_path_factory.mktemp("gluster"), bricks=2),
        stop_volume,
        GlusterUnavailable,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m ckptio.testing.gluster start DIR [BRICKS]`` / ``stop DIR``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] not in ("start", "stop"):
        print(
            "usage: python -m ckptio.testing.gluster start DIR [BRICKS] | stop DIR", file=sys.stderr
        )
        return 2
    if args[0] == "start":
        try:
            vol = start_volume(args[1], bricks=int(args[2]) if len(args) > 2 else 2)
        except GlusterUnavailable as err:
            print(f"cannot start a GlusterFS volume: {err}", file=sys.stderr)
            return 1
        print(vol.mount)
        return 0
    state = Path(args[1]) / "volume.json"
    if not state.exists():
        print(f"no volume recorded in {state}", file=sys.stderr)
        return 1
    problems = stop_volume(GlusterVolume(**json.loads(state.read_text())))
    for p in problems:
        print(p, file=sys.stderr)
    state.unlink()
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
