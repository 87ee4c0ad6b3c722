"""Property: over random banks, budgets, demand and lag, the budget invariant holds at
every tick, no card leaves its constraints, and boot ends at fair share."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FAST, make_rig
from powerbudgetd_sim.physics import CardSpec
from powerbudgetd_sim.profiles import Phase, Profile
from powerbudgetd_sim.traces import TRACES


pytestmark = pytest.mark.slow  # hundreds of random banks: the full run (CI) covers it

@st.composite
def phases(draw, max_w):
    power = st.floats(0.0, 1.2 * max_w)
    kind = draw(st.sampled_from(["idle", "constant", "square", "ramp", "trace"]))
    at = draw(st.floats(0.0, 12.0))
    if kind == "constant":
        return Phase(at, kind, power_w=draw(power))
    if kind == "square":
        return Phase(at, kind, high_w=draw(power), on_s=draw(st.floats(0.05, 2.0)), off_s=draw(st.floats(0.0, 2.0)))
    if kind == "ramp":
        return Phase(at, kind, to_w=draw(power), over_s=draw(st.floats(0.0, 5.0)))
    if kind == "trace":
        return Phase(at, kind, trace=draw(st.sampled_from(TRACES)), offset_s=draw(st.floats(0.0, 60.0)))
    return Phase(at, kind)


@st.composite
def cards(draw, index):
    min_w = draw(st.integers(50, 300))
    max_w = min_w + draw(st.integers(0, 500))
    default_w = draw(st.integers(min_w, max_w))
    ph = sorted(draw(st.lists(phases(max_w), min_size=1, max_size=4)), key=lambda p: p.at_s)
    return CardSpec(
        uuid=f"GPU-prop-{index}",
        name="Random GPU",
        min_w=float(min_w),
        max_w=float(max_w),
        default_w=float(default_w),
        idle_w=float(draw(st.integers(5, 150))),
        has_instant=draw(st.booleans()),
        profile=Profile((Phase(0.0),) + tuple(ph)),
    )


@st.composite
def banks(draw):
    n = draw(st.integers(1, 8))
    specs = [draw(cards(i)) for i in range(n)]
    lo = sum(s.min_w for s in specs)
    hi = 1.1 * sum(s.max_w for s in specs)
    budget = draw(st.floats(lo, hi))
    lag = draw(st.sampled_from([0.0, 0.05, 0.1, 0.2, 0.5]))
    return specs, budget, lag, draw(st.integers(0, 2**16))


def is_fair_share(shares, specs, budget_mw):
    """Shares are clamp(L, min, max) for one level L, within the budget, and leave
    less than one mW per card unused unless every card is at its max."""
    mins = [round(s.min_w * 1000) for s in specs]
    maxs = [round(s.max_w * 1000) for s in specs]
    free = [x for x, lo, hi in zip(shares, mins, maxs) if lo < x < hi]
    if free and max(free) - min(free) > 0:
        return False
    level = free[0] if free else None
    for x, lo, hi in zip(shares, mins, maxs):
        if level is not None and x != min(max(level, lo), hi):
            return False
    total = sum(shares)
    return total <= budget_mw and (budget_mw - total < len(shares) * 1000 or shares == maxs or level is None)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(banks())
def test_budget_invariant_over_random_banks(bank):
    specs, budget, lag, seed = bank
    rig = make_rig(specs, budget, timings=FAST, lag_s=lag, seed=seed)
    budget_mw = rig.ctl.budget_mw
    prev = [c.requested_mw for c in rig.bank.cards]
    ready_seen = False
    while rig.t < 12.0:
        rep = rig.step()
        assert all(w.error is None for w in rep.writes), rep.writes
        now = [c.requested_mw for c in rig.bank.cards]
        for c in rig.bank.cards:
            assert c.min_mw <= c.requested_mw <= c.max_mw
        truth = rig.bank.sum_limit_bound_mw()
        assert rig.ctl.sum_bound_mw >= truth, "the controller counted less than may be in force"
        if rig.ctl.ready or any(a > b for a, b in zip(now, prev)):
            assert truth <= budget_mw, f"t={rig.t}: {truth} mW > {budget_mw} mW"
        if rig.ctl.ready and not ready_seen:
            ready_seen = True
            shares = [c.enforced_mw(rig.bank.now) for c in rig.bank.cards]
            assert is_fair_share(shares, specs, budget_mw), shares
        prev = now
    assert ready_seen, "never ready"
