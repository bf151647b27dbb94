"""Which assumption moves the answer most: one at a time, each halved and doubled.

The answer is the GPU time a job loses per day to checkpointing (stall + rework + restart,
:mod:`ckptio.costmodel`), as a cost at the stated price. Each assumption of
:data:`ASSUMPTIONS` is set to half and to twice its value, the others held, and the model
re-run (:func:`ckptio.stallmodel.project`); the *swing* is how far apart the two answers are.
Sorted by swing, the rows are a tornado: the top one is what to measure on your own cluster
first. Halving and doubling is a stated range, not a probability: it shows the answer's
leverage, not its likelihood.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ckptio.profiles import Profile
from ckptio.stallmodel import Conditions, Workload, peer_link, project
from ckptio.units import human_rate, human_seconds

__all__ = ["ASSUMPTIONS", "FACTOR", "PEER_ASSUMPTIONS", "sensitivity"]

FACTOR = 2.0
"""Each assumption is divided and multiplied by this."""

Variant = Callable[[Conditions, Profile, float], tuple[Conditions, Profile]]


def _stream(c: Conditions, p: Profile, f: float) -> tuple[Conditions, Profile]:
    changes: dict[str, Any] = {"stream_bandwidth": p.value("stream_bandwidth") * f}
    if "read_stream_bandwidth" in p.figures:
        changes["read_stream_bandwidth"] = p.value("read_stream_bandwidth") * f
    return c, p.with_overrides(changes)


ASSUMPTIONS: dict[str, tuple[str, Variant, Callable[[Conditions, Profile], str]]] = {
    "interval": (
        "checkpoint interval",
        lambda c, p, f: (replace(c, interval=c.interval * f), p),
        lambda c, p: human_seconds(c.interval),
    ),
    "mtbf": (
        "MTBF of the job",
        lambda c, p, f: (replace(c, mtbf=c.mtbf * f), p),
        lambda c, p: human_seconds(c.mtbf),
    ),
    "restart_overhead": (
        "restart overhead",
        lambda c, p, f: (replace(c, restart_overhead=c.restart_overhead * f), p),
        lambda c, p: human_seconds(c.restart_overhead),
    ),
    "price": (
        "price per GPU-hour",
        lambda c, p, f: (replace(c, price_per_gpu_hour=c.price_per_gpu_hour * f), p),
        lambda c, p: f"{c.price_per_gpu_hour:g}",
    ),
    "stream_bandwidth": (
        "per-stream bandwidth",
        _stream,
        lambda c, p: human_rate(p.value("stream_bandwidth")),
    ),
    "p_lose_another": (
        "chance a failure loses another node at once",
        lambda c, p, f: (replace(c, p_lose_another=min(c.p_lose_another * f, 0.999)), p),
        lambda c, p: f"{c.p_lose_another:g}",
    ),
    "peer_bandwidth": (
        "node link to the peers",
        lambda c, p, f: (replace(c, peer_bandwidth=peer_link(c, p)[0] * f), p),
        lambda c, p: human_rate(peer_link(c, p)[0]),
    ),
}
"""name -> (words, how to scale it by a factor, its value in words)."""

PEER_ASSUMPTIONS = ("p_lose_another", "peer_bandwidth")
"""Assumptions that move only a target with peer copies (left out of the others' rows)."""


def sensitivity(
    workload: Workload,
    profile: Profile,
    conditions: Conditions,
    *,
    local: Profile | None = None,
    answer: str = "lost_cost_per_day",
) -> list[dict[str, Any]]:
    """One row per assumption, the largest swing first: ``assumption`` (its name in
    :data:`ASSUMPTIONS`), ``words``, ``value`` (as assumed), ``low`` and ``high`` (``answer``
    with the assumption halved and doubled), ``base`` (as assumed) and ``swing`` (``|high -
    low|``). With ``local`` the target is tiered (the per-stream bandwidth varied is the
    durable tier's, ``profile``). A restart given outright (``conditions.restart_seconds``)
    leaves the restart overhead without effect (swing 0). The chance of losing another node
    at once and the node link to the peers have rows only for a target with peer copies
    (``conditions.peers``; the link varied from :func:`~ckptio.stallmodel.peer_link`'s)."""
    base = project(workload, profile, conditions, local=local)[answer]
    rows = []
    for name, (words, scale, shown) in ASSUMPTIONS.items():
        if name in PEER_ASSUMPTIONS and not (local is not None and conditions.peers):
            continue
        ends = []
        for f in (1 / FACTOR, FACTOR):
            c, p = scale(conditions, profile, f)
            ends.append(project(workload, p, c, local=local)[answer])
        rows.append(
            {
                "assumption": name,
                "words": words,
                "value": shown(conditions, profile),
                "low": ends[0],
                "high": ends[1],
                "base": base,
                "swing": abs(ends[1] - ends[0]),
                "answer": answer,
            }
        )
    return sorted(rows, key=lambda r: -r["swing"])
