"""examples/train.py: killed with SIGKILL mid-run and restarted, it reproduces the losses of
an uninterrupted run bit for bit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train.py"
ARGS = ["--steps", "200", "--every", "20", "--hidden", "128", "--layers", "3"]


def _losses(log: Path) -> tuple[dict[int, str], dict[int, list[str]]]:
    """step -> loss (float.hex); a step logged twice (re-run after the resume) keeps both."""
    seen: dict[int, list[str]] = {}
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        seen.setdefault(rec["step"], []).append(rec["loss"])
    return {s: v[-1] for s, v in seen.items()}, seen


def test_resume_after_kill_reproduces_the_loss_curve(tmp_path: Path) -> None:
    ref_log, run_log = tmp_path / "ref.jsonl", tmp_path / "run.jsonl"
    ref = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--url",
            f"file://{tmp_path}/ref",
            "--log",
            str(ref_log),
            *ARGS,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert (
        "a synchronous save of the same state" in ref.stdout
        and "summary: median blocking time" in ref.stdout
    )
    reference, _ = _losses(ref_log)
    assert sorted(reference) == list(range(1, 201))

    cmd = [
        sys.executable,
        str(EXAMPLE),
        "--url",
        f"file://{tmp_path}/run",
        "--log",
        str(run_log),
        "--no-sync-probe",
        *ARGS,
    ]
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # the loop prints "step N loss ..." every 10 steps
            if line.startswith("step ") and int(line.split()[1]) >= 130:
                proc.send_signal(signal.SIGKILL)
                break
        else:
            pytest.fail("the training run ended before it could be killed")
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    first, _ = _losses(run_log)
    killed_at = max(first)
    assert 130 <= killed_at < 200

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed_from = int(again.stdout.split("resumed from step ")[1].split()[0])
    assert 0 < resumed_from <= killed_at and resumed_from % 20 == 0
    final, every = _losses(run_log)
    assert sorted(final) == list(range(1, 201))
    # steps run twice (after the checkpoint, before the kill) give the same loss both times,
    # and the whole curve equals the uninterrupted run's, bit for bit
    assert any(len(v) == 2 for v in every.values())
    assert all(len(set(v)) == 1 for v in every.values())
    assert final == reference
