"""Run under mpiexec with 2 ranks: rank 1 waits for rank 0, which works 0.5 s of CPU first,
in each of the peer transport's ``recv`` (a document), the communicator's ``gather``, its
``bcast`` and its ``barrier`` (the collectives a restore's planning runs); rank 1 prints the
wall and CPU seconds of each wait as JSON."""

import json
import time

from ckptio.checkpoint import peers
from ckptio.dist import detect

comm = detect()
w = peers.wire(comm)


def work() -> None:
    c0 = time.process_time()
    while time.process_time() - c0 < 0.5:  # work, not a sleep: the other rank waits meanwhile
        sum(range(1000))


waits = {
    "recv": lambda: peers._recv_doc(w, 0) if comm.rank else peers._send_doc(w, 1, {"go": True}),
    "gather": lambda: comm.gather({"rank": comm.rank}, root=1),  # rank 1 collects
    "bcast": lambda: comm.bcast({"go": True} if comm.rank == 0 else None, root=0),
    "barrier": comm.barrier,
}
out = {}
for name, wait in waits.items():
    if comm.rank == 0:
        work()
        wait()
    else:
        t0, c0 = time.perf_counter(), time.process_time()
        got = wait()
        out[name] = {"got": got, "wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
if comm.rank:
    print(json.dumps(out), flush=True)
comm.barrier()
