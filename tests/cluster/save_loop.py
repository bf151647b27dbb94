"""Under srun on two nodes of the test cluster: save steps 1..STEPS of a sharded state to URL
(each rank a box); after each save, rank 0 lists the step and names every object its
manifest names that is missing (a listing, not a read: on CephFS a read of objects other
nodes' clients just wrote waits for each of them to give up its capabilities: seconds per
object on a busy machine). Rank 0 prints one JSON line per step, then touches DONE."""

import json
import sys
import time

import numpy as np

import ckptio
from ckptio.dist import detect

N = 1 << 19  # float32 elements per rank: 2 MiB


def main() -> None:
    url, steps, done = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    comm = detect()
    ck = ckptio.Checkpointer(url, comm=comm, max_object_size="512KiB", chunk_size="512KiB")
    try:
        for step in range(1, steps + 1):
            w = np.random.default_rng([step, comm.rank]).standard_normal(N, dtype=np.float32)
            start = time.time()
            ck.save({"w": ckptio.Shard(w, (N * comm.size,), (N * comm.rank,))}, step)
            if comm.rank == 0:
                prefix = f"step-{step:010d}/"
                listed = set(ck.store.list(prefix))
                names = ckptio.open_checkpoint(ck.store, step).manifest.objects
                missing = [k for k in names if prefix + k not in listed]
                line = {"step": step, "start": start, "end": time.time(), "missing": missing}
                print(json.dumps(line), flush=True)
    finally:
        ck.close()
        if comm.rank == 0:
            open(done, "w").close()


if __name__ == "__main__":
    main()
