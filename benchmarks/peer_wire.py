"""The peer copies' transport on one machine: 2 MPI ranks standing for 2 nodes
(``$CKPTIO_NODE``), Open MPI's TCP transport forced (``OMPI_MCA_btl=tcp,self``, as between
nodes), no namespace cluster.

    OMPI_MCA_btl=tcp,self mpiexec --oversubscribe -n 2 .venv/bin/python benchmarks/peer_wire.py \\
        wire --mib 64 --repeat 3
    OMPI_MCA_btl=tcp,self mpiexec --oversubscribe -n 2 .venv/bin/python benchmarks/peer_wire.py \\
        restore --mib 64 --repeat 3 --dir /tmp/peer-wire

``wire``: rank 0 streams ``--mib`` MiB to rank 1 through
:func:`ckptio.checkpoint.peers.receive_objects` (the CRC32C of every piece taken on both
ends; the receiver's store discards the bytes): the transport alone. ``restore``: each rank
saves ``--mib`` MiB with ``replicas=1``, rank 1's fast root is removed before each restore,
which then takes its shard from the copy on rank 0 (checked bit-identical): the whole path.
Rank 1 prints one line per round with the machine's load average: a shared machine's figures
compare code on the same machine at the same time, nothing more."""

from __future__ import annotations

import argparse
import os
import shutil
import time
from typing import Any

import numpy as np

import ckptio
from ckptio.checkpoint import peers
from ckptio.dist import detect


class _Discard:
    url = "discard://"

    def open_writer(self, key: str, size_hint: int | None = None) -> Any:
        return self

    def write(self, data: Any) -> None:
        return None

    def close(self) -> None:
        return None

    def abort(self) -> None:
        return None

    def delete(self, keys: Any) -> None:
        return None


def wire(comm: Any, mib: int, repeat: int) -> list[float]:
    w = peers.wire(comm)
    data = np.random.default_rng(0).integers(0, 255, mib << 20, dtype=np.uint8)
    piece = 8 << 20

    def send(t: Any) -> None:
        objects = [["o", data.size]] if t["src"] == 0 else []
        peers._send_doc(w, t["dst"], {"objects": objects})
        if objects:
            out = peers._WireWriter(w, t["dst"])
            for pos in range(0, data.size, piece):
                out.write(memoryview(data[pos : pos + piece]))
            out.close()
        peers._send_doc(w, t["dst"], {"end": True})

    def receive(t: Any) -> None:
        error = peers.receive_objects(w, t["src"], _Discard(), "p/")[2]  # type: ignore[arg-type]
        assert not error, error

    out = []
    for _ in range(repeat):
        comm.barrier()
        t0 = time.perf_counter()
        peers.run_round(comm.rank, [{"src": 0, "dst": 1}, {"src": 1, "dst": 0}], send, receive)
        out.append(time.perf_counter() - t0)
    return out


def restore(comm: Any, mib: int, repeat: int, base: str) -> list[float]:
    rank, size, n = comm.rank, comm.size, mib << 18
    box = np.random.default_rng([1, rank]).standard_normal(n, dtype=np.float32)
    kw: dict[str, Any] = {
        "local": f"file://{base}/local/{{rank}}",
        "comm": comm,
        "replicas": 1,
        "persist_every": 1,
        "max_object_size": "16MiB",
    }
    with ckptio.Checkpointer(f"file://{base}/durable", **kw) as ck:
        ck.save({"w": ckptio.Shard(box, (n * size,), (n * rank,))}, 1)
        ck.wait()
    out = []
    for _ in range(repeat):
        comm.barrier()
        if rank == 1:
            shutil.rmtree(f"{base}/local/1")
        comm.barrier()
        with ckptio.Checkpointer(f"file://{base}/durable", **kw) as ck:
            comm.barrier()
            t0 = time.perf_counter()
            got = ck.load(select={"w": np.s_[n * rank : n * (rank + 1)]})
            comm.barrier()
            out.append(time.perf_counter() - t0)
            rec = ck.engine.last_restore
            if rank == 1 and rec is not None:
                print("where rank 1's restore spent its time:", rec.seconds, flush=True)
        assert np.array_equal(got["w"], box)
        assert rank != 1 or (rec is not None and rec.path == "peer"), rec
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["wire", "restore"])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/peer-wire")
    args = ap.parse_args()
    comm = detect()
    os.environ[peers.NODE_ENV] = f"n{comm.rank}"
    if args.mode == "wire":
        times = wire(comm, args.mib, args.repeat)
    else:
        if comm.rank == 0:
            shutil.rmtree(args.dir, ignore_errors=True)
        comm.barrier()
        times = restore(comm, args.mib, args.repeat, args.dir)
    if comm.rank == 1:
        for t in times:
            mbs = args.mib * 1.048576 / t
            print(f"{args.mode} {args.mib} MiB: {t:.3f} s, {mbs:.0f} MB/s, load {os.getloadavg()}")


if __name__ == "__main__":
    main()
