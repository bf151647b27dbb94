"""Run by 2 ranks under mpiexec or torchrun: rank 0 sends three pieces of bytes over the peer
copies' wire (:func:`ckptio.checkpoint.peers.wire`), rank 1 receives the first two where a
``place`` puts them (two halves of an array) and the third where it does not (a new buffer);
prints whether each landed in place and bit-identical."""

import json
import os

import numpy as np

from ckptio.checkpoint.peers import _DATA, wire
from ckptio.dist import detect, shutdown

N = 1 << 20


def main() -> None:
    comm = detect()
    w = wire(comm.dup())
    pieces = [np.random.default_rng(i).integers(0, 256, N, dtype=np.uint8) for i in range(3)]
    out: dict = {"rank": comm.rank}
    if comm.rank == 0:
        for p in pieces:
            w.send(1, p, _DATA)
    else:
        dest = np.zeros(2 * N, dtype=np.uint8)
        got = []
        for i, p in enumerate(pieces):
            where = dest[i * N : (i + 1) * N] if i < 2 else None
            kind, data = w.recv(0, lambda kind, n, where=where: where if n == N else None)
            same = where is not None and data.ctypes.data == where.ctypes.data
            got.append({"kind": kind, "in_place": same, "equal": bool(np.array_equal(data, p))})
        out["got"] = got
        out["dest_equal"] = bool(np.array_equal(dest, np.concatenate(pieces[:2])))
    comm.barrier()
    os.write(1, (json.dumps(out) + "\n").encode())
    shutdown()


if __name__ == "__main__":
    main()
