"""Fits that respect steady state, and intervals on every figure built on them
(ckptio.calibration, ckptio.intervals): which rounds count, when a measured target is refused
and what the refusal says would do, and the interval arithmetic itself."""

from __future__ import annotations

import math
import random

import pytest

from ckptio import calibration as cal
from ckptio.intervals import mean_interval, rounds_needed, spread_interval, t_quantile
from ckptio.profiles import load_profile
from ckptio.stallmodel import Conditions, preset_workload, project

MiB = 2**20


def _round(
    run_id: str,
    it: int,
    *,
    rate: float,
    parts: int = 32,
    part: int = 8 * MiB,
    start: float = 0.0,
    second_half: float = 1.0,
) -> tuple[list[dict], dict]:
    """The request rows and the runs row of one round: ``parts`` writes of ``part`` bytes one
    after another at ``rate`` bytes/s (the second half of them ``second_half`` times as fast),
    then as many reads."""
    rows, t = [], start
    for i in range(parts):
        secs = part / rate / (second_half if i >= parts // 2 else 1.0)
        rows.append(_req(run_id, it, "write", "write", part, t, secs))
        t += secs
    for _ in range(parts):
        secs = part / (2 * rate)
        rows.append(_req(run_id, it, "read", "get", part, t, secs))
        t += secs
    run = {"run_id": run_id, "iteration": it, "target": "disk", "streams": 1, "emulated": False}
    return rows, run


def _req(run_id: str, it: int, phase: str, op: str, n: int, start: float, secs: float) -> dict:
    return {
        "run_id": run_id,
        "iteration": it,
        "phase": phase,
        "op": op,
        "nbytes": n,
        "start": start,
        "end": start + secs,
        "seconds": secs,
        "outcome": "ok",
    }


def _rounds(rates: list[float], **kw) -> tuple[list[dict], list[dict]]:
    requests, runs, t = [], [], 0.0
    for it, rate in enumerate(rates):
        rows, run = _round("r1", it, rate=rate, start=t, **kw)
        requests += rows
        runs.append(run)
        t = rows[-1]["end"] + 1
    return requests, runs


def test_a_slow_first_round_is_a_warm_up_left_out() -> None:
    requests, runs = _rounds([0.5e9, 1.0e9, 1.05e9, 0.95e9, 1.0e9])
    fit = cal.fit_target("disk", requests, runs)
    assert [r.iteration for r in fit.warmup] == [0]
    assert len(fit.used) == 4 and fit.refusal is None
    assert fit.pooled.aggregate_bandwidth == pytest.approx(1.0e9, rel=0.03)
    assert "warm-up" in fit.notes[0]
    # a first round as fast as the others is kept
    requests, runs = _rounds([0.98e9, 1.0e9, 1.05e9, 0.95e9])
    assert cal.fit_target("disk", requests, runs).warmup == []


def test_too_few_rounds_have_no_interval_and_say_how_many_would() -> None:
    requests, runs = _rounds([1e9, 1e9])
    fit = cal.fit_target("disk", requests, runs)
    assert "2 steady rounds" in fit.refusal and "--iterations 4" in fit.refusal


def test_a_round_too_short_is_refused_with_the_size_that_would_do() -> None:
    # 16 MiB per round at 1 GB/s: 17 ms, far below a tenth of a second
    requests, runs = _rounds([1e9] * 4, parts=8, part=2 * MiB)
    fit = cal.fit_target("disk", requests, runs)
    assert "too small to show its steady bandwidth" in fit.refusal
    size = fit.refusal.rsplit("--total-size ", 1)[1].rstrip(")")
    from ckptio.units import parse_size

    # the size named would make a round last at least the minimum, and hold enough bytes
    assert parse_size(size) / 1e9 >= cal.MIN_ROUND_SECONDS
    assert parse_size(size) >= cal.MIN_ROUND_BYTES
    # a busy machine stretching a small round past the time floor does not make it large
    requests, runs = _rounds([0.05e9] * 4, parts=8, part=2 * MiB)
    fit = cal.fit_target("disk", requests, runs)
    assert fit.used[0].write_span > cal.MIN_ROUND_SECONDS
    assert "too small" in fit.refusal


def test_a_round_still_speeding_up_is_not_steady() -> None:
    requests, runs = _rounds([0.3e9] * 4, second_half=3.0)
    fit = cal.fit_target("disk", requests, runs)
    assert fit.halves == pytest.approx(3.0, rel=0.05)
    assert "not at steady state" in fit.refusal and "faster" in fit.refusal
    assert "--total-size" in fit.refusal


def test_noisy_rounds_are_refused_and_quiet_ones_projected_with_an_interval() -> None:
    w = preset_workload("gpt3-175b")
    c = Conditions.reference(w.gpus)
    rng = random.Random(7)
    for spread, refused in ((0.02, False), (0.9, True)):
        rates = [1e9 * math.exp(rng.gauss(0, spread)) for _ in range(4)]
        requests, runs = _rounds([rates[0] * 0.999, *rates[1:]])
        fit = cal.fit_target("disk", requests, runs)
        assert fit.refusal is None
        pooled, per_round = cal.fit_profiles(fit)
        row = cal.project_rounds(w, c, (pooled, None), [(p, None) for p in per_round])
        if refused:
            assert "too noisy" in row["refusal"] and "rounds would give ±20%" in row["refusal"]
            assert "write_seconds" not in row
        else:
            assert row["write_seconds_low"] < row["write_seconds"] < row["write_seconds_high"]
            for part in ("stall", "rework", "restart", "lost"):
                key = f"{part}_cost_per_day"
                assert row[f"{key}_low"] <= row[key] <= row[f"{key}_high"]
            assert row["rounds"] == len(fit.used)


def test_an_emulated_profile_projects_deterministically() -> None:
    w = preset_workload("gpt3-175b")
    c = Conditions.reference(w.gpus)
    a = project(w, load_profile("cloud-s3"), c)
    b = cal.project_rounds(w, c, (load_profile("cloud-s3"), None), [])
    assert a == b and "write_seconds_low" not in b


def test_t_quantiles_are_students() -> None:
    stats = pytest.importorskip("scipy.stats", reason="SciPy checks the table")
    for df in range(1, 40):
        assert t_quantile(df) == pytest.approx(
            stats.t.ppf(0.975, df), abs=2e-3 if df <= 30 else 0.05
        )


def test_intervals_of_a_mean_and_of_a_projection() -> None:
    iv = mean_interval([1.0, 2.0, 3.0])
    assert iv.value == 2.0 and iv.n == 3
    assert iv.high - iv.value == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-3)
    assert mean_interval([5.0]) is None  # one round: the spread is unknown
    sp = spread_interval(10.0, [1.0, 30.0])
    assert sp.low == 0.0 and sp.high > 10  # never below zero
    # the rounds said to be needed do give the asked width
    n = rounds_needed(0.3, 0.2)
    assert (
        t_quantile(n - 1) * 0.3 / math.sqrt(n) <= 0.2 < t_quantile(n - 2) * 0.3 / math.sqrt(n - 1)
    )
