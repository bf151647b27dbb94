"""``ckptio backends``, ``ls``, ``verify``, ``gc`` and ``profiles``: what is installed, what
is stored, and the storage profiles."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ckptio import errors
from ckptio.cli.common import add_format, count_arg, duration_arg, print_json, printer
from ckptio.cli.console import Printer, Sheet, Styled, note
from ckptio.redact import redact_url
from ckptio.units import MAX_STEP, human_bytes

__all__ = ["COMMANDS"]


# -- backends ---------------------------------------------------------------------------------


def declare_backends(p: argparse.ArgumentParser) -> None:
    add_format(p)


def run_backends(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ckptio.registry import backends, load_backend

    rows: list[dict[str, Any]] = []
    for scheme, info in sorted(backends().items()):
        try:
            cls = load_backend(scheme)
            rows.append(
                {
                    "scheme": scheme,
                    "available": True,
                    "class": info.target,
                    "capabilities": asdict(cls.capabilities),
                    "problem": "",
                }
            )
        except errors.CkptioError as err:
            rows.append(
                {
                    "scheme": scheme,
                    "available": False,
                    "class": info.target,
                    "capabilities": {},
                    "problem": str(err),
                }
            )
    out = printer(args)
    if out.fmt == "json":
        out.json(rows)
        return 0
    sheet = Sheet("ckptio backends", ["scheme", "status", "capabilities / install hint"])
    for r in rows:
        if r["available"]:
            caps = ", ".join(k for k, v in r["capabilities"].items() if v) or "-"
            sheet.add(r["scheme"], Styled("ok", "green"), caps)
        else:
            sheet.add(r["scheme"], Styled("missing dependency", "red"), r["problem"])
    out.sheet(sheet)
    return 0


# -- ls ---------------------------------------------------------------------------------------


def declare_ls(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="root URL of a run (file:///..., s3://bucket/prefix, ...)")
    add_format(p)


def run_ls(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ckptio.checkpoint import list_steps
    from ckptio.registry import open_store

    with open_store(args.url) as store:
        steps = list_steps(store)
    out = printer(args)
    if out.fmt == "json":
        out.json([asdict(s) for s in steps])
        return 0
    sheet = Sheet(
        f"checkpoints under {redact_url(args.url)}",
        ["step", "state", "size", "objects", "created / problem"],
        right={"step", "size", "objects"},
    )
    for s in steps:
        sheet.add(
            str(s.step), _state(s), human_bytes(s.nbytes), str(s.objects), s.problem or s.created
        )
    if steps or out.fmt != "table":
        out.sheet(sheet)
    else:
        out.line(f"no checkpoints under {args.url}")
    return 0


_STATE_COLOURS = {"complete": "green", "damaged": "red"}


def _state(step: Any) -> Styled:
    return Styled(step.state, _STATE_COLOURS.get(step.state, "yellow"))


# -- verify -----------------------------------------------------------------------------------


def declare_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="root URL of a run")
    p.add_argument(
        "--step",
        type=count_arg(0, MAX_STEP),
        default=None,
        help="step to verify (default: the newest complete)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


VERIFY_PROGRESS_BYTES = 1 << 30
"""A verify of at least this many declared bytes shows its progress on stderr."""


def run_verify(args: argparse.Namespace) -> int:
    import time

    from ckptio.checkpoint import open_checkpoint
    from ckptio.cli.console import Progress

    t0 = time.perf_counter()
    try:
        reader = open_checkpoint(args.url, args.step)
        total = sum(c.length for t in reader.manifest.tensors.values() for c in t.chunks)
        what = f"verify step {reader.step} ({human_bytes(total)} declared)"
        with Progress(what, total, enabled=total >= VERIFY_PROGRESS_BYTES) as bar:
            problems = reader.verify(progress=bar.advance)
        step, nbytes = reader.step, reader.manifest.nbytes
    except errors.CorruptCheckpointError as err:
        problems, step, nbytes = [str(err)], args.step, 0
    seconds = time.perf_counter() - t0
    ok = not problems
    if args.json:
        print_json(
            {
                "url": redact_url(args.url),
                "step": step,
                "ok": ok,
                "bytes": nbytes,
                "seconds": seconds,
                "problems": problems,
            }
        )
    elif ok:
        Printer().line(
            Styled("OK", "green"),
            f" step {step}: {human_bytes(nbytes)} re-read, every CRC32C matches "
            f"({seconds:.2f} s, {nbytes / max(seconds, 1e-9) / 1e9:.2f} GB/s)",
        )
    else:
        note(Styled("DAMAGED", "red"), f" step {step}: {len(problems)} problem(s)")
        for p in problems:
            note(f"  - {p}")
    return 0 if ok else 1


# -- gc ---------------------------------------------------------------------------------------


def declare_gc(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="root URL of a run")
    p.add_argument(
        "--older-than",
        type=duration_arg(keep_text=False),
        default="3600",
        metavar="AGE",
        help="only remove temp files and multipart uploads older than this: seconds or 10min, "
        "2h, ... from 0 to 1e9 s (default 3600)",
    )
    p.add_argument(
        "--grace",
        type=duration_arg(keep_text=False),
        default="60",
        metavar="AGE",
        help="keep the data of checkpoints retired by retention this long after their retirement, "
        "for readers that opened them just before: seconds or 10min, ... from 0 to 1e9 s "
        "(default 60)",
    )
    p.add_argument(
        "--unfinished",
        action="store_true",
        help="also remove steps newer than the newest checkpoint that have no manifest and no "
        "live save (a save in flight is never touched, whatever the options)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="list what would be removed, remove nothing"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run_gc(args: argparse.Namespace) -> int:
    from ckptio.checkpoint import collect_garbage
    from ckptio.registry import open_store

    older_than, grace = args.older_than, args.grace
    with open_store(args.url) as store:
        incomplete_before = store.list_incomplete("step-")
        removed = collect_garbage(
            store,
            older_than=older_than,
            unfinished=args.unfinished,
            dry_run=args.dry_run,
            grace=grace,
        )
        incomplete_after = incomplete_before if args.dry_run else store.list_incomplete("step-")
    incomplete = len(incomplete_before) - len(incomplete_after)
    if args.json:
        print_json(
            {
                "url": redact_url(args.url),
                "dry_run": args.dry_run,
                "removed": removed,
                "incomplete_removed": incomplete,
                "incomplete_left": len(incomplete_after),
            }
        )
        return 0
    verb = "would remove" if args.dry_run else "removed"
    out = Printer()
    for key in removed:
        out.line(f"{verb} {key}")
    if args.dry_run:
        tail = f"{len(incomplete_before)} temp file(s)/upload(s) exist; those older than {older_than:g} s would go"
    else:
        tail = f"{incomplete} temp file(s)/upload(s); {len(incomplete_after)} younger than {older_than:g} s kept"
    out.line(f"{verb} {len(removed)} object(s) of unfinished or losing saves and {tail}")
    return 0


# -- profiles -------------------------------------------------------------------------------


def declare_profiles(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="profiles to show (default: all)")
    add_format(p)


def run_profiles(args: argparse.Namespace) -> int:
    from ckptio.cli.console import profiles_sheet
    from ckptio.profiles import available, load_profile

    profs = [load_profile(n) for n in (args.names or available())]
    out = printer(args)
    if out.fmt == "json":
        out.json([p.as_dict() for p in profs])
        return 0
    out.sheet(profiles_sheet(profs))
    out.line(
        Styled(
            "* assumption (no published figure); see `ckptio profiles --json` for every source",
            "dim",
        )
    )
    return 0


#: command -> (declare its arguments, run it)
COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {
    "backends": (declare_backends, run_backends),
    "ls": (declare_ls, run_ls),
    "verify": (declare_verify, run_verify),
    "gc": (declare_gc, run_gc),
    "profiles": (declare_profiles, run_profiles),
}
