"""Conventions of the ecosystem (issue 20 item 6): the fsspec/s3fs and boto3 spellings of S3
options work (one table, ``OPTION_SPELLINGS``); result files carry their units (Parquet field
metadata, ``*_GBps`` column names, old ``*_gbps`` files still read); every fixture ckptio ships
has a docstring, and ``s3_url`` yields a ready ``s3://`` URL. And the shape of the source
(issue 31): no file, function or parameter list over its limit, no private name imported across
modules."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio.registry import open_store
from ckptio.testing.motoserver import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY

S3_BACKENDS = ["s3+boto3", "s3+fsspec", "s3+arrow", "s3+obstore"]


def _no_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing in the environment or config files: only the options given count."""
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
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# -- option spellings ---------------------------------------------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize("scheme", S3_BACKENDS)
def test_fsspec_storage_options_work_on_every_s3_backend(
    scheme: str, s3_bucket: str, moto_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_aws_env(monkeypatch)
    storage_options = {
        "key": TEST_ACCESS_KEY_ID,
        "secret": TEST_SECRET_ACCESS_KEY,
        "client_kwargs": {"endpoint_url": moto_server, "region_name": "eu-west-1"},
    }
    store = open_store(f"{scheme}://{s3_bucket}/fsspec", storage_options=storage_options)
    assert store.aws.region == "eu-west-1" and store.aws.endpoint_url == moto_server  # type: ignore[attr-defined]
    store.put("a.bin", b"fsspec spelling")
    assert store.get("a.bin") == b"fsspec spelling"
    store.close()


@pytest.mark.s3
@pytest.mark.parametrize("scheme", S3_BACKENDS)
def test_boto3_keyword_spellings_work_on_every_s3_backend(
    scheme: str, s3_bucket: str, moto_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_aws_env(monkeypatch)
    store = open_store(
        f"{scheme}://{s3_bucket}/boto3",
        aws_access_key_id=TEST_ACCESS_KEY_ID,
        aws_secret_access_key=TEST_SECRET_ACCESS_KEY,
        region_name="eu-west-1",
        endpoint_url=moto_server,
    )
    assert store.aws.region == "eu-west-1"  # type: ignore[attr-defined]
    store.put("b.bin", b"boto3 spelling")
    assert store.get("b.bin") == b"boto3 spelling"
    store.close()


@pytest.mark.s3
def test_checkpoint_through_storage_options(
    s3_bucket: str, moto_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a Lightning/pandas user has: ``storage_options={...}`` handed to save and load."""
    _no_aws_env(monkeypatch)
    opts = {
        "storage_options": {
            "key": TEST_ACCESS_KEY_ID,
            "secret": TEST_SECRET_ACCESS_KEY,
            "endpoint_url": moto_server,
        }
    }
    state = {"w": np.arange(10, dtype=np.float32)}
    ckptio.save(state, f"s3://{s3_bucket}/ck", step=1, **opts)
    back = ckptio.load(f"s3://{s3_bucket}/ck", **opts)
    assert np.array_equal(back["w"], state["w"])


def test_spellings_in_the_url_query_and_anon(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_aws_env(monkeypatch)
    store = open_store(
        "s3://bucket/x?anon=true&region_name=eu-central-1&endpoint_url=http://127.0.0.1:9"
    )
    assert store.aws.anonymous and store.aws.region == "eu-central-1"  # type: ignore[attr-defined]
    store.close()
    store = open_store("s3+fsspec://bucket/x", anon=True, endpoint_url="http://127.0.0.1:9")
    assert store.aws.anonymous  # type: ignore[attr-defined]
    store.close()


def test_one_option_under_two_spellings_must_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_aws_env(monkeypatch)
    with pytest.raises(
        errors.InvalidArgumentError, match=r"key.*access_key_id|access_key_id.*key"
    ) as caught:
        open_store("s3://bucket/x", key="AKIAONE", access_key_id="AKIATWO", secret="s" * 8)
    assert "AKIAONE" not in str(caught.value) and "AKIATWO" not in str(caught.value)
    with pytest.raises(errors.InvalidArgumentError, match=r"storage_options.*dict"):
        open_store("s3://bucket/x?storage_options=anon")
    with pytest.raises(errors.InvalidArgumentError, match="did you mean 'anon'"):
        open_store("s3://bucket/x", annon=True)


def test_the_spellings_are_documented_in_one_table() -> None:
    from ckptio.backends import _s3config

    doc = _s3config.__doc__ or ""
    for other, ours in _s3config.OPTION_SPELLINGS.items():
        assert f"``{other}``" in doc and f"``{ours}``" in doc
    for nested in _s3config.NESTED_OPTIONS:
        assert f"``{nested}" in doc


# -- backend options ----------------------------------------------------------------------------

BACKEND_CLASSES = [
    ("local", "LocalStore", "file:///{tmp}/store"),
    ("parallelfs", "ParallelFSStore", "pfs:///{tmp}/store"),
    ("memory", "MemoryStore", "memory://options"),
    ("s3", "Boto3Store", "s3+boto3://bucket/x"),
    ("fsspec", "FsspecStore", "s3+fsspec://bucket/x"),
    ("arrow", "ArrowStore", "s3+arrow://bucket/x"),
    ("obstore", "ObstoreStore", "s3+obstore://bucket/x"),
    ("emulate", "EmulatedStore", "emulate+memory://options"),
]


def _typed_options(cls: type) -> tuple[set[str], type | None]:
    """The keyword-only parameters of ``cls.__init__`` after ``url`` and the ``TypedDict`` of
    its ``**`` parameter (None: none, or an untyped one)."""
    import inspect
    import typing

    params = list(inspect.signature(cls.__init__).parameters.values())[2:]  # self, url
    named = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    assert all(p.annotation is not p.empty for p in params), params
    rest = [p for p in params if p.kind is not p.KEYWORD_ONLY]
    assert [p.kind for p in rest] == [inspect.Parameter.VAR_KEYWORD], params
    hint = typing.get_type_hints(cls.__init__, include_extras=True).get(rest[0].name)
    if typing.get_origin(hint) is typing.Unpack:
        return named, typing.get_args(hint)[0]
    return named, None


@pytest.mark.parametrize(
    ("module", "name", "url"), BACKEND_CLASSES, ids=[c[1] for c in BACKEND_CLASSES]
)
def test_every_backend_names_its_options_in_its_signature(
    module: str, name: str, url: str, tmp_path: Path
) -> None:
    """Each backend's options are typed: keyword-only parameters, or the keys of the
    ``TypedDict`` its ``**`` parameter unpacks (the S3 stores': ``S3Options``, one definition
    for the four), and the options its refusal of an unknown one lists are exactly those (plus
    the S3 spellings, and for ``emulate`` the profile figures): a catch-all ``**`` admits no
    further name a type checker would let through, except ``emulate``'s, which holds the
    wrapped store's options."""
    import importlib

    from ckptio.backends._s3config import own_options

    from ckptio.profiles import ALL_FIGURES
    from ckptio.store import NoOptions

    cls = getattr(importlib.import_module(f"ckptio.backends.{module}"), name)
    named, typed = _typed_options(cls)
    assert "trace" in named
    if name != "EmulatedStore":
        assert typed is not None, name
        named |= set(own_options(typed)) if typed is not NoOptions else set()

    with pytest.raises(errors.UnknownOptionError) as refused:
        cls(url.format(tmp=tmp_path), bogus_option=1)
    assert refused.value.unknown == ["bogus_option"]
    taker, own = refused.value.groups[0]  # the store's own options (then spellings, inner's)
    assert named - {"trace", "storage_options"} <= set(own), taker
    assert set(own) - set(ALL_FIGURES) <= named, taker


def test_the_s3_options_are_one_typed_definition() -> None:
    """The four S3 stores take ``**options: Unpack[S3Options]`` (boto3's a ``TypedDict`` that
    extends it): one definition, whose keys are ckptio's options and exactly the other
    spellings of the one table; each key is documented once, an option of ckptio's own naming
    its environment variable (or none)."""
    import ast
    import inspect

    from ckptio.backends import _s3config
    from ckptio.backends.arrow import ArrowStore
    from ckptio.backends.fsspec import FsspecStore
    from ckptio.backends.obstore import ObstoreStore
    from ckptio.backends.s3 import Boto3Options, Boto3Store

    S3Options = _s3config.S3Options
    for cls in (ArrowStore, FsspecStore, ObstoreStore):
        assert _typed_options(cls) == ({"trace"}, S3Options)
    assert _typed_options(Boto3Store) == ({"trace"}, Boto3Options)
    assert issubclass(Boto3Options, dict) and S3Options.__annotations__.items() <= (
        Boto3Options.__annotations__.items()
    )
    own = set(_s3config.own_options(S3Options))
    spellings = {*_s3config.OPTION_SPELLINGS, *_s3config.NESTED_OPTIONS}
    assert set(S3Options.__annotations__) == own | spellings
    for typed in (S3Options, Boto3Options):
        tree = ast.parse(inspect.getsource(inspect.getmodule(typed)))  # type: ignore[arg-type]
        body = next(
            n.body
            for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef) and n.name == typed.__name__
        )
        docs = {
            a.target.id: b.value.value
            for a, b in itertools.pairwise(body)
            if isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)
        }
        mine = {a.target.id for a in body if isinstance(a, ast.AnnAssign)}  # type: ignore[union-attr]
        assert mine <= set(docs), mine - set(docs)
        for key in mine & set(_s3config.own_options(typed)):
            assert "**Environment variable" in " ".join(docs[key].split()), key


@pytest.mark.parametrize("scheme", S3_BACKENDS)
def test_an_s3_option_left_none_takes_its_default(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """None is "not given" for every S3 store option (the signature's default): the store opens
    with the documented default, and a value set through another spelling or
    ``storage_options`` is not in conflict with it."""
    _no_aws_env(monkeypatch)
    store = open_store(
        f"{scheme}://bucket/x",
        part_size=None,
        streams=None,
        region=None,
        anonymous=None,
        storage_options={"anon": True},
        endpoint_url="http://127.0.0.1:9",
    )
    try:
        assert (store.part_size, store.streams) == (8 * 2**20, 8)  # type: ignore[attr-defined]
        assert store.aws.anonymous and store.aws.region == "us-east-1"  # type: ignore[attr-defined]
    finally:
        store.close()


# -- fixtures -----------------------------------------------------------------------------------


def test_every_shipped_fixture_has_a_docstring(tmp_path: Path) -> None:
    """``pytest --fixtures`` in a project that only installed ckptio (its pytest plugin)."""
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--fixtures", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    shown: dict[str, str] = {}
    lines = out.stdout.splitlines()
    for i, line in enumerate(lines):
        if " -- " in line and "ckptio/testing/" in line.partition(" -- ")[2]:
            shown[line.split()[0]] = lines[i + 1].strip() if i + 1 < len(lines) else ""
    assert {
        "memory_url",
        "moto_server",
        "s3_env",
        "s3_bucket",
        "s3_client",
        "fault_proxy",
        "s3_url",
    } <= set(shown)
    assert [name for name, doc in shown.items() if doc in ("", "no docstring available")] == []


@pytest.mark.s3
def test_s3_url_fixture_is_ready_to_use(s3_url: str) -> None:
    state = {"w": np.arange(6, dtype=np.float32)}
    ckptio.save(state, s3_url, step=1)
    assert np.array_equal(ckptio.load(s3_url)["w"], state["w"])


# -- units of result files ----------------------------------------------------------------------


@pytest.fixture
def one_run(tmp_path: Path) -> Path:
    """The result directory of one tiny run on a local directory."""
    from ckptio.cli import main

    out = tmp_path / "results"
    assert (
        main(
            [
                "run",
                str(tmp_path / "ck"),
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


def test_every_result_column_carries_its_unit(one_run: Path) -> None:
    import pyarrow.parquet as pq

    files = sorted(one_run.glob("*.parquet"))
    assert {f.name.split(".")[-2] for f in files} == {"requests", "phases", "run"}
    for f in files:
        sch = pq.read_schema(f)  # as any Parquet reader sees it, without ckptio
        for field in sch:
            assert field.metadata and field.metadata.get(b"unit"), (f.name, field.name)
            assert not field.name.endswith("_gbps"), field.name
    run = pq.read_schema(next(one_run.glob("*.run.parquet")))
    assert run.field("write_GBps").metadata[b"unit"] == b"GB/s (1e9 bytes/s)"
    assert run.field("checkpoint_bytes").metadata[b"unit"] == b"bytes"
    assert run.field("write_seconds").metadata[b"unit"] == b"seconds"
    req = pq.read_schema(next(one_run.glob("*.requests.parquet")))
    assert req.field("start").metadata[b"unit"].startswith(b"Unix seconds")


def test_result_files_with_the_old_gbps_names_are_still_read(one_run: Path, tmp_path: Path) -> None:
    """A run file written before the rename (``write_gbps``, ..., no field metadata)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ckptio.results import read_results

    run_file = next(one_run.glob("*.run.parquet"))
    new = pq.read_table(run_file)
    old = pa.table(
        {
            c.replace("_GBps", "_gbps"): new.column(c).combine_chunks()
            for c in new.column_names
            if c != "layout"
        }
    )  # before layout, too
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for f in one_run.iterdir():
        (old_dir / f.name).write_bytes(f.read_bytes())
    pq.write_table(old, old_dir / run_file.name)
    runs = read_results([old_dir]).runs
    assert runs.column("write_GBps").to_pylist() == new.column("write_GBps").to_pylist()
    assert runs.column("generate_GBps").to_pylist() == new.column("generate_GBps").to_pylist()
    assert runs.schema.field("read_GBps").metadata[b"unit"] == b"GB/s (1e9 bytes/s)"


# -- the shape of the source --------------------------------------------------------------------
#
# Limits that keep a module readable in one sitting and a function on one screen or two
# (ARCHITECTURE.md, "Conventions"): no file over MAX_FILE_LINES lines in ckptio/ and backends/,
# no function over MAX_FUNCTION_LINES lines (its ``def`` line through its last, docstring and
# nested definitions included) or over MAX_PARAMETERS parameters (``self``/``cls`` not counted;
# ``*args`` and ``**kwargs`` count one each), and no private name of one ckptio module imported
# by another (``from ckptio.x import _y``; a private *module* is imported only inside its own
# package, ``from . import _s3common`` in backends/). Other libraries' private names are theirs
# to keep stable and out of this check.

ROOT = Path(ckptio.__file__).resolve().parent.parent
MAX_FILE_LINES = 1000
MAX_FUNCTION_LINES = 150
MAX_PARAMETERS = 12

KNOWN_VIOLATIONS: dict[str, str] = {}
"""Violations still there, each with its owner and why; the list only shrinks: a new
violation fails, and so does an entry whose violation is gone (delete it)."""


def _source_files() -> list[tuple[str, Path]]:
    """``(module, file)`` for every Python file in ckptio/ and backends/ (as
    ``ckptio.backends``)."""
    out = []
    for base, package in ((ROOT / "ckptio", "ckptio"), (ROOT / "backends", "ckptio.backends")):
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            if package == "ckptio" and rel.parts[0] == "backends":
                continue  # a link to ../backends in some checkouts
            parts = [package, *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out.append((".".join(parts), path))
    return out


def _qualified(tree: ast.AST) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function with its qualified name (``Class.method``, ``outer.inner``)."""
    found = []

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{where}.{child.name}" if where else child.name
                if not isinstance(child, ast.ClassDef):
                    found.append((name, child))
                walk(child, name)
            else:
                walk(child, where)

    walk(tree, "")
    return found


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def _private_imports(module: str, is_package: bool, tree: ast.AST, known: set[str]) -> list[str]:
    """``module imports X._y`` for every private ckptio name or module ``module`` takes from
    another module: a name starting with ``_`` (not a dunder) from a ckptio module, or a
    private module from outside its own package."""
    own_package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = own_package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            if base != "ckptio" and not base.startswith("ckptio."):
                continue
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                if f"{base}.{name}" in known and base == own_package:
                    continue  # a private module of the importer's own package
                out.append(f"{module} imports {base}.{name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != "ckptio":
                    continue
                for i, part in enumerate(parts):
                    if part.startswith("_") and ".".join(parts[:i]) != own_package:
                        out.append(f"{module} imports {alias.name}")
                        break
    return out


def shape_violations() -> dict[str, str]:
    """Every violation of the limits above: ``key -> what`` (the key is what
    :data:`KNOWN_VIOLATIONS` lists)."""
    files = _source_files()
    known = {m for m, _ in files}
    found: dict[str, str] = {}
    for module, path in files:
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines > MAX_FILE_LINES:
            found[f"lines {rel}"] = f"{lines} lines (at most {MAX_FILE_LINES})"
        tree = ast.parse(text, str(path))
        for name, fn in _qualified(tree):
            length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found[f"length {rel}:{name}"] = f"{length} lines (at most {MAX_FUNCTION_LINES})"
            count = _parameters(fn)
            if count > MAX_PARAMETERS:
                found[f"parameters {rel}:{name}"] = f"{count} parameters (at most {MAX_PARAMETERS})"
        for what in _private_imports(module, path.name == "__init__.py", tree, known):
            found[f"private {what}"] = "a private name used outside its module"
    return found


def test_no_file_function_or_import_breaks_the_limits() -> None:
    found = shape_violations()
    new = {k: v for k, v in found.items() if k not in KNOWN_VIOLATIONS}
    gone = sorted(k for k in KNOWN_VIOLATIONS if k not in found)
    assert new == {}, "over the limits (split it, or pass a typed options object):\n" + "\n".join(
        f"{k}: {v}" for k, v in sorted(new.items())
    )
    assert gone == [], "fixed: delete these from KNOWN_VIOLATIONS:\n" + "\n".join(gone)


def test_every_known_violation_names_its_owner() -> None:
    for key, why in KNOWN_VIOLATIONS.items():
        owner, _, reason = why.partition(":")
        assert owner.strip() and reason.strip(), key


def test_the_shape_check_sees_what_it_forbids(tmp_path: Path) -> None:
    """The checker itself, on a module made for it."""
    tree = ast.parse(
        "from ckptio.runner import _assign\n"
        "from ckptio.backends import _s3config\n"
        "from . import _local_direct\n"
        "from torch.x import _private\n"
        "import ckptio.checkpoint._inner\n"
        "def f(a, b, c, d, e, f, g, h, i, j, k, l, *m): pass\n"
        "class C:\n    def g(self, a, b, c, d, e, f, g, h, i, j, k, l): pass\n"
    )
    known = {
        "ckptio.backends._s3config",
        "ckptio.backends._local_direct",
        "ckptio.checkpoint._inner",
    }
    assert _private_imports("ckptio.backends.local", False, tree, known) == [
        "ckptio.backends.local imports ckptio.runner._assign",
        "ckptio.backends.local imports ckptio.checkpoint._inner",
    ]
    assert _private_imports("ckptio.cli.run", False, tree, known)[1:3] == [
        "ckptio.cli.run imports ckptio.backends._s3config",
        "ckptio.cli.run imports ckptio.cli._local_direct",
    ]
    counts = {name: _parameters(fn) for name, fn in _qualified(tree)}
    assert counts == {"f": 13, "C.g": 12}
