"""The conformance suite on the core backends."""

from __future__ import annotations

import os

import pytest
from ckptio.backends.local import LocalStore
from ckptio.backends.memory import MemoryStore

from ckptio.store import Store
from ckptio.testing.store_tests import StoreTests


class TestLocalStore(StoreTests):
    @pytest.fixture
    def store(self, tmp_path: os.PathLike[str]) -> Store:
        return LocalStore(f"file://{tmp_path}/root")

    def raw_keys(self, store: Store) -> list[str]:
        root = store.root  # type: ignore[attr-defined]
        out = []
        for d, _, files in os.walk(root):
            out += [os.path.relpath(os.path.join(d, f), root) for f in files]
        return sorted(out)


class TestLocalStoreDirect(TestLocalStore):
    @pytest.fixture
    def store(self, tmp_path: os.PathLike[str]) -> Store:
        return LocalStore(
            f"file://{tmp_path}/root", direct=True, direct_read=True, block_size="1MiB"
        )


class TestMemoryStore(StoreTests):
    @pytest.fixture
    def store(self, memory_url: str) -> Store:
        return MemoryStore(memory_url)
