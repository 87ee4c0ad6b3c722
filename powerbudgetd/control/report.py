"""A tick's outcome and the bank as it left it, in W: built once, read by every side channel."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from powerbudgetd.control.card import CardState
from powerbudgetd.control.overbudget import OverBudget
from powerbudgetd.control.writes import WriteEvent
from powerbudgetd.core.model import Mode, Role
from powerbudgetd.core.snapshot import BankSnapshot, CardSnapshot
from powerbudgetd.core.units import opt_w, to_w


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


_ROLE = {role: role.value for role in Role}  # Role.value is a property: 0.1 us a card, a dict a tenth of it


def bank_snapshot(cards: Sequence[CardState], now: float, mode: Mode, ready: bool, budget_mw: int,
                  over: OverBudget, bounds: Mapping[str, int] | None = None) -> BankSnapshot:
    """The bank in W from the controller's card states at ``now`` (its mode, readiness,
    budget in mW and over-budget tracker): the one place the side channels' view is
    computed. An unreadable card's limits and draw are None. ``bounds``: each card's
    bound (mW, by UUID) as the caller just took it; without, taken here."""
    snaps = []
    sum_bound_mw = floor_mw = 0
    for c in cards:
        readable = c.error is None
        r = c.reading if readable else None  # an unreadable card's last values are stale
        info, led, audit = c.info, c.ledger, c.audit
        bound_mw = c.bound_mw if bounds is None else bounds[c.uuid]
        sum_bound_mw += bound_mw
        floor_mw += c.min_mw if c.controllable else bound_mw
        # Positional, in CardSnapshot's field order (tests/control/test_report.py checks
        # each field by name): 23 keyword arguments took 1.3 us a card, these 0.5 us.
        snaps.append(CardSnapshot(
            info.index, c.uuid, info.name, _ROLE[c.role], c.controllable, readable,
            None if r is None else opt_w(led.requested_mw),  # requested_limit_w
            None if r is None else opt_w(led.enforced_mw),  # enforced_limit_w
            to_w(bound_mw),  # limit_bound_w
            None if info.min_limit_w is None else to_w(c.min_mw),  # min_limit_w
            None if info.max_limit_w is None else to_w(c.max_mw),  # max_limit_w
            info.min_limit_w, info.max_limit_w,  # hw_min_limit_w, hw_max_limit_w
            None if r is None else r.power_avg_w,
            None if r is None else r.power_instant_w,
            c.error,
            audit.contested_w if audit.contested(now) else None,  # contested_w
            audit.excursions, audit.peak_excursion_w,
            tuple(sorted(c.read_errors.items())) if c.read_errors else (), audit.readings_rejected,
            info.mig_mode, opt_w(c.outside_cap_seen_mw),  # mig_mode, outside_cap_w
            info.vendor, info.backend,
        ))
    return BankSnapshot(
        now=now, mode=str(mode), ready=ready, budget_w=to_w(budget_mw),
        sum_limit_bound_w=to_w(sum_bound_mw), floor_w=to_w(floor_mw), cards=tuple(snaps),
        over_budget=over.active, over_budget_cause=over.cause or None,
        over_budget_episodes=over.episodes, over_budget_s=round(over.seconds, 3),
    )
