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
the path itself (a directory, or a URL), otherwise ``<url>/<file name>``. Every save of a path
is the next step under that root, committed atomically, and older steps of it are deleted after
the commit (``keep_last=1``): rewriting ``last.ckpt`` can never leave a torn file. Loads read the
newest committed step. The checkpoint dict goes through :func:`ckptio.torch.encode`
(optimizer states have integer keys); values must be tensors, containers and JSON values —
anything else (a pickled object in ``hyper_parameters``, say) is refused with its path.

Resuming with ``ckpt_path="last"``: Lightning looks for ``last*.ckpt`` by listing the
``ModelCheckpoint``'s directory with fsspec, so that directory must show the checkpoints. With
``url=None`` it does (the roots are there). With a ``url``, the data lives under the URL, so
after each commit the plugin writes a *stub* at the local path Lightning named: a small JSON file
(``{"kind": "ckptio-lightning-stub", "root": ..., "step": ...}``) that Lightning lists, dates
and hands back to ``load_checkpoint``, which maps it to its root like any path. The stub is written only
once the save is committed (an async save: when its commit completes), so a kill never leaves a
stub naming nothing; a path that is a URL, or that is the root itself, gets no stub. On a
machine without the stubs (a fresh node resuming from ``s3://``), call
``io.restore_stubs(dirpath)`` before ``fit`` (it writes the stub of every checkpoint committed
under the URL), or pass the path explicitly: ``ckpt_path="<dirpath>/last.ckpt"`` loads
``<url>/last.ckpt`` whether or not the stub exists.
``remove_checkpoint`` (``save_top_k``) deletes the root's objects, its stub and the directories
left empty.

Lightning calls ``save_checkpoint`` on global rank 0 only, so the plugin saves as a single
process. With ``async_save=True`` a save returns after the snapshot; ``load`` and ``remove``
of the same path, and ``teardown``, wait for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from concurrent.futures import Future
from typing import Any

import torch

from ckptio import errors
from ckptio import format as fmt
from ckptio import torch as ct
from ckptio.checkpoint.checkpointer import _split_options
from ckptio.dist import SingleProcess
from ckptio.lease import runs_here
from ckptio.registry import open_store, parse_url

try:  # pytorch-lightning's plugins subclass lightning_fabric's CheckpointIO
    from lightning_fabric.plugins import CheckpointIO
except ImportError:  # the unified "lightning" package
    from lightning.fabric.plugins import CheckpointIO  # type: ignore[no-redef]

__all__ = ["CkptioCheckpointIO"]

STUB_KIND = "ckptio-lightning-stub"


def _local_path(path: str) -> str | None:
    """The local file system path ``path`` names (a plain path or a URL of a local
    directory, such as ``file://``), else None."""
    try:
        loc = parse_url(path)
    except errors.CkptioError:
        return None
    return loc.path if loc.local else None


class CkptioCheckpointIO(CheckpointIO):  # type: ignore[misc]  # Lightning ships no stubs
    """A Lightning ``CheckpointIO`` that stores checkpoints through ckptio.

    Options (keyword-only after ``url``):

    - ``url`` (str or None): root under which each Lightning checkpoint path becomes
      ``<url>/<file name>`` (and a stub is left at the Lightning path, see the module
      docstring); None: the Lightning path itself is the root.
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
                    root,
                    async_save=self.async_save,
                    keep_last=1,
                    comm=SingleProcess(),
                    **self.options,
                )
                self._checkpointers[root] = ck
            return ck

    def _stub_path(self, path: Any, ck: ct.Checkpointer) -> str | None:
        """Where the stub of ``path`` goes: None without a ``url``, for a path that is not
        local, or when the path is the root's own directory."""
        if self.url is None:
            return None
        local = _local_path(os.fspath(path))
        if local is None:
            return None
        local = os.path.abspath(local)
        root = ck.store.local_path
        if root is not None and os.path.abspath(root) == local:
            return None
        return local

    def _write_stub(self, stub: str, root: str, step: int) -> None:
        """Write the stub through a hidden temp file renamed into place, so Lightning sees
        the whole stub or none. The temp file names its host and process; one in the
        directory whose process is gone (killed between write and rename) is removed first,
        so the directory holds stubs only. Another host's temp files are left alone: whether
        their process runs is not known here (a second job writing stubs beside this one)."""
        directory, name = os.path.split(stub)
        os.makedirs(directory, exist_ok=True)
        mark = ".ckptio-tmp-"
        for entry in os.listdir(directory):
            host, _, pid = entry.rpartition(mark)[2].rpartition("-")
            gone = pid.isdigit() and runs_here(host, int(pid)) is False
            if entry.startswith(".") and mark in entry and gone:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(directory, entry))
        tmp = os.path.join(directory, f".{name}{mark}{socket.gethostname()}-{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump({"kind": STUB_KIND, "root": root, "step": step}, f)
        os.replace(tmp, stub)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                "CkptioCheckpointIO.save_checkpoint takes no storage_options; pass options to "
                "CkptioCheckpointIO(...) instead"
            )
        ck = self._checkpointer(path)
        ck.wait()  # the previous save of this path must be committed before numbering the next
        steps = ck.steps()
        step = steps[-1] + 1 if steps else 0
        handle = ck.save(checkpoint, step=step, metadata={"lightning_path": os.fspath(path)})
        stub = self._stub_path(path, ck)
        if stub is None:
            return
        root = self._root(path)
        future: Future[Any] | None = handle._future
        if future is None:  # committed already
            self._write_stub(stub, root, step)
            return

        def committed(fut: Future[Any]) -> None:
            if not fut.cancelled() and fut.exception() is None:  # the failure is raised by wait
                self._write_stub(stub, root, step)

        future.add_done_callback(committed)

    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The newest committed checkpoint of ``path`` (its root, also when ``path`` is a stub);
        tensors on ``map_location`` when it is a device (or its name), else on the CPU. Nothing
        is unpickled, so ``weights_only`` holds whatever it is set to."""
        ck = self._checkpointer(path)
        ck.wait()
        if ck.latest() is None:
            raise errors.NotFoundError(f"no committed ckptio checkpoint at {self._root(path)}")
        device = map_location if isinstance(map_location, str | torch.device) else None
        state = ct.decode(ct.to_torch(ck.open().state(), device=device))
        if not isinstance(state, dict):  # a damaged or foreign checkpoint: not Lightning's dict
            raise errors.ManifestError(
                f"{self._root(path)}: a Lightning checkpoint is a dict, this one holds a "
                f"{type(state).__name__}",
                field="tree",
            )
        return state

    def remove_checkpoint(self, path: Any) -> None:
        """Delete every object under the root of ``path`` (manifests first, so no checkpoint
        is half there), its stub, and the local directories that leaves empty."""
        root = self._root(path)
        ck = self._checkpointer(path)
        ck.wait()
        store = ck.store
        keys = store.list("")
        manifests = [k for k in keys if k.endswith("/" + fmt.MANIFEST_NAME)]
        store.delete(manifests)
        store.delete([k for k in keys if k not in manifests])
        store.cleanup_incomplete("")
        stub = self._stub_path(path, ck)
        with self._lock:
            self._checkpointers.pop(root, None)
        ck.close()
        if stub is not None and os.path.isfile(stub):
            os.remove(stub)
        local = store.local_path
        if local is not None and os.path.isdir(local):
            for dirpath, _dirs, _files in os.walk(local, topdown=False):
                with contextlib.suppress(OSError):  # rmdir removes only empty directories
                    os.rmdir(dirpath)

    def restore_stubs(self, dirpath: Any) -> list[str]:
        """Write, under the local directory ``dirpath`` (the ``ModelCheckpoint``'s), the stub of
        every ``*.ckpt`` root that has a committed checkpoint under the ``url``, so that
        ``ckpt_path="last"`` (and top-k bookkeeping) sees them on a machine that lacks them.
        Returns the stub paths written."""
        if self.url is None:
            raise errors.InvalidArgumentError(
                "restore_stubs needs CkptioCheckpointIO(url=...): without a url the checkpoints "
                "are in the ModelCheckpoint's directory already"
            )
        _, store_options = _split_options(dict(self.options))
        with open_store(self.url, **store_options) as store:
            names = sorted(
                {
                    k.split("/", 1)[0]
                    for k in store.list("")
                    if k.count("/") == 2 and k.endswith("/" + fmt.MANIFEST_NAME)
                }
            )
        written = []
        for name in names:
            if not name.endswith(".ckpt"):
                continue
            path = os.path.join(os.fspath(dirpath), name)
            ck = self._checkpointer(path)
            step, stub = ck.latest(), self._stub_path(path, ck)
            if step is not None and stub is not None:
                self._write_stub(stub, self._root(path), step)
                written.append(stub)
        return written

    def teardown(self) -> None:
        """Wait for saves in flight (raising a failure) and release the stores."""
        with self._lock:
            cks, self._checkpointers = list(self._checkpointers.values()), {}
        for ck in cks:
            ck.close()
