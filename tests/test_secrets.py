"""Credentials never reach logs, traces, errors, manifests, result files or reports.

The moto fixtures use distinctive fake keys (``ckptio.testing.moto``); these tests add a
session token marker, pass the keys both through the environment and as explicit options
(the way a user of ``--option`` or ``open_store(..., secret_access_key=...)`` would), drive
every command that touches S3 — including failing ones — and grep every byte that comes out.

Out of scope (said in README "Guarantees"): third-party libraries' own DEBUG logging
(botocore logs signed request headers at DEBUG when a user turns that on for it).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio.registry import open_store
from ckptio.testing.moto import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY

pytestmark = pytest.mark.s3

SESSION_TOKEN = "ckptioSessionTokenMarker/DoNotLeak=9876543210"
MARKERS = (TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY, SESSION_TOKEN)


def leaks(text: str | bytes) -> list[str]:
    """The markers found in ``text`` (also URL-quoted and JSON-escaped forms)."""
    from urllib.parse import quote

    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    found = []
    for m in MARKERS:
        for form in {m, quote(m, safe=""), json.dumps(m)[1:-1], m[:16]}:
            if form in text:
                found.append(form)
    return found


def files_leaking(root: Path) -> dict[str, list[str]]:
    out = {}
    for p in root.rglob("*"):
        if p.is_file():
            hit = leaks(p.read_bytes())
            if hit:
                out[str(p)] = hit
    return out


@pytest.fixture
def env(s3_env, monkeypatch):
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    return {**os.environ, "AWS_SESSION_TOKEN": SESSION_TOKEN}


def cli(capfd, *args: str, ok: bool = True) -> str:
    """Run a ``ckptio`` command in this process (a subprocess costs seconds of imports);
    return everything it wrote to stdout and stderr."""
    from ckptio.cli import main

    rc = main(list(args))
    out, err = capfd.readouterr()
    assert (rc == 0) == ok, (rc, out + err)
    return out + err


def test_cli_outputs_result_files_and_reports_never_show_credentials(
    s3_bucket, env, tmp_path, capfd, caplog, monkeypatch
):
    caplog.set_level(logging.DEBUG, logger="ckptio")
    url = f"s3://{s3_bucket}/bench"
    out = tmp_path / "results"
    report = tmp_path / "report"
    text = ""
    # credentials from the environment and, again, as explicit options
    text += cli(capfd, "-v", "run", url, "--total-size", "6MiB", "--object-size", "1MiB",
                "--option", f"access_key_id={TEST_ACCESS_KEY_ID}",
                "--option", f"secret_access_key={TEST_SECRET_ACCESS_KEY}",
                "--option", f"session_token={SESSION_TOKEN}",
                "--out", str(out), "--json")
    text += cli(capfd, "-v", "ls", url)
    text += cli(capfd, "-v", "ls", url, "--json")
    text += cli(capfd, "-v", "verify", url)
    text += cli(capfd, "-v", "gc", url, "--json")
    text += cli(capfd, "-v", "report", str(out), "--out", str(report))
    text += cli(capfd, "-v", "backends")
    # failures print errors: an unknown bucket, an endpoint nobody listens on
    text += cli(capfd, "-v", "ls", f"s3://no-such-bucket-{s3_bucket}/x", ok=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    text += cli(capfd, "-v", "verify", url, ok=False)
    text += caplog.text
    assert "step" in text and "error" in text  # the commands did run and did fail
    assert leaks(text) == [], leaks(text)
    assert list(out.rglob("*.parquet")), "the run wrote no result files"
    assert list(report.rglob("*.html")) or list(report.rglob("*.md")), "no report written"
    assert files_leaking(out) == {}
    assert files_leaking(report) == {}


def test_library_logs_traces_errors_and_manifests_never_show_credentials(
    s3_bucket, env, fault_proxy, caplog, tmp_path
):
    caplog.set_level(logging.DEBUG, logger="ckptio")
    caplog.set_level(logging.INFO)  # everything else at INFO (see the module docstring)
    proxy = fault_proxy(rate=0.15, kinds=("slowdown", "internal", "drop"), seed=4)
    opts = {
        "endpoint_url": proxy.url,
        "access_key_id": TEST_ACCESS_KEY_ID,
        "secret_access_key": TEST_SECRET_ACCESS_KEY,
        "session_token": SESSION_TOKEN,
        "part_size": "5MiB",
    }
    store = open_store(f"s3://{s3_bucket}/lib", **opts)
    texts = [repr(store), str(store)]
    state = {"w": np.arange(3 * 2**20, dtype=np.float32), "n": 1}
    with ckptio.Checkpointer(store, async_save=True, keep_last=1) as ck:
        ck.save(state, 1, metadata={"run": "secrets-test"})
        ck.save(state, 2)
        texts.append(repr(ck))
    reader = ckptio.open_checkpoint(store)
    texts.append(json.dumps(reader.manifest.to_json().decode()))
    assert reader.verify() == []
    # errors: a missing step, an unknown bucket, a save past the retry budget
    failures = []
    with pytest.raises(errors.NotFoundError) as info:
        ckptio.load(store, step=99)
    failures.append(info.value)
    with pytest.raises(errors.CkptioError) as info:
        ckptio.load(f"s3://no-such-{s3_bucket}/x", **opts)
    failures.append(info.value)
    from ckptio.store import RetryPolicy

    store.retry_policy = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)
    proxy.set(rate=1.0)
    with pytest.raises(errors.CkptioError) as info:
        ckptio.save(state, store, step=3)
    failures.append(info.value)
    proxy.set(rate=0.0)
    for err in failures:
        while err is not None:
            texts += [str(err), repr(err), repr(err.args)]
            err = err.__cause__ or err.__context__
    events = store.trace.events()
    assert any(e.outcome in ("retry", "throttled") for e in events)
    texts += [json.dumps(e.as_dict()) for e in events]
    texts.append(caplog.text)
    texts += [r.getMessage() for r in caplog.records]
    joined = "\n".join(texts)
    assert "RetryBudgetExceeded" in joined or "failed 3 times" in joined
    assert leaks(joined) == [], leaks(joined)
