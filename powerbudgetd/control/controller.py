"""The controller: observe every card, decide targets, plan and apply the writes.

Synchronous and clock-free: the caller (the daemon, or ``simulate`` on virtual time)
passes ``now`` in seconds. One :meth:`Controller.tick` reads every card (an audit, not
only after our own writes), keeps for each card a *bound* — the highest limit that may
be in force: requested, enforced or written and not yet confirmed — and only ever plans
increases that fit in ``budget - sum(bounds)``. So at every instant

    sum over cards of the highest limit that may be in force <= budget

once boot has brought the bank under the budget (before that, nothing is raised).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog

from powerbudgetd.control.actuator import Actuator
from powerbudgetd.errors import BudgetInfeasible, NvmlError, NvmlInvalidArgument, NvmlNoPermission
from powerbudgetd.core.fairshare import fair_shares
from powerbudgetd.core.model import CardOverride, Mode, Role, Timings
from powerbudgetd.hw.nvml import GpuInfo, Nvml, PowerReading, to_mw
from powerbudgetd.core.plan import Step, plan_writes
from powerbudgetd.core.policy import CardView, LendingPolicy
from powerbudgetd.core.snapshot import BankSnapshot, CardSnapshot

log = structlog.get_logger("powerbudgetd")

MODE_REASON = {Mode.BOOTING: "boot", Mode.FAILSAFE: "fail_static", Mode.STOPPING: "shutdown"}


@dataclass
class CardState:
    """Everything the controller knows about one card. Limits in integer mW, times in s."""

    info: GpuInfo
    controllable: bool  # by configuration and hardware; see active() for right now
    min_mw: int
    max_mw: int  # config may lower it below the hardware max
    hw_max_mw: int  # the highest limit the card can come back with
    priority: int = 0
    reading: PowerReading | None = None
    requested_mw: int | None = None
    enforced_mw: int | None = None
    inflight: list[tuple[int, float]] = field(default_factory=list)  # (target mW, written at s)
    bound_mw: int = 0
    target_mw: int | None = None
    share_mw: int | None = None
    role: Role = Role.FAIR
    error: str | None = None
    shadow_mw: int | None = None  # dry run only: the limit we would have set
    foreign_mw: int | None = None  # a raise we did not make, maybe still in flight
    foreign_since: float | None = None
    # A write that did not take (unconfirmed, or refused as invalid) holds the card: it
    # counts at what it reads and is left alone until hold_until, the hold doubling.
    hold_until: float = float("-inf")
    backoff_s: float = 0.0
    refused: set[int] = field(default_factory=set)  # values NVML refused: never resent
    # Someone else changes this card's limit: expected_mw is the requested limit we
    # last confirmed; drift_times when it was found changed; contested while repeated.
    expected_mw: int | None = None
    drift_times: list[float] = field(default_factory=list)
    contested_until: float = float("-inf")
    contested_w: float | None = None  # the competing value last found (W)
    # Instant draw above the enforced limit (normal at load onset; kept, not acted on).
    excursions: int = 0
    peak_excursion_w: float | None = None
    _over_limit: bool = False
    power_unknown: bool = False
    read_errors: dict[str, int] = field(default_factory=dict)  # failed reads by NvmlError.kind (metrics)

    @property
    def readable(self) -> bool:
        return self.error is None

    @property
    def index(self) -> int:
        return self.info.index

    @property
    def uuid(self) -> str:
        return self.info.uuid

    def active(self, now: float) -> bool:
        """Controlled right now: controllable, readable and not held after a failed write."""
        return self.controllable and self.readable and now >= self.hold_until

    def contested(self, now: float) -> bool:
        return now < self.contested_until

    def last_written(self) -> tuple[int, float] | None:
        return self.inflight[-1] if self.inflight else None


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
    backoff); any fault returns the bank to fair share for ``failsafe_hold_s``; a limit
    someone else keeps changing marks the card contested and stops every increase.
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
    ) -> None:
        self.nvml = nvml
        self.budget_mw = int(budget_w * 1000)  # rounded down: toward safety
        self.timings = timings or Timings()
        self.dry_run = dry_run
        self.allow_monitor_only = allow_monitor_only
        self.monitor_only = False
        self.overrides = dict(overrides or {})
        self.actuator = Actuator(nvml, dry_run=dry_run)
        self.policy = LendingPolicy(self.timings)
        self.cards: list[CardState] = []
        self.ready = False
        self.stopping = False
        self.stopped = False
        self.mode = Mode.DRY_RUN if dry_run else Mode.BOOTING
        self._failsafe_until = float("-inf")
        self._infeasible_said = False
        self._budget_reason: str | None = None  # the reason for the next tick's writes

    # -- start ----------------------------------------------------------------------
    def start(self) -> list[CardState]:
        """Enumerate the cards and check the budget can be met and limits written.

        Raises BudgetInfeasible with the numbers when the minimum limits (and fixed
        cards) sum above the budget, and NvmlNoPermission when limits cannot be written
        (unless ``allow_monitor_only``: then the controller only watches).
        """
        self.cards = []
        for info in self.nvml.devices():
            ov = self.overrides.get(info.uuid) or self.overrides.get(str(info.index)) or CardOverride()
            lo, hi = info.min_limit_w, info.max_limit_w
            valid = lo is not None and hi is not None and 0 < lo <= hi
            if lo is not None and hi is not None and not valid:
                log.error("invalid_constraints", index=info.index, uuid=info.uuid, min_w=lo, max_w=hi,
                          action="card left alone and counted at its enforced limit")
            controllable = not ov.exclude and valid
            hw_max = to_mw(max(v for v in (hi, info.default_limit_w, 0.0) if v is not None))
            min_mw = to_mw(lo) if valid and lo is not None else 0
            max_mw = hw_max if ov.max_w is None else max(min_mw, min(hw_max, int(ov.max_w * 1000)))
            role = Role.FIXED if not controllable else Role.FAIR
            self.cards.append(CardState(info, controllable, min_mw, max_mw, hw_max, ov.priority, role=role))
        if not self.cards:
            raise BudgetInfeasible("no GPUs found: nothing to keep under a budget")
        self._check_feasible()
        if not self.dry_run:
            self._check_permission()
        return self.cards

    def _check_permission(self) -> None:
        """Write one card's current limit back to itself (a no-op) to learn, before
        anything else, whether limits can be written at all."""
        for c in self.cards:
            if not c.controllable:
                continue
            reading = self._read(c)
            if reading is None or reading.requested_limit_w is None:
                continue
            try:
                self.nvml.set_power_limit(c.uuid, reading.requested_limit_w)
            except NvmlNoPermission:
                if not self.allow_monitor_only:
                    raise
                self.monitor_only = True
                log.error("monitor_only", error="writing power limits needs root or CAP_SYS_ADMIN",
                          action="watching only: the budget is NOT enforced (allow_monitor_only = true)")
            except NvmlError:
                pass  # anything else shows up, and is handled, on the first tick
            return

    def _check_feasible(self) -> None:
        ctl = [c for c in self.cards if c.controllable]
        fixed_mw = 0
        for c in self.cards:
            if not c.controllable:
                reading = self._read(c)
                known = [v for v in (reading.enforced_limit_w, reading.requested_limit_w) if v is not None] if reading else []
                fixed_mw += to_mw(max(known)) if known else c.hw_max_mw
        floor_mw = sum(c.min_mw for c in ctl) + fixed_mw
        if floor_mw > self.budget_mw:
            share = (self.budget_mw - fixed_mw) / max(len(ctl), 1) / 1000.0
            detail = "; ".join(
                f"GPU {c.index} ({c.info.name}) floor {c.min_mw / 1000:g} W vs share {share:g} W" for c in ctl
            )
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
        self.budget_mw = int(budget_w * 1000)
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
        faults = [f for c in self.cards if (f := self._observe(c, now))]
        faults += self._check_confirmations(now)
        if faults and not self.dry_run:
            self._failsafe_until = now + self.timings.failsafe_hold_s
        mode = self._mode(now)
        shown = Mode.DRY_RUN if self.dry_run else Mode.MONITOR if self.monitor_only else mode
        if shown != self.mode:
            log.info("mode_changed", old=str(self.mode), new=str(shown), faults=faults or None)
            self.mode = shown
        if self.monitor_only:
            self.ready = True
            self.stopped = self.stopping
            return self._report(now, [], faults)

        targets, reasons = self._targets(now, mode)
        if self._budget_reason is not None and mode != Mode.STOPPING:
            reasons = dict.fromkeys(reasons, self._budget_reason)
        self._budget_reason = None
        active = [c for c in self.cards if c.active(now)]
        for c in active:
            c.target_mw = targets[c.uuid] = _avoid_refused(c, targets[c.uuid])
        steps = [
            Step(c.uuid, c.bound_mw, targets[c.uuid], c.requested_mw, c.priority,
                 busy=bool(c.inflight) or c.foreign_mw is not None)
            for c in active
            if targets[c.uuid] not in c.refused
        ]
        # Cards outside the plan (lost, fixed, held) still count at their bounds.
        planned = {st.uuid for st in steps}
        outside_mw = sum(c.bound_mw for c in self.cards if c.uuid not in planned)
        contested = any(c.contested(now) for c in self.cards)
        writes = plan_writes(steps, self.budget_mw - outside_mw, allow_increases=not contested)
        events = self._apply(writes, reasons, now)

        if mode == Mode.BOOTING and all(self._confirmed(c, now) and c.bound_mw == c.target_mw for c in active):
            self.ready = True
            log.info("ready", budget_w=self.budget_mw / 1000, sum_limits_w=self.sum_bound_mw / 1000)
        if mode == Mode.STOPPING and all(self._confirmed(c, now) and c.bound_mw <= (c.share_mw or 0) for c in active):
            self.stopped = True
        return self._report(now, events, faults)

    def _report(self, now: float, events: list[WriteEvent], faults: list[str]) -> TickReport:
        return TickReport(
            now, self.mode, self.ready, self.budget_mw / 1000, self.sum_bound_mw / 1000, tuple(events), tuple(faults),
            bank_snapshot(self, now),
        )

    @property
    def sum_bound_mw(self) -> int:
        return sum(c.bound_mw for c in self.cards)

    def _mode(self, now: float) -> Mode:
        if self.stopping:
            return Mode.STOPPING
        if not self.ready:
            return Mode.BOOTING
        if now < self._failsafe_until or any(c.contested(now) for c in self.cards):
            return Mode.FAILSAFE
        return Mode.DYNAMIC

    # -- observe --------------------------------------------------------------------
    def _read(self, c: CardState) -> PowerReading | None:
        try:
            return self.nvml.read(c.uuid)
        except NvmlError:
            return None

    def _observe(self, c: CardState, now: float) -> str | None:
        """Read one card (an audit, every tick) and update its bound. Returns a fault
        description or None."""
        try:
            r = self.nvml.read(c.uuid)
        except NvmlError as exc:
            c.read_errors[exc.kind] = c.read_errors.get(exc.kind, 0) + 1
            first = c.error is None
            c.error = f"{exc.kind}: {exc}"
            c.reading = None
            c.expected_mw = None  # whatever comes back is news
            if c.controllable:
                c.role = Role.LOST
            # Unknown now: count it at the highest limit it may have or come back with.
            c.bound_mw = max([c.hw_max_mw, c.bound_mw] + [mw for mw, _ in c.inflight])
            if first:
                log.warning("card_unreadable", index=c.index, uuid=c.uuid, error=c.error, counted_w=c.bound_mw / 1000)
            return f"GPU {c.index} unreadable ({exc.kind})"
        if c.error is not None:
            log.info("card_readable_again", index=c.index, uuid=c.uuid, was=c.error)
            c.error = None
            c.role = Role.FAIR if c.controllable else Role.FIXED
        c.reading = r
        c.requested_mw = None if r.requested_limit_w is None else to_mw(r.requested_limit_w)
        c.enforced_mw = None if r.enforced_limit_w is None else to_mw(r.enforced_limit_w)
        if self._confirmed(c, now):
            if c.inflight:
                c.expected_mw = c.inflight[-1][0]  # our write is in force: expect it from now on
                if c.backoff_s:
                    log.info("card_controllable_again", index=c.index, uuid=c.uuid)
                    c.hold_until, c.backoff_s = float("-inf"), 0.0
            c.inflight.clear()
        self._foreign(c, now)
        known = [v for v in (c.requested_mw, c.enforced_mw) if v is not None]
        known += [mw for mw, _ in c.inflight] + ([c.foreign_mw] if c.foreign_mw is not None else [])
        c.bound_mw = max(known) if known else c.hw_max_mw
        if c.shadow_mw is not None:
            c.bound_mw = c.shadow_mw  # dry run: decide as if what we would have written were in force
        self._audit(c, r, now)
        return None

    def _foreign(self, c: CardState, now: float) -> None:
        """A raise we did not make may still be on its way: requested above enforced with
        nothing of ours in flight (a run killed mid-write, another tool). Until it lands
        (or ``settle_s`` shows another limiter holds enforced lower), the card takes no
        write: the old enforced value could otherwise "confirm" our next write too early."""
        pending = (
            not c.inflight and c.requested_mw is not None and c.enforced_mw is not None
            and c.requested_mw > c.enforced_mw
        )
        if not pending:
            c.foreign_mw = c.foreign_since = None
        elif c.foreign_mw != c.requested_mw:
            c.foreign_mw, c.foreign_since = c.requested_mw, now
        elif now - c.foreign_since >= self.timings.settle_s:  # type: ignore[operator]
            c.foreign_mw = None  # settled: a tighter limiter, not a write in flight

    def _audit(self, c: CardState, r: PowerReading, now: float) -> None:
        """Things worth knowing that are not faults: drift, contest, excursions, unknown power."""
        if c.expected_mw is not None and not c.inflight and c.requested_mw not in (None, c.expected_mw):
            found_w = c.requested_mw / 1000
            log.warning("limit_drift", index=c.index, uuid=c.uuid, expected_w=c.expected_mw / 1000, found_w=found_w,
                        action="re-applied (a driver reload, a GPU reset or another tool)")
            window = self.timings.contest_window_s
            c.drift_times = [t for t in c.drift_times if now - t < window] + [now]
            c.contested_w = found_w
            if len(c.drift_times) >= self.timings.contest_reverts:
                if not c.contested(now):
                    log.error("limit_contested", index=c.index, uuid=c.uuid, competing_w=found_w,
                              reverts=len(c.drift_times), window_s=window,
                              action="another tool keeps setting this limit: nothing is raised until it stops")
                c.contested_until = now + self.timings.contest_hold_s
            c.expected_mw = None
        elif c.contested_until != float("-inf") and not c.contested(now):
            log.info("limit_uncontested", index=c.index, uuid=c.uuid)
            c.contested_until = float("-inf")
        if not c.inflight and c.requested_mw is not None and c.requested_mw == c.target_mw:
            c.expected_mw = c.requested_mw
        unknown = r.power_avg_w is None and r.power_instant_w is None
        if unknown != c.power_unknown:
            c.power_unknown = unknown
            (log.warning if unknown else log.info)(
                "power_reading_unknown" if unknown else "power_reading_back", index=c.index, uuid=c.uuid
            )
        over = r.power_instant_w is not None and c.enforced_mw is not None and to_mw(r.power_instant_w) > c.enforced_mw
        if over:
            c.peak_excursion_w = max(c.peak_excursion_w or 0.0, r.power_instant_w)  # type: ignore[type-var]
            if not c._over_limit:
                c.excursions += 1
        c._over_limit = over

    def _confirmed(self, c: CardState, now: float) -> bool:
        """The last write is in force: requested reads it back and enforced equals it
        (or, after ``settle_s``, sits below it because another limiter is tighter)."""
        last = c.last_written()
        if last is None:
            return True
        target, written_at = last
        if c.requested_mw != target or c.enforced_mw is None:
            return False
        return c.enforced_mw == target or (c.enforced_mw < target and now - written_at >= self.timings.settle_s)

    def _check_confirmations(self, now: float) -> list[str]:
        out = []
        for c in self.cards:
            last = c.last_written()
            if last and c.readable and now - last[1] > self.timings.confirm_timeout_s:
                out.append(f"GPU {c.index} write of {last[0] / 1000:g} W unconfirmed")
                self._hold(c, now, "write_unconfirmed", target_w=last[0] / 1000,
                           requested_w=_w(c.requested_mw), enforced_w=_w(c.enforced_mw))
                c.inflight.clear()
        return out

    def _hold(self, c: CardState, now: float, event: str, **fields: object) -> None:
        """Leave a card alone for a doubling backoff after a write that did not take; it
        counts at what it reads. Logged when the card stops being controllable only."""
        if not c.backoff_s:
            log.error(event, index=c.index, uuid=c.uuid, **fields,
                      action="card counted at its read-back limit and retried with backoff")
        tm = self.timings
        c.backoff_s = min(max(tm.retry_backoff_s, 2 * c.backoff_s), tm.retry_backoff_max_s)
        c.hold_until = now + c.backoff_s
        c.role = Role.FIXED

    # -- decide ---------------------------------------------------------------------
    def _targets(self, now: float, mode: Mode) -> tuple[dict[str, int], dict[str, str]]:
        active = [c for c in self.cards if c.active(now)]
        for c in self.cards:
            if c.readable and not c.active(now):
                c.role = Role.FIXED
        reserved = sum(c.bound_mw for c in self.cards if c not in active)
        pool = self.budget_mw - reserved
        shares = fair_shares(pool, [c.min_mw for c in active], [c.max_mw for c in active])
        if shares is None:  # a lost card reserved at its max squeezes the rest below their floors
            shares = [c.min_mw for c in active]
            if not self._infeasible_said:
                log.error("budget_infeasible_now", pool_w=pool / 1000, floors_w=sum(shares) / 1000)
            self._infeasible_said = True
        else:
            self._infeasible_said = False
        for c, share in zip(active, shares):
            c.share_mw = share
        drift = {c.uuid: "drift" for c in active if c.requested_mw != c.expected_mw and c.drift_times
                 and c.drift_times[-1] == now}
        if mode != Mode.DYNAMIC:
            self.policy.reset()
            for c in active:
                c.role = Role.FAIR
            reason = MODE_REASON[mode]
            return {c.uuid: c.share_mw for c in active}, {c.uuid: drift.get(c.uuid, reason) for c in active}  # type: ignore[misc]
        views = [
            CardView(
                c.uuid, c.share_mw, c.min_mw, c.max_mw,  # type: ignore[arg-type]
                c.bound_mw if self.dry_run or c.enforced_mw is None else c.enforced_mw,
                _mw(c.reading.power_avg_w if c.reading else None),
                _mw(c.reading.power_instant_w if c.reading else None),
                c.priority,
            )
            for c in active
        ]
        decided = self.policy.decide(now, views, pool)
        tick_reason = next((r for r in ("reclaim", "release", "lend") if any(t.reason == r for t in decided.values())), "lend")
        for c in active:
            c.role = decided[c.uuid].role
        return (
            {u: t.limit_mw for u, t in decided.items()},
            {u: drift.get(u) or t.reason or tick_reason for u, t in decided.items()},
        )

    # -- act ------------------------------------------------------------------------
    def _apply(self, writes: list, reasons: dict[str, str], now: float) -> list[WriteEvent]:
        by_id = {c.uuid: c for c in self.cards}
        events = []
        running_mw = self.sum_bound_mw  # the sum once this tick's writes so far have landed
        for applied in self.actuator.apply(writes):
            w = applied.write
            c = by_id[w.uuid]
            if applied.skipped and not self.dry_run:
                continue
            if self.dry_run:
                c.bound_mw = c.shadow_mw = w.to_mw
            elif applied.done:
                c.inflight.append((w.to_mw, now))
                c.bound_mw = max(c.bound_mw, w.to_mw)
            err = applied.error
            if err is None:
                running_mw += w.to_mw - w.from_mw
            sum_after = running_mw
            ev = WriteEvent(
                c.index, c.uuid, w.from_mw / 1000, w.to_mw / 1000, reasons.get(w.uuid, "lend"),
                sum_after / 1000,
                None if err is None else str(err),
                None if err is None else err.kind,
                self.dry_run,
            )
            events.append(ev)
            if err is None:
                log.info("power_limit_would_set" if self.dry_run else "power_limit_set", **_event_fields(ev))
                continue
            self._failsafe_until = now + self.timings.failsafe_hold_s
            log.error("power_limit_write_failed", **_event_fields(ev), kind=err.kind, error=str(err))
            if isinstance(err, NvmlInvalidArgument):  # never resend the same refused value
                c.refused.add(w.to_mw)
                self._hold(c, now, "write_refused", target_w=w.to_mw / 1000)
            elif isinstance(err, NvmlNoPermission) and self.allow_monitor_only:
                self.monitor_only = True
                log.error("monitor_only", error="writing power limits needs root or CAP_SYS_ADMIN",
                          action="watching only: the budget is NOT enforced")
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
            requested_limit_w=None if r is None else _w(c.requested_mw),
            enforced_limit_w=None if r is None else _w(c.enforced_mw),
            limit_bound_w=c.bound_mw / 1000,
            min_limit_w=None if info.min_limit_w is None else c.min_mw / 1000,
            max_limit_w=None if info.max_limit_w is None else c.max_mw / 1000,
            hw_min_limit_w=info.min_limit_w, hw_max_limit_w=info.max_limit_w,
            power_avg_w=None if r is None else r.power_avg_w,
            power_instant_w=None if r is None else r.power_instant_w,
            error=c.error, contested_w=c.contested_w if c.contested(now) else None,
            excursions=c.excursions, peak_excursion_w=c.peak_excursion_w,
            read_errors=tuple(sorted(c.read_errors.items())),
        ))
    floor_mw = sum(c.min_mw if c.controllable else c.bound_mw for c in ctl.cards)
    return BankSnapshot(
        now=now, mode=str(ctl.mode), ready=ctl.ready, budget_w=ctl.budget_mw / 1000,
        sum_limit_bound_w=ctl.sum_bound_mw / 1000, floor_w=floor_mw / 1000, cards=tuple(cards),
    )


def _avoid_refused(c: CardState, target_mw: int) -> int:
    """A value NVML refused (INVALID_ARGUMENT) is never resent unchanged: take the nearest
    whole watt below it that was not refused (lower is always within the budget), down to
    the card's minimum; with none left the target stays and the card stays held."""
    candidate = target_mw
    while candidate in c.refused and candidate - 1000 >= c.min_mw:
        candidate -= 1000
    return candidate


def _mw(w: float | None) -> int | None:
    return None if w is None else to_mw(w)


def _w(mw: int | None) -> float | None:
    return None if mw is None else mw / 1000


def _event_fields(ev: WriteEvent) -> dict:
    return {
        "index": ev.index, "uuid": ev.uuid, "from_w": ev.from_w, "to_w": ev.to_w,
        "reason": ev.reason, "sum_after_w": ev.sum_after_w,
    }
