"""The restore planner of peer copies (:func:`ckptio.checkpoint.peer_plan.assign`) and what it
does on a ring that loses nodes (:func:`ckptio.checkpoint.peer_plan.ring_fan_in`): pure, no
cluster. The restores it plans are run under MPI in ``tests/test_peers.py`` and on the
namespace cluster in ``tests/test_cluster_peers.py``."""

from __future__ import annotations

import pytest

from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint import peer_plan as peers

STEP = 7


def key(rank: int, index: int = 0) -> str:
    return fmt.shard_key(STEP, rank, index).partition("/")[2]


def senders(plan: dict) -> dict[int, set[int]]:
    """Each sending rank -> the ranks it sends to (a copy on the rank's own root aside)."""
    out: dict[int, set[int]] = {}
    for t in plan["transfers"]:
        if t["src"] != t["dst"]:
            out.setdefault(t["src"], set()).add(t["dst"])
    return out


def test_two_lost_neighbours_are_served_by_two_survivors_where_the_ring_has_them() -> None:
    """A ring of 4 nodes (a rank each), 2 copies on the next 2 nodes; nodes 3 and 0 lost (a
    block round the ring's end). Node 3's copies are on 0 and 1: only 1 survives. Node 0's
    are on 1 and 2. A balance of ranks alone took node 0's from node 1 (the lower of two
    idle holders) and then node 3's from node 1 too: one survivor serving two replacement
    nodes while node 2 idles. Placed most constrained first, node 1 serves 3 and node 2
    serves 0."""
    copies = [{}, {3: {STEP}, 0: {STEP}}, {0: {STEP}, 1: {STEP}}, {}]
    own = [set(), {STEP}, {STEP}, set()]
    plan = peers.assign(STEP, [[key(0)], [], [], [key(3)]], own, copies, False, {}, set())
    assert plan is not None and plan["durable"] == {}
    assert senders(plan) == {1: {3}, 2: {0}}


def test_a_node_s_ranks_are_spread_over_its_survivors_without_raising_the_fan_in() -> None:
    """3 nodes x 2 ranks (ranks 0-1 on node 0, ...), 2 copies, node 0 lost: its two ranks'
    copies are on nodes 1 and 2. Each survivor serves one replacement node either way; the
    bytes are split between them (one rank each) instead of both from node 1."""
    nodes = [0, 0, 1, 1, 2, 2]
    copies = [{}, {}, {0: {STEP}}, {1: {STEP}}, {0: {STEP}}, {1: {STEP}}]
    own = [set(), set(), *[{STEP}] * 4]
    sizes = {key(0): 10, key(1): 10}
    missing = [[key(0)], [key(1)], [], [], [], []]
    plan = peers.assign(STEP, missing, own, copies, False, sizes, set(), nodes)
    assert plan is not None
    by_node = {nodes[s]: {nodes[d] for d in ds} for s, ds in senders(plan).items()}
    assert by_node == {1: {0}, 2: {0}}


def test_the_plan_keeps_its_rules_own_copy_then_owner_then_a_good_copy() -> None:
    """A copy on the rank's own root is taken there (no transfer); an object whose owner's
    root holds it comes from the owner before any copy; a holding that failed a check
    (``bad``) is never used; an object no one holds comes from the durable tier, or the plan
    is None without one."""
    # rank 0 lacks its own object (its copy is on its own root, and on rank 2) and rank 1's
    # (the owner, rank 1, holds it; so does rank 2's copy); rank 3's object is held by a
    # copy on rank 2 that failed its check only
    copies = [{0: {STEP}}, {}, {0: {STEP}, 1: {STEP}, 3: {STEP}}, {}]
    own = [set(), {STEP}, {STEP}, set()]
    missing = [[key(0), key(1)], [], [], [key(3)]]
    plan = peers.assign(STEP, missing, own, copies, True, {}, {(STEP, 2, 3)})
    assert plan is not None
    got = {(t["src"], t["dst"], t["kind"], t["source"]) for t in plan["transfers"]}
    assert got == {(0, 0, "copy", 0), (1, 0, "own", 1)}
    assert plan["durable"] == {"3": [key(3)]}
    assert peers.assign(STEP, missing, own, copies, False, {}, {(STEP, 2, 3)}) is None


@pytest.mark.parametrize(
    ("nodes", "per_node", "k", "lost", "fan_in", "durable"),
    [
        (3, 1, 2, 2, 2, False),  # one survivor serves both replacement nodes
        (3, 4, 2, 2, 2, False),
        (3, 2, 2, 1, 1, False),
        (4, 2, 2, 2, 1, False),
        (4, 2, 3, 2, 1, False),  # a balance of bytes alone split node 0 over both survivors: 2
        (6, 2, 4, 4, 2, False),  # 4 lost, 2 survivors: 2 each at best
        (64, 8, 2, 2, 1, False),  # was 2 with a balance of ranks alone (the block 63, 0)
        (64, 8, 3, 3, 1, False),
        (64, 8, 1, 2, 1, True),  # one copy, two neighbours lost: the first one's is gone
        (5, 2, 2, 3, 1, True),
    ],
)
def test_the_fan_in_of_a_ring_is_what_the_planner_assigns(
    nodes: int, per_node: int, k: int, lost: int, fan_in: int, durable: bool
) -> None:
    got = peers.ring_fan_in(nodes, per_node, k, lost)
    assert (got.fan_in, got.durable) == (fan_in, durable)
    assert f"a ring of {nodes} nodes" in got.source() and f"{lost} neighbouring" in got.source()


@pytest.mark.parametrize("args", [(1, 8, 1, 1), (3, 8, 3, 1), (3, 8, 1, 3), (3, 0, 1, 1)])
def test_a_ring_that_cannot_be_is_refused(args: tuple[int, int, int, int]) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="needs 2 <= nodes"):
        peers.ring_fan_in(*args)


def test_the_fan_in_of_a_ring_plans_what_every_placement_would() -> None:
    """ring_fan_in plans one block of those that are others shifted, and every block near the
    ring's end; planning every placement gives the same fan-in and the same durable reads, on
    every ring of up to 12 nodes (1 and 3 ranks a node)."""
    from ckptio.checkpoint.peer_plan import _block_outcomes, _placements

    planned = 0
    for nodes in range(2, 13):
        for per_node in (1, 3):
            for k in range(1, nodes):
                for lost in range(1, nodes):
                    every = _block_outcomes(nodes, per_node, k, lost, range(nodes))
                    got = peers.ring_fan_in(nodes, per_node, k, lost)
                    want = (max(f for f, _ in every), any(d for _, d in every))
                    assert (got.fan_in, got.durable) == want, (nodes, per_node, k, lost)
                    planned += len(_placements(nodes, k, lost)) < nodes
    assert planned > 0  # some rings were planned from fewer placements
    assert len(_placements(192, 2, 2)) == 6  # 192 before
