"""PyTorch Lightning: ckptio as the Trainer's checkpoint storage (a ``CheckpointIO`` plugin).

::

    from ckptio.lightning import CkptioCheckpointIO, load_from_checkpoint
    io = CkptioCheckpointIO("s3://bucket/run1", async_save=True)
    trainer = L.Trainer(plugins=[io],
                        callbacks=[ModelCheckpoint(dirpath="ckpts", every_n_train_steps=500)])
    trainer.fit(model, ckpt_path="last")                 # resumes through ckptio
    best = load_from_checkpoint(MyModel, trainer.checkpoint_callback.best_model_path)

Why Lightning (and not a Hugging Face Trainer callback): ckptio is a storage layer, and
Lightning has a storage seam — ``CheckpointIO`` decides how the checkpoint dict is written,
read and removed, so ckptio *replaces* ``torch.save`` there (no pickle, CRC32C, atomic
commit, async, any backend). It is also the seam NVIDIA NeMo, which many of our users run
for large-model training, builds its own distributed checkpointing on. The Hugging Face
Trainer has no such seam: a ``TrainerCallback`` runs after the Trainer has already written
its checkpoint with ``torch.save`` / safetensors, so a callback could only write a second
copy.

**Both namespaces.** One class serves ``pytorch_lightning`` and the unified ``lightning``
package (``import lightning as L``): it subclasses the ``CheckpointIO`` of the first one
installed and is registered as a virtual subclass of the other's (``CheckpointIO`` is an
ABC; the plugin implements all of it), so either ``Trainer`` accepts it.

**Paths.** Lightning's paths are fsspec URLs and are read as Lightning reads them
(:func:`ckptio.registry.from_fsspec_url`): a plain path or ``file://`` is a local path,
``s3://`` the bucket, and ``memory://`` fsspec's in-process filesystem (where Lightning's
``ModelCheckpoint`` and HPC resume look), not ckptio's ``memory://``. Each checkpoint path
Lightning names (``ckpts/epoch=0-step=500.ckpt``, ``ckpts/last.ckpt``) has a ckptio *root*,
and a local path holds a *stub*: a small JSON file (``{"kind": "ckptio-lightning-stub",
"root": ..., "step": ...}``, never a pickle) naming that root, which Lightning lists, dates,
versions and hands back to the plugin, as it would its own ``torch.save`` file:

- with ``url=None``, the root is in the *sidecar* of the path's directory, beside it:
  ``ckpts/last.ckpt`` is the stub, ``ckpts.ckptio/last.ckpt`` its root (the stub names it
  relative to itself, so the run directory can move or be copied whole). Beside, not inside:
  Lightning's tests and users' scripts list a checkpoint directory and expect only
  checkpoint files there. A path that is a directory is its own root: what earlier versions
  of this plugin saved (they had no stubs) still loads, resumes and is saved to as it was;
- with a ``url``, the root is ``<url>/<the path relative to base>`` (``base`` defaults to
  ``/``: ``<url>/home/me/run/ckpts/last.ckpt``), so distinct Lightning paths are distinct
  roots;
- a path that is a URL (``s3://``, ``memory://``) is its own root, with no stub.

Every save of a path is the next step under its root, committed atomically, and older steps of
it are retired after the commit (``keep_last=1``): rewriting ``last.ckpt`` can never leave a
torn checkpoint. Loads read the newest committed step. The checkpoint dict goes through
:func:`ckptio.torch.encode` (optimizer states have integer keys); values must be tensors,
containers and JSON values — anything else (a pickled object in ``hyper_parameters``, say) is
refused with its path.

**Order of operations on one path.** A save, load or removal of a root waits for the one in
progress on it, in any thread of the process and through any plugin instance: a removal by
``save_top_k`` on the main thread waits for the save of that path running in Lightning's
``AsyncCheckpointIO`` thread, and a load of a path whose ``async_save`` is in flight (by a
second Trainer in the same process, too) waits for its commit. When ``save_checkpoint``
returns, the path exists for Lightning's own checks (``ModelCheckpoint``'s version counter
asks fsspec): the stub is there, written after the commit for a synchronous save, and for an
async save before its commit (a URL path without a stub: its directory, or on object
storage the save's first object, its lease, once stored: a prefix exists only with an object
under it). A process killed during an async save's *first* commit leaves that path existing
with nothing committed; loading it says so (:class:`~ckptio.errors.NotFoundError`). One
killed between a first synchronous commit and its stub leaves a root no stub names:
:meth:`CkptioCheckpointIO.restore_stubs` writes it. A removal deletes the stub first, then
the root. A path that is a symbolic link (``save_last="link"``) is removed as a link, never
followed; a save to it replaces the link.

**Getting a model back.** ``LightningModule.load_from_checkpoint(path)`` reads ``path`` with
``torch.load`` and never asks the plugin: given a stub it raises ``pickle.UnpicklingError``
("Weights only load failed ... Unsupported operand 123", the stub's opening ``{``; torch's
advice to retry with ``weights_only=False`` does not apply, the stub is JSON), given a root
``IsADirectoryError``. Use
:func:`load_from_checkpoint` (``load_from_checkpoint(MyModel, path)``), or resume training
with ``trainer.fit(model, ckpt_path=path)`` / ``ckpt_path="last"``, which go through the
plugin.

**Resuming with ``ckpt_path="last"``.** Lightning looks for ``last*.ckpt`` by listing the
``ModelCheckpoint``'s directory with fsspec, and finds the stubs there (Lightning's lookup
drops the scheme of a directory that is a URL, ``s3://`` or ``memory://``, and finds
nothing, with its default plugin too). On a machine without them (a fresh node resuming from
a ``url``), call ``io.restore_stubs(dirpath)`` before ``fit`` (it writes the stub of every
checkpoint committed under the URL, or in the sidecar, for that directory), or pass the path
explicitly: ``ckpt_path="<dirpath>/last.ckpt"`` loads its root whether or not the stub
exists.

**Processes.** Lightning calls ``save_checkpoint`` on global rank 0 only, so the plugin saves
as a single process. It pickles without its live state (``strategy="ddp_spawn"`` sends it to
the spawned processes), which each process re-creates. ``teardown`` (the end of ``fit``)
waits for the saves in flight, raises a failure, and closes every store and thread the plugin
opened; a synchronous save, load or removal keeps nothing open after it returns.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import socket
import threading
from abc import ABCMeta
from collections.abc import Iterator
from importlib.util import find_spec
from typing import Any

import torch

from ckptio import errors
from ckptio import format as fmt
from ckptio import torch as ct
from ckptio.checkpoint.checkpointer import SaveHandle, split_options
from ckptio.dist import SingleProcess
from ckptio.lease import runs_here
from ckptio.registry import from_fsspec_url, open_store, parse_url

__all__ = ["STUB_KIND", "CkptioCheckpointIO", "load_from_checkpoint"]

log = logging.getLogger(__name__)

STUB_KIND = "ckptio-lightning-stub"
STUB_MAX_BYTES = 64 << 10
"""Bytes; a stub is a few hundred bytes, so a larger file at a checkpoint path is not one."""
_TMP_MARK = ".ckptio-tmp-"
SIDECAR_SUFFIX = ".ckptio"
"""Without a ``url``, the checkpoints of directory ``d`` live in ``d`` + this, beside it."""


def _checkpoint_io_bases() -> list[ABCMeta]:
    """``CheckpointIO`` of each Lightning namespace installed: ``lightning_fabric`` (from
    ``pytorch-lightning``) and ``lightning.fabric`` (from the unified ``lightning``)."""
    bases = []
    for package, module in (
        ("lightning_fabric", "lightning_fabric.plugins.io.checkpoint_io"),
        ("lightning", "lightning.fabric.plugins.io.checkpoint_io"),
    ):
        if find_spec(package) is None:
            continue
        try:
            bases.append(importlib.import_module(module).CheckpointIO)
        except ImportError:  # an unrelated or broken package of that name
            continue
    if not bases:
        raise errors.BackendUnavailableError(
            "ckptio.lightning needs PyTorch Lightning: pip install 'ckptio[lightning]' "
            "(pytorch-lightning, or the unified lightning package)"
        )
    return bases


_BASES = _checkpoint_io_bases()


# -- which roots are in use in this process -------------------------------------------------
class _RootsInUse:
    """Roots with a save, load or removal in progress in this process, across threads and
    plugin instances: one operation per root at a time, in the order they ask. An async save
    holds its root until its commit (released by the save's own thread, or by the thread
    that closes its Checkpointer), so the holder is an operation, not a thread; the next
    holder joins that closing thread, so what follows a commit sees its threads gone."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: set[str] = set()
        self._closers: dict[str, threading.Thread] = {}

    def acquire(self, root: str) -> None:
        with self._cond:
            while root in self._held:
                self._cond.wait()
            self._held.add(root)
            closer = self._closers.pop(root, None)
        if closer is not None and closer is not threading.current_thread():
            closer.join()  # it released the root as its last act

    def release(self, root: str, *, closer: threading.Thread | None = None) -> None:
        with self._cond:
            self._held.discard(root)
            self._closers = {r: t for r, t in self._closers.items() if t.is_alive()}
            if closer is not None:
                self._closers[root] = closer
            self._cond.notify_all()

    @contextlib.contextmanager
    def holding(self, root: str) -> Iterator[None]:
        self.acquire(root)
        try:
            yield
        finally:
            self.release(root)


_ROOTS = _RootsInUse()


def _forget_parents_roots() -> None:
    """A forked child runs none of its parent's operations."""
    global _ROOTS
    _ROOTS = _RootsInUse()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parents_roots)


# -- paths ------------------------------------------------------------------------------------
def _local_path(path: str) -> str | None:
    """The local file system path ``path`` (a ckptio URL or plain path) names, else None."""
    try:
        loc = parse_url(path)
    except errors.CkptioError:
        return None
    return loc.path if loc.local else None


def _make_visible(path: str, local_root: str | None) -> None:
    """Make the Lightning path ``path`` exist as Lightning sees paths (through fsspec), where
    an empty directory can exist: the root's local directory (``local_root``), or a directory
    of fsspec's in-memory filesystem. Nothing is made on object storage (a prefix exists once
    an object is under it: for an async save, its lease, which its thread stores first; and
    s3fs's ``makedirs`` would create a missing bucket)."""
    if local_root is not None:
        os.makedirs(local_root, exist_ok=True)
        return
    import fsspec  # Lightning's own dependency: its view of paths
    from fsspec.implementations.memory import MemoryFileSystem

    fs, fs_path = fsspec.core.url_to_fs(path)
    if isinstance(fs, MemoryFileSystem):
        fs.makedirs(fs_path, exist_ok=True)


def _sidecar(directory: str) -> str:
    """The directory beside the local directory ``directory`` that holds the roots of its
    checkpoints when there is no ``url``: ``<directory>.ckptio`` (``ckpts/epoch=0.ckpt`` is a
    stub, its root ``ckpts.ckptio/epoch=0.ckpt``). Beside it, not in it: Lightning and the
    code around it list a checkpoint directory and expect only checkpoints there."""
    parent, name = os.path.split(directory.rstrip(os.sep))
    if not name:
        raise errors.InvalidArgumentError(
            f"a checkpoint directly in {directory} has no directory beside it for its data "
            f"(<directory>{SIDECAR_SUFFIX}); pass CkptioCheckpointIO(url=...)"
        )
    return os.path.join(parent, name + SIDECAR_SUFFIX)


def _read_stub(path: str) -> dict[str, Any] | None:
    """The stub at the local file ``path``, None if ``path`` is no regular file; a file that
    is not a stub is an error saying what it is."""
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        head = f.read(STUB_MAX_BYTES + 1)
    if head.startswith(b"PK\x03\x04") or head[:2] == b"\x80\x02":
        raise errors.InvalidArgumentError(
            f"{path} is a torch.save file (Lightning's default TorchCheckpointIO wrote it), not "
            "a ckptio checkpoint; ckptio does not unpickle. Load it with Lightning's default "
            "plugin, or convert it once from a trusted source: "
            "ckptio.torch.save(torch.load(path, weights_only=True), new_root, step=0)"
        )
    try:
        doc = json.loads(head) if len(head) <= STUB_MAX_BYTES else None
    except ValueError:
        doc = None
    if not (
        isinstance(doc, dict) and doc.get("kind") == STUB_KIND and isinstance(doc.get("root"), str)
    ):
        raise errors.InvalidArgumentError(
            f"{path} is a file but not a ckptio checkpoint stub (a JSON object with "
            f'"kind": "{STUB_KIND}" and the "root" it names)'
        )
    return doc


class CkptioCheckpointIO(_BASES[0]):  # type: ignore[misc,valid-type]  # Lightning ships no stubs
    """A Lightning ``CheckpointIO`` that stores checkpoints through ckptio (see the module
    docstring for the mapping of paths, the order of operations and what it cannot do).

    Options (keyword-only after ``url``):

    - ``url`` (str or None): root under which each local Lightning checkpoint path ``p``
      becomes ``<url>/<p relative to base>``; None: ``p``'s root is in the sidecar of its
      directory, ``<directory>.ckptio/<name>``. Either way a stub is left at ``p``.
    - ``base`` (a local directory, default ``/``; with ``url`` only): the directory whose tree
      the ``url`` mirrors. A Lightning path outside it is refused.
    - ``async_save`` (bool, False): save in the background after a snapshot.
    - anything else goes to :class:`ckptio.torch.Checkpointer` (``chunk_size``, store options
      such as ``streams`` or ``endpoint_url``...).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        async_save: bool = False,
        base: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        if base is not None and url is None:
            raise errors.InvalidArgumentError(
                "base= says which local directory the url mirrors; it needs url="
            )
        self.url = url
        self.base = os.path.abspath(os.fspath(base)) if base is not None else os.sep
        self.async_save = async_save
        self.options = options
        self._start()

    def _start(self) -> None:
        """The live state, which is never pickled: async saves in flight (or failed, until
        their failure is raised) with their Checkpointers, and the threads closing the
        Checkpointers of committed ones."""
        self._saving: dict[str, tuple[ct.Checkpointer, SaveHandle]] = {}
        self._closers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        # strategy="ddp_spawn" pickles the Trainer, plugin included, to the new processes;
        # saves in flight, threads and locks belong to this one
        return {k: self.__dict__[k] for k in ("url", "base", "async_save", "options")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

    # -- where a path lives -------------------------------------------------------------------
    def _root(self, path: Any) -> str:
        """The ckptio root of the Lightning path ``path`` (its stub aside): a URL is its own
        root; a local path's root is ``<url>/<path relative to base>`` with a ``url``, else
        in the sidecar of its directory (:func:`_sidecar`) — or the path itself where it is
        a directory, the root an earlier version of this plugin saved there."""
        p = from_fsspec_url(os.fspath(path))
        local = _local_path(p)
        if local is None:  # a URL is its own root
            return p
        if self.url is None:
            if os.path.isdir(local):
                return os.path.abspath(local)
            directory, name = os.path.split(os.path.abspath(local))
            return os.path.join(_sidecar(os.path.realpath(directory)), name)
        rel = os.path.relpath(os.path.abspath(local), self.base)
        if rel == os.curdir or rel.split(os.sep, 1)[0] == os.pardir:
            raise errors.InvalidArgumentError(
                f"checkpoint path {local} is not below base {self.base}, the directory "
                f"{self.url} mirrors; pass base= a directory that holds every checkpoint path"
            )
        return f"{self.url.rstrip('/')}/{rel.replace(os.sep, '/')}"

    def _home(self, directory: Any) -> str:
        """Where the roots of the checkpoints in the local directory ``directory`` live: the
        URL ``<url>/<directory relative to base>``, or its sidecar."""
        if self.url is None:
            return _sidecar(os.path.realpath(os.fspath(directory)))
        return self._root(directory)

    @staticmethod
    def _stub_path(path: Any, root: str) -> str | None:
        """Where the stub of ``path`` goes: its local path, unless ``path`` is a URL or its
        own root (a directory an earlier version saved)."""
        local = _local_path(from_fsspec_url(os.fspath(path)))
        if local is None or _local_path(root) == os.path.abspath(local):
            return None
        return os.path.abspath(local)

    def _source(self, path: Any) -> str:
        """The root to read or remove for ``path``: the one its stub names, if a stub is
        there (whichever plugin wrote it: with or without a ``url``), else :meth:`_root`."""
        local = _local_path(from_fsspec_url(os.fspath(path)))
        stub = _read_stub(local) if local is not None else None
        if local is None or stub is None:
            return self._root(path)
        root: str = stub["root"]
        if "://" in root or os.path.isabs(root):
            return root
        # relative to the stub's directory (through a "last" link: its target's)
        return os.path.normpath(os.path.join(os.path.dirname(os.path.realpath(local)), root))

    def _checkpointer(self, root: str) -> ct.Checkpointer:
        return ct.Checkpointer(
            root, async_save=self.async_save, keep_last=1, comm=SingleProcess(), **self.options
        )

    def _write_stub(self, stub: str, root: str, step: int) -> None:
        """Write the stub through a hidden temp file renamed into place, so Lightning sees
        the whole stub or none. A sidecar's root (no ``url``) is written relative to the
        stub's directory, so a run directory moved or copied whole still loads; a ``url``
        root as it is. The temp file names its host and process; one in the
        directory whose process is gone (killed between write and rename) is removed first,
        so the directory holds stubs only. Another host's temp files are left alone: whether
        their process runs is not known here (a second job writing stubs beside this one)."""
        directory, name = os.path.split(stub)
        os.makedirs(directory, exist_ok=True)
        for entry in os.listdir(directory):
            host, _, pid = entry.rpartition(_TMP_MARK)[2].rpartition("-")
            gone = pid.isdigit() and runs_here(host, int(pid)) is False
            if entry.startswith(".") and _TMP_MARK in entry and gone:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(directory, entry))
        tmp = os.path.join(directory, f".{name}{_TMP_MARK}{socket.gethostname()}-{os.getpid()}")
        if self.url is None:  # a sidecar's root: named from here, so the two move together
            root = os.path.relpath(root, os.path.dirname(os.path.realpath(stub)))
        with open(tmp, "w") as f:
            json.dump({"kind": STUB_KIND, "root": root, "step": step}, f)
        os.replace(tmp, stub)

    # -- saves in flight ----------------------------------------------------------------------
    def _reap(self, *, wait: bool = False) -> None:
        """Close the Checkpointers of async saves that are done (with ``wait``: wait for
        those in flight, and for the closing of committed ones), then raise the first
        failure among them. In a forked child (``strategy="ddp_fork"``), the parent's saves
        are the parent's: the child starts with none."""
        if os.getpid() != self._pid:
            self._start()
        with self._lock:
            done = [r for r, (_, h) in self._saving.items() if wait or h.done()]
            closing = [self._saving.pop(r)[0] for r in done]
        failure: BaseException | None = None
        for ck in closing:
            try:
                ck.close()
            except BaseException as err:
                failure = failure or err
        if wait:
            with self._lock:
                closers, self._closers = self._closers, []
            for thread in closers:
                thread.join()
        if failure is not None:
            raise failure

    def _committed(self, root: str, handle: SaveHandle) -> None:
        """An async save of ``root`` ended (its own thread calls this). Committed and still
        listed: its Checkpointer is closed at once (threads, snapshot memory, store) by a
        short-lived thread, since the save's thread cannot join itself; that thread frees the
        root when done. A failure stays listed for the plugin's next call, or ``teardown``, to
        raise, and the root is free at once."""
        future = handle._future
        entry = None
        if future is not None and not future.cancelled() and future.exception() is None:
            with self._lock:
                entry = self._saving.get(root)
                if entry is not None and entry[1] is handle:
                    del self._saving[root]
                else:
                    entry = None  # taken by _reap, which closes it
        if entry is None:
            _ROOTS.release(root)
            return
        ck = entry[0]

        def close() -> None:
            try:
                ck.close()
            except Exception as err:  # the save committed; only releasing failed
                log.warning("closing the checkpointer of %s failed: %s", root, err)
            finally:
                _ROOTS.release(root, closer=threading.current_thread())

        closer = threading.Thread(target=close, name="ckptio-close")
        with self._lock:  # listed once started: teardown joins it, and cannot join it before
            closer.start()
            self._closers = [t for t in self._closers if t.is_alive()] + [closer]

    # -- the CheckpointIO interface -----------------------------------------------------------
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        """Save ``checkpoint`` as the next step of the root of ``path`` (see the module
        docstring). Sync: returns once committed. Async: returns after the snapshot, with
        the path already visible to Lightning; the commit follows in the background."""
        if storage_options is not None:
            raise TypeError(
                "CkptioCheckpointIO.save_checkpoint takes no storage_options; pass options to "
                "CkptioCheckpointIO(...) instead"
            )
        self._reap()
        lightning_path = os.fspath(path)
        local = _local_path(from_fsspec_url(lightning_path))
        if local is not None and os.path.islink(local):
            os.remove(local)  # a link Lightning made (save_last="link"): replaced, never followed
        root = self._root(path)
        stub = self._stub_path(path, root)
        _ROOTS.acquire(root)
        try:
            ck = self._checkpointer(root)
            try:
                steps = ck.steps()
                step = steps[-1] + 1 if steps else 0
                saved = ck.save(checkpoint, step=step, metadata={"lightning_path": lightning_path})
                # tiered (local= among the options): the fast tier's save is the commit here
                handle = saved if isinstance(saved, SaveHandle) else saved.fast
            except BaseException:
                ck.close()
                raise
            if stub is not None:
                self._write_stub(stub, root, step)
            else:  # the path exists for Lightning now, also before an async commit
                _make_visible(lightning_path, ck.store.describe().local_path)
        except BaseException:
            _ROOTS.release(root)
            raise
        future = handle._future
        if future is None:  # committed
            try:
                ck.close()
            finally:
                _ROOTS.release(root)
            return
        with self._lock:
            self._saving[root] = (ck, handle)
        future.add_done_callback(lambda _f: self._committed(root, handle))

    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The newest committed checkpoint of ``path``'s root (the one its stub names, if
        ``path`` is a stub), after any save of it in flight in this process; tensors on
        ``map_location`` when it is a device (or its name), else on the CPU. Nothing is
        unpickled, so ``weights_only`` holds whatever it is set to."""
        self._reap()
        root = self._source(path)
        device = map_location if isinstance(map_location, str | torch.device) else None
        with _ROOTS.holding(root), self._checkpointer(root) as ck:
            if ck.latest() is None:
                if not ck.store.list(""):  # as Lightning's default plugin says it
                    raise errors.NotFoundError(
                        f"Checkpoint file not found: {os.fspath(path)} (no ckptio checkpoint at "
                        f"{ck.store.url})"
                    )
                raise errors.NotFoundError(
                    f"{os.fspath(path)}: no committed ckptio checkpoint at {ck.store.url}: its "
                    "first save was interrupted, or runs in another process"
                )
            state = ct.decode(ct.to_torch(ck.open().state(), device=device))
            if not isinstance(state, dict):  # damaged or foreign: not Lightning's dict
                raise errors.ManifestError(
                    f"{ck.store.url}: a Lightning checkpoint is a dict, this one holds a "
                    f"{type(state).__name__}",
                    field="tree",
                )
        return state

    def remove_checkpoint(self, path: Any) -> None:
        """Remove the checkpoint at ``path``: a symbolic link is removed as a link (its
        target stays); otherwise its stub first (Lightning no longer sees the path), then
        every object under its root (manifests first, so no checkpoint is half there) and the
        local directories of the root that leaves empty, after any save of that root in
        flight in this process. The sidecar directory itself stays: a save in another thread
        may be creating its next root in it."""
        self._reap()
        local = _local_path(from_fsspec_url(os.fspath(path)))
        if local is not None and os.path.islink(local):
            os.remove(local)
            return
        root = self._source(path)
        stub = self._stub_path(path, root)
        _, store_options = split_options(dict(self.options))
        with _ROOTS.holding(root):
            self._reap()  # the save of this root, if it was in flight, is done now
            if stub is not None and os.path.isfile(stub):
                os.remove(stub)
            with open_store(root, **store_options) as store:
                keys = store.list("")
                manifests = [k for k in keys if k.endswith("/" + fmt.MANIFEST_NAME)]
                store.delete(manifests)
                store.delete([k for k in keys if k not in manifests])
                store.cleanup_incomplete("")
                top = store.describe().local_path
            if top is not None and os.path.isdir(top):
                for dirpath, _dirs, _files in os.walk(top, topdown=False):
                    with contextlib.suppress(OSError):  # rmdir removes only empty directories
                        os.rmdir(dirpath)

    def restore_stubs(self, dirpath: Any) -> list[str]:
        """Write, under the local directory ``dirpath`` (the ``ModelCheckpoint``'s), the stub of
        every ``*.ckpt`` root that has a committed checkpoint under the ``url`` (or, without
        one, in the directory's sidecar), so that ``ckpt_path="last"`` (and top-k
        bookkeeping) sees them on a machine that lacks them (a fresh node resuming from the
        ``url``), or after a process was killed between a first commit and its stub. Returns
        the stub paths written."""
        self._reap()
        _, store_options = split_options(dict(self.options))
        with open_store(self._home(dirpath), **store_options) as store:
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
            root = self._root(path)
            stub = self._stub_path(path, root)
            with _ROOTS.holding(root), self._checkpointer(root) as ck:
                step = ck.latest()
            if step is not None and stub is not None:
                self._write_stub(stub, root, step)
                written.append(stub)
        return written

    def teardown(self) -> None:
        """Wait for the saves in flight (raising a failure) and close their stores and threads."""
        self._reap(wait=True)


for _base in _BASES[1:]:
    _base.register(CkptioCheckpointIO)  # the other namespace's Trainer accepts it too


def load_from_checkpoint(
    cls: Any,
    path: Any,
    *,
    map_location: Any = None,
    plugin: CkptioCheckpointIO | None = None,
    **kwargs: Any,
) -> Any:
    """``cls.load_from_checkpoint`` for a checkpoint saved through :class:`CkptioCheckpointIO`:
    ``load_from_checkpoint(MyModel, trainer.checkpoint_callback.best_model_path)``.

    ``cls`` is a ``LightningModule`` or ``LightningDataModule`` subclass; ``path`` a path the
    plugin saved (a root, or a stub); ``plugin`` the plugin that saved it, when its ``url``,
    ``base`` or store options are needed to find the root (a stub names its root, so the
    default ``CkptioCheckpointIO()`` reads stubs and roots alike); ``map_location`` and
    ``kwargs`` (``strict``, ``hparams_file``, hyperparameter overrides) as for Lightning's.

    The checkpoint is read through ckptio (CRC32C-checked, no pickle), then handed to
    Lightning's own ``cls.load_from_checkpoint`` as an in-memory ``torch.save`` buffer that
    Lightning loads with ``weights_only=True`` (tensors, containers and plain values only: it
    runs no code), so the model is built exactly as Lightning builds it (hyperparameters,
    ``on_load_checkpoint``, ``strict``). The buffer is a second copy of the checkpoint while
    Lightning reads it: at its peak, loading takes about twice the checkpoint's size in host
    memory."""
    if "weights_only" in kwargs:
        raise TypeError(
            "load_from_checkpoint takes no weights_only: Lightning reads ckptio's buffer with "
            "weights_only=True"
        )
    checkpoint = (plugin or CkptioCheckpointIO()).load_checkpoint(path, map_location)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    del checkpoint
    buffer.seek(0)
    return cls.load_from_checkpoint(buffer, map_location=map_location, weights_only=True, **kwargs)
