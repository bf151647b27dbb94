"""s3+boto3 reads: ranged GETs of presigned URLs, with get_object behind them."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

from ckptio import errors
from ckptio.registry import open_store

DATA = bytes(range(256)) * 4096  # 1 MiB


def _store(bucket: str, **options: Any) -> Any:
    store = open_store(f"s3+boto3://{bucket}/pre", **options)
    with store.open_writer("obj.bin") as w:
        w.write(DATA)
    return store


def _no_get_object(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def refuse(**kw: Any) -> Any:
        calls.append(kw["Key"])
        raise AssertionError("get_object called")

    monkeypatch.setattr(store.client, "get_object", refuse)
    return calls


def test_ranged_reads_go_through_presigned_urls(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(s3_bucket)
    _no_get_object(store, monkeypatch)
    buf = bytearray(100_000)
    assert store.read_into("obj.bin", 12_345, buf) == len(buf)
    assert bytes(buf) == DATA[12_345:112_345]
    tail = bytearray(10)
    assert store.read_into("obj.bin", len(DATA) - 4, tail) == 4  # short: the object ends
    assert bytes(tail[:4]) == DATA[-4:]
    assert store.read_into("obj.bin", len(DATA), bytearray(8)) == 0  # past the end: 416
    assert store.get("obj.bin") == DATA
    url = store._presigned._urls["pre/obj.bin"][0]
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url  # SigV4, not botocore's default SigV2
    store.close()


def test_any_other_answer_falls_back_to_get_object(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(s3_bucket)
    store.get("obj.bin")
    full = "pre/obj.bin"
    url, made = store._presigned._urls[full]
    # a kept URL that is answered with an error (moto checks no signatures, so: a 404; on S3
    # an expired or refused signature is a 403, handled the same way)
    bad = url.replace("/obj.bin?", "/gone.bin?")
    assert bad != url
    store._presigned._urls[full] = (bad, made)
    via_get_object: list[str] = []
    real = store.client.get_object

    def counted(**kw: Any) -> Any:
        via_get_object.append(kw["Key"])
        return real(**kw)

    monkeypatch.setattr(store.client, "get_object", counted)
    buf = bytearray(1000)
    assert store.read_into("obj.bin", 7, buf) == 1000 and bytes(buf) == DATA[7:1007]
    assert via_get_object == [full]
    assert store._presigned._urls.get(full, (None,))[0] != bad  # the refused URL is forgotten
    store.close()


def test_a_missing_object_is_not_found_through_get_object(s3_bucket: str) -> None:
    store = _store(s3_bucket)
    with pytest.raises(errors.NotFoundError, match="nope"):
        store.read_into("nope.bin", 0, bytearray(10))
    store.close()


def test_presigned_reads_off_sends_get_object(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(s3_bucket, presigned_reads=False)
    assert store._presigned is None
    assert store.get("obj.bin") == DATA
    calls = _no_get_object(store, monkeypatch)
    with pytest.raises(errors.StorageError):
        store.read_into("obj.bin", 0, bytearray(10))
    assert calls == ["pre/obj.bin"]
    store.close()


def test_a_failed_send_shows_no_signature_or_key(
    s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    store = open_store("s3+boto3://bucket/pre")
    with pytest.raises(errors.StorageError) as info:
        store.read_into("obj.bin", 0, bytearray(10))
    shown = "".join(traceback.format_exception(info.value))
    assert f"127.0.0.1:{port}" in shown  # the message says where
    for secret in ("X-Amz-Signature=", "X-Amz-Credential=", s3_env["AWS_ACCESS_KEY_ID"]):
        assert secret not in shown
    assert "pre/obj.bin" in store._presigned._urls  # it was the presigned GET that failed
    store.close()


@pytest.mark.parametrize(("kind", "outcome"), [("slowdown", "throttled"), ("internal", "retry")])
def test_service_errors_are_retried_not_sent_again_through_get_object(
    s3_bucket: str, fault_proxy: Any, monkeypatch: pytest.MonkeyPatch, kind: str, outcome: str
) -> None:
    proxy = fault_proxy(rate=1.0, kinds=(kind,), seed=3)
    proxy.max_faults = 0
    store = open_store(f"s3+boto3://{s3_bucket}/pre", endpoint_url=proxy.url)
    with store.open_writer("obj.bin") as w:
        w.write(DATA)
    calls = _no_get_object(store, monkeypatch)
    proxy.max_faults = proxy.stats().get("faults", 0) + 1  # the next request fails, once
    buf = bytearray(1000)
    assert store.read_into("obj.bin", 5, buf) == 1000 and bytes(buf) == DATA[5:1005]
    assert calls == []
    outcomes = [e.outcome for e in store.trace.events() if e.op == "get"]
    assert outcomes[-2] == outcome  # traced as the retry policy's own, then the success
    store.close()
