"""The suite on the namespace cluster (ckptio.testing.cluster): the same workload on 1, 2 and 3
writing nodes (2 ranks each, launched by srun) to each shared target — CephFS, RGW and
GlusterFS — then the report: each 3-node run's per-node table and the model, fitted from the
1-node runs, against the measurement at 2 and 3 nodes.

    sudo .venv/bin/python benchmarks/cluster.py --out benchmarks/results/cluster-$(date +%F)

Needs root and the packages of scripts/install-system-deps.sh. Every figure is measured on
ONE machine: the "nodes" are namespaces sharing its CPU cores, its memory and the one Ceph
OSD / GlusterFS bricks on its disk, so what a second node adds here is clients and ranks,
not hardware — which is what the scaling check is meant to show (a limit all nodes share).
Results go to ``OUT/results`` (Parquet + JSON, mergeable), the report to ``OUT/report``, and
the two tables to stdout and ``OUT/tables.md``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ckptio.testing.cluster import start_cluster
from ckptio.testing.cluster.suite import SHARED_TARGETS, run_suite


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default="ckptio-cluster-bench")
    p.add_argument("--size", default="96MiB", help="checkpoint size of every run")
    p.add_argument("--gpus", type=int, default=12, help="logical ranks (12: 6, 3, 2 per process)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--nodes", default="1,2,3")
    p.add_argument("--targets", default=",".join(SHARED_TARGETS))

    p.add_argument(
        "--report-only", action="store_true", help="build the report from OUT/results, run nothing"
    )
    args = p.parse_args()
    out = Path(args.out).resolve()
    results = out / "results"
    results.mkdir(parents=True, exist_ok=True)
    counts = [int(n) for n in args.nodes.split(",")]
    targets = args.targets.split(",")
    if not args.report_only:
        measure(args, out, results, counts, targets)
    return report(out, results, counts)


def measure(
    args: argparse.Namespace, out: Path, results: Path, counts: list[int], targets: list[str]
) -> None:
    t0 = time.time()
    cluster = start_cluster(max(counts), gluster="glusterfs" in targets)
    print(f"cluster {cluster.id} up in {time.time() - t0:.1f} s", flush=True)
    try:
        t1 = time.time()
        runs = run_suite(
            cluster,
            results,
            targets=targets,
            nodes=counts,
            gpus=args.gpus,
            size=args.size,
            iterations=args.iterations,
            timeout=1800,
        )
        print(f"{len(runs)} runs in {time.time() - t1:.1f} s", flush=True)
    finally:
        problems = cluster.down()
        print(f"cluster down{': ' + '; '.join(problems) if problems else ''}", flush=True)


def report(out: Path, results: Path, counts: list[int]) -> int:
    from ckptio.report import build_report

    rep = build_report([str(results)], str(out / "report"), title="ckptio on the namespace cluster")
    lines = []
    for sec in rep["nodes"]:
        rows = sec["rows"]
        if sec["title"] == "Per node":  # the runs on the most nodes (report.md has every run)
            rows = [r for r in rows if r[1] == str(max(counts))]
        lines += [f"## {sec['title']}", "", sec["intro"], ""]
        lines.append("| " + " | ".join(sec["header"]) + " |")
        lines.append("|" + "---|" * len(sec["header"]))
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        lines.append("")
    text = "\n".join(lines)
    (out / "tables.md").write_text(text + "\n")
    print(text)
    print(f"report: {out / 'report' / 'report.md'}; load while it ran: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
