"""The CUDA path on a real GPU: CUDA tensors staged through pinned host memory on save, loads
onto the device and into device tensors in place, async snapshots taken before ``save``
returns, and DCP through ckptio's writer and reader.

Skipped without a CUDA device; test_torch.py covers the same code on CPU with the device calls
stood in for. ``scripts/gpu-check.sh`` runs this module where a GPU is lent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import ckptio.torch as ct  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    # dcp.save/load without a process group says so with a UserWarning; that is what we want
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(300, 37, device="cuda", generator=g)
    return {
        "f32": x,
        "bf16": x.to(torch.bfloat16),
        "e4m3": x.to(torch.float8_e4m3fn),
        "i64": torch.randint(-1000, 1000, (1000,), device="cuda", generator=g),
        "bool": x[0] > 0,
        "scalar": x[1, 1].clone(),  # 0-d
        "strided": x.t(),  # not contiguous
    }


def _bytes(t: torch.Tensor) -> bytes:
    """The exact bit pattern, in host memory (float8 has no equality op)."""
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()


def _assert_same(
    got: dict[str, torch.Tensor], want: dict[str, bytes], dtypes: dict[str, torch.dtype]
) -> None:
    for k, b in want.items():
        assert got[k].device.type == "cuda", k
        assert got[k].dtype == dtypes[k], k
        assert _bytes(got[k]) == b, k


def test_cuda_state_round_trips_bitwise_onto_the_device(tmp_path: Path) -> None:
    state = _state()
    ct.save(state, str(tmp_path), step=1)
    back = ct.load(str(tmp_path), device="cuda")
    _assert_same(
        back, {k: _bytes(v) for k, v in state.items()}, {k: v.dtype for k, v in state.items()}
    )
    assert back["scalar"].shape == () and back["strided"].shape == state["strided"].shape


def test_load_into_cuda_tensors_fills_them_in_place(tmp_path: Path) -> None:
    state = _state()
    ct.save(state, str(tmp_path), step=1)
    dest = {k: torch.zeros_like(v) for k, v in state.items()}
    ptrs = {k: v.data_ptr() for k, v in dest.items()}
    out = ct.load(str(tmp_path), into=dest)
    for k in state:
        assert out[k] is dest[k] and dest[k].data_ptr() == ptrs[k], k
    _assert_same(
        dest, {k: _bytes(v) for k, v in state.items()}, {k: v.dtype for k, v in state.items()}
    )


def test_async_save_snapshots_cuda_state_before_save_returns(tmp_path: Path) -> None:
    """The next training step may change the tensors as soon as ``save`` returns: what is
    committed is the state as it was when ``save`` was called."""
    state = {
        k: v for k, v in _state().items() if v.dtype in (torch.float32, torch.bfloat16, torch.int64)
    }
    want = {k: _bytes(v) for k, v in state.items()}
    with ct.Checkpointer(str(tmp_path), async_save=True, device="cuda") as ck:
        for step in (1, 2):  # the second save reuses the snapshot memory of the first
            handle = ck.save(state, step=step)
            for v in state.values():
                v.add_(1)  # on the current stream, right after save returned
            handle.wait()
            _assert_same(ck.load(step), want, {k: v.dtype for k, v in state.items()})
            want = {k: _bytes(v) for k, v in state.items()}


def test_dcp_save_and_load_of_cuda_tensors_through_ckptio(tmp_path: Path) -> None:
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    state = {k: v for k, v in _state().items() if k in ("f32", "bf16", "i64")}
    url = str(tmp_path / "step-1")
    dcp.save(state, storage_writer=ct.StorageWriter(url), no_dist=True)
    out = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(out, storage_reader=ct.StorageReader(url, allow_pickle=True), no_dist=True)
    _assert_same(
        out, {k: _bytes(v) for k, v in state.items()}, {k: v.dtype for k, v in state.items()}
    )
