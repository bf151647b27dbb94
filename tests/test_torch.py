"""PyTorch tensors in ckptio.save / ckptio.load: every stored dtype, zero-copy on the CPU,
CUDA staging through pinned memory (exercised on the CPU by standing in for the device),
optimizer state (integer keys), async saves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ckptio  # noqa: E402
import ckptio.torch as ct  # noqa: E402
from ckptio import errors  # noqa: E402
from ckptio.dcp_metadata import TORCH_DTYPES  # noqa: E402
from ckptio.format import DTYPES  # noqa: E402

pytestmark = pytest.mark.torch


def _sample(dtype: torch.dtype, shape: tuple[int, ...] = (5, 3)) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Exact bit pattern (float8 has no equality op on CPU)."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


def test_every_ckptio_dtype_round_trips_bitwise(tmp_path: Path) -> None:
    assert set(TORCH_DTYPES) == set(DTYPES)  # torch covers every dtype the format stores
    state = {name: _sample(dt) for name, dt in TORCH_DTYPES.items()}
    state["scalar_bf16"] = torch.tensor(1.5, dtype=torch.bfloat16)
    state["empty"] = torch.zeros(0, 4)
    state["strided"] = torch.arange(24.0).reshape(4, 6)[:, ::2]  # non-contiguous view
    ckptio.save(state, str(tmp_path), step=1)
    raw = json.loads((tmp_path / "step-0000000001/manifest.json").read_bytes())
    assert raw["tensors"]["bfloat16"]["dtype"] == "bfloat16"
    out = ct.load(str(tmp_path))
    for k, v in state.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape, k
        assert torch.equal(_bits(out[k]), _bits(v.contiguous())), k
    # no pickle anywhere: the step is a JSON manifest plus raw data objects
    files = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert files.count("manifest.json") == 1 and all(
        f.endswith(".bin") for f in files if f != "manifest.json"
    )


def test_cpu_tensors_are_not_copied() -> None:
    for dt in (torch.float32, torch.bfloat16, torch.float8_e5m2, torch.int64):
        t = _sample(dt, (64, 4))
        a = ct.to_numpy(t)
        assert a is not None
        assert a.ctypes.data == t.data_ptr(), dt  # same memory
    p = torch.nn.Parameter(torch.ones(3))
    assert ct.to_numpy(p).ctypes.data == p.data_ptr()  # autograd detached, not copied
    assert ct.to_numpy(torch.Size([2, 3])) is None  # torch objects that are not tensors
    # loaded tensors share the memory ckptio read into
    arr = np.arange(6, dtype=np.float32)
    assert ct.from_numpy(arr).data_ptr() == arr.ctypes.data


def test_cuda_tensors_are_staged_through_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path without a GPU: the device test, the pinned allocation and the stream
    synchronisation are stood in for; the copy itself is real."""
    calls: list[tuple[str, object]] = []

    def pinned_empty(t: torch.Tensor) -> torch.Tensor:
        calls.append(("pinned_empty", (tuple(t.shape), t.dtype)))
        return torch.empty(t.shape, dtype=t.dtype)  # pin_memory=True needs a CUDA driver

    real_copy = torch.Tensor.copy_

    def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        calls.append(("copy_", non_blocking))
        return real_copy(self, src, non_blocking=non_blocking)

    monkeypatch.setattr(ct, "_is_cuda", lambda t: True)
    monkeypatch.setattr(ct, "_pinned_empty", pinned_empty)
    monkeypatch.setattr(
        ct, "_synchronize", lambda device: calls.append(("synchronize", device.type))
    )
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    src = _sample(torch.bfloat16, (8, 2))
    arr = ct.to_numpy(src)
    assert [c[0] for c in calls] == ["pinned_empty", "copy_", "synchronize"]
    assert calls[1] == ("copy_", True)  # asynchronous DMA, then one synchronisation
    assert arr.ctypes.data != src.data_ptr()  # a host copy, not the device tensor
    assert torch.equal(ct.from_numpy(arr), src)


def test_load_into_a_state_dict_fills_its_tensors_in_place(tmp_path: Path) -> None:
    def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
        model[1].register_buffer("scale", torch.randn(3).to(torch.bfloat16))
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
        return model, opt

    model, opt = trained(0)
    ct.save({"model": model.state_dict(), "optim": opt.state_dict()}, str(tmp_path), step=1)
    model2, opt2 = trained(1)  # the resumed job: same shapes, other values
    into = {"model": model2.state_dict(), "optim": opt2.state_dict()}  # optimizer: int keys
    before = {k: v.data_ptr() for k, v in into["model"].items()}
    out = ct.load(str(tmp_path), into=into)
    for k, v in model.state_dict().items():
        assert torch.equal(model2.state_dict()[k], v), k  # the parameters themselves
        assert model2.state_dict()[k].data_ptr() == before[k], k
        assert out["model"][k] is into["model"][k], k
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            assert torch.equal(opt2.state_dict()["state"][i][k], v), (i, k)
    assert out["optim"]["param_groups"] == opt.state_dict()["param_groups"]


def test_load_into_cuda_tensors_goes_through_pinned_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA path without a GPU, as above: the device test and the pinned allocation are
    stood in for; the read into host memory and the copy onto the tensor are real."""
    src = _sample(torch.bfloat16, (8, 2))
    ckptio.save({"w": src}, str(tmp_path), step=1)
    calls: list[tuple[int, ...]] = []

    def pinned_empty(t: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(t.shape))
        return torch.empty(t.shape, dtype=t.dtype)

    monkeypatch.setattr(ct, "_is_cuda", lambda t: True)
    monkeypatch.setattr(ct, "_pinned_empty", pinned_empty)
    dest = torch.zeros(8, 2, dtype=torch.bfloat16)
    assert ct.load(str(tmp_path), into={"w": dest})["w"] is dest
    assert calls == [(8, 2)] and torch.equal(dest, src)


def test_unsupported_tensors_are_refused_clearly() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="supported: "):
        ct.to_numpy(torch.zeros(2, dtype=torch.float8_e4m3fnuz))
    with pytest.raises(errors.InvalidArgumentError, match="to_dense"):
        ct.to_numpy(torch.eye(3).to_sparse())
    with pytest.raises(errors.InvalidArgumentError, match="meta device"):
        ct.to_numpy(torch.empty(3, device="meta"))


def test_optimizer_state_and_async_checkpointer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state()}
    with ct.Checkpointer(f"file://{tmp_path}", async_save=True) as ck:
        handle = ck.save(state, step=3)
        # the snapshot was taken: changing the live tensors now does not leak into the save
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        handle.wait()
        back = ck.load()
    assert set(back["optim"]["state"]) == {0, 1, 2, 3}  # integer keys restored
    opt2 = torch.optim.AdamW(model.parameters(), lr=0.5)
    opt2.load_state_dict(back["optim"])
    assert opt2.param_groups[0]["lr"] == 0.01
    for k, v in state["optim"]["state"][0].items():
        assert torch.equal(opt2.state_dict()["state"][0][k], v), k
    for k, v in back["model"].items():
        assert torch.equal(v + 1.0, model.state_dict()[k]), k  # the pre-change values
    assert torch.equal(back["rng"], state["rng"])


def test_encode_rejects_reserved_and_odd_keys() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="reserved"):
        ct.encode({ct.ITEMS_MARKER: 1})
    with pytest.raises(errors.InvalidArgumentError, match="str or int"):
        ct.encode({1.5: 1})
    mixed = {"a": 1, 2: "b"}
    assert ct.decode(ct.encode(mixed)) == mixed


# -- hostile or damaged trees -------------------------------------------------------------------

#: ``{"__ckptio_items__": ...}`` nodes that encode() never writes, and what the refusal says
HOSTILE_ITEMS = {
    "dict": (
        {ct.ITEMS_MARKER: {"0": 1}},
        r"expected a list of \[key, value\] pairs, got a dict of 1",
    ),
    "string": (
        {ct.ITEMS_MARKER: "abc"},
        r"expected a list of \[key, value\] pairs, got a str of 3",
    ),
    "3-item": ({ct.ITEMS_MARKER: [[0, 1, 2]]}, r"\[0\]: expected \[key, value\], got a list of 3"),
    "2-char": (
        {ct.ITEMS_MARKER: [[0, 1], "ab"]},
        r"\[1\]: expected \[key, value\], got a str of 2",
    ),
    "list-key": ({ct.ITEMS_MARKER: [[[1], 2]]}, r"\[0\]: key \[1\] \(list\): keys are str or int"),
    "bool-key": ({ct.ITEMS_MARKER: [[True, 2]]}, r"\[0\]: key True \(bool\): keys are str or int"),
    "twice": ({ct.ITEMS_MARKER: [[0, 1], [0, 2]]}, r"\[1\]: key 0 given twice"),
    "beside": ({ct.ITEMS_MARKER: [], "x": 1}, r"beside other keys \(x\)"),
}


@pytest.mark.parametrize("name", list(HOSTILE_ITEMS))
def test_hostile_items_nodes_are_refused_naming_the_field(tmp_path: Path, name: str) -> None:
    """A checkpoint (written by anything: here plain ckptio.save) whose tree holds an items
    node that encode() never writes: ckptio.torch.load, its Checkpointer and the Lightning
    plugin refuse it with a ManifestError naming where it lies, never a raw TypeError or
    ValueError, nor a dict built from a string's characters."""
    node, says = HOSTILE_ITEMS[name]
    url = f"file://{tmp_path}/run"
    ckptio.save({"w": np.zeros(2), "optim": {"state": node}}, url, step=1)
    field = r"tree\['optim'\]\['state'\]\['__ckptio_items__'\]"
    loads = [lambda: ct.load(url), lambda: ct.Checkpointer(url).load(), lambda: ct.decode(node)]
    for load in loads:
        with pytest.raises(errors.ManifestError, match=says) as err:
            load()
        if load is not loads[-1]:
            assert err.value.field is not None and re_match(field, err.value.field), err.value
    pytest.importorskip("pytorch_lightning")
    from ckptio.lightning import CkptioCheckpointIO

    io = CkptioCheckpointIO()
    with pytest.raises(errors.ManifestError, match=field + ".*" + says):
        io.load_checkpoint(str(tmp_path / "run"))
    io.teardown()


def re_match(pattern: str, text: str) -> bool:
    import re

    return re.match(pattern, text) is not None


def test_a_lightning_checkpoint_that_is_not_a_dict_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    from ckptio.lightning import CkptioCheckpointIO

    ckptio.save([np.zeros(2), 1], f"file://{tmp_path}/run", step=0)
    io = CkptioCheckpointIO()
    with pytest.raises(
        errors.ManifestError,
        match=r"tree: .*a Lightning checkpoint is a dict, this one holds a list",
    ):
        io.load_checkpoint(str(tmp_path / "run"))
    io.teardown()


# -- any integral step ------------------------------------------------------------------------


def test_torch_integer_scalars_are_steps_and_float_ones_are_refused(tmp_path: Path) -> None:
    """A step counter kept as a torch tensor (``torch.tensor(7)``, a LongTensor from a
    scheduler) is a step for ckptio.torch's save/load, its Checkpointer and the DCP
    writer/reader; a float tensor is refused in one line."""
    import torch.distributed.checkpoint as dcp

    from ckptio.torch import StorageReader, StorageWriter

    url, state = f"file://{tmp_path}/run", {"w": torch.arange(4.0)}
    ct.save(state, url, step=torch.tensor(7))
    assert torch.equal(ct.load(url, step=torch.tensor(7))["w"], state["w"])
    with ct.Checkpointer(url, async_save=True) as ck:
        ck.save(state, step=torch.tensor(8, dtype=torch.int32))
        assert ck.steps() == [7, 8] and torch.equal(ck.load(np.int64(8))["w"], state["w"])
    with pytest.warns(UserWarning, match="torch.distributed is disabled"):
        dcp.save(state, storage_writer=StorageWriter(f"{url}-dcp", step=torch.tensor(9)))
    out = {"w": torch.zeros(4)}
    with pytest.warns(UserWarning, match="torch.distributed is disabled"):
        dcp.load(out, storage_reader=StorageReader(f"{url}-dcp", step=np.int64(9)))
    assert torch.equal(out["w"], state["w"])
    for bad, says in (
        (torch.tensor(7.0), r"got tensor\(7\.\) \(Tensor\)$"),
        (torch.tensor(True), r"got tensor\(True\) \(a bool\)$"),
    ):
        with pytest.raises(errors.InvalidArgumentError, match=says):
            ct.save(state, url, step=bad)
        with pytest.raises(errors.InvalidArgumentError, match="step must be an integer"):
            StorageWriter(url, step=bad)
