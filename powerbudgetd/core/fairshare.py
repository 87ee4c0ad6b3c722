"""Fair share: the budget split evenly, clamped to each card's constraints (pure).

All arithmetic in integer mW, rounded down (toward safety).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache


def waterfill(amount_mw: int, lows: Sequence[int], highs: Sequence[int]) -> list[int]:
    """Largest common level L with sum(clamp(L, lo, hi)) <= amount; each card gets
    clamp(L, lo, hi). Watts a clamped card cannot take go to the others.

    Assumes sum(lows) <= amount_mw (callers check). Returns one value per card, mW.
    """
    if not lows:
        return []
    lo_level, hi_level = min(lows), max(highs)

    def total(level: int) -> int:
        return sum(min(max(level, lo), hi) for lo, hi in zip(lows, highs))

    if total(hi_level) <= amount_mw:
        return list(highs)
    while lo_level < hi_level:  # largest level whose total fits
        mid = (lo_level + hi_level + 1) // 2
        if total(mid) <= amount_mw:
            lo_level = mid
        else:
            hi_level = mid - 1
    return [min(max(lo_level, lo), hi) for lo, hi in zip(lows, highs)]


def fair_shares(budget_mw: int, lows: Sequence[int], highs: Sequence[int]) -> list[int] | None:
    """Fair share per card in mW, or None when the minimums sum above the budget."""
    if sum(lows) > budget_mw:
        return None
    return waterfill(budget_mw, lows, highs)


@lru_cache(maxsize=8)
def cached_fair_shares(budget_mw: int, lows: tuple[int, ...], highs: tuple[int, ...]) -> tuple[int, ...] | None:
    """:func:`fair_shares` remembered for the last few inputs: a tick's pool and its
    cards' limits seldom change, and the water-fill is a bisection over every card."""
    shares = fair_shares(budget_mw, lows, highs)
    return None if shares is None else tuple(shares)
