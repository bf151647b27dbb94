"""S3 under injected faults (a fault-injecting proxy in front of moto and of Ceph RGW) and with bad
configuration: retries are counted in the trace; past the budget the save fails cleanly; bad
buckets, credentials and endpoints give one clear error each, without retrying."""

from __future__ import annotations

import logging
import urllib.request
from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio.registry import open_store
from ckptio.store import RetryPolicy, Store
from ckptio.testing.moto import MOTO_AND_RGW, S3Target

pytestmark = [pytest.mark.s3, MOTO_AND_RGW]

BACKENDS = ["s3+boto3", "s3+fsspec", "s3+arrow", "s3+obstore"]
FAST_RETRIES = RetryPolicy(max_attempts=8, base_delay=0.01, max_delay=0.1)
"""Same number of attempts as the default, shorter sleeps: keeps the tests quick."""


def _state() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    return {"w": rng.standard_normal((1024, 4096), dtype=np.float32), "n": 5}  # 16 MiB


def _store(scheme: str, bucket: str, endpoint: str, **kw: Any) -> Store:
    st = open_store(
        f"{scheme}://{bucket}/run", endpoint_url=endpoint, part_size="5MiB", streams=4, **kw
    )
    st.retry_policy = FAST_RETRIES
    return st


def _secrets_absent(text: str, env: dict[str, str]) -> None:
    for secret in (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]):
        assert secret not in text


@pytest.mark.parametrize("scheme", BACKENDS)
def test_save_survives_faults_and_counts_retries(
    scheme: str,
    s3_bucket: str,
    s3_client: Any,
    s3_env: dict[str, str],
    fault_proxy: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="ckptio")
    # 20% of requests fail (>= 5%): 503 SlowDown, 500 InternalError, dropped connections
    proxy = fault_proxy(rate=0.2, kinds=("slowdown", "internal", "drop"), seed=11)
    store = _store(scheme, s3_bucket, proxy.url)
    state = _state()
    ckptio.save(state, store, step=1)
    stats = proxy.stats()
    proxy.set(rate=0.0)
    events = store.trace.events()
    retried = [e for e in events if e.outcome in ("retry", "throttled")]
    assert stats.get("faults", 0) >= 1, stats
    assert retried, f"no retries traced although the proxy injected {stats}"
    if stats.get("slowdown"):
        assert any(e.outcome == "throttled" for e in events)
    if scheme == "s3+boto3":  # ckptio sends each request itself: one traced retry per fault
        assert len(retried) == stats["faults"]
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    # and the load goes through the same faults
    before = proxy.stats().get("faults", 0)
    proxy.set(rate=0.2)
    store.trace.clear()
    assert np.array_equal(ckptio.load(store)["w"], state["w"])
    # s3fs absorbs some read-side failures itself (a failed HEAD falls back to a LIST), so
    # only the other backends must show every read fault as a traced retry
    if proxy.stats().get("faults", 0) > before and scheme != "s3+fsspec":
        assert [e for e in store.trace.events() if e.outcome in ("retry", "throttled")]
    _secrets_absent(caplog.text + "".join(e.error for e in events), s3_env)


@pytest.mark.parametrize("scheme", BACKENDS)
def test_save_past_retry_budget_fails_cleanly(
    scheme: str,
    s3_bucket: str,
    s3_client: Any,
    s3_env: dict[str, str],
    fault_proxy: Any,
) -> None:
    # every PUT of data or the manifest (parts, single PUTs) fails, not the save's lease;
    # starting, completing and aborting uploads still works, so an upload gets opened and must
    # be aborted
    proxy = fault_proxy(
        rate=1.0,
        kinds=("slowdown", "internal", "drop"),
        methods=["PUT"],
        paths=["/data/", "/manifest.json"],
        seed=5,
    )
    store = _store(scheme, s3_bucket, proxy.url)
    with pytest.raises(Exception) as info:
        ckptio.save(_state(), store, step=2)
    chain, err = [], info.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    assert any(isinstance(e, errors.RetryBudgetExceededError) for e in chain), chain
    text = " ".join(str(e) for e in chain)
    assert ".bin" in text or "manifest" in text  # names the key
    assert "failed 8 times" in text  # and that the budget ran out
    objects = s3_client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    assert not [o for o in objects if o["Key"].endswith("manifest.json")]
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    _secrets_absent(text, s3_env)


@pytest.mark.parametrize("scheme", BACKENDS)
def test_unknown_bucket_is_one_clear_error(
    scheme: str, s3_bucket: str, s3_env: dict[str, str]
) -> None:
    store = open_store(f"{scheme}://no-such-bucket-ckptio/run")
    with pytest.raises(errors.CkptioError) as info:
        store.put("x.bin", b"1" * 100)
    assert not isinstance(info.value, errors.TransientStorageError)
    assert "no-such-bucket-ckptio" in str(info.value) or "bucket" in str(info.value).lower()
    assert [e.attempt for e in store.trace.events()] == [1]  # not retried
    with pytest.raises(FileNotFoundError):
        store.get("x.bin")


@pytest.mark.parametrize("scheme", BACKENDS)
def test_endpoint_nobody_listens_on_is_one_clear_error(scheme: str, s3_env: dict[str, str]) -> None:
    store = open_store(f"{scheme}://some-bucket/run", endpoint_url="http://127.0.0.1:9")
    store.retry_policy = FAST_RETRIES
    with pytest.raises(errors.StorageError) as info:
        store.put("x.bin", b"1" * 100)
    assert not isinstance(info.value, errors.RetryBudgetExceededError)
    assert "127.0.0.1:9" in str(info.value) or "endpoint" in str(info.value)
    assert [e.attempt for e in store.trace.events()] == [1]


@pytest.fixture
def refused_credentials(
    s3_target: S3Target, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Any:
    """The server refuses the test's credentials: moto is told to check them against its IAM
    (which knows none); RGW checks signatures, so the secret is made wrong."""
    if s3_target.is_rgw:
        wrong = "ckptioWrongSecret/DoNotLeak+0123456789abcdefgh"
        s3_env["AWS_SECRET_ACCESS_KEY"] = wrong
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
        yield
        return

    def post(value: str) -> None:
        req = urllib.request.Request(
            f"{s3_target.endpoint}/moto-api/reset-auth",
            data=value.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        urllib.request.urlopen(req, timeout=10).read()

    post("0")
    yield
    post("inf")


@pytest.mark.parametrize("scheme", BACKENDS)
def test_wrong_credentials_are_one_clear_error(
    scheme: str, s3_bucket: str, s3_env: dict[str, str], refused_credentials: None
) -> None:
    store = open_store(f"{scheme}://{s3_bucket}/run")
    with pytest.raises(errors.StoragePermissionError) as info:
        store.put("x.bin", b"1" * 100)
    assert "credentials" in str(info.value)
    assert [e.attempt for e in store.trace.events()] == [1]
    _secrets_absent(str(info.value) + repr(store), s3_env)


@pytest.mark.parametrize("scheme", BACKENDS)
def test_slow_responses_past_the_read_timeout_are_retried(
    scheme: str, s3_bucket: str, fault_proxy: Any
) -> None:
    # the first two requests stall longer than the client waits: timeouts, then retries
    proxy = fault_proxy(rate=1.0, kinds=("slow",), slow_seconds=2.0, max_faults=2)
    store = _store(scheme, s3_bucket, proxy.url, read_timeout=0.5)
    store.put("slow.bin", b"s" * 1000)
    assert store.get("slow.bin") == b"s" * 1000
    retried = [e for e in store.trace.events() if e.outcome == "retry"]
    assert retried and all("TransientStorageError" in e.error for e in retried)


def test_faults_on_every_request_fail_within_the_budget(
    s3_bucket: str, s3_client: Any, fault_proxy: Any
) -> None:
    proxy = fault_proxy(rate=1.0, kinds=("slowdown", "internal", "drop"), seed=2)
    store = _store("s3", s3_bucket, proxy.url)
    with pytest.raises(Exception) as info:
        ckptio.save(_state(), store, step=3)
    chain, err = [], info.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    text = " ".join(f"{type(e).__name__}: {e}" for e in chain)
    assert "RetryBudgetExceededError" in text and "failed 8 times" in text, text
    attempts = [e.attempt for e in store.trace.events()]
    assert max(attempts) == FAST_RETRIES.max_attempts  # the budget, and not one attempt more
    assert not s3_client.list_objects_v2(Bucket=s3_bucket).get("Contents")
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
