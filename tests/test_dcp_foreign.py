"""A checkpoint of DCP's own format met by ckptio: a ``FileSystemWriter`` directory read by
ckptio's reader (``StorageReader``, ``ckptio.load``, ``ckptio verify``) is named for what it is
and what reads it, and :func:`ckptio.torch.convert_dcp` turns it into a ckptio checkpoint,
reading DCP's pickled ``.metadata`` only when told to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import ckptio  # noqa: E402
import ckptio.torch as ct  # noqa: E402
from ckptio import errors  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    # dcp.save/dcp.load in one process warn that torch.distributed is not initialised
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

WHAT = "written by DCP's FileSystemWriter"
WHO = "FileSystemReader"


def _state() -> dict[str, object]:
    return {
        "model": {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(4)},
        "step": 7,
        "opt": {"lr": 0.125},
    }


@pytest.fixture
def dcp_dir(tmp_path: Path) -> Path:
    path = tmp_path / "dcp"
    dcp.save(_state(), storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    assert (path / ".metadata").is_file()
    return path


def test_ckptio_readers_say_what_a_dcp_directory_is(dcp_dir: Path) -> None:
    with pytest.raises(errors.NotFoundError, match=WHAT) as info:
        ckptio.load(dcp_dir)
    assert WHO in str(info.value) and "convert_dcp" in str(info.value)
    # DCP wraps the reader's error in its CheckpointException (a BaseException)
    with pytest.raises(BaseException, match=WHAT):
        dcp.load(
            {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(4)}},
            storage_reader=ct.StorageReader(dcp_dir),
            no_dist=True,
        )
    verify = subprocess.run(
        [sys.executable, "-m", "ckptio.cli", "verify", str(dcp_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert verify.returncode != 0 and WHAT in verify.stderr and WHO in verify.stderr


def test_convert_dcp_reads_the_pickle_only_when_allowed(dcp_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "ckptio"
    with pytest.raises(errors.InvalidArgumentError, match="allow_pickle=True"):
        ct.convert_dcp(dcp_dir, target)
    assert not target.exists()  # nothing read, nothing written
    with pytest.raises(errors.NotFoundError, match=r"no \.metadata"):
        ct.convert_dcp(tmp_path, target, allow_pickle=True)

    checkpoint_id = ct.convert_dcp(dcp_dir, target, step=7, allow_pickle=True)
    assert checkpoint_id == f"{target.as_uri()}/step-0000000007"
    assert ckptio.verify(target, 7) == []
    out = {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(4)}, "step": 0, "opt": {"lr": 0.0}}
    dcp.load(out, storage_reader=ct.StorageReader(target, allow_pickle=True), no_dist=True)
    want = _state()
    assert torch.equal(out["model"]["w"], want["model"]["w"])  # type: ignore[index]
    assert torch.equal(out["model"]["b"], want["model"]["b"])  # type: ignore[index]
    assert out["step"] == 7 and out["opt"] == {"lr": 0.125}
    # tensors also through ckptio's own (pickle-free, torch-free) reader, by DCP's names
    plain = ct.load(target)
    assert set(plain) == {"model.w", "model.b"}
    assert torch.equal(plain["model.w"], want["model"]["w"])  # type: ignore[index]
