"""Run under mpiexec -n 4: every rank saves its shard with each layout, then every rank
loads the whole checkpoint back and checks it; rank 0 verifies every CRC.

    mpiexec -n 4 python tests/mpi/pfs_layouts.py URL [LAYOUT ...]

URL may carry store options (``pfs:///mnt/gv0/run?fanout=1``); each layout saves under
``URL-base/<layout>``. Prints ``OK <layout> rank <r>`` per rank and layout.
"""

from __future__ import annotations

import sys

import numpy as np

import ckptio
from ckptio.dist import detect

ROWS, COLS = 96, 1000  # per rank: 96 x 1000 float32 = 375 KiB, several chunks of 64 KiB


def expected(world: int) -> np.ndarray:
    return np.arange(world * ROWS * COLS, dtype=np.float32).reshape(world * ROWS, COLS) / 7


def main() -> int:
    url, layouts = sys.argv[1], sys.argv[2:] or ["file-per-shard", "shared-file"]
    base, _, query = url.partition("?")
    comm = detect()
    r, n = comm.rank, comm.size
    full = expected(n)
    state = {
        "model": {"w": ckptio.Shard(full[r * ROWS : (r + 1) * ROWS], full.shape, (r * ROWS, 0))},
        "bias": np.linspace(0, 1, 333, dtype=np.float64),  # replicated: written once
        "step": 7,
    }
    for layout in layouts:
        target = f"{base}/{layout}" + (f"?{query}" if query else "")
        # small chunks and objects: ~6 objects per rank (many files to spread over bricks)
        ckptio.save(
            state, target, step=7, comm=comm, layout=layout, chunk_size=65536, max_object_size=65536
        )
        comm.barrier()
        back = ckptio.load(target)
        assert back["step"] == 7
        assert np.array_equal(back["model"]["w"], full), f"{layout}: w differs on rank {r}"
        assert np.array_equal(back["bias"], state["bias"])
        mine = ckptio.load(target, select={"model/w": np.s_[r * ROWS : (r + 1) * ROWS]})
        assert np.array_equal(mine["model"]["w"], full[r * ROWS : (r + 1) * ROWS])
        if r == 0:
            problems = ckptio.verify(target)
            assert problems == [], problems
        comm.barrier()
        print(f"OK {layout} rank {r}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
