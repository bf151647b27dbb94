"""The tests' own ``mpiexec`` launches survive what earlier launches left: a launcher killed
with SIGKILL leaves its session directory, and a later one given the same PID cannot start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MPI_TMPDIR, clear_dead_launchers
from tests.test_mpi_checkpoint import mpiexec

pytestmark = pytest.mark.mpi

SPAN = 3000
"""PIDs ahead of the last one given out that get a dead launcher's directory."""


def _leave_dead_launchers(base: Path) -> range:
    """A dead launcher's session directory (its PMIx rendezvous sockets) under ``base`` for
    each of the next :data:`SPAN` PIDs: what a killed ``mpiexec`` leaves."""
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    if last + SPAN >= int(Path("/proc/sys/kernel/pid_max").read_text()):
        pytest.skip("the PIDs are about to wrap round: the next launcher's PID is unknown")
    host = socket.gethostname()
    pids = range(last + 1, last + 1 + SPAN)
    for pid in pids:
        d = base / f"ompi.{pid}"
        d.mkdir()
        for name in (f"pmix.{host}.tool.{pid}", f"pmix.{host}.tool"):
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(str(d / name))
    return pids


def _launch(base: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, MPI_TMPDIR: str(base)}
    return subprocess.run(
        [*mpiexec(), "-n", "1", sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_dead_launchers_directory_stops_the_next_launch_with_its_pid(
    mpi_session_base: Path,
) -> None:
    """The failure itself, as CI met it: with a dead launcher's directory for every PID the
    next ``mpiexec`` may get, it cannot start its PMIx server (exit 213)."""
    base = mpi_session_base / "stale"
    base.mkdir()
    _leave_dead_launchers(base)
    proc = _launch(base)
    assert proc.returncode != 0
    assert "listener thread failed to start" in proc.stdout + proc.stderr


def test_dead_launchers_directories_are_cleared(mpi_session_base: Path) -> None:
    """What the tests' fixture does after each test: the directories of launchers no longer
    running are removed (a running one's is kept), and the next ``mpiexec`` starts."""
    base = mpi_session_base / "cleared"
    base.mkdir()
    pids = _leave_dead_launchers(base)
    alive = base / f"ompi.{os.getpid()}"
    alive.mkdir()
    gone = clear_dead_launchers(base)
    assert len(gone) >= SPAN - 50  # a few of the PIDs may have been given out meanwhile
    assert alive.exists() and not any((base / f"ompi.{p}").exists() for p in pids[-10:])
    proc = _launch(base)
    assert proc.returncode == 0, proc.stdout + proc.stderr
