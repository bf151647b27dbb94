"""pytest plugin (entry point ``pytest11: ckptio``): fixtures for code that checkpoints.

Fixtures:

- ``memory_url``: a fresh ``memory://`` space per test.
- ``s3_url``: a ready ``s3://bucket/ckpt`` URL on a moto server (bucket created, AWS
  environment set); with ``moto_server``, ``s3_env``, ``s3_bucket``, ``s3_client`` and
  ``fault_proxy`` (:mod:`ckptio.testing.moto`).
- ``gluster_volume`` (session): a real GlusterFS volume mounted through FUSE
  (:mod:`ckptio.testing.gluster`); skips without root/FUSE/gluster, fails under ``CI=true``.
- ``cephfs`` (session): a CephFS mounted through ``ceph-fuse`` (:mod:`ckptio.testing.rgw`);
  skips with the install hint where it cannot run, fails under ``CI=true``.
- ``cluster`` (session): a 3-node cluster on this machine — nodes as namespaces, Slurm, Open
  MPI, torchrun, Ceph (RGW + CephFS), GlusterFS (:mod:`ckptio.testing.cluster`); marked
  ``cluster``; skips with the install step where it cannot run, fails under ``CI=true``.
- S3 servers on loopback (:mod:`ckptio.testing.moto`): ``moto_server``, ``rgw_server`` (Ceph
  RGW, :mod:`ckptio.testing.rgw`), ``s3_target`` (moto, or both with
  ``ckptio.testing.moto.MOTO_AND_RGW``), ``s3_env``, ``s3_client``, ``s3_bucket``,
  ``fault_proxy``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

__all__ = ["memory_url", "pytest_configure"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "rgw: runs against Ceph's RADOS Gateway (ckptio.testing.rgw)"
    )
    config.addinivalue_line(
        "markers", "cluster: runs on the namespace cluster (ckptio.testing.cluster; needs root)"
    )


@pytest.fixture
def memory_url() -> Iterator[str]:
    """A fresh ``memory://`` URL (its own in-process space, forgotten after the test)."""
    from ckptio.backends import memory

    name = f"test-{uuid.uuid4().hex[:12]}"
    yield f"memory://{name}"
    memory._SPACES.pop(name, None)


# the namespace cluster (cluster): see ckptio.testing.cluster;
# a GlusterFS volume through FUSE for the session (gluster_volume): see ckptio.testing.gluster;
# S3 fixtures on a moto server or Ceph RGW (moto_server, rgw_server, s3_target, s3_env,
# s3_client, s3_bucket, s3_url, fault_proxy): see ckptio.testing.moto;
# a CephFS mounted through ceph-fuse (cephfs): see ckptio.testing.rgw
from ckptio.testing.cluster.fixture import cluster  # noqa: E402, F401
from ckptio.testing.gluster import gluster_volume  # noqa: E402, F401
from ckptio.testing.moto import (  # noqa: E402, F401
    fault_proxy,
    moto_server,
    rgw_server,
    s3_bucket,
    s3_client,
    s3_env,
    s3_target,
    s3_url,
)
from ckptio.testing.rgw import cephfs  # noqa: E402, F401
