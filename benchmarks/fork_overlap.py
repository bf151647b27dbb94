#!/usr/bin/env python
"""What a training step pays when it overlaps a ``snapshot="fork"`` save: write one byte of
every 4 KiB page of the state at several moments after ``save`` returned, and after the save
ended. Each moment uses a freshly allocated state (a page written once is private again).

::

    python benchmarks/fork_overlap.py --size 1GiB --dir /var/tmp/ckptio-fork

Pages the child has not written yet cost a fault and a 4 KiB copy; pages it has written are
given back by the child, and cost a fault only; after the child ends, every page costs a
fault only (one per 2 MiB on numpy's transparent huge pages). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as cm

import ckptio
from ckptio.units import parse_size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1GiB")
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default="/var/tmp/ckptio-fork")
    a = p.parse_args(argv)
    n = parse_size(a.size, field="--size") // 4 // a.tensors
    rng = np.random.default_rng(0)

    def fresh() -> dict[str, np.ndarray]:
        return {f"w{i}": rng.random(n, dtype=np.float32) for i in range(a.tensors)}

    shutil.rmtree(a.dir, ignore_errors=True)
    results: dict[str, list[float]] = {}
    step = 0
    with ckptio.Checkpointer(
        f"file://{a.dir}", async_save=True, snapshot="fork", keep_last=1
    ) as ck:
        st = fresh()
        step += 1
        save_seconds = ck.save(st, step).wait().seconds  # the write's length, to place the touches
        results["no snapshot"] = [cm.touch_pages(fresh()) for _ in range(a.rounds)]
        for frac in (0.0, 0.25, 0.5, 0.75):
            label = f"{frac:.0%} into the write"
            for _ in range(a.rounds):
                st = fresh()
                step += 1
                handle = ck.save(st, step)
                time.sleep(frac * save_seconds)
                results.setdefault(label, []).append(cm.touch_pages(st))
                handle.wait()
        for _ in range(a.rounds):
            st = fresh()
            step += 1
            ck.save(st, step).wait()
            results.setdefault("after the write", []).append(cm.touch_pages(st))
    shutil.rmtree(a.dir, ignore_errors=True)
    size = n * 4 * a.tensors
    print(
        f"state {size / 2**30:.2f} GiB in {a.tensors} tensors; one fork save takes {save_seconds:.2f} s; "
        f"median of {a.rounds}; {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    )
    print("| writing every page of the state | seconds |\n|---|---:|")
    for label, xs in results.items():
        print(f"| {label} | {cm.median(xs):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
