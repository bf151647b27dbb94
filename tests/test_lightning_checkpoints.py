"""ckptio under a real Lightning Trainer: no checkpoint is ever deleted or shadowed by mistake,
a trained model comes back, and the plugin lives where Lightning puts it (threads, processes,
both namespaces, fsspec paths).

Each test is one behaviour a Lightning user meets (issue 30's points 1-9); the ones about
data loss check afterwards that every checkpoint Lightning believes it has loads, with the
step it was saved at. Saves that must overlap a removal or a load are held at a known point
by a trace that blocks the background save's first request (no sleeps). Tiny models, a few
steps each: the file runs in about a minute on a laptop (ddp_spawn's process start is most
of it).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

from ckptio import Checkpointer, errors  # noqa: E402
from ckptio.lightning import CkptioCheckpointIO  # noqa: E402
from ckptio.trace import RequestEvent, Trace  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    # Lightning's own advice (num_workers, logger, ...) on a deliberately tiny CPU run
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`isinstance:FutureWarning"),  # lightning 2.6, torch 2.13
]

HOLD_SECONDS = 60.0
"""A held save waits at most this long for the event it waits for (a bound, so a broken
test fails instead of hanging; the events come within milliseconds)."""


def _tiny_class(base: Any) -> Any:
    class Tiny(base):  # type: ignore[misc,valid-type]
        def __init__(self, hidden: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Linear(hidden, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Tiny


class Tiny(_tiny_class(pl.LightningModule)):  # type: ignore[misc]
    """At module level: ``ddp_spawn`` pickles the model by reference."""


def _data(batches: int = 8) -> Any:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8 * batches, 8, generator=g)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8
    )


def _trainer(tmp_path: Path, plugin: Any, callbacks: list[Any], module: Any = pl, **kw: Any) -> Any:
    options: dict[str, Any] = {
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "accelerator": "cpu",
        "devices": 1,
        "default_root_dir": tmp_path,
        **kw,
    }
    return module.Trainer(plugins=[plugin], callbacks=callbacks, **options)


def _steps_of(paths: Iterator[Path] | list[Path]) -> dict[str, int]:
    """Every checkpoint path's name -> the global step it loads with (read afresh)."""
    io = CkptioCheckpointIO()
    return {p.name: io.load_checkpoint(p)["global_step"] for p in paths}


class _Hold(Trace):
    """A trace that, once armed, holds the first request a save's thread makes that
    ``when`` accepts (after it completed) until ``release`` is set, or HOLD_SECONDS pass: the
    save is then in flight at a known point. ``held`` tells the test it got there."""

    def __init__(self, thread: str = "ckptio-save", when: Any = None) -> None:
        super().__init__()
        self.thread = thread
        self.when = when or (lambda event: True)
        self.armed = threading.Event()
        self.held = threading.Event()
        self.release = threading.Event()
        self.timed_out = False

    def record(self, event: RequestEvent) -> None:
        super().record(event)
        if (
            self.armed.is_set()
            and threading.current_thread().name.startswith(self.thread)
            and self.when(event)
        ):
            self.armed.clear()
            self.held.set()
            self.timed_out = not self.release.wait(HOLD_SECONDS)


# -- 0. without a url, Lightning's paths are files; the data is beside them ------------------------
def _tree(root: Path) -> dict[str, set[str]]:
    """Each directory under ``root`` (relative) -> the names in it."""
    return {
        str(d.relative_to(root)): {p.name for p in d.iterdir()}
        for d in [root, *root.rglob("*")]
        if d.is_dir()
    }


@pytest.mark.parametrize("async_save", [False, True])
def test_without_a_url_each_checkpoint_path_is_a_file_and_its_root_is_beside(
    tmp_path: Path, async_save: bool
) -> None:
    """Lightning (and code around it) expects its checkpoint directory to hold checkpoint
    files only: ``os.path.isfile``, ``*.ckpt``, exact listings, its own ``last`` lookup. Each
    path is a stub file; its root is in ``ckpts.ckptio``, beside the directory, and a top-k
    removal removes both (step 2's are gone)."""
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        save_top_k=2,
        monitor="step",
        mode="max",
        save_last=True,
        every_n_train_steps=2,
    )
    trainer = _trainer(tmp_path, CkptioCheckpointIO(async_save=async_save), [ckpt], max_steps=6)
    trainer.fit(Tiny(), _data())
    ckpts, sidecar = tmp_path / "ckpts", tmp_path / "ckpts.ckptio"
    names = {"epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt", "last.ckpt"}
    assert {p.name for p in ckpts.iterdir()} == names
    assert all((ckpts / n).is_file() and not (ckpts / n).is_symlink() for n in names)
    assert {p.name for p in ckpts.glob("*.ckpt")} == names
    assert ckpt._find_last_checkpoints(trainer) == {str(ckpts / "last.ckpt")}
    assert {p.name for p in tmp_path.iterdir()} == {"ckpts", "ckpts.ckptio"}
    assert {p.name for p in sidecar.iterdir()} == names  # step 2's root went with its stub
    assert _steps_of(sorted(ckpts.iterdir())) == {
        "epoch=0-step=4.ckpt": 4,
        "epoch=0-step=6.ckpt": 6,
        "last.ckpt": 6,
    }
    # rewritten three times, last.ckpt's root has one committed step, its newest (the older
    # ones are retired: their data goes after ckptio's grace period)
    manifests = (sidecar / "last.ckpt").glob("step-*/manifest.json")
    assert [m.parent.name for m in manifests] == ["step-0000000002"]


def test_a_stub_appears_only_once_its_checkpoint_is_committed(tmp_path: Path) -> None:
    """A synchronous ``trainer.save_checkpoint`` of a new path, held while it writes its data
    (in a second thread, so the test can look): Lightning's path does not exist yet; after
    the commit it does, and loads. A reader never meets a path with nothing behind it."""
    hold = _Hold(thread="", when=lambda e: e.op == "create" and "/data/" in e.key)
    trainer = _trainer(tmp_path, CkptioCheckpointIO(trace=hold), [], max_steps=2)
    trainer.fit(Tiny(), _data())
    path = tmp_path / "ckpts" / "now.ckpt"
    hold.armed.set()
    failed: list[BaseException] = []

    def save() -> None:
        try:
            trainer.save_checkpoint(path)
        except BaseException as err:
            failed.append(err)

    saver = threading.Thread(target=save)
    saver.start()
    try:
        assert hold.held.wait(HOLD_SECONDS)
        assert not path.exists() and not trainer.checkpoint_callback.file_exists(path, trainer)
    finally:
        hold.release.set()
        saver.join()
    assert not failed and not hold.timed_out
    assert path.is_file() and _steps_of([path]) == {"now.ckpt": 2}


def test_a_checkpoint_an_earlier_version_saved_as_a_directory_still_loads(tmp_path: Path) -> None:
    """Before the sidecar layout, the plugin without a ``url`` saved each path as its own
    root, a directory (``Legacy`` below saves as it did). Such a run resumes with
    ``ckpt_path="last"`` (Lightning lists the directory and finds ``last.ckpt``, a directory);
    its ``last.ckpt`` is saved to where it is (it stays a directory: nothing is lost while
    the new one commits); new paths are stubs; top-k removes an old directory whole; and
    ``load_from_checkpoint`` reads one."""
    from ckptio import torch as ct
    from ckptio.dist import SingleProcess
    from ckptio.lightning import load_from_checkpoint

    class Legacy(CkptioCheckpointIO):
        def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
            with ct.Checkpointer(path, keep_last=1, comm=SingleProcess()) as ck:
                steps = ck.steps()
                ck.save(
                    checkpoint,
                    step=steps[-1] + 1 if steps else 0,
                    metadata={"lightning_path": str(path)},
                )

    def callback() -> Any:
        return pl.callbacks.ModelCheckpoint(
            dirpath=tmp_path / "ckpts",
            save_top_k=1,
            monitor="step",
            mode="max",
            save_last=True,
            every_n_train_steps=2,
        )

    ckpts = tmp_path / "ckpts"
    _trainer(tmp_path, Legacy(), [callback()], max_steps=4).fit(Tiny(), _data())
    assert {p.name for p in ckpts.iterdir() if p.is_dir()} == {"epoch=0-step=4.ckpt", "last.ckpt"}
    model = load_from_checkpoint(Tiny, ckpts / "epoch=0-step=4.ckpt")
    assert isinstance(model, Tiny)

    start = _StartStep()
    again = _trainer(tmp_path, CkptioCheckpointIO(), [callback(), start], max_steps=6)
    again.fit(Tiny(), _data(), ckpt_path="last")
    assert start.step == 4 and again.global_step == 6
    assert (ckpts / "last.ckpt").is_dir()  # saved to where it was
    assert (ckpts / "epoch=0-step=6.ckpt").is_file()  # a new path: a stub
    assert not (ckpts / "epoch=0-step=4.ckpt").exists()  # removed by top-1, whole
    assert _steps_of(sorted(ckpts.iterdir())) == {"epoch=0-step=6.ckpt": 6, "last.ckpt": 6}


def test_a_run_directory_moved_whole_still_loads_and_resumes(tmp_path: Path) -> None:
    """A stub names its sidecar root relative to itself: the run directory (checkpoints and
    sidecar) moved or copied elsewhere loads and resumes with ``ckpt_path="last"``."""
    import shutil

    run = tmp_path / "run"
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=run / "ckpts", save_last=True, every_n_train_steps=2
    )
    _trainer(run, CkptioCheckpointIO(), [ckpt], max_steps=4).fit(Tiny(), _data())
    moved = tmp_path / "moved"
    shutil.move(run, moved)
    assert _steps_of(sorted((moved / "ckpts").iterdir())) == {
        "epoch=0-step=4.ckpt": 4,
        "last.ckpt": 4,
    }
    start = _StartStep()
    again = pl.callbacks.ModelCheckpoint(dirpath=moved / "ckpts", save_last=True)
    _trainer(moved, CkptioCheckpointIO(), [again, start], max_steps=6).fit(
        Tiny(), _data(), ckpt_path="last"
    )
    assert start.step == 4


def test_a_root_left_without_its_stub_is_found_again(tmp_path: Path) -> None:
    """A process killed between a path's first commit and its stub leaves a committed root no
    stub names (here: the stub removed by hand); ``restore_stubs(dirpath)`` writes its stub,
    and Lightning's ``ckpt_path="last"`` resumes from it."""
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpts", save_last=True, every_n_train_steps=2
    )
    _trainer(tmp_path, CkptioCheckpointIO(), [ckpt], max_steps=4).fit(Tiny(), _data())
    ckpts = tmp_path / "ckpts"
    for stub in ckpts.iterdir():
        stub.unlink()
    io = CkptioCheckpointIO()
    assert sorted(io.restore_stubs(ckpts)) == [
        str(ckpts / "epoch=0-step=4.ckpt"),
        str(ckpts / "last.ckpt"),
    ]
    start = _StartStep()
    again = pl.callbacks.ModelCheckpoint(dirpath=ckpts, save_last=True)
    _trainer(tmp_path, io, [again, start], max_steps=6).fit(Tiny(), _data(), ckpt_path="last")
    assert start.step == 4


def test_a_checkpoint_with_no_directory_beside_it_is_refused_before_writing(
    tmp_path: Path,
) -> None:
    """A path directly in ``/`` has no directory beside its own for the sidecar: refused,
    saying to pass a ``url``, before anything is written."""
    import shutil

    path = Path(os.sep, f"ckptio-refused-{tmp_path.name}-{os.getpid()}.ckpt")
    try:
        with pytest.raises(errors.InvalidArgumentError, match=r"url="):
            CkptioCheckpointIO().save_checkpoint({"w": torch.ones(1)}, path)
        assert not path.exists()
    finally:  # whatever a wrong plugin wrote there
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


# -- 1. save_last="link" ------------------------------------------------------------------------
def test_removing_a_last_link_keeps_the_checkpoint_it_points_to(tmp_path: Path) -> None:
    """With ``save_last="link"`` and a last name that changes (``last-{epoch}``), Lightning
    removes the previous link through the plugin: the link goes, its target stays."""
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpts", save_top_k=-1, save_last="link", every_n_epochs=1
    )
    ckpt.CHECKPOINT_NAME_LAST = "last-{epoch}"
    trainer = _trainer(tmp_path, CkptioCheckpointIO(), [ckpt], max_epochs=3, limit_train_batches=2)
    trainer.fit(Tiny(), _data())
    ckpts = tmp_path / "ckpts"
    epochs = sorted(p for p in ckpts.iterdir() if p.name.startswith("epoch="))
    assert _steps_of(epochs) == {
        "epoch=0-step=2.ckpt": 2,
        "epoch=1-step=4.ckpt": 4,
        "epoch=2-step=6.ckpt": 6,
    }
    links = [p for p in ckpts.iterdir() if p.name.startswith("last")]
    assert [p.name for p in links] == ["last-epoch=2.ckpt"] and links[0].is_symlink()
    assert _steps_of(links) == {"last-epoch=2.ckpt": 6}


# -- 2. two ModelCheckpoints, one file name -----------------------------------------------------------
@pytest.mark.parametrize("url", [False, True])
def test_the_same_file_name_in_two_directories_is_two_checkpoints(
    tmp_path: Path, url: bool
) -> None:
    """A top-1 "best" callback and a keep-all one name their files alike in two directories;
    they are two roots (with a ``url``, two paths under it; without, two sidecars): the best
    one's removals never touch the other's."""
    io = CkptioCheckpointIO(f"file://{tmp_path}/store" if url else None)
    best = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "best", monitor="step", mode="max", every_n_train_steps=2
    )
    every = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "every", save_top_k=-1, every_n_train_steps=2
    )
    _trainer(tmp_path, io, [best, every], max_steps=6).fit(Tiny(), _data())
    assert _steps_of(sorted((tmp_path / "every").iterdir())) == {
        "epoch=0-step=2.ckpt": 2,
        "epoch=0-step=4.ckpt": 4,
        "epoch=0-step=6.ckpt": 6,
    }
    assert _steps_of((tmp_path / "best").iterdir()) == {"epoch=0-step=6.ckpt": 6}
    assert io.load_checkpoint(tmp_path / "every" / "epoch=0-step=2.ckpt")["global_step"] == 2


# -- 3. a model back from best_model_path -----------------------------------------------------------
@pytest.mark.parametrize("url", [False, True])
def test_a_trained_model_comes_back_from_best_model_path(tmp_path: Path, url: bool) -> None:
    """``LightningModule.load_from_checkpoint`` reads with ``torch.load`` and cannot read a
    ckptio checkpoint (the path is a JSON stub); ``ckptio.lightning.load_from_checkpoint``
    builds the model as it would (hyperparameters, weights), with or without a ``url``."""
    io = CkptioCheckpointIO(f"file://{tmp_path}/store" if url else None)
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpts", monitor="step", mode="max", every_n_train_steps=4
    )
    model = Tiny(hidden=8)
    _trainer(tmp_path, io, [ckpt], max_steps=8).fit(model, _data())
    best = ckpt.best_model_path
    assert Path(best).name == "epoch=0-step=8.ckpt"
    with pytest.raises(pickle.UnpicklingError, match="Unsupported operand 123"):
        Tiny.load_from_checkpoint(best)  # torch.load of the stub, "{": the plugin is not asked
    from ckptio.lightning import load_from_checkpoint

    back = load_from_checkpoint(Tiny, best)
    assert isinstance(back, Tiny) and back.hparams["hidden"] == 8
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    wider = load_from_checkpoint(Tiny, best, strict=False, hidden=8, plugin=io)
    assert torch.equal(wider.net.weight, model.net.weight)


# -- 4. a removal while the save of that path runs in Lightning's AsyncCheckpointIO -----------------
def test_a_removal_waits_for_the_save_of_that_path_in_flight(tmp_path: Path) -> None:
    """Lightning's ``AsyncCheckpointIO`` runs the plugin's save in its own thread; the save of
    step 2 is held mid-way until ``save_top_k`` removes that path on the main thread (after
    step 4 was saved). The removal waits for the save, then removes it whole: fit ends
    without error, and what is left loads."""
    # Lightning's AsyncCheckpointIO runs the save in its ThreadPoolExecutor; held once its
    # first data object is being written
    hold = _Hold("ThreadPoolExecutor", lambda e: e.op == "create" and "/data/" in e.key)

    class Plugin(CkptioCheckpointIO):
        def remove_checkpoint(self, path: Any) -> None:
            # Lightning queues the save and removes on the main thread, either may come first
            # (a removal that comes first finds nothing, with any plugin): here the save of
            # this path is surely mid-write when the removal starts
            assert hold.held.wait(HOLD_SECONDS)
            hold.release.set()  # the held save may go on; this removal must wait for it
            super().remove_checkpoint(path)

    class Arm(pl.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 2:  # ModelCheckpoint saves step 2 right after this
                hold.armed.set()

    from pytorch_lightning.plugins.io.async_plugin import AsyncCheckpointIO

    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpts", monitor="step", mode="max", every_n_train_steps=2
    )
    wrapped = AsyncCheckpointIO(Plugin(trace=hold))
    _trainer(tmp_path, wrapped, [Arm(), ckpt], max_steps=4).fit(Tiny(), _data())
    assert hold.held.is_set() and not hold.timed_out
    assert _steps_of((tmp_path / "ckpts").iterdir()) == {"epoch=0-step=4.ckpt": 4}


# -- 5. no thread outlives fit ----------------------------------------------------------------------
def _ckptio_threads() -> set[threading.Thread]:
    """ckptio's threads, less its process-wide CPU pool (CRC32C and copies: it lives as long
    as the process, by design)."""
    return {
        t
        for t in threading.enumerate()
        if t.name.startswith("ckptio-") and not t.name.startswith("ckptio-cpu")
    }


def test_a_closed_checkpointer_leaves_no_thread(tmp_path: Path) -> None:
    """``Checkpointer.close`` closes the store it opened (its I/O threads with it), plain and
    tiered; a Store passed in stays open for its owner."""
    from ckptio.registry import open_store

    before = _ckptio_threads()
    state = {"w": torch.arange(1 << 16, dtype=torch.float32).numpy()}
    with Checkpointer(tmp_path / "plain", async_save=True) as ck:
        ck.save(state, step=1)
    with Checkpointer(tmp_path / "durable", local=str(tmp_path / "fast")) as ck:
        ck.save(state, step=1)
    assert _ckptio_threads() == before
    store = open_store(tmp_path / "given")
    with Checkpointer(store) as ck:
        ck.save(state, step=1)
    assert store.list("")  # still usable: not closed by the Checkpointer
    store.close()


@pytest.mark.parametrize("async_save", [False, True])
def test_no_thread_of_the_plugin_outlives_fit(tmp_path: Path, async_save: bool) -> None:
    before = _ckptio_threads()
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        save_top_k=2,
        monitor="step",
        mode="max",
        save_last=True,
        every_n_train_steps=2,
    )
    io = CkptioCheckpointIO(async_save=async_save)
    _trainer(tmp_path, io, [ckpt], max_steps=6).fit(Tiny(), _data())
    assert _ckptio_threads() == before
    assert _steps_of(sorted((tmp_path / "ckpts").iterdir())) == {
        "epoch=0-step=4.ckpt": 4,
        "epoch=0-step=6.ckpt": 6,
        "last.ckpt": 6,
    }


def test_an_async_save_outside_fit_ends_its_threads_by_itself(tmp_path: Path) -> None:
    """``trainer.save_checkpoint`` with ``async_save=True`` outside ``fit`` (no ``teardown``
    follows): the save's thread is alive while it commits (what Lightning's thread check
    meets when a test ends right after such a save), and every ckptio thread of it ends once
    the save is committed, with nothing else called."""
    hold = _Hold()
    trainer = _trainer(tmp_path, CkptioCheckpointIO(async_save=True, trace=hold), [], max_steps=2)
    trainer.fit(Tiny(), _data())
    before = _ckptio_threads()
    hold.armed.set()
    trainer.save_checkpoint(tmp_path / "out.ckpt")
    assert hold.held.wait(HOLD_SECONDS)
    assert {t.name for t in _ckptio_threads() - before} == {"ckptio-save_0"}  # committing
    hold.release.set()
    for _ in range(10):  # the save's thread starts the one that closes its Checkpointer
        alive = _ckptio_threads() - before
        for thread in alive:
            thread.join(HOLD_SECONDS)
    assert not _ckptio_threads() - before and not hold.timed_out
    assert _steps_of([tmp_path / "out.ckpt"]) == {"out.ckpt": 2}


def test_teardown_never_meets_a_closing_thread_not_yet_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async save's own thread, once committed, starts a thread that closes its
    Checkpointer and lists it for ``teardown`` to join (when no plugin call came first).
    Listed before it was started, a ``teardown`` in between failed with "cannot join thread
    before it is started" (the end of ``fit`` in docs/training.md's example). The closing
    thread of a save outside ``fit`` is recorded as it starts: not listed yet; then
    ``teardown`` joins it."""
    plugin = CkptioCheckpointIO(async_save=True)
    trainer = _trainer(tmp_path, plugin, [], max_steps=2)
    trainer.fit(Tiny(), _data())
    listed_before_start: list[bool] = []
    started = threading.Event()

    class Recorded(threading.Thread):
        def start(self) -> None:
            if self.name == "ckptio-close":
                listed_before_start.append(self in plugin._closers)
                started.set()
            super().start()

    monkeypatch.setattr(threading, "Thread", Recorded)
    trainer.save_checkpoint(tmp_path / "out.ckpt")
    assert started.wait(HOLD_SECONDS)  # committed; nothing called the plugin meanwhile
    monkeypatch.undo()
    plugin.teardown()
    assert listed_before_start == [False]
    assert _steps_of([tmp_path / "out.ckpt"]) == {"out.ckpt": 2}


# -- 6. strategy="ddp_spawn" ------------------------------------------------------------------------
@pytest.mark.slow
def test_ddp_spawn_sends_the_plugin_to_its_processes(tmp_path: Path) -> None:
    """``ddp_spawn`` pickles the Trainer, plugin included, into a new process: the plugin
    pickles without its live state (also after it has saved), the spawned process saves
    through it, and the parent loads the weights it sent back through it."""
    io = CkptioCheckpointIO(async_save=True)
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, tmp_path / "before.ckpt")
    assert pickle.loads(pickle.dumps(io)).async_save is True
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=4)
    model = Tiny()
    trainer = _trainer(tmp_path, io, [ckpt], max_steps=4, strategy="ddp_spawn")
    trainer.fit(model, _data())
    assert trainer.state.finished
    io.teardown()
    assert _steps_of((tmp_path / "ckpts").iterdir()) == {"epoch=0-step=4.ckpt": 4}
    saved = CkptioCheckpointIO().load_checkpoint(tmp_path / "ckpts" / "epoch=0-step=4.ckpt")
    for k, v in model.state_dict().items():  # the parent's model holds the trained weights
        assert torch.equal(saved["state_dict"][k], v), k


# -- 7. import lightning as L ------------------------------------------------------------------------
def test_the_unified_lightning_package_accepts_the_plugin(tmp_path: Path) -> None:
    """With ``lightning`` installed beside ``pytorch-lightning``, ``L.Trainer`` accepts the
    plugin as ``pytorch_lightning.Trainer`` does; both save and resume through it."""
    L = pytest.importorskip("lightning")
    for module, base in ((L, L.LightningModule), (pl, pl.LightningModule)):
        io = CkptioCheckpointIO()
        trainer = _trainer(tmp_path, io, [], module=module, max_steps=2)
        assert trainer.strategy.checkpoint_io is io
        trainer.fit(_tiny_class(base)(), _data())
        path = tmp_path / f"{module.__name__}.ckpt"
        trainer.save_checkpoint(path)
        again = _trainer(tmp_path, CkptioCheckpointIO(), [], module=module, max_steps=4)
        again.fit(_tiny_class(base)(), _data(), ckpt_path=str(path))
        assert again.global_step == 4


# -- 8. async_save=True: a path being saved is there -----------------------------------------------
def test_a_load_waits_for_an_async_save_of_that_path(tmp_path: Path) -> None:
    """``trainer.save_checkpoint`` returns before an async save commits; a second Trainer in
    the same process (its own plugin) resuming from that path right away reads it, not
    nothing: its load waits for the commit."""
    hold = _Hold()

    class Loader(CkptioCheckpointIO):
        def load_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
            hold.release.set()  # the held save may go on; this load must wait for it
            return super().load_checkpoint(*args, **kwargs)

    trainer = _trainer(tmp_path, CkptioCheckpointIO(async_save=True, trace=hold), [], max_steps=3)
    trainer.fit(Tiny(), _data())
    path = tmp_path / "now.ckpt"
    hold.armed.set()
    trainer.save_checkpoint(path)
    assert hold.held.wait(HOLD_SECONDS)  # in flight, nothing of it stored yet
    again = _trainer(tmp_path, Loader(), [], max_steps=5)
    again.fit(Tiny(), _data(), ckpt_path=str(path))
    assert not hold.timed_out and again.global_step == 5
    trainer.strategy.checkpoint_io.teardown()


@pytest.mark.parametrize("url", [False, True])
def test_the_version_counter_sees_an_async_save_in_flight(tmp_path: Path, url: bool) -> None:
    """``ModelCheckpoint`` (top 2, one file name) picks a free name by asking whether the file
    exists (through fsspec, not the plugin). The first async save of ``ckpt.ckpt`` is held
    before it stores anything; the next save must still see the name taken and use
    ``ckpt-v1.ckpt`` (Lightning's default plugin does), and both load afterwards."""
    hold = _Hold()

    class Plugin(CkptioCheckpointIO):
        calls = 0

        def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
            Plugin.calls += 1
            if Plugin.calls == 2:  # the version counter has chosen the second name
                hold.release.set()
            super().save_checkpoint(*args, **kwargs)

    io = Plugin(f"file://{tmp_path}/store" if url else None, async_save=True, trace=hold)
    hold.armed.set()
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        filename="ckpt",
        save_top_k=2,
        monitor="step",
        mode="max",
        every_n_train_steps=2,
    )
    _trainer(tmp_path, io, [ckpt], max_steps=4).fit(Tiny(), _data())
    assert hold.held.is_set() and not hold.timed_out
    assert _steps_of(sorted((tmp_path / "ckpts").iterdir())) == {
        "ckpt.ckpt": 2,
        "ckpt-v1.ckpt": 4,
    }


# -- 9. memory:// means what it means to Lightning ------------------------------------------------------
@contextlib.contextmanager
def _fsspec_memory(name: str) -> Iterator[str]:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    try:
        yield f"memory://{name}"
    finally:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(f"/{name}", recursive=True)


def test_memory_paths_are_where_lightning_looks(tmp_path: Path) -> None:
    """A ``memory://`` path in Lightning is fsspec's in-memory filesystem; the plugin stores
    there too, so Lightning's own checks see what it saved (``ModelCheckpoint`` asks fsspec
    whether a file exists) and ``ckpt_path="hpc"`` finds the newest HPC checkpoint. (Its
    ``ckpt_path="last"`` does not work on a non-local directory even with Lightning's
    default plugin: its listing drops the protocol; an explicit path works.)"""
    fsspec = pytest.importorskip("fsspec")
    with _fsspec_memory(f"ckptio-{tmp_path.name}") as root:
        ckpt = pl.callbacks.ModelCheckpoint(
            dirpath=f"{root}/ckpts", save_last=True, every_n_train_steps=2
        )
        trainer = _trainer(tmp_path, CkptioCheckpointIO(), [ckpt], max_steps=4)
        trainer.fit(Tiny(), _data())
        assert fsspec.filesystem("memory").exists(f"{root}/ckpts/last.ckpt")
        assert ckpt.file_exists(f"{root}/ckpts/epoch=0-step=2.ckpt", trainer)

        for version in (1, 3):
            trainer.save_checkpoint(f"{root}/hpc_ckpt_{version}.ckpt")
        start = _StartStep()
        hpc = _trainer(root, CkptioCheckpointIO(), [start], max_steps=5)
        hpc.fit(Tiny(), _data(), ckpt_path="hpc")
        assert hpc.ckpt_path == f"{root}/hpc_ckpt_3.ckpt" and start.step == 4

        start = _StartStep()
        again = _trainer(tmp_path, CkptioCheckpointIO(), [start], max_steps=6)
        again.fit(Tiny(), _data(), ckpt_path=f"{root}/ckpts/last.ckpt")
        assert start.step == 4


class _StartStep(pl.Callback):
    """Records the global step training starts at (the resumed one)."""

    step: int | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.step = trainer.global_step
