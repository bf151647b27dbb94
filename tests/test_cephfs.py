"""pfs:// on a real CephFS (one monitor, one memstore OSD, one MDS, mounted through
ceph-fuse; the session fixture ``cephfs``): detection, the conformance suite, the layout the
stripe options give every shard file (Lustre's stripe count and size under CephFS's names),
read back and recorded in a run's sidecar, and N-1 ranges aligned to the stripe unit."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest
from ckptio.backends.parallelfs import ParallelFSStore, kind_of

import ckptio
from ckptio import errors
from ckptio.registry import open_store
from ckptio.store import Store
from ckptio.testing.store_tests import DirectoryRawAccess, StoreTests

MiB = 2**20


@pytest.fixture
def ceph_root(cephfs: str) -> str:
    """A fresh directory on the mounted CephFS for one test."""
    return os.path.join(cephfs, f"t-{uuid.uuid4().hex[:10]}")


class TestPfsCephFS(DirectoryRawAccess, StoreTests):
    large_size = 5 * MiB + 123  # FUSE round trips: a little smaller than the default

    @pytest.fixture
    def store(self, ceph_root: str) -> Store:
        s = open_store(f"file://{ceph_root}", block_size="1MiB")  # file:// picks pfs here
        assert isinstance(s, ParallelFSStore) and s.fs.kind == "cephfs"
        self.raw_root = ceph_root
        return s


class TestPfsCephFSStriped(TestPfsCephFS):
    """The same suite with a layout set on every file (the setlayout path)."""

    @pytest.fixture
    def store(self, ceph_root: str) -> Store:
        s = open_store(f"pfs://{ceph_root}?stripe_count=2&stripe_size=1MiB", block_size="1MiB")
        assert isinstance(s, ParallelFSStore) and s.ceph_layout is not None
        self.raw_root = ceph_root
        return s


def test_kind_from_magic_and_mount_type() -> None:
    assert kind_of(0x65735546, "fuse.ceph-fuse") == "cephfs"
    assert kind_of(0x00C36400, "ceph") == "cephfs"  # the kernel client
    assert kind_of(0x12345678, "ceph") == "cephfs"


def test_cephfs_is_detected_and_files_keep_the_directory_layout(ceph_root: str) -> None:
    store = open_store(f"file://{ceph_root}/run")
    assert isinstance(store, ParallelFSStore)
    assert store.fs.kind == "cephfs" and store.fs.mount_type == "fuse.ceph-fuse"
    assert store.ceph_layout is None  # no stripe option: no setlayout per file
    store.put("a.bin", b"x" * 100)
    assert store.file_layout("a.bin") == {
        "fs": "cephfs",
        "stripe_unit": 4 * MiB,  # Ceph's default layout, inherited from the root
        "stripe_count": 1,
        "object_size": 4 * MiB,
        "pool": "cephfs_data",
    }
    assert store.positional_alignment == 4 * MiB  # the stripe unit in force
    assert not any(e.op == "setlayout" for e in store.trace.events())


def test_stripe_options_become_each_files_ceph_layout(ceph_root: str) -> None:
    store = open_store(f"pfs://{ceph_root}/run?stripe_count=4&stripe_size=1MiB&object_size=8MiB")
    data = np.random.default_rng(1).integers(0, 255, 9 * MiB, dtype=np.uint8)
    with store.open_writer("big.bin", size_hint=data.nbytes) as w:
        w.write(data)
    got = os.getxattr(os.path.join(ceph_root, "run", "big.bin"), "ceph.file.layout").decode()
    assert "stripe_unit=1048576 stripe_count=4 object_size=8388608" in got
    assert store.file_layout("big.bin")["stripe_count"] == 4
    assert [e.op for e in store.trace.events()].count("setlayout") == 1
    assert store.get("big.bin") == data.tobytes()
    assert store.positional_alignment == MiB


def test_object_size_defaults_to_a_multiple_of_the_stripe_unit(ceph_root: str) -> None:
    store = open_store(f"pfs://{ceph_root}/run?stripe_size=3MiB")
    assert store.ceph_layout == f"stripe_unit={3 * MiB} stripe_count=1 object_size={6 * MiB}"
    store.put("k", b"v")
    assert store.file_layout("k")["object_size"] == 6 * MiB


def test_bad_layouts_are_refused_with_the_reason(ceph_root: str, tmp_path: Path) -> None:
    with pytest.raises(
        errors.InvalidArgumentError, match="object_size must be a positive multiple"
    ):
        open_store(f"pfs://{ceph_root}/r?stripe_size=1MiB&object_size=1536KiB")
    with pytest.raises(errors.InvalidArgumentError, match="CephFS needs a count >= 1"):
        open_store(f"pfs://{ceph_root}/r?stripe_count=-1")
    with pytest.raises(errors.InvalidArgumentError, match="object_size is a CephFS layout setting"):
        open_store(f"pfs://{tmp_path}/r?object_size=8MiB")


def test_a_run_records_the_layout_its_files_got(ceph_root: str, tmp_path: Path) -> None:
    from ckptio.runner import RunSettings, run_workload
    from ckptio.workload import make_plan

    plan = make_plan("llama3-8b", total_size="16MiB", object_size="4MiB")
    url = f"pfs://{ceph_root}/bench?stripe_count=2&stripe_size=1MiB"
    summary = run_workload(url, plan, RunSettings(out_dir=str(tmp_path), label="cephfs"))
    side = json.loads(next(p for p in summary.paths if p.suffix == ".json").read_text())
    assert side["storage_layout"] == {
        "fs": "cephfs",
        "stripe_unit": MiB,
        "stripe_count": 2,
        "object_size": 4 * MiB,
        "pool": "cephfs_data",
    }
    assert side["machine"]["filesystem"] == "fuse.ceph-fuse"


def test_shared_file_ranges_start_on_stripe_units(ceph_root: str) -> None:
    """N-1 on CephFS: each writer's range begins at a stripe unit, as on Lustre a stripe."""
    state = {"w": np.arange(3 * MiB, dtype=np.float32)}
    url = f"pfs://{ceph_root}/n1?stripe_size=1MiB"
    ckptio.save(state, url, step=1, layout="shared-file", chunk_size="1MiB")
    m = ckptio.open_checkpoint(url).manifest
    assert len(m.objects) == 1
    assert all(c.offset % MiB == 0 for c in m.tensors["w"].chunks)
    assert np.array_equal(ckptio.load(url)["w"], state["w"])
