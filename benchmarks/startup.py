"""Start-up time of ckptio in fresh processes, side by side with ``python -c "import numpy"``.

Each round runs every case once as a new process of this interpreter (``sys.executable``, with
this process's environment, so ``PYTHONPATH`` decides which ckptio is measured), in an order
that rotates from round to round; the table gives the median wall time of each case and its
difference to numpy's own import, against issue 20's targets, and the median CPU time (user +
system) of the process, steadier than wall time on a busy machine:

- ``ckptio --help`` and ``ckptio backends``: within 0.15 s of importing numpy
- a first save + load of a small float32 state: within 0.2 s of importing numpy

Bytecode is cached in a temporary ``PYTHONPYCACHEPREFIX`` (written by one unmeasured warm-up
round), as an installed package has it, whatever ``PYTHONDONTWRITEBYTECODE`` says and without
writing into the source tree. Results go to ``benchmarks/results/startup-<date>.json``.

    python benchmarks/startup.py [--rounds 15] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

SAVE_LOAD = """
import sys
import numpy as np
import ckptio
state = {"w": np.arange(4096, dtype=np.float32).reshape(64, 64), "b": np.ones(64, np.float32), "step": 7}
ckptio.save(state, sys.argv[1], step=1)
back = ckptio.load(sys.argv[1])
assert np.array_equal(back["w"], state["w"]) and back["step"] == 7
"""

CASES: dict[str, list[str]] = {
    "import numpy": ["-c", "import numpy"],
    "ckptio --help": ["-m", "ckptio.cli", "--help"],
    "ckptio backends": ["-m", "ckptio.cli", "backends"],
    "first save+load (float32)": ["-c", SAVE_LOAD, "{dir}"],
}
TARGETS = {"ckptio --help": 0.15, "ckptio backends": 0.15, "first save+load (float32)": 0.2}
BASELINE = "import numpy"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(args: list[str], env: dict[str, str], workdir: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh process running ``args``."""
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        argv = [sys.executable, *(a.replace("{dir}", d) for a in args)]
        cpu0, t0 = _children_cpu(), time.perf_counter()
        proc = subprocess.run(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
        )
        seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        sys.exit(
            f"{' '.join(argv[:4])} failed ({proc.returncode}):\n{proc.stderr.decode()[-2000:]}"
        )
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="measured rounds (default 15)")
    parser.add_argument(
        "--out", type=Path, help="result file (default benchmarks/results/startup-<date>.json)"
    )
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="ckptio-startup-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pycache")
    where = subprocess.run(
        [sys.executable, "-c", "import ckptio; print(ckptio.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(
        f"interpreter {sys.executable}; ckptio from {where}; {args.rounds} rounds", file=sys.stderr
    )
    names = list(CASES)
    samples: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    try:
        for n in names:  # warm-up: writes the bytecode cache
            run_once(CASES[n], env, workdir)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                wall, used = run_once(CASES[n], env, workdir)
                samples[n].append(wall)
                cpu[n].append(used)
            print(
                f"round {r + 1}: " + ", ".join(f"{n} {samples[n][-1]:.3f}" for n in names),
                file=sys.stderr,
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    medians = {n: statistics.median(s) for n, s in samples.items()}
    cpu_medians = {n: statistics.median(s) for n, s in cpu.items()}
    base, cpu_base = medians[BASELINE], cpu_medians[BASELINE]
    rows = []
    print(
        f"\n| command | wall s (median) | minus `{BASELINE}` | target | met | CPU s (median) | minus "
        f"`{BASELINE}` |\n|---|---:|---:|---:|---|---:|---:|"
    )
    for n in names:
        delta, cpu_delta = medians[n] - base, cpu_medians[n] - cpu_base
        target = TARGETS.get(n)
        met = None if target is None else delta <= target
        rows.append(
            {
                "case": n,
                "median_s": medians[n],
                "minus_numpy_s": delta,
                "target_s": target,
                "met": met,
                "cpu_median_s": cpu_medians[n],
                "cpu_minus_numpy_s": cpu_delta,
                "samples_s": samples[n],
                "cpu_samples_s": cpu[n],
            }
        )
        first = n == BASELINE
        print(
            f"| {n} | {medians[n]:.3f} | {'' if first else f'{delta:+.3f}'} | "
            f"{'' if target is None else f'<= {target}'} | {'' if met is None else ('yes' if met else 'NO')} | "
            f"{cpu_medians[n]:.3f} | {'' if first else f'{cpu_delta:+.3f}'} |"
        )
    now = datetime.now(UTC)
    out = args.out or Path(__file__).resolve().parent / "results" / f"startup-{now:%Y-%m-%d}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "startup",
                "utc": now.isoformat(timespec="seconds"),
                "rounds": args.rounds,
                "python": sys.version.split()[0],
                "executable": sys.executable,
                "ckptio": where,
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "loadavg": os.getloadavg(),
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
