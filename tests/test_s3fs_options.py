"""The options an s3fs user brings (``config_kwargs``, ``use_ssl``) mean what they mean there,
or are refused saying what ckptio does instead — never "did you mean 'client_kwargs'?"."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio.registry import open_store

pytestmark = pytest.mark.s3

BACKENDS = ["s3", "s3+fsspec"]


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")


@pytest.mark.usefixtures("creds")
@pytest.mark.parametrize("scheme", BACKENDS)
def test_config_kwargs_map_to_the_options_they_mean(scheme: str) -> None:
    pytest.importorskip("s3fs")
    config = {
        "connect_timeout": 5,
        "read_timeout": 7,
        "region_name": "eu-west-1",
        "s3": {"addressing_style": "virtual"},
    }
    with open_store(f"{scheme}://bucket/x", config_kwargs=config) as store:
        aws: Any = store.aws  # type: ignore[attr-defined]
        assert (aws.connect_timeout, aws.read_timeout) == (5.0, 7.0)
        assert (aws.region, aws.addressing_style) == ("eu-west-1", "virtual")
    from botocore import UNSIGNED

    unsigned = {"config_kwargs": {"signature_version": UNSIGNED}}
    with open_store(f"{scheme}://bucket/x", storage_options=unsigned) as store:
        assert store.aws.anonymous  # type: ignore[attr-defined]


@pytest.mark.usefixtures("creds")
@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"retries": {"max_attempts": 10}}, "retries every request itself"),
        ({"max_pool_connections": 64}, "streams="),
        ({"tcp_keepalive": True}, "maps connect_timeout, read_timeout, region_name"),
    ],
)
def test_config_kwargs_without_a_ckptio_meaning_are_refused_with_advice(
    config: dict[str, Any], says: str
) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=says) as info:
        open_store("s3+fsspec://bucket/x", config_kwargs=config)
    assert "client_kwargs" not in str(info.value)
    with pytest.raises(errors.InvalidArgumentError, match="expected a dict of options"):
        open_store("s3+fsspec://bucket/x", config_kwargs="retries=3")


@pytest.mark.usefixtures("creds")
@pytest.mark.parametrize("scheme", BACKENDS)
def test_use_ssl_is_checked_against_the_endpoint(scheme: str) -> None:
    pytest.importorskip("s3fs")
    with open_store(f"{scheme}://bucket/x", use_ssl=False, endpoint_url="http://127.0.0.1:9") as s:
        assert s.aws.endpoint_url == "http://127.0.0.1:9"  # type: ignore[attr-defined]
    with open_store(f"{scheme}://bucket/x", client_kwargs={"use_ssl": True}) as s:
        assert s.aws.endpoint_url is None  # type: ignore[attr-defined]
    with pytest.raises(errors.InvalidArgumentError, match="endpoint_url='http://host:port'"):
        open_store(f"{scheme}://bucket/x", use_ssl=False)
    with pytest.raises(errors.InvalidArgumentError, match="https:// endpoint_url"):
        open_store(f"{scheme}://bucket/x", use_ssl=True, endpoint_url="http://127.0.0.1:9")


def test_s3fs_options_save_and_load_through_a_server(
    s3_bucket: str, s3_env: dict[str, str]
) -> None:
    """What an s3fs user passes for a local plain-HTTP S3 service works as written."""
    pytest.importorskip("s3fs")
    options = {
        "use_ssl": False,
        "client_kwargs": {"endpoint_url": s3_env["AWS_ENDPOINT_URL"]},
        "config_kwargs": {"s3": {"addressing_style": "path"}, "connect_timeout": 5},
    }
    state = {"w": np.arange(1000, dtype=np.float32)}
    url = f"s3+fsspec://{s3_bucket}/run"
    ckptio.save(state, url, step=1, storage_options=options)
    assert np.array_equal(ckptio.load(url, storage_options=options)["w"], state["w"])
