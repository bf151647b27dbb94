"""N-N vs N-1: the same checkpoint saved by every rank as file-per-shard and as one shared
file, timed. Run under MPI, one line of JSON per layout from rank 0::

    mpiexec -n 4 python benchmarks/pfs_layouts.py pfs:///mnt/gv0/bench --mib-per-rank 64

Save time is the maximum over ranks from a barrier to the commit (what a training job waits
for); load time the same for every rank reading the whole checkpoint back (page cache not
dropped: on one machine this measures the write path honestly, the read path optimistically).
GB/s = 1e9 bytes/s of tensor data (all ranks). Measured, not modelled.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import ckptio
from ckptio.checkpoint import LAYOUTS, delete_step
from ckptio.dist import detect
from ckptio.registry import open_store


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("--mib-per-rank", type=int, default=64)
    ap.add_argument(
        "--layouts", nargs="+", default=["file-per-shard", "shared-file"], choices=LAYOUTS
    )
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    comm = detect()
    rows = args.mib_per_rank * 2**20 // (4 * 1024)
    rng = np.random.default_rng(comm.rank)
    local = rng.random((rows, 1024), dtype=np.float32)  # incompressible
    state = {"w": ckptio.Shard(local, (rows * comm.size, 1024), (rows * comm.rank, 0))}
    total = local.nbytes * comm.size
    base, _, query = args.url.partition("?")
    for layout in args.layouts:
        url = f"{base}/{layout}" + (f"?{query}" if query else "")
        saves, loads = [], []
        for i in range(args.repeat):
            comm.barrier()
            t0 = time.perf_counter()
            ckptio.save(state, url, step=i, comm=comm, layout=layout)
            times = comm.gather(time.perf_counter() - t0)
            saves.append(max(times) if times else 0.0)
            comm.barrier()
            t0 = time.perf_counter()
            back = ckptio.load(
                url, step=i, select={"w": np.s_[rows * comm.rank : rows * (comm.rank + 1)]}
            )
            dt = time.perf_counter() - t0
            assert np.array_equal(back["w"], local)
            times = comm.gather(dt)
            loads.append(max(times) if times else 0.0)
            comm.barrier()
            if comm.rank == 0:
                delete_step(open_store(url), i)
        if comm.rank == 0:
            best_s, best_l = min(saves), min(loads)
            print(
                json.dumps(
                    {
                        "url": args.url,
                        "layout": layout,
                        "ranks": comm.size,
                        "bytes": total,
                        "save_s": round(best_s, 4),
                        "save_GBps": round(total / best_s / 1e9, 3),
                        "load_own_slice_s": round(best_l, 4),
                        "load_GBps": round(total / best_l / 1e9, 3),
                        "repeat": args.repeat,
                        "measured": True,
                    }
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
