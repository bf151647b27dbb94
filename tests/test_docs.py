"""The documentation keeps up with the code: every public name is in the API reference, every
code block of README.md and docs/ is in a language the doc tests run (or one that is data),
the profile table is generated from every shipped profile, the README stays a README.

(The blocks themselves run through conftest.py at the repository root, with sybil.)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]

#: fence languages sybil runs (conftest.py) and those that are data or diagrams, never code
RUN = {"python", "sh"}
DATA = {"text", "json", "toml", "mermaid"}

#: module -> file whose __all__ lists its public names
PUBLIC = {
    "ckptio": ROOT / "ckptio" / "__init__.py",
    "ckptio.torch": ROOT / "ckptio" / "torch.py",
    "ckptio.jax": ROOT / "ckptio" / "jax.py",
}


def _all_of(path: Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [n for n in ast.literal_eval(node.value) if not n.startswith("__")]
    raise AssertionError(f"{path}: no __all__")


def _documented() -> set[str]:
    names: set[str] = set()
    for page in (DOCS / "reference").glob("*.md"):
        names |= set(re.findall(r"^::: ([\w.]+)", page.read_text(), flags=re.MULTILINE))
        for block in re.finditer(
            r"^::: ([\w.]+)\n(?:    .*\n)*?\s+members: \[(.*)\]",
            page.read_text(),
            flags=re.MULTILINE,
        ):
            names |= {f"{block.group(1)}.{m.strip()}" for m in block.group(2).split(",")}
    return names


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_is_in_the_api_reference(module: str) -> None:
    documented = _documented()
    missing = [n for n in _all_of(PUBLIC[module]) if f"{module}.{n}" not in documented]
    assert not missing, f"add to docs/reference/: {', '.join(f'{module}.{n}' for n in missing)}"


def test_the_store_contract_and_the_conformance_suite_are_in_the_api_reference() -> None:
    documented = _documented()
    for name in (
        "ckptio.store.Store",
        "ckptio.store.Writer",
        "ckptio.store.Capabilities",
        "ckptio.testing.store_tests.StoreTests",
        "ckptio.testing.moto.s3_bucket",
    ):
        assert name in documented, name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_runs_or_is_data(page: Path) -> None:
    fences = re.findall(r"^```(\S*)", page.read_text(), flags=re.MULTILINE)
    opening = fences[::2]  # fences alternate: opening, closing
    unknown = [lang or "(none)" for lang in opening if lang not in RUN | DATA]
    assert not unknown, (
        f"{page.name}: code blocks in {unknown} are neither run by the doc tests ({sorted(RUN)}) "
        f"nor data ({sorted(DATA)})"
    )


HIDE_OPTIONAL = """
import sys
for name in ("torch", "jax", "jaxlib", "pytorch_lightning", "lightning"):
    sys.modules[name] = None  # import raises ModuleNotFoundError, as where it is not installed
"""


def test_doc_blocks_run_or_skip_on_their_own_without_the_optional_packages(tmp_path: Path) -> None:
    """The page with torch, Lightning and JAX examples, run as the README's test command runs
    it on a machine without those packages (hidden from a real pytest run here, whatever is
    installed): every block passes or skips, each skip names its page and line and the
    install that enables it, and a block that needs none of them runs although the page's
    first block, which imports ckptio and torch, is skipped."""
    import subprocess

    (tmp_path / "hide_optional.py").write_text(HIDE_OPTIONAL)
    page = DOCS / "training.md"
    lines = page.read_text().splitlines()
    fork = next(i for i, t in enumerate(lines, 1) if 'snapshot="fork", keep_last=2' in t)
    fence = max(i for i, t in enumerate(lines[:fork], 1) if t == "```python")
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    pytest_args = ["-p", "hide_optional", "-p", "no:cacheprovider", "-rs", "-v"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, str(page.relative_to(ROOT))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert f"docs/training.md::line:{fence},column:1 PASSED" in out, out[-6000:]
    skips = [t for t in out.splitlines() if t.startswith("SKIPPED")]
    assert len(skips) >= 4, out[-6000:]
    for t in skips:
        assert re.match(r"SKIPPED \[1\] docs/training\.md:\d+: ", t) and "pip install -e" in t, t


def test_profile_table_is_generated_from_every_profile() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import docs_hooks
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from ckptio.profiles import FIGURES, load_all

    table = docs_hooks.profiles_markdown()
    for profile in load_all():
        assert f"### `{profile.name}`" in table
        for name in FIGURES:
            assert profile.figures[name].source.replace("|", "\\|") in table
    page = (DOCS / "suite.md").read_text()
    assert docs_hooks.MARK in page
    assert docs_hooks.on_page_markdown(page).count("### `") == len(load_all())


def test_readme_is_a_readme() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) < 12 * 1024, f"README.md is {len(text.encode())} bytes (< 12 KiB)"
    dated = [
        line
        for line in text.splitlines()
        if re.search(r"\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d\b.*UTC|\bUTC\b", line)
    ]
    assert not dated, f"dated measurement lines belong in docs/performance.md: {dated}"


def test_changelog_has_the_package_version() -> None:
    import ckptio

    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(ckptio.__version__)}\]", changelog, flags=re.MULTILINE)
    assert re.search(r"^## \[Unreleased\]", changelog, flags=re.MULTILINE)


@pytest.mark.parametrize("page", ["README.md", "CHANGELOG.md", "benchmarks/README.md"])
def test_relative_links_outside_the_site_resolve(page: str) -> None:
    # (mkdocs build --strict checks the links of docs/; these pages are not part of the site)
    text = (ROOT / page).read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    broken = [
        t
        for t in targets
        if "://" not in t
        and not t.startswith("#")
        and not (ROOT / page).parent.joinpath(t.split("#")[0]).exists()
    ]
    assert not broken, f"{page}: links to missing files: {broken}"
