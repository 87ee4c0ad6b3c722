"""The remote budget: a command on an MQTT topic that lowers (or restores) the budget.

A value in [floor, configured budget] (W) is offered to the budget arbiter as source
``remote``; the configured budget itself (or more) withdraws it. Anything else is
rejected with the reason. Clock-free: ``now`` (s) is passed in.
"""

from __future__ import annotations

import json
from typing import Any

import structlog

from powerbudgetd.channels.mqtt._text import finite_number, shown
from powerbudgetd.channels.mqtt.metrics import MqttMetrics
from powerbudgetd.core.arbiter import BudgetArbiter

log = structlog.get_logger("powerbudgetd")

SOURCE = "remote"  # its name at the budget arbiter


def parse_budget_command(payload: bytes) -> float:
    """A remote budget command: ``850``, ``850.5`` or ``{"budget_w": 850}`` (W).

    Raises ValueError with the reason.
    """
    try:
        value: Any = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ValueError(f"not a number of watts: {shown(payload)!r}") from None
    if isinstance(value, dict):
        if "budget_w" not in value:
            raise ValueError('expected a number of watts or {"budget_w": <watts>}')
        value = value["budget_w"]
    watts = finite_number(value)
    if watts is None:
        raise ValueError(f"not a number of watts: {shown(payload)!r}")
    return watts


class RemoteBudget:
    """Validates remote budget commands and offers the accepted ones to ``arbiter``."""

    def __init__(self, arbiter: BudgetArbiter, metrics: MqttMetrics, raise_interval_s: float = 0.0) -> None:
        self.arbiter = arbiter
        self.metrics = metrics
        self.raise_interval_s = raise_interval_s  # a raise at most this often; a cut at once
        self._last_raise_at = float("-inf")

    @property
    def budget_w(self) -> float | None:
        """The remote budget offered now (W); None: none (the configured one applies)."""
        offer = self.arbiter.offered(SOURCE)
        return None if offer is None else offer.budget_w

    def command(self, payload: bytes, now: float, floor_w: float | None) -> dict[str, Any]:
        """Validate and take one command; returns the response payload.

        ``floor_w``: the lowest budget the bank can be held to (W; None: the cards are
        not enumerated yet, and every command is refused). Accepted: a value in
        [floor, configured budget]; rejected: anything else, with the reason. A raise
        (above the budget wanted now) is taken at most every ``raise_interval_s``; a
        change is logged once, not per message.
        """
        configured_w = self.arbiter.configured_w
        response: dict[str, Any] = {"ok": False, "requested": shown(payload), "min_w": floor_w, "max_w": configured_w}
        try:
            watts = parse_budget_command(payload)
            if floor_w is None:
                raise ValueError("not ready: the cards are not enumerated yet")
            if watts < floor_w:
                raise ValueError(f"{watts:g} W is below the sum of the cards' minimum power limits ({floor_w:g} W)")
            if watts > configured_w:
                raise ValueError(
                    f"{watts:g} W is above the configured budget ({configured_w:g} W): "
                    "a remote budget may lower or restore it, never exceed it"
                )
        except ValueError as exc:
            self.metrics.remote.labels("rejected").inc()
            log.warning("remote_budget_rejected", requested=shown(payload), reason=str(exc))
            return {**response, "error": str(exc)}
        wanted_w = self.arbiter.resolve(now).wanted_w
        if watts > wanted_w:
            if now - self._last_raise_at < self.raise_interval_s:
                self.metrics.remote.labels("rate_limited").inc()
                wait_s = self.raise_interval_s - (now - self._last_raise_at)
                return {**response, "error": f"a raise is taken at most every {self.raise_interval_s:g} s: "
                        f"try again in {wait_s:.1f} s"}
            self._last_raise_at = now
        self.metrics.remote.labels("accepted").inc()
        before = self.budget_w
        if watts >= configured_w:
            self.arbiter.withdraw(SOURCE)
        else:
            self.arbiter.offer(SOURCE, watts, now)
        if self.budget_w != before:  # logged once per change, not per message
            log.info("remote_budget_accepted", budget_w=watts, was_w=before)
        decision = self.arbiter.resolve(now)
        return {**response, "ok": True, "budget_w": watts, "effective_budget_w": decision.wanted_w,
                "budget_source": decision.source}
