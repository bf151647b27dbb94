"""Storage URLs are parsed strictly, the same way for every backend.

Table-driven: for every registered scheme, the accepted forms open a store at the expected
root (local directory, bucket + prefix, memory space + prefix, wrapped store), and the
malformed forms are refused with a message that shows the accepted forms, writing nothing.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio.registry import backends, open_store

BUILTIN = {
    "file",
    "pfs",
    "memory",
    "emulate",
    "s3",
    "s3+boto3",
    "s3+fsspec",
    "fsspec",
    "s3+arrow",
    "s3+obstore",
}
S3_SCHEMES = ["s3", "s3+boto3", "s3+fsspec", "s3+arrow", "s3+obstore", "fsspec+s3"]
LOCAL_SCHEMES = ["file", "pfs"]


def test_the_table_covers_every_builtin_scheme() -> None:
    assert set(backends()) >= BUILTIN
    covered = {*S3_SCHEMES, *LOCAL_SCHEMES, "memory", "emulate", "fsspec"} - {"fsspec+s3"}
    assert covered == BUILTIN


def _refused(url: Any, *, unknown: bool = False) -> str:
    kind = errors.UnknownSchemeError if unknown else errors.InvalidArgumentError
    with pytest.raises(kind) as info:
        open_store(url)
    msg = str(info.value)
    # the accepted forms are shown
    for form in (
        "file:///abs/path",
        "/abs/path",
        "s3://bucket/prefix",
        "s3+obstore://bucket/prefix",
    ):
        assert form in msg, msg
    return msg


# -- local directories: plain paths, os.PathLike, file://, pfs:// ------------------------------


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _root(url: Any) -> str:
    store = open_store(url)
    try:
        return store.root  # type: ignore[attr-defined]
    finally:
        store.close()


@pytest.mark.parametrize("scheme", LOCAL_SCHEMES)
@pytest.mark.parametrize(
    ("form", "expected"),
    [
        ("{s}://{tmp}/run", "{tmp}/run"),
        ("{s}://{tmp}/run/", "{tmp}/run"),
        ("{s}://localhost{tmp}/run", "{tmp}/run"),
        ("{s}://LOCALHOST{tmp}/run", "{tmp}/run"),
        ("{s}://{tmp}/a%20b/c%25d", "{tmp}/a b/c%d"),  # percent-decoded (RFC 8089)
        ("{s}://{tmp}/x/../run?streams=2", "{tmp}/run"),
        ("{S}://{tmp}/run", "{tmp}/run"),  # schemes are case-insensitive
    ],
)
def test_local_url_forms(in_tmp: Path, scheme: str, form: str, expected: str) -> None:
    url = form.format(s=scheme, S=scheme.upper(), tmp=in_tmp)
    assert _root(url) == expected.format(tmp=in_tmp)


def test_path_uri_round_trips(in_tmp: Path) -> None:
    path = in_tmp / "with space" / "100%"
    assert _root(path.as_uri()) == str(path)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("{tmp}/abs/run", "{tmp}/abs/run"),
        ("rel/run", "{tmp}/rel/run"),  # relative to the current directory
        ("./rel/run/", "{tmp}/rel/run"),
        ("rel/with:colon", "{tmp}/rel/with:colon"),  # a colon after the first "/" is a path's
    ],
)
def test_plain_paths_mean_file(in_tmp: Path, given: str, expected: str) -> None:
    assert _root(given.format(tmp=in_tmp)) == expected.format(tmp=in_tmp)


@pytest.mark.parametrize("make", [Path, lambda p: _PathLike(p)], ids=["pathlib", "PathLike"])
@pytest.mark.parametrize("rel", [False, True])
def test_any_pathlike_means_file(in_tmp: Path, make: Any, rel: bool) -> None:
    given = "sub/run" if rel else str(in_tmp / "sub" / "run")
    assert _root(make(given)) == str(in_tmp / "sub" / "run")
    state = {"w": np.arange(5.0)}
    ckptio.save(state, make(given), step=3)
    np.testing.assert_array_equal(ckptio.load(make(given))["w"], state["w"])
    assert (in_tmp / "sub" / "run").is_dir()


class _PathLike:
    def __init__(self, path: str) -> None:
        self._path = path

    def __fspath__(self) -> str:
        return self._path


@pytest.mark.parametrize("scheme", LOCAL_SCHEMES)
@pytest.mark.parametrize(
    "form",
    [
        "{s}:/data/x",  # one slash
        "{s}:data/x",
        "{s}://relative/dir",  # a host, not a relative path
        "{s}://otherhost/data/x",
        "{s}://user@localhost/data/x",
        "{s}://",
        "{s}:///data/x#frag",
        "{s}:///data/x?novalue",
        "{s}+x:///data/x",  # no such client
        "{s}:///data/x\n",
    ],
)
def test_malformed_local_urls_are_refused(in_tmp: Path, scheme: str, form: str) -> None:
    url = form.format(s=scheme)
    msg = _refused(url, unknown="+x" in form)
    assert "+x" in form or "malformed URL" in msg
    assert list(in_tmp.iterdir()) == []  # nothing written


def test_a_colon_that_looks_like_a_scheme_is_refused(in_tmp: Path) -> None:
    _refused("ckpt:v1/run")
    _refused(" s3://bucket/x")  # leading space: not a scheme, not a path either
    _refused("")


@pytest.mark.parametrize(
    "url", ["s3:/bucket/x", "file:/data/x", "file://relative/dir", "s3+boto://bucket/x"]
)
def test_the_reported_urls_no_longer_write_a_local_folder(in_tmp: Path, url: str) -> None:
    with pytest.raises(errors.InvalidArgumentError) as info:
        ckptio.save({"w": np.zeros(3)}, url, step=1)
    assert "file:///abs/path" in str(info.value)
    assert list(in_tmp.rglob("*")) == []


def test_the_suggestion_for_a_client_typo(in_tmp: Path) -> None:
    assert "did you mean 's3+boto3'" in _refused("s3+boto://bucket/x", unknown=True)


# -- memory:// -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("form", "space", "prefix"),
    [
        ("memory://{sp}", "{sp}", ""),
        ("memory://{sp}/", "{sp}", ""),
        ("memory://{sp}/a/b/", "{sp}", "a/b/"),
        ("MEMORY://{sp}/a", "{sp}", "a/"),
    ],
)
def test_memory_url_forms(form: str, space: str, prefix: str) -> None:
    sp = f"urls-{uuid.uuid4().hex[:8]}"
    store = open_store(form.format(sp=sp))
    store.publish("k", b"x")
    whole = open_store(f"memory://{space.format(sp=sp)}")
    assert whole.list() == [f"{prefix}k"]


@pytest.mark.parametrize(
    "url",
    [
        "memory:/space",
        "memory:space",
        "memory://user:pw@space",
        "memory://space#f",
        "memory+x://space",
    ],
)
def test_malformed_memory_urls_are_refused(url: str) -> None:
    _refused(url, unknown="+x" in url)


# -- s3://, its +client variants and fsspec+s3:// -------------------------------------------


@pytest.mark.parametrize("scheme", S3_SCHEMES)
@pytest.mark.parametrize(
    ("form", "prefix", "extra"),
    [
        ("{s}://{b}", "", {}),
        ("{s}://{b}/", "", {}),
        ("{s}://{b}/run/a", "run/a", {}),
        ("{s}://{b}/run/a/?part_size=16MiB", "run/a", {"part_size": 16 << 20}),
        ("{S}://{b}/run", "run", {}),
        ("{s}://AKIAUSERINFO:se%2Fcret@{b}/run", "run", {"key": "AKIAUSERINFO"}),
    ],
)
def test_s3_url_forms(
    s3_env: dict[str, str], scheme: str, form: str, prefix: str, extra: dict[str, Any]
) -> None:
    bucket = "urls-bucket"
    store = open_store(form.format(s=scheme, S=scheme.upper(), b=bucket))
    try:
        assert (store.bucket, store.prefix) == (bucket, prefix)  # type: ignore[attr-defined]
        if "part_size" in extra:
            assert store.part_size == extra["part_size"]  # type: ignore[attr-defined]
        if "key" in extra:
            assert store.aws.access_key_id == extra["key"]  # type: ignore[attr-defined]
            assert store.aws.secret_access_key == "se/cret"  # type: ignore[attr-defined]
            assert "se%2Fcret" not in store.url and "AKIAUSERINFO" not in store.url
    finally:
        store.close()


@pytest.mark.parametrize("scheme", S3_SCHEMES)
@pytest.mark.parametrize(
    "form",
    [
        "{s}:/bucket/x",
        "{s}:bucket/x",
        "{s}://",
        "{s}:///x",
        "{s}://Bad_Bucket/x",
        "{s}://bucket:9000/x",
        "{s}://bucket/x#frag",
        "{s}://KEYONLY@bucket/x",
        "{s}://AKIAKEY:hunter2@bucket/x?access_key_id=AKIAKEY2",
        "{s}+x://bucket/x",
    ],
)
def test_malformed_s3_urls_are_refused(scheme: str, form: str) -> None:
    url = form.format(s=scheme)
    msg = _refused(url, unknown="+x" in form)
    for secret in ("KEYONLY", "hunter2", "AKIAKEY"):  # credentials are not echoed
        assert secret not in msg


def test_unknown_clients_are_refused() -> None:
    for url in (
        "s3+boto://b1/x",
        "s3+obstor://b1/x",
        "s3+boto3+x://b1/x",
        "gs://b1/x",
        "pfs+lustre:///x",
    ):
        _refused(url, unknown=True)


# -- s3 end to end through userinfo credentials (moto) --------------------------------------


def test_s3_userinfo_credentials_reach_the_service(s3_bucket: str, moto_server: str) -> None:
    url = f"s3+boto3://AKIAUSERINFO:secret@{s3_bucket}/run?endpoint_url={moto_server}"
    ckptio.save({"w": np.arange(4.0)}, url, step=1)
    np.testing.assert_array_equal(ckptio.load(url)["w"], np.arange(4.0))


# -- fsspec+<protocol>:// --------------------------------------------------------------------


def test_fsspec_file_keeps_the_leading_slash(in_tmp: Path) -> None:
    url = f"fsspec+file://{in_tmp}/abs/run"
    store = open_store(url)
    assert store.root == f"{in_tmp}/abs/run"  # type: ignore[attr-defined]
    state = {"w": np.arange(6.0)}
    ckptio.save(state, url, step=2)
    np.testing.assert_array_equal(ckptio.load(url)["w"], state["w"])
    assert (in_tmp / "abs" / "run").is_dir()
    assert not (in_tmp / in_tmp.relative_to("/")).exists()  # not re-rooted under the cwd


@pytest.mark.parametrize(
    ("form", "root"),
    [
        ("fsspec+memory://{sp}/ckpt", "{sp}/ckpt"),
        ("fsspec+file://localhost{tmp}/r", "{tmp}/r"),
    ],
)
def test_fsspec_url_forms(in_tmp: Path, form: str, root: str) -> None:
    sp = f"urls-{uuid.uuid4().hex[:8]}"
    store = open_store(form.format(sp=sp, tmp=in_tmp))
    assert store.root == root.format(sp=sp, tmp=in_tmp)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "unknown"),
    [
        ("fsspec://x/y", False),
        ("fsspec+nosuchprotocol://x/y", True),
        ("fsspec+file://relative/dir", False),
        ("fsspec+file:/abs", False),
        ("fsspec:/x", False),
    ],
)
def test_malformed_fsspec_urls_are_refused(in_tmp: Path, url: str, unknown: bool) -> None:
    _refused(url, unknown=unknown)
    assert list(in_tmp.iterdir()) == []


# -- emulate+<url> (and its old spelling shaped+<url>) -------------------------------------


@pytest.mark.parametrize(
    ("form", "check"),
    [
        ("emulate+file://{tmp}/run?profile=cloud-s3", ("root", "{tmp}/run")),
        ("emulate+FILE://localhost{tmp}/run", ("root", "{tmp}/run")),
        ("emulate+pfs://{tmp}/run?fanout=1", ("root", "{tmp}/run")),
        ("emulate+memory://{sp}/p", ("name", "memory")),
        ("shaped+file://{tmp}/run?profile=cloud-s3", ("root", "{tmp}/run")),  # the old name
        ("SHAPED+memory://{sp}/p", ("name", "memory")),
    ],
)
def test_emulate_url_forms(in_tmp: Path, form: str, check: tuple[str, str]) -> None:
    sp = f"urls-{uuid.uuid4().hex[:8]}"
    store = open_store(form.format(tmp=in_tmp, sp=sp))
    try:
        attr, want = check
        assert getattr(store.inner, attr) == want.format(tmp=in_tmp)  # type: ignore[attr-defined]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "unknown"),
    [
        ("emulate://x", False),
        ("emulate:/x", False),
        ("emulate+s3:/bucket/x", False),
        ("emulate+s3+boto://bucket/x", True),
        ("emulate+file://relative/dir", False),
        ("emulate+nosuch://x", True),
        ("shaped://x", False),
        ("shaped+nosuch://x", True),
    ],
)
def test_malformed_emulate_urls_are_refused(in_tmp: Path, url: str, unknown: bool) -> None:
    _refused(url, unknown=unknown)
    assert list(in_tmp.iterdir()) == []


# -- one parser ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/abs/run",
        "file:///abs/run?direct=0",
        "file://localhost/abs/a%20b",
        "pfs:///abs/run",
        "memory://space/p",
        "memory://",
        "s3://bucket/p/q?part_size=8MiB",
        "s3+obstore://K:S@bucket/p",
        "fsspec+file:///abs/run",
        "fsspec+memory://x/y",
        "fsspec+s3://bucket/p",
        "emulate+s3+arrow://bucket/p?profile=cloud-s3",
    ],
)
def test_the_canonical_url_parses_to_the_same_parts(url: str) -> None:
    """Backends are built with ``parse_url(url).bare`` and read their parts back through the
    same parser: the canonical form must give the same parts, without options or secrets."""
    from ckptio.registry import parse_url

    loc = parse_url(url)
    again = parse_url(loc.bare)
    assert again == loc
    assert "?" not in loc.bare and "@" not in loc.bare
    assert os.path.isabs(loc.path) or not loc.local
