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

One tick, in order: read the device count and every card (one batch), follow the device
set (:mod:`~powerbudgetd.control.cardset`; a card found gone, back or new is read after
it), take each read into its card's ledger (:mod:`~powerbudgetd.control.observe`),
decide the targets (:mod:`~powerbudgetd.control.decide`), plan the writes, decreases first
(:mod:`powerbudgetd.core.plan`), apply them (:mod:`~powerbudgetd.control.actuator`, the
only writer) and take what became of them into the ledgers
(:mod:`~powerbudgetd.control.writes`). NVML calls go through ``calls``
(:mod:`powerbudgetd.hw.calls`): in the daemon each with a deadline in a worker thread, so
a hung call costs one card its control (it counts at its worst case), never the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import structlog

from powerbudgetd.control import decide, observe
from powerbudgetd.control.actuator import Actuator
from powerbudgetd.control.card import CardState
from powerbudgetd.control.cardset import BANK_KEY, CardSet
from powerbudgetd.control.overbudget import OverBudget, degraded
from powerbudgetd.control.report import TickReport, bank_snapshot
from powerbudgetd.control.writes import WriteEvent, record
from powerbudgetd.core.model import CardOverride, Mode, Timings
from powerbudgetd.core.plan import Step, Write, plan_writes
from powerbudgetd.core.policy import LendingPolicy
from powerbudgetd.core.snapshot import BankSnapshot
from powerbudgetd.core.units import budget_mw, to_mw, to_w
from powerbudgetd.errors import NvmlError, NvmlNoPermission, NvmlTimeout
from powerbudgetd.hw.calls import InlineCalls
from powerbudgetd.hw.card import CardBackend

__all__ = ["Controller", "TickReport", "WriteEvent"]  # the tick's report types, where the controller is

log = structlog.get_logger("powerbudgetd")


class Controller:
    """Keeps one bank's summed power limits under ``budget_w``.

    Call :meth:`start` once (enumerates cards, checks feasibility and write permission),
    then :meth:`tick` every ``timings.tick_s``. :attr:`ready` turns true once every
    card's boot limit is read back as enforced. :meth:`request_stop` returns the bank to
    fair share; then :attr:`stopped` turns true.

    Faults never raise out of :meth:`tick`: a card that cannot be read counts at the
    highest limit it may have, and returns the bank to fair share for ``failsafe_hold_s``;
    a write that does not take holds that card alone (counted at its bound, retried with
    backoff) while the others keep lending; a limit someone else keeps changing marks
    the card contested and stops every increase.
    ``clock`` (s, the daemon's) stamps each write when it is sent; without it, ``now``.
    """

    def __init__(
        self,
        nvml: CardBackend,
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
        self.calls = calls or InlineCalls()
        self.bank = CardSet(nvml, self.timings, self.calls, overrides or {})
        self.actuator = Actuator(nvml, dry_run=dry_run, calls=self.calls, clock=clock)
        self.policy = LendingPolicy(self.timings)
        self.over = OverBudget()
        self.ready = self.stopping = self.stopped = False
        self.mode = Mode.DRY_RUN if dry_run else Mode.BOOTING
        self._failsafe_until = float("-inf")
        self._budget_reason: str | None = None  # the reason for the next tick's writes
        self._over = False  # the sum of bounds read this tick is above the budget
        self.override_warnings: list[str] = []  # [cards] settings that do nothing (see start)

    @property
    def cards(self) -> list[CardState]:
        return self.bank.cards

    # -- start ----------------------------------------------------------------------
    def start(self) -> list[CardState]:
        """Enumerate the cards and check the budget can be met and limits written.

        Raises CardLimitUnknown naming each card whose limits cannot be read and has no
        ``[cards]`` max_w; BudgetInfeasible with the numbers when the minimum limits (and
        fixed cards) sum above the budget; NvmlNoPermission when limits cannot be
        written (unless ``allow_monitor_only``: then the controller only watches).
        """
        self.override_warnings = self.bank.start()
        self.bank.check_feasible(self.budget_mw)
        if not self.dry_run:
            self._check_permission()
        return self.cards

    def _check_permission(self) -> None:
        """Write one card's current limit back to itself (a no-op, through the actuator)
        to learn, before anything else, whether limits can be written at all."""
        for c in self.cards:
            reading = self.bank.read(c.uuid) if c.controllable else None
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

    def set_budget(self, budget_w: float, reason: str | None = None) -> None:
        """Change the budget. A lower one is acted on at the next tick, decreases first;
        raises BudgetInfeasible (keeping the old budget) when the minimums do not fit
        (the cards we do not control counted as the last tick left them: no NVML call
        here, the daemon calls this on its event loop).
        ``reason`` (such as ``"reload"``) labels the writes of the next tick."""
        new = budget_mw(budget_w)
        self.bank.check_feasible(new, fresh=False)
        self.budget_mw, self._budget_reason = new, reason

    def request_stop(self) -> None:
        """Return every card to fair share (decreases first); :attr:`stopped` follows."""
        self.stopping = True

    # -- one tick -------------------------------------------------------------------
    def tick(self, now: float) -> TickReport:
        # The device count rides with the card reads: one hand-off to the NVML workers. A
        # card the enumeration found gone, back or new is read (again) after it.
        reads = self.calls.many(self.bank.read_calls())
        for uuid in self.bank.follow(now, reads.pop(BANK_KEY)):
            reads.pop(uuid, None)
        faults = self._observe_all(now, reads)
        # A write that did not take holds its own card (counted at its bound, retried with
        # backoff): the others keep lending among themselves, the bank is not in failsafe.
        held = [f for c in self.cards if (f := observe.expire(c, now))]
        if faults and not self.dry_run:
            self._failsafe_until = now + self.timings.failsafe_hold_s
        # Each card's bound, taken once: unchanged until record() takes this tick's writes
        # in (then taken again for the cards written), it is what the plan, the over-budget
        # episode and the snapshot count.
        bounds = {c.uuid: c.bound_mw for c in self.cards}
        sum_bound_mw = sum(bounds.values())
        self._over = sum_bound_mw > self.budget_mw
        contested = any(c.contested(now) for c in self.cards)  # the audit's, set by the reads above
        mode = self._mode(now, contested)
        shown = Mode.DRY_RUN if self.dry_run else Mode.MONITOR if self.monitor_only else mode
        if shown != self.mode:
            log.info("mode_changed", old=str(self.mode), new=str(shown), faults=faults or None)
            self.mode = shown
        if self.monitor_only:
            self.ready, self.stopped = True, self.stopping
            return self._report(now, [], faults + held, bounds)

        active = [c for c in self.cards if self._active(c, now)]
        settling = self._over and any(c.ledger.above_requested and not c.ledger.held_above for c in self.cards)
        doubted = frozenset(c.uuid for c in active if c.ledger.doubted) if self._over else frozenset()
        targets, reasons = decide.targets(self.cards, active, self.budget_mw, mode, self.policy, self.over, now,
                                          self.dry_run, settling, doubted)
        if self._budget_reason is not None and mode != Mode.STOPPING:
            reasons = dict.fromkeys(reasons, self._budget_reason)
        self._budget_reason = None
        # Over budget, a cut that one cap does not show yet is sent again every tick (it may
        # have been put back), so the card is down within a tick plus its lag; the card
        # still counts where it is (not active), the others lowered around it. Not to a
        # slow card (its reads time out): as any, it takes no write meanwhile.
        resent = {c.uuid: cut for c in self.cards if c.ledger.above_requested and c.slow_since is None
                  and (cut := c.ledger.unshown_cut_mw) is not None and self._controlled(c, now)} if self._over else {}
        if resent:
            reasons = {**reasons, **dict.fromkeys(resent, "resend")}
        applied = self.actuator.apply(self._plan(now, active, targets, bounds, bool(faults) or contested, resent),
                                      sum_bound_mw=sum_bound_mw, budget_mw=self.budget_mw)
        by_uuid = self.bank.by_uuid
        done = record(applied, by_uuid, reasons, sum_bound_mw, now, self.dry_run, self.allow_monitor_only)
        if done.no_permission:
            self._monitor_only()
        for a in applied:  # record() changed these cards' ledgers, and no other's
            bounds[a.write.uuid] = by_uuid[a.write.uuid].bound_mw
        sum_bound_mw = sum(bounds.values())
        self.over.track(now, self.cards, self.budget_mw, mode, sum_bound_mw)
        self._check_done(now, mode, sum_bound_mw)
        return self._report(now, done.events, faults + held, bounds)

    def _plan(self, now: float, active: list[CardState], targets: dict[str, int], bounds: Mapping[str, int],
              hold_raises: bool = False, resent: Mapping[str, int] = MappingProxyType({})) -> list[Write]:
        """The writes that move the active cards to their targets (``bounds``: every
        card's, by UUID), decreases first, increases only into the budget left above
        every other card's bound; none in a tick that ``hold_raises`` (a fault: a card
        just lost may have made way for one NVML lists only at the next enumeration,
        uncounted until then; a contested card), nor while a card is new. The cards in
        ``resent`` (by UUID) are sent their cut in flight again (mW), as decreases."""
        steps = []
        for c in active:
            target, bound = targets[c.uuid], bounds[c.uuid]
            step = to_mw(c.info.caps.limit_step_w)  # a driver that keeps whole W (amdgpu) reads back only those
            if step > 1 and target % step:
                target = max(c.min_mw, target - target % step)  # down: within the budget
            c.target_mw = targets[c.uuid] = target = c.ledger.avoid_refused(target, c.min_mw)
            if target in c.refused:
                if target < bound:
                    # It cannot be lowered to what it was counted at (NVML refused that value,
                    # and every one below): held, it counts at its bound from the next tick and
                    # the others are fitted around it, instead of lending watts it still holds.
                    c.hold(now, "write_refused", target_w=to_w(target), counted_w=to_w(bound))
                continue
            asked, new = c.asked_mw, c.ledger.new
            if target == bound == asked and not new:
                # At rest (most cards, most ticks): no write to plan (plan_writes passes such
                # a step by), so none is built; it counts outside the plan with the others,
                # which leaves the plan the same room.
                c.ledger.at_rest()
                continue
            # A new card is written even at its target: only a confirmed write of ours ends it.
            # A slow card (its reads time out) keeps its place and takes no write meanwhile.
            steps.append(Step(c.uuid, bound, target, asked, c.priority,
                              busy=c.ledger.writing or c.slow_since is not None, force=new))
        by_uuid = self.bank.by_uuid
        steps += [Step(u, bounds[u], cut, by_uuid[u].asked_mw, by_uuid[u].priority) for u, cut in resent.items()]
        outside_mw = sum(bounds.values()) - sum(st.bound_mw for st in steps)  # fixed, lost, held, at rest
        hold_raises = hold_raises or any(c.ledger.new for c in active)
        return plan_writes(steps, self.budget_mw - outside_mw, allow_increases=not hold_raises)

    def _check_done(self, now: float, mode: Mode, sum_bound_mw: int) -> None:
        """Ready only when provably within budget: every card we control confirmed at its
        boot limit, and the sum of bounds (``sum_bound_mw``, as the tick's writes left it;
        cards we cannot lower counted at theirs) fits. Stopped once every card we control
        is confirmed at or below its fair share. Judged on every card we control, those
        counted where they are while their decrease bites (over budget) too: their writes
        must be confirmed first."""
        if mode == Mode.BOOTING and sum_bound_mw <= self.budget_mw:
            if all(c.ledger.confirmed(now) and c.bound_mw == c.target_mw for c in self.cards if self._controlled(c, now)):
                self.ready = True
                log.info("ready", budget_w=to_w(self.budget_mw), sum_limits_w=to_w(sum_bound_mw),
                         degraded=self.degraded() or None)
        elif mode == Mode.STOPPING:
            if all(c.ledger.confirmed(now) and c.bound_mw <= (c.share_mw or 0)
                   for c in self.cards if self._controlled(c, now)):
                self.stopped = True

    def _observe_all(self, now: float, results: dict[str, Any]) -> list[str]:
        """Every card's read (``results``, by UUID: a PowerReading or the NvmlError; a card
        missing there is read here) into its ledger. Returns the faults found."""
        if new := {c.uuid: (self.nvml.read, (c.uuid,)) for c in self.cards if c.uuid not in results}:
            results = {**results, **self.calls.many(new)}
        faults = []
        energy_j = self._energy_j
        for c in self.cards:
            r = results[c.uuid]
            if isinstance(r, NvmlError) and not isinstance(r, NvmlTimeout):
                self.bank.look_again(now)  # a lookup error (not a slow card): enumerate again
            if fault := observe.observe(c, r, now, energy_j):
                faults.append(fault)
        return faults

    def _energy_j(self, uuid: str) -> float | None:
        try:
            return self.calls.call(uuid, self.nvml.energy_j, uuid)
        except NvmlError:
            return None

    def _report(self, now: float, events: list[WriteEvent], faults: list[str], bounds: Mapping[str, int]) -> TickReport:
        snap = bank_snapshot(self.cards, now, self.mode, self.ready, self.budget_mw, self.over, bounds)
        return TickReport(now, self.mode, self.ready, to_w(self.budget_mw), snap.sum_limit_bound_w,
                          tuple(events), tuple(faults), snap)

    def snapshot(self, now: float) -> BankSnapshot:
        """The bank in W as it stands at ``now`` (what every side channel reads)."""
        return bank_snapshot(self.cards, now, self.mode, self.ready, self.budget_mw, self.over)

    @property
    def sum_bound_mw(self) -> int:
        return sum(c.bound_mw for c in self.cards)

    def degraded(self) -> list[str]:
        """Why the bank is not fully under control, one phrase per card (empty: it is)."""
        return degraded(self.cards)

    def _mode(self, now: float, contested: bool) -> Mode:
        """This tick's mode (``contested``: some card's limit is)."""
        if self.stopping:
            return Mode.STOPPING
        if not self.ready:
            return Mode.BOOTING
        if now < self._failsafe_until or contested:
            return Mode.FAILSAFE
        return Mode.DYNAMIC

    def _controlled(self, c: CardState, now: float) -> bool:
        """Controlled right now: controllable, readable, not held after a failed write, and
        not held above its requested limit by an outside floor (writing cannot lower it)."""
        return c.controllable and c.readable and not c.ledger.held(now) and not c.ledger.held_above

    def _active(self, c: CardState, now: float) -> bool:
        """Controlled and given a target this tick. Over budget, a card whose enforced
        limit is above its requested one (our decrease still biting, or a floor that came
        in under it) is counted where it is, so the others are lowered around it this
        tick instead of once the write settles."""
        return self._controlled(c, now) and not (self._over and c.ledger.above_requested)
