"""The plan of a restore from peer copies (:mod:`ckptio.checkpoint.peers`): rank 0's
:func:`assign` of where each rank's missing objects come from, and :func:`ring_fan_in`, what
that plan does on a ring that loses neighbouring nodes (the stall model's fan-in). Pure: no
store, no process group."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint.drain import object_rank
from ckptio.checkpoint.peers import NodeRing

__all__ = ["RingLoss", "assign", "ring_fan_in"]


def assign(
    step: int,
    missing: Sequence[Sequence[str]],
    own: Sequence[Iterable[int]],
    copies: Sequence[Mapping[int, Iterable[int]]],
    durable: bool,
    sizes: Mapping[str, int],
    bad: set[tuple[int, int, int]],
    nodes: Sequence[int] | None = None,
) -> dict[str, Any] | None:
    """Rank 0: for each rank, where each object it lacks comes from: a transfer from its
    owner's fast root (``kind": "own"``), else from a copy, else the durable tier; None when
    some object survives nowhere. A copy the rank holds itself is a transfer to itself (copied
    on its root, no message). ``bad``: ``(step, holder, source rank)`` holdings that failed a
    check. ``nodes``: each rank's node (its index in the ring; default: a node per rank).

    Among the copies, the plan spreads the replacement nodes over the surviving nodes, in two
    passes over the objects, those with the fewest holders first. The first keeps each
    replacement node whole: an object comes from the holder whose node would then send to
    the fewest other nodes (its *fan-in*), one already sending to the rank's node first. The
    second spreads the bytes: an object may come from a node that sent to the rank's node in
    the first pass or from one that sent nothing, without raising a node's fan-in above the
    first pass's highest, and goes to the node, then the rank, with the fewest bytes to
    send. A balance of ranks alone piles two replacement nodes onto one survivor where the
    ring leaves another free: two neighbours lost, the first one's ranks take the
    lower-numbered of their two holders, which is the second one's only one; a balance of
    bytes alone splits the first replacement node over both survivors and leaves the second
    none of its own."""
    size = len(missing)
    node = list(nodes) if nodes is not None else list(range(size))
    held: dict[int, list[int]] = {}  # a source rank -> the ranks holding a copy of it
    for h in range(size):
        for q, steps in copies[h].items():
            if step in steps and (step, h, q) not in bad:
                held.setdefault(q, []).append(h)
    wanted: list[tuple[int, str, list[tuple[int, str]]]] = []
    for r, keys in enumerate(missing):
        for key in sorted(keys):
            q = object_rank(key)
            holders: list[tuple[int, str]] = []
            if q < size and step in own[q] and q != r and (step, q, q) not in bad:
                holders.append((q, "own"))
            holders += [(h, "copy") for h in held.get(q, [])]
            if not holders and not durable:
                return None
            wanted.append((r, key, holders))
    wanted.sort(key=lambda w: (len(w[2]), w[0], w[1]))  # the most constrained first
    whole = _place(wanted, node, sizes, None)
    pairs = {(node[h], node[r]) for h, r, _, _ in whole}
    plan = _place(wanted, node, sizes, pairs)
    transfers: dict[tuple[int, int, str, int], list[str]] = {}
    from_durable: dict[int, list[str]] = {}
    for h, r, kind, key in plan:
        if h < 0:
            from_durable.setdefault(r, []).append(key)
        else:
            transfers.setdefault((h, r, kind, object_rank(key)), []).append(key)
    return {
        "transfers": [
            {"src": h, "dst": r, "kind": kind, "source": q, "keys": sorted(keys)}
            for (h, r, kind, q), keys in sorted(transfers.items())
        ],
        "durable": {str(r): sorted(keys) for r, keys in sorted(from_durable.items())},
    }


def _place(
    wanted: Sequence[tuple[int, str, Sequence[tuple[int, str]]]],
    node: Sequence[int],
    sizes: Mapping[str, int],
    pairs: set[tuple[int, int]] | None,
) -> list[tuple[int, int, str, str]]:
    """One pass of :func:`assign`: ``(holder, rank, kind, key)`` for each wanted object in
    order (holder -1: the durable tier). ``pairs`` None: whole replacement nodes, each from
    as few sending nodes as can (a node already sending to the rank's node before another
    one), the fewest nodes served first. Else a sending node may send only where the first
    pass sent from it (``pairs``: (sending node, receiving node)), or anywhere if it sent
    nothing there, up to the first pass's fan-in: the bytes spread, the fan-in no higher."""
    load: dict[int, int] = {}
    node_load: dict[int, int] = {}
    serves: dict[int, set[int]] = {}  # a node -> the other nodes it sends to
    senders = {n for n, _ in pairs or ()}
    cap = max((sum(1 for p in pairs if p[0] == n) for n in senders), default=0) if pairs else 0
    out: list[tuple[int, int, str, str]] = []
    for r, key, holders in wanted:
        to = node[r]
        choice = list(holders)
        if pairs is not None:
            choice = [
                x
                for x in holders
                if node[x[0]] == to or (node[x[0]], to) in pairs or node[x[0]] not in senders
            ] or choice

        def cost(x: tuple[int, str], r: int = r, to: int = to) -> tuple[Any, ...]:
            n = node[x[0]]
            mine = serves.get(n, set())
            fan_in = len(mine) + (n != to and to not in mine)
            spread = (fan_in > cap,) if pairs is not None else (fan_in, n != to and to not in mine)
            # a copy on the rank's own root first (no transfer), then an owner's root
            return (x[0] != r, x[1] != "own", *spread, node_load.get(n, 0), load.get(x[0], 0), x[0])

        if not choice:
            out.append((-1, r, "durable", key))
            continue
        h, kind = min(choice, key=cost)
        load[h] = load.get(h, 0) + sizes.get(key, 0)
        if node[h] != to:
            node_load[node[h]] = node_load.get(node[h], 0) + sizes.get(key, 0)
            serves.setdefault(node[h], set()).add(to)
        out.append((h, r, kind, key))
    return out


@dataclass(frozen=True)
class RingLoss:
    """What the restore planner (:func:`assign`) does when a ring loses nodes
    (:func:`ring_fan_in`)."""

    nodes: int
    ranks_per_node: int
    replicas: int
    lost: int
    fan_in: int
    """The most replacement nodes one surviving node sends to, over every placement of the
    lost nodes (0: none is served from a peer)."""
    durable: bool
    """Whether some lost rank's data survives in no copy (the durable tier is read)."""

    def source(self) -> str:
        return (
            f"the restore planner's assignment on a ring of {self.nodes} nodes "
            f"({self.ranks_per_node} ranks each, {self.replicas} cop"
            f"{'y' if self.replicas == 1 else 'ies'}), {self.lost} neighbouring node"
            f"{'s' if self.lost != 1 else ''} lost (the worst placement)"
        )


@cache
def ring_fan_in(nodes: int, ranks_per_node: int, replicas: int, lost: int) -> RingLoss:
    """The fan-in of a restore after ``lost`` neighbouring nodes of a ring of ``nodes`` x
    ``ranks_per_node`` ranks are lost at once, each rank's step copied to ``replicas``
    partners (:class:`NodeRing`'s own placement): the holdings such a ring has, the real
    :func:`assign` on them, and the most replacement nodes any surviving node sends to. No
    cluster: what the planner would decide, each rank's shard one object of one size.

    Every placement of the lost block whose plan can differ is planned (:func:`_placements`):
    :func:`assign` breaks ties by rank, and a block near the ring's end sees its holders in
    another order."""
    if nodes < 2 or ranks_per_node < 1 or not 1 <= replicas < nodes or not 1 <= lost < nodes:
        raise errors.InvalidArgumentError(
            f"a ring of {nodes} node(s) x {ranks_per_node} rank(s) with {replicas} copies "
            f"and {lost} lost: needs 2 <= nodes, 1 <= replicas < nodes, 1 <= lost < nodes"
        )
    outcomes = _block_outcomes(
        nodes, ranks_per_node, replicas, lost, _placements(nodes, replicas, lost)
    )
    worst = max(f for f, _ in outcomes)
    return RingLoss(nodes, ranks_per_node, replicas, lost, worst, any(d for _, d in outcomes))


def _placements(nodes: int, replicas: int, lost: int) -> list[int]:
    """The first nodes of the lost blocks whose plans can differ. What a block's plan reads
    lies within ``replicas`` nodes of it (the lost ranks' copies are on the ``replicas``
    nodes after each); a block whose such window does not wrap round the ring's end is any
    other such block shifted, the same ranks in the same order, so :func:`assign` breaks
    its ties the same way: one of those stands for all, and every block near the end is
    planned. (A window of ``replicas`` nodes on both sides: the direction is NodeRing's.)"""
    inner = [f for f in range(replicas, nodes) if f + lost + replicas <= nodes]
    return [f for f in range(nodes) if f not in inner[1:]]


def _block_outcomes(
    nodes: int, ranks_per_node: int, replicas: int, lost: int, firsts: Iterable[int]
) -> list[tuple[int, bool]]:
    """For each first node in ``firsts``, the plan of losing it and the ``lost - 1`` after
    it: the most replacement nodes one survivor sends to, and whether the durable tier is
    read."""
    ring = NodeRing.of([f"node-{n}" for n in range(nodes) for _ in range(ranks_per_node)])
    size = nodes * ranks_per_node
    node = [n for n in range(nodes) for _ in range(ranks_per_node)]
    step = 1
    keys = [fmt.shard_key(step, r, 0).partition("/")[2] for r in range(size)]
    partners = [[ring.partner(q, j) for j in range(1, replicas + 1)] for q in range(size)]
    out = []
    for first in firsts:
        gone = {(first + i) % nodes for i in range(lost)}
        dead = [node[r] in gone for r in range(size)]
        copies: list[dict[int, set[int]]] = [{} for _ in range(size)]
        for q in range(size):
            for h in partners[q]:
                if not dead[h]:
                    copies[h][q] = {step}
        plan = assign(
            step,
            [[keys[r]] if dead[r] else [] for r in range(size)],
            [set() if dead[r] else {step} for r in range(size)],
            copies,
            True,
            dict.fromkeys(keys, 1),
            set(),
            node,
        )
        assert plan is not None  # the durable tier holds every object
        served: dict[int, set[int]] = {}
        for t in plan["transfers"]:
            src, dst = node[t["src"]], node[t["dst"]]
            if src != dst:
                served.setdefault(src, set()).add(dst)
        out.append((max((len(d) for d in served.values()), default=0), bool(plan["durable"])))
    return out
