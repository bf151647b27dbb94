"""Credentials never reach logs, traces, errors, manifests, result files or reports.

Every place a credential can be given gets its own distinctive fake value: the URL's query
(``?access_key_id=&secret_access_key=&session_token=``, documented), the URL's user part
(``s3://KEY:SECRET@bucket``), store options (``--option`` / keyword arguments), the
environment (``AWS_*``) and an AWS profile in a temporary ``AWS_CONFIG_FILE`` /
``AWS_SHARED_CREDENTIALS_FILE``. Every ``ckptio`` command runs in a real subprocess against the
moto server, including failing ones (a missing bucket, a wrong key, a bad option, an endpoint
nobody listens on); every byte of their stdout/stderr, every file they write (Parquet read as
bytes *and* as decoded tables, file names too) and every object in the bucket is searched for
each secret, raw, URL-quoted and JSON-escaped.

Out of scope (said in README "Guarantees"): third-party libraries' own DEBUG logging
(botocore logs signed request headers at DEBUG when a user turns that on for it).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio.registry import open_store
from ckptio.testing.moto import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY

pytestmark = pytest.mark.s3

SESSION_TOKEN = "ckptioSessionTokenMarker/DoNotLeak=9876543210"
# one set per place a credential can be given ('/', '+', '=' as real AWS secrets have them)
QUERY = (
    "AKIAQUERYKEYID000X01",
    "ckptioQuerySecret/DoNotLeak+01abcdef",
    "ckptioQueryToken=DoNotLeak02",
)
USERINFO = ("AKIAUSERINFOKEY00X03", "ckptioUserinfoSecretDoNotLeak03xyz")
OPTION = (
    "AKIAOPTIONKEYID00X04",
    "ckptioOptionSecret/DoNotLeak04qrstu",
    "ckptioOptionToken+DoNotLeak04",
)
ENVIRON = (
    "AKIAENVIRONKEYID0X05",
    "ckptioEnvironSecret/DoNotLeak+05vw",
    "ckptioEnvironToken/DoNotLeak05",
)
PROFILE = (
    "AKIAPROFILEKEYID0X06",
    "ckptioProfileSecret/DoNotLeak06klmn",
    "ckptioProfileToken+DoNotLeak06",
)
PROFILE_NAME = "ckptio-leak-test"
MARKERS = (
    TEST_ACCESS_KEY_ID,
    TEST_SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    *QUERY,
    *USERINFO,
    *OPTION,
    *ENVIRON,
    *PROFILE,
)


def leaks(text: str | bytes) -> list[str]:
    """The markers found in ``text`` (also URL-quoted, form-encoded and JSON-escaped forms,
    and their first 16 characters)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    found = []
    for m in MARKERS:
        for form in {m, quote(m, safe=""), quote_plus(m), json.dumps(m)[1:-1], m[:16]}:
            if form in text:
                found.append(form)
    return found


def _decoded(path: Path) -> str:
    """A Parquet file's rows as text (zstd pages hide strings from a byte search)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return json.dumps(table.to_pylist(), default=str) + json.dumps(
        {
            k.decode(errors="replace"): v.decode(errors="replace")
            for k, v in (table.schema.metadata or {}).items()
        }
    )


def files_leaking(root: Path) -> dict[str, list[str]]:
    """Every file under ``root`` whose name, bytes or (Parquet) decoded rows hold a marker."""
    out = {}
    for p in root.rglob("*"):
        hit = leaks(str(p.relative_to(root)))
        if p.is_file():
            hit += leaks(p.read_bytes())
            if p.suffix == ".parquet":
                hit += leaks(_decoded(p))
        if hit:
            out[str(p)] = hit
    return out


def bucket_leaking(client: Any, bucket: str) -> dict[str, list[str]]:
    """Every object of ``bucket`` (manifests, data) whose key or bytes hold a marker."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            hit = leaks(obj["Key"]) + leaks(
                client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            )
            if hit:
                out[obj["Key"]] = hit
    return out


def _query_url(bucket: str, prefix: str, extra: str = "") -> str:
    key, secret, token = QUERY
    return (
        f"s3://{bucket}/{prefix}?access_key_id={quote(key, safe='')}&secret_access_key="
        f"{quote(secret, safe='')}&session_token={quote(token, safe='')}&region=us-east-1{extra}"
    )


@pytest.fixture
def aws_profile(tmp_path: Path) -> dict[str, str]:
    """An AWS config + credentials file pair holding :data:`PROFILE` under
    :data:`PROFILE_NAME` (and as the default profile)."""
    key, secret, token = PROFILE
    creds = tmp_path / "aws" / "credentials"
    creds.parent.mkdir()
    body = f"aws_access_key_id = {key}\naws_secret_access_key = {secret}\naws_session_token = {token}\n"
    creds.write_text(f"[default]\n{body}\n[{PROFILE_NAME}]\n{body}")
    config = tmp_path / "aws" / "config"
    config.write_text(
        f"[default]\nregion = us-east-1\n\n[profile {PROFILE_NAME}]\nregion = us-east-1\n"
    )
    return {"AWS_CONFIG_FILE": str(config), "AWS_SHARED_CREDENTIALS_FILE": str(creds)}


@pytest.fixture
def moto_auth(moto_server: str) -> Iterator[Any]:
    """``check(True)``: moto checks keys against its IAM (every key here is then refused)."""

    def check(on: bool) -> None:
        req = urllib.request.Request(
            f"{moto_server}/moto-api/reset-auth",
            data=b"0" if on else b"inf",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        urllib.request.urlopen(req, timeout=10).read()

    yield check
    check(False)


class Cli:
    """``ckptio`` commands as real subprocesses, a batch at a time side by side; collects every
    byte they print, the commands that showed a secret and those whose exit status was not
    the expected one (checked after the leaks, so that a version that leaks reports every
    leak first)."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.text: list[str] = []
        self.leaks: dict[str, list[str]] = {}
        self.unexpected: list[tuple[list[str], int, str]] = []

    def batch(self, *commands: tuple[Any, ...]) -> list[str]:
        """Run ``(ok, args, extra_env, dropped_env)`` commands at once; their outputs."""
        procs = []
        for ok, args, extra, drop in commands:
            env = {k: v for k, v in {**self.env, **extra}.items() if k not in drop}
            procs.append(
                (
                    ok,
                    args,
                    subprocess.Popen(
                        [sys.executable, "-m", "ckptio.cli", "-v", *args],
                        env=env,
                        cwd=self.cwd,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                    ),
                )
            )
        outs = []
        for ok, args, proc in procs:
            stdout, stderr = proc.communicate(timeout=300)
            out = stdout.decode("utf-8", "replace") + stderr.decode("utf-8", "replace")
            outs.append(out)
            self.text.append(out)
            where = " ".join("URL" if "://" in a else a for a in args)
            if leaks(out):
                self.leaks[f"{len(self.text)}: {where}"] = leaks(out)
            if (proc.returncode == 0) != ok:
                self.unexpected.append((list(args), proc.returncode, out[-2000:]))
        return outs


def ok(
    *args: str, env: dict[str, str] | None = None, drop: tuple[str, ...] = ()
) -> tuple[Any, ...]:
    return (True, args, env or {}, drop)


def fails(
    *args: str, env: dict[str, str] | None = None, drop: tuple[str, ...] = ()
) -> tuple[Any, ...]:
    return (False, args, env or {}, drop)


@pytest.mark.slow
def test_every_cli_command_hides_credentials_from_every_place(
    s3_bucket: str,
    s3_env: dict[str, str],
    s3_client: Any,
    moto_server: str,
    tmp_path: Path,
    aws_profile: dict[str, str],
    moto_auth: Any,
) -> None:
    env_key, env_secret, env_token = ENVIRON
    env = {
        **os.environ,
        **s3_env,
        **aws_profile,
        "AWS_ACCESS_KEY_ID": env_key,
        "AWS_SECRET_ACCESS_KEY": env_secret,
        "AWS_SESSION_TOKEN": env_token,
        "COLUMNS": "400",
    }  # rich wraps at 80 columns otherwise: a split secret is still shown
    work = tmp_path / "work"
    work.mkdir()
    cli = Cli(env, work)
    url = _query_url(s3_bucket, "run")
    opts = [
        "--option",
        f"access_key_id={OPTION[0]}",
        "--option",
        f"secret_access_key={OPTION[1]}",
        "--option",
        f"session_token={OPTION[2]}",
    ]
    small = ["--total-size", "2MiB", "--object-size", "1MiB"]
    no_env_keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    ukey, usecret = USERINFO
    # credentials in the query, in options and in the environment at once, or in the user
    # part; then failures: a user part misread ('/' in the secret), a missing bucket, bad
    # options, an endpoint nobody listens on
    shown = cli.batch(
        ok("run", url, *small, *opts, "--out", "results"),
        # a tiered run: the durable tier's credentials in the query and options
        ok(
            "run",
            _query_url(s3_bucket, "tiered"),
            "--local",
            f"file://{work}/fast",
            *small,
            *opts,
            "--out",
            "results",
        ),
        ok(
            "sweep",
            f"s3://{ukey}:{quote(usecret, safe='')}@{s3_bucket}/sweep",
            *small,
            "--streams",
            "2",
            "--part-size",
            "5MiB",
            "--out",
            "results",
            "--label",
            url,
            "--json",
        ),
        # compare against the URL only (no emulated profiles, no mock)
        ok(
            "compare",
            "--targets",
            _query_url(s3_bucket, "cmp"),
            "--profiles",
            "",
            "--tiered",
            "",
            *small,
            "--out",
            "cmp",
        ),
        ok("backends"),
        fails("ls", f"s3://{ukey}:abc/{usecret}@{s3_bucket}/run"),
        fails("ls", _query_url(f"no-such-bucket-{s3_bucket}", "x")),
        fails("verify", _query_url(s3_bucket, "run", "&part_size=lots")),
        fails("run", _query_url(s3_bucket, "x", "&no_such_option=1"), *small),
        fails("verify", _query_url(s3_bucket, "run", "&endpoint_url=http://127.0.0.1:9")),
    )
    # the checkpoint tools on the root the run left a checkpoint in (one by an AWS profile
    # named in the query, no keys in the environment); the report tools on the results
    shown += cli.batch(
        ok("ls", url),
        ok("verify", url, "--json"),
        ok("gc", url, "--json"),
        ok("ls", f"s3://{s3_bucket}/run?profile={PROFILE_NAME}", drop=no_env_keys),
        ok("report", "results", "cmp/results", "--out", "report", "--json"),
        ok("model", "--from", "results", "--preset", "llama3-8b"),
        # the sweep's root, listed once the sweep is done (beside it, it raced the sweep)
        ok("ls", f"s3+fsspec://{ukey}:{quote(usecret, safe='')}@{s3_bucket}/sweep"),
    )
    moto_auth(True)  # every key is wrong now
    shown += cli.batch(fails("ls", url))
    moto_auth(False)

    assert not cli.leaks, "commands that show a secret:\n" + "\n".join(cli.leaks)
    files = files_leaking(work)
    assert not files, "files that hold a secret:\n" + "\n".join(files)
    assert bucket_leaking(s3_client, s3_bucket) == {}
    assert cli.unexpected == []
    # the commands did what they say, and what is not a secret stays readable
    assert "malformed URL" in shown[5] and "credentials" in shown[17]
    assert "complete" in shown[16] and "complete" in shown[10] and '"ok": true' in shown[11]
    assert PROFILE_NAME in shown[13]  # a profile's name is not a secret; its keys are
    assert "from durable s" in shown[1]
    text = "\n".join(cli.text)
    assert "region=us-east-1" in text and "127.0.0.1:9" in text
    assert list((work / "results").glob("*.parquet")) and list(
        (work / "cmp" / "results").glob("*.parquet")
    )
    assert (work / "report" / "index.html").exists() and (work / "cmp" / "report.md").exists()


def test_library_logs_traces_errors_and_manifests_never_show_credentials(
    s3_bucket, s3_env, monkeypatch, fault_proxy, caplog, tmp_path
):
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
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
    texts = [repr(store), str(store), store.url]
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
    texts += _error_texts(failures)
    events = store.trace.events()
    assert any(e.outcome in ("retry", "throttled") for e in events)
    texts += [json.dumps(e.as_dict()) for e in events]
    texts.append(caplog.text)
    texts += [r.getMessage() for r in caplog.records]
    joined = "\n".join(texts)
    assert "RetryBudgetExceeded" in joined or "failed 3 times" in joined
    assert leaks(joined) == [], leaks(joined)


def _error_texts(failures: list[BaseException]) -> list[str]:
    """``str``, ``repr`` and ``args`` of each error and of its whole cause/context chain."""
    texts = []
    for err in failures:
        seen: BaseException | None = err
        while seen is not None:
            texts += [str(seen), repr(seen), repr(seen.args)]
            seen = seen.__cause__ or seen.__context__
    return texts


@pytest.mark.parametrize("scheme", ["s3+boto3", "s3+fsspec", "s3+arrow", "s3+obstore"])
def test_library_error_paths_hide_credentials_from_url_userinfo_options_and_profile(
    scheme: str,
    s3_bucket: str,
    s3_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    aws_profile: dict[str, str],
    moto_auth: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip(
        {"s3+fsspec": "s3fs", "s3+arrow": "pyarrow.fs", "s3+obstore": "obstore"}.get(
            scheme, "boto3"
        )
    )
    caplog.set_level(logging.DEBUG, logger="ckptio")
    for k, v in aws_profile.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ENVIRON[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ENVIRON[1])
    monkeypatch.setenv("AWS_SESSION_TOKEN", ENVIRON[2])
    url = _query_url(s3_bucket, "lib").replace("s3://", f"{scheme}://", 1)
    options = dict(
        zip(("access_key_id", "secret_access_key", "session_token"), OPTION, strict=True)
    )
    texts: list[str] = []
    failures: list[BaseException] = []

    def expect_error(fn: Any, *args: Any, **kwargs: Any) -> None:
        with pytest.raises(errors.CkptioError) as info:
            fn(*args, **kwargs)
        failures.append(info.value)

    state = {"w": np.arange(1000, dtype=np.float32)}
    for store in (
        open_store(url),
        open_store(url, **options),
        open_store(f"{scheme}://{s3_bucket}/lib", profile=PROFILE_NAME),
    ):
        with store:
            texts += [repr(store), str(store), store.url]
            expect_error(ckptio.load, store, step=7)  # no such step
    ukey, usecret = USERINFO
    userinfo = f"{scheme}://{ukey}:{quote(usecret, safe='')}@{s3_bucket}/lib"
    expect_error(ckptio.load, userinfo, step=7)
    expect_error(open_store, f"{scheme}://{ukey}:abc/{usecret}@{s3_bucket}/lib")
    expect_error(
        ckptio.load, _query_url(f"no-such-{s3_bucket}", "x").replace("s3://", f"{scheme}://", 1)
    )
    expect_error(open_store, url + "&no_such_option=" + quote(OPTION[1], safe=""))
    expect_error(open_store, url, part_size="lots", **options)
    expect_error(open_store, url, endpoint_url=f"ftp://{ukey}:{usecret}@127.0.0.1:9")
    moto_auth(True)
    by_profile = open_store(f"{scheme}://{s3_bucket}/lib", profile=PROFILE_NAME)
    assert by_profile.aws.access_key_id == PROFILE[0]  # the profile's keys, not the environment's
    for store in (open_store(url), open_store(url, **options), by_profile, open_store(userinfo)):
        with store:
            expect_error(ckptio.save, state, store, step=2)
            expect_error(store.list, "")
    moto_auth(False)
    texts += _error_texts(failures)
    texts += [caplog.text, *(r.getMessage() for r in caplog.records)]
    joined = "\n".join(texts)
    assert leaks(joined) == [], leaks(joined)
    assert "credentials" in joined and "malformed URL" in joined


def test_the_redaction_rule() -> None:
    """What is hidden and what stays readable, in URLs, free text and result documents."""
    from ckptio.redact import redact, redact_obj, redact_url, register_secret

    url = (
        "s3+boto3://AKIAUSER:pa%2Fss@bucket/run?endpoint_url=http%3A%2F%2Fh%3A9000&region=eu-west-1"
        "&part_size=8MiB&profile=prod&access_key_id=AKIAX&secret_access_key=s%2Fk&session_token=t"
        "&X-Amz-Signature=abc&X-Amz-Credential=AKIAX%2F2026&sig=zz&password=pw&api_key=k&token=q"
    )
    shown = redact_url(url)
    assert shown == (
        "s3+boto3://***@bucket/run?endpoint_url=http%3A%2F%2Fh%3A9000&region=eu-west-1"
        "&part_size=8MiB&profile=prod&access_key_id=***&secret_access_key=***"
        "&session_token=***&X-Amz-Signature=***&X-Amz-Credential=***&sig=***"
        "&password=***&api_key=***&token=***"
    )
    assert redact_url("s3://KEY:abc/def@bucket/run") == "s3://***@bucket/run"  # '/' in the secret
    assert redact_url("s3:/KEY:SECRET@bucket/run") == "s3:/***@bucket/run"  # malformed, in errors
    assert redact_url("s3://bucket/a@b/c") == "s3://bucket/a@b/c"  # '@' in a key is no user part
    assert redact_url("file:///tmp/x") == "file:///tmp/x" and redact_url("/tmp/x") == "/tmp/x"
    assert redact_url("pfs:///lustre/run?direct=true&key_layout=hashed") == (
        "pfs:///lustre/run?direct=true&key_layout=hashed"
    )
    register_secret("ckptio-registered-secret-value")
    text = redact(
        "failed on s3://u:p@b/x?secret_access_key=zz&region=r: got "
        "ckptio-registered-secret-value; {'aws_secret_access_key': 'v1'} token=v2 "
        "Authorization: AWS4-HMAC-SHA256 Credential=AKIAX/2026, Signature=ff"
    )
    for gone in ("u:p", "zz", "ckptio-registered", "v1", "v2", "AKIAX", "ff"):
        assert gone not in text, (gone, text)
    assert "s3://***@b/x?secret_access_key=***&region=r" in text
    for same in (
        "--option wants KEY=VALUE, got 'x'",
        '{"key": "step-000001/a.bin"}',
        "part_size=8MiB key_layout=hashed profile=prod",
    ):
        assert redact(same) == same
    doc = redact_obj(
        {
            "url": url,
            "store_options": {"secret_access_key": "v3", "streams": 4, "profile": "prod"},
            "env": {"HOME": "/root"},
            "key_layout": "flat",
            "n": [1, "x"],
        }
    )
    assert doc["store_options"] == {"secret_access_key": "***", "streams": 4, "profile": "prod"}
    assert "env" not in doc and doc["key_layout"] == "flat" and doc["n"] == [1, "x"]
    assert doc["url"] == shown


def test_paths_are_shown_and_secrets_in_them_are_not(tmp_path: Path) -> None:
    """The shell's PWD and OLDPWD (and XAUTHORITY, AWS_SHARED_CREDENTIALS_FILE: paths whose
    names say auth or credential) are not credentials: a message about a relative path shows
    the directory it resolved to. A secret-named variable's value is still hidden, also inside
    a path."""
    secret = "ckptioPathSecret0123456789"
    (tmp_path / "bench").mkdir()
    env = {
        **os.environ,
        "PWD": str(tmp_path),
        "OLDPWD": str(tmp_path.parent),
        "XAUTHORITY": str(tmp_path / "bench"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path),
        "CKPTIO_DEMO_API_TOKEN": secret,
    }
    ckptio = [sys.executable, "-m", "ckptio.cli"]
    for rel, shown in (("bench", f"file://{tmp_path}/bench"), (secret, f"file://{tmp_path}/***")):
        proc = subprocess.run(
            [*ckptio, "verify", f"./{rel}", "--step", "5"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and f"{shown}: no committed checkpoint at step 5" in out, out
        assert secret not in out and "***/bench" not in out, out
