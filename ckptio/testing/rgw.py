"""A throwaway Ceph RGW on loopback, for tests: :mod:`ckptio.rgwserver` (a product module,
since ``ckptio compare --targets rgw`` starts one) under its old name, and the body of the
session fixture (:func:`server_or_skip`). ``python -m ckptio.testing.rgw start DIR`` / ``stop
DIR`` still works."""

from __future__ import annotations

from collections.abc import Iterator

from ckptio.rgwserver import (
    INSTALL_HINT,
    LABEL,
    RgwServer,
    RgwUnavailable,
    empty_bucket,
    main,
    start_rgw,
    stop_rgw,
    unavailable_reason,
)
from ckptio.testing.services import in_ci, service_or_skip

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
    yield from service_or_skip("Ceph RGW", start_rgw, stop_rgw, RgwUnavailable)


if __name__ == "__main__":
    raise SystemExit(main())
