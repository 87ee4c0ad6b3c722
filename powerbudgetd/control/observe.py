"""One card's read, every tick, taken into its ledger and audit.

Every read is an audit, not only those after our own writes: an unreadable card counts
at the highest limit it may have; a readable one has its power readings checked
(impossible, frozen), its limits taken into the ledger (which confirms our writes by
read-back) and its limit checked for drift. A write that was not confirmed in time
holds the card.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from powerbudgetd.control.card import CardState
from powerbudgetd.core.model import Role
from powerbudgetd.core.units import opt_mw, opt_w, to_w
from powerbudgetd.errors import NvmlError, NvmlTimeout
from powerbudgetd.hw.nvml import PowerReading

log = structlog.get_logger("powerbudgetd")

OUTSIDE_CAP_CHECK_S = 300.0  # a card capped from outside is offered its share again this often


def observe(c: CardState, r: PowerReading | NvmlError, now: float,
            energy_j: Callable[[str], float | None]) -> str | None:
    """Take one read of ``c`` (or the error reading it) into its ledger and audit;
    ``energy_j(uuid)`` reads a card's energy counter (J), asked only while a reading
    looks frozen. Returns a fault description the first time the card cannot be read, else None.

    A read that timed out is a slow card, not a lost one: for ``confirm_timeout_s`` (the
    longest a write of ours is waited for) from the first in a row, it keeps its bound
    (what may be in force: its limits last read, every write that may still land), its
    role and its last reading, and is no fault; only past that is it unreadable."""
    if isinstance(r, NvmlTimeout) and c.readable and (
            c.slow_since is None or now - c.slow_since < c.ledger.timings.confirm_timeout_s):
        c.read_errors[r.kind] = c.read_errors.get(r.kind, 0) + 1
        c.slow_since = now if c.slow_since is None else c.slow_since
        return None
    if isinstance(r, NvmlError):
        c.read_errors[r.kind] = c.read_errors.get(r.kind, 0) + 1
        first = c.error is None
        c.error, c.reading = f"{r.kind}: {r}", None
        c.audit.lost()
        if c.controllable:
            c.role = Role.LOST
        c.ledger.observe_unknown(now)  # counted at the highest limit it may have or come back with
        if not first:
            return None  # one fault per episode: a card gone for good does not stop lending forever
        log.warning("card_unreadable", index=c.index, uuid=c.uuid, error=c.error, counted_w=to_w(c.bound_mw),
                    unanswered_s=None if c.slow_since is None else round(now - c.slow_since, 3))
        return f"GPU {c.index} unreadable ({r.kind})"
    slow_since, c.slow_since = c.slow_since, None
    if c.error is not None:
        log.info("card_readable_again", index=c.index, uuid=c.uuid, was=c.error,
                 unanswered_s=None if slow_since is None else round(now - slow_since, 3))
        c.error = None
        c.role = Role.FAIR if c.controllable else Role.FIXED
        if c.controllable:
            c.ledger.appeared(now)  # whatever it came back with is not ours until a write confirms
    r = c.audit.check_power(now, r, c.ledger.worst_mw, c.index, c.uuid)
    c.reading = r = c.audit.check_frozen(now, r, energy_j, c.index, c.uuid)
    confirmed = c.ledger.observe(now, opt_mw(r.requested_limit_w), opt_mw(r.enforced_limit_w))
    if confirmed is not None:
        c.audit.confirmed(confirmed)
        if c.ledger.release():
            log.info("card_controllable_again", index=c.index, uuid=c.uuid)
    c.audit.audit(c.ledger, r, c.target_mw, now, c.index, c.uuid)
    if c.controllable:
        outside_cap(c, now)
    return None


def outside_cap(c: CardState, now: float) -> None:
    """Follow an outside limiter holding ``c``'s enforced limit below its requested one
    (with nothing of ours in flight and no other tool's raise landing: ``settle_s`` has
    shown it): the card is planned at that cap (given what it can use, the rest lent).
    Said once per episode. Every ``OUTSIDE_CAP_CHECK_S`` it is offered its share again:
    a cap still there shows within ``settle_s``; one lifted ends the episode."""
    led = c.ledger
    if led.held_below and not led.busy and led.enforced_mw is not None:
        if c.outside_cap_seen_mw is None:
            log.warning("limit_capped_outside", index=c.index, uuid=c.uuid, requested_w=opt_w(led.requested_mw),
                        enforced_w=to_w(led.enforced_mw), check_every_s=OUTSIDE_CAP_CHECK_S,
                        action="held below its request by another limiter (a BMC, a node cap): given what it "
                        "can use, the rest lent to the other cards")
        c.outside_cap_mw = c.outside_cap_seen_mw = led.enforced_mw
        c.outside_cap_at = now
    elif c.outside_cap_mw is not None and now - c.outside_cap_at >= OUTSIDE_CAP_CHECK_S:
        c.outside_cap_mw = None  # offered its share again: is the cap still there?
    elif (c.outside_cap_mw is None and c.outside_cap_seen_mw is not None and not led.busy
          and led.enforced_mw is not None and led.enforced_mw > c.outside_cap_seen_mw):
        log.info("limit_cap_outside_lifted", index=c.index, uuid=c.uuid, was_w=to_w(c.outside_cap_seen_mw),
                 enforced_w=to_w(led.enforced_mw))
        c.outside_cap_seen_mw = None


def expire(c: CardState, now: float) -> str | None:
    """Hold ``c`` when its last write did not take (see CardLedger.expire); returns the
    fault description, else None."""
    last = c.ledger.expire(now) if c.readable else None
    if not last:
        return None
    c.hold(now, "write_unconfirmed", target_w=to_w(last[0]),
           requested_w=opt_w(c.requested_mw), enforced_w=opt_w(c.enforced_mw))
    return f"GPU {c.index} write of {to_w(last[0]):g} W unconfirmed"
