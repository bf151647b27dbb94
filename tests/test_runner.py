"""The comparison workload runner: local-process ranks, phases, Parquet results, bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")

import ckptio
from ckptio import errors
from ckptio.checkpoint import list_steps
from ckptio.dist import SingleProcess
from ckptio.results import read_results
from ckptio.runner import RunSettings, run_workload, sweep
from ckptio.workload import make_plan


def ckptio_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptio.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def check_request_rows(out: Path, ranks: int) -> None:
    """The result files hold a row per request, of every rank, matching the run's totals."""
    res = read_results([out])
    assert res.runs.num_rows == 1
    run = res.runs.to_pylist()[0]
    assert run["ranks"] == ranks and run["preset"] == "llama3-8b"
    plan = make_plan("llama3-8b", scale=2e-4)
    assert run["checkpoint_bytes"] == plan.total_bytes
    assert run["objects"] == plan.objects
    reqs = res.requests.to_pylist()
    assert len(reqs) == run["requests"] > 0
    assert {r["rank"] for r in reqs} == set(range(ranks))
    assert {r["run_id"] for r in reqs} == {run["run_id"]}
    # every shard object was written (closed) once and read back once
    written = [r for r in reqs if r["phase"] == "write" and r["op"] == "commit"]
    read = [r for r in reqs if r["phase"] == "read" and r["op"] == "get"]
    assert len(written) == plan.objects
    assert sum(r["nbytes"] for r in read) == plan.total_bytes
    assert sum(r["nbytes"] for r in written) == plan.total_bytes
    phases = res.phases.to_pylist()
    assert {(p["rank"], p["phase"]) for p in phases} >= {
        (r, ph) for r in range(ranks) for ph in ("generate", "write", "flush", "read", "verify")
    }
    assert run["write_GBps"] > 0 and run["read_GBps"] > 0 and run["generate_GBps"] > 0
    assert run["min_rank_write_GBps"] <= run["write_GBps"] * ranks
    assert res.sidecars[0]["config"]["ranks"] == ranks


def test_run_memory_on_two_local_ranks_writes_a_row_per_request(tmp_path: Path) -> None:
    out = tmp_path / "results"
    r = ckptio_cli(
        "run",
        "memory://",
        "--preset",
        "llama3-8b",
        "--scale",
        "2e-4",
        "--ranks",
        "2",
        "--iterations",
        "1",
        "--out",
        str(out),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["peak_rss_bytes"]) == 2
    check_request_rows(out, 2)


def test_run_on_files_leaves_a_checkpoint_that_verifies(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/target"
    plan = make_plan("llama3-8b", total_size="24MiB", object_size="1MiB")
    summary = run_workload(
        url, plan, RunSettings(iterations=2, out_dir=tmp_path / "out", pause=0.01), SingleProcess()
    )
    assert len(summary.runs) == 2
    assert summary.cache in ("o_direct", "fadvise")
    # keep=last: only the second iteration's checkpoint is left, and it is a valid one
    reader = ckptio.open_checkpoint(url)
    assert reader.step == summary.steps[-1] == summary.steps[0] + 1
    assert [s.step for s in list_steps(reader.store)] == [reader.step]
    assert reader.manifest.nbytes == plan.total_bytes
    assert reader.manifest.metadata["workload"] == "llama3-8b"
    assert ckptio.verify(url) == []
    r = ckptio_cli("verify", url)
    assert r.returncode == 0, r.stderr
    assert read_results([tmp_path / "out"]).sidecars[0]["machine"]["filesystem"]
    phases = read_results([tmp_path / "out"]).phases.to_pylist()
    assert {p["cache"] for p in phases if p["phase"] == "read"} == {summary.cache}
    # a second run on the same target goes on at the next free step
    again = run_workload(url, plan, RunSettings(read=False), SingleProcess())
    assert again.steps == [summary.steps[-1] + 1]


def test_data_is_incompressible_and_unique_per_object(tmp_path: Path) -> None:
    import zlib

    url = f"file://{tmp_path}/t"
    plan = make_plan("llama3-8b", total_size="8MiB", object_size="256KiB")
    run_workload(url, plan, RunSettings(read=False), SingleProcess())
    files = sorted((tmp_path / "t").rglob("*.bin"))
    assert len(files) == plan.objects
    heads = [f.read_bytes()[:4096] for f in files]
    assert len(set(heads)) == len(heads)
    blob = files[0].read_bytes()
    assert len(zlib.compress(blob, 6)) > 0.99 * len(blob)


def _peak_rss(tmp_path: Path, size: str, name: str) -> list[int]:
    r = ckptio_cli(
        "run",
        f"file://{tmp_path}/{name}",
        "--preset",
        "llama3-8b",
        "--total-size",
        size,
        "--object-size",
        "4MiB",
        "--inflight",
        "2",
        "--ranks",
        "2",
        "--keep",
        "none",
        "--out",
        str(tmp_path / "out"),
        "--json",
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["peak_rss_bytes"]


def test_memory_per_rank_does_not_grow_with_checkpoint_size(tmp_path: Path) -> None:
    small = _peak_rss(tmp_path, "48MiB", "small")
    large = _peak_rss(tmp_path, "384MiB", "large")  # 8x larger
    for s, big in zip(small, large, strict=True):
        assert abs(big - s) <= 0.10 * s, (small, large)


def test_sweep_records_one_point_per_streams_and_part_size(tmp_path: Path) -> None:
    plan = make_plan("llama3-8b", total_size="8MiB", object_size="1MiB")
    summary = sweep(
        f"file://{tmp_path}/t",
        plan,
        RunSettings(out_dir=tmp_path / "out", read=False),
        SingleProcess(),
        streams=[1, 4],
        part_sizes=["256KiB", "1MiB"],
    )
    merged = read_results([tmp_path / "out"])
    rows = merged.runs.to_pylist()
    assert merged.sidecars[0]["machine"]["filesystem"]  # statfs type of the file:// target
    assert len(rows) == 4 and {r["kind"] for r in rows} == {"sweep"}
    assert {(r["sweep_streams"], r["sweep_part_size"]) for r in rows} == {
        (1, 256 * 1024),
        (1, 2**20),
        (4, 256 * 1024),
        (4, 2**20),
    }
    assert {r["run_id"] for r in rows} == {summary.run_id}
    assert all(r["checkpoint_bytes"] == plan.total_bytes for r in rows)


def test_cli_sweep(tmp_path: Path) -> None:
    r = ckptio_cli(
        "sweep",
        f"file://{tmp_path}/t",
        "--total-size",
        "4MiB",
        "--object-size",
        "1MiB",
        "--streams",
        "1,2",
        "--part-size",
        "1MiB",
        "--no-read",
        "--out",
        str(tmp_path / "out"),
    )
    assert r.returncode == 0, r.stderr
    assert len(read_results([tmp_path / "out"]).runs) == 2


@pytest.mark.parametrize(
    "args, words",
    [
        (["nosuch://x"], ["nosuch"]),
        (["memory://", "--preset", "llama3-9b"], ["unknown preset", "llama3-8b"]),
        (["memory://", "--scale", "0"], ["scale", "> 0"]),
        (["memory://", "--scale", "1e-4", "--ranks", "9"], ["exceeds", "8 GPUs"]),
        (["memory://", "--preset", "llama3-70b", "--gpus", "12"], ["multiple of", "8"]),
        (["memory://", "--scale", "1e-4", "--iterations", "0"], ["iterations"]),
        (["memory://", "--scale", "1e-4", "--streams", "4"], ["memory:// takes no options"]),
    ],
)
def test_cli_run_wrong_input(
    tmp_path: Path, args: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from ckptio.cli import main

    assert main(["run", *args, "--out", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    for w in words:
        assert w in err, err


def test_run_refuses_bad_options() -> None:
    plan = make_plan("llama3-8b", scale=1e-5)
    for kwargs in ({"cache": "sometimes"}, {"keep": "first"}, {"inflight": 0}, {"pause": -1.0}):
        with pytest.raises(errors.InvalidArgumentError):
            run_workload("memory://bad", plan, RunSettings(**kwargs), SingleProcess())


def test_emulated_run_is_marked_emulated(tmp_path: Path) -> None:
    plan = make_plan("llama3-8b", total_size="2MiB", object_size="1MiB")
    summary = run_workload(
        "memory://emu", plan, RunSettings(emulate="cloud-s3", out_dir=tmp_path), SingleProcess()
    )
    run = read_results([tmp_path]).runs.to_pylist()[0]
    assert run["emulated"] is True and run["profile"] == "cloud-s3"
    assert "cloud-s3" in run["target"]
    assert summary.cache == "n/a"


def test_a_failing_target_commits_nothing_and_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    plan = make_plan("llama3-8b", total_size="2MiB", object_size="1MiB")
    with pytest.raises(errors.CkptioError) as info:
        run_workload(f"file://{blocker}/ckpt", plan, None, SingleProcess())
    assert str(blocker) in str(info.value)
    r = ckptio_cli(
        "run",
        f"file://{blocker}/ckpt",
        "--total-size",
        "2MiB",
        "--ranks",
        "2",
        "--out",
        str(tmp_path / "out"),
    )
    assert r.returncode == 2 and str(blocker) in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.parquet"))


@pytest.mark.s3
def test_run_on_mock_s3_records_requests_and_leaks_no_credentials(
    s3_bucket: str, tmp_path: Path
) -> None:
    from ckptio.testing.moto import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY

    url = f"s3://{s3_bucket}/run1"
    plan = make_plan("llama3-8b", total_size="12MiB", object_size="1MiB")
    summary = run_workload(
        url,
        plan,
        RunSettings(out_dir=tmp_path, mock=True, options={"part_size": "5MiB"}),
        SingleProcess(),
    )
    res = read_results([tmp_path])
    run = res.runs.to_pylist()[0]
    assert run["mock"] is True and run["backend"].startswith("s3")
    assert run["checkpoint_bytes"] == plan.total_bytes and run["errors"] == 0
    assert res.requests.num_rows == run["requests"] > plan.objects
    assert summary.cache == "n/a"
    assert ckptio.verify(url) == []
    for f in tmp_path.iterdir():
        blob = f.read_bytes()
        assert (
            TEST_SECRET_ACCESS_KEY.encode() not in blob and TEST_ACCESS_KEY_ID.encode() not in blob
        )


def test_credentials_in_the_url_never_reach_result_files(
    tmp_path: Path, s3_bucket: str, moto_server: str
) -> None:
    plan = make_plan("llama3-8b", total_size="1MiB", object_size="1MiB")
    url = f"s3://AKIAHUNTER:hunter2@{s3_bucket}/run?endpoint_url={moto_server}"
    summary = run_workload(url, plan, RunSettings(out_dir=tmp_path, read=False), SingleProcess())
    assert "hunter" not in summary.run_id
    for f in tmp_path.iterdir():
        assert b"hunter" not in f.read_bytes(), f


def test_hashed_key_layout_spreads_objects_over_prefixes(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/t"
    plan = make_plan("llama3-8b", total_size="16MiB", object_size="256KiB")
    run_workload(url, plan, RunSettings(read=False, key_layout="hashed"), SingleProcess())
    reader = ckptio.open_checkpoint(url)
    prefixes = {k.split("/")[1] for k in reader.manifest.objects}
    assert len(reader.manifest.objects) == plan.objects
    assert len(prefixes) > plan.writing_ranks  # per object, not per rank
    assert reader.manifest.layout["key_layout"] == "hashed"
    assert ckptio.verify(url) == []


def _collectives(comm: Any, fail_rank: int = -1) -> Any:
    """Runs on every local-process rank (module level: spawned ranks import it)."""
    if comm.rank == fail_rank:
        raise RuntimeError("this rank fails on purpose")
    ranks = comm.gather({"rank": comm.rank, "size": comm.size})
    comm.barrier()
    token = comm.bcast("from-0" if comm.rank == 0 else None)
    assert token == "from-0"
    return ranks


def test_local_process_ranks_gather_and_broadcast() -> None:
    from ckptio.dist import run_local

    got = run_local(3, _collectives)
    assert got == [{"rank": r, "size": 3} for r in range(3)]


def test_a_dead_local_rank_is_reported_not_waited_for() -> None:
    from ckptio.dist import RankFailedError, run_local

    with pytest.raises(RankFailedError, match="rank 2"):
        run_local(3, _collectives, fail_rank=2)


def test_read_back_detects_damaged_data(tmp_path: Path) -> None:
    """The read phase checks every CRC32C: a store that returns a flipped byte fails the run,
    naming the object."""
    from ckptio.backends.memory import MemoryStore

    from ckptio.runner import RunSettings, _run

    class Flipping(MemoryStore):
        def read_into(self, key: str, offset: int, buffer: Any) -> int:
            n = super().read_into(key, offset, buffer)
            view = memoryview(buffer).cast("B")
            view[0] ^= 0xFF
            return n

    plan = make_plan("llama3-8b", total_size="2MiB", object_size="1MiB")
    store = Flipping("memory://flip")
    with pytest.raises(errors.CorruptCheckpointError, match=r"rank-00000-000-.*CRC32C mismatch"):
        _run(
            store,
            "memory://flip",
            plan,
            SingleProcess(),
            RunSettings(label="flip", write_files=False),
        )


def test_restore_says_when_the_filesystem_refused_o_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restore asked for O_DIRECT, the filesystem refused it on the way and the store read
    through the page cache: the phase says ``none``, not ``o_direct``, and later reads stay
    buffered."""
    import fcntl

    from ckptio.backends import local

    if not local.O_DIRECT:
        pytest.skip("no O_DIRECT on this platform")
    real = local.os.preadv

    def refuse(fd: int, *args: Any) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & local.O_DIRECT:
            raise OSError(22, "Invalid argument")
        return real(fd, *args)

    monkeypatch.setattr(local.os, "preadv", refuse)
    plan = make_plan("llama3-8b", total_size="16MiB", object_size="2MiB")
    summary = run_workload(
        f"file://{tmp_path}/t", plan, RunSettings(cache="o_direct", iterations=2), SingleProcess()
    )
    assert summary.cache == "none"
    assert {p["cache"] for p in summary.phases if p["phase"] == "read"} == {"none"}


def test_results_record_the_clients_of_the_store_they_ran_on(tmp_path: Path) -> None:
    """The sidecar's versions: ckptio's own packages and the store's client libraries
    (``Store.client_versions``), not every client installed."""
    plan = make_plan("llama3-8b", total_size="2MiB", object_size="1MiB")
    run_workload("memory://clients", plan, RunSettings(out_dir=tmp_path / "out"), SingleProcess())
    versions = read_results([tmp_path / "out"]).sidecars[0]["versions"]
    assert {"ckptio", "numpy", "python"} <= set(versions)
    assert not {"botocore", "boto3", "s3fs", "obstore"} & set(versions)


def test_the_first_write_is_timed_warm(tmp_path: Path) -> None:
    """What a run imports on first need (ml_dtypes for bfloat16 weights: about a second on a
    busy 2-core machine) is imported before the first write phase starts its clock, so the
    first iteration measures the storage, not the import. A fresh interpreter, since this
    test process has imported it already."""
    code = f"""
import sys
import ckptio.runner.phases as R
from ckptio.dist import SingleProcess
from ckptio.workload import make_plan
seen = []
write = R.Run.write
def spy(self, *a, **k):
    seen.append("ml_dtypes" in sys.modules)
    return write(self, *a, **k)
R.Run.write = spy
R.run_workload({str(tmp_path / "ckpt")!r}, make_plan("llama3-8b", total_size=2**20),
               R.RunSettings(read=False), SingleProcess())
print(seen)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[True]", out.stdout + out.stderr


@pytest.mark.parametrize("layout", ["file-per-shard", "shared-file"])
def test_the_run_and_save_write_through_one_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """The runner saves through the library's pipeline (issue 31), in either layout: a
    change to the library's writer (here one that refuses every object) is seen by
    ``ckptio.save`` and by ``run_workload`` alike, each committing nothing; unchanged, both
    write through it."""
    import numpy as np

    from ckptio.checkpoint import write

    real_objects, real_pwrite = write.write_rank_shards, write.pwrite_pieces
    calls: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError(5, "Input/output error (injected into the library's writer)")

    def spy_objects(*args: Any, **kwargs: Any) -> Any:
        calls.append("objects")
        return real_objects(*args, **kwargs)

    def spy_pwrite(*args: Any, **kwargs: Any) -> Any:
        calls.append("pwrite")
        return real_pwrite(*args, **kwargs)

    plan = make_plan("llama3-8b", total_size="4MiB", object_size="1MiB")
    state = {"w": np.arange(1024, dtype=np.float32)}
    lib, suite = f"file://{tmp_path}/lib", f"file://{tmp_path}/suite"
    settings = RunSettings(read=False, layout=layout, write_files=False)
    monkeypatch.setattr(write, "write_rank_shards", refuse)
    monkeypatch.setattr(write, "pwrite_pieces", refuse)
    with pytest.raises(errors.SaveFailedError, match=r"nothing committed.*injected"):
        ckptio.Checkpointer(lib, layout=layout).save(state, 1)
    with pytest.raises(errors.SaveFailedError, match=r"nothing committed.*injected"):
        run_workload(suite, plan, settings, SingleProcess())
    for url in (lib, suite):
        with ckptio.open_store(url) as store:
            assert list_steps(store) == [], url
    monkeypatch.setattr(write, "write_rank_shards", spy_objects)
    monkeypatch.setattr(write, "pwrite_pieces", spy_pwrite)
    ckptio.Checkpointer(lib, layout=layout).save(state, 1)
    saved = len(calls)
    run_workload(suite, plan, settings, SingleProcess())
    want = "objects" if layout == "file-per-shard" else "pwrite"
    assert saved >= 1 and len(calls) > saved and set(calls) == {want}
    assert ckptio.verify(lib) == [] and ckptio.verify(suite) == []
