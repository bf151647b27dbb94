"""The generic fsspec passthrough (``fsspec+<proto>://``) on fsspec's in-memory filesystem."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ckptio.registry import open_store
from ckptio.store import Store
from ckptio.testing.store_tests import StoreTests


class TestFsspecMemory(StoreTests):
    """``fsspec+memory://``: no S3, no conditional create (best-effort check)."""

    large_size = 6 * 2**20 + 7

    @pytest.fixture
    def store(self) -> Iterator[Store]:
        st = open_store(f"fsspec+memory://ckptio-{uuid.uuid4().hex[:8]}/root")
        yield st
        st.close()
