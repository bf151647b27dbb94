"""Run under mpiexec with 2 ranks: rank 1 waits in the peer transport's ``recv`` for a
document rank 0 sends only after 0.5 s of its own CPU work; rank 1 prints the wall and CPU
seconds of its wait as JSON."""

import json
import time

from ckptio.checkpoint import peers
from ckptio.dist import detect

comm = detect()
w = peers.wire(comm)
if comm.rank == 0:
    c0 = time.process_time()
    while time.process_time() - c0 < 0.5:  # work, not a sleep: the receiver waits meanwhile
        sum(range(1000))
    peers._send_doc(w, 1, {"go": True})
else:
    t0, c0 = time.perf_counter(), time.process_time()
    doc = peers._recv_doc(w, 0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"doc": doc, "wall": wall, "cpu": cpu}), flush=True)
comm.barrier()
