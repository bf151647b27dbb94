"""pytest plugin (entry point ``pytest11: ckptio``): fixtures for code that checkpoints.

Fixtures:

- ``memory_url``: a fresh ``memory://`` space per test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture
def memory_url() -> Iterator[str]:
    from ckptio.backends import memory

    name = f"test-{uuid.uuid4().hex[:12]}"
    yield f"memory://{name}"
    memory._SPACES.pop(name, None)
