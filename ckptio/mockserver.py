"""A moto S3 server on loopback, without pytest: the embedded mock S3 target of ``ckptio
compare``, and the server behind the pytest fixtures in :mod:`ckptio.testing.moto`
(:mod:`ckptio.testing.motoserver` re-exports this module for tests).

moto is a mock: it exercises the S3 code path (multipart, conditional writes, listing) and
accepts everything at ~100 MB/s on loopback. Its figures are never performance figures.
"""

from __future__ import annotations

import urllib.request
from typing import Any

__all__ = [
    "TEST_ACCESS_KEY_ID",
    "TEST_REGION",
    "TEST_SECRET_ACCESS_KEY",
    "aws_env",
    "boto3_client",
    "reset_moto",
    "start_moto_server",
]

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
