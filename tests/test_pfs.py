"""pfs:// on local disk: filesystem detection, positional writes (beyond the conformance suite,
whose pfs classes are in test_conformance_core.py), the N-N and N-1 layouts, Lustre striping through a stand-in ``lfs``, and read-only / full
filesystems (real tmpfs mounts)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from ckptio.backends.local import LocalStore
from ckptio.backends.parallelfs import ParallelFSStore, detect_fs, kind_of, mount_of, stripe_for

import ckptio
from ckptio import errors
from ckptio.registry import open_store

FIXTURES = Path(__file__).parent / "fixtures"
MiB = 2**20


def walk_files(root: str) -> list[str]:
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.relpath(os.path.join(d, f), root) for f in files]
    return sorted(out)


# -- detection ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("magic", "mount_type", "kind"),
    [
        (0x0BD00BD0, "lustre", "lustre"),
        (0x47504653, "gpfs", "gpfs"),
        (0x19830326, "beegfs", "beegfs"),
        (0x65735546, "fuse.glusterfs", "glusterfs"),
        (0x65735546, "fuse.sshfs", "fuse"),
        (0x6969, "nfs4", "nfs"),
        (0xEF53, "ext4", "ext4"),
        (0x58465342, "xfs", "xfs"),
        (0x01021994, "tmpfs", "tmpfs"),
        (0x12345678, "weird", "other"),
    ],
)
def test_pfs_kind_from_statfs_magic(magic: int, mount_type: str, kind: str) -> None:
    assert kind_of(magic, mount_type) == kind


def test_pfs_detects_the_real_root_filesystem(tmp_path: Path) -> None:
    info = detect_fs(str(tmp_path / "not" / "yet" / "made"))  # nearest existing parent counts
    point, mtype = mount_of(str(tmp_path))
    assert info.mount_point == point and info.mount_type == mtype
    assert info.kind == kind_of(info.magic, mtype)
    assert info.magic != 0 and info.block_size > 0
    assert not info.parallel
    # file:// there stays the plain local store
    assert type(open_store(f"file://{tmp_path}/x")) is LocalStore


def test_pfs_mount_table_parsing(tmp_path: Path) -> None:
    table = tmp_path / "mounts"
    table.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        "10.0.0.1@tcp:/lfs /lustre lustre rw 0 0\n"
        "host:/gv0 /lustre/gv fuse.glusterfs rw 0 0\n"
    )
    assert mount_of("/lustre/run1/x", str(table)) == ("/lustre", "lustre")
    assert mount_of("/lustre/gv/run", str(table)) == ("/lustre/gv", "fuse.glusterfs")
    assert mount_of("/lustrex", str(table)) == ("/", "ext4")


def test_pfs_unknown_fs_and_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="valid: auto, lustre, gpfs"):
        ParallelFSStore(f"pfs://{tmp_path}", fs="zfs")
    with pytest.raises(
        errors.InvalidArgumentError, match="stripe_size must be a positive multiple of 64 KiB"
    ):
        ParallelFSStore(f"pfs://{tmp_path}", stripe_size="100KiB")
    with pytest.raises(errors.InvalidArgumentError, match="stripe_count"):
        ParallelFSStore(f"pfs://{tmp_path}", stripe_count=0)
    with pytest.raises(errors.InvalidArgumentError, match=r"valid options: .*fs, .*stripe_count"):
        ParallelFSStore(f"pfs://{tmp_path}", stripes=4)


def test_pfs_url_options_and_kind_defaults(tmp_path: Path) -> None:
    s = open_store(f"pfs://{tmp_path}/r?fs=gpfs&stripe_count=4")
    assert isinstance(s, ParallelFSStore)
    assert s.root == f"{tmp_path}/r" and s.fs.kind == "gpfs" and s.stripe_count == 4
    assert s.direct and s.fanout and s.preferred_key_layout == "hashed"
    g = open_store(f"pfs://{tmp_path}/r?fs=glusterfs")
    assert not g.fanout and g.preferred_key_layout == "flat"  # type: ignore[attr-defined]
    assert (
        open_store(f"pfs://{tmp_path}/r?fs=gpfs&fanout=0&direct=false").preferred_key_layout
        == "flat"
    )


# -- positional writes -------------------------------------------------------------------------


@pytest.mark.parametrize("direct", [False, True])
def test_pfs_positional_writes_from_several_writers(tmp_path: Path, direct: bool) -> None:
    store = ParallelFSStore(f"pfs://{tmp_path}", direct=direct, block_size="1MiB")
    rng = np.random.default_rng(3)
    parts = [rng.integers(0, 255, 3 * MiB + 100, dtype=np.uint8) for _ in range(3)]
    starts = [0, 4 * MiB, 8 * MiB]
    store.open_positional("shared.bin", 12 * MiB, create=True).close()
    assert store.size("shared.bin") == 12 * MiB  # visible at full size from creation
    writers = [store.open_positional("shared.bin", 12 * MiB) for _ in parts]
    for w, part, start in zip(writers, parts, starts, strict=True):
        w.pwrite(start, part)
    for w in writers:
        w.close()
    data = np.frombuffer(store.get("shared.bin"), dtype=np.uint8)
    for part, start in zip(parts, starts, strict=True):
        assert np.array_equal(data[start : start + part.nbytes], part)
    ops = [e.op for e in store.trace.events() if e.key == "shared.bin"]
    assert ops.count("create") == 1 and ops.count("open") == 3 and ops.count("fsync") == 4
    assert ops.count("close") == 4 and "write" in ops


def test_pfs_positional_open_of_a_missing_object_names_it(tmp_path: Path) -> None:
    store = ParallelFSStore(f"pfs://{tmp_path}")
    with pytest.raises(errors.NotFoundError, match=re.escape(str(tmp_path / "nope.bin"))):
        store.open_positional("nope.bin", 10)


def test_pfs_memory_store_refuses_the_shared_file_layout(memory_url: str) -> None:
    with pytest.raises(
        errors.InvalidArgumentError, match=r"needs positional writes.*valid here: file-per-shard"
    ):
        ckptio.save({"x": np.zeros(4)}, memory_url, step=1, layout="shared-file")
    with pytest.raises(errors.InvalidArgumentError, match="valid: file-per-shard, shared-file"):
        ckptio.save({"x": np.zeros(4)}, memory_url, step=1, layout="n-1")


# -- layouts, one process ----------------------------------------------------------------------

STATE = {
    "model": {
        "w": np.arange(200 * 300, dtype=np.float32).reshape(200, 300),
        "b": np.ones(7, np.float16),
    },
    "opt": {"m": np.full((50, 50), 3, dtype=np.int8)},
    "step": 3,
}


@pytest.mark.parametrize("layout", ["file-per-shard", "shared-file", "shared-file-per-node"])
def test_pfs_layouts_save_load_verify(tmp_path: Path, layout: str) -> None:
    url = f"pfs://{tmp_path}/run"
    ckptio.save(STATE, url, step=3, layout=layout, chunk_size=65536)
    back = ckptio.load(url)
    assert np.array_equal(back["model"]["w"], STATE["model"]["w"])
    assert back["model"]["b"].dtype == np.float16 and back["step"] == 3
    assert ckptio.verify(url) == []
    reader = ckptio.open_checkpoint(url)
    assert reader.manifest.layout["kind"] == layout
    objects = list(reader.manifest.objects)
    assert len(objects) == 1 if layout.startswith("shared") else len(objects) >= 1
    # every chunk 4 KiB aligned in its object
    assert all(c.offset % 4096 == 0 for t in reader.manifest.tensors.values() for c in t.chunks)
    # a flipped byte in the shared object is found and named
    if layout == "shared-file":
        path = tmp_path / "run" / "step-0000000003" / objects[0]
        with open(path, "r+b") as fh:
            fh.seek(4096 * 3 + 5)
            b = fh.read(1)
            fh.seek(4096 * 3 + 5)
            fh.write(bytes([b[0] ^ 0xFF]))
        problems = ckptio.verify(url)
        assert len(problems) == 1 and objects[0] in problems[0]


def test_pfs_fanout_spreads_shard_files_over_directories(tmp_path: Path) -> None:
    url = f"pfs://{tmp_path}/run?fanout=true"
    ckptio.save(STATE, url, step=1, chunk_size=4096, max_object_size=8192)
    reader = ckptio.open_checkpoint(url)
    assert reader.manifest.layout["key_layout"] == "hashed"
    dirs = {os.path.dirname(k) for k in reader.manifest.objects}
    assert len(reader.manifest.objects) > 20 and len(dirs) > 5
    assert all(re.fullmatch(r"data/[0-9a-f]{2}", d) for d in dirs)
    assert ckptio.verify(url) == []
    # anyone can read it back, through plain file:// too
    assert np.array_equal(ckptio.load(f"file://{tmp_path}/run")["opt"]["m"], STATE["opt"]["m"])


def test_pfs_trace_has_metadata_ops_per_file(tmp_path: Path) -> None:
    store = ParallelFSStore(f"pfs://{tmp_path}/run")
    ckptio.save(STATE, store, step=1, chunk_size=65536, max_object_size=65536)
    objects = [k for k in store.list("step-") if "/data/" in k]
    assert len(objects) >= 2
    for key in objects:
        ops = [e.op for e in store.trace.events() if e.key == key]
        for op in ("create", "write", "fsync", "close", "rename"):
            assert op in ops, (key, op, ops)
    assert all(e.end >= e.start for e in store.trace.events())


# -- Lustre through a stand-in lfs -------------------------------------------------------------


@pytest.fixture
def lfs_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in ``lfs`` first on PATH, logging to the returned file."""
    log = tmp_path / "lfs.log"
    monkeypatch.setenv("PATH", f"{FIXTURES}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("LFS_LOG", str(log))
    return log


def lfs_calls(log: Path) -> list[list[str]]:
    return [line.split(" ") for line in log.read_text().splitlines()] if log.exists() else []


def test_lustre_stripe_count_by_size() -> None:
    gib = 2**30
    assert [stripe_for(n) for n in (1, gib - 1, gib, 8 * gib - 1, 8 * gib, 64 * gib, 10**15)] == [
        1,
        1,
        4,
        4,
        8,
        -1,
        -1,
    ]


def test_lustre_each_shard_file_is_created_by_lfs_setstripe(tmp_path: Path, lfs_log: Path) -> None:
    store = ParallelFSStore(f"pfs://{tmp_path}/run", fs="lustre")
    assert store.direct and store.positional_alignment == 4 * MiB
    data = np.arange(3 * MiB // 8, dtype=np.float64)
    store.put("a/shard.bin", data)
    store.publish("a/manifest.json", b"{}")  # small commit object: default layout, no lfs
    (call,) = lfs_calls(lfs_log)
    assert call[:5] == ["setstripe", "-c", "1", "-S", str(4 * MiB)]
    assert re.fullmatch(
        re.escape(f"{tmp_path}/run/a/.shard.bin.ckptio-tmp-") + "[0-9a-f]{12}", call[5]
    )
    assert store.get("a/shard.bin") == data.tobytes()
    assert [e.op for e in store.trace.events() if e.op == "setstripe"] == ["setstripe"]


def test_lustre_stripe_options_are_passed_exactly(tmp_path: Path, lfs_log: Path) -> None:
    store = open_store(f"pfs://{tmp_path}/run?fs=lustre&stripe_count=-1&stripe_size=1MiB")
    with store.open_writer("big.bin", size_hint=20 * 2**30) as w:  # hint only; writes little
        w.write(b"x" * 10)
    store2 = open_store(f"pfs://{tmp_path}/run?fs=lustre&stripe_size=16MiB")
    with store2.open_writer("huge.bin", size_hint=10 * 2**30) as w:
        w.write(b"y")
    calls = lfs_calls(lfs_log)
    assert [c[:5] for c in calls] == [
        ["setstripe", "-c", "-1", "-S", "1048576"],
        ["setstripe", "-c", "8", "-S", "16777216"],
    ]


def test_lustre_shared_file_and_shards_in_a_checkpoint(tmp_path: Path, lfs_log: Path) -> None:
    url = f"pfs://{tmp_path}/run?fs=lustre&stripe_size=1MiB"
    ckptio.save(STATE, url, step=5, layout="shared-file")
    ckptio.save(STATE, url, step=6)
    calls = lfs_calls(lfs_log)
    assert len(calls) == 2
    shared, shard = calls
    assert shared[:5] == ["setstripe", "-c", "1", "-S", "1048576"]
    assert re.fullmatch(
        re.escape(f"{tmp_path}/run/step-0000000005/data/shared-") + "[0-9a-f]{8}\\.bin", shared[5]
    )
    # N-N: the shard object's temp file, in a fan-out directory (hashed keys on Lustre)
    assert re.fullmatch(
        re.escape(f"{tmp_path}/run/step-0000000006/data/")
        + r"[0-9a-f]{2}/\.rank-00000-000-[0-9a-f]{8}\.bin\.ckptio-tmp-[0-9a-f]{12}",
        shard[5],
    )
    for step in (5, 6):
        assert np.array_equal(ckptio.load(url, step=step)["model"]["w"], STATE["model"]["w"])
        assert ckptio.verify(url, step=step) == []


def test_lustre_lfs_failure_is_a_clear_error(
    tmp_path: Path, lfs_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LFS_FAIL", "1")
    store = ParallelFSStore(f"pfs://{tmp_path}/run", fs="lustre")
    with pytest.raises(errors.StorageError) as info:
        store.put("x.bin", b"z" * 100)
    msg = str(info.value)
    assert (
        f"cannot stripe {tmp_path}/run/x.bin" in msg
        and "lfs setstripe -c 1" in msg
        and "exited 28" in msg
    )
    assert store.list("") == [] and store.list_incomplete("") == []


def test_lustre_without_lfs_warns_and_still_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ParallelFSStore(f"pfs://{tmp_path}/run", fs="lustre", lfs="no-such-lfs-here")
    with caplog.at_level(logging.WARNING, logger="ckptio.backends.parallelfs"):
        store.put("x.bin", b"z" * 100)
        store.put("y.bin", b"z" * 100)
    assert store.get("x.bin") == b"z" * 100
    warned = [r for r in caplog.records if "no-such-lfs-here" in r.getMessage()]
    assert len(warned) == 1 and "default striping" in warned[0].getMessage()


# -- read-only and full filesystems (real tmpfs mounts) ----------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    point = tmp_path / "fs"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=True)


def test_pfs_read_only_filesystem_error_names_the_path(small_tmpfs: Path) -> None:
    url = f"pfs://{small_tmpfs}/run"
    ckptio.save({"x": np.ones(10)}, url, step=1)
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    store = ParallelFSStore(url)
    assert store.fs.kind == "tmpfs"
    with pytest.raises(
        errors.StoragePermissionError,
        match=re.escape(f"{small_tmpfs}/run/a.bin") + ".*Read-only file system",
    ):
        store.put("a.bin", b"x")
    with pytest.raises(
        errors.SaveFailedError,
        match=re.escape(f"{small_tmpfs}/run/step-0000000002") + ".*Read-only file system",
    ) as info:
        ckptio.save({"x": np.zeros(10)}, url, step=2)
    assert isinstance(info.value.__cause__, errors.StoragePermissionError)
    assert np.array_equal(ckptio.load(url)["x"], np.ones(10))  # still readable


@pytest.mark.parametrize("layout", ["file-per-shard", "shared-file"])
def test_pfs_full_filesystem_mid_save_keeps_the_earlier_checkpoint(
    small_tmpfs: Path, layout: str
) -> None:
    url = f"pfs://{small_tmpfs}/run"
    small = {"w": np.arange(64 * 1024, dtype=np.float32)}  # 256 KiB
    ckptio.save(small, url, step=1, layout=layout)
    big = {"w": np.random.default_rng(0).random(3 * MiB // 8)}  # 3 MiB > 2 MiB: ENOSPC midway
    with pytest.raises(
        errors.SaveFailedError,
        match=re.escape(f"{small_tmpfs}/run/step-0000000002/data/") + ".*No space left",
    ) as info:
        ckptio.save(big, url, step=2, layout=layout, chunk_size=256 * 1024)
    assert isinstance(info.value.__cause__, errors.NoSpaceError)
    # the earlier checkpoint loads and verifies; the failed one left no data or temp files
    assert ckptio.open_checkpoint(url).step == 1
    assert np.array_equal(ckptio.load(url)["w"], small["w"])
    assert ckptio.verify(url) == []
    assert [
        p for p in walk_files(str(small_tmpfs / "run")) if p.startswith("step-0000000002")
    ] == []
    # and after freeing nothing, a small save still fits: the space of the failed one came back
    ckptio.save(small, url, step=3, layout=layout)
    assert ckptio.open_checkpoint(url).step == 3


def test_pfs_manifest_records_layout(tmp_path: Path) -> None:
    url = f"pfs://{tmp_path}/run"
    ckptio.save(STATE, url, step=1, layout="shared-file")
    doc = json.loads((tmp_path / "run" / "step-0000000001" / "manifest.json").read_text())
    assert doc["layout"]["kind"] == "shared-file"


def test_the_registry_opens_file_urls_on_a_parallel_filesystem_as_pfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which class serves a ``file://`` URL is the registry's choice: on a parallel filesystem
    (here: statfs's answer relabelled as Lustre) ``open_store`` gives the pfs store; the plain
    local store, constructed directly, stays what it is (no ``__new__`` returning a subclass)."""
    from dataclasses import replace

    from ckptio.backends import parallelfs

    detect = parallelfs.detect_fs
    monkeypatch.setattr(parallelfs, "detect_fs", lambda path: replace(detect(path), kind="lustre"))
    store = open_store(f"file://{tmp_path}/x?block_size=1MiB")
    assert type(store) is ParallelFSStore and store.fs.kind == "lustre"
    assert store.block_size == 2**20 and store.preferred_key_layout == "hashed"
    assert type(LocalStore(f"file://{tmp_path}/x")) is LocalStore
