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
from ckptio.store import Store

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
    ("compare.py", "_Ceph.url"): "likewise, the URLs of the Ceph the suite starts (RGW's S3, "
    "CephFS's mount as pfs://); nothing branches on them",
    ("tierbench.py", "run_tiered"): "the tiered targets' emulated durable tier lives in "
    "memory://, as compare's emulated targets do; nothing branches on it",
    ("arrays.py", "_read_capacity"): "'memory' is the cgroup controller, not a store",
    ("mockserver.py", "boto3_client"): "'s3' is boto3's service name for the client of the "
    "moto server the suite starts (moved from testing/), not a store",
    ("testing/", "*"): "the conformance suite and the pytest plugin's fixtures build URLs of the "
    "stores under test (a test helper, not the library)",
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
        "    if url.startswith('shaped'):\n"
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


def _check_common(store: Store) -> None:
    assert isinstance(store.streams, int) and store.streams >= 0
    assert isinstance(store.request_size, int) and store.request_size >= 0
    assert isinstance(type(store).request_size_option, str)
    assert isinstance(store.emulated, bool)
    versions = store.client_versions()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items())
    if not store.emulated:  # an emulated store runs on the wrapped store's clients
        assert set(versions) <= set(store.client_packages)
    assert set(store.cold_read_modes) <= {"o_direct", "fadvise"}
    assert store.local_path is None or os.path.isabs(store.local_path)
    # a mode the store does not offer is refused, naming the ones it does
    for mode in {"o_direct", "fadvise"} - set(store.cold_read_modes):
        with pytest.raises(errors.InvalidArgumentError, match="cold"):
            store.start_cold_reads([], mode)


def _cold_read_round(store: Store) -> None:
    """Every mode the store offers makes the next read cold and gives the data back."""
    data = os.urandom(3 * 2**20 + 17)
    store.put("cold/a.bin", data)
    for mode in store.cold_read_modes:
        assert store.start_cold_reads(["cold/a.bin"], mode) == mode
        buf = bytearray(len(data))
        assert store.read_into("cold/a.bin", 0, buf) == len(data)
        assert store.end_cold_reads() is True
        assert bytes(buf) == data


def test_local_store_contract(tmp_path: Path) -> None:
    with open_store(f"file://{tmp_path}/root", streams=3, block_size="1MiB") as store:
        _check_common(store)
        assert (store.streams, store.request_size) == (3, 2**20)
        assert type(store).request_size_option == "block_size"
        assert store.local_path == f"{tmp_path}/root"
        assert not store.emulated
        assert "fadvise" in store.cold_read_modes
        assert ("o_direct" in store.cold_read_modes) == store.capabilities.direct_io
        _cold_read_round(store)


def test_local_store_fadvise_reports_what_it_could_drop(tmp_path: Path) -> None:
    with open_store(f"file://{tmp_path}/root") as store:
        store.put("x/a.bin", b"a" * 4096)
        # an object that is not there cannot be dropped: not every read will be cold
        assert store.start_cold_reads(["x/a.bin", "x/missing.bin"], "fadvise") == "none"
        assert store.start_cold_reads(["x/missing.bin"], "fadvise") == ""
        assert store.start_cold_reads(["x/a.bin"], "fadvise") == "fadvise"
        assert store.end_cold_reads() is True


def test_local_direct_reads_end_as_they_began(tmp_path: Path) -> None:
    with open_store(f"file://{tmp_path}/root", direct_read=False) as store:
        if "o_direct" not in store.cold_read_modes:
            pytest.skip("no O_DIRECT on this platform")
        store.put("x/a.bin", os.urandom(2**20))
        assert store.start_cold_reads(["x/a.bin"], "o_direct") == "o_direct"
        assert store.direct_read  # type: ignore[attr-defined]
        assert store.end_cold_reads() is True
        assert not store.direct_read  # type: ignore[attr-defined]


def test_pfs_store_contract(tmp_path: Path) -> None:
    with open_store(f"pfs://{tmp_path}/root", block_size="2MiB") as store:
        _check_common(store)
        assert store.request_size == 2 * 2**20
        assert type(store).request_size_option == "block_size"
        assert store.local_path == f"{tmp_path}/root"
        _cold_read_round(store)


def test_memory_store_contract(memory_url: str) -> None:
    with open_store(memory_url) as store:
        _check_common(store)
        assert store.cold_read_modes == ()
        assert store.local_path is None
        assert store.client_versions() == {}
        assert store.end_cold_reads() is True


@pytest.mark.parametrize("inner", ["memory", "file"])
def test_shaped_store_contract(inner: str, tmp_path: Path, memory_url: str) -> None:
    url = memory_url if inner == "memory" else f"file://{tmp_path}/root"
    with open_store(f"shaped+{url}", profile="local-nvme", part_size="4MiB", streams=5) as store:
        _check_common(store)
        assert store.emulated
        assert (store.streams, store.request_size) == (5, 4 * 2**20)
        assert type(store).request_size_option == "part_size"
        if inner == "file":
            assert store.local_path == f"{tmp_path}/root"
            assert store.cold_read_modes == ("fadvise",)  # direct reads are not emulated
        else:
            assert store.local_path is None
            assert store.cold_read_modes == ()
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
    with open_store(f"{scheme}://{s3_bucket}/root", part_size="6MiB", streams=3) as store:
        _check_common(store)
        assert (store.streams, store.request_size) == (3, 6 * 2**20)
        assert type(store).request_size_option == "part_size"
        assert store.local_path is None
        assert store.cold_read_modes == ()
        assert set(store.client_packages) == packages
        assert "botocore" in store.client_versions()


def test_fsspec_local_contract(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    with open_store(f"fsspec+file://{tmp_path}/root", streams=2) as store:
        _check_common(store)
        assert store.local_path == f"{tmp_path}/root"
        assert store.streams == 2
        assert "fsspec" in store.client_versions()


def test_store_class_is_found_without_opening_a_store() -> None:
    """What the CLI needs before it opens anything: the option that sets the request size."""
    assert registry.store_class("/tmp/x").request_size_option == "block_size"
    assert registry.store_class("shaped+memory://x").request_size_option == "part_size"
    assert registry.store_class("s3://bucket/x").request_size_option == "part_size"


def test_base_class_defaults() -> None:
    """A third-party store that says nothing gets defaults that mean 'not applicable'."""

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

    s = Minimal("x://y")
    assert (s.streams, s.request_size, s.local_path, s.emulated) == (0, 0, None, False)
    assert s.cold_read_modes == () and s.client_versions() == {}
    assert Minimal.request_size_option == "part_size" and Minimal.client_packages == ()
    assert s.end_cold_reads() is True
