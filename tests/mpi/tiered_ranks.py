"""Run under mpiexec: ``save DURABLE LOCAL [async]`` (steps 1..4 on the fast tier, every 2nd
drained), ``load DURABLE LOCAL STEP`` (every rank restores its own rows and the replicated
tensor, and checks them and the step) or ``resume DURABLE LOCAL STEP`` (load as ``load``
does, then save the next step with new contents, as a resumed run does, and load that).
LOCAL may hold ``{rank}`` (a fast root per rank)."""

import json
import sys

import numpy as np

import ckptio
from ckptio.dist import detect

ROWS, COLS = 600, 40


def state(step: int, rank: int, size: int) -> dict:
    lo, hi = rank * ROWS // size, (rank + 1) * ROWS // size
    w = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS) + step
    return {
        "model": {
            "w": ckptio.Shard(w[lo:hi].copy(), (ROWS, COLS), (lo, 0)),
            "bias": np.linspace(0, 1, 37) + step,
        },  # replicated: rank 0 writes it
        "step": step,
    }


def main() -> None:
    mode, durable, local = sys.argv[1:4]
    comm = detect()
    opts = {"chunk_size": 16 * 1024, "max_object_size": 64 * 1024}
    with ckptio.Checkpointer(
        durable,
        local=local,
        comm=comm,
        persist_every=2,
        keep_last_local=3,
        keep_last=3,
        async_save="async" in sys.argv[4:],
        **opts,
    ) as ck:
        if mode == "save":
            for s in range(1, 5):
                ck.save(state(s, comm.rank, comm.size), s)
            ck.wait()
            print(json.dumps({"rank": comm.rank, **ck.tiers()}), flush=True)
            return
        expect = int(sys.argv[4])
        check(ck, expect, state(expect, comm.rank, comm.size))
        print(f"rank {comm.rank} restored step {expect} OK", flush=True)
        if mode == "resume":
            new = state(expect + 100, comm.rank, comm.size)
            new["step"] = expect + 1
            ck.save(new, expect + 1)
            ck.wait()
            check(ck, expect + 1, new)
            print(f"rank {comm.rank} resumed and saved step {expect + 1} OK", flush=True)


def check(ck: ckptio.Checkpointer, expect: int, want: dict) -> None:
    rank, size = ck.comm.rank, ck.comm.size
    lo, hi = rank * ROWS // size, (rank + 1) * ROWS // size
    got = ck.load(select={"model/w": np.s_[lo:hi]})
    assert got["step"] == expect, (got["step"], expect)
    assert np.array_equal(got["model"]["w"], want["model"]["w"].array)
    assert np.array_equal(got["model"]["bias"], want["model"]["bias"])


if __name__ == "__main__":
    main()
