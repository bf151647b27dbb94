"""Under srun on the test cluster (ckptio.testing.cluster), 3 nodes x 2 ranks.

``save DURABLE LOCAL``: steps 1 and 2 of a tiered checkpoint (``LOCAL`` holds ``{rank}``: a
fast root per rank on its node's own disk); with ``persist_every=2`` step 1 is drained to the
durable tier and step 2 stays on the fast tier only.
``restore DURABLE LOCAL``: a fresh Checkpointer restores each rank's box.

Each rank prints one JSON line: its host, the SHA-256 of its box of each step it saved (or of
what it restored, with the step), and the data bytes it read from each tier."""

import hashlib
import json
import os
import socket
import sys

import numpy as np

import ckptio
from ckptio.dist import detect

N = 1 << 20  # float32 elements per rank: 4 MiB, several objects


def box(step: int, rank: int) -> np.ndarray:
    return np.random.default_rng([step, rank]).standard_normal(N, dtype=np.float32)


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def data_bytes(store) -> int:
    return sum(e.nbytes for e in store.trace.events() if e.op == "get" and "/data/" in e.key)


def main() -> None:
    mode, durable, local = sys.argv[1:4]
    comm = detect()
    rank, size = comm.rank, comm.size
    out: dict = {"rank": rank, "host": socket.gethostname()}
    with ckptio.Checkpointer(
        durable,
        local=local,
        comm=comm,
        persist_every=2,
        keep_last_local=2,
        max_object_size="1MiB",
        chunk_size="1MiB",
    ) as ck:
        if mode == "save":
            for step in (1, 2):
                state = {"w": ckptio.Shard(box(step, rank), (N * size,), (N * rank,)), "step": step}
                ck.save(state, step)
            ck.wait()
            out["tiers"] = ck.tiers()
            out["sha"] = {str(s): digest(box(s, rank)) for s in (1, 2)}
        else:
            got = ck.load(select={"w": np.s_[N * rank : N * (rank + 1)]})
            out.update(
                step=int(got["step"]),
                sha=digest(got["w"]),
                fast_bytes=data_bytes(ck.engine.fast.store),
                durable_bytes=data_bytes(ck.store),
            )
    os.write(1, (json.dumps(out) + "\n").encode())  # one write: ranks share srun's stdout


if __name__ == "__main__":
    main()
