"""ckptio as PyTorch Lightning's checkpoint storage: ModelCheckpoint saves through the plugin,
a new Trainer resumes from it, and top-k removal deletes through it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

from ckptio import errors  # noqa: E402
from ckptio.lightning import CkptioCheckpointIO  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    # Lightning's own advice (num_workers, logger, ...) on a deliberately tiny CPU run
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings(
        "ignore:`isinstance:FutureWarning"
    ),  # lightning 2.6 vs torch 2.13 pytree API
]


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 5)}


def _data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8
    )


def _trainer(tmp_path: Path, io: CkptioCheckpointIO, steps: int) -> pl.Trainer:
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        every_n_train_steps=4,
        save_top_k=2,
        monitor="step",
        mode="max",
        save_last=True,
    )
    return pl.Trainer(
        max_steps=steps,
        plugins=[io],
        callbacks=[ckpt],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        default_root_dir=tmp_path,
    )


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True])
def test_lightning_saves_resumes_and_removes_through_ckptio(
    tmp_path: Path, async_save: bool
) -> None:
    torch.manual_seed(0)
    model = Tiny()
    _trainer(tmp_path, CkptioCheckpointIO(async_save=async_save), 12).fit(model, _data())
    ckpts = tmp_path / "ckpts"
    names = {p.name for p in ckpts.iterdir()}
    # top-2 by step plus last; the step-4 checkpoint was removed through the plugin
    assert names == {"epoch=0-step=8.ckpt", "epoch=1-step=12.ckpt", "last.ckpt"}
    # each is a stub file; its ckptio root, beside the directory, holds a JSON manifest and
    # one committed step (older ones deleted)
    last = ckpts / "last.ckpt"
    assert all(p.is_file() for p in ckpts.iterdir())
    assert {p.name for p in (tmp_path / "ckpts.ckptio").iterdir()} == names
    manifests = sorted((tmp_path / "ckpts.ckptio" / "last.ckpt").glob("step-*/manifest.json"))
    assert len(manifests) == 1
    doc = json.loads(manifests[0].read_bytes())
    assert doc["metadata"] == {"lightning_path": str(last)}

    io = CkptioCheckpointIO()
    state = io.load_checkpoint(last)
    assert state["global_step"] == 12 and set(state["optimizer_states"][0]["state"]) == {0, 1}
    for k, v in model.state_dict().items():
        assert torch.equal(state["state_dict"][k], v), k

    resumed = Tiny()
    trainer = _trainer(tmp_path, io, 16)
    trainer.fit(resumed, _data(), ckpt_path=str(last))
    assert trainer.global_step == 16
    assert io.load_checkpoint(last)["global_step"] == 16


# -- resuming with ckpt_path="last" after a kill -------------------------------------------------
# A real training process saves through the plugin and is SIGKILLed; a second process resumes
# with Lightning's own ``ckpt_path="last"`` and must start at the saved step with the saved
# weights.

_CHILD = r"""
import json, os, signal, sys
import torch, pytorch_lightning as pl
from ckptio.lightning import CkptioCheckpointIO

phase, url, out, async_save = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)

class Probe(pl.Callback):
    def on_train_start(self, trainer, module):
        torch.save(module.state_dict(), os.path.join(out, phase + "-start.pt"))
        with open(os.path.join(out, phase + "-start.json"), "w") as f:
            json.dump({"global_step": trainer.global_step}, f)
    def on_train_batch_end(self, trainer, module, *args):
        if phase == "train" and trainer.global_step == 8:  # ModelCheckpoint saves right after
            torch.save(module.state_dict(), os.path.join(out, "saved-8.pt"))
        if phase == "train" and trainer.global_step == 10:
            io.teardown()  # the async save of step 8 committed
            os.kill(os.getpid(), signal.SIGKILL)

g = torch.Generator().manual_seed(0)
x = torch.randn(64, 8, generator=g)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
io = CkptioCheckpointIO(url, async_save=async_save, base=out)
ckpt = pl.callbacks.ModelCheckpoint(every_n_train_steps=4, save_top_k=1, monitor="step", mode="max", save_last=True)
trainer = pl.Trainer(max_steps=12, plugins=[io], callbacks=[Probe(), ckpt], logger=False,
                     enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                     devices=1, default_root_dir=out)
torch.manual_seed(0)
trainer.fit(Tiny(), data, ckpt_path="last")
with open(os.path.join(out, phase + "-end.json"), "w") as f:
    json.dump({"global_step": trainer.global_step}, f)
"""


def _run_child(
    tmp_path: Path, phase: str, url: str, async_save: bool
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    return subprocess.run(
        [
            sys.executable,
            str(script),
            phase,
            url,
            str(tmp_path / "run"),
            "1" if async_save else "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _kill_and_resume(tmp_path: Path, url: str, async_save: bool) -> None:
    (tmp_path / "run").mkdir()
    first = _run_child(tmp_path, "train", url, async_save)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    second = _run_child(tmp_path, "resume", url, async_save)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "no last checkpoint available" not in second.stderr
    run = tmp_path / "run"
    assert json.loads((run / "resume-start.json").read_text()) == {"global_step": 8}
    saved = torch.load(run / "saved-8.pt")
    started = torch.load(run / "resume-start.pt")
    assert saved.keys() == started.keys()
    for k in saved:
        assert torch.equal(saved[k], started[k]), k
    assert json.loads((run / "resume-end.json").read_text()) == {"global_step": 12}


def _dirs_and_files(root: Path) -> tuple[set[str], set[str]]:
    dirs = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}
    files = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    return dirs, files


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True])
def test_ckpt_path_last_resumes_after_a_kill_with_a_file_url(
    tmp_path: Path, async_save: bool
) -> None:
    store = tmp_path / "store"
    _kill_and_resume(tmp_path, f"file://{store}", async_save)
    # the top-1 checkpoint of step 4, then 8, was removed through the plugin: no folder is left
    # the url mirrors the run directory (base=): <store>/checkpoints/<name>
    dirs, _files = _dirs_and_files(store / "checkpoints")
    tops = {d for d in dirs if "/" not in d}
    assert tops == {"last.ckpt", "epoch=1-step=12.ckpt"}, dirs
    assert all(any(Path(store, "checkpoints", d).iterdir()) for d in dirs), (
        f"an empty folder is left: {dirs}"
    )
    # Lightning's own directory holds the stubs of exactly these
    stubs = {p.name for p in (tmp_path / "run" / "checkpoints").iterdir()}
    assert stubs == tops
    stub = json.loads((tmp_path / "run" / "checkpoints" / "last.ckpt").read_text())
    assert stub["kind"] == "ckptio-lightning-stub"
    assert stub["root"] == f"file://{store}/checkpoints/last.ckpt"


@pytest.mark.slow
@pytest.mark.s3
def test_ckpt_path_last_resumes_after_a_kill_with_an_s3_url(
    tmp_path: Path, s3_bucket: str, s3_client: Any
) -> None:
    _kill_and_resume(tmp_path, f"s3://{s3_bucket}/run", False)
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert {k.split("/")[2] for k in keys} == {"last.ckpt", "epoch=1-step=12.ckpt"}, keys


def test_restore_stubs_lets_last_resolve_on_a_machine_without_them(tmp_path: Path) -> None:
    """A fresh node resuming from the URL has no stubs; ``restore_stubs`` writes them, and
    Lightning's own lookup of ``last`` (ModelCheckpoint._find_last_checkpoints) finds them.
    The two nodes' run directories differ; ``base=`` (each node's run directory) makes the
    URL mirror the run directory, so both find the same roots."""
    url = f"file://{tmp_path}/store"
    io = CkptioCheckpointIO(url, base=tmp_path / "node1")
    ckpts = tmp_path / "node1" / "ckpts"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 8}, ckpts / "last.ckpt")
    io.save_checkpoint(
        {"state_dict": {"w": torch.ones(3)}, "global_step": 8}, ckpts / "epoch=0-step=8.ckpt"
    )
    io.teardown()
    fresh = tmp_path / "node2" / "ckpts"
    finder = pl.callbacks.ModelCheckpoint(dirpath=fresh)
    assert finder._find_last_checkpoints(None) == set()
    io2 = CkptioCheckpointIO(url, base=tmp_path / "node2")
    assert sorted(io2.restore_stubs(fresh)) == [
        str(fresh / "epoch=0-step=8.ckpt"),
        str(fresh / "last.ckpt"),
    ]
    assert finder._find_last_checkpoints(None) == {str(fresh / "last.ckpt")}
    assert io2.load_checkpoint(fresh / "last.ckpt")["global_step"] == 8
    # without the url, the plugin looks in the directory's sidecar: nothing there
    assert CkptioCheckpointIO().restore_stubs(fresh) == []


def test_a_stub_temp_file_of_a_killed_process_is_removed(tmp_path: Path) -> None:
    """A process killed between writing a stub's temp file and renaming it leaves the temp
    file in Lightning's checkpoint directory; the next stub written there removes it (its
    process is gone), while a live process's temp file, and another host's (a second job on
    another node, whose process this one cannot see), are left alone."""
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = socket.gethostname()
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    (ckpts / f".epoch=0-step=4.ckpt.ckptio-tmp-{here}-{dead.pid}").write_text("{")
    (ckpts / f".last.ckpt.ckptio-tmp-{here}-1").write_text("{")  # PID 1 runs
    other = f".epoch=1-step=8.ckpt.ckptio-tmp-other-node-{dead.pid}"
    (ckpts / other).write_text("{")
    io = CkptioCheckpointIO(f"file://{tmp_path}/store")
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 8}, ckpts / "last.ckpt")
    io.teardown()
    assert sorted(p.name for p in ckpts.iterdir()) == sorted(
        [f".last.ckpt.ckptio-tmp-{here}-1", other, "last.ckpt"]
    )


def test_what_is_not_a_ckptio_checkpoint_is_named_not_read(tmp_path: Path) -> None:
    """A ``torch.save`` file (Lightning's default plugin wrote it) is refused without being
    unpickled; a file that is no stub says so; a path never saved is "not found" as
    Lightning's default plugin says it; a path outside ``base`` is refused."""
    io = CkptioCheckpointIO()
    torch_file = tmp_path / "old.ckpt"
    torch.save({"state_dict": {}}, torch_file)
    with pytest.raises(errors.InvalidArgumentError, match=r"torch\.save file"):
        io.load_checkpoint(torch_file)
    other = tmp_path / "notes.ckpt"
    other.write_text("hello")
    with pytest.raises(errors.InvalidArgumentError, match="not a ckptio checkpoint stub"):
        io.load_checkpoint(other)
    with pytest.raises(FileNotFoundError, match="Checkpoint file not found"):
        io.load_checkpoint(tmp_path / "never.ckpt")
    scoped = CkptioCheckpointIO(f"file://{tmp_path}/store", base=tmp_path / "run")
    with pytest.raises(errors.InvalidArgumentError, match="not below base"):
        scoped.save_checkpoint({"w": torch.ones(1)}, tmp_path / "elsewhere" / "x.ckpt")
    with pytest.raises(errors.InvalidArgumentError, match="needs url"):
        CkptioCheckpointIO(base=tmp_path)


def test_lightning_paths_are_read_as_fsspec_reads_them() -> None:
    from ckptio.registry import from_fsspec_url

    assert from_fsspec_url("memory://run/last.ckpt") == "fsspec+memory://run/last.ckpt"
    assert from_fsspec_url("gs://bucket/run") == "fsspec+gs://bucket/run"
    for same in ("/abs/last.ckpt", "rel/last.ckpt", "file:///abs", "s3://bucket/run", "pfs:///x"):
        assert from_fsspec_url(same) == same
