"""A training job under srun on the test cluster (3 nodes x 2 ranks, MPI), killed and
resumed by tests/test_cluster_peers.py.

``peer_train.py DURABLE LOCAL K STEPS``: a tiered Checkpointer (a fast root per rank on its
node's own disk, ``replicas=K``, every 3rd save drained to DURABLE); restores the newest
checkpoint if there is one, checks it bit for bit against what that step saved, then saves
steps after it, up to STEPS in all, until it is killed.

Each event is one JSON line (one write: ranks share srun's stdout): ``restored`` (the step,
whether every array is bit-identical, the restore's path and bytes), ``saved`` (the save
returned), ``replicated`` (the step's peer copies committed), ``durable`` (rank 0: the step's
drain committed), ``done``."""

import hashlib
import json
import os
import socket
import sys

import numpy as np

import ckptio
from ckptio.dist import detect

N = 1 << 19  # float32 elements per rank: 2 MiB, two objects


def box(step: int, rank: int) -> np.ndarray:
    return np.random.default_rng([step, rank]).standard_normal(N, dtype=np.float32)


def emit(**doc) -> None:
    os.write(1, (json.dumps(doc) + "\n").encode())


def main() -> None:
    durable, local, k, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    comm = detect()
    rank, size = comm.rank, comm.size
    host = socket.gethostname()
    with ckptio.Checkpointer(
        durable,
        local=local,
        comm=comm,
        replicas=k,
        persist_every=3,
        keep_last_local=2,
        keep_last=2,
        max_object_size="1MiB",
        chunk_size="1MiB",
    ) as ck:
        start = 0
        try:
            got = ck.load(select={"w": np.s_[N * rank : N * (rank + 1)]})
        except ckptio.errors.NotFoundError as err:  # the first start: nothing saved yet
            if not str(err).startswith("no checkpoint survives"):
                raise
            got = None
        if got is not None:
            start = int(got["step"])
            rec = ck.engine.last_restore
            emit(
                event="restored",
                rank=rank,
                host=host,
                step=start,
                identical=bool(np.array_equal(got["w"], box(start, rank))),
                sha=hashlib.sha256(got["w"].tobytes()).hexdigest()[:16],
                **{"path": rec.path, "nbytes": rec.nbytes, "sources": rec.sources},
            )
        for step in range(start + 1, steps + 1):
            state = {"w": ckptio.Shard(box(step, rank), (N * size,), (N * rank,)), "step": step}
            h = ck.save(state, step)
            emit(event="saved", rank=rank, host=host, step=step, blocking=h.blocking_seconds)
            h.peer.add_done_callback(
                lambda f, s=step: emit(
                    event="replicated", rank=rank, step=s, status=f.result().status
                )
            )
            if h.drain is not None and rank == 0:
                h.drain.future.add_done_callback(
                    lambda f, s=step: emit(
                        event="durable", rank=rank, step=s, status=f.result().status
                    )
                )
        ck.wait()
    emit(event="done", rank=rank)


if __name__ == "__main__":
    main()
