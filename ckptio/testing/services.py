"""The session fixtures of services the tests start themselves (Ceph RGW, a GlusterFS volume):
one shape for all of them, so each skips and fails the same way."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["in_ci", "service_or_skip"]

T = TypeVar("T")


def in_ci() -> bool:
    """Under ``CI=true``, where a service that does not start fails the test instead of
    skipping it: CI installs every service's packages, so a skip there would hide a fault."""
    return os.environ.get("CI", "").lower() == "true"


def service_or_skip(
    what: str,
    start: Callable[[], T],
    stop: Callable[[T], list[str]],
    unavailable: type[Exception],
) -> Iterator[T]:
    """The body of a session fixture: ``start()`` the service and yield it, ``stop`` it at
    the end (printing what its teardown could not clean up). Where it cannot start
    (``unavailable`` raised), the test is skipped with the reason, or fails under ``CI=true``."""
    import pytest

    try:
        service = start()
    except unavailable as err:
        if in_ci():
            pytest.fail(f"{what} could not be started in CI: {err}", pytrace=False)
        pytest.skip(f"no {what}: {err}")
    try:
        yield service
    finally:
        problems = stop(service)
        if problems:
            print(f"{what} teardown problems:", *problems, sep="\n  ", file=sys.stderr)
