"""The statistics of a report: mean and spread over seeds, paired t differences, and Holm's adjustment.

from layerdescent.analysis.stats import paired_difference, holm

d = paired_difference([0.61, 0.58, 0.60], [0.57, 0.56, 0.59])   # mean, 95% t interval, p
holm([0.01, 0.04, 0.03])                                         # -> [0.03, 0.06, 0.06]
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def seed_stats(values) -> dict:
    """Mean and sample std over seeds, elementwise, and the number of seeds n; std is 0 for a single seed."""
    a = np.asarray(values, dtype=float)
    std = a.std(axis=0, ddof=1) if len(a) > 1 else np.zeros_like(a[0])
    return {"mean": a.mean(axis=0).tolist(), "std": std.tolist(), "n": len(a)}


def paired_difference(a, b, level: float = 0.95) -> dict:
    """Mean of a - b over paired seeds, its t interval at ``level``, the two-sided t test's p, and whether the interval excludes 0."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    d = a - b
    n, mean = len(d), float(d.mean())
    # One pair has no spread to judge it by; nor have pairs that all differ alike (a metric counted
    # on a fixed test set, such as accuracy, takes few values), where t's interval would shrink to a
    # point and call any difference certain. "Alike" is up to float32 rounding of the metrics.
    if n < 2 or np.ptp(d) <= 1e-6 * float(np.abs(np.concatenate([a, b])).max()):
        return {"mean": mean, "low": None, "high": None, "n": n, "distinct": False, "p": None}
    scale = float(d.std(ddof=1) / np.sqrt(n))
    half = float(stats.t.ppf((1 + level) / 2, n - 1) * scale)
    low, high = mean - half, mean + half
    p = float(2 * stats.t.sf(abs(mean) / scale, n - 1))
    return {"mean": mean, "low": low, "high": high, "n": n, "distinct": low > 0 or high < 0, "p": p}


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm–Bonferroni adjusted p-values, in the given order (None, a test with no p, stays None and counts in m).

    Holm (1979): sort the m p-values ascending, multiply the i-th smallest (i from 0) by m − i, take
    the running maximum so the order is kept, and cap at 1. Rejecting where the adjusted p ≤ α
    controls the family-wise error rate at α, uniformly more powerful than Bonferroni's m · p.
    """
    m = len(pvalues)
    order = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted: list[float | None] = [None] * m
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def excluding_zero_by_chance(cells: int, level: float = 0.95) -> float:
    """How many of ``cells`` independent null differences a ``level`` interval is expected to call distinct."""
    return cells * (1 - level)
