"""pytest fixtures for S3 tests against a real moto server (``moto[server]``), started by the
tests themselves on loopback — the zarr-python ``tests/conftest.py`` pattern.

Fixtures (registered by the ckptio pytest plugin):

- ``moto_server`` (session): one ``ThreadedMotoServer`` on ``127.0.0.1``, port 0; yields its
  endpoint URL (``http://127.0.0.1:<port>``). Skips the test when moto is not installed.
- ``s3_env`` (function): the standard AWS environment variables pointing at that server
  (``AWS_ENDPOINT_URL``, fake test credentials, region), set for the test only.
- ``s3_bucket`` (function): moto reset through ``/moto-api/reset``, then a fresh bucket;
  yields its name. Uses ``s3_env``.
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

import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

TEST_ACCESS_KEY_ID = "AKIACKPTIOTESTKEY0001"
"""Fake access key id used by the fixtures (never printed by ckptio)."""
TEST_SECRET_ACCESS_KEY = "ckptioTestSecret/DoNotLeak+0123456789abcdefgh"
"""Fake secret key used by the fixtures (never printed by ckptio)."""
TEST_REGION = "us-east-1"


def start_moto_server() -> tuple[Any, str]:
    """Start a ``ThreadedMotoServer`` on a free loopback port: ``(server, endpoint_url)``."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def reset_moto(endpoint: str) -> None:
    """Forget every bucket and object of the moto server at ``endpoint``."""
    req = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def aws_env(endpoint: str) -> dict[str, str]:
    """The AWS environment variables that point every client library at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": TEST_SECRET_ACCESS_KEY,
        "AWS_REGION": TEST_REGION,
        "AWS_DEFAULT_REGION": TEST_REGION,
        "AWS_EC2_METADATA_DISABLED": "true",  # never probe 169.254.169.254 in tests
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }


def boto3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=TEST_ACCESS_KEY_ID,
        aws_secret_access_key=TEST_SECRET_ACCESS_KEY,
        region_name=TEST_REGION,
    )


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install 'ckptio[test]')")
    pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'ckptio[s3]')")
    server, endpoint = start_moto_server()
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_env(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = aws_env(moto_server)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def s3_client(moto_server: str) -> Any:
    client = boto3_client(moto_server)
    yield client
    client.close()


@pytest.fixture
def s3_bucket(moto_server: str, s3_env: dict[str, str], s3_client: Any) -> str:
    reset_moto(moto_server)
    name = f"ckptio-test-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


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
