"""Over-budget episodes: when the sum of bounds exceeds the budget, for any cause.

The controller corrects such a state by itself (cards that cannot be lowered are
reserved at their bounds, the rest get fair shares of what is left, decreases first);
this module says so: one ``over_budget`` log line per episode with the cause and the
numbers, and the state the metrics, the status line and MQTT export.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from powerbudgetd.control.card import CardState
from powerbudgetd.core.model import Mode
from powerbudgetd.core.units import to_w

log = structlog.get_logger("powerbudgetd")


def degraded(cards: Sequence[CardState]) -> list[str]:
    """Why the bank is not fully under control, one phrase per card (empty: it is)."""
    return [f"GPU {c.index} {why}" for c in cards if (why := OverBudget.why(c))]


class OverBudget:
    """Tracks over-budget episodes (s, W) and the cards that cannot be held to their share."""

    def __init__(self) -> None:
        self.since: float | None = None  # when the current episode began (None: within budget)
        self.episodes = 0
        self.seconds = 0.0  # total time over budget, ticks counted at their start
        self.cause = ""  # the current (or last) episode's cause
        self.peak_w = 0.0  # the current (or last) episode's highest sum of bounds
        self._last: float | None = None
        self._infeasible = False
        self._budget_mw: int | None = None  # the budget at the last tick

    @property
    def active(self) -> bool:
        return self.since is not None

    @staticmethod
    def why(c: CardState) -> str | None:
        """Why a card counts above what we can hold it to, or None."""
        if c.gone:
            return f"gone, reserved at {to_w(c.bound_mw):g} W"
        if c.error is not None:
            return f"unreadable ({c.error.split(':')[0]}), counted at {to_w(c.bound_mw):g} W"
        if c.ledger.new:
            return f"new, counted at {to_w(c.bound_mw):g} W until capped"
        if c.ledger.held_above:
            return (f"held at {to_w(c.enforced_mw):g} W above its requested {to_w(c.requested_mw):g} W "
                    "by an outside limit")
        if c.ledger.backoff_s:
            return "a write did not take"
        if not c.controllable and not c.excluded:  # an operator's exclusion is a choice, not a fault
            return f"not controllable, counted at {to_w(c.bound_mw):g} W"
        return None

    @staticmethod
    def _raised(cards: Sequence[CardState]) -> str:
        """The cards above their share (a reset, another tool), as a cause."""
        above = [f"GPU {c.index} at {to_w(c.bound_mw):g} W (share {to_w(c.share_mw):g} W)"
                 for c in cards if c.share_mw is not None and c.bound_mw > c.share_mw]
        return "limits raised behind our back (a reset or another tool): " + ", ".join(above or ["?"])

    def track(self, now: float, cards: Sequence[CardState], budget_mw: int, mode: Mode,
              sum_bound_mw: int) -> None:
        """Take the bank as the tick left it (``cards``, counted at ``sum_bound_mw``, the
        sum of their bounds, mW, against ``budget_mw``): start, follow or end an episode,
        logging each."""
        over = sum_bound_mw > budget_mw
        lowered = self._budget_mw is not None and budget_mw < self._budget_mw
        self._budget_mw = budget_mw
        if self.since is not None and self._last is not None:
            self.seconds += now - self._last
        self._last = now
        if over and self.since is None:
            outside = degraded(cards)
            # Raised behind our back (a reset, another tool): not a card we cannot control,
            # nor the budget: an outside episode all the same.
            raised = not outside and mode != Mode.BOOTING and not lowered
            self.cause = "; ".join(outside) or ("boot: cards at their start-up limits" if mode == Mode.BOOTING
                                                else "budget lowered" if lowered else self._raised(cards))
            # A lowered budget (UPS, wall meter, remote, reload) is our own step down, its
            # decreases under way: not an outside episode, so no alert counts it.
            outside_episode = bool(outside) or raised
            self.since, self.episodes = now, self.episodes + int(outside_episode or mode == Mode.BOOTING)
            self.peak_w = to_w(sum_bound_mw)
            (log.error if outside_episode else log.info)(
                "over_budget", cause=self.cause, sum_limits_w=self.peak_w, budget_w=to_w(budget_mw),
                action="lowering the controllable cards (decreases only) until the bank fits")
        elif over:
            self.peak_w = max(self.peak_w, to_w(sum_bound_mw))
        elif self.since is not None:
            log.info("over_budget_cleared", after_s=round(now - self.since, 3), peak_w=self.peak_w,
                     sum_limits_w=to_w(sum_bound_mw), budget_w=to_w(budget_mw))
            self.since = None

    def infeasible(self, pool_mw: int, active: Sequence[CardState], infeasible: bool) -> None:
        """The cards we cannot lower leave less than the others' floors: say so loudly
        (once per episode); the others are then held at their floors."""
        if infeasible and not self._infeasible:
            log.error("budget_infeasible_now", pool_w=to_w(pool_mw), floors_w=to_w(sum(c.min_mw for c in active)),
                      action="cards outside our control alone leave less than the others' floors: every "
                      "controllable card held at its floor; find what holds the other cards' limits")
        self._infeasible = infeasible
