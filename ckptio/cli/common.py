"""What every ``ckptio`` subcommand shares: argparse ``type=`` functions built on the parsers
of :mod:`ckptio.units`, the ``--format``/``--json`` options and the printer they choose.

:func:`arg` turns a parser into an argparse ``type=`` function that raises
:class:`argparse.ArgumentTypeError` with the parser's one line, so ``ckptio`` refuses a bad value
while parsing, before any work starts, with exit status 2. The functions it returns carry
``kind``, ``minimum``, ``positive`` and ``allow_inf`` attributes (tests/test_cli_args.py reads
them).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ckptio import errors
from ckptio.cli.console import FORMATS, Printer
from ckptio.units import (
    MAX_BYTES,
    MAX_LOCAL_PROCESSES,
    parse_bandwidth,
    parse_count,
    parse_duration,
    parse_list,
    parse_number,
    parse_rate,
    parse_size,
)

__all__ = [
    "add_client_options",
    "add_format",
    "add_p_lose_node",
    "arg",
    "bandwidth_arg",
    "count_arg",
    "duration_arg",
    "list_arg",
    "number_arg",
    "print_json",
    "printer",
    "size_arg",
]


def arg(
    parse: Callable[..., Any], kind: str, *, keep_text: bool = False, **kwargs: Any
) -> Callable[[str], Any]:
    """An argparse ``type=`` function: ``parse(text, field="", **kwargs)``, its
    :class:`~ckptio.errors.InvalidArgumentError` turned into :class:`argparse.ArgumentTypeError`
    (argparse prefixes the option's name, so the message is one line naming it). With
    ``keep_text`` the checked text is returned, for code that reads it again with the same
    parser (and shows it as typed, ``2TB``)."""

    def convert(text: str) -> Any:
        try:
            value = parse(text, field="", **kwargs)
        except errors.InvalidArgumentError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text if keep_text else value

    convert.__name__ = kind  # argparse names the type in some messages
    convert.kind = kind  # type: ignore[attr-defined]
    convert.minimum = kwargs.get("minimum", 0)  # type: ignore[attr-defined]
    convert.positive = kwargs.get("positive", False)  # type: ignore[attr-defined]
    convert.allow_inf = kind in ("bandwidth", "rate") or kwargs.get("allow_inf", False)  # type: ignore[attr-defined]
    return convert


def count_arg(minimum: int, maximum: int) -> Callable[[str], int]:
    """argparse type: an integer in ``minimum`` .. ``maximum``."""
    return arg(parse_count, "count", minimum=minimum, maximum=maximum)


def size_arg(minimum: int = 1, maximum: int = MAX_BYTES) -> Callable[[str], str]:
    """argparse type: a size (``8MiB``), at least 1 byte by default; the text is kept."""
    return arg(parse_size, "size", keep_text=True, minimum=minimum, maximum=maximum)


def duration_arg(
    *, positive: bool = False, allow_inf: bool = False, keep_text: bool = True
) -> Callable[[str], Any]:
    """argparse type: a duration (``10min``); the text is kept, or seconds without
    ``keep_text``."""
    return arg(
        parse_duration, "duration", keep_text=keep_text, positive=positive, allow_inf=allow_inf
    )


def bandwidth_arg() -> Callable[[str], str]:
    """argparse type: a bandwidth (``70GB/s``, ``inf``); the text is kept."""
    return arg(parse_bandwidth, "bandwidth", keep_text=True)


def number_arg(*, maximum: float, positive: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number from 0 (above 0 with ``positive``) to ``maximum``."""
    return arg(parse_number, "number", maximum=maximum, positive=positive)


def list_arg(parse: Callable[..., Any], **kwargs: Any) -> Callable[[str], str]:
    """argparse type: a comma-separated list (``1,4,16``, ``70GB/s,7GB/s``), each part through
    ``parse``; the text is kept. Its ``positive``/``allow_inf`` attributes are those of the
    parts (a bandwidth or rate is above 0, or inf)."""
    convert = arg(
        lambda text, field, **kw: parse_list(text, parse, field=field, **kw),
        "list",
        keep_text=True,
        **kwargs,
    )
    if parse in (parse_bandwidth, parse_rate):
        convert.positive = convert.allow_inf = True  # type: ignore[attr-defined]
    return convert


def add_format(p: argparse.ArgumentParser, *, table: bool = True) -> None:
    """``--json`` and, for a command that prints a table, ``--format`` (``--json`` is the same
    as ``--format json``)."""
    if table:
        p.add_argument(
            "--format",
            choices=FORMATS,
            default=None,
            help="output: table (default; plain full-width text when not on a "
            "terminal), markdown, csv, or json (the same as --json)",
        )
    p.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output" + (" (--format json)" if table else ""),
    )


def printer(args: argparse.Namespace) -> Printer:
    fmt = getattr(args, "format", None)
    if args.json and fmt not in (None, "json"):
        raise errors.InvalidArgumentError(f"--json and --format {fmt} disagree; give one of them")
    return Printer("json" if args.json else fmt or "table")


def print_json(obj: Any) -> None:
    """``obj`` as JSON on stdout, credentials hidden (:func:`ckptio.redact.redact_obj`)."""
    Printer("json").json(obj)


# -- options that ``ckptio model`` and ``ckptio simulate`` share ------------------------------


def add_client_options(
    group: Any, *, from_help: str, set_example: str, streams_help: str | None = None
) -> None:
    """``--ranks-per-node``, ``--key-layout``, ``--from RESULTS``, ``--set FIELD=VALUE``,
    ``--streams`` and ``--part-size``: the job's client and what a projection reads its
    storage from (``from_help``: what ``--from`` does with the results; ``set_example``: a
    ``FIELD=VALUE`` for the help)."""
    group.add_argument(
        "--ranks-per-node",
        type=count_arg(1, MAX_LOCAL_PROCESSES),
        default=8,
        help="GPUs per node (default 8)",
    )
    group.add_argument(
        "--key-layout",
        choices=("flat", "hashed"),
        default="flat",
        help="hashed spreads keys over 256 prefixes (per-prefix request limits)",
    )
    group.add_argument("--from", dest="from_results", nargs="+", metavar="RESULTS", help=from_help)
    group.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help=f"override a profile figure, e.g. {set_example}",
    )
    group.add_argument(
        "--streams",
        type=count_arg(1, MAX_LOCAL_PROCESSES),
        help=streams_help
        or f"concurrent data requests per node, 1 to {MAX_LOCAL_PROCESSES} (default: the "
        "profile's)",
    )
    group.add_argument(
        "--part-size", type=size_arg(), help="bytes per request (default: the profile's)"
    )


def add_p_lose_node(group: Any, *, what: str) -> None:
    """``--p-lose-node``, defaulting to :data:`ckptio.costmodel.DEFAULT_P_LOSE_NODE` (``what``:
    how the command uses it)."""
    from ckptio.costmodel import DEFAULT_P_LOSE_NODE

    group.add_argument(
        "--p-lose-node",
        type=number_arg(maximum=1.0),
        default=DEFAULT_P_LOSE_NODE,
        help=f"{what}: probability that a failure loses a node's fast tier "
        f"(assumption {DEFAULT_P_LOSE_NODE}: Llama 3's share of hardware interruptions)",
    )
