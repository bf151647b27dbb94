"""The moto S3 server launcher, for tests: :mod:`ckptio.mockserver` (a product module, since
``ckptio compare`` embeds it) under its old name."""

from ckptio.mockserver import (
    TEST_ACCESS_KEY_ID,
    TEST_REGION,
    TEST_SECRET_ACCESS_KEY,
    aws_env,
    boto3_client,
    reset_moto,
    start_moto_server,
)

__all__ = [
    "TEST_ACCESS_KEY_ID",
    "TEST_REGION",
    "TEST_SECRET_ACCESS_KEY",
    "aws_env",
    "boto3_client",
    "reset_moto",
    "start_moto_server",
]
