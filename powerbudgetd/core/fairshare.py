"""Fair share: the budget split evenly, clamped to each card's constraints (pure); and
the water-fill it rests on, which every division of watts in the project uses (the
bank's fair shares, the lending policy, the circuit's and the power tree's max-min fair
grants, :mod:`powerbudgetd.core.fair`).

A bank's arithmetic is in integer mW, rounded down (toward safety).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TypeVar

N = TypeVar("N", int, float)


def waterfill(amount: N, lows: Sequence[N], highs: Sequence[N], weights: Sequence[float] | None = None) -> list[N]:
    """The water-fill, the one division rule of the project: the largest common level L
    with sum(weight x clamp(L, lo, hi)) <= amount; each gets clamp(L, lo, hi). What a
    clamped one cannot take goes to the others.

    In integer mW without ``weights`` (a bank's cards: the level rounded down, toward
    safety), or in W with them (a power tree's hosts, each watt of a host costing its
    node ``weight`` watts). Assumes lows[i] <= highs[i] and sum(weight x low) <= amount
    (callers check). Returns one value per entry, in the unit given.
    """
    if not lows:
        return []
    w: Sequence[float] = weights if weights is not None else [1] * len(lows)
    if sum(wi * hi for wi, hi in zip(w, highs)) <= amount:
        return list(highs)
    # The total is piecewise linear in L: its slope is the weight of the entries with
    # lo <= L < hi. Walk the breakpoints (every lo and hi, sorted) up from min(lows),
    # where the total is sum(weight x low), to the segment where it passes the amount:
    # exact, and O(n log n) where a bisection over the level would be O(n log(range)).
    level, total = min(lows), sum(wi * lo for wi, lo in zip(w, lows))
    rising, open_ = 0 * w[0], 0  # the slope just above ``level``, and how many entries make it
    # At one point the entries opening come before those closing, so the count of open
    # entries reaches 0 only when none is open (then the slope is exactly 0, not a residue).
    events = sorted([(lo, -1, wi) for lo, wi in zip(lows, w)] + [(hi, 1, -wi) for hi, wi in zip(highs, w)])
    for point, closing, change in events:
        if point > level:
            step = rising * (point - level)
            if total + step > amount:
                break
            total, level = total + step, point
        open_ -= closing
        rising = rising + change if open_ else 0 * rising  # no float residue once none rises
    if rising:
        level += (amount - total) // rising if weights is None else (amount - total) / rising  # type: ignore[assignment]
    return [min(max(level, lo), hi) for lo, hi in zip(lows, highs)]


def fair_shares(budget_mw: int, lows: Sequence[int], highs: Sequence[int]) -> list[int] | None:
    """Fair share per card in mW, or None when the minimums sum above the budget."""
    if sum(lows) > budget_mw:
        return None
    return waterfill(budget_mw, lows, highs)


@lru_cache(maxsize=8)
def cached_fair_shares(budget_mw: int, lows: tuple[int, ...], highs: tuple[int, ...]) -> tuple[int, ...] | None:
    """:func:`fair_shares` remembered for the last few inputs: a tick's pool and its
    cards' limits seldom change, and the water-fill walks every card's breakpoints."""
    shares = fair_shares(budget_mw, lows, highs)
    return None if shares is None else tuple(shares)
