"""Shared fixtures. The ckptio pytest plugin (ckptio.testing.plugin) is loaded through its
entry point; fixtures here are the project's own."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

MPI_TMPDIR = "PRTE_MCA_prte_tmpdir_base"
"""Where Open MPI's launcher puts its session directory (``ompi.<pid>``: the PMIx server's
rendezvous sockets, named by the launcher's PID)."""


def clear_dead_launchers(base: Path) -> list[str]:
    """Remove the session directories under ``base`` whose launcher is no longer running;
    returns their names."""
    gone = []
    for d in base.glob("ompi.*"):
        pid = d.name.removeprefix("ompi.")
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d.name)
        except PermissionError:  # another user's process holds that PID: alive
            pass
    return gone


@pytest.fixture(scope="session")
def mpi_session_base() -> Iterator[Path]:
    """A directory of this test session for every ``mpiexec`` its tests start (through the
    environment they inherit), removed at the end.

    A launcher killed with SIGKILL (the node-loss, crash and timeout paths kill theirs)
    leaves its ``ompi.<pid>`` directory behind, and a later ``mpiexec`` that is given the
    same PID cannot start: "The PMIx server's listener thread failed to start" (exit 213).
    A CI run failed so on a machine whose /tmp held such a directory from the day before."""
    base = Path(tempfile.mkdtemp(prefix="ckptio-mpi-", dir="/tmp"))
    old = os.environ.get(MPI_TMPDIR)
    os.environ[MPI_TMPDIR] = str(base)
    try:
        yield base
    finally:
        if old is None:
            os.environ.pop(MPI_TMPDIR, None)
        else:
            os.environ[MPI_TMPDIR] = old
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_dead_launchers_left(mpi_session_base: Path) -> Iterator[None]:
    """After each test, the session directories of launchers that died are removed, so a
    PID reused later in the run meets no directory of its own."""
    yield
    clear_dead_launchers(mpi_session_base)
