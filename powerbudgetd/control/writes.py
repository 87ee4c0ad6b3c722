"""What became of a tick's writes: each taken into its card's ledger, logged as an event.

A write that returned counts from the moment it was sent (until read back); one that
did not return in time may land whenever it returns (the card counts at its worst); one
NVML refused is never resent; any failure holds that card alone (it counts at its bound,
retried with backoff) while the others are fitted around it and keep lending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from powerbudgetd.control.actuator import Applied
from powerbudgetd.control.card import CardState
from powerbudgetd.errors import NvmlInvalidArgument, NvmlNoPermission
from powerbudgetd.core.units import to_w

log = structlog.get_logger("powerbudgetd")


@dataclass(frozen=True)
class WriteEvent:
    """One limit write as logged: W, reason, and the sum of bounds after it took effect."""

    index: int
    uuid: str
    from_w: float
    to_w: float
    reason: str
    sum_after_w: float
    error: str | None = None
    error_kind: str | None = None  # NvmlError.kind: no_permission, invalid_argument, ...
    dry_run: bool = False

    def fields(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "from_w": self.from_w, "to_w": self.to_w,
                "reason": self.reason, "sum_after_w": self.sum_after_w}


@dataclass(frozen=True)
class Recorded:
    """The tick's write events; whether one found we may not write (where the operator
    allows monitoring only: the controller then only watches)."""

    events: list[WriteEvent]
    no_permission: bool = False


def record(applied: Sequence[Applied], cards: Mapping[str, CardState], reasons: Mapping[str, str],
           sum_bound_mw: int, now: float, dry_run: bool = False, allow_monitor_only: bool = False) -> Recorded:
    """Take the actuator's results into the cards' ledgers (by UUID in ``cards``); the
    events carry the sum of bounds (from ``sum_bound_mw``, mW) once each write landed."""
    events = []
    no_permission = False
    running_mw = sum_bound_mw
    for a in applied:
        w, err, c = a.write, a.error, cards[a.write.uuid]
        if a.skipped and not dry_run:
            continue
        sent_at = now if a.sent_at is None else a.sent_at
        if dry_run:
            c.would_be_mw = w.to_mw
        elif a.done:
            c.ledger.record_write(w.to_mw, sent_at)
        elif a.overdue:  # it may land whenever the call returns
            c.ledger.record_overdue_write(w.to_mw, sent_at)
        if err is None:
            running_mw += w.to_mw - w.from_mw
        ev = WriteEvent(c.index, c.uuid, to_w(w.from_mw), to_w(w.to_mw), reasons.get(w.uuid, "lend"),
                        to_w(running_mw), None if err is None else str(err),
                        None if err is None else err.kind, dry_run)
        events.append(ev)
        if err is None:
            log.info("power_limit_would_set" if dry_run else "power_limit_set", **ev.fields())
            continue
        log.error("power_limit_write_failed", **ev.fields(), kind=err.kind, error=str(err))
        if isinstance(err, NvmlInvalidArgument):  # never resend the same refused value
            c.ledger.refuse(w.to_mw)
            c.hold(now, "write_refused", target_w=to_w(w.to_mw))
        elif a.overdue:
            c.hold(now, "write_overdue", target_w=to_w(w.to_mw), counted_w=to_w(c.bound_mw))
        elif isinstance(err, NvmlNoPermission) and allow_monitor_only:
            no_permission = True
        else:  # it did not take: counted at what it reads, the others fit around it
            c.hold(now, "write_failed", target_w=to_w(w.to_mw), counted_w=to_w(c.bound_mw))
    return Recorded(events, no_permission)
