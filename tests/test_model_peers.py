"""The model's peer copies of the fast tier: the restore of a replaced node from a surviving
peer, the replication after each save, and restarts priced by which copy survives."""

import itertools
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from ckptio import errors
from ckptio.cli import main
from ckptio.costmodel import DEFAULT_P_LOSE_ANOTHER, DEFAULT_P_LOSE_NODE
from ckptio.profiles import load_profile
from ckptio.sensitivity import PEER_ASSUMPTIONS, sensitivity
from ckptio.stallmodel import Conditions, estimate, preset_workload, project

S3, NVME, LUSTRE = (load_profile(n) for n in ("cloud-s3", "local-nvme", "abci-lustre"))
W = preset_workload("gpt3-175b", gpus=1536)
C = Conditions.reference(W.gpus)


def _tiered(**changes) -> dict:
    return project(W, S3, replace(C, **changes), local=NVME)


def test_no_peers_is_the_tiered_projection_exactly() -> None:
    """k = 0: every figure is the tiered target's as it was, to the last bit."""
    plain, zero = project(W, S3, C, local=NVME), _tiered(peers=0)
    assert zero == plain
    p = C.p_lose_node
    assert (
        zero["restore_seconds"]
        == (1 - p) * zero["restore_fast_seconds"] + p * zero["restore_durable_seconds"]
    )
    assert zero["target"] == "cloud-s3+local-nvme" and "peers" not in zero


def test_more_copies_are_never_slower() -> None:
    """Restore, restart and the restart's cost fall (or stay) with every copy added, whether
    the peer is faster than the durable tier (S3) or slower (Lustre: capped at its time)."""
    for durable in (S3, LUSTRE):
        rows = [project(W, durable, replace(C, peers=k), local=NVME) for k in range(6)]
        for a, b in itertools.pairwise(rows):
            assert b["restore_seconds"] <= a["restore_seconds"]
            assert b["restart_seconds"] <= a["restart_seconds"]
            assert b["restart_cost_per_day"] <= a["restart_cost_per_day"]
    one = _tiered(peers=1)
    assert one["restore_seconds"] < project(W, S3, C, local=NVME)["restore_seconds"] / 3
    lustre = project(W, LUSTRE, replace(C, peers=1), local=NVME)
    assert lustre["peer_slower_than_durable"]  # 70 GB/s shared beats two steps off one NVMe
    assert not one["peer_slower_than_durable"]


def test_which_copy_survives_prices_the_restore() -> None:
    """Losing up to k nodes at once leaves a copy of each; losing more reads the durable
    tier: with k copies, p_lose_node * p_lose_another**k of the failures."""
    p, q = DEFAULT_P_LOSE_NODE, DEFAULT_P_LOSE_ANOTHER
    for k in (1, 2, 3):
        t = _tiered(peers=k)
        assert t["restore_fast_probability"] == pytest.approx(1 - p)
        assert t["restore_durable_probability"] == pytest.approx(p * q**k)
        assert t["restore_peer_probability"] == pytest.approx(p * (1 - q**k))
        assert t["restore_seconds"] == pytest.approx(
            (1 - p) * t["restore_fast_seconds"]
            + p * (1 - q**k) * t["restore_peer_seconds"]
            + p * q**k * t["restore_durable_seconds"]
        )
        assert t["target"] == (
            "cloud-s3+local-nvme+peer" if k == 1 else f"cloud-s3+local-nvme+peer{k}"
        )
        assert t["p_lose_another_source"].startswith("assumption")
    assert "from a peer's copy" in _tiered(peers=1)["restart_basis"]


def test_every_copy_lost_restores_from_the_durable_tier() -> None:
    """Every failure loses nodes (p_lose_node 1) and nearly always more than the copies: the
    restore is the durable tier's; with no other node lost, it is the peer's."""
    durable = _tiered(p_lose_node=1.0)["restore_durable_seconds"]
    assert _tiered(p_lose_node=1.0)["restore_seconds"] == durable  # no copies at all
    gone = _tiered(p_lose_node=1.0, peers=1, p_lose_another=0.999)
    assert gone["restore_durable_probability"] == pytest.approx(0.999)
    assert gone["restore_seconds"] == pytest.approx(durable, rel=2e-3)
    kept = _tiered(p_lose_node=1.0, peers=1, p_lose_another=0.0)
    assert kept["restore_seconds"] == pytest.approx(kept["restore_peer_seconds"])
    assert kept["restore_peer_seconds"] < durable


def test_fan_in_shares_the_peers_fast_tier_and_link() -> None:
    """A peer serving f replacement nodes reads its own step and f copies from its fast tier
    and sends f copies over its link: the slower binds."""
    node = W.node_bytes
    one, three = _tiered(peers=2), _tiered(peers=2, peer_fan_in=3)
    assert one["restore_peer_binding"] == three["restore_peer_binding"] == "peer's fast tier"
    read = {
        f: estimate(
            replace(
                W,
                total_bytes=W.total_bytes * (1 + f),
                bytes_per_rank=W.bytes_per_rank * (1 + f),
                objects_per_rank=W.objects_per_rank * (1 + f),
            ),
            NVME,
            phase="restore",
        ).seconds
        for f in (1, 3)
    }
    assert one["restore_peer_seconds"] == pytest.approx(read[1])
    assert three["restore_peer_seconds"] == pytest.approx(read[3])
    assert three["restore_peer_seconds"] > 1.9 * one["restore_peer_seconds"]  # 4 steps vs 2
    slow = _tiered(peers=2, peer_fan_in=3, peer_bandwidth=1e9)  # a 1 GB/s link binds
    assert slow["restore_peer_binding"] == "peer's node link"
    assert slow["restore_peer_seconds"] == pytest.approx(3 * node / 1e9)
    assert slow["peer_bandwidth_source"] == "given (--peer-bandwidth)"
    assert "cloud-s3's node_bandwidth" in one["peer_bandwidth_source"]
    assert one["peer_bandwidth"] == S3.value("node_bandwidth")


def test_the_fan_in_is_the_restore_planner_s_on_the_job_s_ring() -> None:
    """Where no fan-in is given, the model takes the restore planner's on the job's ring with
    ``peers`` neighbouring nodes lost: on 3 nodes with 2 copies, two lost leave one survivor,
    which serves both replacement nodes (its fast tier reads 3 steps); on the founding
    example's 192 nodes the planner spreads them (fan-in 1). A fan-in given wins."""
    from ckptio.stallmodel import peer_fan_in

    small = _tiered(peers=2, gpus=24)  # 3 nodes of 8
    assert small["peer_fan_in"] == 2
    assert small["peer_fan_in_source"] == (
        "the restore planner's assignment on a ring of 3 nodes (8 ranks each, 2 copies), 2 "
        "neighbouring nodes lost (the worst placement)"
    )
    assert small["restore_peer_seconds"] == pytest.approx(
        _tiered(peers=2, gpus=24, peer_fan_in=2)["restore_peer_seconds"]
    )
    assert (
        small["restore_peer_seconds"]
        > _tiered(peers=2, gpus=24, peer_fan_in=1)["restore_peer_seconds"]
    )
    assert peer_fan_in(W, replace(C, peers=2, gpus=1536))[0] == 1
    assert peer_fan_in(W, replace(C, peers=2, peer_fan_in=3)) == (3, "given (--peer-fan-in)")
    with pytest.raises(errors.InvalidArgumentError, match="the job has 3 node"):
        peer_fan_in(W, replace(C, peers=3, gpus=24))


def test_replication_blocks_when_it_outlasts_the_interval() -> None:
    """The replication starts when the save returns; a save that finds it unfinished waits
    for the rest, which adds to the stall (and nothing is added while it fits)."""
    k, node = 2, W.node_bytes
    fits = _tiered(peers=k)
    assert fits["replication_fits_interval"] and fits["replication_wait_seconds"] == 0
    assert fits["stall_seconds"] == _tiered()["stall_seconds"]
    assert fits["replication_bytes_per_node"] == k * node
    assert fits["fast_tier_bytes_per_node"] == (k + 1) * node
    # the fast tier writes the k copies and reads the step to send it: that binds on NVMe
    sent = (k + 1) * node / S3.value("node_bandwidth")
    assert fits["replication_seconds"] >= sent
    assert fits["replication_binding"] == "fast tier"
    interval = 90.0  # shorter than the save and the replication together
    short, base = _tiered(peers=k, interval=interval), _tiered(interval=interval)
    assert not short["replication_fits_interval"]
    wait = short["write_seconds"] + short["replication_seconds"] - interval
    assert short["replication_wait_seconds"] == pytest.approx(wait)
    assert short["stall_seconds"] == pytest.approx(base["stall_seconds"] + wait)
    slow = _tiered(peers=k, peer_bandwidth=1e9)  # the link binds: k copies and the drain's
    assert slow["replication_binding"] == "node link"
    assert slow["replication_seconds"] == pytest.approx((k + 1) * node / 1e9)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"peers": -1}, "peers must be >= 0"),
        ({"peer_fan_in": 0}, "peer_fan_in must be >= 1"),
        ({"p_lose_another": 1.0}, "p_lose_another: a probability in \\[0, 1\\)"),
        ({"peer_bandwidth": 0.0}, "peer_bandwidth must be > 0"),
    ],
)
def test_bad_peer_conditions_say_which(changes: dict, words: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=words):
        Conditions(**changes)


def test_sensitivity_varies_the_peer_assumptions_only_with_peers() -> None:
    rows = {r["assumption"]: r for r in sensitivity(W, S3, replace(C, peers=1), local=NVME)}
    assert set(PEER_ASSUMPTIONS) <= set(rows)
    assert rows["p_lose_another"]["high"] > rows["p_lose_another"]["low"]  # more losses cost
    plain = {r["assumption"] for r in sensitivity(W, S3, C, local=NVME)}
    assert not set(PEER_ASSUMPTIONS) & plain


def test_model_cli_shows_the_peer_target_beside_the_tiered_one(capsys) -> None:
    argv = ["model", "--preset", "gpt3-175b", "--gpus", "1536", "--profile", "cloud-s3"]
    argv += ["--local", "local-nvme", "--peers", "1", "--mtbf", "5.27h", "--price", "2"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [t["target"] for t in out["targets"]]
    assert names == ["cloud-s3", "cloud-s3+local-nvme", "cloud-s3+local-nvme+peer"]
    _, tiered, peer = out["targets"]
    assert peer["restart_seconds"] < tiered["restart_seconds"]
    assert peer["peers"] == 1 and "peers" not in tiered
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "1 peer copy (projected)" in text and "from a peer" in text
    assert main([*argv, "--p-lose-another", "1"]) != 0
    assert "p_lose_another: a probability in [0, 1)" in " ".join(capsys.readouterr().err.split())


def _restore_rows(rates: list[float], run: str = "r1") -> list[dict]:
    """``restore-peer`` rows of a run as ``ckptio run --replicas 1`` writes them, one round
    per rate: node1's two ranks restored from a peer (their bytes, the slower's seconds give
    the rate), node0's from its own disk."""
    rows = []
    for i, rate in enumerate(rates):
        for rank, host, path, nbytes, secs in (
            (0, "n0", "local", 0, 0.01),
            (1, "n1", "peer", 2 << 20, (4 << 20) / rate / 2),
            (2, "n1", "peer", 2 << 20, (4 << 20) / rate),
        ):
            rows.append(
                {"run_id": run, "iteration": i, "rank": rank, "phase": "restore-peer",
                 "host": host, "restore_path": path, "peer_bytes": nbytes, "seconds": secs}
            )  # fmt: skip
    # another phase's rows are not the peer restore's
    rows += [{**r, "phase": "restore", "restore_path": "local"} for r in rows[:1]]
    return rows


def test_the_peer_link_is_fitted_from_measured_restores_from_a_peer() -> None:
    """Per round, the replaced node's peer bytes over its slowest rank's seconds; a first
    round much slower than the others is a warm-up, left out; the pooled figure has the
    interval its rounds' spread gives, and says what it is."""
    from ckptio.calibration import fit_peer_link

    assert fit_peer_link(_restore_rows([])) is None
    assert fit_peer_link([{**r, "restore_path": "local"} for r in _restore_rows([1e8])]) is None
    fit = fit_peer_link(_restore_rows([2e7, 1e8, 1.2e8, 0.9e8]))
    assert fit is not None and fit.warmup == 1 and fit.fan_in == 1
    assert fit.per_round == pytest.approx((1e8, 1.2e8, 0.9e8))
    assert fit.bandwidth == pytest.approx(3 * (4 << 20) / sum((4 << 20) / r for r in fit.per_round))
    assert fit.interval is not None and fit.interval.low < fit.bandwidth < fit.interval.high
    words = fit.source()
    assert "fitted from 3 measured restore-peer rounds" in words and "warm-up" in words
    assert "95% interval" in words and "effective" in words
    one = fit_peer_link(_restore_rows([1e8]))
    assert one is not None and one.interval is None and "no interval: one round" in one.source()


def _lost_rows(run: str, fan_in: int, rates: list[float], slower: float = 1.0) -> list[dict]:
    """``restore-peer`` rows as ``ckptio run --replicas 2 --lose N`` writes them, a rank per
    node: at fan-in 1 node n2 lost, n1 sends it 4 MiB; at fan-in 2 nodes n1 and n2 lost, n0
    sends each 4 MiB. The round takes the sender's bytes over ``rate``, times ``slower``."""
    lost = ["n2"] if fan_in == 1 else ["n1", "n2"]
    sender = "n1" if fan_in == 1 else "n0"
    rows = []
    for i, rate in enumerate(rates):
        secs = fan_in * (4 << 20) / rate * slower
        for rank, node in enumerate(("n0", "n1", "n2")):
            gone = node in lost
            rows.append(
                {"run_id": run, "iteration": i, "rank": rank, "phase": "restore-peer",
                 "host": "h", "node": node, "lost_nodes": ",".join(lost),
                 "restore_path": "peer" if gone else "local",
                 "peer_bytes": 4 << 20 if gone else 0,
                 "peer_sources": json.dumps({sender: 4 << 20}) if gone else "",
                 "seconds": secs if gone else 0.01}
            )  # fmt: skip
    return rows


def test_the_fan_in_and_a_sender_s_link_are_taken_from_what_the_restore_did() -> None:
    """The rows name the nodes lost and who sent each rank its bytes: the fan-in is the most
    lost nodes one sender served (1, then 2), and the link the busiest sender's bytes over the
    round's time, the same figure at either fan-in for the same link. Where both fan-ins
    were run, the link is fitted at fan-in 1 and the model's ``f * node / link`` is checked
    against the restores at fan-in 2: their ratio, with its interval, in the link's source."""
    from ckptio.calibration import check_fan_in, fit_peer_link, peer_rounds

    one = _lost_rows("one", 1, [1e8, 1.1e8, 0.9e8])
    two = _lost_rows("two", 2, [1e8, 1.05e8, 0.95e8], slower=1.5)
    assert [r.fan_in for r in peer_rounds(one + two)] == [1, 1, 1, 2, 2, 2]
    fit1, fit2 = fit_peer_link(one), fit_peer_link(two)
    assert fit1 is not None and fit2 is not None
    assert (fit1.fan_in, fit2.fan_in) == (1, 2)
    assert fit1.bandwidth == pytest.approx(1e8, rel=0.02)
    assert fit2.bandwidth == pytest.approx(1e8 / 1.5, rel=0.02)  # 2 nodes' bytes, 1.5x slower
    assert "at measured fan-in 2" in fit2.source() and fit2.check == ""
    check = check_fan_in(one + two)
    assert check is not None and check.fan_in == 2
    assert check.ratio == pytest.approx(1.5, rel=0.03)
    assert check.interval is not None and check.interval.low < 1.5 < check.interval.high
    both = fit_peer_link(one + two)  # the link from the rounds at fan-in 1, checked at 2
    assert both is not None and both.check == check.text()
    assert both.bandwidth == fit1.bandwidth and both.per_round == fit1.per_round
    assert "took 1.49x the model" in both.source() and "95% interval" in check.text()
    assert check_fan_in(one) is None and check_fan_in(two) is None


def test_a_fitted_peer_link_prices_the_peer_restore_with_its_interval() -> None:
    """The fitted link replaces the durable profile's (an assumption) wherever no figure is
    given: the pooled figure for the projection, each round's for its interval; a link given
    (--peer-bandwidth) wins. The fan-in is the restore planner's on the job's ring and says
    so."""
    from ckptio.calibration import fit_peer_link, project_rounds

    fit = fit_peer_link(_restore_rows([1e8, 1.2e8, 0.9e8]))
    assert fit is not None
    c = replace(C, peers=1)
    got = project_rounds(W, c, (S3, NVME), [], peer_link=fit)
    assert got["peer_bandwidth"] == pytest.approx(fit.bandwidth)
    assert got["peer_bandwidth_source"] == fit.source()
    assert got["restore_peer_binding"] == "peer's node link"
    assert got["restore_peer_seconds"] == pytest.approx(W.node_bytes / fit.bandwidth)
    low, high = got["restore_peer_seconds_low"], got["restore_peer_seconds_high"]
    assert low < got["restore_peer_seconds"] < high
    assert got["peer_bandwidth_low"] < fit.bandwidth < got["peer_bandwidth_high"]
    assert got["peer_fan_in_source"].startswith("the restore planner's assignment on a ring")
    assumed = project(W, S3, c, local=NVME)
    assert "cloud-s3's node_bandwidth" in assumed["peer_bandwidth_source"]
    given = project_rounds(W, replace(c, peer_bandwidth=5e9), (S3, NVME), [], peer_link=fit)
    assert given["peer_bandwidth"] == 5e9 and given["peer_bandwidth_source"].startswith("given")
    assert "restore_peer_seconds_low" not in given
    # no peer copies: the fit changes nothing
    assert project_rounds(W, C, (S3, NVME), [], peer_link=fit) == project(W, S3, C, local=NVME)


def test_the_replacement_writes_its_fast_tier_as_the_bytes_arrive() -> None:
    """The replacement node keeps what it receives on its own fast tier (not read back): a
    restore from a peer takes at least that write, which binds where the fast tier's writes
    are slow (each object's create + fsync + rename at 5 s) and its reads are not."""
    got = _tiered(peers=1, peer_bandwidth=1e15)
    assert got["restore_peer_seconds"] >= estimate(W, NVME, phase="write").seconds
    assert "replacement writes its local-nvme" in got["restore_peer_detail"]
    slow = NVME.with_overrides({"metadata_latency": 5.0})
    got = project(W, S3, replace(C, peers=1, peer_bandwidth=1e15), local=slow)
    assert got["restore_peer_binding"] == "replacement's fast tier"
    assert got["restore_peer_seconds"] == pytest.approx(estimate(W, slow, phase="write").seconds)


NODE_PER_RANK = (
    "import os, sys; os.environ['CKPTIO_NODE'] = 'n' + os.environ['OMPI_COMM_WORLD_RANK']; "
    "from ckptio.cli import main; sys.exit(main(sys.argv[1:]))"
)
"""``ckptio`` under mpiexec with each rank standing for a node of its own."""


@pytest.mark.mpi
def test_model_from_a_run_with_peer_copies_takes_its_node_link(tmp_path, capsys) -> None:
    """``ckptio run --replicas 1`` (2 ranks, each its own node) measures a restore from a
    peer copy; ``ckptio model --from`` its results prices the peer path with the node link
    fitted from it (said so, with the rounds it came from), not the profile's. A run of 3
    ranks with ``--replicas 2 --lose 2`` records the two nodes lost and the one survivor
    that sent them their bytes (fan-in 2), and the model checks its ``f * node / link``
    against it; ``--lose`` as many nodes as the job has is refused."""
    from ckptio.calibration import fit_peer_link
    from ckptio.results import read_results
    from tests.test_mpi_checkpoint import mpiexec, run_mpi

    out = tmp_path / "out"
    run_mpi(
        2, "-c", NODE_PER_RANK, "run", f"file://{tmp_path}/durable", "--local",
        f"file://{tmp_path}/fast/{{rank}}", "--replicas", "1", "--preset", "llama3-8b",
        "--total-size", "8MiB", "--iterations", "3", "--out", str(out),
    )  # fmt: skip
    fit = fit_peer_link(read_results([out]).phases)
    assert fit is not None and fit.fan_in == 1 and fit.bandwidth > 0
    argv = ["model", "--from", str(out), "--preset", "gpt3-175b", "--gpus", "1536"]
    argv += ["--profile", "cloud-s3", "--local", "local-nvme", "--peers", "1", "--json"]
    assert main(argv) == 0
    peer = json.loads(capsys.readouterr().out)["targets"][-1]
    assert peer["target"] == "cloud-s3+local-nvme+peer"
    assert peer["peer_bandwidth"] == pytest.approx(fit.bandwidth)
    assert peer["peer_bandwidth_source"] == fit.source()
    assert "measured restore-peer round" in peer["peer_bandwidth_source"]
    assert peer["peer_fan_in_source"] == (
        "the restore planner's assignment on a ring of 192 nodes (8 ranks each, 1 copy), 1 "
        "neighbouring node lost (the worst placement)"
    )
    assert main(argv[:-1]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "fitted from" in text and "fan-in 1: the restore planner's" in text
    # 3 ranks (nodes n0-n2), 2 copies, the last two nodes lost at once: n0 serves both
    two = tmp_path / "two"
    run_mpi(
        3, "-c", NODE_PER_RANK, "run", f"file://{tmp_path}/durable2", "--local",
        f"file://{tmp_path}/fast2/{{rank}}", "--replicas", "2", "--lose", "2", "--preset",
        "llama3-8b", "--total-size", "12MiB", "--iterations", "2", "--out", str(two),
    )  # fmt: skip
    rows = [r for r in read_results([two]).phases.to_pylist() if r["phase"] == "restore-peer"]
    assert {r["lost_nodes"] for r in rows} == {"n1,n2"}
    for r in rows:
        lost = r["node"] in ("n1", "n2")
        assert r["restore_path"] == ("peer" if lost else "local"), r
        assert (json.loads(r["peer_sources"]) if lost else {}) == (
            {"n0": r["peer_bytes"]} if lost else {}
        )
    fit2 = fit_peer_link(read_results([two]).phases)
    assert fit2 is not None and fit2.fan_in == 2
    argv[2:3] = [str(out), str(two)]
    assert main(argv[:-1]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "measured restores at fan-in 2 took" in text
    # as many nodes lost as the job has: refused, naming the problem
    bad = subprocess.run(
        [*mpiexec(), "-n", "2", sys.executable, "-c", NODE_PER_RANK, "run",
         f"file://{tmp_path}/durable3", "--local", f"file://{tmp_path}/fast3/{{rank}}",
         "--replicas", "1", "--lose", "2", "--preset", "llama3-8b", "--total-size", "8MiB",
         "--iterations", "1"],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"},
    )  # fmt: skip
    assert bad.returncode != 0 and "--lose 2: the job runs on 2 node(s)" in bad.stderr
