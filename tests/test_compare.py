"""`ckptio compare`: runs the default kinds of target at a tiny scale and writes the report."""

import json

import pytest

from ckptio import errors
from ckptio.cli import main
from ckptio.compare import CompareWorkload, compare
from ckptio.results import read_results

TINY = ["--total-size", "4MiB", "--object-size", "1MiB"]


@pytest.mark.s3
def test_compare_runs_every_kind_of_target_and_writes_the_report(tmp_path, capsys) -> None:
    pytest.importorskip("moto.server", reason="the mock S3 target needs moto[server]")
    out = tmp_path / "report"
    argv = [
        "compare",
        *TINY,
        "--targets",
        "local,mock-s3",
        "--profiles",
        "cloud-s3,abci-lustre",
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    kinds = {s["target"]: s["kind"] for s in result["summary"]}
    assert kinds == {
        "local": "measured",
        "mock-s3": "mock",
        "cloud-s3": "emulated",
        "abci-lustre": "emulated",
        "cloud-s3+local-nvme": "emulated",  # the default tiered targets
        "cloud-s3+local-nvme+peer": "emulated",
    }
    for name in (
        "index.html",
        "report.md",
        "throughput.png",
        "latency.png",
        "timeline.png",
        "cost.png",
    ):
        assert (out / name).stat().st_size > 0, name
    md = (out / "report.md").read_text()
    assert "mock — not a performance figure" in md
    assert "emulated" in md and "projected" in md
    # the emulated cloud target is slower than its emulated HPC neighbour, as the profiles say
    gbps = {s["target"]: s["write_GBps"] for s in result["summary"]}
    assert gbps["cloud-s3"] < gbps["abci-lustre"]
    # full-scale projection names the binding limit in words, mock is not projected
    proj = {p["target"]: p for p in result["projections"]}
    assert "per-stream bandwidth" in proj["cloud-s3 (emulated cloud-s3)"]["binding_detail"]
    assert proj["mock-s3 (mock)"]["write_seconds"] is None
    assert (out / "results").is_dir()


def test_compare_prints_the_table(tmp_path, capsys) -> None:
    argv = ["compare", *TINY, "--targets", "local", "--profiles", "", "--tiered", ""]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "local" in text and "measured" in text and "binding" in text


def test_compare_tiered_targets_show_stall_drain_and_restore(tmp_path) -> None:
    """A tiered target runs beside the plain ones: its stall (the fast tier's save), drain and
    restores (from either tier) are timed, each part labelled measured or emulated, and the
    full-scale projection shows stall, drain, restore, restart and cost side by side."""
    out = tmp_path / "report"
    result = compare(
        targets=[],
        profiles=["cloud-s3", "abci-lustre"],
        tiered=["cloud-s3+disk", "cloud-s3+local-nvme"],
        out=str(out),
        workload=CompareWorkload(total_size="4MiB", object_size="1MiB"),
        say=lambda _line: None,
    )
    rows = {s["target"]: s for s in result["summary"]}
    assert set(rows) == {"cloud-s3", "abci-lustre", "cloud-s3+disk", "cloud-s3+local-nvme"}
    disk, nvme, plain = rows["cloud-s3+disk"], rows["cloud-s3+local-nvme"], rows["cloud-s3"]
    assert disk["phase_kinds"] == {
        "save": "measured",
        "restore": "measured",
        "drain": "emulated",
        "restore-durable": "emulated",
    }
    assert set(nvme["phase_kinds"].values()) == {"emulated"}
    assert not plain["tiered"] and plain["drain_seconds"] is None
    for r in (disk, nvme):
        assert r["tiered"] and r["drain_seconds"] > 0 and r["restore_durable_seconds"] > 0
    # the save blocks for the fast tier only: less than the drain to emulated cloud-s3 (both
    # emulated here, so deterministic; the disk's save is measured and a busy machine may
    # stretch it past the emulated drain)
    assert nvme["write_seconds"] < nvme["drain_seconds"]
    md = (out / "report.md").read_text()
    assert "fast tier this machine's disk, measured; durable tier emulated cloud-s3" in md
    assert "(measured)" in md and "(emulated)" in md and "| drain |" in md
    proj = {p["name"]: p for p in result["projections"]}
    tier, cloud = proj["cloud-s3+local-nvme"], proj["cloud-s3"]
    assert tier["drain_seconds"] == pytest.approx(cloud["write_seconds"])  # cloud-s3's write
    assert tier["write_seconds"] < cloud["write_seconds"] / 5
    assert tier["drain_fits_interval"]
    assert "(emulated)" in tier["profile"] and tier["basis"].startswith("deterministic")
    # the measured fast tier ran its rounds, but 4 MiB saves are too short to project: the
    # row says so, and what size would do
    assert disk["rounds"] >= 3
    assert "--total-size" in proj["cloud-s3+disk"]["refusal"]
    # restart = 5 min overhead + the projected restore, for every target projected
    for p in (tier, cloud, proj["abci-lustre"]):
        assert p["restart_seconds"] == pytest.approx(300 + p["restore_seconds"])
    assert tier["lost_cost_per_day"] < cloud["lost_cost_per_day"]
    for name in ("timeline.png", "cost.png"):
        assert (out / name).stat().st_size > 0


def test_compare_peer_target_is_projected_with_peer_copies_beside_the_others(
    tmp_path, capsys
) -> None:
    """``cloud-s3+local-nvme+peer`` runs as the tiered target does and is projected with one
    peer copy of each node's fast tier: said projected wherever it is shown, its restart
    shorter than the tiered one's, in the console, the report's table and its plot."""
    out = tmp_path / "report"
    argv = ["compare", *TINY, "--targets", "", "--profiles", "cloud-s3,abci-lustre"]
    argv += ["--tiered", "cloud-s3+local-nvme,cloud-s3+local-nvme+peer", "--out", str(out)]
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "cloud-s3+local-nvme+peer (emulated + projected peers)" in text
    assert "peers projected" in text and "1 peer copy (projected)" in text
    result = read_results([str(out / "results")])
    assert {r["target"] for r in result.runs.to_pylist()} >= {"cloud-s3+local-nvme+peer"}
    from ckptio.report import build_report

    rep = build_report([str(out / "results")], str(tmp_path / "again"))
    proj = {p["name"]: p for p in rep["projections"]}
    tier, peer = proj["cloud-s3+local-nvme"], proj["cloud-s3+local-nvme+peer"]
    assert peer["peers"] == 1 and not tier.get("peers")
    assert peer["kind"] == "emulated + projected peers"
    assert peer["restart_seconds"] < tier["restart_seconds"]
    assert peer["restore_peer_seconds"] < peer["restore_durable_seconds"]
    assert peer["stall_seconds"] == tier["stall_seconds"]  # the replication fits 2 h
    assert peer["restart_cost_per_day"] < tier["restart_cost_per_day"]
    # the restores plot draws the restore table's figures, nothing of its own
    drawn = rep["plots"]["restores"]
    for name in ("cloud-s3", "abci-lustre", "cloud-s3+local-nvme", "cloud-s3+local-nvme+peer"):
        for key, value in drawn[name].items():
            assert value == proj[name][key], (name, key)
    assert set(drawn["cloud-s3+local-nvme+peer"]) == {
        "restore_seconds",
        "restore_fast_seconds",
        "restore_peer_seconds",
        "restore_durable_seconds",
    }
    md = (tmp_path / "again" / "report.md").read_text()
    assert "## Restarts by which copy survives" in md
    assert "peer copies projected by the model (not run here" in md
    assert "from a peer's copy (projected)" in md
    assert "With 1 peer copy of each node's fast tier (projected)" in md
    assert (tmp_path / "again" / "restores.png").stat().st_size > 0
    assert "| chance a failure loses another node at once (0.1 as assumed" in md
    sens = {r["assumption"] for r in rep["sensitivity"]["cloud-s3+local-nvme+peer"]}
    assert "p_lose_another" in sens
    assert "p_lose_another" not in {r["assumption"] for r in rep["sensitivity"]["cloud-s3"]}


def test_unknown_tiered_target_says_what_is_valid(tmp_path) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="DURABLE\\+LOCAL"):
        compare(targets=[], profiles=[], tiered=["cloud-s3"], out=str(tmp_path))
    with pytest.raises(errors.InvalidArgumentError, match="valid: abci-lustre"):
        compare(targets=[], profiles=[], tiered=["cloud-s3+nvme9"], out=str(tmp_path))
    for bad in ("cloud-s3+local-nvme+peerx", "cloud-s3+local-nvme+peer0", "cloud-s3+peer99"):
        with pytest.raises(errors.InvalidArgumentError, match="'\\+peer' or '\\+peerK'"):
            compare(targets=[], profiles=[], tiered=[bad], out=str(tmp_path))


def test_unknown_profile_lists_valid_names(tmp_path) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="valid: abci-lustre"):
        compare(
            targets=["local"],
            profiles=["cloud-s9"],
            out=str(tmp_path),
            workload=CompareWorkload(total_size="4MiB"),
        )


def test_unknown_target_lists_valid_names(tmp_path) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="valid: local, mock-s3"):
        compare(
            targets=["nvme"],
            profiles=[],
            out=str(tmp_path),
            workload=CompareWorkload(total_size="4MiB"),
        )


def test_unknown_preset_lists_valid_names(tmp_path, capsys) -> None:
    assert main(["compare", "--preset", "gpt5", "--out", str(tmp_path)]) == 2
    assert "llama3-8b" in capsys.readouterr().err


def test_rgw_is_a_default_target_where_installed() -> None:
    from ckptio.compare import DEFAULT_TARGETS, default_targets
    from ckptio.testing.rgw import unavailable_reason

    want = DEFAULT_TARGETS if unavailable_reason() else (*DEFAULT_TARGETS, "rgw")
    assert default_targets() == want


@pytest.mark.s3
@pytest.mark.rgw
def test_compare_against_rgw_is_measured_on_loopback(tmp_path, capsys) -> None:
    from ckptio.testing.rgw import in_ci, unavailable_reason

    reason = unavailable_reason()
    if reason:
        if in_ci():
            pytest.fail(f"Ceph RGW is missing in CI: {reason}", pytrace=False)
        pytest.skip(reason)
    out = tmp_path / "report"
    argv = ["compare", *TINY, "--targets", "rgw", "--profiles", "", "--tiered", ""]
    argv += ["--out", str(out), "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert [(s["target"], s["kind"]) for s in result["summary"]] == [("rgw", "measured")]
    assert result["summary"][0]["write_GBps"] > 0
    assert "measured — Ceph RGW on loopback" in (out / "report.md").read_text()
    # its results fit a profile, as any measured target's do
    capsys.readouterr()
    assert (
        main(
            [
                "model",
                "--from",
                str(out / "results"),
                "--preset",
                "llama3-8b",
                "--gpus",
                "64",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["target"] == "measured:rgw"


@pytest.mark.s3
@pytest.mark.rgw
def test_cephfs_beside_rgw_on_one_ceph_is_measured(tmp_path, monkeypatch) -> None:
    """The same OSD behind a POSIX and an S3 interface: one Ceph serves both targets, each
    measured and labelled as what it is."""
    from ckptio import rgwserver
    from ckptio.testing.rgw import in_ci

    reason = rgwserver.unavailable_reason(cephfs=True)
    if reason:
        if in_ci():
            pytest.fail(f"CephFS is missing in CI: {reason}", pytrace=False)
        pytest.skip(reason)
    started = []
    real = rgwserver.start_ceph

    def counted(*args, **kw):
        started.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(rgwserver, "start_ceph", counted)
    out = tmp_path / "report"
    result = compare(
        targets=["rgw", "cephfs"],
        profiles=[],
        tiered=[],
        out=str(out),
        workload=CompareWorkload(total_size="8MiB", iterations=2),
    )
    assert started == [{"rgw": True, "cephfs": True}]
    assert [(s["target"], s["kind"]) for s in result["summary"]] == [
        ("cephfs", "measured"),
        ("rgw", "measured"),
    ]
    assert all(s["write_GBps"] > 0 for s in result["summary"])
    report = (out / "report.md").read_text()
    assert "measured — CephFS (ceph-fuse) on loopback" in report
    assert "measured — Ceph RGW on loopback" in report
    sides = {s["labels"]["target"]: s for s in read_results([out / "results"]).sidecars}
    assert sides["cephfs"]["machine"]["filesystem"] == "fuse.ceph-fuse"
    assert sides["cephfs"]["storage_layout"]["fs"] == "cephfs"


def test_cephfs_without_root_is_skipped_with_the_reason_and_rgw_still_runs(
    tmp_path, monkeypatch
) -> None:
    from ckptio import rgwserver

    if rgwserver.unavailable_reason():
        pytest.skip(rgwserver.unavailable_reason())
    monkeypatch.setattr(rgwserver.os, "geteuid", lambda: 1000)
    result = compare(
        targets=["rgw", "cephfs"],
        profiles=[],
        tiered=[],
        out=str(tmp_path / "report"),
        workload=CompareWorkload(total_size="4MiB", iterations=1),
    )
    assert result["skipped"] == [
        {
            "target": "cephfs",
            "reason": "the cephfs target: CephFS through ceph-fuse needs root (mount)",
        }
    ]
    assert [s["target"] for s in result["summary"]] == ["rgw"]


def test_sensitivity_table_shows_the_peer_assumptions_whichever_target_comes_first() -> None:
    """A target with peer copies varies two assumptions the others do not: the table has a
    row for each, '-' where a target does not vary it, whichever target is first."""
    from types import SimpleNamespace

    from ckptio.report import _sensitivity_table

    def row(name: str, low: float) -> dict:
        return {
            "assumption": name,
            "words": name,
            "value": "1",
            "low": low,
            "high": 2 * low,
            "swing": low,
            "base": 1.5 * low,
        }

    peer = [row("price", 10), row("p_lose_another", 1)]
    plain = [row("price", 20)]
    for order in (("peer", "plain"), ("plain", "peer")):
        sens = {"peer": peer, "plain": plain}
        (table,) = _sensitivity_table(SimpleNamespace(sensitivity={k: sens[k] for k in order}))
        cells = {r[0].split(" (")[0]: r[1:] for r in table.rows[1:]}
        assert set(cells) == {"price", "p_lose_another"}
        assert cells["p_lose_another"][order.index("plain")] == "-"
        assert cells["p_lose_another"][order.index("peer")].startswith("1 / 2")
