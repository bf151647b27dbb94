"""ckptio as PyTorch Lightning's checkpoint storage: ModelCheckpoint saves through the plugin,
a new Trainer resumes from it, and top-k removal deletes through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

from ckptio.lightning import CkptioCheckpointIO  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    # Lightning's own advice (num_workers, logger, ...) on a deliberately tiny CPU run
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`isinstance:FutureWarning"),  # lightning 2.6 vs torch 2.13 pytree API
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
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _trainer(tmp_path: Path, io: CkptioCheckpointIO, steps: int) -> pl.Trainer:
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=4, save_top_k=2, monitor="step", mode="max", save_last=True)
    return pl.Trainer(
        max_steps=steps, plugins=[io], callbacks=[ckpt], logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=tmp_path,
    )


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True])
def test_lightning_saves_resumes_and_removes_through_ckptio(tmp_path: Path, async_save: bool) -> None:
    torch.manual_seed(0)
    model = Tiny()
    _trainer(tmp_path, CkptioCheckpointIO(async_save=async_save), 12).fit(model, _data())
    ckpts = tmp_path / "ckpts"
    names = {p.name for p in ckpts.iterdir()}
    # top-2 by step plus last; the step-4 checkpoint was removed through the plugin
    assert names == {"epoch=0-step=8.ckpt", "epoch=1-step=12.ckpt", "last.ckpt"}
    # each is a ckptio root: a JSON manifest, one committed step (older ones deleted)
    last = ckpts / "last.ckpt"
    manifests = sorted(last.glob("step-*/manifest.json"))
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
