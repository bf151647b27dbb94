"""Tiered saves on this machine: a local-disk fast tier drained to an emulated durable tier.

Each round, on the same state (``--size`` of random float32 in 8 tensors), in rotating order:

- ``local-save``: a plain blocking save to a local directory;
- ``tiered-save``: ``Checkpointer(durable, local=<local dir>)``'s save (blocks for the local
  tier only), then its drain to ``durable`` (timed by the drain itself: copy and commit);
- ``direct-save``: a plain blocking save of the same state straight to ``durable``;
- ``local-load`` / ``tiered-load``: a plain load of the local save, and the tiered restore
  (from its fast tier).

``durable`` defaults to ``emulate+file://…?profile=cloud-s3`` (the emulate backend imposing the
cloud-s3 profile's latency and bandwidth on a local directory). The page cache is not dropped
(both local cases and both loads see it alike). Prints the medians and the issue's ratios:
tiered save blocks <= 1.1x a local save; drain throughput >= 0.9x a direct save's; tiered
restore >= 0.9x a plain local load's speed.

    .venv/bin/python benchmarks/tiered.py --size 256MiB --rounds 5 --dir /var/tmp/ckptio-tiered
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import ckptio
from ckptio.units import parse_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp/ckptio-tiered")
    ap.add_argument(
        "--durable",
        default="emulate+file://{dir}/durable-{case}-{round}?profile=cloud-s3",
        help="durable URL template ({dir}, {case}, {round})",
    )
    ap.add_argument("--out", help="also write the samples and medians to this JSON file")
    args = ap.parse_args()
    load_before = os.getloadavg()
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    n = parse_size(args.size) // 4
    rng = np.random.default_rng(0)
    state = {f"t{i}": rng.standard_normal(n // 8, dtype=np.float32) for i in range(8)}
    nbytes = sum(a.nbytes for a in state.values())
    samples: dict[str, list[float]] = {
        k: []
        for k in ("local-save", "tiered-save", "drain", "direct-save", "local-load", "tiered-load")
    }
    drain_GBps: list[float] = []
    direct_GBps: list[float] = []
    for r in range(args.rounds):

        def durable(case: str, r: int = r) -> str:
            return args.durable.format(dir=base, case=case, round=r)

        def local_save(r: int = r) -> None:
            t = time.perf_counter()
            ckptio.save(state, f"file://{base}/local-{r}", step=1)
            samples["local-save"].append(time.perf_counter() - t)
            t = time.perf_counter()
            ckptio.load(f"file://{base}/local-{r}")
            samples["local-load"].append(time.perf_counter() - t)

        def tiered_save(r: int = r) -> None:
            with ckptio.Checkpointer(durable("tiered"), local=f"file://{base}/fast-{r}") as ck:
                t = time.perf_counter()
                h = ck.save(state, 1)
                samples["tiered-save"].append(time.perf_counter() - t)
                d = h.wait_drain()
                assert d is not None and d.status == "durable", d
                samples["drain"].append(d.seconds)
                drain_GBps.append(nbytes / d.seconds / 1e9)
                t = time.perf_counter()
                ck.load()
                samples["tiered-load"].append(time.perf_counter() - t)

        def direct_save(r: int = r) -> None:
            t = time.perf_counter()
            ckptio.save(state, durable("direct"), step=1)
            s = time.perf_counter() - t
            samples["direct-save"].append(s)
            direct_GBps.append(nbytes / s / 1e9)

        cases = [local_save, tiered_save, direct_save]
        for case in cases[r % 3 :] + cases[: r % 3]:
            case()
        print(
            f"round {r}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in samples.items()), flush=True
        )
    med = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {
        "tiered_save_vs_local_save": med["tiered-save"] / med["local-save"],
        "drain_vs_direct_throughput": statistics.median(drain_GBps)
        / statistics.median(direct_GBps),
        "tiered_load_vs_local_load_speed": med["local-load"] / med["tiered-load"],
    }
    doc = {
        "bytes": nbytes,
        "rounds": args.rounds,
        "median_seconds": med,
        "drain_GBps": statistics.median(drain_GBps),
        "direct_GBps": statistics.median(direct_GBps),
        "ratios": ratios,
    }
    print(json.dumps(doc, indent=1))
    if args.out:
        from ckptio.results import machine_info, versions

        # the machine is shared: its load (1, 5, 15 min averages) is part of the figures
        doc.update(
            command=" ".join(["benchmarks/tiered.py", *sys.argv[1:]]),
            loadavg_before=load_before,
            loadavg_after=os.getloadavg(),
            machine=machine_info(str(base)),
            versions=versions(),
            samples=samples,
        )
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
