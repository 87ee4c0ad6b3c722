"""A recipient that a reclaim lowers lends instead where it may (quiet long enough, or
busy below its share), so the other recipients keep their raise; and the no-flapping
rule counts the moves made outside lending (boot) (``core/policy.py``, "wants more"
and "no flapping")."""

from __future__ import annotations

from powerbudgetd.core.model import Role, Timings
from powerbudgetd.core.policy import FLAP_WINDOW_S, MAX_REVERSALS, CardView, LendingPolicy

SHARE, LO, HI = 200_000, 100_000, 300_000
POOL = 3 * SHARE
BOOT_MW = HI  # every card starts at its maximum; boot lowers it to its share


def _run(policy: LendingPolicy, draws: dict[str, object], until_s: float) -> dict[str, list[tuple[float, int, Role]]]:
    """Boot (each card from BOOT_MW to its share, noted as the controller does), then a
    decide every 0.1 s until ``until_s``; ``draws[u](now, cap)`` is card u's draw (mW).
    Returns each card's (time, target, role) from boot on."""
    policy.held(0.0, {u: (BOOT_MW, SHARE) for u in draws})
    caps = {u: SHARE for u in draws}
    seen: dict[str, list[tuple[float, int, Role]]] = {u: [(-1.0, BOOT_MW, Role.FAIR), (0.0, SHARE, Role.FAIR)]
                                                      for u in draws}
    for step in range(1, int(round(until_s * 10)) + 1):
        now = round(step * 0.1, 9)
        views = [CardView(u, SHARE, LO, HI, caps[u], d, d)
                 for u in sorted(draws) for d in [draws[u](now, caps[u])]]  # type: ignore[operator]
        out = policy.decide(now, views, POOL)
        assert sum(t.limit_mw for t in out.values()) <= POOL, (now, out)
        caps = {u: t.limit_mw for u, t in out.items()}
        for u, t in out.items():
            seen[u].append((now, t.limit_mw, t.role))
    return seen


def _most_reversals(limits: list[tuple[float, int, Role]]) -> int:
    """The most reversals of direction of a card's limit in any FLAP_WINDOW_S (as the
    scoreboard counts them on the enforced limit)."""
    direction, at = 0, []
    for (_, before, _), (t, after, _) in zip(limits, limits[1:]):
        if after != before:
            d = 1 if after > before else -1
            if direction and d != direction:
                at.append(t)
            direction = d
    return max((sum(1 for s in at if t <= s < t + FLAP_WINDOW_S) for t in at), default=0)


def test_a_quiet_recipient_lends_when_a_reclaim_would_cut_it_and_the_busy_one_keeps_its_raise() -> None:
    """A is pinned throughout; B pinned until 10 s, then idle at 30 W (a recipient holding
    its raise: release takes 10 s); C idles, lends (from 2.1 s: no quiet spell of its own
    says otherwise) and wakes at 16.5 s to a steady 150 W. Both recipients hold 250 W until then. When C wakes it returns to its share;
    B, quiet 6.5 s and lowered by that reclaim, goes on down to its floor and lends, and A
    keeps a raise (300 W: C's watts are B's now). Before, every recipient fell to its
    share (nothing left to lend that tick) and A, having reversed, could not be raised
    again for 10 s."""
    draws = {
        "A": lambda now, cap: cap,
        "B": lambda now, cap: cap if now < 10.0 else 30_000,
        "C": lambda now, cap: 30_000 if now < 16.5 else min(cap, 150_000),
    }
    seen = _run(LendingPolicy(Timings()), draws, 18.0)
    at = {u: {round(t, 1): (mw, role) for t, mw, role in seen[u]} for u in seen}
    assert at["A"][10.0][0] == at["B"][10.0][0] == 250_000, (at["A"][10.0], at["B"][10.0])
    assert at["C"][16.5] == (SHARE, Role.FAIR), at["C"][16.5]  # reclaimed at once
    assert at["B"][16.5] == (LO, Role.DONOR), at["B"][16.5]
    for t in (16.5, 17.0, 18.0):
        assert at["A"][t][0] == HI and at["A"][t][1] == Role.RECIPIENT, (t, at["A"][t])
    for u in seen:
        assert _most_reversals(seen[u]) <= MAX_REVERSALS, (u, seen[u])


def test_the_boot_move_counts_toward_a_cards_reversals() -> None:
    """Boot lowers every card from 300 W to its 200 W share. A is pinned; B pinned until
    6 s, then idle; C idles and lends from 5 s, wakes at 8 s. B was raised at about 5 s
    (a reversal after boot's decrease); lending at 8 s would be a second and C's next
    wake, or B's own, would force a third within 10 s: B falls to its share instead, and
    no card's limit reverses more than twice in any 10 s, boot included."""
    draws = {
        "A": lambda now, cap: cap,
        "B": lambda now, cap: cap if now < 6.0 else 30_000,
        "C": lambda now, cap: 30_000 if now < 8.0 or 9.0 <= now < 9.5 else min(cap, 250_000),
    }
    seen = _run(LendingPolicy(Timings()), draws, 20.0)
    at = {u: {round(t, 1): (mw, role) for t, mw, role in seen[u]} for u in seen}
    assert at["B"][7.0][0] > SHARE, at["B"][7.0]  # raised
    assert at["B"][8.0] == (SHARE, Role.FAIR), at["B"][8.0]
    for u in seen:
        assert _most_reversals(seen[u]) <= MAX_REVERSALS, (u, [(t, mw) for t, mw, _ in seen[u]])

