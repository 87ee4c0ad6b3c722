"""Fair share: the budget split evenly, clamped to each card's constraints (pure).

All arithmetic in integer mW, rounded down (toward safety).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache


def waterfill(amount_mw: int, lows: Sequence[int], highs: Sequence[int]) -> list[int]:
    """Largest common level L with sum(clamp(L, lo, hi)) <= amount; each card gets
    clamp(L, lo, hi). Watts a clamped card cannot take go to the others.

    Assumes lows[i] <= highs[i] and sum(lows) <= amount_mw (callers check). Returns one
    value per card, mW.
    """
    if not lows:
        return []
    if sum(highs) <= amount_mw:
        return list(highs)
    # The total is piecewise linear in L: its slope is the number of cards with
    # lo <= L < hi. Walk the breakpoints (every lo and hi, sorted) up from min(lows),
    # where the total is sum(lows), to the segment where it passes the amount: exact,
    # and O(n log n) where a bisection over the level would be O(n log(range)).
    level, total = min(lows), sum(lows)
    rising = 0  # cards whose clamp rises with L just above ``level``
    events = sorted([(lo, 1) for lo in lows] + [(hi, -1) for hi in highs])
    for point, change in events:
        if point > level:
            step = rising * (point - level)
            if total + step > amount_mw:
                break
            total, level = total + step, point
        rising += change
    level += (amount_mw - total) // rising if rising else 0
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
