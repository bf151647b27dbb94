"""The ``ckptio`` command.

Each subcommand is two functions: ``_add_<name>(subparsers)`` declares its arguments and
``_cmd_<name>(args) -> int`` runs it and returns the exit status. Errors that a user caused
print one clear line and exit 2; a failed verification exits 1. Nothing printed holds a
credential: URLs, messages and JSON go through :mod:`ckptio.redact` (and so does ``-v``'s log
output).

Output (:mod:`ckptio.console`): a command that prints a table takes ``--format
table|markdown|csv|json`` (``--json`` is ``--format json``). ``table`` fits a terminal and is
plain ASCII at full width when piped or redirected: no value is cut or wrapped. Progress and
warnings go to stderr: a rich bar on a terminal, plain lines (``running X ...``, ``X done in
N s``) otherwise.

Every numeric, size, bandwidth and duration option has a ``type=`` from :mod:`ckptio.units`
(the parsers the library uses), so a malformed or out-of-range value — NaN, an infinity,
``1e999``, a negative, zero where zero means nothing, ``10**30``, ``5XB`` — is refused while
parsing, before any work starts: one line naming the option and the accepted range, exit 2.
A value refused later while setting up (a store option in a URL, a layout that does not
divide) is an :class:`~ckptio.errors.InvalidArgumentError`: one line too, exit 2.

Start-up is kept short: rich and the modules behind a subcommand (runner, model, report, the
array machinery) are imported only by the command that uses them, and ``run``, ``sweep`` and
``plan`` declare their arguments only when they are the command parsed, so ``ckptio --help``
and ``ckptio backends`` do not pay for them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ckptio import errors
from ckptio.console import FORMATS, Printer, Sheet, Styled, note
from ckptio.redact import redact, redact_url
from ckptio.units import (
    MAX_COUNT,
    MAX_GPUS,
    MAX_ITERATIONS,
    MAX_LOCAL_PROCESSES,
    MAX_PRICE,
    MAX_SCALE,
    MAX_STEP,
    arg,
    bandwidth_arg,
    count_arg,
    duration_arg,
    human_bytes,
    list_arg,
    number_arg,
    parse_bandwidth,
    parse_count,
    size_arg,
)


def print_json(obj: Any) -> None:
    """``obj`` as JSON on stdout, credentials hidden (:func:`ckptio.redact.redact_obj`)."""
    Printer("json").json(obj)


def _add_format(p: argparse.ArgumentParser, *, table: bool = True) -> None:
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


def _printer(args: argparse.Namespace) -> Printer:
    fmt = getattr(args, "format", None)
    if args.json and fmt not in (None, "json"):
        raise errors.InvalidArgumentError(f"--json and --format {fmt} disagree; give one of them")
    return Printer("json" if args.json else fmt or "table")


# -- backends ---------------------------------------------------------------------------------


def _add_backends(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("backends", help="installed storage backends and their capabilities")
    _add_format(p)


def _cmd_backends(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ckptio.registry import backends, load_backend

    rows = []
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
    out = _printer(args)
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


def _add_ls(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ls", help="checkpoints under a URL: steps, complete or not, size")
    p.add_argument("url", help="root URL of a run (file:///..., s3://bucket/prefix, ...)")
    _add_format(p)


def _cmd_ls(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ckptio.checkpoint import list_steps
    from ckptio.registry import open_store

    with open_store(args.url) as store:
        steps = list_steps(store)
    out = _printer(args)
    if out.fmt == "json":
        out.json([asdict(s) for s in steps])
        return 0
    sheet = Sheet(
        f"checkpoints under {redact_url(args.url)}",
        ["step", "state", "size", "objects", "created / problem"],
        right={"step", "size", "objects"},
    )
    for s in steps:
        state = Styled("complete", "green") if s.complete else Styled("incomplete", "yellow")
        sheet.add(str(s.step), state, human_bytes(s.nbytes), str(s.objects), s.created or s.problem)
    if steps or out.fmt != "table":
        out.sheet(sheet)
    else:
        out.line(f"no checkpoints under {args.url}")
    return 0


# -- verify -----------------------------------------------------------------------------------


def _add_verify(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="re-read every byte of a checkpoint and check every CRC32C (exit 1 if damaged)",
    )
    p.add_argument("url", help="root URL of a run")
    p.add_argument(
        "--step",
        type=count_arg(0, MAX_STEP),
        default=None,
        help="step to verify (default: the newest complete)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _cmd_verify(args: argparse.Namespace) -> int:
    import time

    from ckptio.checkpoint import open_checkpoint

    t0 = time.perf_counter()
    try:
        reader = open_checkpoint(args.url, args.step)
        problems = reader.verify()
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


def _add_gc(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "gc",
        help="remove debris of interrupted saves (temp files, open uploads, data without a "
        "manifest); never touches a committed checkpoint",
    )
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


def _cmd_gc(args: argparse.Namespace) -> int:
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


# -- profiles / model (why it stalls) ---------------------------------------------------------


def _add_profiles(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("profiles", help="storage profiles and their figures, with sources")
    p.add_argument("names", nargs="*", help="profiles to show (default: all)")
    _add_format(p)


def _cmd_profiles(args: argparse.Namespace) -> int:
    from ckptio.console import profiles_sheet
    from ckptio.profiles import available, load_profile

    profs = [load_profile(n) for n in (args.names or available())]
    out = _printer(args)
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


def _add_model(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "model",
        help="checkpoint time, binding limit, idle GPU cost and optimal interval (projected)",
        description="Project one checkpoint's write/read time from a workload and storage "
        "profiles (or figures given directly), say which limit binds, and what the stall "
        "costs. Examples: `ckptio model --size 2TB --write-bandwidth 70GB/s --interval 2h`, "
        "`ckptio model --size 2TB --write-bandwidth 70GB/s,7GB/s --gpus 1024 --async-save` "
        "(one row per bandwidth), "
        "`ckptio model --checkpoint-seconds 300 --mtbf 24h --restart 10min`, "
        "`ckptio model --preset gpt3-175b --gpus 992 --profile cloud-s3,abci-lustre`. "
        "Without --gpus (or a preset) it assumes 1 GPU and says so.",
    )
    w = p.add_argument_group("workload")
    w.add_argument("--preset", help="a model preset (see `ckptio plan`)")
    w.add_argument(
        "--gpus", type=count_arg(1, MAX_GPUS), help=f"GPUs (ranks) of the job (1 to {MAX_GPUS})"
    )
    w.add_argument("--size", type=size_arg(), help="checkpoint size, e.g. 2TB (1 B to 1 EiB)")
    w.add_argument(
        "--writing-ranks", type=count_arg(1, MAX_GPUS), help="ranks that write (default: all GPUs)"
    )
    w.add_argument(
        "--ranks-per-node",
        type=count_arg(1, MAX_LOCAL_PROCESSES),
        default=8,
        help="GPUs per node (default 8)",
    )
    w.add_argument(
        "--objects-per-rank",
        type=count_arg(1, MAX_COUNT),
        default=1,
        help="objects each rank writes",
    )
    w.add_argument(
        "--key-layout",
        choices=("flat", "hashed"),
        default="flat",
        help="hashed spreads keys over 256 prefixes (per-prefix request limits)",
    )
    w.add_argument(
        "--from",
        dest="from_results",
        nargs="+",
        metavar="RESULTS",
        help="fit a profile from measured result files/dirs and project it",
    )
    s = p.add_argument_group("storage")
    s.add_argument(
        "--profile",
        action="append",
        help="profile name(s), comma-separated or repeated (default with a workload: all)",
    )
    s.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="override a profile figure, e.g. stream_bandwidth=100MB/s",
    )
    s.add_argument(
        "--streams",
        type=count_arg(1, MAX_LOCAL_PROCESSES),
        help=f"streams per node, 1 to {MAX_LOCAL_PROCESSES} (default: the profile's)",
    )
    s.add_argument(
        "--part-size", type=size_arg(), help="bytes per request (default: the profile's)"
    )
    s.add_argument(
        "--write-bandwidth",
        type=list_arg(parse_bandwidth),
        help="measured/assumed bandwidth with --size, e.g. 70GB/s; several, "
        "comma-separated (70GB/s,7GB/s), give one row each",
    )
    s.add_argument(
        "--checkpoint-seconds", type=duration_arg(), help="stall per checkpoint, e.g. 300 or 5min"
    )
    c = p.add_argument_group("cost and interval")
    c.add_argument(
        "--interval",
        type=duration_arg(positive=True),
        default="2h",
        help="time between checkpoints (default 2h)",
    )
    c.add_argument(
        "--mtbf",
        type=duration_arg(positive=True, allow_inf=True),
        help="mean time between failures of the job, e.g. 24h (inf: none)",
    )
    c.add_argument(
        "--restart",
        type=duration_arg(),
        help="restart time after a failure, e.g. 10min (default: --restart-overhead "
        "+ the restore time, read back from the storage)",
    )
    c.add_argument(
        "--restart-overhead",
        type=duration_arg(),
        default="5min",
        help="restart time besides the restore: reschedule, start, warm up (assumption: 5min)",
    )
    s.add_argument(
        "--local",
        metavar="PROFILE",
        type=_profile_arg,
        help="a fast tier (e.g. local-nvme): each profile also gets a tiered target "
        "that saves there and drains to it (ckptio.tiered)",
    )
    s.add_argument(
        "--persist-every",
        type=count_arg(1, MAX_COUNT),
        default=1,
        help="with --local: every N-th checkpoint is drained (default 1)",
    )
    s.add_argument(
        "--p-lose-node",
        type=number_arg(maximum=1.0),
        default=0.78,
        help="with --local: probability that a failure loses a node's fast tier "
        "(assumption 0.78: Llama 3's share of hardware interruptions)",
    )
    s.add_argument(
        "--read-bandwidth",
        type=bandwidth_arg(),
        help="read bandwidth for the restore with --size and figures given directly, e.g. 50GB/s",
    )
    c.add_argument(
        "--price", type=number_arg(maximum=MAX_PRICE), default=0.0, help="price per GPU-hour"
    )
    c.add_argument(
        "--async-save",
        action="store_true",
        help="asynchronous save: the stall is the snapshot (device->host copy of "
        "each GPU's share: --size over --writing-ranks, default all --gpus); works "
        "with figures given directly and with profiles",
    )
    c.add_argument(
        "--snapshot-bandwidth",
        type=bandwidth_arg(),
        default="25GB/s",
        help="device->host copy per GPU for --async-save (assumption: 25GB/s)",
    )
    _add_format(p)


def _cmd_model(args: argparse.Namespace) -> int:
    from ckptio.console import print_model
    from ckptio.model import run_model_cli

    out = _printer(args)
    result = run_model_cli(args)
    if out.fmt == "json":
        out.json(result)
    else:
        print_model(result, out)
    return 0


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="merge result files (any machines/sites) into index.html + report.md + plots",
    )
    p.add_argument(
        "results",
        nargs="+",
        help="result files or directories (from run/sweep/compare, on any machine)",
    )
    p.add_argument(
        "--out", default="ckptio-report", help="output directory (default ckptio-report/)"
    )
    _add_projection_arguments(p)
    _add_format(p)


def _add_projection_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("full-scale projection (model)")
    g.add_argument(
        "--project",
        action="append",
        metavar="PRESET[:GPUS]",
        type=arg(parse_projection, "projection"),
        help="workload to project each target to (default gpt3-175b); repeatable",
    )
    g.add_argument(
        "--interval",
        type=duration_arg(positive=True),
        default="2h",
        help="checkpoint interval (default 2h)",
    )
    g.add_argument(
        "--price",
        type=number_arg(maximum=MAX_PRICE),
        help="price per GPU-hour (default 2.0, an assumption)",
    )
    g.add_argument(
        "--restart",
        type=duration_arg(),
        help="restart time after a failure (default: a 5min overhead, an assumption, plus "
        "each target's projected restore)",
    )


def _profile_arg(text: str) -> str:
    """argparse type: the name of a storage profile (or a path to a .toml file)."""
    from ckptio.profiles import available

    if text in available() or (text.endswith(".toml") and os.path.isfile(text)):
        return text
    raise argparse.ArgumentTypeError(
        f"expected a storage profile ({', '.join(available())}) or a path to a .toml file, "
        f"got {text!r}"
    )


def parse_projection(text: str, *, field: str = "--project") -> tuple[str, int | None]:
    """``PRESET[:GPUS]`` -> (preset, GPUs or None): a preset of :mod:`ckptio.workload` and a
    GPU count its layout (TPxPP) divides."""
    from ckptio.workload import get_preset, preset_names

    name, colon, gpus_text = text.strip().partition(":")
    presets = [n for n in preset_names() if n != "custom"]
    expected = (
        f"PRESET[:GPUS] with PRESET one of {', '.join(presets)} and GPUS an integer "
        f"from 1 to {MAX_GPUS}"
    )
    prefix = f"{field}: " if field else ""
    if name not in presets:
        raise errors.InvalidArgumentError(f"{prefix}expected {expected}, got {text!r}")
    gpus = None
    if colon:
        try:
            gpus = parse_count(gpus_text, field="", minimum=1, maximum=MAX_GPUS)
        except errors.InvalidArgumentError:
            raise errors.InvalidArgumentError(
                f"{prefix}expected {expected}, got {text!r}"
            ) from None
    layout = get_preset(name).layout
    if gpus is not None and gpus % (layout.tp * layout.pp):
        raise errors.InvalidArgumentError(
            f"{prefix}expected GPUS a multiple of {name}'s TPxPP = {layout.tp * layout.pp}, "
            f"got {text!r}"
        )
    return name, gpus


def _projection_options(args: argparse.Namespace) -> dict[str, Any]:
    from ckptio.report import DEFAULT_PRICE_PER_GPU_HOUR
    from ckptio.units import parse_duration

    presets = list(args.project or [])  # (preset, GPUs) pairs, checked by parse_projection
    return {
        "presets": presets or None,
        "interval": parse_duration(args.interval, field="--interval", positive=True),
        "price": DEFAULT_PRICE_PER_GPU_HOUR if args.price is None else args.price,
        "restart": None
        if args.restart is None
        else parse_duration(args.restart, field="--restart"),
    }


def _cmd_report(args: argparse.Namespace) -> int:
    from ckptio.console import comparison_sheet, projection_sheet, warn
    from ckptio.report import build_report

    out = _printer(args)
    result = build_report(args.results, args.out, **_projection_options(args))
    if out.fmt == "json":
        out.json(result)
        return 0
    out.sheet(comparison_sheet(result["summary"], "merged results"))
    out.sheet(projection_sheet(result["projections"]))
    out.line(f"report: {args.out}/index.html ({len(result['files'])} files)")
    if result["plots_missing"]:
        warn(f"no plots: {result['plots_missing']}")
    return 0


def _add_compare(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compare",
        help="the main job: run a small scaled checkpoint against local disk, mock S3 and "
        "emulated cloud/HPC storage; print why each stalls; write a report",
    )
    p.add_argument(
        "--targets",
        help="comma-separated: local, mock-s3, rgw (a Ceph RADOS "
        "Gateway started on loopback: measured, a real S3 implementation), memory, "
        "or URLs (default: local,mock-s3, and rgw where radosgw, ceph-mon and "
        "ceph-osd are installed)",
    )
    p.add_argument(
        "--profiles",
        help="storage profiles to emulate over memory:// "
        "(default: cloud-s3,abci-lustre; '' for none; see `ckptio profiles`)",
    )
    p.add_argument(
        "--tiered",
        help="tiered targets DURABLE+LOCAL, comma-separated: a durable profile drained from a "
        "fast tier, 'disk' (this machine's, measured) or a profile (emulated) "
        "(default: cloud-s3+local-nvme; '' for none)",
    )
    p.add_argument("--preset", default="llama3-8b", help="model preset (default llama3-8b)")
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--total-size",
        type=size_arg(),
        default=None,
        help="scale the preset to about this size (default 256MiB)",
    )
    size.add_argument(
        "--scale",
        type=number_arg(maximum=MAX_SCALE, positive=True),
        help=f"scale factor instead of --total-size (above 0, at most {MAX_SCALE:,.0f})",
    )
    p.add_argument(
        "--object-size",
        type=size_arg(),
        default="16MiB",
        help="largest shard object (default 16MiB)",
    )
    p.add_argument(
        "--iterations",
        type=count_arg(1, MAX_ITERATIONS),
        default=1,
        help=f"checkpoints to write per target, 1 to {MAX_ITERATIONS} (default 1)",
    )
    p.add_argument(
        "--site", help="label of this machine/site in merged reports (default: hostname)"
    )
    p.add_argument(
        "--out",
        default="ckptio-report",
        help="report directory (default ckptio-report/); results go to OUT/results/",
    )
    _add_projection_arguments(p)
    _add_format(p)


def _cmd_compare(args: argparse.Namespace) -> int:
    from ckptio.compare import DEFAULT_TOTAL_SIZE, compare
    from ckptio.console import comparison_sheet, projection_sheet

    def names(text: str | None) -> list[str] | None:
        return None if text is None else [n.strip() for n in text.split(",") if n.strip()]

    out = _printer(args)
    result = compare(
        targets=names(args.targets),
        profiles=names(args.profiles),
        tiered=names(args.tiered),
        preset=args.preset,
        total_size=args.total_size or (None if args.scale else DEFAULT_TOTAL_SIZE),
        scale=args.scale,
        object_size=args.object_size,
        iterations=args.iterations,
        out=args.out,
        site=args.site,
        **_projection_options(args),
        say=note,
    )
    if out.fmt == "json":
        out.json(result)
        return 0
    out.sheet(comparison_sheet(result["summary"], "ckptio compare (this machine, small scale)"))
    out.sheet(projection_sheet(result["projections"]))
    out.line(f"report: {args.out}/index.html, results: {result['results_dir']}")
    return 0


# -- plan / run / sweep (the comparison workload) ---------------------------------------------


def _add_plan(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser(
        "plan",
        help="checkpoint size, ranks, bytes/objects/requests per rank of a "
        "model preset and parallel layout",
        declare=_declare_plan,
    )


def _declare_plan(p: argparse.ArgumentParser) -> None:
    from ckptio.workload import add_workload_arguments

    add_workload_arguments(p)
    p.add_argument(
        "--part-size", type=size_arg(), help="request size to count requests at (default 8MiB)"
    )
    _add_format(p)


def _cmd_plan(args: argparse.Namespace) -> int:
    from ckptio.console import print_plan
    from ckptio.units import parse_size
    from ckptio.workload import DEFAULT_PART_SIZE, plan_from_args

    out = _printer(args)
    plan = plan_from_args(args)
    part = parse_size(args.part_size, field="--part-size") if args.part_size else DEFAULT_PART_SIZE
    summary = plan.summary(part)
    if out.fmt == "json":
        out.json(summary)
    else:
        print_plan(summary, out)
    return 0


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser(
        "run",
        help="write and read back a synthetic sharded checkpoint of a "
        "preset on a target, on N ranks; Parquet results",
        declare=_declare_run,
    )


def _declare_run(p: argparse.ArgumentParser, *, sweep_mode: bool = False) -> None:
    from ckptio.runner import add_run_arguments

    add_run_arguments(p, sweep_mode=sweep_mode)
    _add_format(p)


def _cmd_run(args: argparse.Namespace, *, sweep_mode: bool = False) -> int:
    from ckptio.console import Progress, print_run, warn
    from ckptio.runner import execute_run, prepare_run

    out = _printer(args)
    job = prepare_run(args, sweep_mode=sweep_mode)
    if job.is_root:
        for line in job.warnings:
            warn(line)
    what = (
        f"{job.mode} {job.plan.preset.name} ({job.plan.total_bytes / 2**20:,.1f} MiB) on "
        f"{redact_url(job.target)}, {job.ranks} rank(s)"
    )
    with Progress(
        what, job.progress_bytes, enabled=job.is_root, short=f"{job.mode} {job.plan.preset.name}"
    ) as bar:
        summary = execute_run(job, progress=bar.advance, say=bar.say)
    if not job.is_root:
        return 0
    if out.fmt == "json":
        out.json(
            {
                "run_id": summary.run_id,
                "runs": summary.runs,
                "paths": [str(p) for p in summary.paths],
                "peak_rss_bytes": summary.peak_rss_bytes,
                "cache": summary.cache,
                "generator": summary.generator,
                "sweep_points": [{**vars(p), "capped": p.capped} for p in job.points],
            }
        )
    else:
        print_run(summary, out)
    return 0


def _add_sweep(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser(
        "sweep",
        help="throughput versus concurrency: the workload at each --streams x --part-size",
        declare=lambda p: _declare_run(p, sweep_mode=True),
    )


def _cmd_sweep(args: argparse.Namespace) -> int:
    return _cmd_run(args, sweep_mode=True)


# -- main -------------------------------------------------------------------------------------

COMMANDS: dict[str, tuple[Callable[..., None], Callable[[argparse.Namespace], int]]] = {
    "backends": (_add_backends, _cmd_backends),
    "ls": (_add_ls, _cmd_ls),
    "verify": (_add_verify, _cmd_verify),
    "profiles": (_add_profiles, _cmd_profiles),
    "model": (_add_model, _cmd_model),
    "compare": (_add_compare, _cmd_compare),
    "report": (_add_report, _cmd_report),
    "gc": (_add_gc, _cmd_gc),
    "plan": (_add_plan, _cmd_plan),
    "run": (_add_run, _cmd_run),
    "sweep": (_add_sweep, _cmd_sweep),
}


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
    ``lazy``: those of ``run``, ``sweep`` and ``plan`` are declared only when that subcommand
    parses or prints its help (what :func:`main` uses: ``ckptio --help`` imports no runner)."""
    parser = ArgumentParser(
        prog="ckptio",
        description="Checkpoint I/O for AI training: save/load on any storage, compare targets, "
        "explain stalls.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add, _ in COMMANDS.values():
        add(sub)
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
    _, run = COMMANDS[args.command]
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


if __name__ == "__main__":
    sys.exit(main())
