"""The simulation (:mod:`ckptio.simulate`) checked against the model where the model is exact,
shown beside it where they part (and why), and reading its storage from measured results.

Check 1: with fixed latencies, no throttling and the model's own client (``lockstep``),
simulation and model agree within 5% at 8, 1,536 and 16,384 GPUs, on every kind of limit
(per-stream bandwidth, node link, aggregate bandwidth). Check 3: throttling with ckptio's
retries, latency tails, a straggler, a restore storm, storage-target contention and a tiered
restore each move the simulation away from the model, and the report shows both figures and
the mechanism. (Check 2, the multi-node cluster, lives with the cluster tests.)
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from ckptio import simulate as sim
from ckptio.errors import InvalidArgumentError
from ckptio.simulate import Job, Storage, fit_layout, simulate
from ckptio.simulate.storage import ROOT_PREFIX
from ckptio.store import DEFAULT_RETRY_POLICY, RetryPolicy
from ckptio.units import human_seconds
from ckptio.workload import make_plan

pytest.importorskip("simpy")

NO_LIMITS = {"write_request_rate": "inf", "read_request_rate": "inf"}
"""Request rates the model treats as unbounded: nothing can throttle."""


def exact(profile: str) -> Storage:
    """A profile where the model is exact: fixed latencies, nothing throttles."""
    return Storage.from_profile(profile, latency="fixed", overrides=NO_LIMITS)


def phases(s: sim.Simulation) -> dict[str, dict]:
    return s.as_dict()["phases"]


# -- check 1: where the model is exact, they agree -------------------------------------------


@pytest.mark.parametrize("gpus", [8, 1536, 16384])
@pytest.mark.parametrize(
    ("preset", "profile", "binding"),
    [
        ("gpt3-175b", "cloud-s3", "per-stream bandwidth"),
        ("llama3-405b", "abci-lustre", "aggregate bandwidth"),
        ("llama3-405b", "local-nvme", "node link"),
    ],
)
def test_simulation_agrees_with_the_model_where_it_is_exact(
    preset: str, profile: str, binding: str, gpus: int
) -> None:
    plan, _ = fit_layout(preset, gpus, scale=0.05 if gpus == 8 else None)
    s = simulate(Job(plan, lockstep=True), exact(profile))
    assert s.deterministic and s.replications == 1
    for ph in phases(s).values():
        assert ph["failed"] == 0
        assert ph["p50_seconds"] == pytest.approx(ph["modelled_seconds"], rel=0.05), ph
        if gpus > 8:
            assert ph["model_binding"] == ph["bound_by"] == binding
    assert s.phases["save"].bytes == plan.total_bytes


def test_a_restore_checks_each_objects_size_beside_its_first_reads() -> None:
    """As the reader does (``CheckpointReader.read_many``): with slow metadata (0.5 s a
    request) the simulated restore still agrees with the model, which puts no size check in
    series before an object's reads (it was 16% longer when the simulation did)."""
    plan, _ = fit_layout("gpt3-175b", 1536, scale=0.01)
    slow = Storage.from_profile(
        "cloud-s3", latency="fixed", overrides={**NO_LIMITS, "metadata_latency": "0.5s"}
    )
    (ph,) = phases(simulate(Job(plan, lockstep=True), slow, phases=["restore"])).values()
    assert ph["p50_seconds"] == pytest.approx(ph["modelled_seconds"], rel=0.05), ph


def test_identical_nodes_are_simulated_once_where_exact() -> None:
    """Aggregation changes how many nodes are simulated, not the answer."""
    plan, _ = fit_layout("llama3-405b", 1536, scale=0.02)
    job = Job(plan, lockstep=True)
    one = simulate(job, exact("abci-lustre"))
    every = simulate(job, exact("abci-lustre"), aggregate=False)
    assert one.aggregated and not every.aggregated
    assert one.simulated_nodes < every.simulated_nodes == job.nodes
    for ph in ("save", "restore"):
        assert one.phases[ph].stalls[0] == pytest.approx(every.phases[ph].stalls[0], rel=0.01)
        assert one.phases[ph].bytes == every.phases[ph].bytes == plan.total_bytes
    # with random latencies every node is simulated, and the notes say why
    tails = simulate(job, Storage.from_profile("abci-lustre"), replications=2)
    assert not tails.aggregated and tails.simulated_nodes == job.nodes
    assert any("every node simulated" in n for n in tails.notes)


# -- check 3: where they part, both are shown with the mechanism ------------------------------


@pytest.fixture(scope="module")
def small() -> Job:
    """GPT-3 175B's layout on 1,536 GPUs, its shards shrunk 100x: fast to simulate."""
    plan, _ = fit_layout("gpt3-175b", 1536, scale=0.01)
    return Job(plan)


def test_throttling_with_ckptios_retries_fails_where_the_model_waits(small: Job) -> None:
    """Past a prefix's request rate, the model counts the requests at the rate; ckptio's
    client retries with its backoff and gives up after its last attempt: the save fails."""
    slow = Storage.from_profile("cloud-s3", latency="fixed", overrides={"write_request_rate": 200})
    assert slow.retry is DEFAULT_RETRY_POLICY  # ckptio's own policy, not a copy
    s = simulate(small, slow, phases=["save"], replications=3)
    save = phases(s)["save"]
    assert save["failed"] == 3 and save["p50_seconds"] is None
    assert save["modelled_seconds"] > 0 and save["model_binding"] == "request-rate limit"
    assert save["throttled"] > 0 and save["failed_requests"] > 0
    assert save["bound_by"] == "failed" and save["bound_prefix"] == "data"
    assert "503 SlowDown" in save["mechanism"]
    why = sim_divergence(s, "save")
    assert "ckptio's retry attempts" in why and "fails" in why
    # a client that never gives up gets through, slower than the model's rate alone
    patient = replace(slow, retry=RetryPolicy(max_attempts=10_000))
    s2 = phases(simulate(small, patient, phases=["save"], replications=3))["save"]
    assert s2["failed"] == 0 and s2["retried"] > 0
    assert s2["p50_seconds"] > s2["modelled_seconds"]


def test_the_backoff_is_ckptios_retry_policy(small: Job) -> None:
    """Every backoff the simulation waits comes from the policy's own ``delay``."""
    calls: list[int] = []

    class Counting(RetryPolicy):
        def delay(self, attempt, uniform=None):  # type: ignore[no-untyped-def, override]
            calls.append(attempt)
            return 0.0

    slow = Storage.from_profile(
        "cloud-s3",
        latency="fixed",
        overrides={"write_request_rate": 200},
        retry=Counting(max_attempts=3),
    )
    s = phases(simulate(small, slow, phases=["save"], replications=1))["save"]
    assert calls and set(calls) <= {1, 2}  # attempt 3 is the last: no backoff after it
    assert s["retried"] == len(calls)
    # every refusal is retried, or is a last attempt (failed, or still waiting for its answer
    # when the first failure ended the checkpoint)
    assert s["throttled"] >= s["retried"] + s["failed_requests"] >= s["retried"] + 1


def test_latency_tails_lengthen_the_stall(small: Job) -> None:
    tails = Storage.from_profile("cloud-s3", latency="lognormal:8", overrides=NO_LIMITS)
    s = simulate(small, tails, replications=5, seed=7)
    for ph in phases(s).values():
        assert ph["p50_seconds"] > ph["modelled_seconds"] * 1.2
        assert ph["p50_low_seconds"] <= ph["p50_seconds"] <= ph["p50_high_seconds"]
        assert ph["p99_seconds"] >= ph["p50_seconds"]
    assert "latency" in sim_divergence(s, "restore")
    # the same seed gives the same answer; another seed another one
    again = simulate(small, tails, replications=5, seed=7)
    other = simulate(small, tails, replications=5, seed=8)
    assert again.phases["save"].stalls == s.phases["save"].stalls
    assert other.phases["save"].stalls != s.phases["save"].stalls


def test_a_straggler_node_binds(small: Job) -> None:
    s = simulate(small, exact("cloud-s3"), replications=3, stragglers=1, straggler_slowdown=2)
    assert not s.deterministic
    for ph in phases(s).values():
        assert ph["bound_by"] == "straggler node"
        assert ph["p50_seconds"] == pytest.approx(2 * ph["modelled_seconds"], rel=0.1)
        assert "straggler" in ph["mechanism"]


def test_a_straggler_behind_a_shared_limit_is_not_blamed(small: Job) -> None:
    """Where the aggregate bandwidth binds every node, a node twice as slow on its own still
    ends with the others: the straggler is not what bound the checkpoint, and the mechanism
    says so."""
    s = simulate(small, exact("abci-lustre"), replications=2, stragglers=1)
    for ph in phases(s).values():
        assert ph["p50_seconds"] == pytest.approx(ph["modelled_seconds"], rel=0.02)
        assert ph["bound_by"] != "straggler node"
        assert "ends with the others" in ph["mechanism"]


def test_a_restore_storm_reads_every_replica(small: Job) -> None:
    """GPT-3's ZeRO 0 layout: 12 data-parallel replicas read the same shards."""
    storm = replace(small, readers="all")
    s = simulate(storm, exact("abci-lustre"), phases=["restore"])
    r = s.phases["restore"]
    assert r.bytes == 12 * small.plan.total_bytes
    assert r.stalls[0] > 10 * r.modelled
    assert any("restore storm" in n for n in s.notes)
    assert "every rank reads" in sim_divergence(s, "restore")


def test_the_restore_preamble_of_every_rank_is_throttled() -> None:
    """Every rank lists the steps and reads the manifest (as ckptio.load does): at 16,384
    ranks that alone is a burst on one prefix; the step root is where requests are refused."""
    plan, _ = fit_layout("llama3-405b", 16384, scale=1e-4)
    tight = Storage.from_profile("cloud-s3", latency="fixed", overrides={"read_request_rate": 100})
    s = phases(simulate(Job(plan, key_layout="hashed"), tight, phases=["restore"], replications=1))
    r = s["restore"]
    assert r["throttled"] > 0
    assert r["bound_prefix"] == ROOT_PREFIX


def test_storage_targets_shared_by_files_bind(small: Job) -> None:
    lustre = Storage.from_profile("abci-lustre", latency="fixed", targets=16, placement="random")
    s = simulate(small, lustre, replications=3)
    for ph in phases(s).values():
        assert ph["bound_by"] == "storage target (OST) contention"
        assert ph["p50_seconds"] > ph["modelled_seconds"]
    with pytest.raises(InvalidArgumentError, match="aggregate"):
        Storage.from_profile("cloud-s3", targets=4)  # S3's aggregate is unbounded


def test_a_tiered_restore_is_either_tier(small: Job) -> None:
    """The model gives the expected restore; each simulated failure lost a node (its ranks
    read the durable tier) or did not (every rank reads its fast tier)."""
    durable = Storage.from_profile("cloud-s3", latency="fixed")
    local = Storage.from_profile("local-nvme", latency="fixed")
    s = simulate(small, durable, local=local, replications=8, seed=3, p_lose_node=0.5)
    d = phases(s)
    assert s.target == "cloud-s3+local-nvme"
    assert set(d) == {"save", "restore", "drain"}
    stalls = sorted(set(round(x, 6) for x in s.phases["restore"].stalls))
    assert len(stalls) == 2  # the fast tier alone, or a lost node from the durable tier
    fast, durable_read = stalls
    assert fast < d["restore"]["modelled_seconds"] < durable_read
    assert d["save"]["p50_seconds"] == pytest.approx(d["save"]["modelled_seconds"], rel=0.05)
    assert "expected restore" in sim_divergence(s, "restore")


def test_runners_client_overlaps_metadata_the_model_puts_in_series(small: Job) -> None:
    """ckptio's runner starts a rank's next object as soon as one is done: on S3 (100 ms per
    create and complete) the save is shorter than the model's, which puts them in series."""
    storage = exact("cloud-s3")
    runner = phases(simulate(small, storage))["save"]
    model_client = phases(simulate(replace(small, lockstep=True), storage))["save"]
    assert model_client["p50_seconds"] == pytest.approx(model_client["modelled_seconds"], rel=0.05)
    # shorter by at least one create or complete request that overlapped a transfer
    meta = storage.profile.value("metadata_latency")
    assert runner["p50_seconds"] <= model_client["p50_seconds"] - meta


def test_a_save_pays_ckptios_commit_protocol_in_the_simulation_and_the_model(small: Job) -> None:
    """A save's protocol as ckptio.checkpoint.commit makes it: the lease published while the
    manifest is checked absent (two requests, one round trip) before the data; the manifest,
    one listing per 1,000 keys and the lease's release after it. The simulation sends those
    requests and the model counts the same round trips (it counted one request)."""
    from ckptio.protocol import save_protocol_requests
    from ckptio.simulate.engine import plan_work
    from ckptio.stallmodel import estimate

    assert [save_protocol_requests(n) for n in (1, 998, 999, 5000)] == [4, 4, 5, 9]
    storage = exact("cloud-s3")
    work = plan_work(small, "save")
    objects = sum(len(o) for o in work)
    part = storage.profile.part_size
    parts = sum(-(-b // part) for objs in work for _, _, b in objs)
    save = simulate(small, storage, phases=["save"]).phases["save"]
    assert save.requests == [objects * 2 + parts + save_protocol_requests(objects) + 1]
    meta = storage.profile.value("metadata_latency")
    w = small.workload()
    many = estimate(replace(w, objects=50_000), storage.profile, phase="write")
    few = estimate(replace(w, objects=1), storage.profile, phase="write")
    assert many.seconds - few.seconds == pytest.approx((54 - 4) * meta)


def sim_divergence(s: sim.Simulation, phase: str) -> str:
    """What the report says about ``phase`` of ``s`` (via the result table it writes)."""
    from ckptio.report.simulated import divergence

    row = {**s.rows("t")[0], **s.as_dict()["phases"][phase]}
    row["latency"] = s.storage.latency.describe()
    return divergence(row)


def test_the_report_shows_both_figures_and_the_mechanism_where_they_part(
    tmp_path: Path, small: Job
) -> None:
    """Check 3 as the reader sees it: for throttling (a client that retries until it gets
    through), latency tails and a straggler node, the report's "where they part" list gives
    the simulated figure, the model's, and the mechanism, in report.md and index.html; the
    exact case is said to agree and is not listed."""
    import html as html_lib

    from ckptio.report.simulated import build

    patient = replace(
        Storage.from_profile("cloud-s3", latency="fixed", overrides={"write_request_rate": 200}),
        retry=RetryPolicy(max_attempts=10_000),
    )
    tails = Storage.from_profile("cloud-s3", latency="lognormal:8", overrides=NO_LIMITS)
    cases = {
        "throttling": (simulate(small, patient, phases=["save"], replications=2, seed=1), "save"),
        "tails": (simulate(small, tails, phases=["restore"], replications=3, seed=1), "restore"),
        "straggler": (
            simulate(small, exact("cloud-s3"), phases=["save"], replications=2, stragglers=1),
            "save",
        ),
    }
    mechanism = {
        "throttling": ["answered 503 SlowDown and retried", "ckptio's jittered backoff"],
        "tails": ["drawn from a distribution", "the slowest rank meets its tail"],
        "straggler": ["a straggler node sets the end", "the model has every node alike"],
    }
    for s, _ in cases.values():
        sim.write_results([s], str(tmp_path / "apart"))
    build([str(tmp_path / "apart")], str(tmp_path / "rep"))
    md = (tmp_path / "rep" / "report.md").read_text()
    page = html_lib.unescape((tmp_path / "rep" / "index.html").read_text())
    apart = md.split("Where simulation and model part, and why", 1)[1]
    for name, (s, ph) in cases.items():
        d = phases(s)[ph]
        simulated, modelled = d["p50_seconds"], d["modelled_seconds"]
        assert simulated > 1.1 * modelled, (name, d)  # they do part
        (line,) = [x for x in apart.splitlines() if x.startswith("- ") and _scenario_of(s) in x]
        assert f"simulated {human_seconds(simulated)}" in line, (name, line)
        assert f"vs modelled {human_seconds(modelled)}" in line, (name, line)
        for words in mechanism[name]:
            assert words in line, (name, words, line)
            assert words in page, (name, words)
    # where the model is exact the report says they agree, and lists nothing
    same = simulate(replace(small, lockstep=True), exact("abci-lustre"))
    sim.write_results([same], str(tmp_path / "same"))
    build([str(tmp_path / "same")], str(tmp_path / "rep2"))
    md = (tmp_path / "rep2" / "report.md").read_text()
    assert "They agree within 5% everywhere here." in md


def _scenario_of(s: sim.Simulation) -> str:
    """The words that tell ``s``'s line apart in the report (its scenario, as the table's
    column and the plot name it)."""
    from ckptio.report.simulated import _scenario

    return _scenario({**s.rows("t")[0], "latency": s.storage.latency.describe()})


# -- inputs refused --------------------------------------------------------------------------


def test_bad_inputs_are_refused_with_a_reason() -> None:
    plan = make_plan("llama3-8b", scale=1e-3)
    st = exact("cloud-s3")
    with pytest.raises(InvalidArgumentError, match="replications"):
        simulate(Job(plan), st, replications=0)
    with pytest.raises(InvalidArgumentError, match="phases"):
        simulate(Job(plan), st, phases=["write"])
    with pytest.raises(InvalidArgumentError, match="slowdown"):
        simulate(Job(plan), st, stragglers=1, straggler_slowdown=0.5)
    with pytest.raises(InvalidArgumentError, match="restore readers"):
        Job(plan, readers="some")
    with pytest.raises(InvalidArgumentError, match="key layout"):
        Job(plan, key_layout="deep")
    for text in ("lognormal:0.5", "lognormal:x", "gamma", "lognormal:nan"):
        with pytest.raises(InvalidArgumentError, match="latency"):
            sim.parse_latency(text, 0.1)
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        fit_layout("gpt3-175b", 12, pp=16)  # a PP given is kept


def test_a_layout_that_does_not_divide_is_adapted_and_said() -> None:
    plan, note = fit_layout("gpt3-175b", 8)
    assert (plan.layout.tp, plan.layout.pp, plan.layout.dp) == (8, 1, 1)
    assert "TP8xPP16 does not divide 8 GPUs" in note
    plan, note = fit_layout("gpt3-175b", 1536)
    assert note == "" and plan.layout.pp == 16


def test_median_interval_is_distribution_free() -> None:
    lo, hi, cov = sim.median_interval(list(range(1, 11)))
    assert (lo, hi) == (2, 9) and cov == pytest.approx(1 - 2 * 11 / 1024)
    lo, hi, cov = sim.median_interval([3.0, 1.0, 2.0])
    assert (lo, hi) == (1.0, 3.0) and cov == pytest.approx(0.75)
    assert sim.median_interval([]) == (None, None, None)


# -- measured runs in, result files out ------------------------------------------------------


def test_storage_fitted_from_a_measured_run(tmp_path: Path) -> None:
    """The shape of the cluster check: a storage description fitted from a run's result
    files (latencies resampled from its requests) and a simulation of that run's processes
    on 1, 2 and 3 nodes."""
    from ckptio.dist import SingleProcess
    from ckptio.runner import RunSettings, run_workload

    plan = make_plan("llama3-8b", total_size="24MiB", object_size="1MiB")
    run_workload(
        f"file://{tmp_path}/target", plan, RunSettings(out_dir=tmp_path / "out"), SingleProcess()
    )
    (storage,) = sim.fit_storage([str(tmp_path / "out")])
    assert storage.latency.kind == "empirical" and len(storage.latency.samples) >= 24
    assert storage.profile.name.startswith("measured:")
    assert math.isinf(storage.profile.aggregate_bandwidth)  # one node cannot see it
    # each object's own metadata requests (create; fsync, close, rename), as measured, not the
    # data requests' residuals stretched to a figure (the model's figures stay its own)
    from ckptio.results import read_results

    (run,) = read_results([str(tmp_path / "out")]).runs.to_pylist()
    objects = int(run["objects"])
    own = storage.object_metadata
    assert own is not None and own.kind == "empirical"
    assert f"metadata requests of {objects} measured objects" in own.source
    assert len(own.samples) == 2 * objects and max(own.samples) > 0
    assert storage.profile.value("metadata_latency") == storage.profile.value("request_latency")
    for nodes in (1, 2, 3):
        job = Job.for_run(plan, processes=2 * nodes, processes_per_node=2, streams=8)
        assert job.nodes == nodes
        s = simulate(job, storage, replications=2)
        assert s.phases["save"].bytes == plan.total_bytes
        assert s.phases["restore"].bytes == plan.total_bytes
        assert all(x > 0 for x in s.phases["save"].stalls)
    with pytest.raises(InvalidArgumentError, match="no measured write requests"):
        sim.fit_storage([str(tmp_path / "out")], target="nosuch")


def test_a_probe_gives_the_aggregate_and_the_write_requests(tmp_path: Path) -> None:
    """``fit_storage(paths, aggregate=PROBE)``: the probe (the job's streams and clients from
    one node) gives the aggregate and the write side's requests, as the storage answered
    them; the one-node run (one client) keeps the node's link, a per-client limit, and the
    read side."""
    from ckptio.dist import SingleProcess
    from ckptio.runner import RunSettings, run_workload

    for name, total in (("node", "8MiB"), ("probe", "16MiB")):
        plan = make_plan("llama3-8b", total_size=total, object_size="1MiB")
        run_workload(
            f"file://{tmp_path}/{name}-target",
            plan,
            RunSettings(out_dir=tmp_path / name, iterations=3, label="pfs"),
            SingleProcess(),
        )
    (node,) = sim.fit_storage([str(tmp_path / "node")])
    (fitted,) = sim.fit_storage([str(tmp_path / "node")], aggregate=[str(tmp_path / "probe")])
    (probe,) = sim.fit_storage([str(tmp_path / "probe")])
    # the aggregate: the probe's steady throughput, or where the simulation of the probe as
    # it ran is slower than the probe at that (its resampled latencies hold their wait for
    # the storage already), the aggregate at which it replays the probe's write time
    throughput = probe.profile.node_bandwidth
    assert fitted.profile.aggregate_bandwidth >= throughput
    assert "probe" in fitted.profile.figures["aggregate_bandwidth"].source
    from ckptio.calibration import fit_targets
    from ckptio.results import read_results

    res = read_results([str(tmp_path / "probe")])
    (fit,) = fit_targets(res.requests, res.runs, res.phases)
    measured = sum(rd.run["write_seconds"] for rd in fit.used) / len(fit.used)
    job = Job.for_run(
        make_plan("llama3-8b", total_size="16MiB", object_size="1MiB"),
        processes=1,
        streams=int(fit.used[0].run["streams"]),
    )
    replayed = phases(simulate(job, fitted, phases=["save"], replications=20))["save"]
    at_throughput = phases(
        simulate(
            job,
            sim.with_aggregate(fitted, throughput, ""),
            phases=["save"],
            replications=20,
        )
    )["save"]
    if fitted.profile.aggregate_bandwidth > throughput:
        assert "gives its measured write time" in (
            fitted.profile.figures["aggregate_bandwidth"].source
        )
        assert replayed["p50_seconds"] == pytest.approx(measured, rel=0.05)
        assert at_throughput["p50_seconds"] > measured
    else:  # nothing to mend: not slower at its throughput, or not the shared pipe's doing
        assert fitted.profile.aggregate_bandwidth == throughput
    assert fitted.profile.stream_bandwidth == probe.profile.stream_bandwidth
    assert fitted.latency.samples == probe.latency.samples
    assert fitted.object_metadata == probe.object_metadata and fitted.metadata == probe.metadata
    assert fitted.profile.node_bandwidth == node.profile.node_bandwidth
    assert "the limit of one client" in fitted.profile.figures["node_bandwidth"].source
    assert fitted.read_latency == node.read_latency
    with pytest.raises(InvalidArgumentError, match="aggregate bandwidth from"):
        sim.fit_storage([str(tmp_path / "node")], aggregate=[str(tmp_path / "node-target")])


def test_each_node_has_its_own_client_limit_under_the_shared_aggregate() -> None:
    """The node's link (fitted from one client: each node of a job has its own) bounds each
    node alone; the aggregate (fitted from a probe with the job's clients) bounds them all:
    a save of n nodes takes its bytes over min(n x the link, the aggregate)."""
    plan = make_plan("llama3-8b", gpus=12, total_size="192MiB")
    storage = Storage.from_profile(
        "local-nvme",
        latency="fixed",
        overrides={
            **NO_LIMITS,
            "node_bandwidth": "100MB/s",
            "aggregate_bandwidth": "250MB/s",
            "request_latency": "1ms",
            "metadata_latency": "1ms",
        },
    )
    for nodes, binding in ((1, "node link"), (2, "node link"), (3, "aggregate bandwidth")):
        job = Job.for_run(plan, processes=2 * nodes, processes_per_node=2, streams=8)
        save = phases(simulate(job, storage, phases=["save"]))["save"]
        expected = plan.total_bytes / min(nodes * 100e6, 250e6)
        assert save["p50_seconds"] == pytest.approx(expected, rel=0.02), (nodes, save)
        assert save["bound_by"] == binding


def test_results_round_trip_and_the_report_section(tmp_path: Path, small: Job) -> None:
    from ckptio.report.simulated import build

    s = simulate(small, Storage.from_profile("cloud-s3"), replications=3, seed=5)
    slow = Storage.from_profile("cloud-s3", latency="fixed", overrides={"write_request_rate": 200})
    throttled = simulate(small, slow, phases=["save"], replications=2, seed=5)
    paths = sim.write_results([s], str(tmp_path / "r"), config={"why": "test"})
    sim.write_results([throttled], str(tmp_path / "r"))
    assert [p.name.split(".", 1)[1] for p in paths] == ["simulated.parquet", "json"]
    side = json.loads(paths[1].read_text())
    assert side["kind"] == "simulated" and side["simulations"][0]["seed"] == 5
    back = {
        r["phase"]: r
        for r in sim.read_summaries([str(tmp_path / "r")])
        if r["latency"].startswith("lognormal")
    }
    for ph, summary in phases(s).items():
        assert back[ph]["p50_seconds"] == summary["p50_seconds"]
        assert back[ph]["modelled_seconds"] == summary["modelled_seconds"]
        assert back[ph]["replications"] == 3 and back[ph]["seed"] == 5
    files = build([str(tmp_path / "r")], str(tmp_path / "rep"))
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Simulated vs modelled" in md and "3 replications, seed 5" in md
    assert "Where simulation and model part" in md
    assert any(f.endswith("index.html") for f in files)
    # the plot draws the table's figures, none of its own
    from ckptio.report.simulated import _scenario, plot_scale, read

    bigger = replace(small, plan=fit_layout("gpt3-175b", 3072, scale=0.01)[0])
    two = [simulate(j, exact("cloud-s3")) for j in (small, bigger)] + [throttled]
    sim.write_results(two, str(tmp_path / "p"))
    rows = read([str(tmp_path / "p")])
    drawn = plot_scale(rows, str(tmp_path / "p.png"))
    assert drawn and len(drawn) == len(rows) == 5
    for r in rows:
        fig = drawn[
            f"{r['target']} {r['preset']} {_scenario(r, shape=True)} {r['phase']} {r['gpus']}"
        ]
        assert fig["modelled_seconds"] == r["modelled_seconds"]
        assert fig.get("p50_seconds") == r["p50_seconds"]  # none drawn for a failed phase
        # the throttled save: both figures and the mechanism
    model = phases(throttled)["save"]["modelled_seconds"]
    (line,) = [x for x in md.splitlines() if x.startswith("- cloud-s3") and "failed 2/2" in x]
    assert f"vs modelled {human_seconds(model)}" in line
    assert "503 SlowDown" in line and "ckptio's retry attempts" in line


# -- the command -----------------------------------------------------------------------------


def test_the_command_prints_simulated_beside_modelled(tmp_path: Path) -> None:
    from test_runner import ckptio_cli

    base = ["simulate", "--preset", "gpt3-175b", "--gpus", "1536", "--scale", "0.01"]
    r = ckptio_cli(*base, "--target", "abci-lustre", "--latency", "fixed", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (s,) = doc["simulations"]
    assert s["kind"] == "simulated" and s["target"] == "abci-lustre"
    assert s["deterministic"] and s["replications"] == 1
    assert set(s["phases"]) == {"save", "restore"}
    for ph in s["phases"].values():
        assert ph["modelled_seconds"] > 0 and ph["p50_seconds"] > 0
    # the table, two targets and two scales, written as results and as a report
    out, rep = tmp_path / "results", tmp_path / "report"
    r = ckptio_cli(
        *base[:3], "--gpus", "1536,3072", "--scale", "0.01", "--target", "cloud-s3",
        "--target", "abci-lustre", "--replications", "3", "--out", str(out),
        "--report", str(rep),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "simulated vs modelled stall" in r.stdout and "3 replications, seed 0" in r.stdout
    assert r.stdout.count("cloud-s3") >= 4 and "3,072" in r.stdout
    assert "Every figure here is simulated" in r.stdout
    assert "simulating cloud-s3" in r.stderr  # progress on stderr
    assert len(list(out.glob("*.simulated.parquet"))) == 1
    assert (rep / "index.html").exists() and (rep / "simulated.png").exists()
    rows = sim.read_summaries([str(out)])
    assert {(r["target"], r["gpus"]) for r in rows} == {
        (t, g) for t in ("cloud-s3", "abci-lustre") for g in (1536, 3072)
    }


def test_the_report_of_runs_carries_the_simulated_section(tmp_path: Path) -> None:
    """``ckptio report`` over a directory holding a measured run and a simulation shows both,
    each labelled."""
    from test_runner import ckptio_cli

    out = tmp_path / "results"
    r = ckptio_cli(
        "run", f"file://{tmp_path}/t", "--preset", "llama3-8b", "--total-size", "8MiB",
        "--object-size", "1MiB", "--iterations", "1", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = ckptio_cli(
        "simulate", "--preset", "llama3-405b", "--gpus", "1536,16384", "--scale", "1e-3",
        "--target", "abci-lustre", "--latency", "fixed", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = ckptio_cli("report", str(out), "--out", str(tmp_path / "report"))
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "report" / "report.md").read_text()
    html = (tmp_path / "report" / "index.html").read_text()
    for text in (md, html):
        assert "Simulated vs modelled (full scale)" in text
        assert "deterministic (one replication)" in text
    assert "What checkpoints cost at Llama 3" in md and "466 interruptions" in md
    assert (tmp_path / "report" / "simulated.png").exists()


def test_the_command_refuses_what_it_cannot_simulate(tmp_path: Path) -> None:
    from test_runner import ckptio_cli

    for args, says in (
        (["--target", "nosuch"], "unknown profile 'nosuch'"),
        (["--latency", "gamma"], "latency 'gamma'"),
        (["--target", "cloud-s3", "--osts", "4"], "aggregate"),
        (["--from", str(tmp_path / "none")], "no result file"),
        (["--gpus", "7", "--tp", "8"], "does not fit"),
    ):
        r = ckptio_cli("simulate", "--preset", "gpt3-175b", "--scale", "1e-3", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_replications_in_worker_processes_give_the_same_result(small: Job) -> None:
    """Each replication is seeded on its own: run in 2 forked processes or in this one, the
    simulation is the same, figure for figure."""
    storage = Storage.from_profile("abci-lustre")
    one = simulate(small, storage, replications=3, seed=7, workers=1)
    two = simulate(small, storage, replications=3, seed=7, workers=2)
    for ph in ("save", "restore"):
        a, b = one.phases[ph], two.phases[ph]
        assert (a.stalls, a.bounds, a.requests) == (b.stalls, b.bounds, b.requests)
        assert len(set(a.stalls)) == 3  # random latencies: three different checkpoints


def test_a_tiered_target_simulates_its_save_alone(small: Job) -> None:
    """``--phase save`` on a tiered target: the save and its drain, no restore (it raised
    KeyError: 'restore')."""
    durable, local = Storage.from_profile("cloud-s3"), Storage.from_profile("local-nvme")
    s = simulate(small, durable, local=local, phases=["save"], replications=1)
    assert set(s.phases) == {"save", "drain"}
    assert s.phases["drain"].modelled > s.phases["save"].modelled > 0
