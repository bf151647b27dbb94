"""``ckptio run DURABLE --local FAST``: the tiered workload (ckptio.tierbench) on real targets,
on real ranks (local processes, mpiexec), its result files, and the report over them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from test_runner import ckptio_cli

import ckptio
from ckptio import format as fmt
from ckptio.checkpoint import committed_steps
from ckptio.registry import open_store
from ckptio.results import read_results
from ckptio.tierbench import PHASES
from ckptio.tiered import object_rank

#: small enough for CI, several objects per rank (llama3-8b's 8 writing GPUs)
SIZE = ["--total-size", "24MiB", "--object-size", "2MiB"]


def check_tiered_results(out: Path, ranks: int, iterations: int) -> dict:
    """The result files of a tiered run: a runs row per iteration (kind tiered), every phase
    of every rank, requests of each phase, and the sidecar saying what each tier was."""
    res = read_results([out])
    runs = res.runs.to_pylist()
    assert [r["iteration"] for r in runs] == list(range(iterations))
    assert {r["kind"] for r in runs} == {"tiered"} and {r["ranks"] for r in runs} == {ranks}
    for r in runs:
        assert r["write_seconds"] > 0 and r["read_seconds"] > 0 and r["requests"] > 0
        assert r["checkpoint_bytes"] == runs[0]["checkpoint_bytes"] > 20 << 20
    phases = res.phases.to_pylist()
    assert {(p["rank"], p["iteration"], p["phase"]) for p in phases} == {
        (rank, it, ph) for rank in range(ranks) for it in range(iterations) for ph in PHASES
    }
    assert all(p["seconds"] > 0 for p in phases)
    reqs = res.requests.to_pylist()
    assert {r["phase"] for r in reqs} == {"save", "drain", "drain-read", *PHASES[2:]}
    assert {r["rank"] for r in reqs} == set(range(ranks))
    (side,) = res.sidecars
    return side


def test_two_local_ranks_with_their_own_fast_roots(tmp_path: Path) -> None:
    """Two ranks as two nodes: each saves on its own fast root, the drain commits every
    rank's objects on the durable tier, each iteration is restored from the fast roots and
    from the durable tier alone and compared with what was saved; ``--keep last`` leaves one
    step on each tier, every root verifies, and ``ckptio report`` projects the target from
    the measured tiers."""
    durable, fast, out = (
        f"file://{tmp_path}/durable",
        f"file://{tmp_path}/fast-{{rank}}",
        tmp_path / "out",
    )
    r = ckptio_cli(
        "run", durable, "--local", fast, "--ranks", "2", *SIZE, "--iterations", "2",
        "--out", str(out), "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout)
    assert len(summary["runs"]) == 2 and len(summary["peak_rss_bytes"]) == 2
    side = check_tiered_results(out, 2, 2)
    tiers = side["tiers"]
    assert tiers["durable_measured"] and tiers["local_measured"]
    assert "{rank}" in tiers["local_url"]
    newest = summary["runs"][-1]
    with open_store(durable) as store:
        (step,) = committed_steps(store)
    assert ckptio.verify(durable) == []
    for rank in (0, 1):
        root = f"file://{tmp_path}/fast-{rank}"
        with open_store(root) as store:
            assert committed_steps(store) == [step]
            keys = store.list(fmt.step_dir(step) + "/data/")
            assert keys and {object_rank(k.rsplit("/", 1)[1]) for k in keys} == {rank}
    assert newest["iteration"] == 1
    rep = ckptio_cli("report", str(out), "--out", str(tmp_path / "report"))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    md = (tmp_path / "report" / "report.md").read_text()
    assert "file-durable-tiered" in md and "durable tier" in md
    # two small rounds are fitted but not projected: the report says why and what would do
    assert "the spread between rounds is unknown" in md or "too small" in md
    assert "not projected" in md and ("--iterations" in md or "--total-size" in md)


@pytest.mark.s3
def test_drains_to_s3(tmp_path: Path, s3_bucket: str) -> None:
    """One rank, the fast tier on this machine's disk, the durable tier on the S3 server."""
    durable = f"s3://{s3_bucket}/run"
    r = ckptio_cli(
        "run", durable, "--local", f"file://{tmp_path}/fast", *SIZE, "--keep", "all",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stall s" in r.stdout and "from durable s" in r.stdout
    side = check_tiered_results(tmp_path / "out", 1, 1)
    assert side["tiers"]["durable_measured"] and side["tiers"]["durable"] == durable
    assert ckptio.verify(durable) == []


@pytest.mark.mpi
def test_two_mpi_ranks_emulated_fast_tier(tmp_path: Path) -> None:
    """Under mpiexec (the drain's communicator is a dup of MPI's), with the fast tier
    emulated as node-local NVMe: the results say which tier was emulated."""
    from test_mpi_checkpoint import run_mpi

    out = tmp_path / "out"
    run_mpi(
        2, "-m", "ckptio.cli", "run", f"file://{tmp_path}/durable", "--local",
        f"file://{tmp_path}/fast", "--emulate-local", "local-nvme", *SIZE, "--out", str(out),
    )  # fmt: skip
    side = check_tiered_results(out, 2, 1)
    assert side["tiers"]["durable_measured"] and not side["tiers"]["local_measured"]
    assert side["tiers"]["local"] == "local-nvme"
    assert {r["emulated"] for r in read_results([out]).runs.to_pylist()} == {True}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--emulate-local", "local-nvme"], "--emulate-local needs --local"),
        (["--local", "{tmp}/fast", "--layout", "shared-file"], "cannot be tiered"),
        (["--local", "nfs://host/x"], "nfs"),
        (["--local", "{tmp}/fast", "--emulate-local", "no-such"], "no-such"),
        (["--local", "{tmp}/fast", "--total-size", "1PiB"], "holds the state in memory"),
        (["--local", "{tmp}/fast", "--ranks", "9"], "9"),
        (["--local", "{tmp}/fast", "--gpus", "16", "--zero", "0", "--ranks", "2"], "at most 1"),
        (["--local", "{tmp}/fast", "--replicas", "1"], "needs --local with {rank}"),
        (["--replicas", "1"], "needs --local with {rank}"),
        (["--local", "{tmp}/fast-{rank}", "--replicas", "-1"], "--replicas"),
        (["--local", "{tmp}/fast-{rank}", "--replicas", "1", "--ranks", "2"], "other nodes"),
    ],
)
def test_what_a_tiered_run_refuses(tmp_path: Path, args: list[str], expected: str) -> None:
    """Each refused before anything is written, with one line naming the problem."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = ckptio_cli("run", f"file://{tmp_path}/durable", *SIZE[2:], *argv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert expected in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "durable").exists() and not (tmp_path / "fast").exists()


def test_sweep_has_no_tiers(tmp_path: Path) -> None:
    r = ckptio_cli("sweep", f"file://{tmp_path}/d", "--local", f"file://{tmp_path}/f")
    assert r.returncode == 2 and "--local" in r.stderr


@pytest.mark.parametrize("restore", ["nothing", "other bytes"])
def test_a_restore_that_reads_wrong_is_caught(tmp_path: Path, monkeypatch, restore: str) -> None:
    """The restores read into the state's own arrays (cleared first) and are checked against
    the data generated again: a load that fills nothing, or fills other bytes (that the
    library's CRCs would not see: say, a step other than the newest), fails the run."""
    from ckptio import errors, tierbench
    from ckptio.checkpoint.tiered import TieredCheckpointer
    from ckptio.workload import make_plan

    def wrong_load(self, step=None, *, select=None, into=None):
        if restore == "other bytes":
            for shard in into.values():
                shard.array.view(np.uint8)[::7] = 1
        return into

    monkeypatch.setattr(TieredCheckpointer, "load", wrong_load)
    plan = make_plan("llama3-8b", total_size="4MiB", object_size="1MiB")
    with pytest.raises(errors.CorruptCheckpointError, match="read other bytes than were saved"):
        tierbench.run_tiered_workload(f"file://{tmp_path}/d", f"file://{tmp_path}/f", plan)


def test_the_restores_read_what_was_saved_into_the_state_itself(tmp_path: Path) -> None:
    from ckptio import tierbench
    from ckptio.runner import RunSettings
    from ckptio.workload import make_plan

    plan = make_plan("llama3-8b", total_size="4MiB", object_size="1MiB")
    summary = tierbench.run_tiered_workload(
        f"file://{tmp_path}/d", f"file://{tmp_path}/f", plan, RunSettings(iterations=2)
    )
    assert [t["restore_seconds"] > 0 for t in summary.tiered] == [True, True]
    assert [t["restore_durable_seconds"] > 0 for t in summary.tiered] == [True, True]
    # the runs table's row of each iteration: the stall as the write, the restore as the read
    for run, t in zip(summary.runs, summary.tiered, strict=True):
        assert run["kind"] == "tiered" and run["iteration"] == t["iteration"]
        assert run["checkpoint_bytes"] == t["checkpoint_bytes"] > 0
        assert run["write_seconds"] == t["stall_seconds"]
        assert run["read_seconds"] == t["restore_seconds"]
        assert run["min_rank_write_GBps"] > 0 and run["requests"] > 0


def test_a_generated_stream_is_recognised_in_a_typed_array_and_a_changed_byte_is_not() -> None:
    """``DataGenerator.matches`` (how a tiered run checks its restores) compares bytes: the
    first ``nbytes`` of an array of any dtype, a block at a time."""
    from ckptio.runner import GEN_BLOCK, DataGenerator

    gen = DataGenerator("seed")
    n = 2 * GEN_BLOCK + 12
    raw = np.empty(n + DataGenerator.SLACK, np.uint8)
    gen.fill(raw, n, "0/optim/0")
    optim = raw[:n].view(np.float32)
    assert gen.matches(optim, n, "0/optim/0") and not gen.matches(optim, n, "1/optim/0")
    optim.view(np.uint8)[GEN_BLOCK + 5] ^= 1  # a bit in the second block
    assert not gen.matches(optim, n, "0/optim/0")
    assert gen.matches(optim, GEN_BLOCK, "0/optim/0")  # the first block is still the stream
