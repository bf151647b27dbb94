"""Every subcommand answers every malformed numeric, size, bandwidth or duration argument with
one line naming the argument and stating what it accepts, exit status 2, no traceback, and
before any work starts (issue 19, item 6).

The options are found by walking ``ckptio``'s own parsers: any option that is not a flag, not a
choice and not free text (:data:`TEXT_OPTIONS`) is numeric and gets the whole corpus of bad
values, so an option added later is covered without touching this file. The commands run in
this process through :func:`ckptio.cli.main` (the console script's code path; one case in a
real process shows they agree), with the functions that would start work replaced by ones that
raise :class:`Accepted`: a bad value that gets that far was accepted.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptio import cli

HUGE = "1" + "0" * 30  # 10**30
BAD = [
    "nan",
    "NaN",
    "-inf",
    "1e999",
    "1e400",
    "-3",
    "-1e999",
    "",
    " ",
    HUGE,
    "5XB",
    "abc",
    "0x10",
    "1,2",
]
"""Bad for every numeric option of the command line."""
BAD_UNLESS_ZERO_OK = ["0", "0.0", "0MiB"]
BAD_UNLESS_INF_OK = ["inf", "Infinity"]
BAD_COUNT = ["1.5", "1e3"]
"""Bad for options that take an integer."""

ZERO_OK = {
    "--zero",
    "--step",
    "--restart",
    "--checkpoint-seconds",
    "--older-than",
    "--grace",
    "--pause",
    "--price",
    "--restart-overhead",
    "--p-lose-node",
    "--p-lose-another",
    "--peers",
    "--replicas",
    "--osts",
    "--stragglers",
    "--seed",
}
"""Options where 0 means something (ZeRO stage 0, step 0, no restart time, ...)."""
INF_OK = {
    "--write-bandwidth",
    "--snapshot-bandwidth",
    "--read-bandwidth",
    "--peer-bandwidth",
    "--mtbf",
}
"""Options where ``inf`` means something (no bandwidth limit, no failures)."""
COUNT_OPTIONS = {
    "--step",
    "--gpus",
    "--writing-ranks",
    "--peers",
    "--replicas",
    "--lose",
    "--peer-fan-in",
    "--ranks-per-node",
    "--objects-per-rank",
    "--streams",
    "--iterations",
    "--tp",
    "--pp",
    "--zero",
    "--hidden",
    "--layers",
    "--ffn",
    "--vocab",
    "--heads",
    "--kv-heads",
    "--dp",
    "--ranks",
    "--inflight",
    "--persist-every",
    "--osts",
    "--workers",
    "--stripe-count",
    "--max-attempts",
    "--readers",
    "--stragglers",
    "--replications",
    "--seed",
}
TEXT_OPTIONS = {
    "--preset",
    "--out",
    "--site",
    "--label",
    "--targets",
    "--profiles",
    "--tiered",
    "--profile",
    "--emulate",
    "--emulate-local",
    "--option",
    "--set",
    "--from",
    "--help",
    "--project",
    "--local",
    "--target",
    "--latency",
    "--report",
}
"""Options whose values are names, paths or KEY=VALUE items (``--project``, ``--option`` and
``--set`` have corpora of their own below)."""

PROJECT_BAD = [
    "llama3-8b:abc",
    "llama3-8b:0",
    "llama3-8b:-8",
    "llama3-8b:1e999",
    "llama3-8b:nan",
    f"llama3-8b:{HUGE}",
    "llama3-8b:",
    "nosuch",
    "nosuch:8",
    "",
    ":8",
    "custom",
    "gpt3-175b:7",
]
SET_BAD = [
    "stream_bandwidth=1e999",
    "stream_bandwidth=nan",
    "stream_bandwidth=0",
    "request_latency=nan",
    "request_latency=-1",
    "request_latency=1e999",
    "write_request_rate=1e999",
    "write_request_rate=-5",
    "streams=0",
    f"streams={HUGE}",
    "part_size=-1",
    "part_size=1e999",
    "part_size=5XB",
]
STORE_SIZE_BAD = ["1e999", "1e400", "nan", "inf", "-1", "5XB", "", HUGE]
STORE_COUNT_BAD = ["0", "-1", "nan", "1e999", "1.5", "", HUGE]


class Accepted(Exception):
    """Raised in place of the work a command would start: the bad value got through."""


class Hung(Exception):
    """Raised by an alarm when a command runs for longer than any refusal takes."""


CASE_SECONDS = 30


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _numeric_options() -> Iterator[tuple[str, argparse.Action]]:
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if (
                not action.option_strings
                or action.nargs == 0
                or action.choices
                or set(action.option_strings) & TEXT_OPTIONS
            ):
                continue
            yield name, action


def _positionals(name: str, tmp: Path) -> list[str]:
    """Placeholder values for a subcommand's positional arguments."""
    values = {
        "url": f"file://{tmp}/root",
        "target": "memory://cli-args",
        "results": str(tmp / "r"),
        "names": None,
    }
    out = []
    for action in _subparsers()[name]._actions:
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
            assert action.dest in values, f"ckptio {name}: positional {action.dest!r} unknown here"
            if values[action.dest] is not None:
                out.append(values[action.dest])
    return out


EXTRA = {
    # never start a real comparison or a mock S3 server if a bad value slips through
    "compare": ["--targets", "memory", "--profiles", "", "--tiered", ""],
    "model": ["--checkpoint-seconds", "300"],
}


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry points of work: reaching one means a bad value was accepted."""
    import ckptio.checkpoint
    import ckptio.dist
    import ckptio.report
    import ckptio.runner
    import ckptio.simulate
    import ckptio.store

    def accepted(*args: object, **kwargs: object) -> None:
        raise Accepted

    # one parser for the whole corpus (argparse takes ~10 ms to build it; parsing keeps no state)
    monkeypatch.setattr(cli, "build_parser", lambda **_: PARSER)
    monkeypatch.setattr(ckptio.dist, "run_local", accepted)
    monkeypatch.setattr(ckptio.store, "_sleep", accepted)  # a retry: a store was used
    monkeypatch.setattr(ckptio.runner, "run_workload", accepted)
    monkeypatch.setattr(ckptio.simulate, "simulate", accepted)
    monkeypatch.setattr(ckptio.report, "build_report", accepted)
    monkeypatch.setattr(ckptio.checkpoint, "collect_garbage", accepted)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    """(exit status or what went wrong, stderr) of ``ckptio ARGV`` in this process (stdout is
    left in ``capsys``)."""
    capsys.readouterr()

    def hung(signum: int, frame: object) -> None:
        raise Hung

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        code: object = cli.main(argv)
    except SystemExit as err:
        code = err.code
    except Accepted:
        code = "accepted (the command started its work)"
    except Hung:
        code = f"still running after {CASE_SECONDS} s"
    except Exception as err:  # a traceback in the console script
        code = f"traceback: {type(err).__name__}: {str(err)[:120]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    captured = capsys.readouterr()
    sys.stdout.write(captured.out)
    return code, captured.err


def check(argv: list[str], name: str, capsys: pytest.CaptureFixture[str]) -> str | None:
    """None if ``ckptio ARGV`` refused with exit 2 and one stderr line naming ``name`` and
    saying what is expected; else what happened."""
    code, err = run_cli(argv, capsys)
    lines = err.strip().splitlines()
    if code != 2:
        return f"{argv}: exit {code!r}, stderr {err.strip()[:200]!r}"
    if "Traceback" in err or len(lines) != 1:
        return f"{argv}: {len(lines)} stderr lines: {err.strip()[:300]!r}"
    if name not in lines[0] or "expected" not in lines[0]:
        return f"{argv}: the line does not name {name} and what it expects: {lines[0]!r}"
    return None


def _bad_values(option: str, action: argparse.Action) -> list[str]:
    values = list(BAD)
    if option not in ZERO_OK:
        values += BAD_UNLESS_ZERO_OK
    if option not in INF_OK:
        values += BAD_UNLESS_INF_OK
    if option in COUNT_OPTIONS:
        values += BAD_COUNT
    if (
        (isinstance(action.default, str) and "," in action.default)  # a list: 1,4,16
        or getattr(action.type, "kind", None) == "list"
    ):
        # (empty items are skipped: "1," is valid, and so is "1,1,2")
        values = [v for v in values if v.strip() and v != "1,2"]
        values = [*(f"1,{v}" for v in values), "", ","]
    return values


PARSER = cli.build_parser()
NUMERIC = sorted({(name, action.option_strings[-1]) for name, action in _numeric_options()})


def test_the_corpus_reaches_every_subcommand() -> None:
    """The walk finds the numeric options (a guard against a walk that finds nothing)."""
    covered = {name for name, _ in NUMERIC}
    assert {"verify", "gc", "model", "compare", "report", "plan", "run", "sweep"} <= covered
    assert "simulate" in covered
    assert len(NUMERIC) >= 80


@pytest.mark.parametrize(("command", "option"), NUMERIC, ids=[" ".join(n) for n in NUMERIC])
def test_bad_numbers_are_one_line_and_exit_2(
    command: str, option: str, tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    action = next(a for n, a in _numeric_options() if n == command and option in a.option_strings)
    base = [command, *_positionals(command, tmp_path), *EXTRA.get(command, [])]
    problems = [
        p
        for v in _bad_values(option, action)
        if (p := check([*base, f"{option}={v}"], option, capsys))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command", ["compare", "report"])
def test_bad_projections(
    command: str, tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [command, *_positionals(command, tmp_path), *EXTRA.get(command, [])]
    problems = [
        p for v in PROJECT_BAD if (p := check([*base, f"--project={v}"], "--project", capsys))
    ]
    assert not problems, "\n".join(problems)


def test_bad_profile_figures(
    tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``model --set FIELD=VALUE``: refused even when no profile is used."""
    problems = [
        p
        for v in SET_BAD
        if (p := check(["model", *EXTRA["model"], "--set", v], v.split("=")[0], capsys))
    ]
    assert not problems, "\n".join(problems)


def _url_cases(tmp: Path, *, s3: bool) -> Iterator[tuple[str, str]]:
    """(URL, option it carries) for sizes and counts given in a URL's query."""
    for v in STORE_SIZE_BAD:
        yield f"file://{tmp}/root?block_size={v}", "block_size"
        yield f"pfs://{tmp}/pfs?stripe_size={v}", "stripe_size"
        yield f"emulate+memory://cli-args?part_size={v}", "part_size"
        if s3:
            yield f"s3://cli-args-bucket/x?part_size={v}", "part_size"
    for v in STORE_COUNT_BAD:
        yield f"file://{tmp}/root?streams={v}", "streams"
        if s3:
            yield f"s3://cli-args-bucket/x?streams={v}", "streams"
    for v in ("nan", "0", "-1", "inf", "1e999"):
        if s3:
            yield f"s3://cli-args-bucket/x?connect_timeout={v}", "connect_timeout"


@pytest.mark.parametrize("command", ["ls", "verify", "gc", "run", "sweep", "compare"])
def test_bad_store_options_in_urls(
    command: str,
    tmp_path: Path,
    no_work: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import importlib.util

    # opening an s3:// store must not look for a real endpoint or real credentials
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    problems = []
    for url, name in _url_cases(tmp_path, s3=importlib.util.find_spec("boto3") is not None):
        if command == "compare":
            argv = ["compare", "--targets", url, "--profiles", "", "--tiered", ""]
            argv += ["--out", str(tmp_path / "o")]
        else:
            argv = [command, url]
        if p := check(argv, name, capsys):
            problems.append(p)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_bad_store_options_given_as_options(
    command: str, tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [command, f"file://{tmp_path}/root"]
    problems = []
    for v in STORE_SIZE_BAD:
        if p := check([*base, "--option", f"block_size={v}"], "block_size", capsys):
            problems.append(p)
    for v in STORE_COUNT_BAD:
        if p := check([*base, "--option", f"streams={v}"], "streams", capsys):
            problems.append(p)
    assert not problems, "\n".join(problems)


def test_numeric_options_use_the_unit_parsers() -> None:
    """Each numeric option is read by a :mod:`ckptio.units` type (the library's parsers), so
    the command line and the library accept the same values."""
    unchecked = [
        f"{name} {a.option_strings[-1]}"
        for name, a in _numeric_options()
        if not hasattr(a.type, "kind")
    ]
    assert not unchecked


def test_the_declared_exceptions_match_the_types() -> None:
    """:data:`ZERO_OK`, :data:`INF_OK` and :data:`COUNT_OPTIONS` (which parts of the corpus
    apply) say what the types accept: a new option where 0 or inf is valid must be declared
    here, not slip out of the corpus."""
    for name, a in _numeric_options():
        option, t = a.option_strings[-1], a.type
        zero_ok = t.kind != "bandwidth" and t.minimum == 0 and not t.positive
        assert zero_ok == (option in ZERO_OK), f"ckptio {name} {option}"
        assert t.allow_inf == (option in INF_OK), f"ckptio {name} {option}"
        if t.kind != "list":
            assert (t.kind == "count") == (option in COUNT_OPTIONS), f"ckptio {name} {option}"


def test_the_console_script_agrees(tmp_path: Path) -> None:
    """The same one line and exit status from a real ``ckptio`` process, on a narrow terminal
    (an error printed through rich must not be wrapped)."""
    r = subprocess.run(
        [sys.executable, "-m", "ckptio.cli", "ls", f"file://{tmp_path}/x?block_size=1e999"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "40"},
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "block_size" in lines[0], r.stderr


def test_valid_values_keep_working(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Zero and inf where they mean something, units, and the shapes the options always took."""
    import json

    def ok(argv: list[str]) -> object:
        code, err = run_cli([*argv, "--json"], capsys)
        assert code == 0, f"{argv}: {err}"
        return json.loads(capsys.readouterr().out)

    assert ok(["plan", "--total-size", "4GiB"])["total_bytes"] == 4294967280
    assert ok(["plan", "--preset", "gpt3-175b", "--gpus", "1024"])["total_bytes"] == 2446240874496
    for argv in (
        ["model", "--checkpoint-seconds", "0", "--mtbf", "inf", "--restart", "0", "--price", "0"],
        [
            "model",
            "--size",
            "2TB",
            "--write-bandwidth",
            "inf",
            "--interval",
            "30min",
            "--streams",
            "1024",
            "--gpus",
            "1048576",
        ],
        ["model", "--checkpoint-seconds", "5min", "--async-save", "--snapshot-bandwidth", "inf"],
        ["plan", "--zero", "0", "--total-size", "4GiB", "--part-size", "1"],
        ["plan", "--preset", "llama3-1t", "--gpus", "1048576"],
        ["plan", "--scale", "1e6"],
        ["gc", f"file://{tmp_path}/root", "--older-than", "0", "--dry-run"],
        ["gc", f"file://{tmp_path}/root", "--older-than", "2h", "--dry-run"],
    ):
        ok(argv)
    # the human output formats the age as a number of seconds
    code, err = run_cli(
        ["gc", f"file://{tmp_path}/root", "--older-than", "2h", "--dry-run"], capsys
    )
    assert code == 0 and "older than 7200 s would go" in capsys.readouterr().out, err


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        -1,
        -0.5,
        "1e999",
        "1e400",
        "nan",
        "inf",
        "-1",
        "5XB",
        "",
        True,
        2**61,
        "2048PiB",
    ],
)
def test_library_sizes_refuse_with_the_field_named(value: object) -> None:
    """The library's parser (``?block_size=``, ``chunk_size=``, profile settings) refuses what
    the command line refuses: an InvalidArgumentError naming the field and the range."""
    from ckptio import errors
    from ckptio.units import parse_size

    with pytest.raises(errors.InvalidArgumentError, match=r"^chunk_size: expected a size from 0 B"):
        parse_size(value, field="chunk_size")  # type: ignore[arg-type]


def test_library_parsers_refuse_nan_overflow_and_huge_counts() -> None:
    from ckptio import errors
    from ckptio.store import option_int
    from ckptio.units import parse_bandwidth, parse_duration, parse_rate

    for parse, value in (
        (parse_duration, "nan"),
        (parse_duration, "1e999"),
        (parse_duration, "-1"),
        (parse_duration, float("nan")),
        (parse_duration, "inf"),
        (parse_bandwidth, "1e999"),
        (parse_bandwidth, "nan"),
        (parse_bandwidth, float("nan")),
        (parse_bandwidth, "0"),
        (parse_rate, "1e999"),
        (parse_rate, "nan"),
        (parse_rate, "-3"),
        (option_int, HUGE),
        (option_int, float("inf")),
        (option_int, "1.5"),
        (option_int, float("nan")),
    ):
        with pytest.raises(errors.InvalidArgumentError, match=r"^f: expected "):
            parse(value, field="f")  # type: ignore[operator]
    # and the values that mean something keep their meaning
    assert parse_duration("inf", field="f", allow_inf=True) == float("inf")
    assert parse_bandwidth("inf") == parse_rate("unlimited") == float("inf")
    assert parse_duration("1.5d") == 129600 and parse_bandwidth("100Gb/s") == 12.5e9
    assert option_int("8", field="f") == 8
