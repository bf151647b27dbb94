"""``ckptio model``, ``report`` and ``compare``: why a checkpoint stalls, projected, measured
and merged."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from ckptio import errors
from ckptio.cli.common import (
    add_client_options,
    add_format,
    add_p_lose_node,
    arg,
    bandwidth_arg,
    count_arg,
    duration_arg,
    list_arg,
    number_arg,
    printer,
    size_arg,
)
from ckptio.cli.console import note
from ckptio.costmodel import DEFAULT_P_LOSE_ANOTHER
from ckptio.units import (
    MAX_COUNT,
    MAX_GPUS,
    MAX_ITERATIONS,
    MAX_LOCAL_PROCESSES,
    MAX_PEERS,
    MAX_PRICE,
    MAX_SCALE,
    parse_bandwidth,
    parse_count,
    parse_duration,
    parse_list,
    parse_size,
)

__all__ = ["COMMANDS", "add_projection_arguments", "model_result", "parse_projection"]


def declare_model(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Project one checkpoint's write/read time from a workload and storage "
        "profiles (or figures given directly), say which limit binds, and what the stall "
        "costs. Examples: `ckptio model --size 2TB --write-bandwidth 70GB/s --interval 2h`, "
        "`ckptio model --size 2TB --write-bandwidth 70GB/s,7GB/s --gpus 1024 --async-save` "
        "(one row per bandwidth), "
        "`ckptio model --checkpoint-seconds 300 --mtbf 24h --restart 10min`, "
        "`ckptio model --preset gpt3-175b --gpus 992 --profile cloud-s3,abci-lustre`. "
        "Without --gpus (or a preset) it assumes 1 GPU and says so."
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
        "--objects-per-rank",
        type=count_arg(1, MAX_COUNT),
        default=1,
        help="objects each rank writes",
    )
    s = p.add_argument_group("storage")
    s.add_argument(
        "--profile",
        action="append",
        help="profile name(s), comma-separated or repeated (default with a workload: all)",
    )
    add_client_options(
        s,
        from_help="fit a profile from measured result files/dirs and project it",
        set_example="stream_bandwidth=100MB/s",
        streams_help=f"streams per node, 1 to {MAX_LOCAL_PROCESSES} (default: the profile's)",
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
    add_p_lose_node(s, what="with --local")
    _declare_peers(s)
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
    add_format(p)


def _declare_peers(s: Any) -> None:
    """``ckptio model``'s options for peer copies of the fast tier (with ``--local``)."""
    s.add_argument(
        "--peers",
        type=count_arg(0, MAX_PEERS),
        default=0,
        help="with --local: also a tiered target with K peer copies of each node's fast tier "
        "on the next K nodes of a ring (DURABLE+LOCAL+peer); default 0",
    )
    s.add_argument(
        "--peer-bandwidth",
        type=bandwidth_arg(),
        help="with --peers: a node's network link to the others (default: the durable "
        "profile's node_bandwidth, the same link)",
    )
    s.add_argument(
        "--peer-fan-in",
        type=count_arg(1, MAX_COUNT),
        help="with --peers: replacement nodes that read from one surviving peer (default: the "
        "restore planner's on the job's ring with K neighbouring nodes lost)",
    )
    s.add_argument(
        "--p-lose-another",
        type=number_arg(maximum=1.0),
        default=DEFAULT_P_LOSE_ANOTHER,
        help="with --peers: probability that a failure which loses a node loses another at "
        f"once (assumption {DEFAULT_P_LOSE_ANOTHER})",
    )


def run_model(args: argparse.Namespace) -> int:
    from ckptio.cli.console import print_model

    out = printer(args)
    result = model_result(args)
    if out.fmt == "json":
        out.json(result)
    else:
        print_model(result, out)
    return 0


def _profiles_from_args(names: list[str] | None, overrides: dict[str, str]) -> list[Any]:
    from ckptio.profiles import available, load_profile

    wanted = [n.strip() for item in (names or []) for n in item.split(",") if n.strip()]
    return [load_profile(n, overrides) for n in (wanted or available())]


def _conditions(args: argparse.Namespace) -> Any:
    """The projection's :class:`~ckptio.stallmodel.Conditions` from the arguments."""
    from ckptio.stallmodel import Conditions

    return Conditions(
        interval=parse_duration(args.interval, field="--interval", positive=True),
        mtbf=(
            parse_duration(args.mtbf, field="--mtbf", positive=True, allow_inf=True)
            if args.mtbf
            else math.inf
        ),
        gpus=args.gpus,
        price_per_gpu_hour=args.price,
        restart_seconds=parse_duration(args.restart, field="--restart")
        if args.restart is not None
        else None,
        restart_overhead=parse_duration(args.restart_overhead, field="--restart-overhead"),
        async_save=args.async_save,
        snapshot_bandwidth=parse_bandwidth(args.snapshot_bandwidth, field="--snapshot-bandwidth"),
        persist_every=args.persist_every,
        p_lose_node=args.p_lose_node,
        peers=args.peers,
        peer_fan_in=args.peer_fan_in,
        p_lose_another=args.p_lose_another,
        peer_bandwidth=parse_bandwidth(args.peer_bandwidth, field="--peer-bandwidth")
        if args.peer_bandwidth
        else None,
        streams=args.streams,
        part_size=parse_size(args.part_size, field="--part-size") if args.part_size else None,
    )


def _workload(args: argparse.Namespace, size: int | None) -> tuple[Any, str]:
    """The workload to project and where its GPU count comes from."""
    from ckptio.stallmodel import Workload, preset_workload

    prefixes = 256 if args.key_layout == "hashed" else 1
    if args.preset:
        w = preset_workload(
            args.preset, gpus=args.gpus, ranks_per_node=args.ranks_per_node, prefixes=prefixes
        )
        return w, "given" if args.gpus else f"preset {args.preset}"
    if size is not None:
        gpus = args.gpus or 1
        writing = args.writing_ranks or gpus
        w = Workload(
            total_bytes=size,
            writing_ranks=writing,
            bytes_per_rank=-(-size // writing),
            objects_per_rank=args.objects_per_rank,
            ranks=gpus,
            ranks_per_node=args.ranks_per_node,
            name=f"{args.size} checkpoint",
            prefixes=prefixes,
        )
        return w, "given" if args.gpus else "assumed"
    raise errors.InvalidArgumentError(
        "model needs a workload: --preset NAME (see `ckptio plan`), or --size with --gpus; "
        "or figures: --checkpoint-seconds, or --size with --write-bandwidth"
    )


def model_result(args: argparse.Namespace) -> dict[str, Any]:
    """``ckptio model``: the argparse namespace -> :func:`ckptio.stallmodel.evaluate`'s
    result; measured targets (``--from``) first, each with its intervals over its rounds, or
    the reason it is not projected."""
    from ckptio.calibration import calibrate_results, fit_profiles, project_rounds
    from ckptio.profiles import load_profile, parse_overrides
    from ckptio.stallmodel import Figures, evaluate

    overrides = parse_overrides(args.set)
    size = parse_size(args.size, field="--size") if args.size else None
    c = _conditions(args)
    local = load_profile(args.local, overrides) if getattr(args, "local", None) else None
    if args.checkpoint_seconds is not None or args.write_bandwidth is not None:
        if args.checkpoint_seconds is None and size is None:
            raise errors.InvalidArgumentError("--write-bandwidth needs --size (e.g. --size 2TB)")
        figures = Figures(
            checkpoint_seconds=parse_duration(args.checkpoint_seconds, field="--checkpoint-seconds")
            if args.checkpoint_seconds is not None
            else None,
            size=size,
            write_bandwidths=tuple(
                parse_list(args.write_bandwidth, parse_bandwidth, field="--write-bandwidth")
            )
            if args.write_bandwidth is not None
            else (),
            read_bandwidth=parse_bandwidth(args.read_bandwidth, field="--read-bandwidth")
            if args.read_bandwidth
            else None,
            writing_ranks=args.writing_ranks,
        )
        return evaluate(figures=figures, conditions=c)
    workload, gpus_from = _workload(args, size)
    measured: list[dict[str, Any]] = []
    # the node link to peers, where the results measured restores from a peer copy (a
    # tiered run with --replicas, which has no plain target to fit beside it)
    link = _peer_link(args.from_results) if args.from_results and c.peers else None
    fits = []
    if args.from_results:
        try:
            fits = calibrate_results(args.from_results)
        except errors.InvalidArgumentError:
            if link is None:
                raise
    for fit in fits:
        assert fit.pooled is not None  # calibrate_results keeps only fits with data
        kind = "mock" if fit.pooled.mock else "emulated" if fit.pooled.emulated else "measured"
        if fit.refusal:
            measured.append(
                {"target": f"measured:{fit.target}", "kind": kind, "refusal": fit.refusal}
            )
            continue
        pooled, rounds = fit_profiles(fit, overrides)
        entry = project_rounds(
            workload,
            c,
            (pooled, local),
            [(p, local) for p in rounds],
            what=fit.target,
            peer_link=link,
        )
        measured.append({**entry, "kind": kind, "notes": fit.notes})
    profiles = _profiles_from_args(args.profile, overrides) if args.profile or not fits else []
    if link is not None and c.peer_bandwidth is None:
        c = replace(c, peer_bandwidth=link.bandwidth, peer_bandwidth_source=link.source())
    result = evaluate(
        workload=workload,
        profiles=profiles,
        conditions=c,
        local=local,
        gpus_from=gpus_from,
        measured=measured,
    )
    if fits:
        result["calibration"] = [asdict(f.pooled) for f in fits if f.pooled is not None]
    return result


def _peer_link(paths: list[str]) -> Any:
    """:func:`ckptio.calibration.fit_peer_link` of the results' phases (None: none restored
    from a peer)."""
    from ckptio.calibration import fit_peer_link
    from ckptio.results import read_results

    return fit_peer_link(read_results(paths).phases)


def declare_report(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "results",
        nargs="+",
        help="result files or directories (from run/sweep/compare, on any machine)",
    )
    p.add_argument(
        "--out", default="ckptio-report", help="output directory (default ckptio-report/)"
    )
    add_projection_arguments(p)
    add_format(p)


def add_projection_arguments(p: argparse.ArgumentParser) -> None:
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


def _scenario(args: argparse.Namespace) -> Any:
    """What ``report`` and ``compare`` project to (:class:`ckptio.report.Scenario`)."""
    from ckptio.report import DEFAULT_PRICE_PER_GPU_HOUR, Scenario
    from ckptio.units import parse_duration

    presets = tuple(args.project or [])  # (preset, GPUs) pairs, checked by parse_projection
    return Scenario(
        **({"presets": presets} if presets else {}),
        interval=parse_duration(args.interval, field="--interval", positive=True),
        price=DEFAULT_PRICE_PER_GPU_HOUR if args.price is None else args.price,
        restart=None if args.restart is None else parse_duration(args.restart, field="--restart"),
    )


def run_report(args: argparse.Namespace) -> int:
    from ckptio.cli.console import (
        comparison_sheet,
        peer_lines,
        projection_sheet,
        refusal_lines,
        warn,
    )
    from ckptio.report import build_report

    out = printer(args)
    result = build_report(args.results, args.out, _scenario(args))
    if out.fmt == "json":
        out.json(result)
        return 0
    out.sheet(comparison_sheet(result["summary"], "merged results"))
    out.sheet(projection_sheet(result["projections"]))
    for line in peer_lines(result["projections"]) + refusal_lines(result["projections"]):
        out.line(line)
    out.line(f"report: {args.out}/index.html ({len(result['files'])} files)")
    if result["plots_missing"]:
        warn(f"no plots: {result['plots_missing']}")
    return 0


def declare_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--targets",
        help="comma-separated: local, mock-s3, rgw (a Ceph RADOS "
        "Gateway started on loopback: measured, a real S3 implementation), cephfs (CephFS "
        "from the same Ceph, mounted with ceph-fuse: measured, needs root), memory, "
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
        "fast tier, 'disk' (this machine's, measured) or a profile (emulated); '+peer' or "
        "'+peerK' after it: projected with K peer copies of the fast tier "
        "(default: cloud-s3+local-nvme,cloud-s3+local-nvme+peer; '' for none)",
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
        help=f"rounds (checkpoints written and read back) per target, 1 to {MAX_ITERATIONS} "
        "(default: one for emulated and mock targets; for measured ones as many as their "
        "full-scale projection needs to be within ±20%%, at least 4)",
    )
    p.add_argument(
        "--site", help="label of this machine/site in merged reports (default: hostname)"
    )
    p.add_argument(
        "--out",
        help="report directory, which must not hold an earlier run's results (default: "
        "ckptio-report/<session>/, a directory of its own for each compare); results go to "
        "OUT/results/",
    )
    add_projection_arguments(p)
    add_format(p)


def run_compare(args: argparse.Namespace) -> int:
    from ckptio.cli.console import comparison_sheet, peer_lines, projection_sheet, refusal_lines
    from ckptio.compare import DEFAULT_TOTAL_SIZE, CompareWorkload, compare

    def names(text: str | None) -> list[str] | None:
        return None if text is None else [n.strip() for n in text.split(",") if n.strip()]

    out = printer(args)
    result = compare(
        targets=names(args.targets),
        profiles=names(args.profiles),
        tiered=names(args.tiered),
        workload=CompareWorkload(
            preset=args.preset,
            total_size=args.total_size or (None if args.scale else DEFAULT_TOTAL_SIZE),
            scale=args.scale,
            object_size=args.object_size,
            iterations=args.iterations,
        ),
        out=args.out,
        site=args.site,
        scenario=_scenario(args),
        say=note,
    )
    if out.fmt == "json":
        out.json(result)
        return 0
    out.sheet(comparison_sheet(result["summary"], "ckptio compare (this machine, small scale)"))
    out.sheet(projection_sheet(result["projections"]))
    for line in peer_lines(result["projections"]) + refusal_lines(result["projections"]):
        out.line(line)
    out.line(f"report: {result['out']}/index.html, results: {result['results_dir']}")
    return 0


#: command -> (declare its arguments, run it)
COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {
    "model": (declare_model, run_model),
    "report": (declare_report, run_report),
    "compare": (declare_compare, run_compare),
}
