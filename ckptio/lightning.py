"""PyTorch Lightning: ckptio as the Trainer's checkpoint storage (a ``CheckpointIO`` plugin).

::

    from ckptio.lightning import CkptioCheckpointIO
    trainer = L.Trainer(plugins=[CkptioCheckpointIO("s3://bucket/run1", async_save=True)],
                        callbacks=[ModelCheckpoint(dirpath="ckpts", every_n_train_steps=500)])
    trainer.fit(model, ckpt_path="ckpts/last.ckpt")      # resumes through ckptio

Why Lightning (and not a Hugging Face Trainer callback): ckptio is a storage layer, and
Lightning has a storage seam — ``CheckpointIO`` decides how the checkpoint dict is written,
read and removed, so ckptio *replaces* ``torch.save`` there (no pickle, CRC32C, atomic
commit, async, any backend). It is also the seam NVIDIA NeMo, which many of our users run
for large-model training, builds its own distributed checkpointing on. The Hugging Face
Trainer has no such seam: a ``TrainerCallback`` runs after the Trainer has already written
its checkpoint with ``torch.save`` / safetensors, so a callback could only write a second
copy. (Hugging Face ``transformers`` has more downloads overall; for our users — people who
run and tune large training jobs — Lightning/NeMo is the better fit and the cleaner one.)

How Lightning paths map to ckptio: each checkpoint path Lightning names
(``ckpts/epoch=0-step=500.ckpt``, ``ckpts/last.ckpt``) is a ckptio *root*: with ``url=None``
the path itself (a directory), otherwise ``<url>/<file name>``. Every save of a path is the
next step under that root, committed atomically, and older steps of it are deleted after the
commit (``keep_last=1``): rewriting ``last.ckpt`` can never leave a torn file. Loads read the
newest committed step. The checkpoint dict goes through :func:`ckptio.torch.encode`
(optimizer states have integer keys); values must be tensors, containers and JSON values —
anything else (a pickled object in ``hyper_parameters``, say) is refused with its path.

Lightning calls ``save_checkpoint`` on global rank 0 only, so the plugin saves as a single
process. With ``async_save=True`` a save returns after the snapshot; ``load`` and ``remove``
of the same path, and ``teardown``, wait for it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import torch

from ckptio import checkpoint as _ck
from ckptio import errors
from ckptio import torch as ct
from ckptio.dist import SingleProcess

try:  # pytorch-lightning's plugins subclass lightning_fabric's CheckpointIO
    from lightning_fabric.plugins import CheckpointIO
except ImportError:  # the unified "lightning" package
    from lightning.fabric.plugins import CheckpointIO  # type: ignore[no-redef]

__all__ = ["CkptioCheckpointIO"]


class CkptioCheckpointIO(CheckpointIO):  # type: ignore[misc]  # Lightning ships no stubs
    """A Lightning ``CheckpointIO`` that stores checkpoints through ckptio.

    Options (keyword-only after ``url``):

    - ``url`` (str or None): root under which each Lightning checkpoint path becomes
      ``<url>/<file name>``; None: the Lightning path itself is the root (local directory).
    - ``async_save`` (bool, False): save in the background after a snapshot.
    - anything else goes to :class:`ckptio.Checkpointer` (``chunk_size``, store options...).
    """

    def __init__(self, url: str | None = None, *, async_save: bool = False, **options: Any) -> None:
        super().__init__()
        self.url = url
        self.async_save = async_save
        self.options = options
        self._checkpointers: dict[str, ct.Checkpointer] = {}
        self._lock = threading.Lock()

    def _root(self, path: Any) -> str:
        p = os.fspath(path)
        if self.url is None:
            return p
        name = os.path.basename(p.rstrip("/"))
        return f"{self.url.rstrip('/')}/{name}"

    def _checkpointer(self, path: Any) -> ct.Checkpointer:
        root = self._root(path)
        with self._lock:
            ck = self._checkpointers.get(root)
            if ck is None:
                ck = ct.Checkpointer(
                    root, async_save=self.async_save, keep_last=1, comm=SingleProcess(), **self.options
                )
                self._checkpointers[root] = ck
            return ck

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(
                "CkptioCheckpointIO.save_checkpoint takes no storage_options; pass options to "
                "CkptioCheckpointIO(...) instead"
            )
        ck = self._checkpointer(path)
        ck.wait()  # the previous save of this path must be committed before numbering the next
        steps = ck.steps()
        ck.save(checkpoint, step=steps[-1] + 1 if steps else 0, metadata={"lightning_path": os.fspath(path)})

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """The newest committed checkpoint of ``path``; tensors on ``map_location`` when it
        is a device (or its name), else on the CPU. Nothing is unpickled, so ``weights_only``
        holds whatever it is set to."""
        ck = self._checkpointer(path)
        ck.wait()
        if ck.latest() is None:
            raise errors.NotFoundError(f"no committed ckptio checkpoint at {self._root(path)}")
        device = map_location if isinstance(map_location, str | torch.device) else None
        state: dict[str, Any] = ct.decode(ct.to_torch(ck.open().state(), device=device))
        return state

    def remove_checkpoint(self, path: Any) -> None:
        root = self._root(path)
        ck = self._checkpointer(path)
        ck.wait()
        for step in ck.steps():
            _ck.delete_step(ck.store, step)
        _ck.collect_garbage(ck.store)
        with self._lock:
            self._checkpointers.pop(root, None)
        ck.close()
        if self.url is None and os.path.isdir(root):
            for dirpath, _dirs, _files in os.walk(root, topdown=False):
                with contextlib.suppress(OSError):  # rmdir removes only empty directories
                    os.rmdir(dirpath)

    def teardown(self) -> None:
        """Wait for saves in flight (raising a failure) and release the stores."""
        with self._lock:
            cks, self._checkpointers = list(self._checkpointers.values()), {}
        for ck in cks:
            ck.close()
