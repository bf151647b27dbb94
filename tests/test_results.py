"""Result tables, Parquet files and sidecars (ckptio.results)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

from ckptio import errors, results


def _rows(run_id: str, site: str) -> dict:
    req = [
        {
            "run_id": run_id,
            "target": "t",
            "rank": 0,
            "iteration": 0,
            "phase": "write",
            "op": "write",
            "key": "k",
            "nbytes": 10,
            "start": 1.0,
            "end": 2.0,
            "seconds": 1.0,
            "attempt": 1,
            "outcome": "ok",
            "backend": "memory",
            "thread": 1,
            "host": "node-a",
        }
    ]
    ph = [
        {
            "run_id": run_id,
            "target": "t",
            "rank": 0,
            "iteration": 0,
            "phase": "write",
            "bytes": 10,
            "seconds": 1.0,
            "start": 1.0,
            "end": 2.0,
            "cache": "n/a",
            **results.ADDED_COLUMNS["phases"],  # the columns added since, at their defaults
            "host": "node-a",
        }
    ]
    run = [
        {c: None for c, _ in results.RUN_COLUMNS}
        | {"run_id": run_id, "site": site, "checkpoint_bytes": 10, "ranks": 1, "kind": "run"}
    ]
    return {"requests": req, "phases": ph, "runs": run}


def test_write_and_merge_runs_from_two_sites(tmp_path: Path) -> None:
    a, b = results.new_run_id("file"), results.new_run_id("s3 bucket/x")
    pa_dir, pb_dir = tmp_path / "a", tmp_path / "b"
    results.write_run(pa_dir, **_rows(a, "site-a"), sidecar=results.sidecar(a, config={"x": 1}))
    results.write_run(pb_dir, **_rows(b, "site-b"), sidecar=results.sidecar(b, config={}))
    merged = results.read_results([pa_dir, pb_dir])
    assert merged.runs.num_rows == 2
    assert sorted(merged.runs.column("site").to_pylist()) == ["site-a", "site-b"]
    assert merged.requests.num_rows == 2 and merged.phases.num_rows == 2
    assert {s["run_id"] for s in merged.sidecars} == {a, b}
    assert merged.run_ids == sorted([a, b])


def test_run_id_shape() -> None:
    rid = results.new_run_id("s3://bucket/a b")
    stamp, _ = rid.split("-", 1)
    assert len(stamp) == 15 and stamp[8] == "T"
    assert all(c.isalnum() or c in ".-" for c in rid)


def test_missing_column_is_an_error() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="lacks column"):
        results.table("phases", [{"run_id": "x"}])


def test_credentials_are_hidden(tmp_path: Path) -> None:
    from ckptio.redact import redact_url

    url = "s3://AKIAXXXX:supersecret@bucket/prefix?region=us-east-1&secret_key=abc&token=zzz"
    clean = redact_url(url)
    assert "supersecret" not in clean and "AKIAXXXX" not in clean
    assert "abc" not in clean and "zzz" not in clean and "region=us-east-1" in clean
    side = results.sidecar(
        "r",
        config={
            "url": url,
            "aws_secret_access_key": "k2",
            "env": {"AWS_SECRET_ACCESS_KEY": "k3"},
            "streams": 4,
        },
    )
    text = json.dumps(side)
    for secret in ("supersecret", "abc", "zzz", "k2", "k3"):
        assert secret not in text
    assert side["config"]["streams"] == 4
    for key in ("hostname", "cpu", "cores", "memory_bytes", "kernel", "filesystem"):
        assert key in side["machine"]
    assert "python" in side["versions"] and "numpy" in side["versions"]


def test_filesystem_type_of_a_path(tmp_path: Path) -> None:
    assert results.filesystem_type(str(tmp_path)) != ""


def test_unknown_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        results.read_results([tmp_path / "nothing.run.parquet"])
