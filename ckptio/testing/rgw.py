"""A throwaway Ceph on loopback, for tests: :mod:`ckptio.rgwserver` (a product module, since
``ckptio compare --targets rgw,cephfs`` starts one) under its old name, the body of the RGW
session fixture (:func:`server_or_skip`), and the session fixture ``cephfs`` (a CephFS
mounted with ``ceph-fuse``, from a Ceph of its own). ``python -m ckptio.testing.rgw start
DIR`` / ``stop DIR`` still works."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptio.rgwserver import (
    INSTALL_HINT,
    LABEL,
    CephServer,
    RgwServer,
    RgwUnavailable,
    empty_bucket,
    main,
    mount_cephfs,
    start_ceph,
    start_rgw,
    stop_ceph,
    stop_rgw,
    unavailable_reason,
)
from ckptio.testing.services import in_ci, service_or_skip

__all__ = [
    "INSTALL_HINT",
    "LABEL",
    "RgwServer",
    "RgwUnavailable",
    "cephfs",
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


def _start_cephfs() -> CephServer:
    server = start_ceph(rgw=False, cephfs=True)
    try:
        mount_cephfs(server, Path(server.workdir) / "mnt")
    except BaseException:
        stop_ceph(server)
        raise
    return server


@pytest.fixture(scope="session")
def cephfs() -> Iterator[str]:
    """A CephFS (one monitor, one memstore OSD, one MDS; :func:`ckptio.rgwserver.start_ceph`)
    mounted with ``ceph-fuse`` for the whole session: yields the mount point. Skips with the
    install hint where root, FUSE or the packages are missing; fails instead under
    ``CI=true``."""
    for server in service_or_skip("CephFS", _start_cephfs, stop_ceph, RgwUnavailable):
        yield next(iter(server.mounts))


if __name__ == "__main__":
    raise SystemExit(main())
