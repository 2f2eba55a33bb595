"""Numbers as a page shows them: the digits a spread supports, a difference with its interval, a p-value, a markdown table."""

from __future__ import annotations

import math


def _last_digit(spread: float, mean: float = 0.0, max_digits: int = 4) -> int:
    """The decimal exponent of the last digit worth printing: two significant digits of the spread
    when they start with 1 to 3, else one, but never past ``max_digits`` significant digits of the mean."""
    lead = math.floor(math.log10(spread))
    digits = 2 if spread / 10.0**lead < 3.55 else 1
    last = lead - digits + 1
    if mean and math.isfinite(mean):
        last = max(last, math.floor(math.log10(abs(mean))) - max_digits + 1)
    return last


def _at(x: float, last: int, sign: bool = False) -> str:
    """``x`` rounded to the digit 10**last; scientific for very small or large magnitudes."""
    plus = "+" if sign else ""
    if last < -6 or abs(x) >= 1e7:
        digits = max(math.floor(math.log10(abs(x))) - last, 0) if x else 0
        return f"{x:{plus}.{digits}e}"
    text = f"{round(x, -last) if last > 0 else x:{plus}.{max(-last, 0)}f}"
    if float(text) == 0:  # a bound that rounds to zero keeps its side of zero; a plain zero has no sign
        text = text.lstrip("+-")
        return ("-" if x < 0 else "+") + text if sign else text
    return text


def format_stat(mean: float, spread: float | None = None, n: int = 1) -> str:
    """'mean ± spread' to the precision the spread supports; a single seed (n = 1) shows the mean alone."""
    if not math.isfinite(mean):
        return str(mean)
    if n < 2 or spread is None or not math.isfinite(spread):
        return f"{mean:#.4g}"  # '#' keeps trailing zeros, so one-seed columns show even digits (0.8250 beside 0.8325)
    if spread == 0:
        return f"{mean:.4g} ± 0"
    last = _last_digit(spread, mean)
    if spread < 0.5 * 10.0**last:  # below what the mean's own precision shows: rounding noise
        return f"{_at(mean, last)} ± <{_at(10.0**last, last)}"
    return f"{_at(mean, last)} ± {_at(spread, last)}"


def format_difference(d: dict) -> str:
    """A paired difference as markdown: 'mean [low, high]' to the interval's precision, bold when it excludes 0 (an unbounded side is ∞)."""
    bold = "**" if d["distinct"] else ""
    if d["low"] is None:
        return f"{d['mean']:+#.3g}" + (f" (alike in all {d['n']} pairs)" if d["n"] > 1 else "")
    finite = [v for v in (d["low"], d["high"]) if math.isfinite(v)]
    half = (d["high"] - d["low"]) / 2 if len(finite) == 2 else 0.0
    last = _last_digit(half, max(abs(v) for v in finite)) if half > 0 else _last_digit(abs(d["mean"]) or 1.0)
    mean, low, high = (
        _at(v, last, sign=True) if math.isfinite(v) else f"{'+' if v > 0 else '-'}∞" for v in (d["mean"], d["low"], d["high"])
    )
    return f"{bold}{mean} [{low}, {high}]{bold}"


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines, a blank line after it."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def format_p(p: float | None) -> str:
    """A p-value in two significant digits; "–" where the pairs gave none."""
    return "–" if p is None else f"{p:.2g}"
