"""pytest fixtures for S3 tests against S3 servers the tests start themselves on loopback (the
zarr-python ``tests/conftest.py`` pattern): a moto server (``moto[server]``, a mock) and,
where its packages are installed, Ceph's RADOS Gateway (:mod:`ckptio.testing.rgw`, a real S3
implementation).

Fixtures (registered by the ckptio pytest plugin):

- ``moto_server`` (session): one ``ThreadedMotoServer`` on ``127.0.0.1``, port 0; yields its
  endpoint URL (``http://127.0.0.1:<port>``). Skips the test when moto is not installed.
- ``rgw_server`` (session): a single-node Ceph with RGW (:class:`~ckptio.testing.rgw.RgwServer`);
  skips with the install hint where the packages are missing, fails instead under ``CI=true``.
- ``s3_target`` (session): the S3 server the S3 fixtures below use, an :class:`S3Target`:
  moto unless parametrized; :data:`MOTO_AND_RGW` (``@MOTO_AND_RGW`` on a test, a class or a
  module's ``pytestmark``) runs a test against both.
- ``s3_env`` (function): the standard AWS environment variables pointing at that server
  (``AWS_ENDPOINT_URL``, fake test credentials, region), set for the test only.
- ``s3_bucket`` (function): a fresh bucket; yields its name. Uses ``s3_env``. moto is reset
  through ``/moto-api/reset`` first; on RGW the bucket is emptied (uploads aborted) and deleted
  after the test.
- ``s3_url`` (function): ``s3://<bucket>/ckpt`` on a fresh ``s3_bucket``: ready to use.
- ``s3_client``: a boto3 client on the server (out-of-band checks: list_multipart_uploads...).
- ``fault_proxy``: a factory of :class:`~ckptio.testing.faults.FaultProxy` in front of the
  server (503 SlowDown, 500, dropped connections, slow responses at a chosen rate); pass its
  ``url`` as ``endpoint_url``.

Wrong credentials: ``POST <endpoint>/moto-api/reset-auth`` with body ``0`` makes moto check
keys against its IAM (any fixture key is then refused), ``inf`` turns that off again.

The credentials are fake (moto accepts any) and distinctive, so tests can grep every output
for them: :data:`TEST_ACCESS_KEY_ID`, :data:`TEST_SECRET_ACCESS_KEY`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ckptio.testing.motoserver import (  # re-exported for tests
    TEST_ACCESS_KEY_ID,
    TEST_REGION,
    TEST_SECRET_ACCESS_KEY,
    aws_env,
    boto3_client,
    reset_moto,
    start_moto_server,
)

__all__ = [
    "MOTO_AND_RGW",
    "TEST_ACCESS_KEY_ID",
    "TEST_REGION",
    "TEST_SECRET_ACCESS_KEY",
    "S3Target",
    "aws_env",
    "boto3_client",
    "fault_proxy",
    "moto_server",
    "reset_moto",
    "rgw_server",
    "s3_bucket",
    "s3_client",
    "s3_env",
    "s3_target",
    "s3_url",
    "start_moto_server",
]


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (a free port) for the whole session; yields its endpoint
    URL ``http://127.0.0.1:<port>``. Skips the test when moto[server] or boto3 is missing."""
    pytest.importorskip(
        "moto.server", reason="moto[server] is not installed (pip install 'ckptio[test]')"
    )
    pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'ckptio[s3]')")
    server, endpoint = start_moto_server()
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture(scope="session")
def rgw_server() -> Iterator[Any]:
    """A single-node Ceph RADOS Gateway on loopback for the session (a real S3 implementation,
    :mod:`ckptio.testing.rgw`); skips with the install hint where Debian's ``radosgw``,
    ``ceph-mon`` and ``ceph-osd`` are missing, and fails instead under ``CI=true``."""
    from ckptio.testing.rgw import server_or_skip

    pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'ckptio[s3]')")
    yield from server_or_skip()


@dataclass(frozen=True)
class S3Target:
    """An S3 server the tests run against."""

    name: str
    """``moto`` (a mock) or ``rgw`` (Ceph's RADOS Gateway, a real S3 implementation)."""
    endpoint: str

    @property
    def is_rgw(self) -> bool:
        return self.name == "rgw"


MOTO_AND_RGW = pytest.mark.parametrize(
    "s3_target", ["moto", pytest.param("rgw", marks=pytest.mark.rgw)], indirect=True
)
"""Runs the S3 fixtures of a test (class, module) against moto and against RGW."""


@pytest.fixture(scope="session")
def s3_target(request: pytest.FixtureRequest) -> S3Target:
    """The S3 server the S3 fixtures use: the moto server unless the test is parametrized
    with ``rgw`` (``indirect``; see ``MOTO_AND_RGW``)."""
    name = getattr(request, "param", "moto")
    if name == "moto":
        return S3Target("moto", request.getfixturevalue("moto_server"))
    if name == "rgw":
        return S3Target("rgw", request.getfixturevalue("rgw_server").endpoint)
    raise ValueError(f"unknown S3 target {name!r} (moto, rgw)")


@pytest.fixture
def s3_env(s3_target: S3Target, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The standard AWS environment variables pointing every client library at the S3
    server (``AWS_ENDPOINT_URL``, fake test credentials, region; ``AWS_PROFILE`` unset), set
    for this test only; returns them."""
    env = aws_env(s3_target.endpoint)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def s3_client(s3_target: S3Target) -> Any:
    """A boto3 S3 client on the S3 server, for checks out of band (``list_objects_v2``,
    ``list_multipart_uploads``, ...); closed after the test."""
    client = boto3_client(s3_target.endpoint)
    yield client
    client.close()


@pytest.fixture
def s3_bucket(s3_target: S3Target, s3_env: dict[str, str], s3_client: Any) -> Iterator[str]:
    """A fresh, empty bucket, with :func:`s3_env` set; yields its name. moto is reset first
    (every earlier bucket forgotten); on RGW the bucket is emptied and deleted after the test."""
    if not s3_target.is_rgw:
        reset_moto(s3_target.endpoint)
    name = f"ckptio-test-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    yield name
    if s3_target.is_rgw:  # RGW keeps what a test leaves: free it (memstore holds it in memory)
        from ckptio.testing.rgw import empty_bucket

        empty_bucket(s3_client, name)


@pytest.fixture
def s3_url(s3_bucket: str) -> str:
    """A ready ``s3://<bucket>/ckpt`` URL: the bucket created on the S3 server and the AWS
    environment set (:func:`s3_bucket`), so ``ckptio.save(state, s3_url, step=1)`` works as
    written."""
    return f"s3://{s3_bucket}/ckpt"


@pytest.fixture
def fault_proxy(s3_target: S3Target) -> Iterator[Any]:
    """A factory: ``fault_proxy(rate=0.1, kinds=("slowdown",), seed=1)`` starts a
    :class:`~ckptio.testing.faults.FaultProxy` in front of the S3 server and returns it
    (its ``url`` is the endpoint to use); every proxy is stopped when the test ends."""
    from ckptio.testing.faults import FaultProxy

    started: list[FaultProxy] = []

    def make(**kwargs: Any) -> FaultProxy:
        proxy = FaultProxy(s3_target.endpoint, **kwargs).start()
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        proxy.stop()
