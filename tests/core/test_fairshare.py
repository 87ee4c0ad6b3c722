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


def weighted_by_definition(amount: float, highs: list[float], weights: list[float]) -> float:
    """The largest level L with sum(weight x min(L, high)) <= amount, by bisection over L
    (floats: 200 halvings reach the level to the float's precision)."""
    lo, hi = 0.0, max(highs)
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(w * min(mid, h) for w, h in zip(weights, highs)) <= amount:
            lo = mid
        else:
            hi = mid
    return lo


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5000), st.floats(0.05, 1.0)), min_size=1, max_size=10), st.floats(0, 20000))
def test_the_weighted_waterfill_is_the_largest_level_that_fits(entries: list[tuple[float, float]], amount: float) -> None:
    highs, weights = [e[0] for e in entries], [e[1] for e in entries]
    got = waterfill(amount, [0.0] * len(highs), highs, weights)
    assert sum(w * g for w, g in zip(weights, got)) <= amount * (1 + 1e-9) + 1e-9
    assert all(0 <= g <= h for g, h in zip(got, highs))
    if sum(w * h for w, h in zip(weights, highs)) > amount:  # short: the level is the definition's
        level = weighted_by_definition(amount, highs, weights)
        for g, h in zip(got, highs):
            assert abs(g - min(level, h)) <= 1e-6 * max(1.0, level)


def test_one_water_fill() -> None:
    """core/fairshare.py holds the one water-fill; max_min_fair is a wrapper over it (no
    loop of its own), and no other module defines a water-fill or a fair division."""
    import ast

    from support.paths import REPO

    fills = []
    for path in [*(REPO / "powerbudgetd").rglob("*.py"), *(REPO / "sim").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            name = node.name.replace("_", "") if isinstance(node, ast.FunctionDef) else ""
            if any(k in name for k in ("waterfill", "minfair", "fairshare")):
                fills.append((path.relative_to(REPO).as_posix(), node.name, node))
    assert {(p, n) for p, n, _ in fills} == {("powerbudgetd/core/fairshare.py", "waterfill"),
                                             ("powerbudgetd/core/fairshare.py", "fair_shares"),
                                             ("powerbudgetd/core/fairshare.py", "cached_fair_shares"),
                                             ("powerbudgetd/core/fair.py", "max_min_fair")}
    wrapper = next(node for _, n, node in fills if n == "max_min_fair")
    assert not any(isinstance(n, (ast.For, ast.While)) for n in ast.walk(wrapper))
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "waterfill" for n in ast.walk(wrapper))
