"""The water-fill: the exact breakpoint walk gives what its definition says."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.core.fairshare import fair_shares, waterfill


def by_definition(amount_mw: int, lows: list[int], highs: list[int]) -> list[int]:
    """The largest integer level L with sum(clamp(L, lo, hi)) <= amount, found by
    bisecting over L (the water-fill as first written, kept here as its definition)."""
    lo_level, hi_level = min(lows), max(highs)

    def total(level: int) -> int:
        return sum(min(max(level, lo), hi) for lo, hi in zip(lows, highs))

    if total(hi_level) <= amount_mw:
        return list(highs)
    while lo_level < hi_level:
        mid = (lo_level + hi_level + 1) // 2
        if total(mid) <= amount_mw:
            lo_level = mid
        else:
            hi_level = mid - 1
    return [min(max(lo_level, lo), hi) for lo, hi in zip(lows, highs)]


# Small ranges make ties, equal breakpoints and exact fits common; large ones are mW.
limits = st.one_of(st.integers(0, 40), st.integers(0, 800_000))


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.tuples(limits, limits), min_size=1, max_size=12), st.one_of(st.integers(0, 60), st.integers(0, 10**7)))
def test_waterfill_is_the_largest_level_that_fits(pairs: list[tuple[int, int]], extra_mw: int) -> None:
    lows, highs = [min(p) for p in pairs], [max(p) for p in pairs]
    amount = sum(lows) + extra_mw
    got = waterfill(amount, lows, highs)
    assert got == by_definition(amount, lows, highs)
    assert sum(got) <= amount
    assert all(lo <= g <= hi for g, lo, hi in zip(got, lows, highs))


def test_fair_shares_split_evenly_and_give_a_clamped_cards_watts_to_the_others() -> None:
    # 1000 W over three cards, one of which can take only 200 W: 400 W each to the others.
    assert fair_shares(1_000_000, [100_000] * 3, [200_000, 700_000, 700_000]) == [200_000, 400_000, 400_000]
    # Indivisible: rounded down, never above the amount.
    assert fair_shares(1_000, [0] * 3, [1_000] * 3) == [333, 333, 333]
    assert fair_shares(100_000, [60_000, 60_000], [300_000, 300_000]) is None  # the floors do not fit
