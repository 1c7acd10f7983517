"""Medians and spreads for the benchmarks, the one way every script in ``benchmarks/`` prints them.

A figure in docs/benchmarks.md is a median with its spread: ``median 1.23 s (min-max 1.10-1.41,
IQR 1.15-1.30, n 5)``. A comparison (A against B) runs its rounds alternating, and reports each
side and the ratio B/A of every round the same way, so a verdict can say whether the whole spread
of the ratio is on one side of its target or straddles it.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

#: the fewest rounds a verdict may rest on (docs/benchmarks.md, "How the figures are made")
MIN_ROUNDS = 5


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and the quartiles of ``values``.

    :param values: one figure per round (any unit); at least one.
    :returns: ``{"n", "median", "min", "max", "q1", "q3"}``; with fewer than 2 values the
        quartiles are the value itself.
    :raises ValueError: when ``values`` is empty.
    """
    vals = sorted(float(v) for v in values)
    if not vals:
        raise ValueError("summary of no values")
    q1, q3 = (statistics.quantiles(vals, n=4, method="inclusive")[::2] if len(vals) > 1
              else (vals[0], vals[0]))
    return {"n": len(vals), "median": statistics.median(vals), "min": vals[0], "max": vals[-1],
            "q1": q1, "q3": q3}


def fmt(values: Sequence[float], unit: str = "s", digits: int = 2) -> str:
    """``values`` as one line: ``median 1.23 s (min-max 1.10-1.41, IQR 1.15-1.30, n 5)``.

    :param values: one figure per round.
    :param unit: printed after the median (``"s"``, ``"ms"``, ``"x"`` for ratios).
    :param digits: decimals.
    """
    s = summary(values)
    f = f"{{:.{digits}f}}"
    sep = "" if unit == "x" else " "
    return (f"median {f.format(s['median'])}{sep}{unit} (min-max {f.format(s['min'])}-{f.format(s['max'])}, "
            f"IQR {f.format(s['q1'])}-{f.format(s['q3'])}, n {s['n']})")


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """The ratio ``b / a`` of each round (rounds paired by position).

    :raises ValueError: when the two lists differ in length or an ``a`` is 0.
    """
    if len(a) != len(b):
        raise ValueError(f"{len(a)} rounds of A against {len(b)} of B")
    return [y / x for x, y in zip(a, b)]


def verdict(ratio_values: Sequence[float], target: float, what: str) -> str:
    """A verdict on ``ratio <= target`` from the median ratio of the rounds, with its spread.

    ``[HOLDS]`` when the median ratio is at most ``target``, ``[MISSED]`` when above, and
    ``[TOO FEW ROUNDS]`` under :data:`MIN_ROUNDS`; then how firm it is: ``every round`` on the
    median's side of the target, else ``the middle half`` (the IQR) on that side, else
    ``unsettled`` (the middle half of the rounds straddles the target).

    :param ratio_values: the ratio of each round.
    :param target: the largest ratio that holds.
    :param what: the target in words, printed after the verdict.
    """
    s = summary(ratio_values)
    if s["n"] < MIN_ROUNDS:
        word = "TOO FEW ROUNDS"
    else:
        word = "HOLDS" if s["median"] <= target else "MISSED"
    if s["max"] <= target or s["min"] > target:
        side = "every round on the same side of the target"
    elif s["q3"] <= target or s["q1"] > target:
        side = "the middle half of the rounds on the same side of the target"
    else:
        side = "unsettled: the middle half of the rounds straddles the target"
    return f"[{word}] {what} <= {target}x: {fmt(ratio_values, 'x', 3)}; {side}"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``0.52 0.61 0.70``."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
