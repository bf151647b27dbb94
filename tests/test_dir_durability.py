"""Every directory a save creates on a POSIX store is made durable in its parent: after the
mkdir, the parent directory is fsynced, at every level (the step's directories, the root,
the root's own missing parents). The test records the mkdir and fsync calls of a real save
(``os.open`` maps descriptors to paths) and checks the order: each created directory's parent
is fsynced after the directory was created."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from ckptio.backends import _durabledirs

import ckptio
from ckptio import errors
from ckptio.registry import open_store


class Recorder:
    """``("mkdir", path)``, ``("fsync", path)`` and ``("write", path)`` (``os.pwrite``, how data
    objects are written) events, in the order they happened."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self._paths: dict[int, str] = {}
        self._lock = threading.Lock()

    def install(self, mp: pytest.MonkeyPatch) -> None:
        real_open, real_fsync, real_mkdir, real_pwrite = os.open, os.fsync, os.mkdir, os.pwrite

        def rec_open(path: str, flags: int, *args: object, **kw: object) -> int:
            fd = real_open(path, flags, *args, **kw)  # type: ignore[arg-type]
            with self._lock:
                self._paths[fd] = os.path.abspath(os.fsdecode(path))
            return fd

        def rec_fsync(fd: int) -> None:
            real_fsync(fd)
            with self._lock:
                self.events.append(("fsync", self._paths.get(fd, f"<fd {fd}>")))

        def rec_mkdir(path: str, *args: object, **kw: object) -> None:
            real_mkdir(path, *args, **kw)  # type: ignore[arg-type]
            with self._lock:
                self.events.append(("mkdir", os.path.abspath(os.fsdecode(path))))

        def rec_pwrite(fd: int, data: bytes, offset: int) -> int:
            with self._lock:
                self.events.append(("write", self._paths.get(fd, f"<fd {fd}>")))
            return real_pwrite(fd, data, offset)

        mp.setattr(os, "open", rec_open)
        mp.setattr(os, "fsync", rec_fsync)
        mp.setattr(os, "mkdir", rec_mkdir)
        mp.setattr(os, "pwrite", rec_pwrite)

    def undurable(self, created: list[str]) -> list[str]:
        """Directories of ``created`` whose parent was not fsynced after their mkdir."""
        bad = []
        for d in created:
            made = [i for i, ev in enumerate(self.events) if ev == ("mkdir", d)]
            if not made:
                bad.append(f"{d} (no mkdir recorded)")
                continue
            parent = os.path.dirname(d)
            if not any(ev == ("fsync", parent) for ev in self.events[made[0] + 1 :]):
                bad.append(d)
        return bad


def _dirs_under(top: Path) -> set[str]:
    return {str(p) for p in top.rglob("*") if p.is_dir()} | ({str(top)} if top.is_dir() else set())


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    rec = Recorder()
    rec.install(monkeypatch)
    yield rec


STATE = {"w": np.arange(4096, dtype=np.float32), "b": np.ones((64, 64), dtype=np.float64)}


@pytest.mark.parametrize("scheme", ["file", "pfs-fanout"])
def test_every_directory_a_save_creates_is_fsynced_in_its_parent(
    tmp_path: Path, recorder: Recorder, scheme: str
) -> None:
    root = tmp_path / "a" / "b" / "run"
    url = f"pfs://{root}?fanout=true" if scheme == "pfs-fanout" else str(root)
    before = _dirs_under(tmp_path)
    ck = ckptio.Checkpointer(url, async_save=False)
    try:
        ck.save(STATE, step=1)
        created_1 = sorted(_dirs_under(tmp_path) - before)
        # the root, its missing parents and the step's directories were all made by the save
        assert str(tmp_path / "a") in created_1 and str(root) in created_1
        assert any(d.startswith(str(root / "step-")) for d in created_1)
        assert recorder.undurable(created_1) == []

        # a second save with the same store: the new step's directories, too (nothing cached
        # may stand in for a directory this save creates)
        seen = _dirs_under(tmp_path)
        recorder.events.clear()
        ck.save(STATE, step=2)
        created_2 = sorted(_dirs_under(tmp_path) - seen)
        assert created_2 and recorder.undurable(created_2) == []
    finally:
        ck.close()
    np.testing.assert_array_equal(ckptio.load(url, step=2)["w"], STATE["w"])


def test_a_save_fsyncs_nothing_before_its_first_data_write(
    tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The save's lease is visible before any data is written, but not fsynced: only processes
    running beside the save read it, and a crash ends the save. So no fsync (a journal commit
    on ext4) stands between the start of a save and its first data byte; the directories made
    for the lease are made durable after the data (the test above)."""
    root = tmp_path / "run"
    leases_at_write: list[list[str]] = []  # the leases present at each data write
    recorded_pwrite = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        leases_at_write.append([p.name for p in root.glob("step-*/saving-*.json")])
        return recorded_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    ckptio.save(STATE, str(root), step=1)
    kinds = [kind for kind, _ in recorder.events]
    assert "write" in kinds and "fsync" in kinds
    first_write = kinds.index("write")
    assert "fsync" not in kinds[:first_write], recorder.events[: first_write + 1]
    assert leases_at_write and all(len(names) == 1 for names in leases_at_write)
    assert list(root.glob("step-*/saving-*.json")) == []  # released after the commit
    np.testing.assert_array_equal(ckptio.load(str(root), step=1)["w"], STATE["w"])


def test_no_directory_fsync_per_object(tmp_path: Path, recorder: Recorder) -> None:
    """Directories are made durable once each: many objects in one directory cost one fsync of
    its parent, not one per object."""
    store = open_store(str(tmp_path / "run"))
    try:
        for i in range(20):
            store.publish(f"step-1/data/o{i}", b"x")
    finally:
        store.close()
    parent_syncs = [
        ev for ev in recorder.events if ev == ("fsync", str(tmp_path / "run" / "step-1"))
    ]
    assert len(parent_syncs) == 1


def test_a_directory_removed_behind_the_stores_back_is_created_again(tmp_path: Path) -> None:
    """The store remembers directories it made; one removed since (another process's gc or
    retention pruning an empty step) is created again, not written into as if it existed."""
    url = str(tmp_path / "run")
    ck = ckptio.Checkpointer(url, async_save=False)
    try:
        ck.save(STATE, step=1)
        shutil.rmtree(tmp_path / "run")
        ck.save(STATE, step=1)
    finally:
        ck.close()
    np.testing.assert_array_equal(ckptio.load(url, step=1)["b"], STATE["b"])


def test_a_directory_another_client_is_still_making_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``mkdir`` that answers ESTALE, then EEXIST, while the directory cannot be looked up
    yet (what a GlusterFS client meets while another node's ``mkdir`` of it is under way:
    the real race runs in tests/test_cluster_nodes.py): the publish waits until the
    directory is there and lands in it."""
    store = open_store(str(tmp_path / "run"))
    target = str(tmp_path / "run" / "step-1")
    answers = [errno.ESTALE, errno.EEXIST]
    real_mkdir = os.mkdir

    def other_client_mkdir(path: str) -> None:
        with contextlib.suppress(FileExistsError):  # this client's retry made it first
            real_mkdir(path)

    def racing_mkdir(path: str, *args: object) -> None:
        if path == target and answers:
            code = answers.pop(0)
            if not answers:  # the other client's mkdir completes a moment later
                threading.Timer(0.05, other_client_mkdir, (path,)).start()
            raise OSError(code, os.strerror(code), path)
        real_mkdir(path, *args)

    monkeypatch.setattr(_durabledirs.os, "mkdir", racing_mkdir)
    store.publish("step-1/x.json", b"{}", overwrite=False)
    assert answers == []
    assert (tmp_path / "run" / "step-1" / "x.json").read_bytes() == b"{}"


def test_a_file_where_a_directory_goes_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A regular file in the place of a step's directory is not a directory still being
    made elsewhere: the publish fails with the EEXIST naming the path, without waiting."""
    monkeypatch.setattr(_durabledirs, "MKDIR_RACE_SECONDS", 3600.0)  # a wait would hang
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "step-1").write_bytes(b"not a directory")
    store = open_store(str(tmp_path / "run"))
    with pytest.raises(errors.AlreadyExistsError, match="step-1"):
        store.publish("step-1/x.json", b"{}", overwrite=False)
