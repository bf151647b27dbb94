"""Run under mpiexec: `save URL` (every rank saves its shards) or `load URL` (every rank loads its
own slice of each tensor, for however many ranks there are now, and checks it)."""

import sys

import numpy as np

import ckptio
from ckptio.dist import detect

ROWS, COLS = 1000, 48


def global_tensors() -> dict[str, np.ndarray]:
    w = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    return {"w_rows": w, "w_cols": w * 2, "bias": np.linspace(0, 1, 37)}


def split(n: int, parts: int, i: int) -> tuple[int, int]:
    base, extra = divmod(n, parts)
    lo = i * base + min(i, extra)
    return lo, lo + base + (i < extra)


def main() -> None:
    mode, url = sys.argv[1], sys.argv[2]
    comm = detect()
    g = global_tensors()
    r0, r1 = split(ROWS, comm.size, comm.rank)
    c0, c1 = split(COLS, comm.size, comm.rank)
    if mode == "save":
        state = {
            "model": {
                # row-sharded (like ZeRO / DP shards) and column-sharded (like tensor parallel)
                "w_rows": ckptio.Shard(g["w_rows"][r0:r1], (ROWS, COLS), (r0, 0)),
                "w_cols": ckptio.Shard(
                    np.ascontiguousarray(g["w_cols"][:, c0:c1]), (ROWS, COLS), (0, c0)
                ),
                "bias": g["bias"],  # replicated: written once
            },
            "step": 11,
        }
        handle = ckptio.save(state, url, step=11, comm=comm, metadata={"saved_by": comm.size})
        print(f"rank {comm.rank} wrote {handle.wait().nbytes} bytes", flush=True)
    else:
        sel = {"model/w_rows": np.s_[r0:r1], "model/w_cols": np.s_[:, c0:c1]}
        state = ckptio.load(url, select=sel)
        assert np.array_equal(state["model"]["w_rows"], g["w_rows"][r0:r1])
        assert np.array_equal(state["model"]["w_cols"], g["w_cols"][:, c0:c1])
        assert np.array_equal(state["model"]["bias"], g["bias"])
        assert state["step"] == 11
        reader = ckptio.open_checkpoint(url)
        assert reader.metadata == {"saved_by": 4}
        print(f"rank {comm.rank}/{comm.size} loaded rows {r0}:{r1} cols {c0}:{c1} OK", flush=True)


if __name__ == "__main__":
    main()
