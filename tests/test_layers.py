"""The layers of ckptio, as the source states them (ARCHITECTURE.md): every import
of a ``ckptio`` module (and of a backend, ``backends/`` = ``ckptio.backends``) points to its own
layer or one below, and the import graph has no cycle. Module-level and function-level (lazy)
imports both count; imports under ``if TYPE_CHECKING:`` do not (they never run: annotations
only). A submodule is joined to its parent package, whose ``__init__`` runs first when it is
imported (``ckptio.checkpoint.commit`` -> ``ckptio.checkpoint``). The registry reaches the backends through its entry points (strings), so nothing here
sees those. argparse and rich belong to the CLI; ``dir(ckptio)`` is the documented API.

The graph is built with ``ast`` from the files, so a module does not have to import to be
checked, and a new module fails here until it has a place in :data:`LAYERS`."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ckptio

ROOT = Path(ckptio.__file__).resolve().parent.parent
"""The checkout whose ckptio is imported (its backends/ beside it)."""

#: Bottom to top: a module may import from its own layer (without a cycle) and from the layers
#: above it in this list, never from one below. ``name.*``: the package's submodules.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "helpers",  # console-free: errors, units, trace, secrets, buffers, ranks, profile data
        (
            "ckptio.errors",
            "ckptio.units",
            "ckptio.protocol",
            "ckptio.trace",
            "ckptio.redact",
            "ckptio.arrays",
            "ckptio._memcopy",
            "ckptio.wire",
            "ckptio.dist",
            "ckptio.dist_torch",
            "ckptio.forked",
            # storage profiles are data (TOML, read with units): the emulate backend emulates
            # them and the model projects with them, so they sit below both
            "ckptio.profiles",
        ),
    ),
    (
        "store",  # the contract, the registry, the on-storage format, and the backends
        (
            "ckptio.store",
            "ckptio.registry",
            "ckptio.format",
            "ckptio.manifest",
            "ckptio.backends",
            "ckptio.backends.*",
        ),
    ),
    (
        "checkpoint",  # save/load/Checkpointer, leases, tiers, framework integrations
        (
            "ckptio",
            "ckptio.checkpoint",
            "ckptio.checkpoint.*",
            "ckptio.lease",
            "ckptio.tiered",
            "ckptio.dcp_metadata",
            "ckptio.torch",
            "ckptio.jax",
            "ckptio.lightning",
        ),
    ),
    (
        "suite",
        (
            "ckptio.workload",
            "ckptio.runner",
            "ckptio.runner.*",
            "ckptio.results",
            "ckptio.tierbench",
        ),
    ),
    (
        "analysis",  # model, report, the comparison and the servers it starts
        (
            "ckptio.intervals",
            "ckptio.costmodel",
            "ckptio.peermodel",
            "ckptio.stallmodel",
            "ckptio.calibration",
            "ckptio.sensitivity",
            "ckptio.model",
            "ckptio.simulate",
            "ckptio.simulate.*",
            "ckptio.pernode",
            "ckptio.report",
            "ckptio.report.*",
            "ckptio.compare",
            "ckptio.mockserver",
            "ckptio.rgwserver",
        ),
    ),
    ("cli", ("ckptio.cli", "ckptio.cli.*")),
    ("testing", ("ckptio.testing", "ckptio.testing.*")),  # for tests; the product never imports it
]

#: Packages only the CLI layer imports.
CLI_ONLY = ("argparse", "rich")

#: Lazy imports inside one layer that close a cycle, known and kept: (importer, imported) ->
#: why. The importer may be a package (its modules count). Each must still exist: the test
#: fails when one goes, so its entry goes too.
KNOWN_CYCLES: dict[tuple[str, str], str] = {}


def _in(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def _modules() -> dict[str, Path]:
    """Module name -> file, for ckptio/ (without its backends link) and backends/."""
    found: dict[str, Path] = {}
    for path in sorted((ROOT / "ckptio").rglob("*.py")):
        rel = path.relative_to(ROOT / "ckptio")
        if rel.parts[0] == "backends":
            continue  # a link to ../backends in some checkouts: read from backends/ below
        found[_name("ckptio", rel)] = path
    for path in sorted((ROOT / "backends").rglob("*.py")):
        found[_name("ckptio.backends", path.relative_to(ROOT / "backends"))] = path
    for path in (ROOT / "ckptio").glob("*.c"):  # C extensions: a module without Python source
        found[f"ckptio.{path.stem}"] = path
    return found


def _name(package: str, rel: Path) -> str:
    parts = [package, *rel.with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.orelse:
                    visit_stmt(sub)
                continue
            visit_stmt(child)

    def visit_stmt(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        visit(node)

    visit(tree)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]
) -> list[str]:
    """The modules an import statement names: ``from X import a`` is ``X.a`` where that is a
    module, else ``X``; relative imports are resolved against ``module``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        parts = package.split(".")
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, base] if base else parts)
    return [
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
    ]


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(ckptio module -> ckptio modules it imports, module -> top-level packages it imports)."""
    modules = _modules()
    known = set(modules)
    edges: dict[str, set[str]] = {m: set() for m in modules}
    packages: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _runtime_imports(tree):
            for target in _targets(node, module, path.name == "__init__.py", known):
                packages[module].add(target.partition(".")[0])
                if target == "ckptio" or target.startswith("ckptio."):
                    assert target in known, f"{module} imports {target}, which is not a module"
                    if target != module:
                        edges[module].add(target)
    return _join_parents(edges), packages


def _join_parents(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` with every submodule joined to its parent packages: importing
    ``ckptio.checkpoint.commit`` runs ``ckptio/checkpoint/__init__.py`` first, so the modules
    that ``__init__`` imports from outside its package are imports of every module in it.
    (Its imports of its own submodules are not: they load the package's own parts.) The top
    package ``ckptio`` is left out: it imports nothing when it loads
    (:func:`test_the_top_package_imports_nothing_when_it_loads`)."""
    joined = {m: set(targets) for m, targets in edges.items()}
    for module in edges:
        parent = module.rpartition(".")[0]
        while parent and parent != "ckptio":
            joined[module].update(t for t in edges.get(parent, ()) if not _in(t, parent))
            parent = parent.rpartition(".")[0]
    return joined


def _layer_of(module: str) -> int:
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if module == name or (
                name.endswith(".*") and module.startswith(name[:-1]) and module != name[:-2]
            ):
                return index
    raise AssertionError(f"{module} has no layer: add it to LAYERS in tests/test_layers.py")


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``edges`` as a list of modules (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_every_module_has_a_layer_and_the_table_names_no_module_twice():
    modules = _modules()
    for module in modules:
        _layer_of(module)
    listed = [n for _, names in LAYERS for n in names]
    assert len(listed) == len(set(listed))


def test_imports_point_to_the_same_layer_or_below():
    edges, _ = _graph()
    upward = {
        (a, b): f"{a} ({LAYERS[_layer_of(a)][0]}) imports {b} ({LAYERS[_layer_of(b)][0]})"
        for a, targets in edges.items()
        for b in targets
        if _layer_of(b) > _layer_of(a)
    }
    assert [upward[e] for e in sorted(upward)] == []


def test_the_import_graph_has_no_cycle():
    edges, _ = _graph()
    for importer, imported in KNOWN_CYCLES:
        known = [a for a in edges if _in(a, importer) and imported in edges[a]]
        assert known, f"{importer} no longer imports {imported}: remove it from KNOWN_CYCLES"
        for a in known:
            edges[a].discard(imported)
    cycle = _cycle(edges)
    assert cycle is None, " -> ".join(cycle or [])


@pytest.mark.parametrize("package", CLI_ONLY)
def test_argparse_and_rich_are_imported_only_by_the_cli(package):
    _, packages = _graph()
    cli = next(i for i, (name, _) in enumerate(LAYERS) if name == "cli")
    outside = sorted(m for m, used in packages.items() if package in used and _layer_of(m) != cli)
    assert outside == []


#: Public modules without ``__all__`` yet, and why.
NO_ALL_YET: dict[str, str] = {}


def _bound(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (in ``if``/``try`` blocks too)."""
    found: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                stack.extend(handler.body)
    return found


def test_every_public_module_states_its_api_in_dunder_all():
    missing, unbound = [], {}
    for module, path in _modules().items():
        if path.suffix != ".py" or any(p.startswith("_") for p in module.split(".")):
            continue
        if any(_in(module, name) for name in NO_ALL_YET):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        declared = [
            node.value
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and any(
                isinstance(t, ast.Name) and t.id == "__all__"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
        ]
        if not declared:
            missing.append(module)
            continue
        names = ast.literal_eval(declared[0]) if declared[0] is not None else []
        if wrong := sorted(set(names) - _bound(tree)):
            unbound[module] = wrong
    assert missing == [] and unbound == {}


def _documented() -> set[str]:
    """The names docs/reference/ckptio.md documents (``::: ckptio.<name>``)."""
    text = (ROOT / "docs" / "reference" / "ckptio.md").read_text(encoding="utf-8")
    return set(re.findall(r"^::: ckptio\.(\w+)$", text, re.M))


def test_dir_of_ckptio_is_the_documented_api():
    # a fresh interpreter: this one has imported submodules, which become attributes
    out = subprocess.run(
        [sys.executable, "-c", "import ckptio; print(' '.join(dir(ckptio)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == sorted(ckptio.__all__)
    assert set(ckptio.__all__) == _documented() | {"__version__"}
    for name in ckptio.__all__:
        assert getattr(ckptio, name) is not None


def test_this_test_sees_lazy_and_relative_imports_and_skips_type_checking_ones(tmp_path):
    """The graph builder itself: a function-level import counts, a TYPE_CHECKING one does
    not, and a relative import resolves to the module it names."""
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ckptio import runner\n"
        "def f():\n    from ckptio.cli import main\n"
        "from . import errors\n"
    )
    known = {"ckptio.runner", "ckptio.cli", "ckptio.errors", "ckptio.units"}
    names = [
        t for node in _runtime_imports(tree) for t in _targets(node, "ckptio.units", False, known)
    ]
    assert names == ["typing", "ckptio.cli", "ckptio.errors"]


def test_the_top_package_imports_nothing_when_it_loads():
    """Why :func:`_parent` does not join ``ckptio.*`` to ``ckptio``: its ``__init__`` binds its
    public names on first use (PEP 562), so loading any ``ckptio.x`` loads nothing else."""
    edges, _ = _graph()
    assert edges["ckptio"] == set()


def test_a_cycle_through_a_parent_package_is_found():
    """The graph builder joins a submodule to its parent: a package whose ``__init__`` imports
    a module that imports one of the package's submodules is a cycle (as
    ``ckptio/checkpoint/__init__.py`` importing ``ckptio.tiered`` did, which imported
    ``ckptio.checkpoint.commit``), though no module imports the package by name; a package
    importing its own submodules is not."""
    known = {"pkg", "pkg.sub", "pkg.sub.leaf", "pkg.sub.other", "pkg.top"}
    sources = {"pkg.sub": "from pkg.sub import other\n", "pkg.top": "from pkg.sub.leaf import f\n"}

    def graph() -> dict[str, set[str]]:
        edges: dict[str, set[str]] = {m: set() for m in known}
        for module, source in sources.items():
            for node in _runtime_imports(ast.parse(source)):
                edges[module].update(_targets(node, module, module == "pkg.sub", known))
        return edges

    assert _cycle(_join_parents(graph())) is None
    sources["pkg.sub"] += "from pkg import top\n"
    assert _cycle(graph()) is None  # what the test saw before it joined parents
    assert _cycle(_join_parents(graph())) == ["pkg.top", "pkg.sub.leaf", "pkg.top"]


def test_each_known_cycle_closes_a_cycle_today():
    """Without its entry in :data:`KNOWN_CYCLES`, each known cycle is found (the test would
    fail on it): the list names real cycles only."""
    edges, _ = _graph()
    for importer, imported in KNOWN_CYCLES:
        others = {k: v for k, v in KNOWN_CYCLES.items() if k != (importer, imported)}
        pruned = {a: set(b) for a, b in edges.items()}
        for a, b in others:
            for m in pruned:
                if _in(m, a):
                    pruned[m].discard(b)
        cycle = _cycle(pruned)
        assert cycle is not None and imported in cycle, (importer, imported)
