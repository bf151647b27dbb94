"""Every ``python`` and ``sh`` code block of README.md and docs/*.md runs in the default test run.

Sybil (a maintained tool for testing documentation examples) parses the Markdown: each block
is one test item, in document order, sharing one namespace per document, so a block may use
what an earlier block of the same page defined. Why sybil rather than pytest-markdown-docs:
sybil runs shell blocks too (through an evaluator of our own, below) and has skip directives
that carry a reason, written in the page as an HTML comment that renders as nothing::

    <!-- skip: next "needs 64 MPI ranks on a cluster" -->

Each document runs in its own temporary directory (its working directory and ``TMPDIR``), so
examples use relative paths (``ckpt/run1``) and write nothing outside it. ``s3://`` examples
reach a moto server: the AWS environment points at it and the buckets the pages use exist,
fresh for each document. Blocks are not rewritten: what runs is what the page shows.

Every block runs or skips on its own. A block that imports an optional package which is not
installed (torch, jax, lightning, mpi4py) is skipped, naming the install that brings it; so is
a later block that uses a name only such a skipped block defines (found from the block's
source before it runs), naming that block's page and line. Every skipped block is reported at
its page and line (not at the evaluator that skipped it), and a test module's
``pytest.importorskip`` of an optional package says how to install it too.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from sybil import Example, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, SkipParser

#: Buckets that the pages' s3:// examples name; each document gets them fresh on moto.
DOC_BUCKETS = ("bucket", "my-bucket")

#: optional packages -> the install that brings them, in a clone of the repository (where the
#: README's test command runs)
_OPTIONAL = {
    "torch": "pip install -e '.[torch]'",
    "jax": "pip install -e '.[jax]'",
    "jaxlib": "pip install -e '.[jax]'",
    "lightning": "pip install -e '.[lightning]'",
    "pytorch_lightning": "pip install -e '.[lightning]'",
    "mpi4py": "pip install -e '.[mpi]'",
    "safetensors": "pip install -e '.[bench]'",
}

#: key of a page's namespace: the blocks skipped for a missing package, (line, reason, names
#: each defines)
_SKIPPED = "__ckptio_skipped_blocks__"

#: one shell block may take this long (the README's `ckptio compare` is the longest)
SHELL_TIMEOUT = 300


#: third-party warnings the examples meet (pytest turns warnings into errors, pyproject.toml);
#: the same ones tests/test_dcp.py and tests/test_torch_lightning.py ignore
_IGNORED_WARNINGS = (
    # dcp.save/dcp.load in one process (the pages' examples); under torchrun it does not warn
    ("ignore", "torch.distributed is disabled", UserWarning, ""),
    # lightning 2.6 against torch 2.13's pytree API, and Lightning's own advice at fit()
    ("ignore", "`isinstance", FutureWarning, ""),
    # (and lightning_fabric's advice to use srun, where Slurm is installed, as on CI)
    ("ignore", "", UserWarning, r"(pytorch_)?lightning(_fabric)?\."),
    ("ignore", "", DeprecationWarning, r"(pytorch_)?lightning(_fabric)?\."),
)


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names a block binds, names it reads), anywhere in it (scopes are not told apart: a
    name bound anywhere in the block counts as its own)."""
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, read


def _evaluate_python(example: Example) -> None:
    skipped = example.namespace.setdefault(_SKIPPED, [])
    bound, read = _names(example.parsed)
    unbound = read - bound - set(example.namespace) - set(dir(builtins))
    for line, reason, defines in skipped:
        needed = sorted(unbound & defines)
        if needed:
            skipped.append((example.line, reason, bound))  # what this one defines is lost too
            pytest.skip(
                f"uses {', '.join(needed)} from the block at line {line}, skipped: {reason}"
            )
    try:
        with warnings.catch_warnings():
            for action, message, category, module in _IGNORED_WARNINGS:
                warnings.filterwarnings(action, message, category, module)
            PythonEvaluator()(example)
    except ModuleNotFoundError as err:
        package = (err.name or "").split(".")[0]
        if package in _OPTIONAL:
            reason = f"{err.name} is not installed ({_OPTIONAL[package]})"
            skipped.append((example.line, reason, bound))
            pytest.skip(reason)
        raise


_IMPORTORSKIP = re.compile(r"could not import '([\w.]+)'")


def _explain_skip(report: pytest.CollectReport | pytest.TestReport, item: object) -> None:
    """A skip reported where it is and saying how to enable it: a doc block's at its page and
    line (not at the evaluator that raised it), a missing optional package with its install."""
    if not (report.skipped and isinstance(report.longrepr, tuple)):
        return
    path, line, reason = report.longrepr
    m = _IMPORTORSKIP.search(reason)
    package = m[1].split(".")[0] if m else ""
    if package in _OPTIONAL and "install" not in reason:
        reason = f"{reason} ({_OPTIONAL[package]})"
    example = getattr(item, "example", None)
    if isinstance(example, Example):
        path, line = example.path, example.line
    report.longrepr = (path, line, reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _explain_skip(report, item)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _explain_skip(report, collector)
    return report


def _evaluate_shell(example: Example) -> None:
    """Runs the block with bash (-e: the first failing command fails the block) in the
    document's directory, with this interpreter's scripts (``ckptio``) first on PATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    proc = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", example.parsed],
        cwd=os.getcwd(),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SHELL_TIMEOUT,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"shell block exited {proc.returncode}\n--- block\n{example.parsed}"
            f"--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-4000:]}"
        )


@pytest.fixture(scope="module")
def docs_env(tmp_path_factory: pytest.TempPathFactory, moto_server: str) -> Iterator[Path]:
    """The world of one document's examples: a fresh temporary working directory (also
    ``TMPDIR``), the AWS environment on the moto server, the buckets the pages use."""
    from ckptio.testing.motoserver import aws_env, boto3_client, reset_moto

    where = tmp_path_factory.mktemp("doc")
    reset_moto(moto_server)
    client = boto3_client(moto_server)
    for bucket in DOC_BUCKETS:
        client.create_bucket(Bucket=bucket)
    client.close()
    old_cwd = os.getcwd()
    with pytest.MonkeyPatch.context() as mp:
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(k, raising=False)
        for k, v in aws_env(moto_server).items():
            mp.setenv(k, v)
        mp.setenv("TMPDIR", str(where))
        os.chdir(where)
        try:
            yield where
        finally:
            os.chdir(old_cwd)


pytest_collect_file = Sybil(
    parsers=[
        CodeBlockParser(language="python", evaluator=_evaluate_python),
        CodeBlockParser(language="sh", evaluator=_evaluate_shell),
        SkipParser(),
    ],
    patterns=["README.md", "docs/*.md", "docs/**/*.md"],
    fixtures=["docs_env"],
).pytest()
