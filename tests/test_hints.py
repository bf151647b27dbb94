"""Every error names its fix (issue 20 item 5): a missing optional package names the pip extra
where it is first needed; no credentials says where ckptio looked and how to set them; a
permission error names the directory that is not writable; an unknown option suggests the
closest valid name (checkpoint options included); refused anonymous access does not blame
the credentials.

Missing packages are simulated in a real subprocess (``sys.modules[name] = None`` makes
``import name`` raise ``ModuleNotFoundError``, as when the package is not installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio.registry import open_store
from ckptio.testing.motoserver import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY

FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY_ID,
    "AWS_SECRET_ACCESS_KEY": TEST_SECRET_ACCESS_KEY,
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
}


def run_without(
    blocked: list[str], code: str, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in which the packages ``blocked`` cannot be
    imported (as if not installed)."""
    prelude = f"import sys\nfor _name in {blocked!r}:\n    sys.modules[_name] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **FAKE_AWS, **(env or {})},
    )


# -- missing optional packages ----------------------------------------------------------------

OPEN = """
from ckptio import errors
from ckptio.registry import open_store
try:
    open_store({url!r})
except errors.BackendUnavailableError as err:
    print("ERROR", err)
else:
    print("OPENED")
"""


@pytest.mark.parametrize(
    ("url", "blocked"),
    [
        ("s3+obstore://bucket/x", "obstore"),
        ("s3+arrow://bucket/x", "pyarrow"),
        ("s3+fsspec://bucket/x", "s3fs"),
        ("s3+fsspec://bucket/x", "fsspec"),
        ("s3://bucket/x", "botocore"),
        ("s3+boto3://bucket/x", "botocore"),
    ],
)
def test_missing_package_of_a_backend_names_the_extra(url: str, blocked: str) -> None:
    out = run_without([blocked], OPEN.format(url=url))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ERROR "), out.stdout + out.stderr
    assert f"'{blocked}'" in out.stdout and "pip install 'ckptio[s3]'" in out.stdout


def test_missing_pyarrow_for_result_files_names_the_extra(tmp_path: Path) -> None:
    out = run_without(
        ["pyarrow"],
        f"""
        from ckptio import errors
        from ckptio.results import read_results
        try:
            read_results([{str(tmp_path)!r}])
        except errors.BackendUnavailableError as err:
            print("ERROR", err)
    """,
    )
    assert "ERROR" in out.stdout and "pip install 'ckptio[report]'" in out.stdout, out.stderr


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    """Result files of one tiny run on a local directory."""
    from ckptio.cli import main

    out = tmp_path / "results"
    assert (
        main(
            [
                "run",
                str(tmp_path / "ck"),
                "--preset",
                "llama3-8b",
                "--total-size",
                "4MiB",
                "--object-size",
                "1MiB",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out


def test_report_without_matplotlib_is_written_without_plots_and_says_why(
    results_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    run = run_without(
        ["matplotlib"],
        f"""
        import sys
        from ckptio.cli import main
        sys.exit(main(["report", {str(results_dir)!r}, "--out", {str(out)!r}]))
    """,
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert "pip install 'ckptio[report]'" in run.stderr
    md = (out / "report.md").read_text()
    assert "Plots not drawn" in md and "pip install 'ckptio[report]'" in md
    assert "Plots not drawn" in (out / "index.html").read_text()
    assert not list(out.glob("*.png"))


def test_compare_without_matplotlib_says_so_before_measuring(tmp_path: Path) -> None:
    out = tmp_path / "report"
    run = run_without(
        ["matplotlib"],
        f"""
        import sys
        from ckptio.cli import main
        sys.exit(main(["compare", "--targets", "local", "--profiles", "", "--tiered", "", "--total-size",
                       "4MiB", "--object-size", "1MiB", "--out", {str(out)!r}]))
    """,
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    warning = run.stderr.find("pip install 'ckptio[report]'")
    assert 0 <= warning < run.stderr.find("running local"), run.stderr
    assert "Plots not drawn" in (out / "report.md").read_text()


# -- unknown options ---------------------------------------------------------------------------


def test_misspelt_checkpoint_option_suggests_the_checkpoint_option(tmp_path: Path) -> None:
    state = {"w": np.zeros(4, np.float32)}
    with pytest.raises(errors.InvalidArgumentError) as caught:
        ckptio.save(state, tmp_path / "ck", step=1, keep_lats=3)
    msg = str(caught.value)
    assert "did you mean 'keep_last'" in msg
    assert "keep_last" in msg.partition("valid options")[2] and "block_size" in msg  # both kinds
    with pytest.raises(errors.InvalidArgumentError, match="did you mean 'async_save'"):
        ckptio.Checkpointer(tmp_path / "ck", asnyc_save=True)
    assert not (tmp_path / "ck").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("url", "option", "meant"),
    [
        ("file:///tmp/x", "stream", "streams"),
        ("pfs:///tmp/x", "stripe_cont", "stripe_count"),
        ("emulate+memory://x", "profil", "profile"),
        ("emulate+memory://x", "blok_size", None),
        ("s3://bucket/x", "endpoint", "endpoint_url"),
        ("s3+obstore://bucket/x", "part_sise", "part_size"),
    ],
)
def test_unknown_store_option_suggests_the_closest_name(
    url: str, option: str, meant: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in FAKE_AWS.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(errors.InvalidArgumentError) as caught:
        open_store(url, **{option: "1"})
    msg = str(caught.value)
    assert repr(option) in msg and "valid options" in msg
    if meant:
        assert f"did you mean {meant!r}" in msg
    else:
        assert "did you mean" not in msg


# -- credentials --------------------------------------------------------------------------------

S3_BACKENDS = ["s3+boto3", "s3+fsspec", "s3+arrow", "s3+obstore"]


def _no_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
    ):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.parametrize("scheme", S3_BACKENDS)
def test_no_credentials_says_where_ckptio_looked_and_how_to_set_them(
    scheme: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_aws_env(monkeypatch, tmp_path)
    with pytest.raises(errors.StoragePermissionError) as caught:
        open_store(f"{scheme}://bucket/x", endpoint_url="http://127.0.0.1:9")
    msg = str(caught.value)
    for looked in (
        "access_key_id",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "profile 'default'",
        str(tmp_path / "credentials"),
        str(tmp_path / "config"),
        "AWS_PROFILE",
        "anonymous=true",
    ):
        assert looked in msg, looked


def test_an_unknown_profile_is_named_with_the_profiles_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_aws_env(monkeypatch, tmp_path)
    (tmp_path / "credentials").write_text(
        "[train]\naws_access_key_id = A\naws_secret_access_key = B\n"
    )
    with pytest.raises(
        errors.InvalidArgumentError, match=r"profile 'trian'.*profiles there: train"
    ):
        open_store("s3://bucket/x", profile="trian")


class _Refusing:
    """An HTTP server that answers every request 403 AccessDenied (a private bucket)."""

    def __enter__(self) -> str:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _deny(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self.send_response(403)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(0 if self.command == "HEAD" else len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _deny

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("scheme", S3_BACKENDS)
def test_refused_anonymous_access_does_not_blame_credentials(
    scheme: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_aws_env(monkeypatch, tmp_path)
    with _Refusing() as endpoint:
        store = open_store(f"{scheme}://bucket/x", anonymous=True, endpoint_url=endpoint)
        with pytest.raises(errors.StoragePermissionError) as caught:
            store.put("a.bin", b"x" * 10)
        store.close()
        msg = str(caught.value)
        assert "check the credentials" not in msg
        assert "anonymous" in msg and "public" in msg
        signed = open_store(
            f"{scheme}://bucket/x",
            access_key_id=TEST_ACCESS_KEY_ID,
            secret_access_key=TEST_SECRET_ACCESS_KEY,
            endpoint_url=endpoint,
        )
        with pytest.raises(errors.StoragePermissionError) as caught:
            signed.put("a.bin", b"x" * 10)
        signed.close()
        assert "check the credentials (from the options)" in str(caught.value)
        assert TEST_SECRET_ACCESS_KEY not in str(caught.value)


# -- permissions --------------------------------------------------------------------------------


def _as_unprivileged() -> list[str]:
    """A command prefix under which file modes bind this process (root ignores them)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot drop CAP_DAC_OVERRIDE")
    caps = "-dac_override,-dac_read_search,-fowner"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


def test_permission_error_names_the_directory_that_is_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        code = (
            "import numpy as np, ckptio\n"
            f"ckptio.save({{'w': np.zeros(4)}}, {str(locked / 'run' / 'ckpt')!r}, step=1)\n"
        )
        out = subprocess.run(
            [*_as_unprivileged(), sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        locked.chmod(0o755)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "PermissionError" in last or "Permission" in last, out.stderr
    assert f"directory {locked} is not writable" in last, last
    assert "dr-xr-xr-x" in last


def test_backends_command_reports_a_missing_package_with_its_extra() -> None:
    """``ckptio backends`` checks each backend's packages (without importing them): a backend
    whose client library is missing is not 'ok'."""
    out = run_without(
        ["obstore"],
        """
        import sys
        from ckptio.cli import main
        sys.exit(main(["backends"]))
    """,
        env={"COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if "s3+obstore" in ln)
    assert "missing" in line and "pip install 'ckptio[s3]'" in line
    assert "fsspec" in out.stdout and "ok" in next(
        ln for ln in out.stdout.splitlines() if "s3+boto3" in ln
    )
