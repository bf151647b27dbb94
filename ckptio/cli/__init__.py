"""The ``ckptio`` command.

The command line is the top layer of ckptio, and the only place for argparse and rich. Each
subcommand is two functions in the module of its group (:mod:`ckptio.cli.store`: ``backends``,
``ls``, ``verify``, ``gc``, ``profiles``; :mod:`ckptio.cli.model`: ``model``, ``report``,
``compare``; :mod:`ckptio.cli.run`: ``plan``, ``run``, ``sweep``; :mod:`ckptio.cli.simulate`:
``simulate``): ``declare_<name>(parser)``
declares its arguments and ``run_<name>(args) -> int`` runs it and returns the exit status; the
group's ``COMMANDS`` maps names to both. A new command goes in the module of its group, with its
one-line help in :data:`HELP` here. Errors that a user caused
print one clear line and exit 2; a failed verification exits 1. Nothing printed holds a
credential: URLs, messages and JSON go through :mod:`ckptio.redact` (and so does ``-v``'s log
output).

Output (:mod:`ckptio.cli.console`): a command that prints a table takes ``--format
table|markdown|csv|json`` (``--json`` is ``--format json``). ``table`` fits a terminal and is
plain ASCII at full width when piped or redirected: no value is cut or wrapped. Progress and
warnings go to stderr: a rich bar on a terminal, plain lines (``running X ...``, ``X done in
N s``) otherwise.

Every numeric, size, bandwidth and duration option has a ``type=`` from :mod:`ckptio.cli.common`
(the parsers of :mod:`ckptio.units`, which the library uses), so a malformed or out-of-range value — NaN, an infinity,
``1e999``, a negative, zero where zero means nothing, ``10**30``, ``5XB`` — is refused while
parsing, before any work starts: one line naming the option and the accepted range, exit 2.
A value refused later while setting up (a store option in a URL, a layout that does not
divide) is an :class:`~ckptio.errors.InvalidArgumentError`: one line too, exit 2.

Start-up is kept short: rich and the modules behind a subcommand (runner, model, report, the
array machinery) are imported only by the command that uses them, and a subcommand's module
is imported, and its arguments declared, only when it is the command parsed (or its help is
printed), so ``ckptio --help`` and ``ckptio backends`` do not pay for the others.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NoReturn

from ckptio import errors
from ckptio.cli.console import Styled, note
from ckptio.redact import redact

__all__ = ["HELP", "ArgumentParser", "build_parser", "main"]

#: command -> its one-line help, in the order ``ckptio --help`` lists them
HELP: dict[str, str] = {
    "backends": "installed storage backends and their capabilities",
    "ls": "checkpoints under a URL: steps, complete or not, size",
    "verify": "re-read every byte of a checkpoint and check every CRC32C (exit 1 if damaged)",
    "profiles": "storage profiles and their figures, with sources",
    "model": "checkpoint time, binding limit, idle GPU cost and optimal interval (projected)",
    "compare": "the main job: run a small scaled checkpoint against local disk, mock S3 and "
    "emulated cloud/HPC storage; print why each stalls; write a report",
    "report": "merge result files (any machines/sites) into index.html + report.md + plots",
    "gc": "remove debris of interrupted saves (temp files, open uploads, data without a "
    "manifest); never touches a committed checkpoint",
    "plan": "checkpoint size, ranks, bytes/objects/requests per rank of a "
    "model preset and parallel layout",
    "run": "write and read back a synthetic sharded checkpoint of a "
    "preset on a target, on N ranks; Parquet results",
    "sweep": "throughput versus concurrency: the workload at each --streams x --part-size",
    "simulate": "replay every request of a full-scale checkpoint in virtual time (tails, "
    "throttling, stragglers) beside the model (simulated)",
}


def _group(command: str) -> ModuleType:
    """The module of ``command``'s group, imported on first use."""
    if command in ("plan", "run", "sweep"):
        from ckptio.cli import run

        return run
    if command in ("model", "report", "compare"):
        from ckptio.cli import model

        return model
    if command == "simulate":
        from ckptio.cli import simulate

        return simulate
    from ckptio.cli import store

    return store


def _declare(command: str) -> Callable[[argparse.ArgumentParser], None]:
    def declare(p: argparse.ArgumentParser) -> None:
        _group(command).COMMANDS[command][0](p)

    return declare


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with one-line usage errors: ``ckptio run: error: argument --ranks:
    expected an integer from 1 to 1024, got '-3' (see ckptio run --help)``, exit status 2.
    Subcommand parsers are of this class too (argparse makes them of the parent's class).

    Its arguments may be declared on first use: ``declare(parser)`` runs when the parser
    parses or prints its help or usage, so a subcommand whose arguments come from a module
    that is slow to import (runner, workload) costs nothing unless it is the command given."""

    def __init__(
        self,
        *args: Any,
        declare: Callable[[argparse.ArgumentParser], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._declare = declare

    def declared(self) -> ArgumentParser:
        """This parser with every argument declared."""
        declare, self._declare = self._declare, None
        if declare is not None:
            declare(self)
        return self

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        return super(ArgumentParser, self.declared()).parse_known_args(*args, **kwargs)

    def format_help(self) -> str:
        return super(ArgumentParser, self.declared()).format_help()

    def format_usage(self) -> str:
        return super(ArgumentParser, self.declared()).format_usage()

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {line} (see {self.prog} --help)\n")


def build_parser(*, lazy: bool = False) -> argparse.ArgumentParser:
    """The ``ckptio`` parser with every subcommand's arguments, as a caller walking it expects;
    ``lazy``: a subcommand's arguments are declared only when it parses or prints its help
    (what :func:`main` uses: ``ckptio --help`` imports no subcommand module)."""
    parser = ArgumentParser(
        prog="ckptio",
        description="Checkpoint I/O for AI training: save/load on any storage, compare targets, "
        "explain stalls.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command, text in HELP.items():
        sub.add_parser(command, help=text, declare=_declare(command))
    if not lazy:
        for p in sub.choices.values():
            if isinstance(p, ArgumentParser):
                p.declared()
    return parser


def _redact_record(record: Any) -> bool:
    """A logging filter: the record's message with credentials hidden (libraries' log lines
    included, as far as they reach this process's handlers)."""
    record.msg, record.args = redact(record.getMessage()), None
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(lazy=True)
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help (0) or a usage error (2, one line already printed)
        return done.code if isinstance(done.code, int) else 2
    import logging

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(_redact_record)
    if args.command is None:
        parser.print_help()
        return 2
    _, run = _group(args.command).COMMANDS[args.command]
    try:
        return run(args)
    except errors.CkptioError as err:
        # not wrapped at the terminal's width: an argument refused while setting up (a store
        # option in the URL, a layout that does not divide) stays one line
        note(Styled("error:", "red"), f" {err}")  # note() hides credentials
        return 2
    except KeyboardInterrupt:
        note("interrupted")
        return 130
