"""torch.distributed.checkpoint through ckptio's StorageWriter / StorageReader.

Multi-rank tests run a real ``torchrun --standalone --nproc-per-node 2`` (gloo, CPU) on
``file://`` and on ``s3://`` (a moto server started by the test); each rank holds its own
shard of DTensors (float32 and bfloat16, one of them unevenly split), so the checkpoint is
truly written by two ranks, and this process then loads it in one (DCP resharding).

``memory://`` lives inside one process, so two torchrun ranks cannot share it; what it can
do — ``dcp.save`` / ``dcp.load`` / ``dcp.async_save`` in a single process — is tested here
in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402  (a BaseException)

import ckptio  # noqa: E402
import ckptio.registry  # noqa: E402
from ckptio import errors  # noqa: E402
from ckptio.torch import StorageReader, StorageWriter  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    # dcp.save/load without a process group says so with a UserWarning; that is what we want
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

SHAPES = {"w32": ((64, 8), torch.float32), "bf16": ((33, 5), torch.bfloat16)}


def _full(name: str) -> torch.Tensor:
    """The global value of tensor ``name`` (the same in every process)."""
    shape, dtype = SHAPES[name]
    g = torch.Generator().manual_seed(len(name) * 7919)
    return torch.randn(shape, generator=g).to(dtype)


WORKER = textwrap.dedent(
    """
    import json, sys
    import torch, torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from ckptio.torch import StorageReader, StorageWriter

    SHAPES = {"w32": ((64, 8), torch.float32), "bf16": ((33, 5), torch.bfloat16)}

    def full(name):
        shape, dtype = SHAPES[name]
        g = torch.Generator().manual_seed(len(name) * 7919)
        return torch.randn(shape, generator=g).to(dtype)

    root = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    state = {n: distribute_tensor(full(n), mesh, [Shard(0)]) for n in SHAPES}
    state["replicated"] = torch.arange(10, dtype=torch.float32)
    state["extra"] = {"step": 100, "note": "two ranks"}

    # 1. dcp.save through ckptio, then dcp.load back into fresh DTensors on both ranks
    dcp.save(state, storage_writer=StorageWriter(root + "/step-1"))
    back = {n: distribute_tensor(torch.zeros(SHAPES[n][0], dtype=SHAPES[n][1]), mesh, [Shard(0)]) for n in SHAPES}
    back["replicated"] = torch.zeros(10)
    back["extra"] = {"step": 0, "note": ""}
    dcp.load(back, storage_reader=StorageReader(root + "/step-1", allow_pickle=True))
    ok = all(torch.equal(back[n].to_local(), state[n].to_local()) for n in SHAPES)
    ok = ok and torch.equal(back["replicated"], state["replicated"]) and back["extra"] == state["extra"]

    # 2. dcp.async_save through ckptio (its own gloo group for the background collectives)
    group = dist.new_group(backend="gloo")
    fut = dcp.async_save(state, storage_writer=StorageWriter(root, step=2), process_group=group)
    fut.result()
    back2 = {n: distribute_tensor(torch.zeros(SHAPES[n][0], dtype=SHAPES[n][1]), mesh, [Shard(0)]) for n in SHAPES}
    dcp.load(back2, storage_reader=StorageReader(root, step=2, allow_pickle=True))
    ok = ok and all(torch.equal(back2[n].to_local(), state[n].to_local()) for n in SHAPES)
    # one file per rank: the two ranks' stdout lines can interleave under torchrun
    report = {"rank": rank, "ok": bool(ok), "local_rows": state["bf16"].to_local().shape[0]}
    with open(f"report-{rank}.json", "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def _torchrun(tmp_path: Path, root: str, env: dict[str, str] | None = None) -> list[dict]:
    script = tmp_path / "dcp_worker.py"
    script.write_text(WORKER)
    run_env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            root,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=run_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("report-*.json"))]
    assert sorted(r["rank"] for r in reports) == [0, 1], proc.stdout
    return reports


def _check_loads_in_one_process(root: str) -> None:
    """The 2-rank checkpoint read by 1 process: DCP reshards the shards into whole tensors;
    ckptio.load reads the same step torch-free (numpy) and every CRC verifies."""
    for step in (1, 2):
        whole = {n: torch.zeros(SHAPES[n][0], dtype=SHAPES[n][1]) for n in SHAPES}
        whole["replicated"] = torch.zeros(10)
        dcp.load(
            whole, storage_reader=StorageReader(root, step=step, allow_pickle=True), no_dist=True
        )
        for n in SHAPES:
            assert torch.equal(whole[n], _full(n)), n
        assert torch.equal(whole["replicated"], torch.arange(10, dtype=torch.float32))
        m = ckptio.open_checkpoint(root, step).manifest
        assert m.world_size == 2
        # each sharded tensor has a chunk from each rank: it really was written by two ranks
        assert len(m.tensors["w32"].chunks) == 2
        assert {c.key.split("-")[1] for c in m.tensors["bf16"].chunks} == {"00000", "00001"}
        assert ckptio.verify(root, step) == []
    state = ckptio.load(root, step=1)
    np.testing.assert_array_equal(
        state["bf16"].view(np.int16), _full("bf16").view(torch.int16).numpy()
    )


@pytest.mark.slow
def test_torchrun_two_ranks_file(tmp_path: Path) -> None:
    root = f"file://{tmp_path}/ckpt"
    reports = _torchrun(tmp_path, root)
    assert all(r["ok"] for r in reports), reports
    assert sorted(r["local_rows"] for r in reports) == [16, 17]  # 33 rows split unevenly
    _check_loads_in_one_process(root)


@pytest.mark.slow
@pytest.mark.s3
def test_torchrun_two_ranks_s3(tmp_path: Path, s3_bucket: str, s3_env: dict[str, str]) -> None:
    root = f"s3://{s3_bucket}/run"
    reports = _torchrun(tmp_path, root, env=s3_env)
    assert all(r["ok"] for r in reports), reports
    _check_loads_in_one_process(root)


# -- single process --------------------------------------------------------------------------


def _state() -> dict:
    return {
        "model": {"w": torch.randn(128, 16), "b": torch.randn(16, dtype=torch.bfloat16)},
        "scalar": torch.tensor(2.5),
        "meta": {"step": 7, "lr": 0.25, "tags": ["a", "b"]},
    }


def _zeros_like(state: dict) -> dict:
    return {
        "model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
        "scalar": torch.tensor(0.0),
        "meta": {"step": 0, "lr": 0.0, "tags": []},
    }


def _assert_same(a: dict, b: dict) -> None:
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert torch.equal(a["scalar"], b["scalar"])
    assert a["meta"] == b["meta"]


def test_memory_single_process_save_load_async(memory_url: str) -> None:
    state = _state()
    dcp.save(state, storage_writer=StorageWriter(f"{memory_url}/run/step-5"), no_dist=True)
    out = _zeros_like(state)
    dcp.load(
        out,
        storage_reader=StorageReader(f"{memory_url}/run/step-5", allow_pickle=True),
        no_dist=True,
    )
    _assert_same(state, out)

    fut = dcp.async_save(
        state, storage_writer=StorageWriter(f"{memory_url}/run", step=6), no_dist=True
    )
    fut.result()
    out = _zeros_like(state)
    dcp.load(
        out, storage_reader=StorageReader(f"{memory_url}/run", allow_pickle=True), no_dist=True
    )  # newest: 6
    _assert_same(state, out)
    assert ckptio.Checkpointer(f"{memory_url}/run").steps() == [5, 6]


def test_manifest_is_json_with_dcp_metadata_and_no_pickle(tmp_path: Path) -> None:
    state = _state()
    dcp.save(state, storage_writer=StorageWriter(str(tmp_path), step=3), no_dist=True)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files[-1] == "step-0000000003/manifest.json" and all(
        f.startswith("step-0000000003/data/rank-00000-") for f in files[:-1]
    )
    doc = json.loads((tmp_path / "step-0000000003/manifest.json").read_bytes())
    md = doc["extra"]["dcp"]["state_dict_metadata"]
    assert md["model.b"]["dtype"] == "bfloat16" and md["model.b"]["chunks"] == [[[0], [16]]]
    assert md["meta.step"] == {"type": "bytes"}
    # tensors are stored raw: the bytes in the object at the chunk are the tensor's own
    chunk = doc["tensors"]["model.w"]["chunks"][0]
    raw = (tmp_path / "step-0000000003" / chunk["key"]).read_bytes()[
        chunk["offset"] : chunk["offset"] + chunk["length"]
    ]
    assert raw == state["model"]["w"].numpy().tobytes()
    # ckptio reads it torch-free, and without unpickling the byte items
    loaded = ckptio.load(str(tmp_path), step=3)
    assert set(loaded) == {"model.w", "model.b", "scalar"}


def test_reader_refuses_pickled_items_when_asked(tmp_path: Path) -> None:
    state = _state()
    dcp.save(state, storage_writer=StorageWriter(str(tmp_path), step=1), no_dist=True)
    out = _zeros_like(state)
    with pytest.raises(CheckpointException, match="allow_pickle=False"):
        dcp.load(
            out,
            storage_reader=StorageReader(str(tmp_path), step=1, allow_pickle=False),
            no_dist=True,
        )
    tensors_only = {"model": _zeros_like(state)["model"]}
    dcp.load(
        tensors_only,
        storage_reader=StorageReader(str(tmp_path), step=1, allow_pickle=False),
        no_dist=True,
    )
    assert torch.equal(tensors_only["model"]["w"], state["model"]["w"])


def test_committed_step_is_overwritten_as_dcp_does_unless_refused(tmp_path: Path) -> None:
    """overwrite defaults to True, DCP's FileSystemWriter default; overwrite=False refuses."""
    state = _state()
    url = f"{tmp_path}/step-1"
    dcp.save(state, storage_writer=StorageWriter(url), no_dist=True)
    before = (tmp_path / "step-0000000001/manifest.json").read_bytes()
    changed = _state()
    with pytest.raises(CheckpointException, match="already a committed checkpoint"):
        dcp.save(changed, storage_writer=StorageWriter(url, overwrite=False), no_dist=True)
    assert (tmp_path / "step-0000000001/manifest.json").read_bytes() == before
    assert ckptio.verify(str(tmp_path), 1) == []
    dcp.save(changed, storage_writer=StorageWriter(url), no_dist=True)
    out = _zeros_like(state)
    dcp.load(out, storage_reader=StorageReader(url, allow_pickle=True), no_dist=True)
    _assert_same(changed, out)
    # the replaced step's objects are gone; only the new manifest's remain
    m = ckptio.open_checkpoint(str(tmp_path), 1).manifest
    on_disk = {
        p.relative_to(tmp_path / "step-0000000001").as_posix()
        for p in (tmp_path / "step-0000000001/data").iterdir()
    }
    assert on_disk == set(m.objects)


def test_damaged_object_is_detected_on_load(tmp_path: Path) -> None:
    state = _state()
    dcp.save(state, storage_writer=StorageWriter(str(tmp_path), step=1), no_dist=True)
    m = ckptio.open_checkpoint(str(tmp_path), 1).manifest
    chunk = m.tensors["model.w"].chunks[0]
    path = tmp_path / "step-0000000001" / chunk.key
    data = bytearray(path.read_bytes())
    data[chunk.offset + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointException, match="CRC32C mismatch"):
        dcp.load(
            _zeros_like(state),
            storage_reader=StorageReader(str(tmp_path), step=1, allow_pickle=True),
            no_dist=True,
        )


def test_checkpoint_id_forms_and_errors(tmp_path: Path) -> None:
    assert StorageWriter.validate_checkpoint_id(f"file://{tmp_path}/step-12")
    assert StorageWriter.validate_checkpoint_id("memory://x/run/step-0")
    assert StorageWriter.validate_checkpoint_id(
        f"{tmp_path}/no-step-here"
    )  # DCP's any-directory form
    assert not StorageWriter.validate_checkpoint_id("nosuchscheme://b/step-1")
    w = StorageWriter(f"file://{tmp_path}/run/step-12")
    assert w.step == 12 and w.checkpoint_id.endswith("run/step-0000000012")
    w.reset(f"file://{tmp_path}/run/step-13")
    assert w.step == 13
    w.reset(f"file://{tmp_path}/epoch5")  # names no step: a root holding one checkpoint, step 0
    assert w.step == 0 and w.checkpoint_id.endswith("epoch5/step-0000000000")
    ckptio.save({"w": np.zeros(3)}, str(tmp_path), step=4)
    with pytest.raises(
        errors.ManifestError, match=r"not written by torch\.distributed\.checkpoint"
    ):
        StorageReader(str(tmp_path), step=4).read_metadata()
    with pytest.raises(FileNotFoundError):
        StorageReader(str(tmp_path), step=99).read_metadata()


def test_unsupported_dtype_is_refused_with_the_valid_list(tmp_path: Path) -> None:
    with pytest.raises(CheckpointException, match="cannot be checkpointed by ckptio; supported"):
        dcp.save(
            {"c": torch.zeros(2, dtype=torch.float8_e4m3fnuz)},
            storage_writer=StorageWriter(str(tmp_path), step=1),
            no_dist=True,
        )
    assert not (tmp_path / "step-0000000001/manifest.json").exists()


def test_writer_survives_being_sent_to_a_worker_process(tmp_path: Path) -> None:
    """dcp.async_save(async_checkpointer_type=PROCESS) pickles the writer to hand it to its
    worker (DCP's in-memory transport, not storage): the store is reopened on the other side."""
    import pickle

    w = pickle.loads(pickle.dumps(StorageWriter(f"file://{tmp_path}", step=2)))
    state = _state()
    dcp.save(state, storage_writer=w, no_dist=True)
    out = _zeros_like(state)
    dcp.load(
        out, storage_reader=StorageReader(f"file://{tmp_path}", allow_pickle=True), no_dist=True
    )
    _assert_same(state, out)


def test_failed_save_commits_nothing_and_keeps_the_previous_step(
    memory_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state()
    dcp.save(state, storage_writer=StorageWriter(memory_url, step=1), no_dist=True)
    writer = StorageWriter(memory_url, step=2)

    def broken(key: str, *, size_hint: int | None = None) -> None:
        raise errors.NoSpaceError(f"{key}: no space left (injected)")

    monkeypatch.setattr(writer.store, "open_writer", broken)
    with pytest.raises(CheckpointException, match="no space left"):
        dcp.save(_state(), storage_writer=writer, no_dist=True)
    assert ckptio.Checkpointer(memory_url).steps() == [1]
    out = _zeros_like(state)
    dcp.load(out, storage_reader=StorageReader(memory_url, allow_pickle=True), no_dist=True)
    _assert_same(state, out)


AUDIT = textwrap.dedent(
    """
    import sys, warnings
    from fractions import Fraction  # an object only a pickle can carry
    warnings.filterwarnings("ignore")
    import torch, torch.distributed.checkpoint as dcp
    import ckptio.torch
    from ckptio.torch import StorageReader, StorageWriter
    root = sys.argv[1]
    dcp.save({"w": torch.ones(4), "meta": {"ratio": Fraction(1, 3)}}, storage_writer=StorageWriter(root, step=1), no_dist=True)
    events = []
    sys.addaudithook(lambda name, args: events.append(name) if name == "pickle.find_class" else None)
    def count(fn):
        events.clear(); fn(); return len(events)
    w = {"w": torch.zeros(4)}
    print("tensors", count(lambda: dcp.load(w, storage_reader=StorageReader(root, step=1, allow_pickle=True), no_dist=True)))
    print("ckptio", count(lambda: ckptio.torch.load(root, step=1)))
    both = {"w": torch.zeros(4), "meta": {"ratio": None}}
    print("bytes", count(lambda: dcp.load(both, storage_reader=StorageReader(root, step=1, allow_pickle=True), no_dist=True)))
    assert both["meta"]["ratio"] == Fraction(1, 3) and bool((w["w"] == 1).all())
    """
)


def test_only_dcp_byte_items_are_ever_unpickled(tmp_path: Path) -> None:
    """Audit hook on ``pickle.find_class`` in a fresh process: loading tensors through the
    StorageReader, or the step through ckptio.torch.load, unpickles nothing; only DCP's own
    byte items (non-tensor values) are unpickled, by DCP's planner, when dcp.load asks."""
    script = tmp_path / "audit.py"
    script.write_text(AUDIT)
    proc = subprocess.run(
        [sys.executable, str(script), f"file://{tmp_path}/ck"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = dict(line.split() for line in proc.stdout.splitlines())
    assert counts["tensors"] == "0" and counts["ckptio"] == "0"
    assert int(counts["bytes"]) > 0  # the hook does see DCP's torch.load of the byte items


# -- retention, leases and debris on the DCP path ---------------------------------------------

KILLED = textwrap.dedent(
    """
    import os, signal, sys
    import torch, torch.distributed.checkpoint as dcp
    from ckptio.torch import StorageWriter

    state = {"a": torch.arange(100000, dtype=torch.float32), "b": torch.ones(100000)}
    w = StorageWriter(sys.argv[1], max_object_size=262144)
    real_open = w.store.open_writer
    opened = []

    def open_writer(key, **kw):
        opened.append(key)
        wr = real_open(key, **kw)
        if len(opened) == 2:  # the second object: part of it is written, then the process dies
            real_write = wr.write
            def write(data):
                real_write(memoryview(data)[:4096])
                os.kill(os.getpid(), signal.SIGKILL)
            wr.write = write
        return wr

    w.store.open_writer = open_writer
    dcp.async_save(state, storage_writer=w).result()
    """
)


def _killed_async_save(tmp_path: Path, checkpoint_id: str) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    proc = subprocess.run(
        [sys.executable, str(script), checkpoint_id], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -9, proc.stderr[-3000:]


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_killed_async_save_debris_is_removed_by_gc(tmp_path: Path) -> None:
    """A dcp.async_save SIGKILLed mid-write leaves a whole object, a temp file and its dead
    lease; ``ckptio gc`` (default options) removes all of it at once: the lease proves the
    save is over, whatever the temp file's age."""
    root = tmp_path / "run"
    _killed_async_save(tmp_path, f"{root}/step-1")
    left = _files(root)
    assert any("ckptio-tmp" in f for f in left) and any(f.endswith(".bin") for f in left), left
    proc = subprocess.run(
        [sys.executable, "-m", "ckptio.cli", "gc", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert _files(root) == set(), proc.stdout


def test_a_resave_of_a_killed_async_save_cleans_its_debris(tmp_path: Path) -> None:
    """Saved again after the kill, the step holds exactly its manifest and the objects it
    names: no orphan object, temp file or lease of the killed save, and ``ckptio gc`` has
    nothing left to list."""
    root = tmp_path / "epoch5"  # DCP's form: a directory that names no step
    _killed_async_save(tmp_path, str(root))
    state = {"a": torch.arange(100000, dtype=torch.float32), "b": torch.ones(100000)}
    dcp.save(state, storage_writer=StorageWriter(root, max_object_size=262144), no_dist=True)
    m = ckptio.open_checkpoint(str(root)).manifest
    assert _files(root) == {"step-0000000000/manifest.json"} | {
        f"step-0000000000/{k}" for k in m.objects
    }
    proc = subprocess.run(
        [sys.executable, "-m", "ckptio.cli", "gc", "--dry-run", "--json", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(proc.stdout)
    assert doc["removed"] == [] and doc["incomplete_left"] == 0, doc
    out = {"a": torch.zeros(100000), "b": torch.zeros(100000)}
    dcp.load(out, storage_reader=StorageReader(root), no_dist=True)
    assert torch.equal(out["a"], state["a"]) and torch.equal(out["b"], state["b"])


def test_keep_last_retires_older_dcp_checkpoints(tmp_path: Path) -> None:
    root = f"file://{tmp_path}"
    for step in range(1, 5):
        dcp.save(
            {"w": torch.full((4,), float(step))},
            storage_writer=StorageWriter(root, step=step, keep_last=2),
            no_dist=True,
        )
    assert ckptio.Checkpointer(root).steps() == [3, 4]
    # retired steps keep their data for readers for the grace period (default 60 s)
    assert (tmp_path / "step-0000000001/retired.json").exists()
    dcp.save(
        {"w": torch.full((4,), 5.0)},
        storage_writer=StorageWriter(f"{root}/step-5", keep_last=2, retire_grace=0),
        no_dist=True,
    )
    assert ckptio.Checkpointer(root).steps() == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-0000000004", "step-0000000005"]
    out = {"w": torch.zeros(4)}
    dcp.load(out, storage_reader=StorageReader(root), no_dist=True)
    assert torch.equal(out["w"], torch.full((4,), 5.0))


def test_writer_holds_a_lease_from_before_the_first_write_until_the_commit(tmp_path: Path) -> None:
    writer = StorageWriter(f"file://{tmp_path}", step=1)
    real_open, real_publish = writer.store.open_writer, writer.store.publish
    seen: dict[str, list[str]] = {}

    def leases() -> list[str]:
        return [k for k in writer.store.list("step-0000000001/") if "/saving-" in k]

    def open_writer(key: str, **kw: Any) -> Any:
        seen.setdefault("write", leases())
        return real_open(key, **kw)

    def publish(key: str, data: bytes, **kw: Any) -> None:
        if key.endswith("manifest.json"):
            seen["commit"] = leases()
        real_publish(key, data, **kw)

    writer.store.open_writer = open_writer  # type: ignore[method-assign]
    writer.store.publish = publish  # type: ignore[method-assign]
    dcp.save({"w": torch.ones(4)}, storage_writer=writer, no_dist=True)
    assert len(seen["write"]) == 1 and seen["commit"] == seen["write"]
    assert leases() == []  # released after the commit


def test_a_failed_write_releases_the_lease(
    memory_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = StorageWriter(memory_url, step=1)

    def broken(key: str, *, size_hint: int | None = None) -> None:
        raise errors.NoSpaceError(f"{key}: no space left (injected)")

    monkeypatch.setattr(writer.store, "open_writer", broken)
    with pytest.raises(CheckpointException, match="no space left"):
        dcp.save({"w": torch.ones(4)}, storage_writer=writer, no_dist=True)
    assert [k for k in writer.store.list("") if "/saving-" in k] == []


def test_an_object_gone_before_the_commit_is_never_named_by_a_manifest(tmp_path: Path) -> None:
    class Losing(StorageWriter):
        def finish(self, metadata: Any, results: list[list[Any]]) -> None:
            victim = next(k for k in self.store.list("step-0000000001/data/"))
            self.store.delete([victim])  # as a gc elsewhere would
            super().finish(metadata, results)

    with pytest.raises(CheckpointException, match="lost 1 object\\(s\\) before its commit"):
        dcp.save({"w": torch.ones(4)}, storage_writer=Losing(str(tmp_path), step=1), no_dist=True)
    assert ckptio.Checkpointer(str(tmp_path)).steps() == []
    assert [k for k in ckptio.registry.open_store(str(tmp_path)).list("") if "/saving-" in k] == []


def test_filesystemwriter_keywords_are_taken_and_mapped(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat

    kwargs = {
        "single_file_per_rank": False,
        "sync_files": False,
        "thread_count": 4,
        "per_thread_copy_ahead": 0,
        "cache_staged_state_dict": False,
        "overwrite": True,
    }
    FileSystemWriter(tmp_path / "dcp", **kwargs)  # the same keywords DCP's writer takes
    w = StorageWriter(tmp_path / "ck", max_object_size=4096, **kwargs)
    assert w.overwrite and w.thread_count == 4 and w.store.fsync is False
    state = {f"t{i}": torch.full((1024,), float(i)) for i in range(8)}
    dcp.save(state, storage_writer=w, no_dist=True)
    assert len(ckptio.open_checkpoint(str(tmp_path / "ck")).manifest.objects) == 8  # 4 KiB each
    out = {k: torch.zeros(1024) for k in state}
    dcp.load(out, storage_reader=StorageReader(tmp_path / "ck"), no_dist=True)
    assert all(torch.equal(out[k], state[k]) for k in state)
    assert StorageWriter(tmp_path / "x").store.fsync is True
    StorageWriter(tmp_path / "x", serialization_format=SerializationFormat.TORCH_SAVE)
    with pytest.raises(errors.InvalidArgumentError, match="serialization_format"):
        StorageWriter(tmp_path / "x", serialization_format=SerializationFormat.SAFETENSORS)
    with pytest.raises(errors.InvalidArgumentError, match="_extensions"):
        StorageWriter(tmp_path / "x", _extensions=[object()])


HOSTILE_DCP = {
    # DCP reads only the boxes listed: one outside the tensor, or a gap, loaded wrong data
    "box-outside": (
        ("state_dict_metadata", "model.w", "chunks"),
        [[[64, 0], [128, 16]]],
        r"\['model.w'\]\.chunks\[0\]: a box of \[128, 16\] at \[64, 0\] does not fit",
    ),
    "no-boxes": (
        ("state_dict_metadata", "model.w", "chunks"),
        [],
        r"\['model.w'\]\.chunks: the boxes hold 0 elements, the tensor 2048",
    ),
    "overlap": (
        ("state_dict_metadata", "model.w", "chunks"),
        [[[0, 0], [64, 16]], [[32, 0], [64, 16]]],  # as many elements as the tensor, a gap
        r"\['model.w'\]\.chunks: chunks at \[0, 0\] and \[32, 0\] overlap",
    ),
    # a dict where a list belongs, a 3-element item, a string
    "dict-chunks": (
        ("state_dict_metadata", "model.w", "chunks"),
        {"0": 1},
        "chunks: expected a list",
    ),
    "3-item": (
        ("state_dict_metadata", "model.w", "chunks"),
        [[[0, 0], [128, 16], [1]]],
        r"chunks\[0\]: expected \[offsets, sizes\]",
    ),
    "string": (("state_dict_metadata",), "model.w", "state_dict_metadata: expected an object"),
    "flag": (
        ("state_dict_metadata", "model.w", "requires_grad"),
        "no",
        "requires_grad: expected true or false",
    ),
    "save-id": (
        ("storage_meta", "save_id"),
        {"a": 1},
        "storage_meta.save_id: expected a string or null, got dict",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE_DCP))
def test_hostile_dcp_metadata_is_refused_naming_the_field(tmp_path: Path, name: str) -> None:
    """DCP's metadata inside a ckptio manifest, spoiled: read_metadata refuses it with a
    ManifestError naming the field under extra.dcp, and dcp.load fails with it, rather than
    loading a tensor partly or from the wrong box."""
    state = _state()
    dcp.save(state, storage_writer=StorageWriter(str(tmp_path), step=1), no_dist=True)
    where, value, says = HOSTILE_DCP[name]
    path = tmp_path / "step-0000000001" / "manifest.json"
    doc = json.loads(path.read_bytes())
    node = doc["extra"]["dcp"]
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(errors.ManifestError, match=r"extra\.dcp\..*" + says):
        StorageReader(str(tmp_path), step=1).read_metadata()
    with pytest.raises(CheckpointException, match=says):
        dcp.load(_zeros_like(state), storage_reader=StorageReader(str(tmp_path)), no_dist=True)
