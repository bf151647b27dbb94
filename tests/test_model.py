"""The stall / cost / interval model: the founding example and the attribution."""

import json
import math

import pytest

from ckptio import errors
from ckptio.calibration import fit_latency_bandwidth
from ckptio.cli import main
from ckptio.costmodel import (
    CostModel,
    cost_curve,
    daly_interval,
    lost_shares,
    overhead_fraction,
    young_interval,
)
from ckptio.profiles import load_profile
from ckptio.stallmodel import Workload, estimate
from ckptio.units import parse_bandwidth, parse_duration


def _model_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["model", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_founding_example_70_gbps(capsys: pytest.CaptureFixture[str]) -> None:
    out = _model_json(capsys, "--size", "2TB", "--write-bandwidth", "70GB/s", "--interval", "2h")
    assert out["checkpoint_seconds"] == pytest.approx(28.57, abs=0.01)  # "~30 s"
    assert out["stall_share"] == pytest.approx(28.57 / 7200, rel=1e-3)
    assert out["rework_share"] == out["restart_share"] == 0  # no --mtbf: no failures


def test_founding_example_a_tenth_of_the_bandwidth(capsys: pytest.CaptureFixture[str]) -> None:
    out = _model_json(capsys, "--size", "2TB", "--write-bandwidth", "7GB/s", "--interval", "2h")
    assert out["checkpoint_seconds"] == pytest.approx(285.7, abs=0.1)  # ~5 min every 2 h
    assert 4.5 * 60 < out["stall_share"] * 7200 < 5 * 60


def test_intervals_from_mtbf(capsys: pytest.CaptureFixture[str]) -> None:
    out = _model_json(capsys, "--checkpoint-seconds", "300", "--mtbf", "24h", "--restart", "10min")
    assert out["young_interval_seconds"] == pytest.approx(math.sqrt(2 * 300 * 86400))
    # Daly's higher-order estimate is a little below Young's for small delta/M
    assert (
        0.9 * out["young_interval_seconds"]
        < out["daly_interval_seconds"]
        < out["young_interval_seconds"]
    )
    assert out["overhead_at_optimum"] <= out["overhead_at_interval"]


def test_daly_overhead_is_minimal_near_daly_interval() -> None:
    d, m, r = 300.0, 86400.0, 600.0
    best = daly_interval(d, m)
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert overhead_fraction(best, d, m, r) <= overhead_fraction(best * factor, d, m, r)
    assert daly_interval(5000, 2000) == 2000  # delta >= 2M: checkpoint every M
    assert young_interval(2, 100) == pytest.approx(20)


def test_stall_cost_per_day() -> None:
    rep = CostModel(
        checkpoint_seconds=300, interval=7200, gpus=992, price_per_gpu_hour=2.0
    ).report()
    assert rep["stall_gpu_hours_per_day"] == pytest.approx(992 * 24 * 300 / 7200)
    assert rep["stall_cost_per_day"] == pytest.approx(2 * rep["stall_gpu_hours_per_day"])
    assert rep["lost_cost_per_day"] == rep["stall_cost_per_day"]  # no failures without an MTBF


@pytest.mark.parametrize(
    ("stall", "interval", "mtbf", "restart"),
    [
        (300, 7200, 86400, 600),
        (31, 7200, 5.27 * 3600, 550),
        (5, 600, 3600, 60),
        (100, 3e5, 3600, 9),
    ],
)
def test_stall_rework_and_restart_add_up_to_dalys_overhead(stall, interval, mtbf, restart) -> None:
    """The three parts of the lost time are each >= 0 and add up, exactly, to the share of
    wall time Daly's expected wall time says is lost: ``overhead / (1 + overhead)``."""
    shares = lost_shares(stall, interval, mtbf, restart)
    assert min(shares.values()) >= 0
    assert shares["lost"] == pytest.approx(shares["stall"] + shares["rework"] + shares["restart"])
    over = overhead_fraction(interval - stall, stall, mtbf, restart)
    assert shares["lost"] == pytest.approx(over / (1 + over), rel=1e-9)
    assert shares["restart"] == pytest.approx(1 - math.exp(-restart / mtbf))
    # first order: rework is half an interval of work per failure
    if interval < 0.1 * mtbf:
        assert shares["rework"] == pytest.approx(interval / (2 * mtbf), rel=0.1)


def test_the_cost_curve_and_the_cost_model_are_one_answer() -> None:
    """A cost curve (what the cost plot draws) at the chosen interval is the cost model's
    figure (what the table shows), part by part."""
    kw = dict(gpus=1536, price_per_gpu_hour=2.0, mtbf=5.27 * 3600, restart_seconds=550.0)
    table = CostModel(31.2, interval=7200, **kw).report()
    (curve,) = cost_curve(
        31.2, [7200], gpus=1536, price_per_gpu_hour=2.0, mtbf=kw["mtbf"], restart_seconds=550
    )
    for part in ("stall", "rework", "restart", "lost"):
        assert curve[f"{part}_cost_per_day"] == pytest.approx(table[f"{part}_cost_per_day"])


def test_per_stream_bandwidth_binds_on_s3_with_few_writers() -> None:
    # 8 writing nodes x 16 streams x 50 MB/s = 6.4 GB/s, far below the node links
    w = Workload(total_bytes=64 * 2**30, writing_ranks=64, bytes_per_rank=2**30, ranks=992)
    e = estimate(w, load_profile("cloud-s3"))
    assert e.binding == "per-stream bandwidth"
    assert "8 writing nodes \u00d7 16 streams \u00d7 50 MB/s" in e.binding_detail
    assert sum(lim.contribution_seconds for lim in e.limits) == pytest.approx(e.seconds)


def test_aggregate_binds_on_abci_for_gpt3_size() -> None:
    w = Workload(
        total_bytes=2 * 10**12, writing_ranks=992, bytes_per_rank=2 * 10**12 // 992, ranks=992
    )
    e = estimate(w, load_profile("abci-lustre"))
    assert e.binding == "aggregate bandwidth"
    assert e.seconds == pytest.approx(2e12 / 70e9, rel=0.02)


def test_request_rate_binds_and_hashed_keys_relieve_it() -> None:
    s3 = load_profile("cloud-s3")
    kw = dict(
        total_bytes=2 * 10**12, writing_ranks=992, bytes_per_rank=2 * 10**12 // 992, ranks=992
    )
    flat = estimate(Workload(**kw), s3)
    hashed = estimate(Workload(**kw, prefixes=256), s3)
    assert flat.binding == "request-rate limit" and flat.throttled
    assert hashed.binding != "request-rate limit"
    assert hashed.seconds < flat.seconds


def test_async_save_stall_is_the_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    out = _model_json(
        capsys,
        "--size",
        "64GiB",
        "--gpus",
        "64",
        "--writing-ranks",
        "64",
        "--profile",
        "cloud-s3",
        "--async-save",
        "--snapshot-bandwidth",
        "25GB/s",
    )
    t = out["targets"][0]
    assert t["checkpoint_seconds"] == pytest.approx(2**30 / 25e9)
    assert t["blocking_stall_seconds"] > 10 * t["checkpoint_seconds"]


def test_fit_recovers_latency_and_bandwidth() -> None:
    sizes = [1e6, 2e6, 4e6, 8e6] * 5
    secs = [0.05 + s / 80e6 for s in sizes]
    lat, bw = fit_latency_bandwidth(sizes, secs)
    assert lat == pytest.approx(0.05, rel=1e-3)
    assert bw == pytest.approx(80e6, rel=1e-3)


def test_units() -> None:
    assert parse_duration("2h") == 7200 and parse_duration("10min") == 600
    assert parse_duration("20ms") == pytest.approx(0.02)
    assert parse_bandwidth("70GB/s") == 70e9 and parse_bandwidth("100Gb/s") == 12.5e9
    with pytest.raises(errors.InvalidArgumentError, match="examples"):
        parse_duration("soon")


def test_model_without_inputs_says_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model"]) == 2
    assert "--preset" in capsys.readouterr().err


# -- restart = fixed overhead + restore, projected from the read side --------------------------


def test_restart_is_overhead_plus_the_projected_restore(capsys: pytest.CaptureFixture[str]) -> None:
    out = _model_json(
        capsys,
        "--preset",
        "gpt3-175b",
        "--gpus",
        "1536",
        "--profile",
        "cloud-s3,abci-lustre",
        "--mtbf",
        "24h",
        "--price",
        "2",
    )
    for t in out["targets"]:
        assert t["restore_seconds"] == pytest.approx(t["read"]["seconds"])
        assert t["restart_seconds"] == pytest.approx(300 + t["restore_seconds"])
        assert t["restore_binding"] == t["read"]["binding"]
        assert t["restart_basis"].startswith("fixed overhead + restore")
        assert t["restart_share"] == pytest.approx(1 - math.exp(-t["restart_seconds"] / 86400))
        assert t["lost_share"] == pytest.approx(
            t["stall_share"] + t["rework_share"] + t["restart_share"]
        )
        # Daly's overhead counts the restart: with a longer one it grows
        longer = overhead_fraction(
            t["daly_interval_seconds"], t["checkpoint_seconds"], 86400, t["restart_seconds"] + 600
        )
        assert t["overhead_at_optimum"] < longer
    s3, lustre = out["targets"]
    assert s3["restore_binding"] == "per-stream bandwidth"  # 16 streams x 50 MB/s per node
    assert "reading nodes" in s3["restore_binding_detail"]
    assert lustre["restore_binding"] == "aggregate bandwidth"
    assert s3["restore_seconds"] > 5 * lustre["restore_seconds"]


def test_a_given_restart_is_used_as_given(capsys: pytest.CaptureFixture[str]) -> None:
    out = _model_json(
        capsys,
        "--preset",
        "gpt3-175b",
        "--profile",
        "cloud-s3",
        "--mtbf",
        "24h",
        "--restart",
        "10min",
    )
    assert out["restart_seconds"] == 600 and out["restart_basis"] == "given (--restart)"


def test_restart_from_figures_with_a_read_bandwidth(capsys: pytest.CaptureFixture[str]) -> None:
    out = _model_json(
        capsys,
        "--size",
        "2TB",
        "--write-bandwidth",
        "70GB/s",
        "--read-bandwidth",
        "100GB/s",
        "--mtbf",
        "24h",
        "--restart-overhead",
        "2min",
    )
    assert out["restore_seconds"] == pytest.approx(20.0)
    assert out["restart_seconds"] == pytest.approx(140.0)
    assert out["restart_share"] == pytest.approx(1 - math.exp(-140 / 86400))
    out = _model_json(capsys, "--size", "2TB", "--write-bandwidth", "70GB/s", "--mtbf", "24h")
    assert out["restart_seconds"] == 300 and "no read side" in out["restart_basis"]


def test_model_output_names_the_restore_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "model",
                "--preset",
                "gpt3-175b",
                "--gpus",
                "1536",
                "--profile",
                "cloud-s3",
                "--mtbf",
                "24h",
            ]
        )
        == 0
    )
    text = " ".join(capsys.readouterr().out.split())
    assert "fixed (assumption) + restore" in text
    assert "the restore is bound by cloud-s3: per-stream bandwidth" in text


def test_tiered_projection(capsys: pytest.CaptureFixture[str]) -> None:
    """cloud-s3 with a node-local NVMe tier: the stall is the NVMe write, the drain the S3
    write (every 3rd checkpoint, fits in 3 intervals), the restore weighted by the probability
    that a failure loses a node's fast tier."""
    out = _model_json(
        capsys,
        "--preset",
        "gpt3-175b",
        "--gpus",
        "1536",
        "--profile",
        "cloud-s3",
        "--local",
        "local-nvme",
        "--persist-every",
        "3",
        "--mtbf",
        "24h",
        "--p-lose-node",
        "0.5",
        "--price",
        "2",
    )
    s3, tiered = out["targets"]
    assert tiered["target"] == "cloud-s3+local-nvme"
    assert tiered["write_seconds"] < s3["write_seconds"] / 5  # NVMe node links vs S3 streams
    assert tiered["drain_seconds"] == pytest.approx(s3["write_seconds"])
    assert tiered["drain_binding"] == "cloud-s3 write: per-stream bandwidth"
    assert tiered["drain_fits_interval"]
    assert tiered["fast_only_window_seconds"] == pytest.approx(2 * 7200 + tiered["drain_seconds"])
    assert tiered["restore_durable_seconds"] == pytest.approx(s3["restore_seconds"])
    assert tiered["restore_seconds"] == pytest.approx(
        0.5 * tiered["restore_fast_seconds"] + 0.5 * tiered["restore_durable_seconds"]
    )
    assert tiered["restart_seconds"] == pytest.approx(300 + tiered["restore_seconds"])
    assert tiered["p_lose_node_source"] == "given (--p-lose-node)"
    assert tiered["stall_cost_per_day"] < s3["stall_cost_per_day"] / 5
    assert (
        main(["model", "--preset", "gpt3-175b", "--profile", "cloud-s3", "--local", "local-nvme"])
        == 0
    )
    text = " ".join(capsys.readouterr().out.split())
    assert "drain" in text and "p = 0.78, assumption" in text
    assert (
        main(
            [
                "model",
                "--preset",
                "gpt3-175b",
                "--profile",
                "cloud-s3",
                "--local",
                "local-nvme",
                "--p-lose-node",
                "1.5",
            ]
        )
        != 0
    )
    captured = capsys.readouterr()
    assert "--p-lose-node: expected a number from 0 to 1" in captured.out + captured.err


def test_model_from_results_fits_the_read_side(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ckptio model --from`` fits the read side (request latency, per-stream and node
    bandwidth of the read phase's GETs) as it does the write side, and projects the restore
    with it: a storage that reads 4x slower than it writes restores as slowly as it reads."""
    from ckptio.cli import main

    out = tmp_path / "results"
    argv = ["run", "memory://read-side", "--preset", "llama3-8b", "--total-size", "8MiB"]
    argv += ["--object-size", "1MiB", "--emulate", "cloud-s3", "--out", str(out)]
    argv += ["--iterations", "4"]  # an interval needs 3 rounds; the first may be a warm-up
    for opt in (
        "request_latency=5ms",
        "metadata_latency=5ms",
        "stream_bandwidth=40MB/s",
        "read_request_latency=20ms",
        "read_stream_bandwidth=10MB/s",
        "part_size=256KiB",
    ):
        argv += ["--option", opt]
    assert main(argv) == 0
    capsys.readouterr()
    from ckptio import calibration

    # 8 MiB rounds are below the size a real projection needs; this test is about the fit
    monkeypatch.setattr(calibration, "MIN_ROUND_BYTES", 0)
    assert main(["model", "--from", str(out), "--preset", "gpt3-175b", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    cal = result["calibration"][0]
    assert cal["read_requests"] > 0
    assert cal["stream_bandwidth"] == pytest.approx(40e6, rel=0.3)
    assert cal["read_stream_bandwidth"] == pytest.approx(10e6, rel=0.3)
    assert cal["read_request_latency"] == pytest.approx(0.020, abs=0.010)
    t = result["targets"][0]
    figures = t["profile"]["figures"]
    assert "reads" in figures["read_stream_bandwidth"]["source"]

    # the restore is projected from the read side: its streams 4x slower than the write's
    def alone(phase: str) -> float:
        return next(
            x["seconds"] for x in t[phase]["limits"] if x["limit"] == "per-stream bandwidth"
        )

    assert 2.8 < alone("read") / alone("write") < 5.7, (alone("read"), alone("write"))
