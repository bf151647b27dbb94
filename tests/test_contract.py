"""Nothing above the registry names a backend: the code under ``ckptio/`` (outside
``backends/`` and ``ckptio/registry.py``) reaches stores only through the Store contract, and
every backend implements the contract members the runner and the result files use."""

from __future__ import annotations

import ast
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ckptio
from ckptio import errors, registry
from ckptio.registry import open_store
from ckptio.store import NO_COLD_READS, Store, StoreInfo

PACKAGE = Path(ckptio.__file__).resolve().parent
BACKENDS = PACKAGE.parent / "backends"
EXEMPT = {PACKAGE / "registry.py"}
"""The registry maps schemes to backends: it is where backends are named."""

ALLOWED_SCHEMES: dict[tuple[str, str], str] = {
    ("compare.py", ""): "SPECIAL_TARGETS are the names of the comparison suite's default "
    "targets ('memory' is one), chosen by the user, not a branch on a store",
    ("compare.py", "resolve_targets"): "the comparison suite's default targets are URLs, the "
    "same a user types on the command line; nothing branches on them",
    ("compare.py", "mock_s3_server"): "the URL of the S3 service the suite starts (moto speaks "
    "S3); nothing branches on it",
    ("compare.py", "rgw_s3_server"): "likewise, for the Ceph RGW the suite starts",
    ("tierbench.py", "run_tiered"): "the tiered targets' emulated durable tier lives in "
    "memory://, as compare's emulated targets do; nothing branches on it",
    ("arrays.py", "_read_capacity"): "'memory' is the cgroup controller, not a store",
    ("mockserver.py", "boto3_client"): "'s3' is boto3's service name for the client of the "
    "moto server the suite starts (moved from testing/), not a store",
    ("testing/", "*"): "the conformance suite and the pytest plugin's fixtures build URLs of the "
    "stores under test (a test helper, not the library)",
    ("cli/run.py", "prepare_run"): "'emulate' is the runner's keyword (--emulate PROFILE), "
    "spelled as the emulating backend's scheme on purpose; nothing branches on a store",
}
"""(file under ckptio/ or a package ``dir/``, qualified function or ``*``) -> why a scheme
literal (or a backend import) there is not about stores."""

ALLOWED_PROBES: dict[tuple[str, str], str] = {
    ("torch.py", "StorageWriter._target"): "the DCP writer's own attributes, absent before "
    "the first _target (``self`` is no store)",
    ("torch.py", "StorageReader._target"): "likewise, the DCP reader's",
    ("testing/", "*"): "the conformance suite checks its test classes are complete and its "
    "fault hooks swap the requests of the stores under test (a test helper, not the library)",
}
"""(file, qualified function) -> why a getattr/hasattr there is not a probe of a store."""


def _schemes() -> set[str]:
    """Every registered scheme and the head of a compound one (``s3+boto3`` -> ``s3``)."""
    out: set[str] = set()
    for name in registry.backends():
        out.add(name)
        out.update(name.split("+"))
    return out


def _backend_attributes() -> set[str]:
    """Attributes backends define beyond the contract: names assigned as ``self.x`` or in
    class bodies under ``backends/``, less every name ``Store`` itself has."""
    contract = set(dir(Store)) | set(Store.__annotations__)
    names: set[str] = set()
    for path in BACKENDS.glob("*.py"):
        tree = ast.parse(path.read_text())
        for cls in ast.walk(tree):
            if not (isinstance(cls, ast.ClassDef) and cls.name in _store_classes(tree)):
                continue
            for item in cls.body:
                if isinstance(item, ast.FunctionDef):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            for node in ast.walk(cls):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    names.add(node.attr)
    return {n for n in names if not n.startswith("__")} - contract


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not body:
            continue
        first = body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            ids.add(id(first.value))
        # attribute docstrings: a string statement right after an assignment
        for prev, cur in itertools.pairwise(body):
            if (
                isinstance(prev, ast.Assign | ast.AnnAssign)
                and isinstance(cur, ast.Expr)
                and isinstance(cur.value, ast.Constant)
            ):
                ids.add(id(cur.value))
    return ids


def _functions(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Every node with the qualified name of the function or class holding it
    (``Class.method``; ``""`` at module level)."""

    def walk(node: ast.AST, where: str) -> Iterator[tuple[ast.AST, str]]:
        for child in ast.iter_child_nodes(node):
            name = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{where}.{child.name}" if where else child.name
            yield child, name
            yield from walk(child, name)

    yield from walk(tree, "")


def _allowed(table: dict[tuple[str, str], str], rel: str, where: str) -> bool:
    """``(rel, where)`` or an enclosing function of it, or the whole file, is in ``table``."""
    parts = where.split(".") if where else []
    scopes = {".".join(parts[:n]) for n in range(1, len(parts) + 1)} | {"*"}
    if not where:
        scopes.add("")
    return any((rel, s) in table or (rel.split("/")[0] + "/", s) in table for s in scopes)


def _names_store(node: ast.expr) -> bool:
    text = ast.unparse(node).lower()
    return "store" in text


def _store_classes(tree: ast.AST) -> set[str]:
    return {
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and any("Store" in ast.unparse(b) for b in n.bases)
    }


def findings(package: Path = PACKAGE) -> list[str]:
    """``file:line: what`` for every scheme literal and store probe outside the allow-lists."""
    schemes = _schemes()
    backend_attrs = _backend_attributes()
    out = []
    for path in sorted(package.rglob("*.py")):
        if path in EXEMPT or BACKENDS in path.parents:
            continue
        rel = path.relative_to(package).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        docs = _docstrings(tree)
        stores = _store_classes(tree)
        for node, where in _functions(tree):
            allowed_scheme = _allowed(ALLOWED_SCHEMES, rel, where)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in docs or allowed_scheme:
                    continue
                text = node.value
                head = text.split("://", 1)[0] if "://" in text else None
                if (
                    text in schemes
                    or (head is not None and head in schemes)
                    or any(text.startswith(f"{s}+") for s in schemes)
                ):
                    out.append(f"{rel}:{node.lineno}: scheme literal {text!r} in {where or '-'}")
            elif isinstance(node, ast.Import | ast.ImportFrom) and not allowed_scheme:
                mods = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                if any(m == "ckptio.backends" or m.startswith("ckptio.backends.") for m in mods):
                    out.append(f"{rel}:{node.lineno}: imports a backend in {where or '-'}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and node.args
            ):
                if _allowed(ALLOWED_PROBES, rel, where):
                    continue
                obj = node.args[0]
                attr = node.args[1] if len(node.args) > 1 else None
                name = attr.value if isinstance(attr, ast.Constant) else None
                is_self_store = (
                    isinstance(obj, ast.Name) and obj.id == "self" and where.split(".")[0] in stores
                )
                if _names_store(obj) or is_self_store or name in backend_attrs:
                    out.append(
                        f"{rel}:{node.lineno}: {node.func.id}({ast.unparse(obj)}, "
                        f"{ast.unparse(attr) if attr is not None else ''}) in {where or '-'}"
                    )
    return out


def test_nothing_above_the_registry_names_a_backend() -> None:
    found = findings()
    assert found == [], "backends named or probed outside backends/ and the registry:\n" + (
        "\n".join(found)
    )


def test_the_scan_sees_what_it_forbids(tmp_path: Path) -> None:
    """The checker itself: each forbidden form is found in a module made for it."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "bad.py").write_text(
        "from ckptio.backends.local import LocalStore\n"
        "def f(store, url):\n"
        "    if url.startswith('emulate'):\n"
        "        pass\n"
        "    table = {'file': 'block_size'}\n"
        "    u = f's3://{url}'\n"
        "    store.direct_read = getattr(store, 'direct_read', False)\n"
        "    return hasattr(store, 'drop_cache'), getattr(x, 'block_size', 0), table, u\n"
    )
    found = findings(pkg)
    assert [f.split(":")[1] for f in found] == ["1", "3", "5", "6", "7", "8", "8"], found
    (pkg / "bad.py").write_text('"""Docstrings may say s3:// and file://."""\nx = "s3 file"\n')
    assert findings(pkg) == []


# -- the contract members, on every backend ----------------------------------------------------


STORAGE_MEMBERS = {
    # what a store is and can do
    "schemes",
    "name",
    "url",
    "trace",
    "capabilities",
    "fork_safe",
    "preferred_key_layout",
    "positional_alignment",
    "retry_policy",
    # writes, reads, metadata, debris
    "open_writer",
    "open_positional",
    "publish",
    "publish_transient",
    "put",
    "read_into",
    "get",
    "list",
    "size",
    "stat",
    "stored_ranges",
    "exists",
    "delete",
    "list_incomplete",
    "cleanup_incomplete",
    # lifetime and requests
    "after_fork",
    "close",
    "retrying",
    # the one door to what the suite records (StoreInfo)
    "describe",
}
"""The Store contract, storage semantics only (as zarr's ``Store``): a new member is a
decision, made here. What the benchmark runner records about a store is its description,
:meth:`Store.describe`; what is known before it opens is its scheme's record in the registry."""


def test_the_store_contract_is_storage_only() -> None:
    public = {n for n in (*dir(Store), *Store.__annotations__) if not n.startswith("_")}
    assert public - {"stat"} <= STORAGE_MEMBERS and STORAGE_MEMBERS - {"stat"} <= public


def _check_common(store: Store) -> None:
    info = store.describe()
    assert store.describe() == info and store.describe().cold_reads is info.cold_reads
    assert info.backend == store.name
    assert isinstance(info.streams, int) and info.streams >= 0
    assert isinstance(info.request_size, int) and info.request_size >= 0
    assert isinstance(info.emulated, bool)
    assert set(info.cold_reads.modes) <= {"o_direct", "fadvise"}
    assert info.local_path is None or os.path.isabs(info.local_path)
    # a mode the store does not offer is refused, naming the ones it does
    for mode in {"o_direct", "fadvise"} - set(info.cold_reads.modes):
        with pytest.raises(errors.InvalidArgumentError, match="cold"):
            info.cold_reads.start([], mode)


def _cold_read_round(store: Store) -> None:
    """Every mode the store offers makes the next read cold and gives the data back."""
    data = os.urandom(3 * 2**20 + 17)
    store.put("cold/a.bin", data)
    cold = store.describe().cold_reads
    for mode in cold.modes:
        assert cold.start(["cold/a.bin"], mode) == mode
        buf = bytearray(len(data))
        assert store.read_into("cold/a.bin", 0, buf) == len(data)
        assert cold.end() is True
        assert bytes(buf) == data


def test_local_store_contract(tmp_path: Path) -> None:
    with open_store(f"file://{tmp_path}/root", streams=3, block_size="1MiB") as store:
        _check_common(store)
        info = store.describe()
        assert (info.streams, info.request_size) == (3, 2**20)
        assert registry.backend_for(f"file://{tmp_path}/root").request_size_option == "block_size"
        assert info.local_path == f"{tmp_path}/root"
        assert not info.emulated
        assert "fadvise" in info.cold_reads.modes
        assert ("o_direct" in info.cold_reads.modes) == store.capabilities.direct_io
        _cold_read_round(store)


def test_local_store_fadvise_reports_what_it_could_drop(tmp_path: Path) -> None:
    with open_store(f"file://{tmp_path}/root") as store:
        store.put("x/a.bin", b"a" * 4096)
        cold = store.describe().cold_reads
        # an object that is not there cannot be dropped: not every read will be cold
        assert cold.start(["x/a.bin", "x/missing.bin"], "fadvise") == "none"
        assert cold.start(["x/missing.bin"], "fadvise") == ""
        assert cold.start(["x/a.bin"], "fadvise") == "fadvise"
        assert cold.end() is True


def test_local_direct_reads_end_as_they_began(tmp_path: Path) -> None:
    with open_store(f"file://{tmp_path}/root", direct_read=False) as store:
        cold = store.describe().cold_reads
        if "o_direct" not in cold.modes:
            pytest.skip("no O_DIRECT on this platform")
        store.put("x/a.bin", os.urandom(2**20))
        assert cold.start(["x/a.bin"], "o_direct") == "o_direct"
        assert store.direct_read  # type: ignore[attr-defined]
        assert cold.end() is True
        assert not store.direct_read  # type: ignore[attr-defined]


def test_pfs_store_contract(tmp_path: Path) -> None:
    with open_store(f"pfs://{tmp_path}/root", block_size="2MiB") as store:
        _check_common(store)
        assert store.describe().request_size == 2 * 2**20
        assert registry.backend_for(f"pfs://{tmp_path}/root").request_size_option == "block_size"
        assert store.describe().local_path == f"{tmp_path}/root"
        _cold_read_round(store)


def test_memory_store_contract(memory_url: str) -> None:
    with open_store(memory_url) as store:
        _check_common(store)
        info = store.describe()
        assert info.cold_reads.modes == () and info.cold_reads.end() is True
        assert info.local_path is None
        assert registry.client_versions(memory_url) == {}


@pytest.mark.parametrize("inner", ["memory", "file"])
def test_emulated_store_contract(inner: str, tmp_path: Path, memory_url: str) -> None:
    url = memory_url if inner == "memory" else f"file://{tmp_path}/root"
    with open_store(f"emulate+{url}", profile="local-nvme", part_size="4MiB", streams=5) as store:
        _check_common(store)
        info = store.describe()
        assert info.emulated
        assert (info.streams, info.request_size) == (5, 4 * 2**20)
        assert registry.backend_for(f"emulate+{url}").request_size_option == "part_size"
        if inner == "file":
            assert info.local_path == f"{tmp_path}/root"
            assert info.cold_reads.modes == ("fadvise",)  # direct reads are not emulated
        else:
            assert info.local_path is None
            assert info.cold_reads.modes == ()
        _cold_read_round(store)


@pytest.mark.s3
@pytest.mark.parametrize(
    ("scheme", "packages"),
    [
        ("s3", {"botocore"}),
        ("s3+boto3", {"botocore"}),
        ("s3+fsspec", {"fsspec", "s3fs", "botocore"}),
        ("s3+arrow", {"pyarrow", "botocore"}),
        ("s3+obstore", {"obstore", "botocore"}),
    ],
)
def test_s3_store_contract(scheme: str, packages: set[str], s3_bucket: str) -> None:
    url = f"{scheme}://{s3_bucket}/root"
    with open_store(url, part_size="6MiB", streams=3) as store:
        _check_common(store)
        info = store.describe()
        assert (info.streams, info.request_size) == (3, 6 * 2**20)
        assert registry.backend_for(url).request_size_option == "part_size"
        assert info.local_path is None
        assert info.cold_reads.modes == ()
        assert set(registry.backend_for(url).requires) == packages
        assert set(registry.client_versions(url)) == packages
        # an emulated store runs on the wrapped store's clients
        assert registry.client_versions(f"emulate+{url}") == registry.client_versions(url)


def test_fsspec_local_contract(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    with open_store(f"fsspec+file://{tmp_path}/root", streams=2) as store:
        _check_common(store)
        assert store.describe().local_path == f"{tmp_path}/root"
        assert store.describe().streams == 2
        assert set(registry.client_versions(f"fsspec+file://{tmp_path}/root")) == {"fsspec"}


def test_the_record_is_found_without_opening_a_store() -> None:
    """What the CLI needs before it opens anything: the option that sets the request size."""
    assert registry.backend_for("/tmp/x").request_size_option == "block_size"
    assert registry.backend_for("/tmp/x").flush_option == "fsync"
    assert registry.backend_for("emulate+memory://x").request_size_option == "part_size"
    assert registry.backend_for("s3://bucket/x").request_size_option == "part_size"
    assert registry.backend_for("s3://bucket/x").flush_option is None


def test_base_class_defaults() -> None:
    """A third-party store that says nothing gets a description that means 'not
    applicable'."""

    class Minimal(Store):
        def open_writer(self, key: str, *, size_hint: int | None = None) -> Any: ...
        def publish(self, key: str, data: bytes, *, overwrite: bool = True) -> None: ...
        def read_into(self, key: str, offset: int, buffer: Any) -> int:
            return 0

        def list(self, prefix: str = "") -> list[str]:
            return []

        def size(self, key: str) -> int:
            return 0

        def delete(self, keys: Any) -> None: ...

    info = Minimal("x://y").describe()
    assert info == StoreInfo("Minimal")
    assert (info.streams, info.request_size, info.local_path, info.emulated) == (0, 0, None, False)
    assert info.cold_reads is NO_COLD_READS and info.cold_reads.end() is True


# -- one record per scheme ---------------------------------------------------------------------


def test_every_builtin_record_is_an_entry_point_and_the_reverse() -> None:
    """``pyproject.toml`` registers exactly the schemes of :data:`registry.BUILTIN`, each at the
    class its record names; the class is a Store that names the scheme among its ``schemes``
    (a wrapper or protocol scheme: its head)."""
    import tomllib

    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["ckptio.backends"]
    assert declared == {k: v.target for k, v in registry.BUILTIN.items()}
    for scheme, info in registry.BUILTIN.items():
        assert registry.backends()[scheme] is info
        cls = registry.load_backend(scheme)
        assert issubclass(cls, Store)
        assert scheme in cls.schemes or info.form in ("wrapper", "protocol"), scheme


def test_a_third_party_backend_declares_its_record_by_class_attributes(tmp_path: Path) -> None:
    """Another distribution's backend: an entry point, and class attributes for what a built-in
    record says (URL form, client packages, install hint, option names), read through the
    entry point; in a fresh interpreter that finds the distribution on its path."""
    import subprocess
    import sys
    import textwrap

    dist = tmp_path / "kvstore_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kvstore-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[ckptio.backends]\nkvdemo = kvdemo:KVStore\n")
    (tmp_path / "kvdemo.py").write_text(
        textwrap.dedent(
            """
            from ckptio.store import Store

            class KVStore(Store):
                schemes = ("kvdemo",)
                url_form = "bucket"
                requires = ("kvdemo_client_not_installed",)
                install_hint = "pip install kvstore-demo[client]"
                request_size_option = "chunk_size"
            """
        )
    )
    code = textwrap.dedent(
        """
        from ckptio import errors, registry
        info = registry.backend_info("kvdemo")
        print(info.form, info.requires, info.request_size_option, info.flush_option)
        print(registry.parse_url("kvdemo://bucket-1/run").bucket)
        print("kvdemo://bucket/prefix" in registry.accepted_forms())
        try:
            registry.open_store("kvdemo://bucket-1/run")
        except errors.BackendUnavailableError as err:
            print(err)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:3] == [
        "bucket ('kvdemo_client_not_installed',) chunk_size None",
        "bucket-1",
        "True",
    ]
    assert "'kvdemo_client_not_installed'" in lines[3]
    assert lines[3].endswith("pip install kvstore-demo[client]")


def test_a_missing_client_names_the_extra_from_the_record() -> None:
    """The record's install hint is what a missing client package's error says."""
    for info in registry.BUILTIN.values():
        if info.requires:
            assert info.install_hint == f"pip install 'ckptio[{info.extra}]'"
        else:
            assert info.install_hint  # never empty
