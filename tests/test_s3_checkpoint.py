"""Full save / load / ``ckptio verify`` of a multi-part checkpoint on the moto server, for every
S3 backend and plain ``s3://``; the test credentials never show in any output."""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio import cli

pytestmark = pytest.mark.s3

SCHEMES = ["s3+boto3", "s3+fsspec", "s3+arrow", "s3+obstore", "s3"]
PART = 5 * 2**20


def _state() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    return {
        "model": {
            "w": rng.standard_normal((1024, 4096), dtype=np.float32),  # 16 MiB: > 3 parts of 5 MiB
            "b": rng.standard_normal(4096).astype(np.float16),
        },
        "optim": {"step": np.array([42], dtype=np.int64)},
        "epoch": 3,
    }


@pytest.mark.parametrize("scheme", SCHEMES)
def test_save_load_verify_multipart(
    scheme: str,
    s3_bucket: str,
    s3_client: Any,
    s3_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="ckptio")
    url = f"{scheme}://{s3_bucket}/run1?part_size=5MiB&streams=4"
    state = _state()
    ckptio.save(state, url, step=10)

    objects = s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"]
    keys = {o["Key"]: o["Size"] for o in objects}
    assert "run1/step-0000000010/manifest.json" in keys
    assert max(keys.values()) > 3 * PART  # the shard went up in more than 3 parts
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []

    back = ckptio.load(url)
    assert np.array_equal(back["model"]["w"], state["model"]["w"])
    assert np.array_equal(back["model"]["b"], state["model"]["b"])
    assert back["epoch"] == 3

    assert cli.main(["verify", url, "--json"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report  # the CLI said something about the step it verified
    text = out.out + out.err + caplog.text + json.dumps(report)
    for secret in (s3_env["AWS_ACCESS_KEY_ID"], s3_env["AWS_SECRET_ACCESS_KEY"]):
        assert secret not in text


def test_a_second_manifest_for_the_same_step_is_refused(s3_bucket: str) -> None:
    url = f"s3+boto3://{s3_bucket}/run2"
    ckptio.save({"x": np.arange(10)}, url, step=1)
    with pytest.raises(Exception) as info:
        ckptio.save({"x": np.arange(10) + 1}, url, step=1)
    assert "exist" in str(info.value).lower()
    assert np.array_equal(ckptio.load(url)["x"], np.arange(10))


def test_hashed_key_layout_on_s3(s3_bucket: str, s3_client: Any) -> None:
    url = f"s3://{s3_bucket}/run3"
    state = {"a": np.arange(1000, dtype=np.float32), "b": np.ones((64, 64))}
    ckptio.save(state, url, step=5, key_layout="hashed")
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    data = [k for k in keys if "/data/" in k]
    assert data and all(len(k.split("/data/")[1].split("/")[0]) == 2 for k in data), keys
    back = ckptio.load(url)
    assert np.array_equal(back["a"], state["a"]) and np.array_equal(back["b"], state["b"])
