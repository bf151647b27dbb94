"""Run under mpiexec, ranks of one machine standing for ``NODES`` nodes (``$CKPTIO_NODE``:
rank r is on node ``n{r * NODES // size}``), each rank with its own fast root (LOCAL holds
``{rank}``).

``save DURABLE LOCAL K NODES``: steps 1..4 with ``replicas=K``, every 2nd drained (1 and 3
durable, 2 and 4 on the fast tier and its peer copies only); prints each rank's tiers, its
peer results and how long each save blocked.
``save-each DURABLE LOCAL K NODES``: steps 1..4, only step 1 drained, each save's peer
copies waited for before the next save (the rounds and the fast tier's retention in one
order); prints as ``save``.
``load DURABLE LOCAL K NODES``: a fresh Checkpointer restores each rank's rows and the
replicated tensor; prints the step, whether every array is bit-identical to what was saved,
the restore's record (its path) and the objects of the step it read from its own fast root.
``load-into ...``: as ``load``, into the caller's arrays (a ``Shard`` of the rows, the
replicated tensor), and whether they were filled in place."""

import json
import os
import sys

import numpy as np

import ckptio
from ckptio.dist import detect

ROWS, COLS = 600, 40


def state(step: int, rank: int, size: int) -> dict:
    lo, hi = rank * ROWS // size, (rank + 1) * ROWS // size
    w = np.random.default_rng(step).standard_normal((ROWS, COLS), dtype=np.float32)
    return {
        "model": {
            "w": ckptio.Shard(w[lo:hi].copy(), (ROWS, COLS), (lo, 0)),
            "bias": np.linspace(0, 1, 37) + step,
        },  # replicated: rank 0 writes it
        "step": step,
    }


def main() -> None:
    mode, durable, local, k, nodes = sys.argv[1:6]
    comm = detect()
    os.environ["CKPTIO_NODE"] = f"n{comm.rank * int(nodes) // comm.size}"
    with ckptio.Checkpointer(
        durable,
        local=local,
        comm=comm,
        replicas=int(k),
        persist_every=4 if mode == "save-each" else 2,
        keep_last_local=2,
        chunk_size=16 * 1024,
        max_object_size=32 * 1024,
    ) as ck:
        out: dict = {"rank": comm.rank, "node": os.environ["CKPTIO_NODE"]}
        if mode in ("save", "save-each"):
            handles = []
            for s in range(1, 5):
                handles.append(ck.save(state(s, comm.rank, comm.size), s))
                if mode == "save-each":
                    handles[-1].wait_peers()
            ck.wait()
            out["tiers"] = ck.tiers()
            out["peers"] = [h.wait_peers().status for h in handles]
            out["blocking"] = [h.blocking_seconds for h in handles]
        else:
            lo, hi = comm.rank * ROWS // comm.size, (comm.rank + 1) * ROWS // comm.size
            if mode == "load-into":  # the caller's arrays, filled in place
                w = np.full((hi - lo, COLS), np.nan, dtype=np.float32)
                bias = np.full(37, np.nan)
                into = {"model": {"w": ckptio.Shard(w, (ROWS, COLS), (lo, 0)), "bias": bias}}
                got = ck.load(into=into)
                got_w = got["model"]["w"]
                got_w = got_w.array if isinstance(got_w, ckptio.Shard) else got_w
                out["in_place"] = got_w is w and got["model"]["bias"] is bias
            else:
                got = ck.load(select={"model/w": np.s_[lo:hi]})
                got_w = got["model"]["w"]
            s = int(got["step"])
            want = np.random.default_rng(s).standard_normal((ROWS, COLS), dtype=np.float32)
            out["step"] = s
            out["identical"] = bool(
                np.array_equal(got_w, want[lo:hi])
                and np.array_equal(got["model"]["bias"], np.linspace(0, 1, 37) + s)
            )
            out["restore"] = ck.engine.last_restore.as_dict()
            # the objects of the step this rank read back from its own fast root
            out["fast_reads"] = sorted(
                {
                    e.key
                    for e in ck.engine.fast.store.trace.events()
                    if e.op == "get" and e.key.startswith(f"step-{s:010d}/data/")
                }
            )
        os.write(1, (json.dumps(out) + "\n").encode())


if __name__ == "__main__":
    main()
