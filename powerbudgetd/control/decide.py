"""Each controlled card's target limit for this tick, and the reason for its write.

The cards we do not control right now (fixed, lost, held, gone) are reserved at their
bounds; the controlled ones share what is left: fair shares outside dynamic mode, the
lending policy's targets in it (:mod:`powerbudgetd.core.policy`).
"""

from __future__ import annotations

from collections.abc import Sequence

from powerbudgetd.control.card import CardState
from powerbudgetd.control.overbudget import OverBudget
from powerbudgetd.core.fairshare import cached_fair_shares
from powerbudgetd.core.model import Mode, Role
from powerbudgetd.core.policy import CardView, LendingPolicy
from powerbudgetd.core.units import opt_mw

MODE_REASON = {Mode.BOOTING: "boot", Mode.FAILSAFE: "fail_static", Mode.STOPPING: "shutdown"}

Targets = tuple[dict[str, int], dict[str, str]]  # (mW, reason) by UUID


def targets(cards: Sequence[CardState], active: Sequence[CardState], budget_mw: int, mode: Mode,
            policy: LendingPolicy, over: OverBudget, now: float, dry_run: bool = False,
            settling: bool = False, doubted: frozenset[str] = frozenset()) -> Targets:
    """Targets (mW) and reasons, by UUID, for the ``active`` cards among ``cards``; sets
    each card's fair share and role, and tells ``over`` whether the shares fit (not while
    ``settling``: a card reserved only until its decrease bites is not outside our control).

    The ``doubted`` cards (UUIDs among ``active``, named while the bank is over budget:
    ``CardLedger.doubted``) are sent their fair share, but the others are sized with
    each counted at its bound: the bank is brought within budget even if the doubted
    write does not take either, and a cut that does take leaves room the next tick
    hands back."""
    # By UUID: ``c in active`` over a list compares dataclasses, N x N per tick.
    active_ids = {c.uuid for c in active}
    outside_mw = 0
    for c in cards:
        if c.uuid not in active_ids:
            outside_mw += c.bound_mw
            if c.readable:
                c.role = Role.FIXED
    pool = budget_mw - outside_mw
    shares = _shares(pool, active)
    over.infeasible(pool, active, shares is None and not settling)
    for c, share in zip(active, shares or [c.min_mw for c in active]):
        c.share_mw = share
    drift = {c.uuid: "drift" for c in active if c.requested_mw != c.expected_mw and c.audit.drifted_at(now)}
    retried = {c.uuid: min(c.share_mw or c.min_mw, c.bound_mw) for c in active if c.uuid in doubted}
    if retried:
        for c in active:
            if c.uuid in retried:
                c.role = Role.FAIR
        active = [c for c in active if c.uuid not in retried]
        pool -= sum(c.bound_mw for c in cards if c.uuid in retried)
        for c, share in zip(active, _shares(pool, active) or [c.min_mw for c in active]):
            c.share_mw = min(share, c.share_mw or share)
    chosen, reasons = _targets(active, pool, mode, policy, now, drift, dry_run)
    retry_reason = MODE_REASON.get(mode, "reclaim")
    return {**chosen, **retried}, {**reasons, **{u: drift.get(u, retry_reason) for u in retried}}


def _shares(pool_mw: int, cards: Sequence[CardState]) -> Sequence[int] | None:
    return cached_fair_shares(pool_mw, tuple(c.min_mw for c in cards), tuple(c.usable_max_mw for c in cards))


def _targets(active: Sequence[CardState], pool: int, mode: Mode, policy: LendingPolicy, now: float,
             drift: dict[str, str], dry_run: bool) -> Targets:
    """The targets and reasons of the ``active`` cards sharing ``pool`` (mW), their fair
    shares set: the shares themselves outside dynamic mode, the policy's targets in it;
    ``drift``'s reason where a card's limit drifted."""
    # Held below its requested limit from outside: it cannot use what it is counted at
    # (once the cap is known, it is planned at it: see observe.outside_cap).
    outside = {c.uuid for c in active if c.ledger.held_below and not c.ledger.busy and c.outside_cap_mw is None}
    if mode != Mode.DYNAMIC:
        policy.reset()
        for c in active:
            c.role = Role.FAIR
        reason = MODE_REASON[mode]
        return {c.uuid: c.share_mw for c in active}, {c.uuid: drift.get(c.uuid, reason) for c in active}  # type: ignore[misc]
    views = [CardView(c.uuid, c.share_mw, c.min_mw, c.usable_max_mw,  # type: ignore[arg-type]
                      c.bound_mw if dry_run or c.enforced_mw is None else c.enforced_mw,
                      None if c.uuid in outside else opt_mw(c.reading.power_avg_w if c.reading else None),
                      None if c.uuid in outside else opt_mw(c.reading.power_instant_w if c.reading else None),
                      c.priority) for c in active]
    decided = policy.decide(now, views, pool)
    given = {t.reason for t in decided.values()}
    tick_reason = next((r for r in ("reclaim", "release", "lend") if r in given), "lend")
    for c in active:
        c.role = decided[c.uuid].role
    return ({u: t.limit_mw for u, t in decided.items()},
            {u: drift.get(u) or ("outside_limit" if u in outside and t.reason else t.reason) or tick_reason
             for u, t in decided.items()})
