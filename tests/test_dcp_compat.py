"""ckptio's StorageWriter/StorageReader as drop-ins for DCP's FileSystemWriter/FileSystemReader.

Each scenario runs twice, side by side — once through DCP's own ``FileSystemWriter`` /
``FileSystemReader`` and once through ckptio's ``StorageWriter`` / ``StorageReader``, built
with the same arguments — and the two outcomes (what ``dcp.load`` fills in, or the error class
a save/load raises) must be equal to each other and to what was saved.

The one deliberate difference in these scenarios: ckptio's reader refuses DCP's pickled byte
items (a state dict's non-tensor values) unless ``allow_pickle=True``, so the ckptio side
passes it (docs/training.md lists every deliberate difference). Most scenarios run in one
process (``no_dist=True``); ``test_two_ranks_and_resharded_loads`` runs 2 real ranks
(torchrun, gloo, CPU): saved by 2 ranks, loaded by 2 with the same and another sharding, saved
by 1 and loaded by 2, saved by 2 and loaded by 1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner  # noqa: E402

from ckptio.torch import StorageReader, StorageWriter  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
    # FileSystemWriter announces that it overwrites, which is the scenario
    pytest.mark.filterwarnings("ignore:Detected an existing checkpoint:UserWarning"),
]

KINDS = ("dcp", "ckptio")


def _writer(kind: str, path: Path, **kw: Any) -> Any:
    return FileSystemWriter(path, **kw) if kind == "dcp" else StorageWriter(path, **kw)


def _reader(kind: str, path: Path) -> Any:
    return FileSystemReader(path) if kind == "dcp" else StorageReader(path, allow_pickle=True)


def _canon(obj: Any) -> Any:
    """A comparable form: tensors as (dtype, shape, bytes); containers recursively."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().contiguous().reshape(-1)
        return (
            "tensor",
            str(obj.dtype),
            tuple(obj.shape),
            t.view(torch.uint8).numpy().tobytes() if t.numel() else b"",
        )
    if isinstance(obj, dict):
        return {k: _canon(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_canon(v) for v in obj]
    return obj


def _zeros(obj: Any) -> Any:
    """A load target shaped like ``obj``: zero tensors, placeholder scalars."""
    if isinstance(obj, torch.Tensor):
        return torch.zeros_like(obj.contiguous())
    if isinstance(obj, dict):
        return {k: _zeros(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_zeros(v) for v in obj]
    return None if not isinstance(obj, int | float | str) else type(obj)()


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", _canon(fn()))
    except BaseException as err:  # CheckpointException is a BaseException
        return ("error", type(err).__name__)


def _side_by_side(tmp_path: Path, scenario: Callable[[str, Path], Any]) -> Any:
    results = {}
    for kind in KINDS:
        (tmp_path / kind).mkdir()
        results[kind] = scenario(kind, tmp_path / kind)
    assert results["ckptio"] == results["dcp"]
    return results["dcp"]


def _roundtrip(kind: str, path: Path, state: dict[str, Any], **load_kw: Any) -> Any:
    dcp.save(state, storage_writer=_writer(kind, path / "ckpt"), no_dist=True)
    out = _zeros(state)
    dcp.load(out, storage_reader=_reader(kind, path / "ckpt"), no_dist=True, **load_kw)
    return out


DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def _every_dtype() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    state: dict[str, Any] = {}
    for dt in DTYPES:
        base = torch.randn(6, 5, generator=g) * 10
        state[str(dt).removeprefix("torch.")] = base.to(dt) if dt != torch.bool else base > 0
    state["scalar0d"] = torch.tensor(3.5)
    state["transposed"] = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous
    state["empty"] = torch.zeros(0, 3)
    return state


def test_every_dtype_0d_empty_and_strided_tensors(tmp_path: Path) -> None:
    state = _every_dtype()
    got = _side_by_side(tmp_path, lambda kind, p: _outcome(lambda: _roundtrip(kind, p, state)))
    assert got == ("ok", _canon(state))


def test_nested_containers_and_non_tensor_values(tmp_path: Path) -> None:
    state = {
        "model": {"enc": {"w": torch.randn(4, 3), "b": torch.randn(3)}, "head": torch.randn(2)},
        "list": [torch.arange(5), {"x": torch.ones(2, 2)}],
        "optim": {
            "state": {0: {"exp_avg": torch.randn(4, 3), "step": torch.tensor(7.0)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "epoch": 3,
        "name": "run-a",
    }
    got = _side_by_side(tmp_path, lambda kind, p: _outcome(lambda: _roundtrip(kind, p, state)))
    assert got == ("ok", _canon(state))


def test_empty_state_dict(tmp_path: Path) -> None:
    got = _side_by_side(tmp_path, lambda kind, p: _outcome(lambda: _roundtrip(kind, p, {})))
    assert got == ("ok", {})


def test_overwrite_of_an_existing_checkpoint_id(tmp_path: Path) -> None:
    """Saving to the same directory again replaces it (DCP's default overwrite=True);
    overwrite=False refuses, and the checkpoint stays as it was."""

    def scenario(kind: str, p: Path) -> Any:
        first, second = {"w": torch.ones(4)}, {"w": torch.full((4,), 2.0)}
        dcp.save(first, storage_writer=_writer(kind, p / "c"), no_dist=True)
        dcp.save(second, storage_writer=_writer(kind, p / "c"), no_dist=True)
        refused = _outcome(
            lambda: dcp.save(
                {"w": torch.zeros(4)},
                storage_writer=_writer(kind, p / "c", overwrite=False),
                no_dist=True,
            )
        )
        out = {"w": torch.zeros(4)}
        dcp.load(out, storage_reader=_reader(kind, p / "c"), no_dist=True)
        return refused[0], _canon(out)

    assert _side_by_side(tmp_path, scenario) == ("error", _canon({"w": torch.full((4,), 2.0)}))


def test_checkpoint_id_given_to_save_and_load(tmp_path: Path) -> None:
    """``checkpoint_id`` passed to dcp.save / dcp.load retargets the writer / reader (here to
    a directory that is neither the one they were built with nor a ckptio step)."""

    state = {"w": torch.randn(3, 3), "n": 5}

    def scenario(kind: str, p: Path) -> Any:
        dcp.save(
            state,
            checkpoint_id=p / "epoch5",
            storage_writer=_writer(kind, p / "elsewhere"),
            no_dist=True,
        )
        out = _zeros(state)
        dcp.load(
            out, checkpoint_id=p / "epoch5", storage_reader=_reader(kind, p / "other"), no_dist=True
        )
        return _canon(out), (p / "epoch5").is_dir(), (p / "elsewhere").exists()

    assert _side_by_side(tmp_path, scenario) == (_canon(state), True, False)


def test_planners_and_a_partial_load(tmp_path: Path) -> None:
    """Explicit default planners; a load target with a key the checkpoint lacks loads the
    rest with ``allow_partial_load=True`` and fails without it, on both."""

    state = {"a": {"w": torch.randn(5)}, "b": torch.arange(3)}

    def scenario(kind: str, p: Path) -> Any:
        dcp.save(
            state,
            storage_writer=_writer(kind, p / "c"),
            planner=DefaultSavePlanner(flatten_state_dict=True),
            no_dist=True,
        )
        out = {
            "a": {"w": torch.zeros(5)},
            "b": torch.zeros(3, dtype=torch.int64),
            "missing": torch.zeros(2),
        }
        strict = _outcome(
            lambda: dcp.load(dict(out), storage_reader=_reader(kind, p / "c"), no_dist=True)
        )
        dcp.load(
            out,
            storage_reader=_reader(kind, p / "c"),
            planner=DefaultLoadPlanner(allow_partial_load=True),
            no_dist=True,
        )
        return strict[0], _canon(out)

    assert _side_by_side(tmp_path, scenario) == (
        "error",
        _canon({**state, "missing": torch.zeros(2)}),
    )


def test_async_save(tmp_path: Path) -> None:
    state = {"w": torch.randn(64, 8), "b": torch.randn(8).to(torch.bfloat16), "step": 11}

    def scenario(kind: str, p: Path) -> Any:
        fut = dcp.async_save(state, storage_writer=_writer(kind, p / "c"), no_dist=True)
        fut.result()
        out = _zeros(state)
        dcp.load(out, storage_reader=_reader(kind, p / "c"), no_dist=True)
        return _canon(out)

    assert _side_by_side(tmp_path, scenario) == _canon(state)


# -- two ranks and resharded loads (real processes: torchrun, gloo, CPU) ---------------------------

SHARDED = {"w32": ((64, 8), "float32"), "bf16": ((33, 5), "bfloat16"), "i64": ((9, 6), "int64")}
"""Tensors saved as DTensors: ``bf16`` has 33 rows (split 17/16 over 2 ranks), ``i64`` 9 rows
and 6 columns (uneven when split by rows)."""

RANKS_WORKER = """
import hashlib, json, sys
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from ckptio.torch import StorageReader, StorageWriter

SHARDED = json.loads(sys.argv[2])

def full(name):
    shape, dtype = SHARDED[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    return (torch.randn(shape, generator=g) * 100).to(getattr(torch, dtype))

def digest(t):
    t = t.detach().contiguous().reshape(-1)
    raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return [str(t.dtype), hashlib.sha256(raw).hexdigest()]

root = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))

def sharded(dim, zero=False):
    return {n: distribute_tensor(torch.zeros_like(full(n)) if zero else full(n), mesh, [Shard(dim)])
            for n in SHARDED}

def writer(kind, path):
    return FileSystemWriter(path) if kind == "dcp" else StorageWriter(path)

def reader(kind, path):
    return FileSystemReader(path) if kind == "dcp" else StorageReader(path, allow_pickle=True)

report = {}
for kind in ("dcp", "ckptio"):
    out = report[kind] = {}
    state = sharded(0)
    state["replicated"] = torch.arange(10, dtype=torch.float32)  # the same on every rank
    state["extra"] = {"step": 100, "note": "two ranks"}
    dcp.save(state, storage_writer=writer(kind, f"{root}/{kind}/two"))
    for source in ("two", "one"):  # saved here by 2 ranks; saved whole by 1 process
        for dim in (0, 1):  # the plan it was saved with, and another one
            back = sharded(dim, zero=True)
            back["replicated"] = torch.zeros(10)
            back["extra"] = {"step": 0, "note": ""}
            try:
                dcp.load(back, storage_reader=reader(kind, f"{root}/{kind}/{source}"))
            except BaseException as err:  # CheckpointException is a BaseException
                out[f"{source}->shard{dim}"] = ["error", type(err).__name__]
                continue
            expect = sharded(dim)
            out[f"{source}->shard{dim}"] = {
                "local": {n: digest(back[n].to_local()) for n in SHARDED},
                "equal": all(torch.equal(back[n].to_local(), expect[n].to_local()) for n in SHARDED),
                "local_shapes": {n: list(back[n].to_local().shape) for n in SHARDED},
                "replicated": back["replicated"].tolist(),
                "extra": back["extra"],
            }
with open(f"report-{rank}.json", "w") as f:
    json.dump(report, f)
dist.barrier()
dist.destroy_process_group()
"""


def _full_sharded(name: str) -> torch.Tensor:
    shape, dtype = SHARDED[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    return (torch.randn(shape, generator=g) * 100).to(getattr(torch, dtype))


def _whole_state() -> dict[str, Any]:
    state: dict[str, Any] = {n: _full_sharded(n) for n in SHARDED}
    state["replicated"] = torch.arange(10, dtype=torch.float32)
    state["extra"] = {"step": 100, "note": "two ranks"}
    return state


def _two_ranks(tmp_path: Path) -> list[dict[str, Any]]:
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "ranks_worker.py"
    script.write_text(RANKS_WORKER)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            str(tmp_path),
            json.dumps(SHARDED),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return [json.loads((tmp_path / f"report-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_two_ranks_and_resharded_loads(tmp_path: Path) -> None:
    """Side by side, with 2 real ranks (torchrun, gloo, CPU): DTensors sharded by rows (unevenly)
    saved by 2 ranks, loaded by the 2 ranks with the same plan and with another one (sharded by
    columns); a checkpoint saved whole by 1 process loaded by 2 ranks into both plans; and the
    2-rank checkpoint loaded whole by 1 process. Both paths give the same local shards, equal
    to the same slices of the saved tensors, on every rank."""
    whole = _whole_state()
    for kind in KINDS:  # saved whole by one process, for the 1 -> 2 ranks loads
        dcp.save(whole, storage_writer=_writer(kind, tmp_path / kind / "one"), no_dist=True)
    reports = _two_ranks(tmp_path)
    for rank, report in enumerate(reports):
        assert report["ckptio"] == report["dcp"], rank
        for case, got in report["dcp"].items():
            assert isinstance(got, dict) and got["equal"], (rank, case, got)
            assert got["extra"] == {"step": 100, "note": "two ranks"}, (rank, case)
            assert got["replicated"] == list(range(10)), (rank, case)
    # the plans really differ: rows split 17/16 in one, all 33 rows and 3 or 2 columns in the other
    shapes = [
        r["dcp"][c]["local_shapes"]["bf16"] for r in reports for c in ("two->shard0", "two->shard1")
    ]
    assert shapes == [[17, 5], [33, 3], [16, 5], [33, 2]], shapes

    def two_to_one(kind: str, p: Path) -> Any:
        out = _zeros(whole)
        return _outcome(
            lambda: (
                dcp.load(out, storage_reader=_reader(kind, p / "two"), no_dist=True),
                out,
            )[1]
        )

    results = {kind: two_to_one(kind, tmp_path / kind) for kind in KINDS}
    assert results["ckptio"] == results["dcp"] == ("ok", _canon(whole))
