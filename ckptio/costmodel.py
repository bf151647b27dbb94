"""What a checkpointing job loses, and the interval that loses least: the cost model.

Units: seconds, GPU-hours, price units per GPU-hour (no currency).

**Lost time and its cost: stall + rework + restart.** A checkpoint starts every ``T =
interval`` seconds (wall clock); the GPUs stall ``delta`` seconds of it (the blocking save, or
the snapshot of an asynchronous one), so ``tau = T - delta`` is compute. Failures come every
``M`` seconds on average (the job's MTBF); each costs a restart of ``R`` seconds and the work
done since the newest checkpoint. Daly (2006) gives the expected wall time of one interval,
``E = M e^(R/M) (e^(T/M) - 1)``; the share of wall time lost, ``1 - tau / E``, is split
exactly into three parts that add up to it:

- **stall**: ``delta / E`` (``delta / T`` without failures);
- **restart**: ``1 - e^(-R/M)`` (about ``R / M``);
- **rework**: ``e^(-R/M) (1 - x / (e^x - 1))`` with ``x = T / M`` (about ``T / 2M``: half an
  interval of work redone per failure).

GPU-hours per day of each are ``gpus * 24 * share``, and their cost that times the price per
GPU-hour. Every table, plot and line of ckptio shows these three and their sum under these
names; the sum is Daly's total overhead, ``overhead = E / tau - 1`` (``lost = overhead / (1 +
overhead)``). A background write (asynchronous save, a tiered drain) that outlasts its
interval delays the next save by what it outlasts (backpressure), which adds to the stall.

**Interval.** Young (1974): ``tau = sqrt(2 * delta * M)``. Daly (2006, the higher-order form
LLNL SCR's ``scr_ckpt_interval.py`` uses): ``tau = sqrt(2 delta M) * (1 + sqrt(delta/2M)/3 +
(delta/2M)/9) - delta`` for ``delta < 2M``, else ``M``; the optimum interval (start to start)
is ``tau + delta``.

The assumptions a projection makes when none are given (:data:`ASSUMPTIONS`), each with its
source, live here too: the report states them beside its conclusion.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ASSUMPTIONS",
    "DEFAULT_INTERVAL",
    "DEFAULT_PRICE_PER_GPU_HOUR",
    "DEFAULT_P_LOSE_ANOTHER",
    "DEFAULT_P_LOSE_NODE",
    "DEFAULT_RESTART_OVERHEAD",
    "DEFAULT_SNAPSHOT_BANDWIDTH",
    "LOSSES",
    "REFERENCE_MTTF_GPUS",
    "REFERENCE_MTTF_SECONDS",
    "CostModel",
    "backpressure",
    "cost_curve",
    "daly_interval",
    "lost_shares",
    "overhead_fraction",
    "reference_mtbf",
    "young_interval",
]


# -- cost and interval -----------------------------------------------------------------------


def young_interval(checkpoint_seconds: float, mtbf: float) -> float:
    """Young (1974): ``sqrt(2 * delta * M)`` seconds of compute between checkpoints."""
    return math.sqrt(2 * checkpoint_seconds * mtbf)


def daly_interval(checkpoint_seconds: float, mtbf: float) -> float:
    """Daly (2006), higher-order optimum: seconds of compute between checkpoints."""
    d, m = checkpoint_seconds, mtbf
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def overhead_fraction(
    interval: float, checkpoint_seconds: float, mtbf: float, restart_seconds: float
) -> float:
    """Expected wall time lost per unit of useful compute (checkpoints + lost work +
    restarts), Daly's model: ``M e^(R/M) (e^((tau+delta)/M) - 1) / tau - 1``."""
    tau, d, m, r = interval, checkpoint_seconds, mtbf, restart_seconds
    if tau <= 0:
        return math.inf
    if math.isinf(m):
        return d / tau
    try:
        return m * math.exp(r / m) * math.expm1((tau + d) / m) / tau - 1
    except OverflowError:
        return math.inf


LOSSES = ("stall", "rework", "restart")
"""The three parts of the GPU time a checkpointing job loses (see the module docstring): each
has ``<part>_share``, ``<part>_gpu_hours_per_day`` and ``<part>_cost_per_day`` in
:meth:`CostModel.report`, and ``lost_*`` is their sum."""


def lost_shares(
    stall: float, interval: float, mtbf: float = math.inf, restart: float = 0.0
) -> dict[str, float]:
    """The shares of wall time lost to ``stall`` (seconds per checkpoint), ``rework`` and
    ``restart`` with a checkpoint every ``interval`` seconds (start to start), failures every
    ``mtbf`` seconds and ``restart`` seconds per restart, and ``lost``, their sum (see the
    module docstring). Without failures (``mtbf`` inf) only the stall is lost."""
    if interval <= 0:
        return {"stall": 1.0, "rework": 0.0, "restart": 0.0, "lost": 1.0}
    d = min(max(stall, 0.0), interval)
    if math.isinf(mtbf):
        return {"stall": d / interval, "rework": 0.0, "restart": 0.0, "lost": d / interval}
    x = interval / mtbf
    kept = math.exp(-restart / mtbf)  # e^(-R/M)
    # T / E = e^(-R/M) x / (e^x - 1): the share of wall time the interval itself takes
    ratio = x / math.expm1(x) if x < 700 else 0.0
    stall_share = d / interval * kept * ratio
    rework = kept * (1.0 - ratio)
    restarting = 1.0 - kept
    return {
        "stall": stall_share,
        "rework": rework,
        "restart": restarting,
        "lost": stall_share + rework + restarting,
    }


@dataclass(frozen=True, slots=True)
class CostModel:
    """What a stall of ``checkpoint_seconds`` every ``interval`` seconds costs."""

    checkpoint_seconds: float
    """GPU stall per checkpoint: the write time (blocking save) or the snapshot time (async),
    with any backpressure of a background write that outlasts the interval."""
    interval: float = 7200.0
    """Seconds between checkpoint starts (wall clock)."""
    gpus: int = 1
    price_per_gpu_hour: float = 0.0
    mtbf: float = math.inf
    """Mean time between failures of the whole job, seconds."""
    restart_seconds: float = 0.0
    """Idle time of one restart after a failure (overhead + restore)."""

    def report(self) -> dict[str, Any]:
        """JSON-able figures: ``checkpoint_seconds``; per part of :data:`LOSSES` and for
        ``lost`` (their sum) the share of wall time, GPU-hours and cost per day; Young's and
        Daly's intervals and the total overhead at the chosen and the optimal interval
        (``None`` where an MTBF is needed and not given)."""
        d, t = self.checkpoint_seconds, self.interval
        out: dict[str, Any] = {
            "checkpoint_seconds": d,
            "interval_seconds": t,
            "gpus": self.gpus,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "mtbf_seconds": None if math.isinf(self.mtbf) else self.mtbf,
            "restart_seconds": self.restart_seconds,
            **_per_day(lost_shares(d, t, self.mtbf, self.restart_seconds), self),
            "young_interval_seconds": None,
            "daly_interval_seconds": None,
            "overhead_at_interval": None,
            "overhead_at_optimum": None,
            "optimum_interval_seconds": None,
        }
        if not math.isinf(self.mtbf):
            young = young_interval(d, self.mtbf)
            daly = daly_interval(d, self.mtbf)
            compute = max(t - d, 1e-9)  # compute between checkpoints at the chosen interval
            out.update(
                young_interval_seconds=young,
                daly_interval_seconds=daly,
                optimum_interval_seconds=daly + d,
                overhead_at_interval=overhead_fraction(compute, d, self.mtbf, self.restart_seconds),
                overhead_at_optimum=overhead_fraction(daly, d, self.mtbf, self.restart_seconds),
            )
        return out


def _per_day(shares: Mapping[str, float], c: CostModel) -> dict[str, float]:
    """``<part>_share``, ``<part>_gpu_hours_per_day`` and ``<part>_cost_per_day`` of each part
    of :data:`LOSSES` and of ``lost``."""
    out: dict[str, float] = {}
    for part in (*LOSSES, "lost"):
        hours = c.gpus * 24 * shares[part]
        out[f"{part}_share"] = shares[part]
        out[f"{part}_gpu_hours_per_day"] = hours
        out[f"{part}_cost_per_day"] = hours * c.price_per_gpu_hour
    return out


def cost_curve(
    checkpoint_seconds: float,
    intervals: list[float],
    *,
    gpus: int,
    price_per_gpu_hour: float,
    mtbf: float = math.inf,
    restart_seconds: float = 0.0,
    background_seconds: float = 0.0,
) -> list[dict[str, float]]:
    """:meth:`CostModel.report`'s lost shares, GPU-hours and costs per day at each interval
    (seconds, start to start): the same figures a table shows at its interval.
    ``background_seconds``: a background write after each save (an asynchronous save's
    write, a tiered drain) whose excess over a short interval adds to the stall
    (:func:`backpressure`)."""
    rows = []
    for t in intervals:
        stall = checkpoint_seconds + backpressure(background_seconds, t)
        c = CostModel(stall, t, gpus, price_per_gpu_hour, mtbf, restart_seconds)
        rows.append(
            {
                "interval_seconds": t,
                "stall_seconds": stall,
                **_per_day(lost_shares(stall, t, mtbf, restart_seconds), c),
            }
        )
    return rows


def backpressure(background: float, interval: float, every: int = 1) -> float:
    """Seconds a save waits, on average, for a background write of ``background`` seconds
    started every ``every`` saves, ``interval`` seconds apart: what it outlasts the
    ``every * interval`` it has, spread over the ``every`` saves."""
    return max(0.0, background - every * interval) / every


# -- assumptions -----------------------------------------------------------------------------

#: Device -> host copy rate per GPU for an asynchronous save's snapshot (bytes/s).
#: Assumption: ~25 GB/s, a PCIe Gen4 x16 link in practice (Gen5 doubles it).
DEFAULT_SNAPSHOT_BANDWIDTH = 25e9

#: Seconds of a restart besides reading the checkpoint back: reschedule, start the processes,
#: initialise the job, warm up. Assumption: 5 minutes (no published figure fits every cluster).
DEFAULT_RESTART_OVERHEAD = 300.0

#: Probability that a failure loses a node's fast tier (the node is replaced). Assumption: 0.78,
#: the share of unexpected interruptions that the Llama 3 paper (arXiv 2407.21783, section
#: 3.3.4) attributes to confirmed or suspected hardware issues, taken as node replacements.
DEFAULT_P_LOSE_NODE = 0.78

#: Probability that a failure which loses a node loses another one at once (before the lost
#: node's peer copies are made again), and so on for each further node: the number of nodes
#: one failure loses is geometric, ``P(more than j) = DEFAULT_P_LOSE_NODE *
#: DEFAULT_P_LOSE_ANOTHER ** (j - 1)``. Assumption: 0.1. No published figure was found for
#: simultaneous node losses in training jobs; the figure stands for failures of what several
#: nodes share (a switch, rack power, a maintenance batch). Independent failures alone give
#: far less: another failure within a restart of ``R`` seconds comes with probability about
#: ``R / M`` (0.02 for a 6 min restart at the founding example's 5.3 h MTBF).
DEFAULT_P_LOSE_ANOTHER = 0.1

#: Failure rate of a job: Meta research clusters, job mean time to failure 7.9 h at 1,024 GPUs
#: (arXiv 2410.21680, secondary quote), scaled inversely with the GPU count
#: (:func:`reference_mtbf`).
REFERENCE_MTTF_SECONDS = 7.9 * 3600
REFERENCE_MTTF_GPUS = 1024

#: Assumption: price of one GPU-hour (on-demand H100-class cloud capacity, order of
#: magnitude; no currency).
DEFAULT_PRICE_PER_GPU_HOUR = 2.0

#: Seconds between checkpoint starts when none is given: 2 h, the founding example's (ABCI).
DEFAULT_INTERVAL = 7200.0

ASSUMPTIONS: dict[str, str] = {
    "interval": "2 h between checkpoints: the founding example's (a generative-AI job on "
    "ABCI; DDN talk)",
    "mtbf": "job MTBF 7.9 h at 1,024 GPUs, scaled inversely with the GPU count (Meta research "
    "clusters, arXiv 2410.21680)",
    "restart_overhead": "5 min per restart besides the restore: reschedule, start, warm up "
    "(assumption: no published figure fits every cluster)",
    "price": "2 per GPU-hour, no currency (assumption: on-demand H100-class cloud capacity, "
    "order of magnitude)",
    "p_lose_node": "78% of failures lose the node's fast tier (Llama 3 paper, arXiv "
    "2407.21783: the hardware share of unexpected interruptions)",
    "p_lose_another": "10% of the failures that lose a node lose another at once, and so on "
    "(assumption: no published figure for simultaneous node losses; it stands for what "
    "several nodes share, a switch, rack power, a maintenance batch)",
    "snapshot_bandwidth": "an asynchronous save's snapshot copies 25 GB/s per GPU to host "
    "memory (assumption: PCIe Gen4 x16)",
}
"""Every assumption a projection makes, in words with its source: what a report states
beside its conclusion."""


def reference_mtbf(gpus: int) -> float:
    """The job MTBF (seconds) assumed at ``gpus`` GPUs: :data:`REFERENCE_MTTF_SECONDS` at
    :data:`REFERENCE_MTTF_GPUS`, scaled inversely with the count (failures of independent
    nodes add up)."""
    return REFERENCE_MTTF_SECONDS * REFERENCE_MTTF_GPUS / max(gpus, 1)
