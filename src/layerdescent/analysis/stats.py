"""The statistics of a report: mean and spread over seeds, paired t differences, and Holm's adjustment.

from layerdescent.analysis.stats import paired_difference, holm

d = paired_difference([0.61, 0.58, 0.60], [0.57, 0.56, 0.59])   # mean, 95% t interval, p
holm([0.01, 0.04, 0.03])                                         # -> [0.03, 0.06, 0.06]
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def seed_stats(values) -> dict:
    """Mean and sample std over seeds, elementwise, and the number of seeds n; std is 0 for a single seed."""
    a = np.asarray(values, dtype=float)
    std = a.std(axis=0, ddof=1) if len(a) > 1 else np.zeros_like(a[0])
    return {"mean": a.mean(axis=0).tolist(), "std": std.tolist(), "n": len(a)}


def _spread(a, b) -> float | None:
    """The standard error of mean(a - b), or None where the pairs have no spread to judge by.

    One pair has none; nor have pairs that all differ alike (a metric counted on a fixed test set,
    such as accuracy, takes few values), where t's interval would shrink to a point and call any
    difference certain. "Alike" is up to float32 rounding of the metrics; a subnormal spread
    underflows to 0 and is none either.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    d = a - b
    scale = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
    if len(d) < 2 or np.ptp(d) <= 1e-6 * float(np.abs(np.concatenate([a, b])).max()) or not scale > 0:
        return None
    return scale


def paired_difference(a, b, level: float = 0.95) -> dict:
    """Mean of a - b over paired seeds, its t interval at ``level``, the two-sided t test's p, and whether the interval excludes 0."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n, mean = len(d), float(d.mean())
    scale = _spread(a, b)
    if scale is None:
        return {"mean": mean, "low": None, "high": None, "n": n, "distinct": False, "p": None}
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


def one_sided_p(a, b, margin: float) -> float | None:
    """The paired t test's one-sided p of "mean(a - b) > -margin" (non-inferiority within ``margin``); None where the pairs have no spread."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    scale = _spread(a, b)
    return None if scale is None else float(stats.t.sf((float(d.mean()) + margin) / scale, len(d) - 1))


def equivalence_p(a, b, margin: float) -> float | None:
    """Two one-sided tests' p of "-margin < mean(a - b) < margin": the larger of the two; None where the pairs have no spread."""
    lower, upper = one_sided_p(a, b, margin), one_sided_p(b, a, margin)
    return None if lower is None else max(lower, upper)


EXACT_SEEDS = 16  # up to this many pairs the sign-flip test enumerates every sign; beyond, a seeded sample of them


def _signs(n: int) -> np.ndarray:
    """Every vector of n signs (n <= EXACT_SEEDS), else 2^EXACT_SEEDS drawn with a fixed seed so the record stays byte-stable."""
    if n <= EXACT_SEEDS:
        return 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
    return np.random.default_rng(0).choice([-1, 1], size=(2**EXACT_SEEDS, n))


def sign_flip_p(d, shift: float = 0.0, signs: np.ndarray | None = None) -> float:
    """The exact two-sided sign-flip (randomization) test's p of "mean(d) = shift" for paired differences ``d``."""
    x = np.asarray(d, dtype=float) - shift
    signs = _signs(len(x)) if signs is None else signs
    observed = abs(x.sum())
    # flipped sums that tie with the observed one count as extreme (up to rounding of the sum)
    return float(np.mean(np.abs(signs @ x) >= observed - 1e-9 * max(1.0, np.abs(x).sum())))


def sign_flip(a, b, level: float = 0.95) -> dict:
    """Mean of a - b over paired seeds, the sign-flip test's p, and the interval that inverts it at ``level`` (±inf where no shift is refused).

    For small counts (rising transitions per seed) a t test is no test: pairs that all differ by the
    same count have no spread. The randomization test takes them as they are; with n pairs its
    smallest p is 2 / 2^n, so it needs at least 6 seeds to decide at 0.05. The interval is the set
    of shifts the test does not refuse at 1 - level, found by bisection from the mean outward (from
    0 first where 0 is refused), so it excludes 0 exactly when p <= 1 - level.
    """
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n, mean = len(d), float(d.mean())
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": n, "distinct": False, "p": None}
    alpha, signs = 1 - level, _signs(n)
    p = sign_flip_p(d, 0.0, signs)
    refused = lambda shift: sign_flip_p(d, shift, signs) <= alpha
    span = float(np.ptp(d)) + abs(mean) + 1.0
    ends = []
    for direction in (-1.0, 1.0):
        inner, outer = mean, mean + direction * span  # beyond every d_i the signs are all alike: p is at its smallest
        if refused(0.0) and direction * (0.0 - mean) > 0:
            outer = 0.0
        if not refused(outer):
            ends.append(direction * math.inf)
            continue
        for _ in range(60):
            middle = (inner + outer) / 2
            inner, outer = (inner, middle) if refused(middle) else (middle, outer)
        ends.append(inner)
    low, high = ends
    return {"mean": mean, "low": low, "high": high, "n": n, "distinct": low > 0 or high < 0, "p": p}


def holm_levels(pvalues: list[float | None], alpha: float) -> list[float]:
    """The level Holm's step-down tests each p at: α/(m − i) for the i-th rejection, α/(m − r) for every test it stops at (r rejected).

    An interval at 1 − that level (or 1 − 2 · it for a one-sided test) excludes the null exactly
    where Holm rejects, so a verdict and the interval beside it never disagree.
    """
    m = len(pvalues)
    levels = [0.0] * m
    order = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    rejected = 0
    for rank, (p, i) in enumerate(order):
        if p > alpha / (m - rank):
            break
        levels[i] = alpha / (m - rank)
        rejected += 1
    stop = alpha / (m - rejected) if rejected < m else alpha
    return [level if level else stop for level in levels]


def paired_power(effect: float, sd: float, n: int, alpha: float, one_sided: bool = False) -> float:
    """The paired t test's power to find a true mean difference ``effect`` with ``n`` pairs whose differences spread by ``sd``.

    One-sided (non-inferiority, ``effect`` the distance from the margin) at ``alpha``, else two-sided;
    from the noncentral t distribution, as G*Power and R's power.t.test compute it.
    """
    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0 if effect > 0 else 0.0
    df, ncp = n - 1, effect * math.sqrt(n) / sd
    if one_sided:
        return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, ncp))
    critical = stats.t.ppf(1 - alpha / 2, df)
    # P(T <= -c) as P(T >= c) at -ncp: scipy's nct.cdf far in the lower tail returns nan for large ncp (10 at 9 df)
    return float(stats.nct.sf(critical, df, ncp) + stats.nct.sf(critical, df, -ncp))


def seeds_for_power(effect: float, sd: float, alpha: float, one_sided: bool = False, power: float = 0.8, most: int = 1000) -> int | None:
    """The fewest pairs that give ``power`` (None where even ``most`` do not)."""
    return next((n for n in range(2, most + 1) if paired_power(effect, sd, n, alpha, one_sided) >= power), None)


def iqm(values) -> float:
    """The interquartile mean: the mean of the middle 50% of the values (rliable's IQM, scipy's 25% trimmed mean)."""
    return float(stats.trim_mean(np.asarray(values, dtype=float), 0.25))


def probability_of_improvement(a, b) -> float:
    """P(X > Y) for X drawn from ``a`` and Y from ``b``, a tie counting half (rliable's probability of improvement on one task)."""
    x, y = np.asarray(a, dtype=float)[:, None], np.asarray(b, dtype=float)[None, :]
    return float(np.mean((x > y) + 0.5 * (x == y)))


BOOTSTRAP = 2000  # resamples of a bootstrap interval


def bootstrap_interval(statistic, a, b, level: float = 0.95, seed: int = 0) -> dict:
    """``statistic(a, b)`` and its percentile interval over stratified bootstrap resamples (each side resampled on its own, seeded).

    rliable's stratified bootstrap resamples the runs of each task independently; here each side's
    seeds are a stratum. The seed makes the interval, and so the record, the same on every run.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    draws = [statistic(rng.choice(a, len(a)), rng.choice(b, len(b))) for _ in range(BOOTSTRAP)]
    low, high = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return {"value": float(statistic(a, b)), "low": float(low), "high": float(high)}


ESTIMATES = {
    "iqm": lambda a, b: iqm(a) - iqm(b),
    "probability of improvement": probability_of_improvement,
}  # the estimates an endpoint may report beside its test (``also``), each by its name
