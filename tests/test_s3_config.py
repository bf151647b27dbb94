"""AWS-style configuration reaches every S3 backend (environment, config files, explicit
options), bad options are refused by name, and the one error table classifies what each client
library raises."""

from __future__ import annotations

from typing import Any

import pytest

from ckptio import errors
from ckptio.registry import open_store
from ckptio.testing.moto import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY

pytestmark = pytest.mark.s3

BACKENDS = ["s3+boto3", "s3+fsspec", "s3+arrow", "s3+obstore"]


def _clear_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
    ):
        monkeypatch.delenv(k, raising=False)


def _profile_files(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, moto_server: str, extra: str = ""
) -> None:
    """A clean environment plus AWS config and credentials files with a profile ``ckpt``
    that points at moto (``extra``: more lines for the profile's config)."""
    _clear_aws_env(monkeypatch)
    config = tmp_path / "config"
    config.write_text(f"[profile ckpt]\nregion = us-east-1\nendpoint_url = {moto_server}\n{extra}")
    creds = tmp_path / "credentials"
    creds.write_text(
        f"[ckpt]\naws_access_key_id = {TEST_ACCESS_KEY_ID}\naws_secret_access_key = {TEST_SECRET_ACCESS_KEY}\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))


@pytest.mark.parametrize("scheme", BACKENDS)
def test_profile_in_aws_config_files(
    scheme: str, s3_bucket: str, moto_server: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _profile_files(tmp_path, monkeypatch, moto_server)
    monkeypatch.setenv("AWS_PROFILE", "ckpt")
    store = open_store(f"{scheme}://{s3_bucket}/cfg")
    assert store.aws.endpoint_url == moto_server  # type: ignore[attr-defined]
    store.put("a.bin", b"from the profile")
    assert store.get("a.bin") == b"from the profile"


def test_profile_option_settings_reach_the_boto3_client(
    s3_bucket: str, moto_server: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``profile=`` (not ``AWS_PROFILE``): the client is made from the session that resolved
    the profile, so the profile's settings that ckptio does not set itself still apply."""
    _profile_files(
        tmp_path, monkeypatch, moto_server, "request_min_compression_size_bytes = 12345\n"
    )
    store = open_store(f"s3+boto3://{s3_bucket}/profile", profile="ckpt")
    assert store.client.meta.config.request_min_compression_size_bytes == 12345  # type: ignore[attr-defined]
    store.put("c.bin", b"profile option")
    assert store.get("c.bin") == b"profile option"


@pytest.mark.parametrize("scheme", BACKENDS)
def test_explicit_options_without_environment(
    scheme: str, s3_bucket: str, moto_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_aws_env(monkeypatch)
    store = open_store(
        f"{scheme}://{s3_bucket}/explicit",
        endpoint_url=moto_server,
        region="us-east-1",
        access_key_id=TEST_ACCESS_KEY_ID,
        secret_access_key=TEST_SECRET_ACCESS_KEY,
    )
    store.put("b.bin", b"explicit")
    assert store.get("b.bin") == b"explicit"
    assert TEST_SECRET_ACCESS_KEY not in repr(store) and TEST_ACCESS_KEY_ID not in repr(store)


@pytest.mark.parametrize("scheme", BACKENDS)
def test_bad_options_are_named(scheme: str, s3_env: dict[str, str]) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="part_size"):
        open_store(f"{scheme}://bucket/x", part_size="1MiB")
    with pytest.raises(errors.InvalidArgumentError, match="streams"):
        open_store(f"{scheme}://bucket/x", streams=0)
    with pytest.raises(errors.InvalidArgumentError, match="valid options"):
        open_store(f"{scheme}://bucket/x", colour="blue")
    with pytest.raises(errors.InvalidArgumentError, match="bucket name"):
        open_store(f"{scheme}://Bad_Bucket/x")
    with pytest.raises(errors.InvalidArgumentError, match="endpoint_url"):
        open_store(f"{scheme}://bucket/x", endpoint_url="127.0.0.1:9000")


def test_one_error_table_for_every_library() -> None:
    from botocore.exceptions import ClientError
    from ckptio.backends._s3errors import translate_error

    from ckptio.redact import register_secret

    def tr(err: BaseException) -> errors.CkptioError:
        return translate_error(err, action="write", key="k.bin", where="s3://b")

    slow = ClientError(
        {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject"
    )
    assert isinstance(tr(slow), errors.ThrottledError)
    wrapped = OSError(16, "Please reduce your request rate.")  # how s3fs re-raises it
    wrapped.__cause__ = slow
    assert isinstance(tr(wrapped), errors.ThrottledError)
    arrow = OSError(
        "When uploading part for key 'k' in bucket 'b': AWS Error SLOW_DOWN during UploadPart"
    )
    assert isinstance(tr(arrow), errors.ThrottledError)
    obst = Exception(
        "Server returned non-2xx status code: 500: <Error><Code>InternalError</Code></Error>"
    )
    assert type(tr(obst)) is errors.TransientStorageError
    assert isinstance(
        tr(OSError("AWS Error ACCESS_DENIED during PutObject")), errors.StoragePermissionError
    )
    assert isinstance(
        tr(ClientError({"Error": {"Code": "NoSuchKey"}}, "GetObject")), FileNotFoundError
    )
    assert isinstance(
        tr(ClientError({"Error": {"Code": "PreconditionFailed"}}, "PutObject")), FileExistsError
    )
    refused = tr(ConnectionRefusedError(111, "Connection refused"))
    assert type(refused) is errors.StorageError and "endpoint" in str(refused)
    assert isinstance(
        tr(ConnectionResetError(104, "Connection reset by peer")), errors.TransientStorageError
    )
    assert isinstance(tr(TimeoutError("read timed out")), errors.TransientStorageError)
    register_secret(TEST_SECRET_ACCESS_KEY)  # what resolving the configuration does
    msg = str(
        tr(
            ClientError(
                {"Error": {"Code": "AccessDenied", "Message": f"key {TEST_SECRET_ACCESS_KEY}"}},
                "Put",
            )
        )
    )
    assert TEST_SECRET_ACCESS_KEY not in msg and "credentials" in msg


def test_redact_removes_registered_secrets_and_signatures() -> None:
    from ckptio.redact import redact, register_secret

    register_secret("s3cr3t-value-xyz")
    text = redact("url?X-Amz-Signature=abcdef&X-Amz-Credential=AKIA/2026 secret s3cr3t-value-xyz")
    assert "abcdef" not in text and "s3cr3t-value-xyz" not in text and "AKIA/2026" not in text


def test_boto3_sends_crc32c_with_every_part_and_no_md5(
    s3_bucket: str, s3_env: dict[str, str]
) -> None:
    import os

    from ckptio.backends._s3multipart import crc32c_b64
    from crc32c import crc32c

    store = open_store(f"s3+boto3://{s3_bucket}/crc", part_size="5MiB")
    sent: list[dict[str, str]] = []

    def capture(request: Any, **kwargs: Any) -> None:
        sent.append(
            {
                k.lower(): v.decode() if isinstance(v, bytes) else str(v)
                for k, v in request.headers.items()
            }
        )

    store.client.meta.events.register("before-send.s3.UploadPart", capture)  # type: ignore[attr-defined]
    store.client.meta.events.register("before-send.s3.PutObject", capture)  # type: ignore[attr-defined]
    data = os.urandom(11 * 2**20)
    store.put("parts.bin", data)
    store.put("small.bin", data[:1000])
    part = 5 * 2**20
    expected = [crc32c_b64(crc32c(data[i : i + part])) for i in range(0, len(data), part)]
    expected.append(crc32c_b64(crc32c(data[:1000])))
    assert sorted(h.get("x-amz-checksum-crc32c", "") for h in sent) == sorted(expected)
    assert not any("content-md5" in h for h in sent)
    assert store.get("parts.bin") == data


def test_part_size_grows_to_fit_10000_parts() -> None:
    from ckptio.backends._s3config import MAX_PARTS, MIN_PART_SIZE
    from ckptio.backends._s3multipart import part_size_for

    assert part_size_for(None, MIN_PART_SIZE) == MIN_PART_SIZE
    assert part_size_for(10 * 2**30, 8 * 2**20) == 8 * 2**20
    big = 200 * 2**30  # 200 GiB in 8 MiB parts would be 25,600 parts
    grown = part_size_for(big, 8 * 2**20)
    assert -(-big // grown) <= MAX_PARTS and grown % 2**20 == 0
    with pytest.raises(errors.InvalidArgumentError, match="10000 parts"):
        part_size_for(60 * 2**40, 8 * 2**20)  # beyond 10,000 x 5 GiB


def test_stores_share_botocore_data_files_per_data_path(
    s3_bucket: str, s3_env: dict[str, str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stores opened one after another read botocore's data files once (one loader for the
    process), and ``AWS_DATA_PATH`` still gets a loader that searches it."""
    a = open_store(f"s3+boto3://{s3_bucket}/one")
    b = open_store(f"s3+boto3://{s3_bucket}/two")
    loader = a.aws.session.get_component("data_loader")  # type: ignore[attr-defined]
    assert b.aws.session.get_component("data_loader") is loader  # type: ignore[attr-defined]
    assert str(tmp_path) not in loader.search_paths
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    c = open_store(f"s3+boto3://{s3_bucket}/three")
    other = c.aws.session.get_component("data_loader")  # type: ignore[attr-defined]
    assert other is not loader and str(tmp_path) in other.search_paths
    for store in (a, b, c):
        store.put("x.bin", b"shared")
        assert store.get("x.bin") == b"shared"
        store.close()


def test_the_shared_loader_reads_botocores_data_as_botocore_does(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's loader parses botocore's files into plain dicts, with the same content
    and order as botocore's own loader; a model under ``AWS_DATA_PATH`` still comes first."""
    from botocore.loaders import create_loader
    from ckptio.backends._s3config import _data_loader

    # a fresh one: botocore's endpoint resolver fills defaults into the data it was given
    ours, theirs = _data_loader.__wrapped__(None), create_loader(None)
    for name in ("endpoints", "partitions", "sdk-default-configuration"):
        mine, botos = ours.load_data(name), theirs.load_data(name)
        assert type(mine) is dict and mine == botos and list(mine) == list(botos)
    model = ours.load_service_model("s3", "service-2")
    assert model == theirs.load_service_model("s3", "service-2")
    assert list(model["operations"]) == list(
        theirs.load_service_model("s3", "service-2")["operations"]
    )
    custom = tmp_path / "s3" / "2006-03-01"
    custom.mkdir(parents=True)
    (custom / "service-2.json").write_text('{"metadata": {"custom": true}, "operations": {}}')
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    assert _data_loader.__wrapped__(str(tmp_path)).load_service_model("s3", "service-2")[
        "metadata"
    ] == {"custom": True}


def test_s3_modules_import_one_way() -> None:
    """The S3 code is split by concern with no cycle: each module imports only the ones before
    it in config -> errors -> multipart -> common -> the backends (presigned reads stand
    alone)."""
    import ast
    from pathlib import Path

    import ckptio.backends

    order = ["_s3presigned", "_s3config", "_s3errors", "_s3multipart", "_s3common"]
    root = Path(ckptio.backends.__file__).parent
    for i, name in enumerate(order):
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                imported |= {node.module} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "ckptio.backends."
            ):
                imported.add(node.module.rpartition(".")[2])
        later = imported - set(order[:i])
        assert not later, f"{name} imports {sorted(later)}, which come after it"
