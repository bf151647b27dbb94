"""``ckptio plan``, ``run`` and ``sweep``: the checkpoint workload of a model preset, planned,
and run against a target on N ranks (:mod:`ckptio.runner`).

The runner is imported by ``run`` and ``sweep`` when they start, not by ``plan`` or by their
``--help``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckptio import errors, units
from ckptio.cli.common import (
    add_format,
    count_arg,
    duration_arg,
    list_arg,
    number_arg,
    printer,
    size_arg,
)
from ckptio.redact import redact_url
from ckptio.units import (
    MAX_GPUS,
    MAX_ITERATIONS,
    MAX_LOCAL_PROCESSES,
    MAX_MODEL_DIMENSION,
    MAX_PEERS,
    MAX_SCALE,
    parse_count,
    parse_size,
)
from ckptio.workload import (
    OBJECT_ALIGNMENT,
    Layout,
    Plan,
    Preset,
    Transformer,
    custom_preset,
    make_plan,
    preset_names,
)

if TYPE_CHECKING:
    from ckptio.dist import Communicator
    from ckptio.runner import RunSettings, RunSummary, SweepPoint
    from ckptio.tierbench import Tiers

__all__ = [
    "COMMANDS",
    "RunJob",
    "add_run_arguments",
    "add_workload_arguments",
    "execute_run",
    "parse_list",
    "plan_from_args",
    "prepare_run",
]


# -- workload options (plan, run, sweep) ----------------------------------------------------


def add_workload_arguments(p: Any, *, gpus_type: Callable[[str], Any] | None = None) -> None:
    """The workload options shared by ``ckptio plan``, ``run``, ``sweep`` and ``simulate``
    (argparse); ``gpus_type``: the type of ``--gpus`` (``simulate`` takes a list: a
    sweep)."""
    w = p.add_argument_group("workload")
    w.add_argument(
        "--preset",
        default="llama3-8b",
        help=f"model preset: {', '.join(preset_names())} (default llama3-8b)",
    )
    w.add_argument(
        "--gpus",
        type=gpus_type or count_arg(1, MAX_GPUS),
        help="GPUs of the layout (data parallelism = GPUs / "
        f"(TPxPP)), 1 to {MAX_GPUS}"
        + ("; several, comma-separated (8,1536,16384), simulate each" if gpus_type else "")
        + "; default: the preset's",
    )
    gpus = count_arg(1, MAX_GPUS)
    w.add_argument("--tp", type=gpus, help="tensor parallelism (default: the preset's)")
    w.add_argument("--pp", type=gpus, help="pipeline parallelism (default: the preset's)")
    w.add_argument("--zero", type=count_arg(0, 3), help="ZeRO stage 0-3 (default: the preset's)")
    size = w.add_mutually_exclusive_group()
    size.add_argument(
        "--scale",
        type=number_arg(maximum=MAX_SCALE, positive=True),
        help="shrink the checkpoint by this factor, keeping the layout (e.g. 2e-4; "
        f"above 0, at most {MAX_SCALE:,.0f}, and the result at most 1 EiB)",
    )
    size.add_argument(
        "--total-size",
        type=size_arg(),
        help="shrink (or grow) to about this size, e.g. 4GiB (at most 1 EiB)",
    )
    w.add_argument(
        "--object-size",
        type=size_arg(OBJECT_ALIGNMENT),
        default="64MiB",
        help="largest shard object (default 64MiB); bounds memory per rank",
    )
    c = p.add_argument_group("custom model (--preset custom)")
    for flag in ("hidden", "layers", "ffn", "vocab", "heads", "kv-heads"):
        c.add_argument(
            f"--{flag}", type=count_arg(1, MAX_MODEL_DIMENSION), help=f"1 to {MAX_MODEL_DIMENSION}"
        )
    c.add_argument("--dp", type=gpus, help="data parallelism of a custom model (default 1)")


def plan_from_args(args: Any) -> Plan:
    """The plan the workload options of ``args`` describe."""
    name = args.preset
    preset: str | Preset = name
    if name == "custom":
        need = {
            "hidden": args.hidden,
            "layers": args.layers,
            "ffn": args.ffn,
            "vocab": args.vocab,
            "heads": args.heads,
        }
        missing = [f"--{k}" for k, v in need.items() if v is None]
        if missing:
            raise errors.InvalidArgumentError(
                f"--preset custom needs {', '.join(missing)} (and optionally --kv-heads, "
                "--tp, --pp, --dp, --zero)"
            )
        model = Transformer(**need, kv_heads=args.kv_heads or need["heads"])
        layout = Layout(
            tp=args.tp or 1,
            pp=args.pp or 1,
            dp=args.dp or 1,
            zero=1 if args.zero is None else args.zero,
        )
        preset = custom_preset(model, layout)
    return make_plan(
        preset,
        gpus=args.gpus,
        tp=args.tp,
        pp=args.pp,
        zero=args.zero,
        scale=args.scale,
        total_size=args.total_size,
        object_size=args.object_size,
    )


# -- run and sweep ---------------------------------------------------------------------------


def parse_list(text: str, *, field: str, sizes: bool = False) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]`` (streams: 1 to :data:`~ckptio.units.MAX_LOCAL_PROCESSES`);
    with ``sizes``, ``"8MiB,64MiB"`` -> bytes (at least 1)."""
    if sizes:
        return units.parse_list(text, parse_size, field=field, minimum=1)
    return units.parse_list(text, parse_count, field=field, minimum=1, maximum=MAX_LOCAL_PROCESSES)


def add_run_arguments(p: Any, *, sweep_mode: bool = False) -> None:
    """The options of ``ckptio run`` / ``ckptio sweep`` (argparse)."""
    from ckptio import format as fmt
    from ckptio.checkpoint import LAYOUTS
    from ckptio.runner import CACHE_MODES, KEEP

    p.add_argument(
        "target", help="storage URL or path (file:///mnt/nvme/ckpt, s3://bucket/x, memory://, ...)"
    )
    add_workload_arguments(p)
    r = p.add_argument_group("run")
    per_node = count_arg(1, MAX_LOCAL_PROCESSES)
    r.add_argument(
        "--ranks",
        type=per_node,
        help=f"processes on this node, 1 to "
        f"{MAX_LOCAL_PROCESSES} (started by ckptio); under mpiexec/srun/torchrun the "
        "launcher's ranks are used",
    )
    r.add_argument(
        "--iterations",
        type=count_arg(1, MAX_ITERATIONS),
        default=1,
        help=f"checkpoints to write, 1 to {MAX_ITERATIONS} (default 1)",
    )
    r.add_argument(
        "--pause",
        type=duration_arg(keep_text=False),
        default=0.0,
        help="time between iterations (the compute time): seconds, or 20ms, 10min, ... (default 0)",
    )
    r.add_argument(
        "--inflight",
        type=per_node,
        default=2,
        help="shard objects in flight per "
        f"rank, 1 to {MAX_LOCAL_PROCESSES} (memory per rank ~ inflight x object size)",
    )
    r.add_argument("--no-read", action="store_true", help="skip the read-back phase")
    r.add_argument(
        "--cache",
        choices=CACHE_MODES,
        default="auto",
        help="how reads bypass the page cache (default auto)",
    )
    r.add_argument(
        "--keep",
        choices=KEEP,
        default=None,
        help="the run's checkpoints left on the target afterwards: the last iteration's, all "
        "or none (default last; none with --share-root)",
    )
    r.add_argument(
        "--share-root",
        action="store_true",
        help="run into a root that holds checkpoints (or saves in flight) no benchmark run "
        "wrote, such as a training job's: refused without this flag, since load() returns the "
        "newest step; the run's steps are numbered after every step there",
    )
    r.add_argument("--key-layout", choices=fmt.KEY_LAYOUTS, default="flat")
    r.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="file-per-shard",
        help="checkpoint layout: file-per-shard (N-N, default), shared-file (N-1: one "
        "object per checkpoint, ranks pwrite their ranges), shared-file-per-node "
        "(one per host); the shared ones need file:// or pfs://",
    )
    r.add_argument(
        "--emulate",
        metavar="PROFILE",
        help="wrap the target in the shaped backend "
        "with this storage profile (results are marked emulated)",
    )
    r.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="store option, repeatable (e.g. direct=true)",
    )
    if not sweep_mode:
        t = p.add_argument_group(
            "tiers",
            "with --local, the target is the durable tier of a tiered run: each iteration saves "
            "on the fast tier (the stall), drains it to the target in the background (timed), "
            "and restores it from the fast tier and, as a replaced node would, from the target",
        )
        t.add_argument(
            "--local",
            metavar="URL",
            help="the fast tier (node-local disk), e.g. file:///nvme/run; {rank} in it gives "
            "each rank its own root, as separate nodes have",
        )
        t.add_argument(
            "--emulate-local",
            metavar="PROFILE",
            help="wrap the fast tier in the shaped backend with this storage profile "
            "(e.g. local-nvme; results are marked emulated)",
        )
        t.add_argument(
            "--replicas",
            metavar="K",
            type=count_arg(0, MAX_PEERS),
            default=0,
            help="copy each rank's fast-tier step to K other nodes' fast tiers (needs {rank} in "
            "--local and ranks on more than K nodes, under mpiexec/srun/torchrun); adds the "
            "phases replicate and restore-peer: --lose nodes' loss emulated (their ranks' "
            "fast roots emptied, the nodes not killed), then restored from the peer copies",
        )
        t.add_argument(
            "--lose",
            metavar="N",
            type=count_arg(1, MAX_PEERS + 1),
            default=1,
            help="with --replicas: nodes lost at once in restore-peer, neighbours on the ring "
            "(the worst placement; fewer than the job's nodes; default 1). More than K: what no "
            "copy holds is read from the durable tier (restore_path durable). Each row records "
            "the nodes lost and the nodes that sent the rank its bytes (fan-in: the most lost "
            "nodes one sender served)",
        )
    if sweep_mode:
        r.add_argument(
            "--streams",
            default="1,4,16,64",
            type=list_arg(parse_count, minimum=1, maximum=MAX_LOCAL_PROCESSES),
            help="streams to try (default 1,4,16,64)",
        )
        r.add_argument(
            "--part-size",
            default="8MiB,64MiB",
            type=list_arg(parse_size, minimum=1),
            help="request sizes to try (default 8MiB,64MiB)",
        )
    else:
        r.add_argument("--streams", type=per_node, help="store option: concurrent streams")
        r.add_argument("--part-size", type=size_arg(), help="store option: bytes per request/part")
    r.add_argument(
        "--out", default="ckptio-results", help="result directory (default ./ckptio-results)"
    )
    r.add_argument(
        "--site", help="label of this site/machine in merged reports (default: hostname)"
    )
    r.add_argument("--label", help="label of the target in reports")


def _options(args: Any, *, sweep_mode: bool) -> dict[str, Any]:
    from ckptio.registry import backend_for

    opts: dict[str, Any] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise errors.InvalidArgumentError(f"--option wants KEY=VALUE, got {item!r}")
        opts[key.strip()] = value.strip()
    if not sweep_mode:
        if args.streams is not None:
            opts["streams"] = args.streams
        if args.part_size:
            opts[backend_for(args.target).request_size_option] = args.part_size
    return opts


@dataclass
class RunJob:
    """A ``ckptio run`` / ``sweep`` checked and ready (:func:`prepare_run`)."""

    target: str
    plan: Plan
    mode: str
    """``run``, ``sweep`` or ``tiered`` (``run --local``)."""
    tiers: Tiers | None
    """The fast tier of a tiered run (``run --local``: :func:`ckptio.tierbench.rank_main`)."""
    comm: Communicator | None
    """The launcher's communicator (mpiexec/srun/torchrun), else None: local processes."""
    ranks: int
    progress_bytes: int
    """Bytes rank 0 writes and reads over the whole job (the progress bar's total)."""
    points: list[SweepPoint] = field(default_factory=list)
    settings: RunSettings | None = None
    """The run's (each sweep point's, the tiered run's) settings."""
    sweep: dict[str, Any] | None = None
    """:func:`ckptio.runner.sweep`'s points (``streams``, ``part_sizes``, ``warn``)."""

    @property
    def is_root(self) -> bool:
        return self.comm is None or self.comm.rank == 0

    @property
    def warnings(self) -> list[str]:
        """What the user should know before the job starts (sweep points whose streams the
        layout cannot keep busy)."""
        from ckptio.runner import sweep_warnings

        return sweep_warnings(self.points, self.plan, self.ranks) if self.points else []


def prepare_run(args: Any, *, sweep_mode: bool = False) -> RunJob:
    """Check the options of ``ckptio run`` / ``sweep`` (``args``: their argparse namespace)
    and the target, once, before any work: a wrong target, option or layout raises here."""
    from ckptio import dist
    from ckptio.registry import backend_for, emulation_url, open_store
    from ckptio.runner import RunSettings, check_layout, sweep_points, writer_ranks

    plan = plan_from_args(args)
    opts = _options(args, sweep_mode=sweep_mode)
    local = None if sweep_mode else args.local
    if not sweep_mode and args.emulate_local and not local:
        raise errors.InvalidArgumentError("--emulate-local needs --local URL (the fast tier)")
    replicas = 0 if sweep_mode else args.replicas
    if replicas and (not local or "{rank}" not in local):
        raise errors.InvalidArgumentError(
            "--replicas copies each rank's fast-tier step to other nodes: it needs --local "
            "with {rank} (a fast root per rank, on its node's disk), e.g. "
            "--local 'file:///nvme/run/{rank}'"
        )
    lose = 1 if sweep_mode else args.lose
    if lose != 1 and not replicas:
        raise errors.InvalidArgumentError(
            f"--lose {lose}: nodes are lost in the restore from peer copies; it needs --replicas K"
        )
    if local and args.layout != "file-per-shard":
        raise errors.InvalidArgumentError(
            f"--layout {args.layout} cannot be tiered (--local): a drain copies each rank's own "
            "objects; use file-per-shard"
        )
    probes = [opts]
    if sweep_mode:  # a store that takes no streams or part size fails here, not at point 1
        probes.append(
            {
                **opts,
                "streams": parse_list(args.streams, field="--streams")[0],
                backend_for(args.target).request_size_option: parse_list(
                    args.part_size, field="--part-size", sizes=True
                )[0],
            }
        )
    # a wrong target or option fails here, once (through the shaped wrapper when emulating:
    # profile figures given as --option belong to it, not to the wrapped store)
    for probe_opts in probes:
        if args.emulate:
            probe = open_store(
                emulation_url(args.target), **{**probe_opts, "profile": args.emulate}
            )
        else:
            probe = open_store(args.target, **probe_opts)
        try:
            check_layout(probe, args.layout, args.target)
        finally:
            probe.close()
    if local:  # the fast tier's URL and profile fail here too (rank 0's root stands for all)
        first_root = local.replace("{rank}", "0")
        if args.emulate_local:
            open_store(emulation_url(first_root), profile=args.emulate_local).close()
        else:
            open_store(first_root).close()
    kwargs: dict[str, Any] = {
        "iterations": args.iterations,
        "out_dir": args.out,
        "label": args.label,
        "pause": args.pause,
        "inflight": args.inflight,
        "read": not args.no_read,
        "cache": args.cache,
        "keep": args.keep,
        "share_root": args.share_root,
        "key_layout": args.key_layout,
        "emulate": args.emulate,
        "site": args.site,
        "store_options": opts,
        "config": {"command": "sweep" if sweep_mode else "run"},
        "layout": args.layout,
    }
    sweep: dict[str, Any] | None = None
    if sweep_mode:
        kwargs.pop("pause")
        sweep = {
            "streams": parse_list(args.streams, field="--streams"),
            "part_sizes": parse_list(args.part_size, field="--part-size", sizes=True),
            "warn": False,  # the caller shows RunJob.warnings before starting
        }
    launched = dist.under_mpi() or dist.under_torchrun()
    comm = dist.detect() if launched else None
    ranks = comm.size if comm is not None else (args.ranks or 1)
    if replicas and comm is None:
        raise errors.InvalidArgumentError(
            f"--replicas {replicas}: peer copies go to other nodes over the job's MPI or "
            "torch.distributed process group; start the run under mpiexec, srun or torchrun "
            f"on more than {replicas} node(s) (--ranks runs local processes of one node)"
        )
    if comm is not None and args.ranks not in (None, comm.size):
        raise errors.InvalidArgumentError(
            f"--ranks {args.ranks} disagrees with the launcher's {comm.size} ranks; drop --ranks "
            "under mpiexec/srun/torchrun"
        )
    if ranks > plan.ranks:
        raise errors.InvalidArgumentError(
            f"--ranks {ranks} exceeds the {plan.ranks} GPUs of {plan.preset.name}'s layout; use "
            f"at most {plan.ranks} or more --gpus"
        )
    per_rank0 = int(plan.rank_bytes[writer_ranks(plan, ranks)[0]].sum())
    passes = args.iterations * (1 if args.no_read else 2)
    mode = "sweep" if sweep_mode else "run"
    tiers: Tiers | None = None
    if local:
        from ckptio.tierbench import Tiers, check_tiered

        check_tiered(plan, ranks, comm)
        mode = "tiered"
        # save, drain, two restores (three with peer copies)
        passes = args.iterations * (2 if args.no_read else 5 if replicas else 4)
        tiers = Tiers(local, emulate_local=args.emulate_local, replicas=replicas, lose=lose)
    points: list[SweepPoint] = []
    if sweep is not None:
        points = sweep_points(
            plan, ranks, sweep["streams"], sweep["part_sizes"], inflight=args.inflight
        )
        passes *= len(points)
    settings = RunSettings(options=kwargs.pop("store_options"), **kwargs)
    return RunJob(
        args.target,
        plan,
        mode,
        tiers,
        comm,
        ranks,
        per_rank0 * passes,
        points,
        settings,
        sweep,
    )


def execute_run(
    job: RunJob,
    *,
    progress: Callable[[int], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> RunSummary:
    """Run a prepared job on its ranks; ``progress`` and ``say`` are called in rank 0's
    process (:data:`ckptio.runner.PROGRESS_HOOK`, :data:`~ckptio.runner.SAY_HOOK`). Returns
    this rank's summary."""
    from ckptio import dist, runner, tierbench

    runner.PROGRESS_HOOK, runner.SAY_HOOK = (progress, say) if job.is_root else (None, None)
    main: Callable[..., RunSummary] = runner.rank_main
    args: tuple[Any, ...] = (job.target, job.plan, job.settings, job.sweep)
    if job.mode == "tiered":
        main, args = tierbench.rank_main, (job.target, job.plan, job.settings, job.tiers)
    try:
        if job.comm is not None:
            summary = main(job.comm, *args)
        else:
            summary = dist.run_local(job.ranks, main, *args)
    finally:
        runner.PROGRESS_HOOK = runner.SAY_HOOK = None
    if job.comm is not None:  # on success only: a last barrier after a failure could hang
        dist.shutdown()
    return summary


# -- the commands ----------------------------------------------------------------------------


def declare_plan(p: argparse.ArgumentParser) -> None:
    add_workload_arguments(p)
    p.add_argument(
        "--part-size", type=size_arg(), help="request size to count requests at (default 8MiB)"
    )
    add_format(p)


def run_plan(args: argparse.Namespace) -> int:
    from ckptio.cli.console import print_plan
    from ckptio.workload import DEFAULT_PART_SIZE

    out = printer(args)
    plan = plan_from_args(args)
    part = parse_size(args.part_size, field="--part-size") if args.part_size else DEFAULT_PART_SIZE
    summary = plan.summary(part)
    if out.fmt == "json":
        out.json(summary)
    else:
        print_plan(summary, out)
    return 0


def declare_run(p: argparse.ArgumentParser, *, sweep_mode: bool = False) -> None:
    add_run_arguments(p, sweep_mode=sweep_mode)
    add_format(p)


def run_run(args: argparse.Namespace, *, sweep_mode: bool = False) -> int:
    from ckptio.cli.console import Progress, print_run, warn

    out = printer(args)
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


def run_sweep(args: argparse.Namespace) -> int:
    return run_run(args, sweep_mode=True)


def declare_sweep(p: argparse.ArgumentParser) -> None:
    declare_run(p, sweep_mode=True)


#: command -> (declare its arguments, run it)
COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {
    "plan": (declare_plan, run_plan),
    "run": (declare_run, run_run),
    "sweep": (declare_sweep, run_sweep),
}
