"""How long ``ckptio simulate`` takes, and how much memory: GPT-3 175B on 1,536 GPUs (2.4 TB,
every request; issue 35 asks <= 60 s on a 2-core machine) and Llama 3 405B on 16,384 GPUs
(<= 10 min), each with the command's defaults (save and restore, 10 replications, lognormal
latency: nothing aggregated), repeated in fresh processes to show the spread.

    .venv/bin/python benchmarks/simulate.py --repeat 3 --out benchmarks/results/simulate.json

Each case runs ``python -m ckptio.cli simulate ... --json`` in a new process; its wall time is
measured here, its peak RSS is the child's own (``ru_maxrss``, read in the child after the
command) and its worker processes' largest (``simulate`` runs a large job's replications in a
process per core), and its CPU time (user + system) is the child's and its workers': on a
machine shared with other work the wall time depends on the load beside it, the CPU time
much less. The spread over repeats is part of the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CASES: dict[str, list[str]] = {
    "gpt3-175b-1536-cloud-s3": ["--preset", "gpt3-175b", "--gpus", "1536", "--target", "cloud-s3"],
    "gpt3-175b-1536-abci-lustre": [
        "--preset",
        "gpt3-175b",
        "--gpus",
        "1536",
        "--target",
        "abci-lustre",
    ],
    "llama3-405b-16384-cloud-s3": [
        "--preset",
        "llama3-405b",
        "--gpus",
        "16384",
        "--target",
        "cloud-s3",
    ],
    "llama3-405b-16384-abci-lustre": [
        "--preset",
        "llama3-405b",
        "--gpus",
        "16384",
        "--target",
        "abci-lustre",
    ],
}
"""Name -> arguments of ``ckptio simulate`` (the rest are its defaults)."""

CHILD = (
    "import resource, sys\n"
    "from ckptio.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "u = resource.getrusage(resource.RUSAGE_SELF)\n"
    "c = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "sys.stderr.write('peak_rss_kib=%d worker_peak_rss_kib=%d cpu_seconds=%.3f\\n' % (\n"
    "    u.ru_maxrss, c.ru_maxrss, u.ru_utime + u.ru_stime + c.ru_utime + c.ru_stime))\n"
    "sys.exit(code)\n"
)


def run_case(args: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", CHILD, "simulate", *args, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"ckptio simulate {' '.join(args)} failed: {r.stderr[-2000:]}")
    facts = dict(
        kv.split("=")
        for line in r.stderr.splitlines()
        if line.startswith("peak_rss_kib=")
        for kv in line.split()
    )
    (sim,) = json.loads(r.stdout)["simulations"]
    return {
        "wall_seconds": wall,
        "cpu_seconds": float(facts["cpu_seconds"]),
        "simulation_seconds": sim["wall_seconds"],
        "peak_rss_bytes": int(facts["peak_rss_kib"]) * 1024,
        "worker_peak_rss_bytes": int(facts["worker_peak_rss_kib"]) * 1024,
        "load_average_after": os.getloadavg(),
        "replications": sim["replications"],
        "simulated_nodes": sim["simulated_nodes"],
        "aggregated": sim["aggregated"],
        "requests": {k: v["requests"] for k, v in sim["phases"].items()},
        "attempts": {k: v["attempts"] for k, v in sim["phases"].items()},
        "phases": {
            k: {
                key: v[key]
                for key in (
                    "p50_seconds",
                    "p99_seconds",
                    "modelled_seconds",
                    "failed",
                    "bound_by",
                    "throttled",
                )
            }
            for k, v in sim["phases"].items()
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="fresh processes per case")
    p.add_argument("--only", nargs="*", choices=sorted(CASES), help="cases to run (default all)")
    p.add_argument("--out", help="write the samples as JSON here")
    a = p.parse_args()
    results: dict[str, Any] = {
        "utc": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "load_average_at_start": os.getloadavg(),
        },
        "note": "a shared machine: other work ran beside these processes (see the load average)",
        "cases": {},
    }
    for name in a.only or list(CASES):
        samples = []
        for i in range(a.repeat):
            s = run_case(CASES[name])
            samples.append(s)
            print(
                f"{name} {i + 1}/{a.repeat}: {s['wall_seconds']:.1f} s wall, "
                f"{s['cpu_seconds']:.1f} s CPU, "
                f"{s['peak_rss_bytes'] / 2**20:.0f} MiB peak, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        walls = [s["wall_seconds"] for s in samples]
        cpus = [s["cpu_seconds"] for s in samples]
        results["cases"][name] = {
            "args": CASES[name],
            "samples": samples,
            "cpu_seconds_median": statistics.median(cpus),
            "cpu_seconds_min": min(cpus),
            "cpu_seconds_max": max(cpus),
            "wall_seconds_median": statistics.median(walls),
            "wall_seconds_min": min(walls),
            "wall_seconds_max": max(walls),
            "peak_rss_bytes_max": max(s["peak_rss_bytes"] for s in samples),
        }
        print(
            f"{name}: median {statistics.median(walls):.1f} s wall (min {min(walls):.1f}, "
            f"max {max(walls):.1f}), {statistics.median(cpus):.1f} s CPU (min {min(cpus):.1f}, "
            f"max {max(cpus):.1f}) over {len(walls)}",
            flush=True,
        )
    results["machine"]["load_average_at_end"] = os.getloadavg()
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
