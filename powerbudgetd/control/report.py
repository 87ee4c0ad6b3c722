"""A tick's outcome and the bank as it left it, in W: built once, read by every side channel."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from powerbudgetd.control.card import CardState
from powerbudgetd.control.overbudget import OverBudget
from powerbudgetd.control.writes import WriteEvent
from powerbudgetd.core.model import Mode
from powerbudgetd.core.snapshot import BankSnapshot, CardSnapshot
from powerbudgetd.core.units import opt_w


@dataclass(frozen=True)
class TickReport:
    """The outcome of one tick: mode, budget and sum of bounds (W), the writes, and the
    bank as the tick left it (built once, read by every side channel)."""

    now: float
    mode: Mode
    ready: bool
    budget_w: float
    sum_bound_w: float
    writes: tuple[WriteEvent, ...]
    faults: tuple[str, ...]
    snapshot: BankSnapshot


def bank_snapshot(cards: Sequence[CardState], now: float, mode: Mode, ready: bool, budget_mw: int,
                  over: OverBudget) -> BankSnapshot:
    """The bank in W from the controller's card states at ``now`` (its mode, readiness,
    budget in mW and over-budget tracker): the one place the side channels' view is
    computed. An unreadable card's limits and draw are None."""
    snaps = []
    sum_bound_mw = floor_mw = 0
    for c in cards:
        r = c.reading if c.readable else None  # an unreadable card's last values are stale
        info = c.info
        bound_mw = c.bound_mw
        sum_bound_mw += bound_mw
        floor_mw += c.min_mw if c.controllable else bound_mw
        snaps.append(CardSnapshot(
            index=c.index, uuid=c.uuid, name=info.name, role=str(c.role), controllable=c.controllable,
            readable=c.readable,
            requested_limit_w=None if r is None else opt_w(c.requested_mw),
            enforced_limit_w=None if r is None else opt_w(c.enforced_mw),
            limit_bound_w=bound_mw / 1000,
            min_limit_w=None if info.min_limit_w is None else c.min_mw / 1000,
            max_limit_w=None if info.max_limit_w is None else c.max_mw / 1000,
            hw_min_limit_w=info.min_limit_w, hw_max_limit_w=info.max_limit_w,
            power_avg_w=None if r is None else r.power_avg_w,
            power_instant_w=None if r is None else r.power_instant_w,
            error=c.error, contested_w=c.contested_w if c.contested(now) else None,
            excursions=c.excursions, peak_excursion_w=c.peak_excursion_w,
            read_errors=tuple(sorted(c.read_errors.items())), readings_rejected=c.audit.readings_rejected,
            mig_mode=info.mig_mode, outside_cap_w=opt_w(c.outside_cap_seen_mw),
        ))
    return BankSnapshot(
        now=now, mode=str(mode), ready=ready, budget_w=budget_mw / 1000,
        sum_limit_bound_w=sum_bound_mw / 1000, floor_w=floor_mw / 1000, cards=tuple(snaps),
        over_budget=over.active, over_budget_cause=over.cause or None,
        over_budget_episodes=over.episodes, over_budget_s=round(over.seconds, 3),
    )
