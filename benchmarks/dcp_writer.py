#!/usr/bin/env python
"""``dcp.save`` through ckptio's StorageWriter against DCP's own FileSystemWriter, on the same
state in the same directory: alternating order, several rounds, medians and their ratio.

::

    python benchmarks/dcp_writer.py --size 1GiB --rounds 5 --dir /var/tmp/ckptio-dcp-bench

Cases (both durable: every file fsynced, the metadata/manifest committed last by rename):

- ``dcp-filesystem``: ``FileSystemWriter(dir, thread_count=4, sync_files=True)`` — DCP's
  default format: each tensor ``torch.save``d into 4 files per rank, pickled ``.metadata``.
- ``dcp-ckptio``: ``ckptio.torch.StorageWriter("file://dir", step=N)`` with its defaults —
  raw tensor bytes in shard objects, CRC32C per chunk, JSON manifest.
- with ``--load``: the cold loads of both (page cache dropped before each; how it was
  dropped is printed), ``FileSystemReader`` vs ``ckptio.torch.StorageReader`` (CRC-checked).

The state: ``--tensors`` float32 tensors of random (incompressible) bits, sizes varied around
the mean, totalling ``--size``; one process (``no_dist=True``). The order of the cases
alternates between rounds so neither always runs on a warmer machine. Results are printed
and written as JSON (``--json``). Times are wall seconds; GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed.checkpoint as dcp
from _common import CacheDropper, gb_per_s, machine_info, median, remove, timed, tree_bytes

from ckptio.torch import StorageReader, StorageWriter
from ckptio.units import parse_size

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def make_state(total: int, count: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``count`` float32 tensors of random bits, sizes spread 0.5x..1.5x the mean."""
    g = torch.Generator().manual_seed(seed)
    mean = total // count // 4
    weights = torch.linspace(0.5, 1.5, count)
    sizes = [int(mean * float(w)) for w in weights]
    sizes[-1] += total // 4 - sum(sizes)
    state = {}
    for i, n in enumerate(sizes):
        cols = 1024 if n >= 1024 else 1
        rows = n // cols
        state[f"layer{i:03d}.weight"] = torch.randint(
            -(2**31), 2**31 - 1, (rows, cols), dtype=torch.int32, generator=g
        ).view(torch.float32)
    return state


def zeros_like(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in state.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", default="1GiB", help="bytes of tensor data (default 1GiB)")
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp/ckptio-dcp-bench")
    ap.add_argument("--load", action="store_true", help="also time cold loads")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    total = parse_size(args.size, field="--size")
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    state = make_state(total, args.tensors)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    dropper = CacheDropper(str(base))
    print(
        f"state: {len(state)} float32 tensors, {nbytes / 1e9:.3f} GB; {args.rounds} rounds in {base}; "
        f"cache drop: {dropper.method}",
        flush=True,
    )

    samples: dict[str, list[float]] = {}
    stored: dict[str, int] = {}

    def run_case(name: str, rnd: int) -> None:
        target = base / f"{name}-{rnd}"
        remove(str(target))
        os.sync()  # nobody else's dirty pages in the timed part
        if name == "dcp-filesystem":
            writer: Any = dcp.FileSystemWriter(str(target), thread_count=4, sync_files=True)
        else:
            writer = StorageWriter(f"file://{target}", step=rnd)
        with timed() as t:
            dcp.save(state, storage_writer=writer, no_dist=True)
        samples.setdefault(f"{name}:save", []).append(t["seconds"])
        stored[name] = tree_bytes(str(target))
        if args.load:
            dropper.drop()
            out = zeros_like(state)
            reader: Any = (
                dcp.FileSystemReader(str(target))
                if name == "dcp-filesystem"
                else StorageReader(f"file://{target}", step=rnd)
            )
            with timed() as t:
                dcp.load(out, storage_reader=reader, no_dist=True)
            samples.setdefault(f"{name}:load", []).append(t["seconds"])
            bad = [
                k
                for k in state
                if not torch.equal(out[k].view(torch.int32), state[k].view(torch.int32))
            ]
            if bad:
                raise SystemExit(f"{name}: loaded data differs in {bad[:3]}")
        remove(str(target))

    for rnd in range(args.rounds):
        order = (
            ["dcp-ckptio", "dcp-filesystem"] if rnd % 2 == 0 else ["dcp-filesystem", "dcp-ckptio"]
        )
        for name in order:
            run_case(name, rnd)
        line = ", ".join(f"{k} {v[-1]:.3f} s" for k, v in samples.items())
        print(f"round {rnd + 1}/{args.rounds}: {line}", flush=True)

    print()
    print(f"{'case':24} {'median s':>9} {'GB/s':>7} {'min s':>7} {'max s':>7} {'stored bytes':>14}")
    summary: dict[str, Any] = {}
    for key, xs in samples.items():
        name = key.split(":")[0]
        m = median(xs)
        summary[key] = {
            "median_s": m,
            "GBps": gb_per_s(nbytes, m),
            "samples_s": xs,
            "stored_bytes": stored[name],
        }
        print(
            f"{key:24} {m:9.3f} {gb_per_s(nbytes, m):7.3f} {min(xs):7.3f} {max(xs):7.3f} {stored[name]:14,}"
        )
    ratios = {}
    for op in ("save", "load"):
        a, b = summary.get(f"dcp-filesystem:{op}"), summary.get(f"dcp-ckptio:{op}")
        if a and b:
            ratios[op] = a["median_s"] / b["median_s"]
            print(
                f"{op}: FileSystemWriter/Reader time / ckptio time = {ratios[op]:.2f} "
                f"(>1: ckptio faster)"
            )
    if args.json:
        doc = {
            "benchmark": "dcp_writer",
            "machine": machine_info(str(base)),
            "config": {
                "size_bytes": nbytes,
                "tensors": len(state),
                "rounds": args.rounds,
                "cache_drop": dropper.method,
            },
            "results": summary,
            "ratios_filesystem_over_ckptio": ratios,
        }
        args.json.write_text(json.dumps(doc, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
