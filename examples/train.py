"""Train a small model on the CPU, checkpointing asynchronously through ckptio, and resume
exactly after being killed.

    python examples/train.py --url file:///tmp/ckptio-train --steps 300 --every 25

Every ``--every`` steps the full training state — model, optimizer, RNG state and data
position — is saved with ``Checkpointer(async_save=True)``: ``save`` returns after a memory
snapshot and the write + commit run in the background while training goes on. Each save
prints how long it blocked the training loop next to what a synchronous save of the same
state costs, measured right before it (a blocking save to ``<url>-sync``; ``--no-sync-probe``
skips it).

Kill it at any moment (``kill -9``) and run the same command again: it resumes from the
newest committed checkpoint and produces the same losses, bit for bit, as a run that was
never interrupted (``--log`` writes one JSON line per step; a loss is stored as
``float.hex`` so the comparison is exact). A save cut short by the kill published no
manifest, so it does not exist; the one before it is intact.

Determinism: one intra-op thread, deterministic algorithms, and the batch for step ``s``
generated from ``(seed, s)`` — so the data position is the step itself, and dropout draws
from torch's global generator, whose state is checkpointed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import ckptio.torch as ct


def build(hidden: int, layers: int) -> torch.nn.Module:
    blocks: list[torch.nn.Module] = [torch.nn.Linear(64, hidden), torch.nn.GELU()]
    for _ in range(layers - 1):
        blocks += [torch.nn.Linear(hidden, hidden), torch.nn.GELU(), torch.nn.Dropout(0.1)]
    blocks.append(torch.nn.Linear(hidden, 10))
    return torch.nn.Sequential(*blocks)


def batch(seed: int, step: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step``: a function of (seed, step) only, so resuming needs no iterator."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, 64, generator=g)
    y = (x[:, :10].sum(dim=1) * 2).long().clamp(0, 9)
    return x, y


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--url", default="file:///tmp/ckptio-train", help="checkpoint root (any ckptio URL)"
    )
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=25, help="checkpoint every N steps")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-last", type=int, default=2)
    ap.add_argument(
        "--log", type=Path, help="append one JSON line per step: step, loss (float.hex)"
    )
    ap.add_argument(
        "--no-sync-probe", action="store_true", help="do not measure a synchronous save"
    )
    ap.add_argument(
        "--snapshot",
        choices=("copy", "fork"),
        default="copy",
        help="how async saves snapshot the state: a memory copy, or a forked "
        "copy-on-write writer (file:// and pfs:// only)",
    )
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    model = build(args.hidden, args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    nparams = sum(p.numel() for p in model.parameters())

    ck = ct.Checkpointer(
        args.url, async_save=True, keep_last=args.keep_last, snapshot=args.snapshot
    )
    probe = (
        None if args.no_sync_probe else ct.Checkpointer(args.url.rstrip("/") + "-sync", keep_last=1)
    )
    start = 0
    latest = ck.latest()
    if latest is not None:
        state = ck.load(latest)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        start = state["data"]["position"]
        print(f"resumed from step {start} ({args.url})", flush=True)
    print(
        f"model: {nparams:,} parameters; state with AdamW ~{nparams * 12 / 1e6:.1f} MB", flush=True
    )

    log = args.log.open("a") if args.log else None
    blocked: list[float] = []
    sync_costs: list[float] = []
    pending = None
    model.train()
    for step in range(start + 1, args.steps + 1):
        x, y = batch(args.seed, step)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        value = loss.item()
        if log:
            log.write(json.dumps({"step": step, "loss": value.hex()}) + "\n")
            log.flush()
        if step % 10 == 0:
            print(f"step {step} loss {value:.6f}", flush=True)
        if step % args.every == 0 or step == args.steps:
            state = {
                "model": model.state_dict(),
                "optim": opt.state_dict(),
                "rng": {
                    "torch": torch.get_rng_state(),
                    "numpy": np.random.get_state(),
                    "python": random.getstate(),
                },
                "data": {"position": step, "seed": args.seed},
            }
            if pending is not None and pending.done():
                r = pending.wait()
                print(
                    f"  (step {r.step} committed in the background: write + commit {r.seconds * 1e3:.1f} ms)",
                    flush=True,
                )
            sync_ms = None
            if probe is not None:
                t0 = time.perf_counter()
                probe.save(state, step=step)
                sync_ms = (time.perf_counter() - t0) * 1e3
                sync_costs.append(sync_ms)
            pending = ck.save(state, step=step)
            blocked.append(pending.blocking_seconds * 1e3)
            also = (
                f"; a synchronous save of the same state: {sync_ms:.1f} ms"
                if sync_ms is not None
                else ""
            )
            print(
                f"save step {step}: blocked {pending.blocking_seconds * 1e3:.1f} ms (async){also}",
                flush=True,
            )
    ck.close()  # waits for the save in flight
    if probe is not None:
        probe.close()
    if log:
        log.close()
    if blocked:
        line = f"summary: median blocking time of an async save {statistics.median(blocked):.1f} ms over {len(blocked)} saves"
        if sync_costs:
            line += f"; median synchronous save {statistics.median(sync_costs):.1f} ms"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
