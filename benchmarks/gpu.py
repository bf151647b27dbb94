"""Saving a state that lives on the GPU: ckptio (sync and async) against ``torch.save`` and
DCP (``dcp.save`` / ``dcp.async_save`` with ``FileSystemWriter``), on one local directory.

The state is ``--tensors`` CUDA tensors (float32 and bfloat16 alternately) of ``--size`` bytes
in all. Each round runs every case once, in the same order; each case's files are removed
after it. Per case: ``blocking`` is how long the call held the caller (for a sync save the
whole save), ``total`` until the checkpoint is durable and committed; GB/s = 1e9 bytes/s of
the state over ``total``. The async cases time the second save of a pair, as most saves of a
training job are (the first allocates what later ones reuse); the first's blocking is kept as
``first_blocking``. Every write is fsynced before its clock stops. Once, after the rounds,
ckptio's last checkpoint is loaded into CUDA tensors and compared with the state bit for bit.

Prints a table of medians and writes ``benchmarks/results/gpu-<date>.json``. Without a CUDA
device it says so and exits with status 0 having measured nothing (``scripts/gpu-check.sh``
fails then); ``--device cpu`` runs the same cases on CPU tensors, to check the script itself
where there is no GPU. ::

    python benchmarks/gpu.py [--size 4GiB] [--tensors 32] [--rounds 3] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _common as cm


def _no_gpu() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return None


def make_state(nbytes: int, tensors: int, device: str) -> dict[str, Any]:
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    state = {}
    for i in range(tensors):
        dtype = torch.bfloat16 if i % 2 else torch.float32
        n = nbytes // tensors // (2 if dtype == torch.bfloat16 else 4)
        state[f"layer{i:03d}"] = torch.randn(n, device=device, generator=g, dtype=torch.float32).to(
            dtype
        )
    if device == "cuda":
        torch.cuda.synchronize()
    return state


def case_torch_save(state: dict[str, Any], path: str) -> dict[str, float]:
    import torch

    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    cm.fsync_path(os.path.dirname(path))
    total = time.perf_counter() - t0
    return {"blocking": total, "total": total}


def case_dcp_save(state: dict[str, Any], path: str) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    t0 = time.perf_counter()
    dcp.save(
        state,
        storage_writer=dcp.FileSystemWriter(path, thread_count=4, sync_files=True),
        no_dist=True,
    )
    total = time.perf_counter() - t0
    return {"blocking": total, "total": total}


def case_dcp_async(state: dict[str, Any], path: str) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    def save(sub: str) -> tuple[float, float]:
        t0 = time.perf_counter()
        ret = dcp.async_save(
            state,
            storage_writer=dcp.FileSystemWriter(
                os.path.join(path, sub), thread_count=4, sync_files=True
            ),
            no_dist=True,
        )
        blocking = time.perf_counter() - t0
        getattr(ret, "upload_completion", ret).result()  # a Future, or an AsyncSaveResponse
        return blocking, time.perf_counter() - t0

    first, _ = save("1")
    blocking, total = save("2")
    return {"blocking": blocking, "total": total, "first_blocking": first}


def case_ckptio_sync(state: dict[str, Any], path: str) -> dict[str, float]:
    import ckptio.torch as ct

    t0 = time.perf_counter()
    ct.save(state, path, step=1).wait()
    total = time.perf_counter() - t0
    return {"blocking": total, "total": total}


def case_ckptio_async(state: dict[str, Any], path: str) -> dict[str, float]:
    import ckptio.torch as ct

    with ct.Checkpointer(path, async_save=True) as ck:
        first = ck.save(state, step=1)
        first.wait()
        t0 = time.perf_counter()
        handle = ck.save(state, step=2)
        handle.wait()
        total = time.perf_counter() - t0
    return {
        "blocking": handle.blocking_seconds,
        "total": total,
        "first_blocking": first.blocking_seconds,
    }


CASES: dict[str, Callable[[dict[str, Any], str], dict[str, float]]] = {
    "torch.save": case_torch_save,
    "dcp.save": case_dcp_save,
    "dcp.async_save": case_dcp_async,
    "ckptio-sync": case_ckptio_sync,
    "ckptio-async": case_ckptio_async,
}


def verify(state: dict[str, Any], path: str) -> bool:
    """ckptio's checkpoint at ``path``, loaded into CUDA tensors, equals ``state`` bit for bit."""
    import torch

    import ckptio.torch as ct

    ct.save(state, path, step=1)
    into = {k: torch.empty_like(v) for k, v in state.items()}
    ct.load(path, into=into)
    return all(
        torch.equal(
            into[k].view(torch.int16) if v.dtype == torch.bfloat16 else into[k],
            v.view(torch.int16) if v.dtype == torch.bfloat16 else v,
        )
        for k, v in state.items()
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size", default="4GiB", help="bytes of the state on the GPU (default 4GiB)"
    )
    parser.add_argument("--tensors", type=int, default=32, help="tensors in the state (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument(
        "--dir", default=None, help="where the checkpoints are written (default: the temp dir)"
    )
    parser.add_argument(
        "--out", type=Path, help="result file (default benchmarks/results/gpu-<date>.json)"
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: the same cases on CPU tensors, to check this script without a GPU",
    )
    args = parser.parse_args()
    problem = _no_gpu() if args.device == "cuda" else None
    if problem is not None:
        print(f"benchmarks/gpu.py: {problem}; nothing measured.", file=sys.stderr)
        return 0

    import torch

    from ckptio.units import parse_size

    # DCP without a process group says so at every call; a single process is what is meant
    warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)

    nbytes = parse_size(args.size, field="--size")
    state = make_state(nbytes, args.tensors, args.device)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "the CPU"
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    work = tempfile.mkdtemp(prefix="ckptio-gpu-", dir=args.dir)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in CASES}
    try:
        for r in range(args.rounds):
            for name, case in CASES.items():
                path = os.path.join(work, name.replace(".", "-"))
                samples[name].append(case(state, path + (".pt" if name == "torch.save" else "")))
                cm.remove(path + (".pt" if name == "torch.save" else ""))
                s = samples[name][-1]
                print(
                    f"round {r + 1} {name}: blocking {s['blocking']:.3f} s, total {s['total']:.3f} s, "
                    f"{nbytes / s['total'] / 1e9:.2f} GB/s",
                    file=sys.stderr,
                )
        verified = verify(state, os.path.join(work, "verify"))
        info = cm.machine_info(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = []
    print(
        f"\nstate: {nbytes / 2**30:.2f} GiB in {args.tensors} {args.device} tensors on {device_name}; "
        f"{args.rounds} rounds; ckptio round trip bit-exact: {verified}\n"
    )
    print("| case | blocking s | total s | GB/s | first blocking s |\n|---|---:|---:|---:|---:|")
    for name, ss in samples.items():
        med = {k: statistics.median(s[k] for s in ss) for k in ss[0]}
        rows.append(
            {
                "case": name,
                **{f"{k}_s": v for k, v in med.items()},
                "gb_per_s": nbytes / med["total"] / 1e9,
                "samples": ss,
            }
        )
        first = f"{med['first_blocking']:.3f}" if "first_blocking" in med else ""
        print(
            f"| {name} | {med['blocking']:.3f} | {med['total']:.3f} | {nbytes / med['total'] / 1e9:.2f} | {first} |"
        )
    now = datetime.now(UTC)
    out = args.out or Path(__file__).resolve().parent / "results" / f"gpu-{now:%Y-%m-%d}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    info.update(device=device_name, torch=torch.__version__, cuda=torch.version.cuda)
    out.write_text(
        json.dumps(
            {
                "benchmark": "gpu",
                "utc": now.isoformat(timespec="seconds"),
                "bytes": nbytes,
                "tensors": args.tensors,
                "rounds": args.rounds,
                "verified": verified,
                "machine": info,
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {out}")
    return 0 if verified else 1


if __name__ == "__main__":
    sys.exit(main())
