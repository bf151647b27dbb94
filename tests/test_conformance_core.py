"""The conformance suite (ckptio.testing.store_tests) on the backends without a server: local
files (buffered and O_DIRECT), pfs:// on local disk (plain and the Lustre code path), memory,
and emulate (an emulated profile over memory). Each class reaches the storage around the store:
the filesystem, the memory store's dictionary, the wrapped store."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from ckptio.backends import memory
from ckptio.backends.local import LocalStore
from ckptio.backends.memory import MemoryStore
from ckptio.backends.parallelfs import ParallelFSStore

from ckptio.registry import open_store
from ckptio.store import Store
from ckptio.testing.store_tests import DirectoryRawAccess, InnerStoreFaults, StoreTests

FIXTURES = Path(__file__).parent / "fixtures"


class TestLocalStore(DirectoryRawAccess, StoreTests):
    fault_kinds = ("denied",)  # a FUSE mount of the root refuses writes (EACCES)
    options: ClassVar[dict[str, Any]] = {}

    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        self.raw_root = str(tmp_path / "root")
        return self.open_at(self.raw_root)

    def open_at(self, root: str) -> Store:
        return LocalStore(f"file://{root}", **self.options)


class TestLocalStoreDirect(TestLocalStore):
    options: ClassVar[dict[str, Any]] = {"direct": True, "direct_read": True, "block_size": "1MiB"}


class TestPfsLocalDisk(TestLocalStore):
    def open_at(self, root: str) -> Store:
        return ParallelFSStore(f"pfs://{root}", **self.options)


class TestPfsLocalDiskAsLustreDirect(TestPfsLocalDisk):
    """The Lustre code path (stand-in lfs creates each file; O_DIRECT writes) on local disk."""

    options: ClassVar[dict[str, Any]] = {
        "fs": "lustre",
        "lfs": str(FIXTURES / "lfs"),
        "block_size": "1MiB",
    }

    @pytest.fixture(autouse=True)
    def _lfs_log(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("LFS_LOG", str(tmp_path / "lfs.log"))


class MemoryRawAccess:
    """The memory store's objects are a process-wide dictionary per space: read it directly."""

    space: dict[str, bytes]

    def raw_get(self, store: Store, key: str) -> bytes:
        try:
            return self.space[key]
        except KeyError:
            raise FileNotFoundError(key) from None

    def raw_put(self, store: Store, key: str, data: bytes) -> None:
        self.space[key] = bytes(data)

    def raw_list(self, store: Store, prefix: str = "") -> set[str]:
        return {k for k in self.space if k.startswith(prefix)}


class TestMemoryStore(MemoryRawAccess, StoreTests):
    @pytest.fixture
    def store(self, memory_url: str) -> Store:
        self.space = memory._space(memory_url.removeprefix("memory://"))
        return MemoryStore(memory_url)


class TestEmulatedMemory(MemoryRawAccess, InnerStoreFaults, StoreTests):
    """emulate+memory with figures small enough to keep the suite quick: the emulation's
    request path (streams, parts, rate limiter, retries) with little sleeping. The fault hook
    fails the wrapped store's requests; the emulating store's own retries answer."""

    FIGURES: ClassVar[str] = (
        "request_latency=1ms&metadata_latency=1ms&stream_bandwidth=4GB/s&part_size=1MiB"
    )

    @pytest.fixture
    def store(self, memory_url: str) -> Store:
        name = memory_url.removeprefix("memory://")
        self.space = memory._space(name)
        st = open_store(f"emulate+memory://{name}?profile=cloud-s3&streams=4&{self.FIGURES}")
        yield st
        st.close()


def test_a_test_class_without_out_of_band_helpers_is_refused() -> None:
    """The suite checks the storage around the store: a class that cannot reach it is an
    error when it is defined, not a suite that quietly checks the store through itself."""
    with pytest.raises(TypeError, match="must implement the out-of-band helpers raw_put"):

        class TestHalfDone(StoreTests):
            def raw_get(self, store: Store, key: str) -> bytes:
                return b""

            def raw_list(self, store: Store, prefix: str = "") -> set[str]:
                return set()

    with pytest.raises(TypeError, match="fault_kinds: unknown"):

        class TestBadKinds(MemoryRawAccess, StoreTests):
            fault_kinds = ("meltdown",)
