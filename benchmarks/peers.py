"""Peer copies of the fast tier on the namespace cluster (ckptio.testing.cluster, 3 nodes):
how long a save blocks the training step with ``replicas=1`` against without, and the
restore after a node is lost, from a peer copy against from the durable tier (CephFS)
against from every node's own fast tier (nothing lost).

    sudo .venv/bin/python benchmarks/peers.py --out benchmarks/results/peers-$(date +%F).json

Each scenario is a srun job of 3 nodes x ``--per-node`` ranks (MPI), ``--mib`` MiB of
random float32 per rank; a restore's time is the job's (a barrier before and after
``load``, the slowest rank). Node loss: :meth:`Cluster.kill_node` (every process of the node
killed, its local disk gone) and a replacement started with an empty disk; the durable case
restores with ``replicas=0`` (the tiered engine reads the lost node's shards from the durable
tier), the peer case with ``replicas=1`` (from the copies on the next node). Every restore is
checked bit-identical, and its path per rank recorded, with where each rank's restore spent
its time (:attr:`~ckptio.checkpoint.peers.RestoreRecord.seconds`: plan, transfer, read).
``--baseline DIR`` also runs each restore with the ckptio of another source tree
(``PYTHONPATH=DIR``; ``<case>_baseline``), right after this tree's, to compare two versions
under the same load.
Measured on ONE machine: the nodes are namespaces sharing its cores, memory and the one Ceph OSD on its disk, and the machine is
shared with other work (its load average is recorded): the figures compare the paths under
the same conditions, they are not a network's or a disk's speeds.

``--fan-in`` measures instead the restore of the replaced nodes when one survivor serves
one (``ckptio run --replicas 1 --lose 1``: node2 lost, node0 sends) and when it serves two
(``--replicas 2 --lose 2``: node1 and node2 lost, node0 sends to both), alternating,
``--repeat`` runs of ``--steps`` iterations each; the loss is ``ckptio run``'s (emulated:
the lost nodes' fast roots emptied, see ``ckptio.tierbench``). Per case: the round's restore
time (the slowest replaced rank), the busiest sender's link (its bytes over that time), the
fan-in the rows show; and the model's ``f * node / link`` against the rounds at fan-in 2
(``ckptio.calibration.check_fan_in``).

    sudo .venv/bin/python benchmarks/peers.py --fan-in --per-node 2 \
        --out benchmarks/results/peers-fanin-$(date +%F).json

``worker`` is the srun side (not for direct use)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any


def box(step: int, rank: int, n: int) -> Any:
    import numpy as np

    return np.random.default_rng([step, rank]).standard_normal(n, dtype=np.float32)


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    import ckptio
    from ckptio.dist import detect

    comm = detect()
    rank, size = comm.rank, comm.size
    n = args.mib << 18
    out: dict[str, Any] = {"rank": rank, "host": socket.gethostname()}
    with ckptio.Checkpointer(
        args.durable,
        local=args.local,
        comm=comm,
        replicas=args.k,
        persist_every=1,
        keep_last_local=2,
        max_object_size="16MiB",
    ) as ck:
        if args.mode == "save":
            blocking = []
            for step in range(1, args.steps + 1):
                state = {"w": ckptio.Shard(box(step, rank, n), (n * size,), (n * rank,))}
                comm.barrier()  # every rank's step starts together, as training's would
                blocking.append(ck.save(state, step).blocking_seconds)
                ck.wait()  # copies and drain done before the next step: each save alone
            out["blocking"] = blocking
        else:
            comm.barrier()
            t0 = time.perf_counter()
            got = ck.load(select={"w": np.s_[n * rank : n * (rank + 1)]})
            comm.barrier()
            out["seconds"] = time.perf_counter() - t0
            out["identical"] = bool(np.array_equal(got["w"], box(args.steps, rank, n)))
            rec = ck.engine.last_restore
            out["path"] = rec.path if rec is not None else "local-or-durable"
            out["stages"] = rec.seconds if rec is not None else {}  # plan, transfer, read
    os.write(1, (json.dumps(out) + "\n").encode())


def srun(
    cluster: Any, per_node: int, argv: list[str], env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    proc = cluster.srun(
        ["-N3", f"--ntasks-per-node={per_node}", "--mpi=pmix", sys.executable, __file__, *argv],
        timeout=600,
        env=env,
    )
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from ckptio.testing.cluster import start_cluster

    cluster = start_cluster(3)
    try:
        run = f"peers-bench-{uuid.uuid4().hex[:6]}"
        out: dict[str, Any] = {"config": vars(args).copy(), "load_before": os.getloadavg()}

        def job(mode: str, k: int, name: str, code: str = "") -> list[dict[str, Any]]:
            durable = f"pfs://{cluster.cephfs}/{run}-{name}"
            local = f"file://{cluster.local}/{run}-{name}/{{rank}}"
            a = ["worker", mode, durable, local, str(k), str(args.mib), str(args.steps)]
            return srun(cluster, args.per_node, a, {"PYTHONPATH": code} if code else None)

        # the save's blocking time, each save alone (its copies and drain done before the next)
        for k in (0, 1):
            rows = job("save", k, f"save-k{k}")
            out[f"save_blocking_k{k}"] = spread([b for r in rows for b in r["blocking"][1:]])
        # restores: one saved run (replicas=1, every step drained), restored again and again
        job("save", 1, "restore")
        # peer first (node2 killed; its restore puts the step back on its disk), then its own
        # fast tier on every node (nothing lost), then durable (node2 killed again)
        # (--baseline: each restore with another ckptio source tree too, in turn with this one)
        names = ("peer", "own_fast_tier", "durable")
        suffixes = ("", "_baseline") if args.baseline else ("",)
        cases: dict[str, list[float]] = {f"{c}{x}": [] for c in names for x in suffixes}
        paths: dict[str, list[dict[int, str]]] = {c: [] for c in cases}
        stages: dict[str, list[dict[int, dict[str, float]]]] = {c: [] for c in cases}
        for _ in range(args.repeat):
            for case in cases:
                if not case.startswith("own_fast_tier"):
                    cluster.kill_node("node2")
                    cluster.start_node("node2")
                k = 0 if case.startswith("durable") else 1
                code = args.baseline if case.endswith("_baseline") else ""
                rows = job("load", k, "restore", code)
                assert all(r["identical"] for r in rows), rows
                cases[case].append(max(r["seconds"] for r in rows))
                paths[case].append({r["rank"]: r["path"] for r in rows})
                stages[case].append({r["rank"]: r["stages"] for r in rows})
        out["restore_seconds"] = {c: spread(v) for c, v in cases.items()}
        out["restore_paths"] = paths
        out["restore_stages"] = stages  # per rank: seconds in plan, transfer, read
        out["load_after"] = os.getloadavg()
        return out
    finally:
        cluster.down()


def measure_fan_in(args: argparse.Namespace) -> dict[str, Any]:
    """Restores at fan-in 1 and 2 with ``ckptio run --replicas K --lose N`` (see the module
    docstring)."""
    from ckptio.calibration import check_fan_in, fit_peer_link, peer_rounds
    from ckptio.results import read_results
    from ckptio.testing.cluster import start_cluster

    cluster = start_cluster(3)
    tmp = Path(cluster.local).parent / f"fanin-{uuid.uuid4().hex[:6]}"  # the login node's
    try:
        run = f"fanin-bench-{uuid.uuid4().hex[:6]}"
        out: dict[str, Any] = {"config": vars(args).copy(), "load_before": os.getloadavg()}
        cases = {"fan_in_1": (1, 1), "fan_in_2": (2, 2)}
        dirs: dict[str, list[str]] = {c: [] for c in cases}
        commands: dict[str, list[str]] = {}
        for i in range(args.repeat):
            for case, (k, lose) in cases.items():
                name = f"{run}-{case}-{i}"
                argv = [
                    "-N3", f"--ntasks-per-node={args.per_node}", "--mpi=pmix", sys.executable,
                    "-m", "ckptio.cli", "run", f"pfs://{cluster.cephfs}/{name}", "--local",
                    f"file://{cluster.local}/{name}/{{rank}}", "--replicas", str(k), "--lose",
                    str(lose), "--preset", "llama3-8b", "--total-size",
                    f"{args.mib * 3 * args.per_node}MiB", "--iterations", str(args.steps),
                    "--out", str(tmp / name),
                ]  # fmt: skip
                commands[case] = ["srun", *argv]
                cluster.srun(argv, timeout=600)
                dirs[case].append(str(tmp / name))
        out["commands"] = {c: " ".join(a) for c, a in commands.items()}
        every = read_results([d for ds in dirs.values() for d in ds]).phases
        for case, ds in dirs.items():
            phases = read_results(ds).phases
            rounds = peer_rounds(phases)
            link = fit_peer_link(phases)
            assert link is not None
            out[case] = {
                "fan_in": sorted({r.fan_in for r in rounds}),
                "restore_seconds": spread([r.seconds for r in rounds]),
                "sender_link_Bps": spread([r.link for r in rounds]),
                "replaced_node_bytes": spread([r.node_bytes for r in rounds]),
                "fit": {
                    "bandwidth_Bps": link.bandwidth,
                    "interval": [link.interval.low, link.interval.high] if link.interval else None,
                    "warmup_rounds_left_out": link.warmup,
                    "source": link.source(),
                },
            }
        check = check_fan_in(every)
        out["model_check"] = (
            {
                "ratio": check.ratio,
                "interval": [check.interval.low, check.interval.high] if check.interval else None,
                "predicted_seconds": check.predicted,
                "measured_seconds": check.measured,
                "text": check.text(),
            }
            if check is not None
            else None
        )
        out["load_after"] = os.getloadavg()
        return out
    finally:
        cluster.down()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    for name in ("mode", "durable", "local"):
        w.add_argument(name)
    for name in ("k", "mib", "steps"):
        w.add_argument(name, type=int)
    p.add_argument("--mib", type=int, default=64, help="MiB per rank")
    p.add_argument("--per-node", type=int, default=1, help="ranks per node")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default="")
    p.add_argument(
        "--fan-in",
        action="store_true",
        help="measure restores at fan-in 1 (--replicas 1 --lose 1) against fan-in 2 "
        "(--replicas 2 --lose 2) with ckptio run instead",
    )
    p.add_argument(
        "--baseline",
        default="",
        help="a ckptio source tree (its top directory, e.g. `git archive` of an older "
        "commit): each restore measured with it as well, in turn with this one's "
        "(restore_seconds.<case>_baseline)",
    )
    args = p.parse_args()
    if args.cmd == "worker":
        worker(args)
        return 0
    result = measure_fan_in(args) if args.fan_in else measure(args)
    result["machine"] = {"host": socket.gethostname(), "cpus": os.cpu_count()}
    result["utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
