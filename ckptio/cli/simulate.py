"""``ckptio simulate``: the request plan of a full-scale job replayed in virtual time
(:mod:`ckptio.simulate`), beside the model's figures. Everything it prints is simulated."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ckptio import errors
from ckptio.cli.common import (
    add_client_options,
    add_format,
    add_p_lose_node,
    arg,
    count_arg,
    duration_arg,
    list_arg,
    printer,
    size_arg,
)
from ckptio.cli.console import Printer, Sheet, Styled, note
from ckptio.units import (
    MAX_COUNT,
    MAX_GPUS,
    MAX_LOCAL_PROCESSES,
    parse_count,
    parse_duration,
    parse_list,
    parse_number,
    parse_size,
)

__all__ = ["COMMANDS", "print_simulation"]

#: Replications at most (each is one whole checkpoint of every request).
MAX_REPLICATIONS = 10_000


def declare_simulate(p: argparse.ArgumentParser) -> None:
    from ckptio.cli.run import add_workload_arguments

    p.description = (
        "Replay every request of a full-scale checkpoint (save and restore) in virtual time "
        "(SimPy): latency tails, per-prefix throttling with ckptio's retries, stragglers, "
        "storage-target contention, a restore storm; beside the model's figures. "
        "Examples: `ckptio simulate --preset gpt3-175b --gpus 1536 --target cloud-s3`, "
        "`ckptio simulate --preset llama3-405b --gpus 8,1536,16384 --target "
        "cloud-s3,abci-lustre,cloud-s3+local-nvme --out results/`. Every figure is simulated: "
        "a projection, not a measurement."
    )
    add_workload_arguments(p, gpus_type=list_arg(parse_count, minimum=1, maximum=MAX_GPUS))
    s = p.add_argument_group("storage")
    s.add_argument(
        "--target",
        action="append",
        help="profile names or .toml paths, comma-separated or repeated; DURABLE+LOCAL "
        "(cloud-s3+local-nvme) is a tiered target (default cloud-s3)",
    )
    s.add_argument(
        "--latency",
        default="lognormal",
        help="request latency around the profile's: fixed, lognormal (p99 = 4 x median, an "
        "assumption) or lognormal:RATIO (p99/p50); fitted targets resample their own",
    )
    s.add_argument(
        "--osts",
        type=count_arg(0, MAX_COUNT),
        default=0,
        help="storage targets (Lustre OSTs) the aggregate bandwidth is split over (0: not "
        "modelled)",
    )
    s.add_argument("--stripe-count", type=count_arg(1, MAX_COUNT), default=1, help="OSTs per file")
    s.add_argument("--stripe-size", type=size_arg(), default="1MiB", help="bytes per stripe")
    s.add_argument(
        "--placement",
        choices=("round-robin", "random"),
        default="round-robin",
        help="how a file's first OST is chosen",
    )
    s.add_argument(
        "--burst",
        type=duration_arg(positive=True),
        default="1s",
        help="seconds of request rate a prefix absorbs at once (assumption: 1s)",
    )
    s.add_argument(
        "--max-attempts",
        type=count_arg(1, 1000),
        help="attempts per request before the client gives up (default: ckptio's)",
    )
    c = p.add_argument_group("client")
    add_client_options(
        c,
        from_help="fit storage descriptions from measured result files/dirs (latencies "
        "resampled from their requests) and simulate each measured target",
        set_example="write_request_rate=inf",
    )
    c.add_argument(
        "--inflight",
        type=count_arg(1, MAX_LOCAL_PROCESSES),
        default=2,
        help="objects each rank writes at once (the runner's --inflight, default 2)",
    )
    c.add_argument(
        "--readers",
        type=count_arg(1, MAX_LOCAL_PROCESSES),
        default=8,
        help="objects each rank reads at once in a restore (default 8, as ckptio's reader)",
    )
    c.add_argument(
        "--restore",
        choices=("writers", "all"),
        default="writers",
        help="who reads in a restore: each writing rank its own bytes (as the model counts), "
        "or all ranks what they hold (the storm: replicas read the same objects)",
    )
    c.add_argument(
        "--lockstep",
        action="store_true",
        help="send objects as the model counts them (a node's ranks in groups) instead of as "
        "ckptio's runner does",
    )
    x = p.add_argument_group("scenario")
    x.add_argument("--phase", choices=("save", "restore", "both"), default="both")
    x.add_argument(
        "--stragglers",
        type=count_arg(0, MAX_GPUS),
        default=0,
        help="nodes (drawn per checkpoint) that do everything --straggler-slowdown times slower",
    )
    x.add_argument(
        "--straggler-slowdown",
        type=arg(parse_number, "number", minimum=1.0, maximum=1e6),
        default=2.0,
        help="how many times slower a straggler is (default 2)",
    )
    add_p_lose_node(x, what="tiered targets")
    x.add_argument(
        "--replications",
        type=count_arg(1, MAX_REPLICATIONS),
        default=10,
        help="checkpoints simulated for the distribution (default 10; 1 when nothing is random)",
    )
    x.add_argument("--seed", type=count_arg(0, 2**63 - 1), default=0, help="random seed")
    x.add_argument(
        "--workers",
        type=count_arg(1, MAX_LOCAL_PROCESSES),
        help="processes the replications run in (the result is the same for any count; "
        "default: one per CPU core for a large job)",
    )
    p.add_argument("--out", help="write the simulated results (Parquet + JSON) to this directory")
    p.add_argument(
        "--report",
        metavar="DIR",
        help="write a report of the simulations in --out (or in DIR when no --out) to DIR: "
        "index.html, report.md, a plot of simulated and modelled stall against scale",
    )
    add_format(p)


def _targets(args: argparse.Namespace) -> list[tuple[Any, Any]]:
    """(durable storage, local storage or None) per target the options name."""
    from ckptio import simulate as sim
    from ckptio.profiles import parse_overrides

    overrides = parse_overrides(args.set)
    kw: dict[str, Any] = dict(
        targets=args.osts,
        stripe_count=args.stripe_count,
        stripe_size=parse_size(args.stripe_size, field="--stripe-size"),
        placement=args.placement,
        burst=parse_duration(args.burst, field="--burst", positive=True),
    )
    if args.max_attempts:
        from dataclasses import replace

        from ckptio.store import DEFAULT_RETRY_POLICY

        kw["retry"] = replace(DEFAULT_RETRY_POLICY, max_attempts=args.max_attempts)
    out: list[tuple[Any, Any]] = []
    if args.from_results:
        from dataclasses import replace as dc_replace

        for fitted in sim.fit_storage(args.from_results):
            prof = fitted.profile.with_overrides(overrides)
            out.append((dc_replace(fitted, profile=prof, **kw), None))
    names = [n.strip() for item in (args.target or []) for n in item.split(",") if n.strip()]
    if not names and not out:
        names = ["cloud-s3"]
    for name in names:
        durable, _, local = name.partition("+")
        out.append(
            (
                sim.Storage.from_profile(durable, latency=args.latency, overrides=overrides, **kw),
                sim.Storage.from_profile(local, latency=args.latency, overrides=overrides)
                if local
                else None,
            )
        )
    return out


def _jobs(args: argparse.Namespace) -> list[Any]:
    """One :class:`ckptio.simulate.Job` per ``--gpus`` value (the preset's own without)."""
    from ckptio import simulate as sim
    from ckptio.cli.run import plan_from_args

    gpus = (
        parse_list(args.gpus, parse_count, field="--gpus", minimum=1, maximum=MAX_GPUS)
        if (args.gpus)
        else [None]
    )
    plan_kw: dict[str, Any] = dict(
        scale=args.scale, total_size=args.total_size, object_size=args.object_size
    )
    jobs = []
    for g in gpus:
        note_text = ""
        if args.preset == "custom" or g is None:
            ns = argparse.Namespace(**{**vars(args), "gpus": g})
            plan = plan_from_args(ns)
        else:
            plan, note_text = sim.fit_layout(
                args.preset, g, tp=args.tp, pp=args.pp, zero=args.zero, **plan_kw
            )
        jobs.append(
            sim.Job(
                plan,
                ranks_per_node=args.ranks_per_node,
                streams=args.streams,
                part_size=parse_size(args.part_size, field="--part-size")
                if args.part_size
                else None,
                object_concurrency=args.inflight,
                restore_readers=args.readers,
                key_layout=args.key_layout,
                readers=args.restore,
                lockstep=args.lockstep,
                layout_note=note_text,
            )
        )
    return jobs


def run_simulate(args: argparse.Namespace) -> int:
    from ckptio import simulate as sim

    out = printer(args)
    targets = _targets(args)
    jobs = _jobs(args)
    phases = ("save", "restore") if args.phase == "both" else (args.phase,)
    if not 0 <= args.p_lose_node <= 1:
        raise errors.InvalidArgumentError(
            f"--p-lose-node: a probability in [0, 1], got {args.p_lose_node}"
        )
    sims = []
    for job in jobs:
        for durable, local in targets:
            name = f"{durable.name}+{local.name}" if local else durable.name
            note(f"simulating {name}: {job.plan.preset.name} on {job.gpus:,} GPUs ...")
            s = sim.simulate(
                job,
                durable,
                local=local,
                phases=phases,
                replications=args.replications,
                seed=args.seed,
                workers=args.workers,
                stragglers=args.stragglers,
                straggler_slowdown=args.straggler_slowdown,
                p_lose_node=args.p_lose_node,
            )
            note(f"{name} on {job.gpus:,} GPUs done in {s.wall_seconds:.1f} s")
            sims.append(s)
    written: list[str] = []
    if args.out or args.report:
        paths = sim.write_results(sims, args.out or args.report, config=_config(args))
        written = [str(p) for p in paths]
    if args.report:
        from ckptio.report.simulated import build

        written += build([args.out or args.report], args.report)
    if out.fmt == "json":
        out.json({"simulations": [s.as_dict() for s in sims], "files": written})
    else:
        print_simulation([s.as_dict() for s in sims], out)
        if written:
            out.line(f"results: {', '.join(written)}")
    return 0


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k not in ("format", "json", "verbose")}


def simulation_sheet(sims: list[dict[str, Any]]) -> Sheet:
    """One row per target, scale and phase: simulated beside modelled."""
    from ckptio.report.simulated import seconds_text, simulated_text

    sheet = Sheet(
        "simulated vs modelled stall",
        [
            "target",
            "GPUs",
            "phase",
            "simulated p50 (interval)",
            "p99",
            "modelled",
            "sim/model",
            "bound by (simulated)",
            "binding (model)",
            "throttled",
            "retried",
        ],
        right={"GPUs", "simulated p50 (interval)", "p99", "modelled", "sim/model", "throttled"}
        | {"retried"},
    )
    for s in sims:
        for ph in s["phases"].values():
            ratio = (
                f"{ph['p50_seconds'] / ph['modelled_seconds']:.2f}"
                if ph["p50_seconds"] and ph["modelled_seconds"]
                else "-"
            )
            bound = ph["bound_by"]
            sheet.add(
                s["target"],
                f"{s['job']['gpus']:,}",
                ph["phase"],
                Styled(simulated_text(ph), "red") if ph["failed"] else simulated_text(ph),
                seconds_text(ph["p99_seconds"]),
                seconds_text(ph["modelled_seconds"]),
                ratio,
                bound,
                ph["model_binding"] or "-",
                f"{ph['throttled']:,}",
                f"{ph['retried']:,}",
            )
    return sheet


def print_simulation(sims: list[dict[str, Any]], out: Printer) -> None:
    """The simulations as a table, then per phase what bound it, and the notes."""
    from ckptio.units import human_size

    if not sims:
        return
    first = sims[0]
    j = first["job"]
    out.line(
        f"simulated: {j['preset']}, {human_size(j['checkpoint_bytes'])} per checkpoint, "
        f"{j['layout']}; {j['ranks_per_node']} GPUs per node; key layout {j['key_layout']}; "
        f"restore read by {j['readers']}"
    )
    out.sheet(simulation_sheet(sims))
    for s in sims:
        runs = (
            "deterministic: one replication"
            if s["deterministic"]
            else f"{s['replications']} replications, seed {s['seed']}"
        )
        sets = f"; set {s['overrides']}" if s["overrides"] else ""
        out.line(
            f"{s['target']} at {s['job']['gpus']:,} GPUs ({runs}; {s['storage']['latency']} "
            f"latency{sets}; simulated in {s['wall_seconds']:.1f} s):"
        )
        for ph in s["phases"].values():
            where = (
                f"rank {ph['bound_rank']} on node {ph['bound_node']}"
                + (
                    f" (one of {ph['bound_weight']} identical nodes)"
                    if ph["bound_weight"] > 1
                    else ""
                )
                if ph["bound_rank"] is not None and ph["bound_rank"] >= 0
                else "no rank"
            )
            out.line(f"  {ph['phase']}: last {where}; {ph['mechanism']}")
            if ph["note"]:
                out.line(f"    {ph['note']}")
        for n in s["notes"]:
            out.line(f"  note: {n}")
    out.line(
        "Every figure here is simulated (a projection from storage profiles, not a "
        "measurement); [low, high]: a distribution-free interval of the p50 from the "
        "replications' order statistics, at least 95% unless a smaller coverage is shown "
        "(too few replications)."
    )


COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {"simulate": (declare_simulate, run_simulate)}
