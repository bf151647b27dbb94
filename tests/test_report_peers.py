"""Peer copies in the report: a run that made and restored from them (``ckptio run --replicas
K``) is projected with the node link its restores measured, and a projected restore from a
peer that is slower than the durable tier is shown as the durable read it becomes."""

import math
from dataclasses import replace
from pathlib import Path

import pytest

from ckptio.cli.console import peer_line
from ckptio.profiles import load_profile
from ckptio.report.findings import peer_sentence
from ckptio.report.tables import restore_paths
from ckptio.stallmodel import Conditions, preset_workload, project

S3, NVME, LUSTRE = (load_profile(n) for n in ("cloud-s3", "local-nvme", "abci-lustre"))
W = preset_workload("gpt3-175b", gpus=1536)
C = replace(Conditions.reference(W.gpus), peers=1)


def _expected(p: dict) -> float:
    return math.fsum(share * p[key] for _, key, share in restore_paths(p))


def test_a_peer_faster_than_the_durable_tier_is_a_path_of_its_own() -> None:
    """Against S3, a replaced node reads a peer's copy: three paths whose shares and times
    make the expected restore, and the words say what the copy buys."""
    p = project(W, S3, C, local=NVME)
    assert not p["peer_slower_than_durable"]
    paths = restore_paths(p)
    assert [w for w, _, _ in paths][1] == "from a peer's copy (projected)"
    assert _expected(p) == pytest.approx(p["restore_seconds"])
    words = peer_sentence(p)
    assert "a replacement node restores from a peer in" in words
    assert "read only when every copy is lost" in words
    assert "a replacement node restores from a peer in" in peer_line(p)
    assert "instead" not in peer_line(p)


def test_a_peer_slower_than_the_durable_tier_is_read_from_the_durable_tier() -> None:
    """Against ABCI's Lustre, two steps off one node's NVMe are slower than the shared
    filesystem: the table and plot show the durable read with the peer's share (what the
    expected restore counts), and every text says so instead of offering the slower copy."""
    p = project(W, LUSTRE, C, local=NVME)
    assert p["peer_slower_than_durable"]
    paths = restore_paths(p)
    assert [k for _, k, _ in paths] == ["restore_fast_seconds", "restore_durable_seconds"]
    assert "would be slower" in paths[1][0]
    assert sum(s for _, _, s in paths) == pytest.approx(1.0)
    assert _expected(p) == pytest.approx(p["restore_seconds"])
    words = peer_sentence(p)
    assert "would take" in words and "reads the durable tier instead" in words
    line = peer_line(p)
    assert "would take" in line and "reads instead" in line and "from a peer," not in line


NODE_PER_RANK = (
    "import os, sys; os.environ['CKPTIO_NODE'] = 'n' + os.environ['OMPI_COMM_WORLD_RANK']; "
    "from ckptio.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.mpi
def test_the_report_projects_a_run_with_peer_copies_with_its_measured_link(
    tmp_path: Path,
) -> None:
    """``ckptio run --replicas 1`` under mpiexec (2 ranks, each its own node; both tiers
    emulated, so a few MiB per round project), then ``ckptio report``: the target is projected
    with peer copies, its node link fitted from the run's restores from a peer (with its
    rounds and interval), and nothing calls those copies unrun."""
    from ckptio.calibration import fit_peer_link
    from ckptio.results import read_results
    from tests.test_mpi_checkpoint import run_mpi
    from tests.test_runner import ckptio_cli

    out = tmp_path / "out"
    run_mpi(
        2, "-c", NODE_PER_RANK, "run", f"file://{tmp_path}/durable", "--emulate", "cloud-s3",
        "--local", f"file://{tmp_path}/fast/{{rank}}", "--emulate-local", "local-nvme",
        "--replicas", "1", "--preset", "llama3-8b", "--total-size", "16MiB",
        "--iterations", "4", "--out", str(out),
    )  # fmt: skip
    fit = fit_peer_link(read_results([out]).phases)
    assert fit is not None
    rep = ckptio_cli("report", str(out), "--out", str(tmp_path / "report"))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    md = " ".join((tmp_path / "report" / "report.md").read_text().split())
    assert "projected peers (peer link measured)" in md
    assert "1 peer copy run and restored from (node n1's loss emulated)" in md
    assert fit.source() in md  # the link's rounds and interval, as the fit gives them
    assert "the peer link measured, " in md and "rounds: 95% interval" in md
    assert "not run here" not in md and "made no copies between nodes" not in md
    assert "with the node link fitted from the restores from a peer measured" in md
