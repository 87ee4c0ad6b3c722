"""Property: the lending policy never promises more than its pool, for any timings the
config accepts and any sequence of readings; a card is never donor and recipient at once."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerbudgetd.core.fairshare import fair_shares
from powerbudgetd.core.model import Role, Timings
from powerbudgetd.core.policy import CardView, LendingPolicy
from support.examples import examples


@st.composite
def timings(draw: st.DrawFn) -> Timings:
    """Any Timings its own validation accepts (the config builds them the same way)."""
    enter = draw(st.floats(0.05, 0.9))
    release = draw(st.floats(0.05, 0.9))
    burst_release = draw(st.floats(0.0, 0.5))
    tick = draw(st.sampled_from([0.05, 0.1, 0.25, 1.0]))
    return Timings(
        tick_s=tick,
        donor_hold_s=draw(st.floats(0.0, 10.0)),
        recipient_hold_s=draw(st.floats(0.0, 5.0)),
        release_hold_s=draw(st.floats(0.0, 15.0)),
        donor_enter_fraction=enter,
        wake_fraction=draw(st.floats(enter + 0.01, 1.0)),
        release_fraction=release,
        pinned_fraction=draw(st.floats(release + 0.01, 1.0)),
        burst_window_s=draw(st.floats(0.1, 5.0)),
        burst_release_share=burst_release,
        burst_pinned_share=draw(st.floats(burst_release + 0.01, 1.0)),
        min_step_w=draw(st.floats(0.0, 20.0)),
    )


@st.composite
def banks(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int]:
    """(min, max) mW per card and a pool that covers the floors."""
    n = draw(st.integers(1, 6))
    cards = []
    for _ in range(n):
        lo = draw(st.integers(50, 300)) * 1000
        cards.append((lo, lo + draw(st.integers(0, 500)) * 1000))
    floors = sum(lo for lo, _ in cards)
    pool = floors + draw(st.integers(0, sum(hi - lo for lo, hi in cards) // 1000 + 100)) * 1000
    return cards, pool


# Demand per card as a fraction of its cap (None: unknown), held for a run of ticks:
# loads come in phases, and timers only matter across several ticks of the same phase.
readings = st.lists(st.one_of(st.none(), st.floats(0.0, 1.4)), min_size=6, max_size=6)
phases = st.tuples(readings, st.integers(1, 40))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tm=timings(), bank=banks(), runs=st.lists(phases, min_size=1, max_size=8),
       priorities=st.lists(st.integers(0, 2), min_size=6, max_size=6))
def test_targets_never_exceed_the_pool(tm: Timings, bank: tuple[list[tuple[int, int]], int],
                                       runs: list[tuple[list[float | None], int]], priorities: list[int]) -> None:
    steps = [fractions for fractions, ticks in runs for _ in range(ticks)]
    cards, pool = bank
    lows, highs = [lo for lo, _ in cards], [hi for _, hi in cards]
    shares = fair_shares(pool, lows, highs)
    assert shares is not None
    policy = LendingPolicy(tm)
    caps = list(shares)
    for step, fractions in enumerate(steps):
        now = step * tm.tick_s
        views = []
        for i, (lo, hi) in enumerate(cards):
            f = fractions[i]
            power = None if f is None else int(f * caps[i])
            views.append(CardView(f"GPU-{i}", shares[i], lo, hi, caps[i], power, power, priorities[i]))
        out = policy.decide(now, views, pool)
        total = sum(t.limit_mw for t in out.values())
        assert total <= pool, f"targets {[t.limit_mw for t in out.values()]} sum {total} > pool {pool} at t={now}"
        for i, (lo, hi) in enumerate(cards):
            t = out[f"GPU-{i}"]
            assert lo <= t.limit_mw <= hi
            if t.role == Role.DONOR:  # its floor, or a busy card's lent limit under its share
                assert lo <= t.limit_mw <= max(lo, shares[i])
            caps[i] = t.limit_mw  # the controller confirms before the next tick


def test_issue_case_a_card_going_quiet_while_pinned_is_not_donor_and_recipient() -> None:
    """Two 100-300 W cards, pool 400 W, donor_hold 0.5 s, recipient_hold 0.2 s: both
    pinned for 2 s, then card A drops to 50 W (its average as fast as its instant, as a
    card whose average NVML estimates from the instant). The targets must stay within 400 W."""
    tm = Timings(donor_hold_s=0.5, recipient_hold_s=0.2)
    policy = LendingPolicy(tm)
    caps = {"A": 200_000, "B": 200_000}
    for step in range(60):
        now = step * 0.1
        inst = {"A": caps["A"] if now < 2.0 else 50_000, "B": caps["B"]}
        avg = {u: float(inst[u]) for u in inst}
        views = [CardView(u, 200_000, 100_000, 300_000, caps[u], int(avg[u]), inst[u]) for u in ("A", "B")]
        out = policy.decide(now, views, 400_000)
        assert sum(t.limit_mw for t in out.values()) <= 400_000, (now, out)
        caps = {u: t.limit_mw for u, t in out.items()}


def test_a_card_gone_quiet_lends_though_its_wish_to_borrow_outlives_the_gap() -> None:
    """Two 100-300 W cards at 400 W, both pinned for 3 s; then A idles at 30 W for 4 s.
    Its wish to borrow survives gaps of up to WANT_GAP_S (a bursty card keeps its place),
    but a card quiet long enough to lend is no borrower: it lends, and B gets its watts
    until A wakes (reclaimed at once)."""
    policy = LendingPolicy(Timings())
    caps = {"A": 200_000, "B": 200_000}
    lent_at = None
    for step in range(80):
        now = round(step * 0.1, 9)
        draw = {"A": caps["A"] if now < 3.0 or now >= 7.0 else 30_000, "B": caps["B"]}
        views = [CardView(u, 200_000, 100_000, 300_000, caps[u], draw[u], draw[u]) for u in ("A", "B")]
        out = policy.decide(now, views, 400_000)
        caps = {u: t.limit_mw for u, t in out.items()}
        if lent_at is None and out["A"].role == Role.DONOR:
            lent_at = now
        if 4.5 <= now < 7.0:
            assert out["A"].limit_mw == 100_000 and out["B"].limit_mw == 300_000, (now, out)
        if now >= 7.1:
            assert out["A"].limit_mw >= 200_000, (now, out)  # woke: reclaimed
    assert lent_at is not None and lent_at <= 3.0 + 1.0, lent_at
