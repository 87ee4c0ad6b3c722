"""The budget keeper: the one place that sets the controller's budget, from the arbiter's
decision, between ticks only. The daemon, the simulator and the circuit simulation all
keep the budget through it."""

from __future__ import annotations

import structlog

from powerbudgetd.control.controller import Controller
from powerbudgetd.core.arbiter import BudgetArbiter, Decision
from powerbudgetd.core.units import budget_mw, to_w
from powerbudgetd.errors import BudgetInfeasible

log = structlog.get_logger("powerbudgetd")


class BudgetKeeper:
    """Sets the controller's budget to the arbiter's decision, between ticks only.

    A decision below the bank's floor holds the cards at their minimum limits (logged
    once, ``budget_below_floor``). One the controller refuses (``BudgetInfeasible``:
    its own floor check, which also counts cards it cannot control) keeps the last good
    budget, logged once (``budget_change_refused``) and retried on every tick.
    :attr:`in_force` is the last decision the controller took.
    """

    def __init__(self, arbiter: BudgetArbiter) -> None:
        self.arbiter = arbiter
        self.in_force: Decision | None = None
        self._said: tuple[str, int] | None = None  # the last problem logged: (event, mW)

    def apply(self, ctl: Controller, now: float, reason: str | None = None, *, strict: bool = False) -> Decision:
        """Resolve the arbiter at ``now`` (s) and set ``ctl``'s budget to it when it
        differs; the next tick's writes carry ``reason`` (default: the source in force).
        ``strict``: raise BudgetInfeasible instead of keeping the last good budget."""
        decision = self.arbiter.resolve(now)
        want_mw = budget_mw(decision.budget_w)
        if want_mw != ctl.budget_mw:
            old_w = to_w(ctl.budget_mw)
            try:
                ctl.set_budget(decision.budget_w, reason=reason or decision.source)
            except BudgetInfeasible as exc:
                if strict:
                    raise
                if self._said != ("budget_change_refused", want_mw):
                    log.error("budget_change_refused", wanted_w=round(decision.budget_w, 1), source=decision.source,
                              kept_budget_w=old_w, error=str(exc))
                    self._said = ("budget_change_refused", want_mw)
                return decision
            log.info("budget_changed", from_w=old_w, to_w=to_w(ctl.budget_mw), source=decision.source)
        # Said only once the controller holds it: a refused budget holds nothing.
        if decision.below_floor and self._said != ("budget_below_floor", budget_mw(decision.wanted_w)):
            log.error("budget_below_floor", wanted_w=round(decision.wanted_w, 1), source=decision.source,
                      floor_w=decision.floor_w, detail="holding the cards at their minimum limits instead")
            self._said = ("budget_below_floor", budget_mw(decision.wanted_w))
        self.in_force = decision
        if not decision.below_floor:
            self._said = None
        return decision
