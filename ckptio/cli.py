"""The ``ckptio`` command.

Each subcommand is two functions: ``_add_<name>(subparsers)`` declares its arguments and
``_cmd_<name>(args) -> int`` runs it and returns the exit status. Output is a table for
people (rich) and JSON with ``--json``. Errors that a user caused print one clear line and
exit 2; a failed verification exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ckptio import errors

console = Console()
err_console = Console(stderr=True)


def human_bytes(n: float) -> str:
    """Binary units for sizes a person reads (``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


# -- backends ---------------------------------------------------------------------------------


def _add_backends(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("backends", help="installed storage backends and their capabilities")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _cmd_backends(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ckptio.registry import backends, load_backend

    rows = []
    for scheme, info in sorted(backends().items()):
        try:
            cls = load_backend(scheme)
            rows.append({"scheme": scheme, "available": True, "class": info.target,
                         "capabilities": asdict(cls.capabilities), "problem": ""})
        except errors.CkptioError as err:
            rows.append({"scheme": scheme, "available": False, "class": info.target,
                         "capabilities": {}, "problem": str(err)})
    if args.json:
        print_json(rows)
        return 0
    table = Table(title="ckptio backends")
    table.add_column("scheme")
    table.add_column("status")
    table.add_column("capabilities / install hint")
    for r in rows:
        if r["available"]:
            caps = ", ".join(k for k, v in r["capabilities"].items() if v) or "-"
            table.add_row(r["scheme"], "[green]ok[/]", caps)
        else:
            table.add_row(r["scheme"], "[red]missing dependency[/]", r["problem"])
    console.print(table)
    return 0


# -- ls ---------------------------------------------------------------------------------------


def _add_ls(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ls", help="checkpoints under a URL: steps, complete or not, size")
    p.add_argument("url", help="root URL of a run (file:///..., s3://bucket/prefix, ...)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _cmd_ls(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ckptio.checkpoint import list_steps
    from ckptio.registry import open_store

    with open_store(args.url) as store:
        steps = list_steps(store)
    if args.json:
        print_json([asdict(s) for s in steps])
        return 0
    if not steps:
        console.print(f"no checkpoints under {args.url}")
        return 0
    table = Table(title=f"checkpoints under {args.url}")
    for col in ("step", "state", "size", "objects", "created / problem"):
        table.add_column(col, justify="right" if col in ("step", "size", "objects") else "left")
    for s in steps:
        state = "[green]complete[/]" if s.complete else "[yellow]incomplete[/]"
        table.add_row(str(s.step), state, human_bytes(s.nbytes), str(s.objects), s.created or s.problem)
    console.print(table)
    return 0


# -- verify -----------------------------------------------------------------------------------


def _add_verify(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify", help="re-read every byte of a checkpoint and check every CRC32C (exit 1 if damaged)"
    )
    p.add_argument("url", help="root URL of a run")
    p.add_argument("--step", type=int, default=None, help="step to verify (default: the newest complete)")
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
        print_json({"url": args.url, "step": step, "ok": ok, "bytes": nbytes,
                    "seconds": seconds, "problems": problems})
    elif ok:
        console.print(
            f"[green]OK[/] step {step}: {human_bytes(nbytes)} re-read, every CRC32C matches "
            f"({seconds:.2f} s, {nbytes / max(seconds, 1e-9) / 1e9:.2f} GB/s)"
        )
    else:
        err_console.print(f"[red]DAMAGED[/] step {step}: {len(problems)} problem(s)")
        for p in problems:
            err_console.print(f"  - {escape(p)}", highlight=False)
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
        default="3600",
        metavar="SECONDS",
        help="only remove temp files and multipart uploads older than this (default 3600)",
    )
    p.add_argument(
        "--grace",
        default="60",
        metavar="SECONDS",
        help="keep the data of checkpoints retired by retention this long after their retirement, "
        "for readers that opened them just before (default 60)",
    )
    p.add_argument(
        "--unfinished",
        action="store_true",
        help="also remove steps newer than the newest checkpoint that have no manifest and no "
        "live save (a save in flight is never touched, whatever the options)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _cmd_gc(args: argparse.Namespace) -> int:
    from ckptio.checkpoint import collect_garbage
    from ckptio.registry import open_store

    try:
        older_than = float(args.older_than)
    except ValueError:
        raise errors.InvalidArgumentError(f"--older-than: expected seconds, got {args.older_than!r}") from None
    if older_than < 0:
        raise errors.InvalidArgumentError(f"--older-than: must be >= 0 seconds, got {older_than}")
    try:
        grace = float(args.grace)
    except ValueError:
        raise errors.InvalidArgumentError(f"--grace: expected seconds, got {args.grace!r}") from None
    if not 0 <= grace < float("inf"):
        raise errors.InvalidArgumentError(f"--grace: expected seconds >= 0, got {args.grace!r}")
    with open_store(args.url) as store:
        incomplete_before = store.list_incomplete("step-")
        removed = collect_garbage(store, older_than=older_than, unfinished=args.unfinished,
                                  dry_run=args.dry_run, grace=grace)
        incomplete_after = incomplete_before if args.dry_run else store.list_incomplete("step-")
    incomplete = len(incomplete_before) - len(incomplete_after)
    if args.json:
        print_json({"url": args.url, "dry_run": args.dry_run, "removed": removed,
                    "incomplete_removed": incomplete, "incomplete_left": len(incomplete_after)})
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for key in removed:
        console.print(f"{verb} {key}", highlight=False)
    if args.dry_run:
        tail = f"{len(incomplete_before)} temp file(s)/upload(s) exist; those older than {older_than:g} s would go"
    else:
        tail = f"{incomplete} temp file(s)/upload(s); {len(incomplete_after)} younger than {older_than:g} s kept"
    console.print(f"{verb} {len(removed)} object(s) of unfinished or losing saves and {tail}", highlight=False)
    return 0


# -- profiles / model (why it stalls) ---------------------------------------------------------


def _add_profiles(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("profiles", help="storage profiles and their figures, with sources")
    p.add_argument("names", nargs="*", help="profiles to show (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _cmd_profiles(args: argparse.Namespace) -> int:
    from ckptio.profiles import available, load_profile
    from ckptio.report import profiles_table

    profs = [load_profile(n) for n in (args.names or available())]
    if args.json:
        print_json([p.as_dict() for p in profs])
        return 0
    console.print(profiles_table(profs))
    console.print("[dim]* assumption (no published figure); see `ckptio profiles --json` for "
                  "every source[/]")
    return 0


def _add_model(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "model",
        help="checkpoint time, binding limit, idle GPU cost and optimal interval (projected)",
        description="Project one checkpoint's write/read time from a workload and storage "
        "profiles (or figures given directly), say which limit binds, and what the stall "
        "costs. Examples: `ckptio model --size 2TB --write-bandwidth 70GB/s --interval 2h`, "
        "`ckptio model --checkpoint-seconds 300 --mtbf 24h --restart 10min`, "
        "`ckptio model --preset gpt3-175b --gpus 992 --profile cloud-s3,abci-lustre`.",
    )
    w = p.add_argument_group("workload")
    w.add_argument("--preset", help="a model preset (see `ckptio plan`)")
    w.add_argument("--gpus", type=int, help="GPUs (ranks) of the job")
    w.add_argument("--size", help="checkpoint size, e.g. 2TB")
    w.add_argument("--writing-ranks", type=int, help="ranks that write (default: all GPUs)")
    w.add_argument("--ranks-per-node", type=int, default=8, help="GPUs per node (default 8)")
    w.add_argument("--objects-per-rank", type=int, default=1, help="objects each rank writes")
    w.add_argument("--key-layout", choices=("flat", "hashed"), default="flat",
                   help="hashed spreads keys over 256 prefixes (per-prefix request limits)")
    w.add_argument("--from", dest="from_results", nargs="+", metavar="RESULTS",
                   help="fit a profile from measured result files/dirs and project it")
    s = p.add_argument_group("storage")
    s.add_argument("--profile", action="append", help="profile name(s), comma-separated or "
                   "repeated (default with a workload: all)")
    s.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a profile figure, e.g. stream_bandwidth=100MB/s")
    s.add_argument("--streams", type=int, help="streams per node (default: the profile's)")
    s.add_argument("--part-size", help="bytes per request (default: the profile's)")
    s.add_argument("--write-bandwidth", help="measured/assumed bandwidth, e.g. 70GB/s")
    s.add_argument("--checkpoint-seconds", help="stall per checkpoint, e.g. 300 or 5min")
    c = p.add_argument_group("cost and interval")
    c.add_argument("--interval", default="2h", help="time between checkpoints (default 2h)")
    c.add_argument("--mtbf", help="mean time between failures of the job, e.g. 24h")
    c.add_argument("--restart", help="restart time after a failure, e.g. 10min (default: "
                   "--restart-overhead + the restore time, read back from the storage)")
    c.add_argument("--restart-overhead", default="5min",
                   help="restart time besides the restore: reschedule, start, warm up "
                   "(assumption: 5min)")
    s.add_argument("--local", metavar="PROFILE",
                   help="a fast tier (e.g. local-nvme): each profile also gets a tiered target "
                   "that saves there and drains to it (ckptio.tiered)")
    s.add_argument("--persist-every", type=int, default=1,
                   help="with --local: every N-th checkpoint is drained (default 1)")
    s.add_argument("--p-lose-node", type=float, default=0.78,
                   help="with --local: probability that a failure loses a node's fast tier "
                   "(assumption 0.78: Llama 3's share of hardware interruptions)")
    s.add_argument("--read-bandwidth", help="read bandwidth for the restore with --size and "
                   "figures given directly, e.g. 50GB/s")
    c.add_argument("--price", type=float, default=0.0, help="price per GPU-hour")
    c.add_argument("--async-save", action="store_true",
                   help="asynchronous save: the stall is the snapshot (device->host copy)")
    c.add_argument("--snapshot-bandwidth", default="25GB/s",
                   help="device->host copy per GPU for --async-save (assumption: 25GB/s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _cmd_model(args: argparse.Namespace) -> int:
    from ckptio.model import run_model_cli
    from ckptio.report import print_model

    result = run_model_cli(args)
    if args.json:
        print_json(result)
    else:
        print_model(result, console)
    return 0


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="merge result files (any machines/sites) into index.html + report.md + plots",
    )
    p.add_argument("results", nargs="+", help="result files or directories (from run/sweep/"
                   "compare, on any machine)")
    p.add_argument("--out", default="ckptio-report", help="output directory (default "
                   "ckptio-report/)")
    _add_projection_arguments(p)
    p.add_argument("--json", action="store_true", help="machine-readable summary")


def _add_projection_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("full-scale projection (model)")
    g.add_argument("--project", action="append", metavar="PRESET[:GPUS]",
                   help="workload to project each target to (default gpt3-175b); repeatable")
    g.add_argument("--interval", default="2h", help="checkpoint interval (default 2h)")
    g.add_argument("--price", type=float, help="price per GPU-hour (default 2.0, an assumption)")
    g.add_argument("--restart", default="10min", help="restart time after a failure "
                   "(default 10min, an assumption)")


def _projection_options(args: argparse.Namespace) -> dict[str, Any]:
    from ckptio.model import parse_duration
    from ckptio.report import DEFAULT_PRICE_PER_GPU_HOUR

    presets = []
    for item in args.project or []:
        name, _, gpus = item.partition(":")
        presets.append((name, int(gpus) if gpus else None))
    return {
        "presets": presets or None,
        "interval": parse_duration(args.interval, field="--interval"),
        "price": DEFAULT_PRICE_PER_GPU_HOUR if args.price is None else args.price,
        "restart": parse_duration(args.restart, field="--restart"),
    }


def _cmd_report(args: argparse.Namespace) -> int:
    from ckptio.report import build_report, comparison_table, projection_table

    result = build_report(args.results, args.out, **_projection_options(args))
    if args.json:
        print_json(result)
        return 0
    console.print(comparison_table(result["summary"], "merged results"))
    console.print(projection_table(result["projections"]))
    console.print(f"report: {args.out}/index.html ({len(result['files'])} files)")
    return 0


def _add_compare(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compare",
        help="the main job: run a small scaled checkpoint against local disk, mock S3 and "
        "emulated cloud/HPC storage; print why each stalls; write a report",
    )
    p.add_argument("--targets", help="comma-separated: local, mock-s3, memory, or URLs "
                   "(default: local,mock-s3)")
    p.add_argument("--profiles", help="storage profiles to emulate over memory:// "
                   "(default: cloud-s3,abci-lustre; '' for none; see `ckptio profiles`)")
    p.add_argument("--preset", default="llama3-8b", help="model preset (default llama3-8b)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--total-size", default=None, help="scale the preset to about this size "
                      "(default 256MiB)")
    size.add_argument("--scale", type=float, help="scale factor instead of --total-size")
    p.add_argument("--object-size", default="16MiB", help="largest shard object (default 16MiB)")
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--site", help="label of this machine/site in merged reports (default: hostname)")
    p.add_argument("--out", default="ckptio-report", help="report directory (default "
                   "ckptio-report/); results go to OUT/results/")
    _add_projection_arguments(p)
    p.add_argument("--json", action="store_true", help="machine-readable summary")


def _cmd_compare(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from ckptio.compare import DEFAULT_TOTAL_SIZE, compare
    from ckptio.report import comparison_table, projection_table

    def names(text: str | None) -> list[str] | None:
        return None if text is None else [n.strip() for n in text.split(",") if n.strip()]

    quiet = args.json
    result = compare(
        targets=names(args.targets), profiles=names(args.profiles), preset=args.preset,
        total_size=args.total_size or (None if args.scale else DEFAULT_TOTAL_SIZE),
        scale=args.scale, object_size=args.object_size, iterations=args.iterations,
        out=args.out, site=args.site, **_projection_options(args),
        say=(lambda m: err_console.print(escape(m), highlight=False)) if not quiet
        else (lambda m: None),
    )
    if args.json:
        print_json(result)
        return 0
    console.print(comparison_table(result["summary"], "ckptio compare (this machine, small scale)"))
    console.print(projection_table(result["projections"]))
    console.print(f"report: {args.out}/index.html, results: {result['results_dir']}")
    return 0


# -- plan / run / sweep (the comparison workload) ---------------------------------------------


def _add_plan(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ckptio.workload import add_workload_arguments

    p = sub.add_parser("plan", help="checkpoint size, ranks, bytes/objects/requests per rank of a "
                       "model preset and parallel layout")
    add_workload_arguments(p)
    p.add_argument("--part-size", help="request size to count requests at (default 8MiB)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _cmd_plan(args: argparse.Namespace) -> int:
    from ckptio.workload import cmd_plan

    return cmd_plan(args, console)


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ckptio.runner import add_run_arguments

    p = sub.add_parser("run", help="write and read back a synthetic sharded checkpoint of a "
                       "preset on a target, on N ranks; Parquet results")
    add_run_arguments(p)


def _cmd_run(args: argparse.Namespace) -> int:
    from ckptio.runner import cmd_run

    return cmd_run(args, console)


def _add_sweep(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ckptio.runner import add_run_arguments

    p = sub.add_parser("sweep", help="throughput versus concurrency: the workload at each "
                       "--streams x --part-size")
    add_run_arguments(p, sweep_mode=True)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from ckptio.runner import cmd_run

    return cmd_run(args, console, sweep_mode=True)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckptio",
        description="Checkpoint I/O for AI training: save/load on any storage, compare targets, "
        "explain stalls.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.command is None:
        parser.print_help()
        return 2
    _, run = COMMANDS[args.command]
    try:
        return run(args)
    except errors.CkptioError as err:
        err_console.print(f"[red]error:[/] {escape(str(err))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
