"""What ``ckptio`` prints when its output goes to a file or a pipe, as in a job's log (issue 20,
item 4): every value whole, ``--format table|markdown|csv|json``, progress lines on stderr, the
sweep's warning when the layout caps the concurrency it varies, report rows that keep sweep
points apart, and ``model`` with several bandwidths and async save from figures given directly.

Commands that do I/O run in a real process with stdout and stderr piped (not a terminal), at
tiny sizes on ``memory://`` or a temporary directory; ``model``, ``plan`` and ``profiles`` run
in this process with stdout captured (not a terminal either)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ckptio.cli import main
from ckptio.workload import make_plan

LABEL = "a-target-label-long-enough-that-an-80-column-table-would-cut-or-wrap-it-x7"
TINY = ["--total-size", "4MiB", "--object-size", "1MiB"]


def ckptio(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "ckptio.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def csv_tables(text: str) -> list[list[list[str]]]:
    """The tables of ``--format csv`` output: blocks split at empty lines, ``#`` lines out."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    out = []
    for b in blocks:
        rows = "\n".join(ln for ln in b.splitlines() if not ln.startswith("#"))
        out.append(list(csv.reader(io.StringIO(rows))))
    return out


def test_run_piped_shows_every_value_whole_and_progress_on_stderr(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = ckptio("run", "memory://cli-output-run", "--label", LABEL, *TINY, "--out", str(out))
    lines = proc.stdout.splitlines()
    assert "…" not in proc.stdout and "\x1b[" not in proc.stdout  # nothing cut, no colour codes
    (run,) = pq.read_table(next(out.glob("*.run.parquet"))).to_pylist()
    assert len(run["run_id"]) > 70 and any(run["run_id"] in ln for ln in lines), proc.stdout
    for path in out.iterdir():  # every result file's path whole on a line of its own
        assert str(path) in lines, (path, proc.stdout)
    for column in ("write GB/s", "slowest rank write GB/s", "slowest rank read GB/s"):
        assert f" {column} " in proc.stdout, column
    assert run["write_GBps"] < 10
    row = next(ln for ln in lines if ln.startswith("|  0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[3]) == pytest.approx(run["write_GBps"], rel=0.01), row  # all its digits
    # progress on stderr, in plain lines
    err = proc.stderr.splitlines()
    assert err[0].startswith("running run llama3-8b"), proc.stderr
    assert any(ln.strip().startswith("iteration 1/1: write 4.0 MiB in") for ln in err), err
    assert " done in " in err[-1], err


def run_main(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> tuple[str, str]:
    """``ckptio ARGS`` in this process (stdout captured: not a terminal)."""
    capsys.readouterr()
    assert main(list(args)) == code
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_formats_parse_and_json_is_an_alias(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["model", "--size", "2TB", "--write-bandwidth", "70GB/s,7GB/s", "--interval", "2h"]
    (table,) = csv_tables(run_main(capsys, *args, "--format", "csv")[0])
    assert table[0][:3] == ["target", "size", "write"] and len(table) == 3
    md = run_main(capsys, *args, "--format", "markdown")[0]
    rows = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert rows[1].startswith("|---|") and len(rows) == 4, md
    as_format = json.loads(run_main(capsys, *args, "--format", "json")[0])
    as_flag = json.loads(run_main(capsys, *args, "--json")[0])
    assert as_format == as_flag and len(as_flag["targets"]) == 2
    plan = csv_tables(run_main(capsys, "plan", "--preset", "gpt3-175b", "--format", "csv")[0])
    assert dict((r[0], r[1]) for r in plan[0][1:])["ranks"] == "1,536"
    profiles = csv_tables(run_main(capsys, "profiles", "--format", "csv")[0])
    assert profiles[0][0][:2] == ["figure", "abci-lustre"]
    _, err = run_main(capsys, *args, "--json", "--format", "csv", code=2)
    assert "--format" in err


def test_model_compares_bandwidths_in_one_call_and_names_the_gpu_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README's two founding examples in one call: 2 TB every 2 h at 70 GB/s is 28.6 s,
    0.4% idle; at 7 GB/s 4.8 min, 4.0% idle."""
    text, _ = run_main(
        capsys, "model", "--size", "2TB", "--write-bandwidth", "70GB/s,7GB/s", "--interval", "2h"
    )
    rows = {
        c[0]: c
        for ln in text.splitlines()
        if ln.startswith("| ")
        for c in [[x.strip() for x in ln.strip("|").split("|")]]
    }
    head = rows["target"]
    fast, slow = (dict(zip(head, rows[t], strict=True)) for t in ("70 GB/s", "7 GB/s"))
    assert fast["write"] == "28.6 s" and fast["stall share"] == "0.40%"
    value, unit = slow["write"].split()
    assert unit == "min" and round(float(value), 1) == 4.8
    assert round(float(slow["stall share"].rstrip("%")), 1) == 4.0
    assert "GPUs: 1 (assumed" in text
    assert (
        "GPUs: 1,024 (--gpus)"
        in run_main(
            capsys, "model", "--size", "2TB", "--write-bandwidth", "70GB/s", "--gpus", "1024"
        )[0]
    )


def test_model_async_save_with_figures_given_directly(capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(
        run_main(
            capsys,
            "model",
            "--size",
            "2TB",
            "--write-bandwidth",
            "70GB/s",
            "--gpus",
            "1024",
            "--async-save",
            "--json",
        )[0]
    )
    for t, bw in zip(doc["targets"], (70e9,), strict=True):
        assert t["checkpoint_seconds"] == pytest.approx(2e12 / 1024 / 25e9)  # the snapshot
        assert t["async_save"] is True
        assert t["blocking_stall_seconds"] == pytest.approx(2e12 / bw)
        assert t["stall_share"] == pytest.approx(2e12 / 1024 / 25e9 / 7200)
        assert t["async_fits_interval"]
    assert doc["gpus"] == 1024 and doc["gpus_from"] == "given"
    _, err = run_main(capsys, "model", "--checkpoint-seconds", "300", "--async-save", code=2)
    assert "--size" in err


@pytest.fixture(scope="module")
def capped_sweep(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A sweep on a local directory of 4 MiB over llama3-8b's 8 GPUs in one process: 16 objects of at most 1 MiB,
    so at most 16 parts of 1 MiB in flight; 64 streams cannot all work."""
    out = tmp_path_factory.mktemp("sweep")
    proc = ckptio(
        "sweep",
        f"file://{out}/target",
        "--label",
        "sweep",
        *TINY,
        "--streams",
        "1,64",
        "--part-size",
        "1MiB",
        "--no-read",
        "--out",
        str(out),
    )
    return proc, out


def test_sweep_warns_when_the_layout_caps_the_streams(capped_sweep) -> None:
    proc, _ = capped_sweep
    err = proc.stderr
    warning = next(ln for ln in err.splitlines() if ln.startswith("warning:"))
    assert "--streams 64 with 1.0 MiB parts" in warning and "at most 16 part(s)" in warning
    assert err.index("warning:") < err.index("running sweep")  # said before the work starts
    assert "sweep point 1/2: 1 stream(s)" in err and "sweep point 2/2: 64 stream(s)" in err
    assert " done in " in err.splitlines()[-1]


def test_sweep_points_follow_the_plan() -> None:
    """64 MiB of llama3-8b over 8 writing ranks: on 8 processes each has 2 objects of one 8 MiB
    part, so 4 and 16 streams are capped at 2 (and said to be); on 1 process, with 16 objects,
    the sweep puts enough of them in flight for 16 streams instead of measuring 2 three times."""
    from ckptio.runner import sweep_points, sweep_warnings

    plan = make_plan("llama3-8b", total_size="64MiB")
    eight = sweep_points(plan, 8, [1, 4, 16], [8 * 2**20])
    assert [(p.parts_in_flight, p.capped) for p in eight] == [(2, False), (2, True), (2, True)]
    (line,) = sweep_warnings(eight, plan, 8)
    assert line.startswith("--streams 4,16 with 8.0 MiB parts") and "at most 2 part(s)" in line
    one = sweep_points(plan, 1, [1, 4, 16], [8 * 2**20])
    assert [p.parts_in_flight for p in one] == [2, 4, 16] and not sweep_warnings(one, plan, 1)


def test_report_keeps_sweep_points_apart(capped_sweep, tmp_path: Path) -> None:
    _, results = capped_sweep
    ckptio(
        "run",
        "memory://cli-output-report",
        "--label",
        LABEL,
        *TINY,
        "--iterations",
        "2",
        "--no-read",
        "--out",
        str(results / "run"),
    )
    out = tmp_path / "report"
    doc = json.loads(
        ckptio(
            "report",
            str(results),
            str(results / "run"),
            "--out",
            str(out),
            "--project",
            "llama3-8b",
            "--json",
        ).stdout
    )
    rows = [(s["target"], s.get("point"), s["iterations"]) for s in doc["summary"]]
    assert sorted(rows) == [
        (LABEL, "", 2),  # the iterations of one point are averaged
        ("sweep", "sweep: 1 stream, 1 MiB parts", 1),
        ("sweep", "sweep: 64 streams, 1 MiB parts", 1),
    ], rows
    md = (out / "report.md").read_text()
    assert "| point |" in md and "sweep: 64 streams, 1 MiB parts" in md


def test_compare_progress_on_stderr(tmp_path: Path) -> None:
    proc = ckptio(
        "compare",
        *TINY,
        "--targets",
        "local",
        "--profiles",
        "",
        "--tiered",
        "",
        "--out",
        str(tmp_path),
        "--project",
        "llama3-8b",
    )
    err = proc.stderr.splitlines()
    assert err[0] == "running local (measured) ..." and err[-1].startswith("local done in ")
    assert "…" not in proc.stdout and "binding limit" in proc.stdout
