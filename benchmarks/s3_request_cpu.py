"""Client CPU of one ranged S3 GET: botocore's ``get_object`` against ckptio's presigned GET
(``s3+boto3``'s read path), side by side on one moto server.

``python benchmarks/s3_request_cpu.py [--requests 300] [--rounds 2]`` prints, per way, the
milliseconds of CPU of the calling thread per request (``time.thread_time``; the moto server
runs in other threads of the same process, so its work is not counted) and the ratio. Each
request reads 1 KiB, so the figure is the per-request cost alone, with no body to move.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)

    from ckptio.registry import open_store
    from ckptio.testing.motoserver import aws_env, boto3_client, start_moto_server

    server, endpoint = start_moto_server()
    try:
        os.environ.update(aws_env(endpoint))
        boto3_client(endpoint).create_bucket(Bucket="bench")
        stores = {
            "get_object": open_store("s3+boto3://bench/cpu?presigned_reads=false"),
            "presigned GET": open_store("s3+boto3://bench/cpu"),
        }
        stores["get_object"].put("obj.bin", os.urandom(4096))
        buf = bytearray(1024)
        per: dict[str, list[float]] = {name: [] for name in stores}
        for _ in range(a.rounds):
            for name, store in stores.items():
                for _ in range(20):  # warm: connections, the kept URL
                    store.read_into("obj.bin", 0, buf)
                t0 = time.thread_time()
                for _ in range(a.requests):
                    store.read_into("obj.bin", 0, buf)
                per[name].append((time.thread_time() - t0) / a.requests * 1e3)
        for store in stores.values():
            store.close()
    finally:
        server.stop()
    base = statistics.median(per["get_object"])
    for name, ms in per.items():
        m = statistics.median(ms)
        print(
            f"{name:14s} {m:6.2f} ms CPU per request (rounds: {', '.join(f'{x:.2f}' for x in ms)})"
            f"  {base / m:4.2f}x of get_object's"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
