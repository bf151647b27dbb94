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
import sys
import time
import uuid
from pathlib import Path

from ckptio.testing.cluster import start_cluster

TARGETS = ("cephfs", "rgw", "glusterfs")


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default="ckptio-cluster-bench")
    p.add_argument("--size", default="96MiB", help="checkpoint size of every run")
    p.add_argument("--gpus", type=int, default=12, help="logical ranks (12: 6, 3, 2 per process)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--nodes", default="1,2,3")
    p.add_argument("--targets", default=",".join(TARGETS))
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
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        cluster.run(
            cluster.nodes[0],
            [
                sys.executable,
                "-c",
                f"import boto3; boto3.client('s3').create_bucket(Bucket={bucket!r})",
            ],
        )
        for target in targets:
            for n in counts:
                run = f"{target}-{n}n-{uuid.uuid4().hex[:6]}"
                url = {
                    "cephfs": f"pfs://{cluster.cephfs}/{run}",
                    "glusterfs": f"pfs://{cluster.gluster}/{run}",
                    "rgw": f"s3://{bucket}/{run}",
                }[target]
                start = time.time()
                cluster.srun(
                    [
                        f"-N{n}",
                        "--ntasks-per-node=2",
                        "--mpi=pmix",
                        sys.executable,
                        "-m",
                        "ckptio.cli",
                        "run",
                        url,
                        "--preset",
                        "llama3-8b",
                        "--gpus",
                        str(args.gpus),
                        "--total-size",
                        args.size,
                        "--iterations",
                        str(args.iterations),
                        "--label",
                        target,
                        "--out",
                        str(results),
                    ],
                    cwd=str(out),
                    timeout=1800,
                )
                print(f"{target} on {n} node(s): {time.time() - start:.1f} s", flush=True)
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
