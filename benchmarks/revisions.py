"""Two revisions of ckptio side by side: the same ``run.py`` cases, alternating round by round.

A change that must not slow anything (a new step in the save path, say) is judged here: the
base revision is checked out into a temporary git worktree, and each round runs one round of
each case under the base and under the working tree, in alternating order, so both see the same
disk and the same neighbours. Prints the per-case medians, the new/base ratio of medians and
the median of the per-round ratios, and writes a JSON document.

    python benchmarks/revisions.py --base c668293 --only ckptio-sync,manifest-100k \\
        --size 1GiB --rounds 7 --dir /var/tmp/ckb
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def checkout(rev: str, where: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(where), rev], check=True
    )
    (where / "ckptio" / "backends").symlink_to(where / "backends")
    for so in (REPO / "ckptio").glob("_memcopy*.so"):  # the same compiled copy for both
        shutil.copy(so, where / "ckptio" / so.name)
    return where


def one_round(tree: Path, args: argparse.Namespace, out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "run.py"),
        "--rounds",
        "1",
        "--only",
        args.only,
        "--size",
        args.size,
        "--dir",
        args.dir,
        "--json",
        str(out),
        "--markdown",
        "",
        "--settle",
        str(args.settle),
    ]
    subprocess.run(cmd, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
    doc = json.loads(out.read_text())
    return {c["case"]: c["median_seconds"] for c in doc["cases"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="git revision to compare the working tree with")
    p.add_argument("--only", default="ckptio-sync,manifest-100k", help="run.py cases")
    p.add_argument("--size", default="1GiB", help="bytes of state (run.py --size)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument(
        "--dir", default=tempfile.gettempdir(), help="scratch directory on the disk under test"
    )
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--json", default="", help="write the result document here")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds: must be >= 1")
    tmp = Path(tempfile.mkdtemp(prefix="ckptio-revs-"))
    base = checkout(args.base, tmp / "base")
    trees = {"base": base, "new": REPO}
    samples: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        for r in range(args.rounds):
            order = ["base", "new"] if r % 2 == 0 else ["new", "base"]
            for name in order:
                got = one_round(trees[name], args, tmp / f"{name}.json")
                for case, seconds in got.items():
                    samples[name].setdefault(case, []).append(seconds)
            print(
                f"round {r + 1}: "
                + ", ".join(
                    f"{c} {samples['new'][c][-1] / samples['base'][c][-1]:.3f}x"
                    for c in samples["new"]
                ),
                flush=True,
            )
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False
        )
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    print(f"\n{'case':<16} {'base s':>9} {'new s':>9} {'ratio':>7} {'per-round':>10}")
    for case in samples["new"]:
        b, n = samples["base"][case], samples["new"][case]
        ratio = statistics.median(n) / statistics.median(b)
        per_round = statistics.median(x / y for x, y in zip(n, b, strict=True))
        rows.append(
            {
                "case": case,
                "base_seconds": b,
                "new_seconds": n,
                "ratio_of_medians": ratio,
                "median_per_round_ratio": per_round,
            }
        )
        print(
            f"{case:<16} {statistics.median(b):9.3f} {statistics.median(n):9.3f} {ratio:7.3f} {per_round:10.3f}"
        )
    if args.json:
        doc = {
            "benchmark": "revisions",
            "started_utc": started,
            "base": args.base,
            "new": subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
            ).stdout.strip(),
            "command": " ".join(sys.argv),
            "config": vars(args),
            "cases": rows,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
