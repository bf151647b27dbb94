"""pytest fixtures for S3 tests against a real moto server (``moto[server]``), started by the
tests themselves on loopback — the zarr-python ``tests/conftest.py`` pattern.

Fixtures (registered by the ckptio pytest plugin):

- ``moto_server`` (session): one ``ThreadedMotoServer`` on ``127.0.0.1``, port 0; yields its
  endpoint URL (``http://127.0.0.1:<port>``). Skips the test when moto is not installed.
- ``s3_env`` (function): the standard AWS environment variables pointing at that server
  (``AWS_ENDPOINT_URL``, fake test credentials, region), set for the test only.
- ``s3_bucket`` (function): moto reset through ``/moto-api/reset``, then a fresh bucket;
  yields its name. Uses ``s3_env``.
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
from typing import Any

import pytest

from ckptio.testing.motoserver import (  # noqa: F401  (re-exported for tests)
    TEST_ACCESS_KEY_ID,
    TEST_REGION,
    TEST_SECRET_ACCESS_KEY,
    aws_env,
    boto3_client,
    reset_moto,
    start_moto_server,
)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (a free port) for the whole session; yields its endpoint
    URL ``http://127.0.0.1:<port>``. Skips the test when moto[server] or boto3 is missing."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install 'ckptio[test]')")
    pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'ckptio[s3]')")
    server, endpoint = start_moto_server()
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_env(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The standard AWS environment variables pointing every client library at the moto
    server (``AWS_ENDPOINT_URL``, fake test credentials, region; ``AWS_PROFILE`` unset), set
    for this test only; returns them."""
    env = aws_env(moto_server)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def s3_client(moto_server: str) -> Any:
    """A boto3 S3 client on the moto server, for checks out of band (``list_objects_v2``,
    ``list_multipart_uploads``, ...); closed after the test."""
    client = boto3_client(moto_server)
    yield client
    client.close()


@pytest.fixture
def s3_bucket(moto_server: str, s3_env: dict[str, str], s3_client: Any) -> str:
    """A fresh, empty bucket on a reset moto server (every earlier bucket forgotten), with
    :func:`s3_env` set; returns its name."""
    reset_moto(moto_server)
    name = f"ckptio-test-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_url(s3_bucket: str) -> str:
    """A ready ``s3://<bucket>/ckpt`` URL: the bucket created on the moto server and the AWS
    environment set (:func:`s3_bucket`), so ``ckptio.save(state, s3_url, step=1)`` works as
    written."""
    return f"s3://{s3_bucket}/ckpt"


@pytest.fixture
def fault_proxy(moto_server: str) -> Iterator[Any]:
    """A factory: ``fault_proxy(rate=0.1, kinds=("slowdown",), seed=1)`` starts a
    :class:`~ckptio.testing.faults.FaultProxy` in front of the moto server and returns it
    (its ``url`` is the endpoint to use); every proxy is stopped when the test ends."""
    from ckptio.testing.faults import FaultProxy

    started: list[FaultProxy] = []

    def make(**kwargs: Any) -> FaultProxy:
        proxy = FaultProxy(moto_server, **kwargs).start()
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        proxy.stop()
