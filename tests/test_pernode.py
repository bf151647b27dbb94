"""ckptio.pernode on result tables written for the purpose (hosts, phases and requests chosen
so the figures are known): each node's figures and the slowest node; the model fitted from
the fewest nodes against runs on more, flagged past 25% with the reason. The same sections
from real runs on the namespace cluster are checked in test_cluster_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptio import errors, pernode, results
from ckptio.report import build_report

pytest.importorskip("pyarrow")

MB = 10**6


def _run(
    out: Path,
    label: str,
    nodes: int,
    *,
    seconds: dict[str, float],
    total_GBps: float,
    request_seconds: float = 0.08,
) -> str:
    """One run of ``label`` over ``nodes`` hosts x 2 ranks, 8 MB per rank in one request each
    (``request_seconds`` long); rank write times from ``seconds`` (host -> seconds, the same for
    its two ranks); the runs row's write throughput ``total_GBps``."""
    run_id = results.new_run_id(label)
    hosts = [f"node{i}" for i in range(nodes)]
    phases, reqs = [], []
    for i, host in enumerate(hosts):
        for rank in (2 * i, 2 * i + 1):
            for phase, secs in (("write", seconds[host]), ("read", seconds[host] / 2)):
                phases.append(
                    {
                        "run_id": run_id,
                        "target": label,
                        "rank": rank,
                        "iteration": 0,
                        "phase": phase,
                        "bytes": 8 * MB,
                        "seconds": secs,
                        "start": 0.0,
                        "end": secs,
                        "cache": "n/a",
                        **results.ADDED_COLUMNS[
                            "phases"
                        ],  # the columns added since, at their defaults
                        "host": host,
                    }
                )
            for size in (4 * MB, 8 * MB):  # two sizes: latency and bandwidth both fit
                reqs.append(
                    {
                        "run_id": run_id,
                        "target": label,
                        "rank": rank,
                        "iteration": 0,
                        "phase": "write",
                        "op": "write",
                        "key": f"k{rank}-{size}",
                        "nbytes": size,
                        "start": 0.0,
                        "end": request_seconds * size / (8 * MB),
                        "seconds": request_seconds * size / (8 * MB),
                        "attempt": 1,
                        "outcome": "ok",
                        "backend": "pfs",
                        "thread": 1,
                        "host": host,
                    }
                )
    ranks = 2 * nodes
    total = 8 * MB * ranks
    run = {c: None for c, _ in results.RUN_COLUMNS} | {
        "run_id": run_id,
        "target": label,
        "url": f"pfs:///x/{label}",
        "backend": "pfs",
        "preset": "llama3-8b",
        "scale": 1e-4,
        "ranks": ranks,
        "writing_ranks": ranks,
        "iteration": 0,
        "checkpoint_bytes": total,
        "objects": ranks,
        "write_seconds": total / total_GBps / 1e9,
        "write_GBps": total_GBps,
        "read_GBps": total_GBps,
        "read_seconds": 1.0,
        "min_rank_write_GBps": total_GBps / ranks,
        "min_rank_read_GBps": 0.0,
        "requests": len(reqs),
        "retries": 0,
        "throttled": 0,
        "errors": 0,
        "streams": 1,
        "part_size": 8 * MB,
        "emulated": False,
        "mock": False,
        "site": "node0",
        "kind": "run",
        "layout": "file-per-shard",
        "nodes": nodes,
        "generate_GBps": 1.0,
    }
    results.write_run(
        out,
        requests=reqs,
        phases=phases,
        runs=[run],
        sidecar=results.sidecar(run_id, config={"inflight": 1}),
    )
    return run_id


def test_each_node_and_the_slowest(tmp_path: Path) -> None:
    _run(
        tmp_path, "cephfs", 3, seconds={"node0": 1.0, "node1": 2.5, "node2": 1.25}, total_GBps=0.02
    )
    rows = pernode.node_rows(results.read_results([tmp_path]))
    by = {r["host"]: r for r in rows}
    assert sorted(by) == ["node0", "node1", "node2"]
    assert by["node1"]["ranks"] == [2, 3] and by["node1"]["write_bytes"] == 16 * MB
    assert by["node1"]["write_GBps"] == pytest.approx(16 * MB / 2.5 / 1e9)
    assert by["node1"]["read_seconds"] == pytest.approx(1.25)
    assert by["node0"]["requests"] == 4
    assert [r["host"] for r in rows if r["slowest"]] == ["node1"]
    assert by["node1"]["vs_fastest"] == pytest.approx(2.5)


def test_a_run_on_one_host_has_no_per_node_rows(tmp_path: Path) -> None:
    _run(tmp_path, "local", 1, seconds={"node0": 1.0}, total_GBps=0.2)
    res = results.read_results([tmp_path])
    assert pernode.node_rows(res) == [] and pernode.sections(res) == []


def test_the_model_fitted_on_one_node_against_more_nodes(tmp_path: Path) -> None:
    """One node: 2 ranks x 8 MB at 0.16 GB/s (0.1 s). The model fitted there scales with the
    nodes (no shared limit measurable from one node): flat measurements at 2 and 3 nodes are
    flagged, and the reason names the limit the nodes share; given the aggregate measured
    on 3 nodes, the model agrees there."""
    one = {"node0": 0.1}
    _run(tmp_path, "t", 1, seconds=one, total_GBps=0.16, request_seconds=0.1)
    _run(tmp_path, "t", 2, seconds={"node0": 0.2, "node1": 0.2}, total_GBps=0.16)
    _run(tmp_path, "t", 3, seconds=dict.fromkeys(("node0", "node1", "node2"), 0.3), total_GBps=0.16)
    rows = pernode.scaling_rows(results.read_results([tmp_path]))
    assert [r["nodes"] for r in rows] == [1, 2, 3]
    one_node, two, three = rows
    assert one_node["predicted_GBps"] == pytest.approx(0.16, rel=0.25)
    assert not one_node["flagged"]
    assert two["predicted_GBps"] > 1.5 * two["measured_GBps"]
    assert two["flagged"] and three["flagged"] and three["difference"] < -0.25
    assert "a limit the nodes share cannot be measured from one node" in three["why"]
    assert "0.16 GB/s on the most nodes" in three["why"]
    assert three["with_aggregate_GBps"] == pytest.approx(0.16, rel=0.25)


def test_agreement_within_the_threshold_is_not_flagged(tmp_path: Path) -> None:
    _run(tmp_path, "t", 1, seconds={"node0": 0.1}, total_GBps=0.16, request_seconds=0.1)
    _run(tmp_path, "t", 2, seconds={"node0": 0.1, "node1": 0.1}, total_GBps=0.3)
    rows = pernode.scaling_rows(results.read_results([tmp_path]))
    assert [r["flagged"] for r in rows] == [False, False], rows
    assert rows[1]["why"] == ""


def test_the_report_shows_both_sections(tmp_path: Path) -> None:
    data = tmp_path / "results"
    _run(data, "t", 1, seconds={"node0": 0.1}, total_GBps=0.16, request_seconds=0.1)
    _run(data, "t", 3, seconds=dict.fromkeys(("node0", "node1", "node2"), 0.3), total_GBps=0.16)
    rep = build_report([str(data)], str(tmp_path / "report"))
    assert [s["title"] for s in rep["nodes"]] == [
        "Per node",
        "The model against runs on more nodes",
    ]
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Per node" in md and "## The model against runs on more nodes" in md
    assert "slowest node" in md and "a limit the nodes share" in md
    html = (tmp_path / "report" / "index.html").read_text()
    assert "<h2>Per node</h2>" in html


def test_the_fitted_profile_is_one_nodes(tmp_path: Path) -> None:
    """The profile the scaling check fits (what ckptio simulate may take from a cluster)."""
    _run(tmp_path, "t", 1, seconds={"node0": 0.1}, total_GBps=0.16, request_seconds=0.1)
    _run(tmp_path, "t", 3, seconds=dict.fromkeys(("node0", "node1", "node2"), 0.3), total_GBps=0.16)
    res = results.read_results([tmp_path])
    prof = pernode.fitted_profile(res, "t")
    assert prof.name == "fitted:t@1node"
    assert prof.streams == 2  # one stream per process (the runs table), two processes a node
    assert prof.value("stream_bandwidth") == pytest.approx(80e6, rel=0.05)
    assert prof.value("aggregate_bandwidth") == float("inf")  # one node cannot measure it
    with pytest.raises(errors.InvalidArgumentError, match="no measured write requests"):
        pernode.fitted_profile(res, "nope")
