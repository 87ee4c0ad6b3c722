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

from powerbudgetd.actuator import Actuator
from powerbudgetd.errors import BudgetInfeasible, NvmlError, NvmlGpuLost
from powerbudgetd.fairshare import fair_shares
from powerbudgetd.model import Mode, Role, Timings
from powerbudgetd.nvml import GpuInfo, Nvml, PowerReading, to_mw
from powerbudgetd.plan import Step, plan_writes
from powerbudgetd.policy import CardView, LendingPolicy

log = structlog.get_logger("powerbudgetd")

MODE_REASON = {Mode.BOOTING: "boot", Mode.FAILSAFE: "fail_static", Mode.STOPPING: "shutdown"}


@dataclass(frozen=True)
class CardOverride:
    """Per-card settings from the config: leave it alone, a lower max (W), lending priority."""

    exclude: bool = False
    max_w: float | None = None
    priority: int = 0


@dataclass
class CardState:
    """Everything the controller knows about one card. Limits in integer mW."""

    info: GpuInfo
    controllable: bool
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
    """The outcome of one tick: mode, budget and sum of bounds (W), and the writes."""

    now: float
    mode: Mode
    ready: bool
    budget_w: float
    sum_bound_w: float
    writes: tuple[WriteEvent, ...]
    faults: tuple[str, ...]


class Controller:
    """Keeps one bank's summed power limits under ``budget_w``.

    Call :meth:`start` once (enumerates cards, checks feasibility), then :meth:`tick`
    every ``timings.tick_s``. :attr:`ready` turns true once every card's boot limit is
    read back as enforced. :meth:`request_stop` returns the bank to fair share; then
    :attr:`stopped` turns true.
    """

    def __init__(
        self,
        nvml: Nvml,
        budget_w: float,
        timings: Timings | None = None,
        *,
        dry_run: bool = False,
        overrides: Mapping[str, CardOverride] | None = None,
    ) -> None:
        self.nvml = nvml
        self.budget_mw = int(budget_w * 1000)  # rounded down: toward safety
        self.timings = timings or Timings()
        self.dry_run = dry_run
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

    # -- start ----------------------------------------------------------------------
    def start(self) -> list[CardState]:
        """Enumerate the cards. Raises BudgetInfeasible with the numbers when the
        minimum limits (and fixed cards) sum above the budget."""
        self.cards = []
        for info in self.nvml.devices():
            ov = self.overrides.get(info.uuid) or self.overrides.get(str(info.index)) or CardOverride()
            controllable = not ov.exclude and info.min_limit_w is not None and info.max_limit_w is not None
            hw_max = to_mw(info.max_limit_w or info.default_limit_w or 0.0)
            min_mw = to_mw(info.min_limit_w or 0.0)
            max_mw = hw_max if ov.max_w is None else max(min_mw, min(hw_max, int(ov.max_w * 1000)))
            role = Role.FIXED if not controllable else Role.FAIR
            self.cards.append(
                CardState(info, controllable, min_mw, max_mw, hw_max, ov.priority, role=role)
            )
        if not self.cards:
            raise BudgetInfeasible("no GPUs found: nothing to keep under a budget")
        self._check_feasible()
        return self.cards

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
                + (f" plus {fixed_mw / 1000:g} W on cards we cannot control" if fixed_mw else "")
                + f" = {floor_mw / 1000:g} W. {detail}"
            )

    def set_budget(self, budget_w: float) -> None:
        """Change the budget. A lower one is acted on at the next tick, decreases first;
        raises BudgetInfeasible (keeping the old budget) when the minimums do not fit."""
        old = self.budget_mw
        self.budget_mw = int(budget_w * 1000)
        try:
            self._check_feasible()
        except BudgetInfeasible:
            self.budget_mw = old
            raise

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
        shown = Mode.DRY_RUN if self.dry_run else mode
        if shown != self.mode:
            log.info("mode_changed", old=str(self.mode), new=str(shown), faults=faults or None)
            self.mode = shown

        targets, reasons = self._targets(now, mode)
        ctl = [c for c in self.cards if c.controllable and c.readable]
        for c in ctl:
            c.target_mw = targets[c.uuid]
        steps = [Step(c.uuid, c.bound_mw, targets[c.uuid], c.requested_mw, c.priority) for c in ctl]
        writes = plan_writes(steps, self.budget_mw)
        events = self._apply(writes, reasons, now)

        if mode == Mode.BOOTING and all(self._confirmed(c, now) and c.bound_mw == c.target_mw for c in ctl):
            self.ready = True
            log.info("ready", budget_w=self.budget_mw / 1000, sum_limits_w=self.sum_bound_mw / 1000)
        if mode == Mode.STOPPING and all(self._confirmed(c, now) and c.bound_mw <= (c.share_mw or 0) for c in ctl):
            self.stopped = True
        return TickReport(
            now, mode, self.ready, self.budget_mw / 1000, self.sum_bound_mw / 1000, tuple(events), tuple(faults)
        )

    @property
    def sum_bound_mw(self) -> int:
        return sum(c.bound_mw for c in self.cards)

    def _mode(self, now: float) -> Mode:
        if self.stopping:
            return Mode.STOPPING
        if not self.ready:
            return Mode.BOOTING
        if now < self._failsafe_until:
            return Mode.FAILSAFE
        return Mode.DYNAMIC

    # -- observe --------------------------------------------------------------------
    def _read(self, c: CardState) -> PowerReading | None:
        try:
            return self.nvml.read(c.uuid)
        except NvmlError:
            return None

    def _observe(self, c: CardState, now: float) -> str | None:
        """Read one card and update its bound. Returns a fault description or None."""
        try:
            r = self.nvml.read(c.uuid)
        except NvmlError as exc:
            c.read_errors[exc.kind] = c.read_errors.get(exc.kind, 0) + 1
            first = c.error is None
            c.error = f"{exc.kind}: {exc}"
            c.reading = None
            if c.controllable:
                c.role = Role.LOST if isinstance(exc, NvmlGpuLost) else c.role
            # Unknown now: count it at the highest limit it may have or come back with.
            c.bound_mw = max([c.hw_max_mw, c.bound_mw] + [mw for mw, _ in c.inflight])
            if first:
                log.warning("card_unreadable", index=c.index, uuid=c.uuid, error=c.error, counted_w=c.bound_mw / 1000)
            return f"GPU {c.index} unreadable ({exc.kind})"
        if c.error is not None:
            log.info("card_readable_again", index=c.index, uuid=c.uuid, was=c.error)
            c.error = None
            if c.role == Role.LOST:
                c.role = Role.FAIR
        c.reading = r
        c.requested_mw = None if r.requested_limit_w is None else to_mw(r.requested_limit_w)
        c.enforced_mw = None if r.enforced_limit_w is None else to_mw(r.enforced_limit_w)
        if self._confirmed(c, now):
            c.inflight.clear()
        else:  # a write not visible in read-back after settle_s never took effect
            c.inflight = [(mw, t) for mw, t in c.inflight if now - t < self.timings.settle_s]
        known = [v for v in (c.requested_mw, c.enforced_mw) if v is not None]
        known += [mw for mw, _ in c.inflight]
        c.bound_mw = max(known) if known else c.hw_max_mw
        if c.shadow_mw is not None:
            c.bound_mw = c.shadow_mw  # dry run: decide as if what we would have written were in force
        return None

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
                log.error(
                    "write_unconfirmed", index=c.index, uuid=c.uuid, target_w=last[0] / 1000,
                    requested_w=_w(c.requested_mw), enforced_w=_w(c.enforced_mw),
                )
                c.inflight.clear()
        return out

    # -- decide ---------------------------------------------------------------------
    def _targets(self, now: float, mode: Mode) -> tuple[dict[str, int], dict[str, str]]:
        ctl = [c for c in self.cards if c.controllable and c.readable]
        reserved = sum(c.bound_mw for c in self.cards if c not in ctl)
        pool = self.budget_mw - reserved
        shares = fair_shares(pool, [c.min_mw for c in ctl], [c.max_mw for c in ctl])
        if shares is None:  # a lost card reserved at its max squeezes the rest below their floors
            shares = [c.min_mw for c in ctl]
            if not self._infeasible_said:
                log.error("budget_infeasible_now", pool_w=pool / 1000, floors_w=sum(shares) / 1000)
            self._infeasible_said = True
        else:
            self._infeasible_said = False
        for c, s in zip(ctl, shares):
            c.share_mw = s
        if mode != Mode.DYNAMIC:
            self.policy.reset()
            for c in ctl:
                c.role = Role.FAIR
            reason = MODE_REASON[mode]
            return {c.uuid: c.share_mw for c in ctl}, {c.uuid: reason for c in ctl}  # type: ignore[misc]
        views = [
            CardView(
                c.uuid, c.share_mw, c.min_mw, c.max_mw,  # type: ignore[arg-type]
                c.bound_mw if self.dry_run or c.enforced_mw is None else c.enforced_mw,
                _mw(c.reading.power_avg_w if c.reading else None),
                _mw(c.reading.power_instant_w if c.reading else None),
                c.priority,
            )
            for c in ctl
        ]
        decided = self.policy.decide(now, views, pool)
        tick_reason = next((r for r in ("reclaim", "release", "lend") if any(t.reason == r for t in decided.values())), "lend")
        for c in ctl:
            c.role = decided[c.uuid].role
        return (
            {u: t.limit_mw for u, t in decided.items()},
            {u: t.reason or tick_reason for u, t in decided.items()},
        )

    # -- act ------------------------------------------------------------------------
    def _apply(self, writes: list, reasons: dict[str, str], now: float) -> list[WriteEvent]:
        by_id = {c.uuid: c for c in self.cards}
        events = []
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
            sum_after = self.sum_bound_mw - c.bound_mw + w.to_mw
            ev = WriteEvent(
                c.index, c.uuid, w.from_mw / 1000, w.to_mw / 1000, reasons.get(w.uuid, "lend"),
                sum_after / 1000,
                None if applied.error is None else str(applied.error),
                None if applied.error is None else applied.error.kind,
                self.dry_run,
            )
            events.append(ev)
            if applied.error is not None:
                self._failsafe_until = now + self.timings.failsafe_hold_s
                log.error("power_limit_write_failed", **_event_fields(ev), kind=applied.error.kind)
            elif self.dry_run:
                log.info("power_limit_would_set", **_event_fields(ev))
            else:
                log.info("power_limit_set", **_event_fields(ev))
        return events


def _mw(w: float | None) -> int | None:
    return None if w is None else to_mw(w)


def _w(mw: int | None) -> float | None:
    return None if mw is None else mw / 1000


def _event_fields(ev: WriteEvent) -> dict:
    return {
        "index": ev.index, "uuid": ev.uuid, "from_w": ev.from_w, "to_w": ev.to_w,
        "reason": ev.reason, "sum_after_w": ev.sum_after_w,
    }
