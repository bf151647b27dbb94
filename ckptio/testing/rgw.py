"""A throwaway Ceph RGW on loopback, for tests: :mod:`ckptio.rgwserver` (a product module,
since ``ckptio compare --targets rgw`` starts one) under its old name, and the body of the
session fixture (:func:`server_or_skip`). ``python -m ckptio.testing.rgw start DIR`` / ``stop
DIR`` still works."""

from __future__ import annotations

import sys
from collections.abc import Iterator

from ckptio.rgwserver import (
    INSTALL_HINT,
    LABEL,
    RgwServer,
    RgwUnavailable,
    empty_bucket,
    in_ci,
    main,
    start_rgw,
    stop_rgw,
    unavailable_reason,
)

__all__ = [
    "INSTALL_HINT",
    "LABEL",
    "RgwServer",
    "RgwUnavailable",
    "empty_bucket",
    "in_ci",
    "main",
    "server_or_skip",
    "start_rgw",
    "stop_rgw",
    "unavailable_reason",
]


def server_or_skip() -> Iterator[RgwServer]:
    """The body of the session fixture (in :mod:`ckptio.testing.moto`, beside moto's): an
    RGW for the session, stopped at its end; skips (fails under ``CI=true``) where none
    starts."""
    import pytest

    try:
        server = start_rgw()
    except RgwUnavailable as err:
        if in_ci():
            pytest.fail(f"Ceph RGW could not be started in CI: {err}", pytrace=False)
        pytest.skip(f"no Ceph RGW: {err}")
    try:
        yield server
    finally:
        problems = stop_rgw(server)
        if problems:
            print("rgw teardown problems:", *problems, sep="\n  ", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
