"""The emulate backend (``emulate+<url>``, formerly ``shaped+``): emulates a profile on any
store, and agrees with the model."""

import functools
import time

import numpy as np
import pytest

from ckptio import errors
from ckptio.profiles import load_profile
from ckptio.registry import open_store
from ckptio.stallmodel import Conditions, Workload, estimate

# Figures small enough to run in ~1-2 s, large enough that emulated time dominates per-request
# CPU work and scheduling noise on a busy 2-core machine.
FIGS = "request_latency=50ms&metadata_latency=50ms&stream_bandwidth=20MB/s"
ATTEMPTS = 3


def _agrees(measure, predicted: float, rel: float = 0.20) -> float:
    """The fastest of up to ``ATTEMPTS`` runs of ``measure()``, stopping at the first within
    ``rel`` of ``predicted``. The emulation sleeps until each request's modelled time has passed:
    a machine busy with other work (CI) can only add time to it, so the fastest run is the
    truest. A model or an emulation that is wrong fails every attempt."""
    best = float("inf")
    for _ in range(ATTEMPTS):
        best = min(best, measure())
        if best == pytest.approx(predicted, rel=rel):
            break
    return best


def _write_checkpoint(store, *, objects: int, object_bytes: int) -> float:
    """Write ``objects`` shard objects one after another, then a manifest; seconds taken."""
    data = np.random.default_rng(1).integers(0, 255, object_bytes, dtype=np.uint8)
    t0 = time.monotonic()
    for i in range(objects):
        with store.open_writer(f"step-0000000001/data/rank-00000-{i:03d}.bin") as w:
            for lo in range(0, object_bytes, 256 * 1024):  # the caller's buffers: 256 KiB
                w.write(data[lo : lo + 256 * 1024])
    store.publish("step-0000000001/manifest.json", b"{}", overwrite=False)
    return time.monotonic() - t0


@pytest.mark.parametrize(
    ("extra", "binding"),
    [
        ("&stream_bandwidth=10MB/s", "per-stream bandwidth"),
        ("&stream_bandwidth=10MB/s&node_bandwidth=15MB/s", "node link"),
    ],
)
def test_emulate_run_agrees_with_the_model(extra: str, binding: str) -> None:
    objects, object_bytes, part = 5, 4 * 2**20, 512 * 1024
    url = f"emulate+memory://agree-{len(extra)}?profile=cloud-s3&streams=4&part_size={part}&{FIGS}{extra}"

    def measure() -> float:
        store = open_store(url)
        try:
            return _write_checkpoint(store, objects=objects, object_bytes=object_bytes)
        finally:
            store.close()

    overrides = dict(p.split("=") for p in (FIGS + extra).split("&"))
    profile = load_profile("cloud-s3", overrides)
    w = Workload(
        total_bytes=objects * object_bytes,
        writing_ranks=1,
        bytes_per_rank=objects * object_bytes,
        objects_per_rank=objects,
        ranks_per_node=1,
    )
    predicted = estimate(w, profile, streams=4, part_size=part)
    assert predicted.binding == binding
    measured = _agrees(measure, predicted.seconds)
    assert measured == pytest.approx(predicted.seconds, rel=0.20), (measured, predicted)


def test_data_arrives_intact_and_requests_are_traced() -> None:
    store = open_store(
        f"emulate+memory://intact?profile=cloud-s3&streams=3&part_size=100000&{FIGS}"
    )
    data = np.arange(1_000_003, dtype=np.uint8)
    with store.open_writer("a/obj.bin") as w:
        w.write(data)
    buf = bytearray(len(data))
    assert store.read_into("a/obj.bin", 0, buf) == len(data)
    assert bytes(buf) == data.tobytes()
    assert store.get("a/obj.bin") == data.tobytes()
    ops = store.trace.summary()
    assert ops["write"]["requests"] == 11 and ops["write"]["bytes"] == len(data)
    assert ops["get"]["bytes"] >= len(data)
    assert {e.backend for e in store.trace.events()} == {"emulate:cloud-s3+memory"}
    assert store.describe().emulated
    store.close()


def test_a_request_answered_with_an_error_pays_its_round_trip() -> None:
    """A HEAD or GET of a missing object, or a create of one already there, takes the
    profile's latency as on the real service (a save asks whether its step exists)."""
    store = open_store(
        "emulate+memory://answers?profile=cloud-s3&request_latency=200ms&metadata_latency=200ms"
    )
    store.publish("there", b"x")
    for call in (
        lambda: store.size("missing"),
        lambda: store.read_into("missing", 0, bytearray(4)),
        lambda: store.publish("there", b"y", overwrite=False),
    ):
        t = time.monotonic()
        with pytest.raises((FileNotFoundError, FileExistsError)):
            call()
        assert time.monotonic() - t >= 0.19
    t = time.monotonic()
    assert not store.exists("missing")
    assert time.monotonic() - t >= 0.19
    store.close()


def test_request_rate_limit_throttles_and_retries() -> None:
    # 4 requests/s per prefix: a burst of 4, then 503 SlowDown answers; the retry path recovers.
    store = open_store(
        "emulate+memory://throttle?profile=cloud-s3&streams=8&part_size=65536"
        "&write_request_rate=4&request_latency=1ms&metadata_latency=1ms"
        "&stream_bandwidth=1GB/s"
    )
    data = bytes(range(256)) * 2048  # 512 KiB -> 8 parts
    with store.open_writer("p/obj") as w:
        w.write(data)
    assert store.get("p/obj") == data
    outcomes = [e.outcome for e in store.trace.events()]
    assert "throttled" in outcomes
    throttled = [e for e in store.trace.events() if e.outcome == "throttled"]
    assert "SlowDown" in throttled[0].error
    store.close()


def test_file_store_wrapped(tmp_path) -> None:
    store = open_store(f"emulate+file://{tmp_path}?profile=abci-lustre")
    store.publish("x/m.json", b"{}")
    assert store.list("x") == ["x/m.json"]
    assert (tmp_path / "x" / "m.json").read_bytes() == b"{}"
    store.close()


def test_unknown_profile_lists_valid_names() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="valid: abci-lustre"):
        open_store("emulate+memory://x?profile=nope")


def test_emulate_needs_an_inner_url() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="wrap another store"):
        open_store("emulate://x")


def test_the_old_name_shaped_opens_the_same_emulating_store(tmp_path, capsys) -> None:
    """``shaped+<url>``, the scheme's name before ``emulate``, in URLs users wrote (scripts,
    ``ckptio`` commands) and the old import path: the same store, named ``emulate``."""
    from ckptio.backends.emulate import EmulatedStore
    from ckptio.backends.shaped import ShapedStore

    import ckptio
    from ckptio import registry
    from ckptio.cli import main

    assert ShapedStore is EmulatedStore
    assert registry.backend_info("shaped") is registry.backend_info("emulate")
    assert registry.backend_info("emulate").aliases == ("shaped",)
    assert registry.backend_for(f"shaped+file://{tmp_path}/b").request_size_option == "part_size"
    old = f"shaped+file://{tmp_path}/run?profile=local-nvme"
    with open_store(old) as store:
        assert isinstance(store, EmulatedStore)
        assert store.url == f"emulate+file://{tmp_path}/run"
        assert store.name == "emulate:local-nvme+file" and store.describe().emulated
    ckptio.save({"w": np.arange(4.0)}, old, step=1)
    assert ckptio.load(f"emulate+file://{tmp_path}/run?profile=local-nvme")["w"].tolist() == [
        0.0,
        1.0,
        2.0,
        3.0,
    ]
    capsys.readouterr()
    assert main(["ls", old]) == 0
    assert "1" in capsys.readouterr().out


def test_runner_on_emulate_agrees_with_the_model(tmp_path) -> None:
    """A whole `run_workload` (write, commit, read) through the emulate backend takes what the
    model predicts for the same plan and profile, within 20%."""
    from ckptio.dist import SingleProcess
    from ckptio.results import read_results
    from ckptio.runner import RunSettings, run_workload
    from ckptio.workload import make_plan

    figs = {"request_latency": "50ms", "metadata_latency": "50ms", "stream_bandwidth": "20MB/s"}
    plan = make_plan("llama3-8b", total_size="16MiB", object_size="1MiB")
    w = Workload.for_run(plan, processes=1, inflight=2)
    profile = load_profile("cloud-s3", figs)
    rows = []

    def measure(phase: str) -> float:
        out = tmp_path / f"run-{len(rows)}"
        summary = run_workload(
            f"memory://agree-run-{len(rows)}",
            plan,
            RunSettings(
                out_dir=out,
                emulate="cloud-s3",
                inflight=2,
                options={"streams": 8, "part_size": 256 * 1024, **figs},
            ),
            SingleProcess(),
        )
        rows.append((out, summary.runs[0]))
        return float(summary.runs[0][f"{phase}_seconds"])

    for phase in ("write", "read"):
        predicted = estimate(w, profile, phase=phase, streams=8, part_size=256 * 1024)
        measured = _agrees(functools.partial(measure, phase), predicted.seconds)
        assert measured == pytest.approx(predicted.seconds, rel=0.20), (phase, measured, predicted)
    out, row = rows[0]
    assert row["emulated"] and row["profile"] == "cloud-s3"
    # the result files say it is emulated
    runs = read_results([out]).runs.to_pylist()
    assert runs[0]["emulated"] and runs[0]["profile"] == "cloud-s3"


@pytest.mark.parametrize("tiered", [False, True], ids=["load", "tiered-from-durable"])
def test_restore_through_emulated_agrees_with_the_model(tmp_path, tiered: bool) -> None:
    """A restore (``ckptio.load`` of the newest step; a tiered one whose fast tier is gone
    reads it from the durable tier) through the emulate backend takes what the model projects
    for the restore of the same checkpoint on the same profile (``restore_seconds``), within
    20%: the data, the listing and the manifest before it, a size check of each object."""
    import ckptio
    from ckptio.stallmodel import evaluate

    figs = "request_latency=50ms&metadata_latency=100ms&stream_bandwidth=20MB/s"
    part, objects = 512 * 1024, 12
    url = f"emulate+memory://restore-{tiered}?profile=cloud-s3&streams=4&part_size={part}&{figs}"
    rng = np.random.default_rng(0)
    state = {f"t{i:02d}": rng.standard_normal(2**19, dtype=np.float32) for i in range(objects)}
    with ckptio.Checkpointer(url, max_object_size="2MiB") as ck:
        ck.save(state, 1)
    store = open_store(url)
    data = [k for k in store.list("") if "/data/" in k]
    store.close()
    assert len(data) == objects  # one 2 MiB object per tensor

    def measure() -> float:
        t0 = time.monotonic()
        if tiered:
            empty = tmp_path / f"lost-{time.monotonic_ns()}"  # a replaced node's fast tier
            with ckptio.Checkpointer(url, local=f"file://{empty}") as ck:
                loaded = ck.load()
        else:
            loaded = ckptio.load(url)
        seconds = time.monotonic() - t0
        assert set(loaded) == set(state)
        return seconds

    profile = load_profile("cloud-s3", dict(p.split("=") for p in figs.split("&")))
    w = Workload(
        total_bytes=objects * 2**21,
        writing_ranks=1,
        bytes_per_rank=objects * 2**21,
        objects_per_rank=objects,
        ranks_per_node=1,
    )
    projected = evaluate(
        workload=w, profiles=[profile], conditions=Conditions(streams=4, part_size=part)
    )
    restore = projected["targets"][0]["restore_seconds"]
    measured = _agrees(measure, restore)
    assert measured == pytest.approx(restore, rel=0.20), (measured, restore)
