"""A FUSE passthrough filesystem that fails chosen operations with a real error from the
kernel: the local-disk fault tests save and load through it with the real I/O code, so an
``EIO`` reaches ``os.pwrite`` / ``os.fsync`` / ``os.preadv`` exactly as a failing disk's would.

The filesystem mirrors a backing directory at a mount point. It runs in a separate process
(``python -m ckptio.testing.faultyfs BACKING MOUNTPOINT``; the binding is ``mfusepy``, over
libfuse3), so the test process's own system calls go through the kernel's FUSE driver. Faults
are switched on and off while mounted through the server's stdin: one JSON line
(``{"ops": ["write"], "match": "/data/", "errno": 5}``), answered ``ok`` once in effect.
An operation fails when it is one of ``ops`` (``write``, ``fsync``, ``read``; ``fsync``
covers directories too) and its path (relative to the mount, starting with ``/``) contains
``match``.

Files are opened ``direct_io``: every read and write reaches the server (nothing is answered
from the page cache), and ``O_DIRECT`` opens work. ``fallocate`` passes plain allocation
through and answers ``EOPNOTSUPP`` to the other modes.

The operations themselves are ``ckptio.testing.faultyops.FaultyPassthrough`` (imported by the
server process only).

Use :func:`mounted` (a context manager), :func:`start` / :meth:`FaultyFS.stop`, or in a test
:func:`start_or_skip`. Needs root (or
``fusermount3``), ``/dev/fuse`` and libfuse3 (Debian ``fuse3``); where those are missing the
fixture skips with the reason, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import errno
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "FAULT_OPS",
    "LIBFUSE",
    "MOUNT_TIMEOUT",
    "FaultyFS",
    "FaultyFSUnavailable",
    "main",
    "mounted",
    "serve",
    "start",
    "start_or_skip",
    "unavailable_reason",
]

MOUNT_TIMEOUT = 20.0
"""Seconds the server may take to mount before it counts as failed."""
FAULT_OPS = ("write", "fsync", "read")
LIBFUSE = "fuse3"
"""The libfuse the server loads (mfusepy would take libfuse2 first where both are installed)."""


class FaultyFSUnavailable(RuntimeError):
    """A FUSE filesystem cannot be mounted here; the message says why."""


def unavailable_reason() -> str | None:
    """Why a faulty filesystem cannot be mounted here, or None if it can (as far as can be
    told without trying)."""
    if not os.path.exists("/dev/fuse"):
        return "FUSE fault tests need /dev/fuse (missing)"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "FUSE fault tests need root or fusermount3 (apt-get install fuse3)"
    if importlib.util.find_spec("mfusepy") is None:
        return "FUSE fault tests need mfusepy (pip install -e '.[test]')"
    if ctypes.util.find_library(LIBFUSE) is None:
        return f"FUSE fault tests need lib{LIBFUSE} (apt-get install fuse3)"
    return None


# -- the server (runs in its own process) --------------------------------------------------------


def _control(ops: Any) -> None:
    """Read fault settings from stdin, one JSON object a line; answer each on stdout."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            ops.set_faults(
                req.get("ops", ()), req.get("match", ""), int(req.get("errno", errno.EIO))
            )
            answer = "ok"
        except Exception as err:
            answer = f"error {type(err).__name__}: {err}"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


def serve(backing: str, mountpoint: str, *, debug: bool = False) -> None:
    """Mount and serve until unmounted (blocks). Fault settings come in on stdin."""
    import mfusepy

    from ckptio.testing.faultyops import FaultyPassthrough

    ops = FaultyPassthrough(backing, FAULT_OPS)
    threading.Thread(target=_control, args=(ops,), name="faultyfs-control", daemon=True).start()
    mfusepy.FUSE(
        ops,
        mountpoint,
        foreground=True,
        debug=debug,
        fsname="faultyfs",
        subtype="faultyfs",
        direct_io=True,
        hard_remove=True,
        use_ino=True,
    )


# -- the client (the test process) -------------------------------------------------------------


def _mounted_at(mountpoint: str) -> bool:
    want = os.path.realpath(mountpoint)
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            if (
                len(fields) > 4
                and re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]) == want
            ):
                return True
    return False


class FaultyFS:
    """A mounted faulty filesystem (see the module docstring); made by :func:`mounted`."""

    def __init__(self, backing: str, mountpoint: str, proc: subprocess.Popen[str], log: str):
        self.backing = backing
        self.mountpoint = mountpoint
        self.proc = proc
        self.log = log
        self._lock = threading.Lock()

    def set_faults(self, ops: Iterable[str] = (), match: str = "", err: int = errno.EIO) -> None:
        """From now on fail ``ops`` (of ``write``, ``fsync``, ``read``) on paths containing
        ``match`` with ``err``; no ``ops``: no faults. In effect when this returns."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(
                json.dumps({"ops": list(ops), "match": match, "errno": err}) + "\n"
            )
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(
                f"faultyfs did not take the faults: {answer or 'no answer'}; {self.tail()}"
            )

    def clear(self) -> None:
        """No more faults."""
        self.set_faults(())

    @contextlib.contextmanager
    def faults(self, ops: Iterable[str], match: str = "", err: int = errno.EIO) -> Iterator[None]:
        """Faults for the duration of a ``with`` block."""
        self.set_faults(ops, match, err)
        try:
            yield
        finally:
            self.clear()

    def stop(self) -> None:
        """Unmount (``fusermount3 -u``, else ``umount``, else ``umount -l``) and stop the
        server. Raises RuntimeError if the mount could not be removed."""
        problems = _unmount(self.mountpoint)
        proc = self.proc
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # ends the control thread
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
        if problems and _mounted_at(self.mountpoint):
            raise RuntimeError(f"could not unmount {self.mountpoint}: {'; '.join(problems)}")

    def tail(self, n: int = 2000) -> str:
        try:
            return "server log: " + Path(self.log).read_text(errors="replace")[-n:].strip()
        except OSError:
            return "no server log"


def _unmount(mountpoint: str) -> list[str]:
    problems: list[str] = []
    if not _mounted_at(mountpoint):
        return problems
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmds = [[tool, "-u", mountpoint]] if tool else []
    if os.geteuid() == 0:
        cmds += [["umount", mountpoint], ["umount", "-l", mountpoint]]
    for cmd in cmds:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode == 0 and not _mounted_at(mountpoint):
            return problems
        problems.append(f"`{' '.join(cmd)}` exited {done.returncode}: {done.stderr.strip()}")
    return problems


def start(
    backing: str | os.PathLike[str], mountpoint: str | os.PathLike[str], *, debug: bool = False
) -> FaultyFS:
    """Mount ``backing`` at ``mountpoint`` through a faulty FUSE server (no faults yet) and
    return once the mount answers. Raises :class:`FaultyFSUnavailable` when it cannot be
    mounted. :meth:`FaultyFS.stop` unmounts."""
    reason = unavailable_reason()
    if reason:
        raise FaultyFSUnavailable(reason)
    back, point = os.path.realpath(backing), os.path.realpath(mountpoint)
    os.makedirs(back, exist_ok=True)
    os.makedirs(point, exist_ok=True)
    log = os.path.join(os.path.dirname(point), f".{os.path.basename(point)}.faultyfs.log")
    cmd = [
        sys.executable,
        "-m",
        "ckptio.testing.faultyfs",
        back,
        point,
        *(["--debug"] if debug else []),
    ]
    env = {**os.environ, "FUSE_LIBRARY_NAME": LIBFUSE}
    with open(log, "w") as err_out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err_out,
            text=True,
            bufsize=1,
            env=env,
        )
    fs = FaultyFS(back, point, proc, log)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not _mounted_at(point):
            if proc.poll() is not None:
                raise FaultyFSUnavailable(
                    f"the FUSE server exited {proc.returncode} before mounting; {fs.tail()}"
                )
            if time.monotonic() > deadline:
                raise FaultyFSUnavailable(f"not mounted within {MOUNT_TIMEOUT:.0f} s; {fs.tail()}")
            time.sleep(0.02)
        os.stat(point)  # the first request: answered once the server has taken INIT
    except BaseException:
        fs.stop()
        raise
    return fs


@contextlib.contextmanager
def mounted(
    backing: str | os.PathLike[str], mountpoint: str | os.PathLike[str], *, debug: bool = False
) -> Iterator[FaultyFS]:
    """:func:`start`, yield the :class:`FaultyFS`, and unmount and stop it on exit."""
    fs = start(backing, mountpoint, debug=debug)
    try:
        yield fs
    finally:
        fs.stop()


# -- pytest ---------------------------------------------------------------------------------------


def start_or_skip(tmp_path: Path) -> FaultyFS:
    """:func:`start` over ``tmp_path/backing`` at ``tmp_path/mnt``; skips the test with the
    reason where FUSE is unavailable, but fails it under ``CI=true`` (CI must run it)."""
    import pytest

    try:
        return start(tmp_path / "backing", tmp_path / "mnt")
    except FaultyFSUnavailable as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"FUSE fault filesystem could not be mounted in CI: {err}", pytrace=False)
        pytest.skip(f"no FUSE fault filesystem: {err}")


def main(argv: list[str] | None = None) -> int:
    """``python -m ckptio.testing.faultyfs BACKING MOUNTPOINT [--debug]``: serve until
    unmounted; fault settings as JSON lines on stdin."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    if len(args) != 2:
        print(
            "usage: python -m ckptio.testing.faultyfs BACKING MOUNTPOINT [--debug]", file=sys.stderr
        )
        return 2
    serve(args[0], args[1], debug=debug)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
