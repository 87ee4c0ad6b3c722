"""Busy cards lend the headroom they do not use, and a quiet card's wish to borrow
expires once it is quiet long enough to lend (``core/policy.py``, "busy, below its limit")."""

from __future__ import annotations

from powerbudgetd.core.model import Role, Timings
from powerbudgetd.core.policy import LEND_MIN_MW, CardView, LendingPolicy

SHARE, LO, HI, POOL = 200_000, 100_000, 300_000, 400_000


def _tick(policy: LendingPolicy, now: float, caps: dict[str, int], draw: dict[str, int]) -> dict[str, int]:
    views = [CardView(u, SHARE, LO, HI, caps[u], draw[u], draw[u]) for u in sorted(caps)]
    out = policy.decide(now, views, POOL)
    assert sum(t.limit_mw for t in out.values()) <= POOL, (now, out)
    return {u: t.limit_mw for u, t in out.items()}


def test_a_busy_card_below_its_share_lends_the_difference_and_is_reclaimed_on_the_instant_reading() -> None:
    """A draws a steady 90 W under its 200 W share (busy: above its quiet line of 70 W);
    B sits at its cap. After donor_hold_s (5 s) of A's draw below, A lends down to
    90 / 0.7 = 128.6 -> 130 W and B gets the 70 W. At 20 s A's instant draw steps to
    190 W (over 0.85 x 130 W): that same tick A is back at its share, B at its share."""
    policy = LendingPolicy(Timings())
    caps = {"A": SHARE, "B": SHARE}
    lent_at = None
    for step in range(0, 250):
        now = round(step * 0.1, 9)
        a = 90_000 if now < 20.0 else 190_000
        caps = _tick(policy, now, caps, {"A": min(a, caps["A"]), "B": caps["B"]})
        if lent_at is None and caps["A"] < SHARE:
            lent_at = now
        if 8.0 <= now < 20.0:
            assert caps["A"] == 130_000 and policy.role("A") == Role.DONOR, (now, caps)
            assert caps["B"] == 270_000, (now, caps)
        if now >= 20.0:
            assert caps["A"] >= SHARE and caps["B"] <= SHARE, (now, caps)  # reclaimed at once
    assert lent_at is not None and 5.0 <= lent_at <= 7.0, lent_at


def test_a_busy_card_lends_nothing_without_a_measurable_gap_or_a_borrower() -> None:
    """A at 115 W would lend down to 165 W: less than LEND_MIN_MW under its share, so it
    keeps its share. With B not wanting more, A at 90 W lends nothing either."""
    assert SHARE - 165_000 < LEND_MIN_MW
    for a, b in ((115_000, None), (90_000, 120_000)):
        policy = LendingPolicy(Timings())
        caps = {"A": SHARE, "B": SHARE}
        for step in range(150):
            now = round(step * 0.1, 9)
            caps = _tick(policy, now, caps, {"A": a, "B": caps["B"] if b is None else b})
            assert caps["A"] == SHARE, (a, b, now, caps)


def test_a_card_that_wandered_to_its_limit_in_the_window_does_not_lend() -> None:
    """A at 90 W but at its share once every 4 s: its highest draw per second over the
    window is its cap, so it never lends."""
    policy = LendingPolicy(Timings())
    caps = {"A": SHARE, "B": SHARE}
    for step in range(300):
        now = round(step * 0.1, 9)
        a = SHARE if step % 40 == 0 else 90_000
        caps = _tick(policy, now, caps, {"A": a, "B": caps["B"]})
        assert caps["A"] == SHARE, (now, caps)


def test_a_busy_lender_gone_quiet_lends_down_to_its_floor() -> None:
    """A lends at 130 W from 90 W; at 12 s it idles at 20 W: after donor_hold_s it lends
    the rest, down to its floor (a move further down), and B gets 300 W."""
    policy = LendingPolicy(Timings())
    caps = {"A": SHARE, "B": SHARE}
    for step in range(250):
        now = round(step * 0.1, 9)
        caps = _tick(policy, now, caps, {"A": 90_000 if now < 12.0 else 20_000, "B": caps["B"]})
        if 8.0 <= now < 12.0:
            assert caps["A"] == 130_000, (now, caps)
        if now >= 18.0:
            assert caps["A"] == LO and caps["B"] == HI, (now, caps)


def test_a_quiet_cards_wish_to_borrow_expires_once_it_is_quiet_long_enough_to_lend() -> None:
    """donor_hold_s 2 s. A and B pinned (both wish to borrow, nothing to lend yet); A
    idles 3-7 s (a gap under WANT_GAP_S, which alone would keep its wish; quiet for the
    whole donor_hold_s) and lends to B; C (floor 180 W) busy at 150 W, idles from 6 s
    and lends 20 W. On waking at 7 s A's wish has expired: it is reclaimed to its share,
    and borrows C's watts only after wanting more for recipient_hold_s (2 s) again."""
    tm = Timings(donor_hold_s=2.0)
    policy = LendingPolicy(tm)
    lows = {"A": LO, "B": LO, "C": 180_000}
    caps = {"A": SHARE, "B": SHARE, "C": SHARE}
    borrowed_again = None
    for step in range(130):
        now = round(step * 0.1, 9)
        draw = {"A": caps["A"] if now < 3.0 or now >= 7.0 else 30_000, "B": caps["B"], "C": 150_000 if now < 6.0 else 20_000}
        views = [CardView(u, SHARE, lows[u], HI, caps[u], draw[u], draw[u]) for u in sorted(caps)]
        out = policy.decide(now, views, 3 * SHARE)
        assert sum(t.limit_mw for t in out.values()) <= 3 * SHARE, (now, out)
        caps = {u: t.limit_mw for u, t in out.items()}
        if 4.5 <= now < 7.0:
            assert out["A"].role == Role.DONOR, now
        if now >= 7.0 and borrowed_again is None and out["A"].role == Role.RECIPIENT:
            borrowed_again = now
    assert borrowed_again is not None and borrowed_again >= 7.0 + tm.recipient_hold_s - 0.15, borrowed_again
