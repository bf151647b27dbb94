"""The generic fsspec passthrough (``fsspec+<proto>://``) on fsspec's in-memory filesystem."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import fsspec
import pytest

from ckptio.registry import open_store
from ckptio.store import Store
from ckptio.testing.store_tests import StoreTests


class TestFsspecMemory(StoreTests):
    """``fsspec+memory://``: no S3, no conditional create (best-effort check)."""

    large_size = 6 * 2**20 + 7

    @pytest.fixture
    def store(self) -> Iterator[Store]:
        self.raw_root = f"/ckptio-{uuid.uuid4().hex[:8]}/root"
        st = open_store(f"fsspec+memory:/{self.raw_root}")
        yield st
        st.close()

    # out of band: fsspec's memory filesystem itself, not the store
    raw_root = ""

    def raw_get(self, store: Store, key: str) -> bytes:
        return bytes(fsspec.filesystem("memory").cat_file(f"{self.raw_root}/{key}"))

    def raw_put(self, store: Store, key: str, data: bytes) -> None:
        fsspec.filesystem("memory").pipe_file(f"{self.raw_root}/{key}", data)

    def raw_list(self, store: Store, prefix: str = "") -> set[str]:
        fs = fsspec.filesystem("memory")
        if not fs.exists(self.raw_root):
            return set()
        keys = {p[len(self.raw_root) + 1 :] for p in fs.find(self.raw_root)}
        return {k for k in keys if k.startswith(prefix)}
