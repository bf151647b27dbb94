"""Intervals for figures measured in repeated rounds, and for projections built on them.

A measured figure is the mean of ``n`` rounds; its interval is Student's t confidence interval
of that mean at :data:`CONFIDENCE`: ``mean ± t(n-1) * sd / sqrt(n)``. A projection built on
rounds gets the same half-width from the spread of the per-round projections around the
projection of the pooled rounds (:func:`spread_interval`), so one rule covers both.

Why Student's t and not a percentile bootstrap: a run has a handful of rounds (3 to 12), and a
percentile bootstrap of so few values gives intervals about a third too narrow (it treats the
sample's spread as the population's); t accounts for it. The 97.5% quantiles of t are the
published table (:data:`T975`, checked against SciPy in the tests) rather than a dependency
on SciPy for 30 constants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CONFIDENCE",
    "T975",
    "Interval",
    "mean_interval",
    "rounds_needed",
    "spread_interval",
    "t_quantile",
]

CONFIDENCE = 0.95
"""Two-sided confidence of every interval ckptio shows."""

#: Student's t, 97.5% quantile, for 1 to 30 degrees of freedom (two-sided 95%).
T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (>= 1): the table up
    to 30, beyond it the normal's 1.960 corrected to first order in ``1/df`` (Cornish-Fisher:
    ``z + (z^3 + z) / (4 df)``, within 0.2% of t)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


@dataclass(frozen=True, slots=True)
class Interval:
    """A figure and its 95% interval: ``low <= value <= high``; ``n`` rounds made it."""

    value: float
    low: float
    high: float
    n: int

    @property
    def relative(self) -> float:
        """Half-width over the value: ``0.08`` is ±8%; ``inf`` for a value of 0."""
        if self.value == 0:
            return math.inf
        return (self.high - self.low) / 2 / abs(self.value)


def _sd(values: Sequence[float]) -> float:
    n = len(values)
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def mean_interval(values: Sequence[float]) -> Interval | None:
    """The mean of ``values`` (one per round) with its t interval; None with fewer than two
    values (the spread between rounds is unknown)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(vals) < 2:
        return None
    n = len(vals)
    mean = sum(vals) / n
    half = t_quantile(n - 1) * _sd(vals) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def spread_interval(value: float, per_round: Sequence[float]) -> Interval | None:
    """``value`` (a projection of the pooled rounds) with the half-width that the spread of
    ``per_round`` (the same projection from each round alone) gives its mean; None with fewer
    than two rounds. The low end is never below 0 (times, costs and rates are not negative)."""
    vals = [float(v) for v in per_round if v is not None and math.isfinite(v)]
    if len(vals) < 2 or not math.isfinite(value):
        return None
    n = len(vals)
    half = t_quantile(n - 1) * _sd(vals) / math.sqrt(n)
    return Interval(value, max(0.0, value - half), value + half, n)


def rounds_needed(relative_sd: float, target: float, *, most: int = 1000) -> int:
    """Rounds whose t interval of the mean would be ±``target`` (relative) for values spread
    by ``relative_sd`` (their standard deviation over their mean): the least ``n >= 2`` with
    ``t(n-1) * relative_sd / sqrt(n) <= target``, at most ``most``."""
    if relative_sd <= 0:
        return 2
    for n in range(2, most + 1):
        if t_quantile(n - 1) * relative_sd / math.sqrt(n) <= target:
            return n
    return most
