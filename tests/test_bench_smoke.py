"""A tiny run of the peer benchmark (benchmarks/run.py): it runs end to end, checks what it
loads, and writes its result document. Timings are not asserted; peers that are not installed
are skipped by the benchmark itself and listed."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``benchmarks/<script>`` with ``args`` in a fresh interpreter; fails the test, with the
    end of its stderr, unless it exits 0."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_benchmark_runs_and_writes_its_tables(tmp_path):
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    cases = (
        "memcpy,fio-write,fio-read,fio-write-hugepages,fio-read-hugepages,ckptio-sync,ckptio-load,"
        "ckptio-async,ckptio-async-fork"
    )
    bench(
        "run.py",
        "--size",
        "4MiB",
        "--tensors",
        "3",
        "--rounds",
        "2",
        "--only",
        cases,
        "--dir",
        str(tmp_path / "scratch"),
        "--json",
        str(out_json),
        "--markdown",
        str(out_md),
        "--cache-drop",
        "fadvise",
        "--no-warmup",
        "--settle",
        "0",
    )
    doc = json.loads(out_json.read_text())
    ran = {row["case"] for row in doc["cases"]}
    assert {"memcpy", "ckptio-sync", "ckptio-load", "ckptio-async", "ckptio-async-fork"} <= ran
    assert ran | set(doc["skipped"]) == set(cases.split(","))
    for row in doc["cases"]:
        assert row["rounds"] == 2 and len(row["seconds"]) == 2 and row["median_seconds"] > 0
    for name in (
        "fio-write-hugepages",
        "fio-read-hugepages",
    ):  # run where hugetlb pages are reserved
        assert (
            name in ran or "nr_hugepages" in doc["skipped"][name] or "fio" in doc["skipped"][name]
        )
    async_row = next(r for r in doc["cases"] if r["case"] == "ckptio-async")
    assert 0 < async_row["median_blocking_seconds"] <= async_row["median_seconds"]
    assert async_row["first_blocking_seconds"] > 0  # the untimed first save's, kept apart
    if sys.platform.startswith("linux"):  # what the machine did during each round
        sync_row = next(r for r in doc["cases"] if r["case"] == "ckptio-sync")
        assert len(sync_row["machine"]) == 2 and "cpu_steal" in sync_row["median_machine"]
        assert all(
            {"cpu_user", "cpu_system", "cpu_steal", "pgfault"} <= set(m)
            for m in sync_row["machine"]
        )
    assert any(t["of"] == "ckptio-async:blocking" for t in doc["targets"])
    fork_row = next(r for r in doc["cases"] if r["case"] == "ckptio-async-fork")
    assert (
        fork_row["median_touch_during_seconds"] > 0 and fork_row["median_touch_after_seconds"] > 0
    )
    assert doc["config"]["size_bytes"] >= 3 * 2**20 and doc["machine"]["versions"]["ckptio"]
    # the per-round ratio pairs each round's samples of the two cases
    rows = {row["case"]: row for row in doc["cases"]}
    t = next(
        t for t in doc["targets"] if t["of"] == "ckptio-async:blocking" and t["against"] == "memcpy"
    )
    per_round = [
        b / m
        for b, m in zip(
            rows["ckptio-async"]["blocking_seconds"], rows["memcpy"]["seconds"], strict=True
        )
    ]
    assert t["paired_ratio"] == pytest.approx(statistics.median(per_round))
    md = out_md.read_text()
    assert "| ckptio-sync |" in md and "| target |" in md and "median of per-round ratios" in md
    assert not os.listdir(tmp_path / "scratch")  # every case cleans up after itself


def test_fork_overlap_benchmark_runs(tmp_path):
    proc = bench(
        "fork_overlap.py",
        "--size",
        "8MiB",
        "--tensors",
        "2",
        "--rounds",
        "1",
        "--dir",
        str(tmp_path / "scratch"),
    )
    rows = [
        line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line
    ]
    assert [r.split(" | ")[0][2:] for r in rows[1:]] == [
        "no snapshot",
        "0% into the write",
        "25% into the write",
        "50% into the write",
        "75% into the write",
        "after the write",
    ]
    assert not (tmp_path / "scratch").exists()


def test_s3_peers_pairs_rounds_and_pools_saved_runs(tmp_path):
    """The S3 benchmark's summary pairs each ckptio client with a peer round by round (not
    the i-th sample with the i-th when a round is missing) and pools saved runs."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import s3_peers
    finally:
        sys.path.pop(0)

    def rec(rnd, wall, cpu):  # 1 GB in `wall` seconds with `cpu` CPU seconds
        return {"round": rnd, "bytes": 1e9, "wall_s": wall, "cpu_s": cpu}

    runs = {
        "ckptio-s3+boto3": [rec(0, 10.0, 1.0), rec(1, 20.0, 1.0), rec(2, 10.0, 3.0)],
        "s5cmd": [rec(0, 11.0, 2.0), rec(2, 10.0, 2.0)],  # round 1 failed
        "boto3-transfer": [rec(0, 12.0, 4.0), rec(1, 12.0, 4.0), rec(2, 12.0, 4.0)],
    }
    wall, cpu = s3_peers.per_round(runs, "ckptio-s3+boto3", "s5cmd")
    assert wall == pytest.approx([1.1, 1.0]) and cpu == pytest.approx([0.5, 1.5])
    (summary,) = s3_peers.paired_ratios(runs)
    assert summary["peer"] == "s5cmd" and summary["cpu_peer"] == "s5cmd"  # fastest; least CPU
    assert summary["rounds"] == 2 and summary["rounds_ahead"] == 2
    assert summary["wall_ratio_median"] == pytest.approx(1.05)

    files = []
    for i in range(2):
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps({"runs": runs}))
        files.append(str(path))
    pooled = {(r["client"], r["peer"]): r for r in s3_peers.pool(files)}
    tm = pooled[("ckptio-s3+boto3", "boto3-transfer")]
    assert (tm["runs"], tm["rounds"], tm["rounds_ahead"]) == (2, 6, 4)
    assert tm["wall_ratio_median"] == pytest.approx(1.2)
    lo, hi = tm["wall_ratio_ci95"]
    assert 0.6 <= lo <= tm["wall_ratio_median"] <= hi <= 1.2 + 1e-9

    results = os.path.join(ROOT, "benchmarks", "results")  # the runs the README pools
    saved = [
        os.path.join(results, f) for f in sorted(os.listdir(results)) if f.startswith("s3-download")
    ]
    proc = bench("s3_peers.py", "--pool", *saved)
    assert "ckptio-s3+boto3 / s5cmd:" in proc.stdout


@pytest.mark.s3
def test_s3_peers_downloads_with_every_ckptio_read_client(tmp_path):
    """benchmarks/s3_peers.py --op read end to end on its own moto server: raw ranged reads,
    a load into new arrays and a load into an array made before the clock each read the
    object's bytes (each worker compares them with the payload after its clock)."""
    out = tmp_path / "read.json"
    clients = ["ckptio-s3+boto3", "ckptio-load-s3+boto3", "ckptio-load-into-s3+boto3"]
    bench(
        "s3_peers.py",
        "--op",
        "read",
        "--size",
        "12MiB",
        "--part-size",
        "5MiB",
        "--rounds",
        "1",
        "--repeat",
        "2",
        "--settle",
        "0",
        "--clients",
        ",".join(clients),
        "--json",
        str(out),
        timeout=300,
    )
    runs = json.loads(out.read_text())["runs"]
    for client in clients:
        (rec,) = runs[client]
        assert rec["bytes"] == 2 * 12 * 2**20 and rec["wall_s"] > 0, (client, rec)
    assert "open_s" in runs["ckptio-load-into-s3+boto3"][0]


def test_gpu_benchmark_runs_on_cpu_tensors_and_says_when_there_is_no_gpu(tmp_path):
    """benchmarks/gpu.py end to end on CPU tensors (``--device cpu``, what it does on a GPU with
    CUDA ones); without a CUDA device its default run says so and measures nothing."""
    pytest.importorskip("torch")
    out = tmp_path / "gpu.json"
    bench(
        "gpu.py",
        "--device",
        "cpu",
        "--size",
        "4MiB",
        "--tensors",
        "4",
        "--rounds",
        "1",
        "--dir",
        str(tmp_path),
        "--out",
        str(out),
        timeout=300,
    )
    doc = json.loads(out.read_text())
    assert doc["verified"] is True and doc["bytes"] == 4 * 2**20
    assert [r["case"] for r in doc["results"]] == [
        "torch.save",
        "dcp.save",
        "dcp.async_save",
        "ckptio-sync",
        "ckptio-async",
    ]
    assert all(0 < r["blocking_s"] <= r["total_s"] for r in doc["results"])
    import torch

    if not torch.cuda.is_available():
        proc = bench("gpu.py", "--out", str(tmp_path / "none.json"), timeout=300)
        assert "sees no CUDA device" in proc.stderr and "nothing measured" in proc.stderr
        assert not (tmp_path / "none.json").exists()
