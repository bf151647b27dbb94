"""Check 2 of the simulation (:mod:`ckptio.simulate`) on the namespace cluster: storage
descriptions fitted from runs on ONE node (``ckptio simulate --from``: per-stream bandwidth,
the node's link through its one client, request latencies resampled from the recorded
requests) and, for a job of n nodes, a probe of the storage from that one node with the
job's processes and n storage clients, each shared by one node's processes (CephFS and
GlusterFS mounted n times on the node, :func:`~ckptio.testing.cluster.suite.storage_clients`;
on RGW each process is its own client) (:func:`ckptio.simulate.fit_storage`'s ``aggregate``:
the aggregate, and the write requests as the storage answers the job's concurrency) replay
the same job on 2 and 3 nodes, against what ``ckptio run`` measures there on RGW, CephFS and
GlusterFS.

The workload of ``benchmarks/cluster.py`` (llama3-8b, 12 logical ranks, 2 processes per
node under srun, :func:`~ckptio.testing.cluster.suite.run_suite`): 192 MiB a checkpoint, so
that a steady iteration takes about a second and the fixed costs of a save (its lease, its
commit, a process's first request) do not dominate it; the write only (``--no-read``: the
check is about the save). Every run twice, the second time in the reverse order (30 runs, 5
to 8 minutes on the project's 2-core machine under load): two runs of one shape minutes
apart land up to 50% apart on this shared machine, and the mirrored order lets a drift of
its load fall alike on the fit, the probes and the jobs, whose iterations are pooled.

The measured side is the steady iterations' mean write time (warm-ups left out as the fit
leaves them out: :func:`ckptio.calibration.warmups`); the simulated side is the p50 save of
the job :meth:`ckptio.simulate.Job.for_run` builds from the run's processes, streams and
in-flight objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckptio import pernode
from ckptio import simulate as sim
from ckptio.results import read_results
from ckptio.testing.cluster import Cluster
from ckptio.testing.cluster.suite import run_suite
from ckptio.workload import make_plan

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
pytest.importorskip("simpy")

TARGETS = ("rgw", "cephfs", "glusterfs")
NODES = (1, 2, 3)
PROBES = (2, 3)
"""Node counts whose processes also run on ONE node: the probe of the aggregate."""
PER_NODE = 2
WORKLOAD = {"preset": "llama3-8b", "gpus": 12, "total_size": "192MiB"}
ITERATIONS = 4
REPEATS = 2
"""Each run this many times, in mirrored order (:func:`run_suite`'s ``repeats``)."""
OPTIONS = ("--no-read", "--keep", "none")
"""The write only; nothing left on the targets (Ceph's OSD keeps its objects in memory)."""
WITHIN = 0.20
"""The issue's bound: simulated within 20% of measured."""


@pytest.fixture(scope="module")
def measured(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ckptio run`` of the workload on 1, 2 and 3 nodes to each target, and the probes of
    each target's aggregate from one node with the processes of 2 and 3
    (:func:`~ckptio.testing.cluster.suite.run_suite`), :data:`REPEATS` times in mirrored
    order: each shape's results in its own directory."""
    out = tmp_path_factory.mktemp("simcheck")
    run_suite(
        cluster,
        out,
        targets=TARGETS,
        nodes=NODES,
        probes=PROBES,
        size=WORKLOAD["total_size"],
        gpus=WORKLOAD["gpus"],
        preset=WORKLOAD["preset"],
        iterations=ITERATIONS,
        repeats=REPEATS,
        options=OPTIONS,
    )
    return out


def steady_seconds(res: Any, target: str, nodes: int) -> dict[str, list[float]]:
    """Per run of ``target`` on ``nodes`` nodes, the write seconds of each steady iteration:
    a run's first iteration is left out where it is a warm-up
    (:func:`ckptio.calibration.warmups`), as the fit leaves it out."""
    from ckptio.calibration import read_rounds, warmups

    runs = [r for r in res.runs.to_pylist() if r["target"] == target and int(r["nodes"]) == nodes]
    ids = {r["run_id"] for r in runs}
    requests = [q for q in res.requests.to_pylist() if q["run_id"] in ids]
    phases = [p for p in res.phases.to_pylist() if p["run_id"] in ids]
    warm = {(w.run_id, w.iteration) for w in warmups(read_rounds(requests, runs, phases))}
    out: dict[str, list[float]] = {}
    for r in runs:
        if (r["run_id"], r["iteration"]) not in warm:
            out.setdefault(r["run_id"], []).append(float(r["write_seconds"]))
    return out


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def comparison(out: Path) -> list[dict[str, Any]]:
    """Per target and node count: the measured write (the steady iterations' mean seconds, as
    GB/s), the simulation's p50 save from the storage fitted on one node, and the model's from
    the same runs (:func:`ckptio.pernode.scaling_rows`: fitted on the fewest nodes)."""
    plan = make_plan(WORKLOAD["preset"], gpus=WORKLOAD["gpus"], total_size=WORKLOAD["total_size"])
    gb = plan.total_bytes / 1e9
    rows = []
    for target in TARGETS:
        dirs = [str(out / f"{target}-{n}n") for n in NODES]
        res = read_results(dirs)
        scaling = {r["nodes"]: r for r in pernode.scaling_rows(res) if r["target"] == target}
        for n in NODES:
            # one node only: its own run, and for n nodes the probe of the aggregate with the
            # processes (and so the streams) of n nodes, run on one node
            probe = [str(out / f"{target}-1n-probe{n * PER_NODE}")] if n in PROBES else []
            (storage,) = sim.fit_storage([dirs[0]], target=target, aggregate=probe)
            (run, *_) = [
                r for r in res.runs.to_pylist() if int(r["nodes"]) == n and r["target"] == target
            ]
            assert int(run["checkpoint_bytes"]) == plan.total_bytes  # the plan ckptio run ran
            side = next(s for s in res.sidecars if s.get("run_id") == run["run_id"])
            job = sim.Job.for_run(
                plan,
                processes=int(run["ranks"]),
                processes_per_node=PER_NODE,
                streams=int(run["streams"]),
                inflight=int((side.get("config") or {}).get("inflight") or 2),
            )
            assert job.nodes == n
            s = sim.simulate(job, storage, phases=["save"], replications=20, seed=n)
            save = s.phases["save"].summary()
            per_run = steady_seconds(res, target, n)
            assert len(per_run) == REPEATS, per_run
            seconds = [x for run_seconds in per_run.values() for x in run_seconds]
            measured = mean(seconds)
            # the probe as a measurement of the same processes and clients: how far apart two
            # runs of one shape land on this machine (the floor under any prediction's miss)
            probed = steady_seconds(read_results(probe), target, 1) if probe else per_run
            probe_seconds = mean([x for v in probed.values() for x in v])
            rows.append(
                {
                    "target": target,
                    "nodes": n,
                    "iterations": len(seconds),
                    "measured_GBps": gb / measured,
                    "measured_range": (gb / max(seconds), gb / min(seconds)),
                    "measured_runs": [gb / mean(v) for v in per_run.values()],
                    "probe_GBps": gb / probe_seconds,
                    # the fit replaying the probe it came from: the probe's n clients are the
                    # job's n nodes in the simulation (each client its node's link)
                    "probe_difference": save["p50_seconds"] / probe_seconds - 1,
                    "probe_runs": [gb / mean(v) for v in probed.values()],
                    "aggregate_GBps": storage.profile.value("aggregate_bandwidth") / 1e9,
                    "simulated_GBps": gb / save["p50_seconds"],
                    "modelled_GBps": scaling[n]["predicted_GBps"],
                    "difference": save["p50_seconds"] / measured - 1,
                    "bound_by": save["bound_by"],
                }
            )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def runs(values: list[float]) -> str:
        return "/".join(f"{v:.3f}" for v in values)

    lines = [
        "target     nodes  measured GB/s (steady iterations: range, n; each run)  "
        "probe GB/s (each run)  aggregate  simulated  modelled  simulated/measured - 1  "
        "simulated/probe - 1  bound by (simulated)"
    ]
    for r in rows:
        lo, hi = r["measured_range"]
        probe = f"{r['probe_GBps']:.3f} ({runs(r['probe_runs'])})" if r["nodes"] > 1 else "-"
        lines.append(
            f"{r['target']:<10} {r['nodes']:>5}  {r['measured_GBps']:.3f} ({lo:.3f}-{hi:.3f}, "
            f"{r['iterations']}; {runs(r['measured_runs'])}){'':>6} {probe:<22} "
            f"{r['aggregate_GBps']:.3f}      {r['simulated_GBps']:.3f}      "
            f"{r['modelled_GBps']:.3f}     {r['difference']:+.0%}{'':>20}"
            f"{r['probe_difference']:+.0%}{'':>15}{r['bound_by']}"
        )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def rows(measured: Path) -> list[dict[str, Any]]:
    rows = comparison(measured)
    print("\n" + table(rows))  # shown with -s (and in the report of a failure below)
    return rows


def test_the_simulation_fitted_on_one_node_reproduces_that_node(rows: list[dict[str, Any]]) -> None:
    """The fit and the replay agree with the runs they came from, all on one node: request
    latencies resampled from its requests, its streams and its node link give back the
    1-node run's throughput, and the probes', replayed as they ran (n clients of two
    processes each: the job's n nodes), theirs. The probe's replay is what the aggregate is
    fitted to (:func:`ckptio.simulate.fit_storage`): at the probe's own throughput its
    resampled latencies, which hold their wait for the storage already, waited for it twice."""
    for r in rows:
        assert abs(r["difference" if r["nodes"] == 1 else "probe_difference"]) <= WITHIN, table(
            rows
        )


def spread(per_run: list[float]) -> float:
    """How far apart the runs of one shape landed: the fastest over the slowest, less 1."""
    return max(per_run) / min(per_run) - 1


@pytest.mark.parametrize(("target", "nodes"), [(t, n) for n in PROBES for t in TARGETS])
def test_the_simulation_fitted_on_one_node_predicts_two_and_three(
    rows: list[dict[str, Any]], target: str, nodes: int
) -> None:
    """The issue's check 2: within 20% of the measured write at 2 and 3 nodes.

    Decided only where the measurement is repeatable within that bound: where the two runs
    of the job, or of the probe the prediction rests on, landed more than 20% apart (the
    machine's load moved between them: other work beside it), neither side is known to
    within the bound, and the check skips, saying so with the figures, instead of passing or
    failing on that run's noise. It still fails on any repeatable miss."""
    (r,) = [r for r in rows if r["target"] == target and r["nodes"] == nodes]
    apart = {"job": spread(r["measured_runs"]), "probe": spread(r["probe_runs"])}
    if max(apart.values()) > WITHIN:
        pytest.skip(
            f"{target} on {nodes} nodes: not decidable in this session: the two runs of the "
            + " and of the ".join(f"{k} landed {v:.0%} apart" for k, v in apart.items())
            + f" (more than the {WITHIN:.0%} bound; the prediction missed by "
            f"{r['difference']:+.0%})\n{table(rows)}"
        )
    assert abs(r["difference"]) <= WITHIN, table(rows)
