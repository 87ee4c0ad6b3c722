"""Property: over random banks, budgets, demand and lag, the budget invariant holds at
every tick, no card leaves its constraints, and boot ends at fair share.

The random-bank test runs in the quick profile too, at 15 examples (a tenth would take
the profile past its minute); the outside-events one only in the full run."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from support.examples import examples
from support.rig import BACKENDS, FAST, make_rig
from powerbudgetd_sim.physics import BankEvent, CardSpec
from powerbudgetd_sim.profiles import Phase, Profile
from powerbudgetd_sim.traces import TRACES


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


STEP_MW = {"nvidia": 1, "amd": 1000, "intel": 125}  # what each driver keeps a limit in


def is_fair_share(shares, specs, budget_mw):
    """Shares are clamp(L, min, max) for one level L, each rounded down to its card's
    limit step (NVML mW, amdgpu whole W), within the budget, and leave less than one W
    per card unused (plus what the steps round off) unless every card is at its max."""
    mins = [round(s.min_w * 1000) for s in specs]
    maxs = [round(s.max_w * 1000) for s in specs]
    steps = [STEP_MW[s.vendor] for s in specs]
    free = [x for x, lo, hi, st in zip(shares, mins, maxs, steps) if lo < x < hi]

    def want(level, lo, hi, step):
        x = min(max(level, lo), hi)
        return x if x in (lo, hi) else max(lo, x - x % step)

    # The level is a free card's share; a stepped card's share is its level rounded
    # down, so the level may be up to a step above it.
    levels = sorted({x + d for x in free for d in range(0, max(steps))}) if free else [None]
    if not any(level is None or all(x == want(level, lo, hi, st) for x, lo, hi, st in zip(shares, mins, maxs, steps))
               for level in levels):
        return False
    level = levels[0]
    total = sum(shares)
    slack = sum(1000 + st - 1 for st in steps)
    return total <= budget_mw and (budget_mw - total < slack or shares == maxs or level is None)


def run_random_bank(bank, backend):
    specs, budget, lag, seed = bank
    rig = make_rig(specs, budget, timings=FAST, lag_s=lag, seed=seed, backend=backend)
    specs = [c.spec for c in rig.bank.cards]
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
            # A card with one cap read back is done when the cap reads back (a raise may
            # still be biting): its requested limit; NVML's, the limit enforced.
            shares = [c.enforced_mw(rig.bank.now) if c.spec.vendor == "nvidia" else c.requested_mw
                      for c in rig.bank.cards]
            assert is_fair_share(shares, specs, budget_mw), shares
        prev = now
    assert ready_seen, "never ready"


@settings(max_examples=examples(1000, quick=15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(banks())
def test_budget_invariant_over_random_banks(bank):
    run_random_bank(bank, "nvml")


# The same on the hwmon backend (one cap read back, whole W on amdgpu) and on a bank
# mixing NVML and hwmon cards: fewer examples in the quick profile (each is a whole bank).
@pytest.mark.parametrize("backend", ["hwmon", "mixed"])
@settings(max_examples=examples(150, quick=6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(banks())
def test_budget_invariant_over_random_banks_on_hwmon_and_mixed(backend, bank):
    run_random_bank(bank, backend)


# -- outside events ---------------------------------------------------------------------
# What happens behind the daemon's back, drawn at random: an outside floor held and let
# go, another tool raising a limit (once, or the same value twice in a row), a driver
# reset, a card appearing late or re-plugged, frozen and impossible power readings. The claim (issue: the budget holds in the world
# as it is): after any outside event the bank is back within budget within one tick
# plus the limit lag (another tool's raise included: it is corrected in the tick that
# first reads it, whatever the lag), wherever it
# can be (what outside limiters hold, plus every other card's floor, fits the budget),
# and it never goes over through an action of ours.
OUTSIDE = ("floor", "set_limit", "set_twice", "reset", "replug", "appear", "freeze", "bad_reading")


@st.composite
def outside_banks(draw):
    specs, budget, lag, seed = draw(banks())
    lag = min(lag, 0.2)
    events: list[BankEvent] = []
    late = set()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(specs) - 1))
        s = specs[i]
        at = round(draw(st.floats(3.0, 10.0)), 2)
        kind = draw(st.sampled_from(OUTSIDE))
        if kind == "floor":
            limit = draw(st.floats(s.min_w, s.max_w))
            events += [BankEvent(at, i, "floor", limit_w=limit), BankEvent(at + draw(st.floats(0.5, 3.0)), i, "floor")]
        elif kind == "set_limit":
            events.append(BankEvent(at, i, "set_limit", limit_w=draw(st.floats(s.min_w, s.max_w))))
        elif kind == "set_twice":  # a tool writing the same value again soon after (a retry, a loop)
            limit = draw(st.floats(s.min_w, s.max_w))
            events += [BankEvent(at, i, "set_limit", limit_w=limit),
                       BankEvent(round(at + draw(st.floats(0.02, 0.3)), 2), i, "set_limit", limit_w=limit)]
        elif kind == "reset":
            events.append(BankEvent(at, i, "reset"))
        elif kind == "replug":
            events += [BankEvent(at, i, "disappear"), BankEvent(at + draw(st.floats(0.2, 2.0)), i, "appear")]
        elif kind == "appear" and i not in late and len(late) < len(specs) - 1:
            late.add(i)
            events.append(BankEvent(at, i, "appear"))
        elif kind == "freeze":
            events += [BankEvent(at, i, "freeze"), BankEvent(at + 4.0, i, "unfreeze")]
        elif kind == "bad_reading":
            events += [BankEvent(at, i, "bad_reading", limit_w=draw(st.sampled_from([-5.0, 1e7]))),
                       BankEvent(at + 1.0, i, "bad_reading")]
    specs = [dataclasses.replace(s, present=False) if i in late else s for i, s in enumerate(specs)]
    return specs, budget, lag, seed, events


def lowest_possible_mw(bank) -> int:
    """What the bank can be held to now: an outside floor where one holds, else the floor."""
    return sum(max(c.min_mw, c.outside_floor_mw or 0) for c in bank.cards if c.present)


@pytest.mark.slow  # hundreds of random banks with events: the full run (CI) covers it
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(outside_banks())
def test_after_any_outside_event_the_bank_is_back_within_budget_within_a_tick_plus_the_lag(case):
    back_within_budget_after_outside_events("nvml", case)


def _idle_card(index: int, min_w: float, max_w: float, default_w: float) -> CardSpec:
    return CardSpec(uuid=f"GPU-prop-{index}", name="Random GPU", min_w=min_w, max_w=max_w, default_w=default_w,
                    idle_w=5.0, has_instant=False, profile=Profile((Phase(0.0),)))


# Found by this test in CI (hwmon): another tool wrote 276 W to an idle card twice, 60 ms
# apart, the second under our cut in flight; the card beside it fixed, nothing else could
# give, and the cut was waited on for confirm_timeout_s (24 W over for 3 s).
TWICE_UNDER_OUR_CUT = ([_idle_card(0, 120.0, 322.0, 120.0), _idle_card(1, 70.0, 70.0, 70.0)], 322.0, 0.0, 0,
                       [BankEvent(3.06, 0, "set_limit", limit_w=276.0), BankEvent(3.12, 0, "set_limit", limit_w=276.0)])


# The same on the hwmon backend and a mixed bank: a third of the examples each (an hwmon
# bank serves its files through a directory tree, about three times NVML's cost a tick).
@pytest.mark.slow
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "nvml"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(outside_banks())
@example(case=TWICE_UNDER_OUR_CUT)
def test_after_any_outside_event_on_hwmon_and_mixed_banks_the_bank_is_back_within_budget(backend, case):
    back_within_budget_after_outside_events(backend, case)


def back_within_budget_after_outside_events(backend, case):
    specs, budget, lag, seed, events = case
    rig = make_rig(specs, budget, timings=FAST, lag_s=lag, seed=seed, backend=backend)
    rig.bank._events = sorted((e.at_s, k, e) for k, e in enumerate(events))
    budget_mw = rig.ctl.budget_mw
    tick = rig.ctl.timings.tick_s
    window = {"floor": tick + lag, "reset": tick + lag, "appear": tick + lag, "set_limit": tick + lag}
    # A floor at or below a card's limit cannot be seen until a decrease of ours fails to
    # bite: each floor in force may cost the correction one more tick plus the lag.
    floors = [(e.at_s, next((f.at_s for f in events if f.card == e.card and f.action == "floor"
                             and f.limit_w is None and f.at_s > e.at_s), 1e9))
              for e in events if e.action == "floor" and e.limit_w is not None]
    changed = [(e.at_s, window[e.action] + (tick + lag) * sum(1 for a, b in floors if a < e.at_s + window[e.action]
                                                              and b > e.at_s))
               for e in events if e.action in window]
    while rig.t < 16.0:
        rig.bank.advance_to(rig.t)
        before = rig.bank.sum_limit_bound_mw()
        rep = rig.step()  # advances to the same time, then ticks
        after = rig.bank.sum_limit_bound_mw()
        ours_up = [w for w in rep.writes if w.error is None and w.to_w > w.from_w]
        if ours_up:  # never over through an action of ours
            assert before <= budget_mw and after <= budget_mw, (rep.now, ours_up, before, after)
        if not rig.ctl.ready or after <= budget_mw:
            continue
        recent = [at for at, within_s in changed if at - 1e-6 <= rep.now < at + within_s + 1e-6]  # 6.1000000000000005 is in the 6.1 tick
        feasible = lowest_possible_mw(rig.bank) <= budget_mw
        assert recent or not feasible, (
            f"t={rep.now}: {after} mW > {budget_mw} mW, no outside event in the last tick plus lag "
            f"({tick} + {lag} s); events {events}")
