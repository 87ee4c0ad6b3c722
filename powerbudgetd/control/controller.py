"""The controller: observe every card, decide targets, plan and apply the writes.

Synchronous and clock-free: the caller (the daemon, or ``simulate`` on virtual time)
passes ``now`` in seconds. One :meth:`Controller.tick` reads every card (an audit, not
only after our own writes); each card's ledger (:mod:`powerbudgetd.control.ledger`)
keeps its *bound* — the highest limit that may be in force: requested, enforced or
written and not yet confirmed, and the card's worst case wherever any of it is unknown —
and increases are only ever planned into ``budget - sum(bounds)``. So at every instant

    sum over cards of the highest limit that may be in force <= budget

once boot has brought the bank under the budget (before that, nothing is raised), and
whatever else puts the bank over it (a limit held elsewhere, a card that appears at its
default, a write that did not take) is corrected the next tick, by decreases only.

The cards are re-enumerated every ``enumerate_s`` and after any lookup error; every card
is keyed by UUID. NVML calls go through ``calls`` (:mod:`powerbudgetd.hw.calls`): in the
daemon each with a deadline in a worker thread, so a hung call costs one card its
control (it counts at its worst case), never the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from powerbudgetd.core.units import budget_mw, opt_mw, opt_w, to_mw
from powerbudgetd.control.actuator import Actuator
from powerbudgetd.control.audit import CardAudit
from powerbudgetd.control.card import CardState
from powerbudgetd.control.ledger import CardLedger
from powerbudgetd.control.overbudget import OverBudget
from powerbudgetd.core.fairshare import fair_shares
from powerbudgetd.core.model import CardOverride, Mode, Role, Timings
from powerbudgetd.core.plan import Step, Write, plan_writes
from powerbudgetd.core.policy import CardView, LendingPolicy
from powerbudgetd.core.snapshot import BankSnapshot, CardSnapshot
from powerbudgetd.errors import BudgetInfeasible, CardLimitUnknown, NvmlError, NvmlInvalidArgument, NvmlNoPermission
from powerbudgetd.hw.calls import InlineCalls
from powerbudgetd.hw.nvml import GpuInfo, Nvml, PowerReading

__all__ = ["CardState", "Controller", "TickReport", "WriteEvent"]

log = structlog.get_logger("powerbudgetd")

START_TIMEOUT_S = 30.0  # enumeration at start (outside the loop) may be slow while a driver wakes
MODE_REASON = {Mode.BOOTING: "boot", Mode.FAILSAFE: "fail_static", Mode.STOPPING: "shutdown"}


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


class Controller:
    """Keeps one bank's summed power limits under ``budget_w``.

    Call :meth:`start` once (enumerates cards, checks feasibility and write permission),
    then :meth:`tick` every ``timings.tick_s``. :attr:`ready` turns true once every
    card's boot limit is read back as enforced. :meth:`request_stop` returns the bank to
    fair share; then :attr:`stopped` turns true.

    Faults never raise out of :meth:`tick`: a card that cannot be read counts at the
    highest limit it may have; a write that does not take holds that card (retried with
    backoff); a fault returns the bank to fair share for ``failsafe_hold_s``; a limit
    someone else keeps changing marks the card contested and stops every increase.
    ``clock`` (s, the daemon's) stamps each write when it is sent; without it, ``now``.
    """

    def __init__(
        self,
        nvml: Nvml,
        budget_w: float,
        timings: Timings | None = None,
        *,
        dry_run: bool = False,
        overrides: Mapping[str, CardOverride] | None = None,
        allow_monitor_only: bool = False,
        calls: InlineCalls | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.nvml = nvml
        self.budget_mw = budget_mw(budget_w)  # rounded down: toward safety
        self.timings = timings or Timings()
        self.dry_run = dry_run
        self.allow_monitor_only = allow_monitor_only
        self.monitor_only = False
        self.overrides = dict(overrides or {})
        self.calls = calls or InlineCalls()
        self.clock = clock
        self.actuator = Actuator(nvml, dry_run=dry_run, calls=self.calls, clock=clock)
        self.policy = LendingPolicy(self.timings)
        self.over = OverBudget()
        self.cards: list[CardState] = []
        self.ready = self.stopping = self.stopped = False
        self.mode = Mode.DRY_RUN if dry_run else Mode.BOOTING
        self._failsafe_until = float("-inf")
        self._budget_reason: str | None = None  # the reason for the next tick's writes
        self._next_enumerate = float("-inf")
        self._count = -1  # NVML's device count at the last enumeration
        self._over = False  # the sum of bounds read this tick is above the budget
        self.override_warnings: list[str] = []  # [cards] settings that do nothing (see start)

    # -- start ----------------------------------------------------------------------
    def start(self) -> list[CardState]:
        """Enumerate the cards and check the budget can be met and limits written.

        Raises CardLimitUnknown naming each card whose limits cannot be read and has no
        ``[cards]`` max_w; BudgetInfeasible with the numbers when the minimum limits (and
        fixed cards) sum above the budget; NvmlNoPermission when limits cannot be
        written (unless ``allow_monitor_only``: then the controller only watches).
        """
        found = self.calls.call("bank", self.nvml.devices, timeout_s=START_TIMEOUT_S)
        self.cards = [self._card(info) for info in found]
        if not self.cards:
            raise BudgetInfeasible("no GPUs found: nothing to keep under a budget")
        self.override_warnings = self._check_overrides()
        unknown = [c for c in self.cards if c.ledger.worst_mw <= 0]
        if unknown:
            raise CardLimitUnknown("; ".join(
                f"GPU {c.index} ({c.uuid}, {c.info.name}): NVML gives none of its limit constraints, default, "
                f"requested or enforced limit, so it cannot be counted at its worst case. Set [cards.\"{c.uuid}\"] "
                "max_w to the highest limit it may have" for c in unknown))
        self._check_feasible()
        if not self.dry_run:
            self._check_permission()
        return self.cards

    def _check_overrides(self) -> list[str]:
        """``[cards]`` settings that do not do what they say: a key naming no card (a
        typo in a UUID, an index past the last card) and a ``max_w`` below the card's
        floor (the floor wins). Each logged as a warning and returned for check-config."""
        keys = {c.uuid for c in self.cards} | {str(c.index) for c in self.cards}
        out = [f"[cards.\"{k}\"] matches no card (UUIDs and indices here: "
               f"{', '.join(sorted(keys))}): its settings do nothing" for k in sorted(self.overrides) if k not in keys]
        for c in self.cards:
            ov = self.overrides.get(c.uuid) or self.overrides.get(str(c.index))
            if ov is not None and ov.max_w is not None and c.controllable and to_mw(ov.max_w) < c.min_mw:
                out.append(f"[cards] max_w {ov.max_w:g} W for GPU {c.index} is below its minimum limit "
                           f"{c.min_mw / 1000:g} W: the card is held at {c.min_mw / 1000:g} W at most")
        for text in out:
            log.warning("card_override_ignored", detail=text)
        return out

    def _card(self, info: GpuInfo) -> CardState:
        ov = self.overrides.get(info.uuid) or self.overrides.get(str(info.index)) or CardOverride()
        lo, hi = info.min_limit_w, info.max_limit_w
        valid = lo is not None and hi is not None and 0 < lo <= hi
        if lo is not None and hi is not None and not valid:
            log.error("invalid_constraints", index=info.index, uuid=info.uuid, min_w=lo, max_w=hi,
                      action="card left alone and counted at its enforced limit")
        r = self._read(info.uuid)
        known = [v for v in (hi, info.default_limit_w) + ((r.requested_limit_w, r.enforced_limit_w) if r else ())
                 if v is not None]
        # The worst case: the largest limit read or stated, else the operator's max.
        worst = to_mw(max(known)) if known else to_mw(ov.max_w) if ov.max_w is not None else 0
        min_mw = to_mw(lo) if valid else 0  # type: ignore[arg-type]
        max_mw = worst if ov.max_w is None else max(min_mw, min(worst, int(ov.max_w * 1000)))
        controllable = not ov.exclude and valid
        return CardState(info, controllable, min_mw, max_mw, CardLedger(self.timings, worst),
                         CardAudit(self.timings), ov.priority, role=Role.FAIR if controllable else Role.FIXED,
                         excluded=ov.exclude)

    def _check_permission(self) -> None:
        """Write one card's current limit back to itself (a no-op, through the actuator)
        to learn, before anything else, whether limits can be written at all."""
        for c in self.cards:
            reading = self._read(c.uuid) if c.controllable else None
            if reading is None or reading.requested_limit_w is None:
                continue
            try:
                self.actuator.probe(c.uuid, reading.requested_limit_w)
            except NvmlNoPermission:
                if not self.allow_monitor_only:
                    raise
                self._monitor_only()
            except NvmlError:
                pass  # anything else shows up, and is handled, on the first tick
            return

    def _monitor_only(self) -> None:
        self.monitor_only = True
        log.error("monitor_only", error="writing power limits needs root or CAP_SYS_ADMIN",
                  action="watching only: the budget is NOT enforced (allow_monitor_only = true)")

    def _check_feasible(self) -> None:
        ctl = [c for c in self.cards if c.controllable]
        fixed_mw = 0
        for c in self.cards:
            if not c.controllable:
                r = self._read(c.uuid)
                known = [v for v in ((r.enforced_limit_w, r.requested_limit_w) if r else ()) if v is not None]
                fixed_mw += to_mw(max(known)) if len(known) == 2 else c.ledger.worst_mw
        floor_mw = sum(c.min_mw for c in ctl) + fixed_mw
        if floor_mw > self.budget_mw:
            share = (self.budget_mw - fixed_mw) / max(len(ctl), 1) / 1000.0
            detail = "; ".join(f"GPU {c.index} ({c.info.name}) floor {c.min_mw / 1000:g} W vs share {share:g} W" for c in ctl)
            raise BudgetInfeasible(
                f"budget {self.budget_mw / 1000:g} W is below what the cards can be held to: "
                f"minimum limits sum to {sum(c.min_mw for c in ctl) / 1000:g} W"
                + (f" plus {fixed_mw / 1000:g} W on cards we cannot control = {floor_mw / 1000:g} W" if fixed_mw else "")
                + f". {detail}"
            )

    def set_budget(self, budget_w: float, reason: str | None = None) -> None:
        """Change the budget. A lower one is acted on at the next tick, decreases first;
        raises BudgetInfeasible (keeping the old budget) when the minimums do not fit.
        ``reason`` (such as ``"reload"``) labels the writes of the next tick."""
        old = self.budget_mw
        self.budget_mw = budget_mw(budget_w)
        try:
            self._check_feasible()
        except BudgetInfeasible:
            self.budget_mw = old
            raise
        self._budget_reason = reason

    def request_stop(self) -> None:
        """Return every card to fair share (decreases first); :attr:`stopped` follows."""
        self.stopping = True

    # -- one tick -------------------------------------------------------------------
    def tick(self, now: float) -> TickReport:
        self._enumerate(now)
        faults = self._observe_all(now) + self._expire(now)
        self._over = self.sum_bound_mw > self.budget_mw
        if faults and not self.dry_run:
            self._failsafe_until = now + self.timings.failsafe_hold_s
        mode = self._mode(now)
        shown = Mode.DRY_RUN if self.dry_run else Mode.MONITOR if self.monitor_only else mode
        if shown != self.mode:
            log.info("mode_changed", old=str(self.mode), new=str(shown), faults=faults or None)
            self.mode = shown
        if self.monitor_only:
            self.ready, self.stopped = True, self.stopping
            return self._report(now, [], faults)

        targets, reasons = self._targets(now, mode)
        if self._budget_reason is not None and mode != Mode.STOPPING:
            reasons = dict.fromkeys(reasons, self._budget_reason)
        self._budget_reason = None
        active = [c for c in self.cards if self._active(c, now)]
        for c in active:
            c.target_mw = targets[c.uuid] = c.ledger.avoid_refused(targets[c.uuid], c.min_mw)
            if targets[c.uuid] in c.refused and targets[c.uuid] < c.bound_mw:
                # It cannot be lowered to what it was counted at (NVML refused that value,
                # and every one below): held, it counts at its bound from the next tick and
                # the others are fitted around it, instead of lending watts it still holds.
                self._hold(c, now, "write_refused", target_w=targets[c.uuid] / 1000, counted_w=c.bound_mw / 1000)
        # A new card is written even at its target: only a confirmed write of ours ends it.
        steps = [Step(c.uuid, c.bound_mw, targets[c.uuid], c.requested_mw, c.priority, busy=c.ledger.busy,
                      force=c.ledger.new) for c in active if targets[c.uuid] not in c.refused]
        planned = {st.uuid for st in steps}
        outside_mw = sum(c.bound_mw for c in self.cards if c.uuid not in planned)  # fixed, lost, held
        hold_raises = any(c.contested(now) for c in self.cards) or any(c.ledger.new for c in active)
        events = self._apply(plan_writes(steps, self.budget_mw - outside_mw, allow_increases=not hold_raises),
                             reasons, now)
        self.over.track(now, self, mode)

        # Ready only when provably within budget: every card we control confirmed at its
        # boot limit, and the sum of bounds (cards we cannot lower counted at theirs) fits.
        if (mode == Mode.BOOTING and self.sum_bound_mw <= self.budget_mw
                and all(c.ledger.confirmed(now) and c.bound_mw == c.target_mw for c in active)):
            self.ready = True
            log.info("ready", budget_w=self.budget_mw / 1000, sum_limits_w=self.sum_bound_mw / 1000,
                     degraded=self.degraded() or None)
        if mode == Mode.STOPPING and all(c.ledger.confirmed(now) and c.bound_mw <= (c.share_mw or 0) for c in active):
            self.stopped = True
        return self._report(now, events, faults)

    def _report(self, now: float, events: list[WriteEvent], faults: list[str]) -> TickReport:
        return TickReport(now, self.mode, self.ready, self.budget_mw / 1000, self.sum_bound_mw / 1000,
                          tuple(events), tuple(faults), bank_snapshot(self, now))

    @property
    def sum_bound_mw(self) -> int:
        return sum(c.bound_mw for c in self.cards)

    def degraded(self) -> list[str]:
        """Why the bank is not fully under control, one phrase per card (empty: it is)."""
        return [f"GPU {c.index} {why}" for c in self.cards if (why := self.over.why(c))]

    def _mode(self, now: float) -> Mode:
        if self.stopping:
            return Mode.STOPPING
        if not self.ready:
            return Mode.BOOTING
        if now < self._failsafe_until or any(c.contested(now) for c in self.cards):
            return Mode.FAILSAFE
        return Mode.DYNAMIC

    def _active(self, c: CardState, now: float) -> bool:
        """Controlled right now: controllable, readable, not held after a failed write, and
        not held above its requested limit by an outside floor (writing cannot lower it).
        Over budget, a card whose enforced limit is above its requested one (our decrease
        still biting, or a floor that came in under it) is counted where it is, so the
        others are lowered around it this tick instead of once the write settles."""
        return (c.controllable and c.readable and not c.ledger.held(now) and not c.ledger.held_above
                and not (self._over and c.ledger.above_requested))

    # -- observe --------------------------------------------------------------------
    def _read(self, uuid: str) -> PowerReading | None:
        try:
            return self.calls.call(uuid, self.nvml.read, uuid)
        except NvmlError:
            return None

    def _energy_j(self, uuid: str) -> float | None:
        try:
            return self.calls.call(uuid, self.nvml.energy_j, uuid)
        except NvmlError:
            return None

    def _enumerate(self, now: float) -> None:
        """Follow NVML's device set: every ``enumerate_s``, after a lookup error, and at
        once when the device count (read every tick, microseconds) changes."""
        if now < self._next_enumerate:
            try:
                count = self.calls.call("bank", self.nvml.device_count)
            except NvmlError:
                count = -1
            if count == self._count:
                return
        self._next_enumerate = now + self.timings.enumerate_s
        try:
            self._count = self.calls.call("bank", self.nvml.device_count)
        except NvmlError:
            self._count = -1
        try:
            found = self.calls.call("bank", self.nvml.devices, True)
        except NvmlError as exc:
            log.warning("enumeration_failed", error=str(exc), retry_in_s=self.timings.enumerate_s)
            return
        by_id = {c.uuid: c for c in self.cards}
        for info in found:
            c = by_id.get(info.uuid)
            if c is None:
                c = self._card(info)
                self.cards.append(c)
                log.warning("card_appeared", index=info.index, uuid=info.uuid, name=info.name,
                            counted_w=c.ledger.worst_mw / 1000, controllable=c.controllable,
                            action="counted at its maximum and capped before anything else is raised")
            elif c.gone:
                log.warning("card_returned", index=info.index, uuid=info.uuid, counted_w=c.ledger.worst_mw / 1000)
            elif c.info.index != info.index:
                log.info("card_reindexed", uuid=info.uuid, old_index=c.info.index, new_index=info.index)
            if (c.gone or c.uuid not in by_id) and c.controllable:
                c.ledger.appeared()
            if not c.controllable and info.min_limit_w is None:  # keep constraints once read
                info = GpuInfo(info.index, info.uuid, info.name, c.info.min_limit_w, c.info.max_limit_w,
                               c.info.default_limit_w, info.mig_mode)
            c.info, c.gone = info, False
        present = {i.uuid for i in found}
        for c in self.cards:
            if c.uuid not in present and not c.gone:
                c.gone = True
                log.error("card_gone", index=c.index, uuid=c.uuid, reserved_w=c.bound_mw / 1000,
                          action="reserved at its bound until it returns; the others keep lending")

    def _observe_all(self, now: float) -> list[str]:
        results = self.calls.many({c.uuid: (self.nvml.read, (c.uuid,)) for c in self.cards})
        return [f for c in self.cards if (f := self._observe(c, results[c.uuid], now))]

    def _observe(self, c: CardState, r: PowerReading | NvmlError, now: float) -> str | None:
        """Take one read of a card (an audit, every tick) into its ledger. Returns a fault
        description the first time the card cannot be read, else None."""
        if isinstance(r, NvmlError):
            c.read_errors[r.kind] = c.read_errors.get(r.kind, 0) + 1
            first = c.error is None
            c.error, c.reading = f"{r.kind}: {r}", None
            c.audit.lost()
            if c.controllable:
                c.role = Role.LOST
            c.ledger.observe_unknown()  # counted at the highest limit it may have or come back with
            self._next_enumerate = min(self._next_enumerate, now)  # a lookup error: look again
            if not first:
                return None  # one fault per episode: a card gone for good does not stop lending forever
            log.warning("card_unreadable", index=c.index, uuid=c.uuid, error=c.error, counted_w=c.bound_mw / 1000)
            return f"GPU {c.index} unreadable ({r.kind})"
        if c.error is not None:
            log.info("card_readable_again", index=c.index, uuid=c.uuid, was=c.error)
            c.error = None
            c.role = Role.FAIR if c.controllable else Role.FIXED
            if c.controllable:
                c.ledger.appeared()  # whatever it came back with is not ours until a write confirms
        r = c.audit.check_power(r, c.ledger.worst_mw, c.index, c.uuid)
        c.reading = r = c.audit.check_frozen(now, r, lambda: self._energy_j(c.uuid), c.index, c.uuid)
        confirmed = c.ledger.observe(now, opt_mw(r.requested_limit_w), opt_mw(r.enforced_limit_w))
        if confirmed is not None:
            c.audit.confirmed(confirmed)
            if c.ledger.release():
                log.info("card_controllable_again", index=c.index, uuid=c.uuid)
        c.audit.audit(c.ledger, r, c.target_mw, now, c.index, c.uuid)
        return None

    def _expire(self, now: float) -> list[str]:
        out = []
        for c in self.cards:
            last = c.ledger.expire(now) if c.readable else None
            if last:
                out.append(f"GPU {c.index} write of {last[0] / 1000:g} W unconfirmed")
                self._hold(c, now, "write_unconfirmed", target_w=last[0] / 1000,
                           requested_w=opt_w(c.requested_mw), enforced_w=opt_w(c.enforced_mw))
        return out

    def _hold(self, c: CardState, now: float, event: str, **fields: object) -> None:
        """Leave a card alone for a doubling backoff after a write that did not take; it
        counts at its bound. Logged when the card stops being controllable only."""
        if c.ledger.hold(now):
            log.error(event, index=c.index, uuid=c.uuid, **fields,
                      action="card counted at its read-back limit and retried with backoff")
        c.role = Role.FIXED

    # -- decide ---------------------------------------------------------------------
    def _targets(self, now: float, mode: Mode) -> tuple[dict[str, int], dict[str, str]]:
        active = [c for c in self.cards if self._active(c, now)]
        for c in self.cards:
            if c.readable and c not in active:
                c.role = Role.FIXED
        pool = self.budget_mw - sum(c.bound_mw for c in self.cards if c not in active)
        shares = fair_shares(pool, [c.min_mw for c in active], [c.max_mw for c in active])
        self.over.infeasible(pool, active, shares is None)
        for c, share in zip(active, shares or [c.min_mw for c in active]):
            c.share_mw = share
        drift = {c.uuid: "drift" for c in active if c.requested_mw != c.expected_mw and c.audit.drifted_at(now)}
        # Held below its requested limit from outside: it cannot use what it is counted at.
        outside = {c.uuid for c in active if c.ledger.held_below and not c.ledger.busy}
        if mode != Mode.DYNAMIC:
            self.policy.reset()
            for c in active:
                c.role = Role.FAIR
            reason = MODE_REASON[mode]
            return {c.uuid: c.share_mw for c in active}, {c.uuid: drift.get(c.uuid, reason) for c in active}  # type: ignore[misc]
        views = [CardView(c.uuid, c.share_mw, c.min_mw, c.max_mw,  # type: ignore[arg-type]
                          c.bound_mw if self.dry_run or c.enforced_mw is None else c.enforced_mw,
                          None if c.uuid in outside else opt_mw(c.reading.power_avg_w if c.reading else None),
                          None if c.uuid in outside else opt_mw(c.reading.power_instant_w if c.reading else None),
                          c.priority) for c in active]
        decided = self.policy.decide(now, views, pool)
        tick_reason = next((r for r in ("reclaim", "release", "lend") if any(t.reason == r for t in decided.values())), "lend")
        for c in active:
            c.role = decided[c.uuid].role
        return ({u: t.limit_mw for u, t in decided.items()},
                {u: drift.get(u) or ("outside_limit" if u in outside and t.reason else t.reason) or tick_reason
                 for u, t in decided.items()})

    # -- act ------------------------------------------------------------------------
    def _apply(self, writes: list[Write], reasons: dict[str, str], now: float) -> list[WriteEvent]:
        by_id = {c.uuid: c for c in self.cards}
        events = []
        running_mw = self.sum_bound_mw  # the sum once this tick's writes so far have landed
        for applied in self.actuator.apply(writes):
            w, err, c = applied.write, applied.error, by_id[applied.write.uuid]
            if applied.skipped and not self.dry_run:
                continue
            sent_at = now if applied.sent_at is None else applied.sent_at
            if self.dry_run:
                c.bound_mw = c.shadow_mw = w.to_mw
            elif applied.done:
                c.ledger.record_write(w.to_mw, sent_at)
            elif applied.overdue:  # it may land whenever the call returns
                c.ledger.record_overdue_write(w.to_mw, sent_at)
            if err is None:
                running_mw += w.to_mw - w.from_mw
            ev = WriteEvent(c.index, c.uuid, w.from_mw / 1000, w.to_mw / 1000, reasons.get(w.uuid, "lend"),
                            running_mw / 1000, None if err is None else str(err),
                            None if err is None else err.kind, self.dry_run)
            events.append(ev)
            if err is None:
                log.info("power_limit_would_set" if self.dry_run else "power_limit_set", **_event_fields(ev))
                continue
            self._failsafe_until = now + self.timings.failsafe_hold_s
            log.error("power_limit_write_failed", **_event_fields(ev), kind=err.kind, error=str(err))
            if isinstance(err, NvmlInvalidArgument):  # never resend the same refused value
                c.ledger.refuse(w.to_mw)
                self._hold(c, now, "write_refused", target_w=w.to_mw / 1000)
            elif applied.overdue:
                self._hold(c, now, "write_overdue", target_w=w.to_mw / 1000, counted_w=c.bound_mw / 1000)
            elif isinstance(err, NvmlNoPermission) and self.allow_monitor_only:
                self._monitor_only()
            else:  # it did not take: counted at what it reads, the others fit around it
                self._hold(c, now, "write_failed", target_w=w.to_mw / 1000, counted_w=c.bound_mw / 1000)
        return events


def bank_snapshot(ctl: Controller, now: float) -> BankSnapshot:
    """The bank in W from the controller's card states at ``now``: the one place the
    side channels' view is computed. An unreadable card's limits and draw are None."""
    cards = []
    for c in ctl.cards:
        r = c.reading if c.readable else None  # an unreadable card's last values are stale
        info = c.info
        cards.append(CardSnapshot(
            index=c.index, uuid=c.uuid, name=info.name, role=str(c.role), controllable=c.controllable,
            readable=c.readable,
            requested_limit_w=None if r is None else opt_w(c.requested_mw),
            enforced_limit_w=None if r is None else opt_w(c.enforced_mw),
            limit_bound_w=c.bound_mw / 1000,
            min_limit_w=None if info.min_limit_w is None else c.min_mw / 1000,
            max_limit_w=None if info.max_limit_w is None else c.max_mw / 1000,
            hw_min_limit_w=info.min_limit_w, hw_max_limit_w=info.max_limit_w,
            power_avg_w=None if r is None else r.power_avg_w,
            power_instant_w=None if r is None else r.power_instant_w,
            error=c.error, contested_w=c.contested_w if c.contested(now) else None,
            excursions=c.excursions, peak_excursion_w=c.peak_excursion_w,
            read_errors=tuple(sorted(c.read_errors.items())), readings_rejected=c.audit.readings_rejected,
            mig_mode=info.mig_mode,
        ))
    floor_mw = sum(c.min_mw if c.controllable else c.bound_mw for c in ctl.cards)
    return BankSnapshot(
        now=now, mode=str(ctl.mode), ready=ctl.ready, budget_w=ctl.budget_mw / 1000,
        sum_limit_bound_w=ctl.sum_bound_mw / 1000, floor_w=floor_mw / 1000, cards=tuple(cards),
        over_budget=ctl.over.active, over_budget_cause=ctl.over.cause or None,
        over_budget_episodes=ctl.over.episodes, over_budget_s=round(ctl.over.seconds, 3),
    )


def _event_fields(ev: WriteEvent) -> dict:
    return {"index": ev.index, "uuid": ev.uuid, "from_w": ev.from_w, "to_w": ev.to_w,
            "reason": ev.reason, "sum_after_w": ev.sum_after_w}
