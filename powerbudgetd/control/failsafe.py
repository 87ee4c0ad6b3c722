"""``powerbudgetd failsafe``: every card down to its share of the reserve budget, decreases only.

Run by systemd as ``ExecStopPost=`` after any exit of the daemon (stop, crash, kill by
the watchdog, restart limit reached): the cards are left at a share the circuit already
counts (the host's reserve), or at the fair share of the configured budget on a host
without a circuit. A card already at or below its share is not touched: the command
only lowers. Each write goes through the actuator and is confirmed by read-back.

Shares: the budget less what the cards it cannot write may have, split by
:func:`powerbudgetd.core.fairshare.fair_shares` within each writable card's constraints;
when the minimums do not fit, every card goes to its minimum (the lowest the bank can be
held to). A card it cannot write is reserved at its bound, by the functions the daemon
counts it with (:mod:`powerbudgetd.core.worstcase`): an excluded card or one with
invalid constraints at the higher of its limits where both read, else its worst case; a
card that cannot be enumerated or read (lost, failing, hung) at its worst case: the
largest limit known for it, else its ``[cards] max_w``, else the highest maximum limit
among the cards enumerated. A card whose write fails or is not confirmed is then
reserved at what it read, and the others are lowered again to fit.

Every NVML call goes through ``calls`` (in the command :class:`DeadlineCalls` of
CALL_TIMEOUT_S): a hung card costs one deadline, once, and the whole run stops starting
calls after ``deadline_s``, so it ends within ``deadline_s`` plus one call's deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from powerbudgetd.control.actuator import Actuator
from powerbudgetd.control.cardlimits import card_limits, override_for
from powerbudgetd.core.fairshare import fair_shares
from powerbudgetd.core.model import CardOverride
from powerbudgetd.core.plan import Write
from powerbudgetd.core.units import budget_mw, opt_mw, to_w
from powerbudgetd.core.worstcase import limit_bound_mw, worst_case_mw
from powerbudgetd.errors import NvmlError
from powerbudgetd.hw.calls import InlineCalls
from powerbudgetd.hw.card import CardBackend, GpuInfo, PowerReading
from powerbudgetd.core.units import to_mw

CALL_TIMEOUT_S = 2.0  # one NVML call (a healthy one takes milliseconds)
INIT_TIMEOUT_S = 5.0  # nvmlInit, before :func:`failsafe`
# The whole run, enumeration to the last read-back. With nvmlInit, one call past the
# deadline and nvmlShutdown (2 s): 19 s at most, inside the unit's TimeoutStopSec (30 s)
# with room for the interpreter's start and the circuit grant's give-back.
DEADLINE_S = 10.0
UNKNOWN_MW = 10**12  # a card with no limit known anywhere: more than any budget


@dataclass(frozen=True)
class Lowered:
    """One card: its limit before (W, the higher of requested and enforced), its share
    (W), and whether a decrease was written and read back in force. A card it could not
    write has ``error`` (why); one not enumerated or read (``reached`` False) has
    ``share_w`` what it is counted at (W; None: no maximum known anywhere). A card not
    ours to write (excluded, invalid constraints) has ``counted_w``, what it is reserved
    at (W), and no share."""

    index: int
    uuid: str
    before_w: float | None
    share_w: float | None
    written: bool
    confirmed: bool
    error: str | None = None
    reached: bool = True
    counted_w: float | None = None


@dataclass
class _Card:
    info: GpuInfo
    lo_mw: int
    hi_mw: int
    before_mw: int | None
    counted_mw: int  # its bound as read: what it is reserved at if it cannot be lowered


def _highest_w(r: PowerReading | None) -> float | None:
    known = [v for v in (r.requested_limit_w, r.enforced_limit_w) if v is not None] if r else []
    return max(known) if known else None


@dataclass
class _Survey:
    """The bank as found: the cards to lower, what every other card is reserved at (mW),
    and the result of each card already settled (by index)."""

    to_lower: list[_Card]
    reserved_mw: int
    settled: dict[int, Lowered]


def failsafe(
    nvml: CardBackend,
    budget_w: float,
    overrides: Mapping[str, CardOverride] | None = None,
    *,
    calls: InlineCalls | None = None,
    confirm_timeout_s: float = 5.0,
    deadline_s: float = DEADLINE_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Lowered]:
    """Lower every writable card above its share of ``budget_w`` (W) to it; NVML is
    initialised by the caller. Returns one :class:`Lowered` per card, in index order.
    Never raises for a card (its error is in the result); raises NvmlError only when
    NVML cannot even count the cards."""
    calls = calls or InlineCalls()
    end = clock() + deadline_s
    survey = _survey(nvml, calls, overrides or {})
    out, ctl, reserved_mw = survey.settled, survey.to_lower, survey.reserved_mw
    actuator = Actuator(nvml, calls=calls)
    while ctl:
        shares = fair_shares(budget_mw(budget_w) - reserved_mw, [c.lo_mw for c in ctl], [c.hi_mw for c in ctl])
        shares = shares or [c.lo_mw for c in ctl]  # the minimums do not fit: the lowest the bank can be held to
        failed = _lower(ctl, shares, actuator, calls, nvml, out, end, confirm_timeout_s, clock, sleep)
        if not failed:
            break
        # Reserved at its bound as read (a timed-out decrease may still land: lower).
        reserved_mw += sum(c.counted_mw for c in failed)
        ctl = [c for c in ctl if c not in failed]
        if clock() >= end:
            break
    return [out[i] for i in sorted(out)]


def _survey(nvml: CardBackend, calls: InlineCalls, overrides: Mapping[str, CardOverride]) -> _Survey:
    """Count the cards, look each up and read it; sort them into the cards to lower and
    the cards reserved at what they may hold."""
    count = calls.call("bank", nvml.device_count)
    found = calls.many({f"index {i}": (nvml.device, (i,)) for i in range(count)})
    infos = [v for v in found.values() if isinstance(v, GpuInfo)]
    reads = calls.many({i.uuid: (nvml.read, (i.uuid,)) for i in infos})
    bank_max_mw = max((to_mw(i.max_limit_w) for i in infos if i.max_limit_w), default=None)
    survey = _Survey([], 0, {})
    for i in range(count):
        info = found[f"index {i}"]
        uuid = info.uuid if isinstance(info, GpuInfo) else None
        ov = override_for(overrides, uuid, i, info.bus_id if isinstance(info, GpuInfo) else None)
        r = reads.get(uuid) if uuid else None
        if isinstance(info, GpuInfo) and isinstance(r, PowerReading):
            _read_card(survey, info, ov, r, bank_max_mw)
        else:
            _unreachable_card(survey, i, info, ov, r, bank_max_mw)
    return survey


def _read_card(survey: _Survey, info: GpuInfo, ov: CardOverride, r: PowerReading, bank_max_mw: int | None) -> None:
    """A card enumerated and read: to lower when it is ours to write, else reserved at its
    bound, as the daemon counts it."""
    lim = card_limits(info, ov, r, bank_max_mw)
    req, enf = opt_mw(r.requested_limit_w), opt_mw(r.enforced_limit_w)
    if not lim.controllable:
        counted = None if lim.worst_mw is None else limit_bound_mw(req, enf, lim.worst_mw)
        survey.reserved_mw += UNKNOWN_MW if counted is None else counted
        survey.settled[info.index] = Lowered(info.index, info.uuid, _highest_w(r), None, False, True,
                                             counted_w=None if counted is None else to_w(counted))
        return
    before = _highest_w(r)
    survey.to_lower.append(_Card(info, lim.min_mw, lim.max_mw, None if before is None else to_mw(before),
                                 limit_bound_mw(req, enf, lim.worst_mw or 0)))


def _unreachable_card(survey: _Survey, index: int, info: GpuInfo | NvmlError | object, ov: CardOverride,
                      r: PowerReading | NvmlError | object, bank_max_mw: int | None) -> None:
    """A card not enumerated, or unreadable: reserved at its worst case (nothing known
    anywhere: more than any budget, so the others go to their minimum)."""
    stated = (opt_mw(info.max_limit_w), opt_mw(info.default_limit_w)) if isinstance(info, GpuInfo) else ()
    worst = worst_case_mw(stated, opt_mw(ov.max_w), bank_max_mw)
    error = str(info if isinstance(info, NvmlError) else r)
    if worst_case_mw(stated, opt_mw(ov.max_w)) is None:
        error += "; its limits unknown: counted at the largest maximum limit here"
    uuid = info.uuid if isinstance(info, GpuInfo) else ""
    survey.settled[index] = Lowered(index, uuid, None, None if worst is None else to_w(worst), False, False, error,
                                    reached=False)
    survey.reserved_mw += UNKNOWN_MW if worst is None else worst


def _lower(ctl: list[_Card], shares: list[int], actuator: Actuator, calls: InlineCalls, nvml: CardBackend,
           out: dict[int, Lowered], end: float, confirm_timeout_s: float,
           clock: Callable[[], float], sleep: Callable[[float], None]) -> list[_Card]:
    """One round: each card above its share lowered to it and read back; the cards that
    failed (their :class:`Lowered` says why)."""
    failed: list[_Card] = []
    pending: list[tuple[_Card, int]] = []
    for c, share_mw in zip(ctl, shares):
        i, before_w = c.info.index, None if c.before_mw is None else to_w(c.before_mw)
        if c.before_mw is not None and c.before_mw <= share_mw:
            out[i] = Lowered(i, c.info.uuid, before_w, to_w(share_mw), False, True)
            continue
        if clock() >= end:
            out[i] = Lowered(i, c.info.uuid, before_w, to_w(share_mw), False, False, "failsafe deadline passed")
            failed.append(c)
            continue
        applied = actuator.lower([Write(c.info.uuid, c.before_mw or c.hi_mw, share_mw)])[0]
        error = None if applied.error is None else f"write failed: {applied.error}"
        out[i] = Lowered(i, c.info.uuid, before_w, to_w(share_mw), applied.done, False, error)
        if applied.done:
            pending.append((c, share_mw))
        else:
            failed.append(c)
    confirm_end = min(end, clock() + confirm_timeout_s)
    while pending:
        still = []
        for c, share_mw in pending:
            if clock() >= confirm_end:  # no read started past the deadline
                still.append((c, share_mw))
                continue
            try:
                highest = _highest_w(calls.call(c.info.uuid, nvml.read, c.info.uuid))
            except NvmlError:
                highest = None
            if highest is not None and to_mw(highest) <= share_mw:
                out[c.info.index] = replace(out[c.info.index], confirmed=True)
            else:
                still.append((c, share_mw))
        pending = still
        if pending and clock() >= confirm_end:
            for c, _ in pending:
                out[c.info.index] = replace(out[c.info.index], error="not read back at its share in time")
                failed.append(c)
            break
        if pending:
            sleep(0.05)
    return failed
