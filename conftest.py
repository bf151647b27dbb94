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

A block that imports an optional package which is not installed (torch, jax, lightning,
mpi4py) is skipped, naming the extra to install, like the test modules that need them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from sybil import Example, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, SkipParser

#: Buckets that the pages' s3:// examples name; each document gets them fresh on moto.
DOC_BUCKETS = ("bucket", "my-bucket")

#: optional packages -> the install that brings them
_OPTIONAL = {
    "torch": "pip install 'ckptio[torch]'",
    "jax": "pip install 'ckptio[jax]'",
    "jaxlib": "pip install 'ckptio[jax]'",
    "lightning": "pip install 'ckptio[lightning]'",
    "pytorch_lightning": "pip install 'ckptio[lightning]'",
    "mpi4py": "pip install 'ckptio[mpi]'",
}

#: one shell block may take this long (the README's `ckptio compare` is the longest)
SHELL_TIMEOUT = 300


#: third-party warnings the examples meet (pytest turns warnings into errors, pyproject.toml);
#: the same ones tests/test_dcp.py and tests/test_torch_lightning.py ignore
_IGNORED_WARNINGS = (
    # dcp.save/dcp.load in one process (the pages' examples); under torchrun it does not warn
    ("ignore", "torch.distributed is disabled", UserWarning, ""),
    # lightning 2.6 against torch 2.13's pytree API, and Lightning's own advice at fit()
    ("ignore", "`isinstance", FutureWarning, ""),
    ("ignore", "", UserWarning, r"(pytorch_)?lightning(_fabric)?\."),
    ("ignore", "", DeprecationWarning, r"(pytorch_)?lightning\."),
)


def _evaluate_python(example: Example) -> None:
    try:
        with warnings.catch_warnings():
            for action, message, category, module in _IGNORED_WARNINGS:
                warnings.filterwarnings(action, message, category, module)
            PythonEvaluator()(example)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in _OPTIONAL:
            pytest.skip(f"{err.name} is not installed ({_OPTIONAL[err.name.split('.')[0]]})")
        raise


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
