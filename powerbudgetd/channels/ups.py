"""The UPS side channel: polls a Network UPS Tools server and offers the budget the UPS
allows. The only module that imports ``aionut``.

Two halves on the daemon's event-loop thread:

- :meth:`UpsChannel.run` polls ``upsd`` every ``poll_s`` (``LIST VAR <ups>`` through
  aionut's persistent client), parses and bounds every value (``core.ups.parse_vars``),
  feeds :class:`~powerbudgetd.core.ups.UpsGuard` and offers the result at once, so a
  UPS going on battery lowers the budget within one poll plus one tick. A failed poll
  is a *silence* with a cause (``unreachable``, ``stale``, ``unknown_ups``,
  ``auth_failed``, ``error``): one warning per change, a metric, the budget in force
  kept; polls back off (doubling from ``poll_s`` to ``reconnect_max_s``) until upsd
  answers again. Nothing here can raise out of the task. A flapping source is quiet:
  one state change is logged per change of the budget, the rest counted and given
  (``flaps``) with the next ``ups_budget`` line, or with the state once it has held for
  :data:`SETTLE_S`; a reason changing under an unchanged budget (on battery to stale)
  is not logged.
- :meth:`UpsChannel.on_tick` records the GPUs' board power (to pair with the UPS's
  measured load) and the bank's floor, runs the guard's timers and refreshes the offer.
- :meth:`UpsChannel.on_reload` applies new budget rules at once (the daemon keeps the
  running connection settings: those need a restart, and the reload says so).

The budget is offered to the daemon's budget arbiter under the source name ``ups``: an
offer can only lower the budget; the arbiter decides what is in force, and the daemon
alone sets it on the controller. LB/FSD/OVER offer the bank's floor (the sum of the
cards' minimum limits, from the tick's snapshot).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import aionut
import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from powerbudgetd.channels import metricnames as names
from powerbudgetd.core.backoff import Backoff
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.plausible import REASONS as PLAUSIBILITY_REASONS
from powerbudgetd.core.ups import BOUNDS, EVIDENCE, KNOWN_FLAGS, REASONS, UpsConstraint, UpsGuard, UpsParams, UpsReading, parse_vars
from powerbudgetd.config import UpsConfig

if TYPE_CHECKING:
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.config import Settings

log = structlog.get_logger("powerbudgetd")

SOURCE = "ups"
# The board power shown beside the UPS (record, tests): the lowest of the last 2 s. The
# measured load itself is paired by the sensor model (core.sensor) at the time it changed.
BOARD_WINDOW_S = 2.0
CAUSES = ("unreachable", "stale", "unknown_ups", "auth_failed", "error")
STATES = ("waiting", "ok", *CAUSES)
SHOWN_FLAGS = ("OL", "OB", "LB", "FSD", "OVER", "CHRG", "DISCHRG", "BYPASS", "OFF", "RB", "HB", "ALARM", "TRIM", "BOOST")
MAX_SHOWN = 120  # characters of a server's error quoted in logs
SETTLE_S = 30.0  # a state left unsaid by flapping is said once it has held this long (s)


class BudgetSink(Protocol):
    """The part of ``core.arbiter.BudgetArbiter`` a budget source uses: the configured
    budget (W), an offer of at most ``budget_w`` (W) from ``now`` (s) on, a withdrawal."""

    @property
    def configured_w(self) -> float: ...

    def offer(self, source: str, budget_w: float, now: float) -> None: ...

    def withdraw(self, source: str) -> None: ...


class UpsMetrics:
    """The UPS's Prometheus metrics, on ``registry``. A value the UPS does not report
    (or reported out of bounds) is NaN, never 0."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.state = names.gauge(names.UPS_DATA_STATE, registry)
        self.status = names.gauge(names.UPS_STATUS, registry)
        self.on_battery = names.gauge(names.UPS_ON_BATTERY, registry)
        for evidence in EVIDENCE:
            self.on_battery.labels(evidence).set(0)
        self.load = names.gauge(names.UPS_LOAD, registry)
        self.realpower = names.gauge(names.UPS_REALPOWER, registry)
        self.nominal = names.gauge(names.UPS_REALPOWER_NOMINAL, registry)
        self.charge = names.gauge(names.UPS_CHARGE, registry)
        self.runtime = names.gauge(names.UPS_RUNTIME, registry)
        self.age = names.gauge(names.UPS_DATA_AGE, registry)
        self.budget = names.gauge(names.UPS_BUDGET, registry)
        self.limiting = names.gauge(names.UPS_BUDGET_REASON, registry)
        self.polls_failed = names.counter(names.UPS_POLLS_FAILED, registry)
        self.rejected = names.counter(names.UPS_VALUES_REJECTED, registry)
        self.implausible = names.counter(names.UPS_READINGS_IMPLAUSIBLE, registry)
        self.trusted = names.gauge(names.UPS_MEASURED_LOAD_TRUSTED, registry)
        self.trusted.set(1)
        for reason in PLAUSIBILITY_REASONS:
            self.implausible.labels(reason)
        for state in STATES:
            self.state.labels(state).set(1 if state == "waiting" else 0)
        for flag in SHOWN_FLAGS:
            self.status.labels(flag)
        for reason in REASONS:
            self.limiting.labels(reason).set(0)
        for cause in CAUSES:
            self.polls_failed.labels(cause)
        for name in ("ups.status", *(b[0] for b in BOUNDS)):
            self.rejected.labels(name)

    def reading(self, r: UpsReading) -> None:
        for flag in SHOWN_FLAGS:
            self.status.labels(flag).set(1 if r.flags is not None and flag in r.flags else 0)
        for gauge, value in (
            (self.load, None if r.load_pct is None else r.load_pct / 100),
            (self.realpower, r.wall_w()),
            (self.nominal, r.realpower_nominal_w),
            (self.charge, None if r.battery_charge_pct is None else r.battery_charge_pct / 100),
            (self.runtime, r.battery_runtime_s),
        ):
            _set_or_nan(gauge, value)


def _set_or_nan(gauge: Gauge, value: float | None) -> None:
    if value is None:
        gauge.set(float("nan"))  # a gauge without labels cannot vanish: NaN says "not reported"
    else:
        gauge.set(value)


def classify(exc: BaseException) -> str:
    """A failed poll's cause: one of :data:`CAUSES`."""
    text = str(exc)
    if isinstance(exc, aionut.NUTLoginError) or "ACCESS-DENIED" in text:
        return "auth_failed"
    if isinstance(exc, aionut.NUTCommandError):
        if "UNKNOWN-UPS" in text:
            return "unknown_ups"
        if "DATA-STALE" in text or "DRIVER-NOT-CONNECTED" in text:
            return "stale"
        return "error"
    if isinstance(exc, aionut.NUTProtocolError | aionut.NUTValueError):
        return "error"
    if isinstance(exc, aionut.NUTError | OSError | TimeoutError):
        return "unreachable"
    return "error"


def guard_params(cfg: UpsConfig, feed: Feed | None) -> UpsParams:
    """The state machine's parameters from ``[ups]`` and ``[feed]`` (the plug-side limit
    and PSU efficiency the measured load is held to; without ``[feed]`` it is not used)."""
    measured = cfg.measured_load and feed is not None
    return UpsParams(
        on_battery_w=cfg.on_battery_budget_w,
        on_battery_fraction=cfg.battery_fraction(),
        on_battery_delay_s=cfg.on_battery_delay_s,
        online_hold_s=cfg.online_hold_s,
        stale_as_on_battery=cfg.stale_as_on_battery,
        wall_limit_w=feed.wall_limit_w() if measured and feed is not None else None,
        psu_efficiency=feed.psu_efficiency if feed is not None else 0.9,
        hysteresis_w=cfg.hysteresis_w,
        reach=cfg.reach(),
    )


class UpsChannel:
    """A UPS behind NUT as a budget source; see the module docstring. Register it with
    ``Daemon.register``.

    ``arbiter``: the daemon's budget arbiter (the configured budget is read there, the
    UPS's offered there). ``feed``: the plug-side limit and PSU efficiency for the
    measured load. ``client_factory``: builds the aionut client; ``sleep``: the wait
    between polls (tests). Metrics go on ``registry`` (default: the process-wide one).
    ``on_feed`` (``[ups] feed``): told whether the feed this UPS carries is as good as
    lost (``UpsGuard.feed_lost``: a fresh reading said on battery and the on-battery
    budget is in force; back once on line for the hold; a silence taken as on battery
    stays this host's own), once when first known (a mark this host left before a
    restart is then lifted, once the UPS has been on line for the hold) and at each change.
    """

    def __init__(
        self,
        cfg: UpsConfig,
        arbiter: BudgetSink,
        feed: Feed | None = None,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Callable[[], float] = time.monotonic,
        client_factory: Callable[[UpsConfig], Any] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_feed: Callable[[bool], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.feed = feed
        self.sink = arbiter
        self.clock = clock
        self.metrics = UpsMetrics(registry)
        self.guard = UpsGuard(guard_params(cfg, feed))
        self.client_factory = client_factory or _client
        self._sleep = sleep
        self.state = "waiting"
        self.floor_w: float | None = None
        self.constraint = UpsConstraint(None, None)
        self.polls = 0
        self._board: deque[tuple[float, float]] = deque(maxlen=256)  # (s, W)
        self._flags: frozenset[str] | None = None  # the last known flags: kept through silences and reconnects
        self._waiting = False
        self._no_load = False  # the last fresh reading lacked the measured load's figures (said once a change)
        self._evidence: str | None = None
        self._unknown: frozenset[str] = frozenset()
        self._rejected: tuple[str, ...] = ()
        self._offered: float | None = None
        # A state change is logged once per change of the budget; the others in between
        # are counted and said with the next budget change (``flaps``).
        self._state_said = False
        self._flaps = 0
        self._logged_state = self.state
        self._state_since = clock()
        self.on_feed = on_feed
        self._feed_lost: bool | None = None  # what on_feed was last told (None: nothing yet)
        self.metrics.budget.set(self.configured_w)

    @property
    def configured_w(self) -> float:
        """The configured budget (W), as the arbiter holds it."""
        return self.sink.configured_w

    # -- the side-channel protocol ---------------------------------------------------------
    def on_tick(self, report: TickReport) -> None:
        snap = report.snapshot
        self.bank(self.clock(), snap.sum_power_known_w, snap.floor_w)

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        """A reload: the budget rules in ``settings.ups`` apply at once (the daemon has
        kept the running connection settings where they changed, and said so)."""
        if not ok or settings is None or settings.ups is None:
            return
        self.reload(settings.ups, None if settings.feed is None else settings.feed.feed())

    # -- the tick side (event-loop thread, between ticks; must not block) --------------
    def bank(self, now: float, board_w: float | None, floor_w: float | None) -> None:
        """One tick's bank: summed GPU board power (W; None: unknown) and the floor (W)."""
        if board_w is not None:
            self._board.append((now, board_w))
            self.guard.own_draw(now, board_w)
        while self._board and now - self._board[0][0] > BOARD_WINDOW_S:
            self._board.popleft()
        self.floor_w = floor_w
        if self.guard.silent:
            self.guard.silence(now)  # the stale-as-on-battery delay runs on the tick clock
        age = self.guard.data_age_s(now)
        _set_or_nan(self.metrics.age, age)
        self._offer(now)
        self._settle(now)

    def board_power_w(self) -> float | None:
        """The lowest summed GPU board power of the last :data:`BOARD_WINDOW_S` (W)."""
        return min((w for _, w in self._board), default=None)

    def reload(self, cfg: UpsConfig, feed: Feed | None) -> None:
        """New budget rules (and poll interval) in force from now; the connection stays."""
        self.cfg = cfg.model_copy(update={"host": self.cfg.host, "port": self.cfg.port, "name": self.cfg.name,
                                          "username": self.cfg.username, "password": self.cfg.password,
                                          "timeout_s": self.cfg.timeout_s})
        self.feed = feed
        self.guard.params = guard_params(self.cfg, feed)
        log.info("ups_reloaded", poll_s=self.cfg.poll_s, online_hold_s=self.cfg.online_hold_s,
                 on_battery_budget_w=self.cfg.on_battery_budget_w, on_battery_fraction=self.cfg.battery_fraction(),
                 stale_as_on_battery=self.cfg.stale_as_on_battery)
        self._offer(self.clock())

    def record(self) -> dict[str, Any]:
        """The UPS for the flight recorder's records (see ``powerlog.recorder``)."""
        r = self.guard.last
        c = self.constraint
        return {
            "state": self.state,
            "status": None if r is None or r.flags is None else " ".join(sorted(r.flags)) or None,
            "load_pct": None if r is None else r.load_pct,
            "realpower_w": None if r is None or r.wall_w() is None else round(r.wall_w() or 0.0, 1),
            "runtime_s": None if r is None else r.battery_runtime_s,
            "charge_pct": None if r is None else r.battery_charge_pct,
            "budget_w": None if c.budget_w is None else round(c.budget_w, 1),
            "reason": c.reason,
        }

    # -- polling ------------------------------------------------------------------------
    async def run(self) -> None:
        """Poll until cancelled; every failure is a silence and a retry, never a raise."""
        client = self.client_factory(self.cfg)
        backoff = Backoff(self.cfg.poll_s, self.cfg.reconnect_max_s)
        try:
            while True:
                started = self.clock()
                try:
                    variables = await client.list_vars(self.cfg.name)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - classified; the task must live on
                    cause = classify(exc)
                    if cause == "error" and not isinstance(exc, aionut.NUTError):
                        log.exception("ups_poll_failed")
                    self.failed(cause, f"{type(exc).__name__}: {exc}"[:MAX_SHOWN])
                    await self._sleep(backoff.next_s() * random.uniform(0.8, 1.0))
                    continue
                backoff.reset()
                self.variables(variables)
                await self._sleep(max(0.0, started + self.cfg.poll_s - self.clock()))
        finally:
            client.shutdown()

    def variables(self, variables: Mapping[str, str]) -> None:
        """One poll's answer (NUT name -> text); ``ups.status`` missing means stale."""
        now = self.clock()
        self.polls += 1
        reading = parse_vars(variables)
        if reading.waiting and not reading.flags:
            # NUT's WAIT: upsd has no data from the driver yet (it serves it after each
            # start). No status, no event: the budget in force is kept, said once at info.
            if not self._waiting:
                log.info("ups_no_data_yet", ups=f"{self.cfg.name}@{self.cfg.host}:{self.cfg.port}",
                         detail="upsd serves WAIT until its driver's first data: the budget in force is kept")
            self._waiting = True
            self.guard.silence(now)
            self._offer(now)
            return
        self._waiting = False
        self._note_values(reading)
        self._note_measured_load(reading)
        self.metrics.reading(reading)
        self.guard.observe(reading, now, board_w=None, configured_w=self.configured_w)
        self._note_evidence()
        self._note_plausibility()
        if not reading.flags:
            self.metrics.polls_failed.labels("stale").inc()
            self._set_state("stale", "ups.status missing, unreadable or without a known flag: the UPS's state is unknown")
        else:
            self._set_state("ok", f"ups.status {' '.join(sorted(reading.flags))}")
        self._offer(now)

    def failed(self, cause: str, detail: str) -> None:
        """A poll that gave nothing usable: a silence with ``cause`` (one of :data:`CAUSES`)."""
        now = self.clock()
        self.metrics.polls_failed.labels(cause).inc()
        self.guard.silence(now)
        self._set_state(cause, detail)
        self._offer(now)

    # -- the offer ----------------------------------------------------------------------
    def _offer(self, now: float) -> None:
        lost = self.guard.feed_lost(now)
        if self.on_feed is not None and lost is not None and lost != self._feed_lost:
            self._feed_lost = lost
            self.on_feed(lost)
        c = self.guard.evaluate(now, self.configured_w, self.floor_w)
        if c != self.constraint:
            old = self.constraint
            self.constraint = c
            for reason in REASONS:
                self.metrics.limiting.labels(reason).set(1 if reason == c.reason else 0)
            if c.budget_w != old.budget_w:  # a reason alone changing (on battery <-> stale) is no news
                event = log.info if c.budget_w is None else log.warning
                event("ups_budget", budget_w=None if c.budget_w is None else round(c.budget_w, 1), reason=c.reason,
                      was_w=None if old.budget_w is None else round(old.budget_w, 1), was_reason=old.reason,
                      configured_w=self.configured_w, state=self.state, flaps=self._flaps, detail=self._detail())
                self._flaps, self._state_said = 0, False
        self.metrics.budget.set(self.configured_w if c.budget_w is None else c.budget_w)
        if c.budget_w != self._offered:
            if c.budget_w is None:
                self.sink.withdraw(SOURCE)
            else:
                self.sink.offer(SOURCE, c.budget_w, now)
            self._offered = c.budget_w

    def _detail(self) -> dict[str, Any]:
        r = self.guard.last
        if r is None:
            return {"state": self.state}
        return {
            "state": self.state, "status": None if r.flags is None else " ".join(sorted(r.flags)),
            "load_pct": r.load_pct, "realpower_w": r.wall_w(), "runtime_s": r.battery_runtime_s,
            "charge_pct": r.battery_charge_pct,
        }

    # -- logging, once per change ---------------------------------------------------------
    def _note_values(self, r: UpsReading) -> None:
        if r.flags and r.flags != self._flags:  # the first status after a reconnect is news only if it changed
            was = None if self._flags is None else " ".join(sorted(self._flags))
            now_flags = " ".join(sorted(r.flags)) or "(none)"
            alarming = bool(r.flags & {"OB", "LB", "FSD", "OVER"})
            (log.warning if alarming else log.info)(
                "ups_status_changed", status=now_flags, was=was, load_pct=r.load_pct, realpower_w=r.wall_w(),
                runtime_s=r.battery_runtime_s, charge_pct=r.battery_charge_pct,
            )
            self._flags = r.flags
        if r.unknown_flags != self._unknown:
            if r.unknown_flags:
                log.warning("ups_unknown_flags", flags=sorted(r.unknown_flags)[:8],
                            detail="not NUT status flags: shown, never acted on")
            self._unknown = r.unknown_flags
        for name in r.rejected:  # only ups.status and the BOUNDS variables are ever rejected
            self.metrics.rejected.labels(name).inc()
        if r.rejected != self._rejected:
            if r.rejected:
                log.warning("ups_values_rejected", variables=list(r.rejected),
                            detail="non-numeric or out of bounds: ignored, the budget is not raised by them")
            self._rejected = r.rejected

    def _note_measured_load(self, r: UpsReading) -> None:
        """The measured load configured but the UPS gives no real power (``ups.realpower``,
        or ``ups.load`` with ``ups.realpower.nominal``): the plug is then not held to its
        limit on it, so say so once (and once when the figures come)."""
        if self.guard.params.wall_limit_w is None or not r.flags:
            return
        missing = r.wall_w() is None
        if missing == self._no_load:
            return
        self._no_load = missing
        if missing:
            log.warning("ups_measured_load_unavailable", ups=f"{self.cfg.name}@{self.cfg.host}:{self.cfg.port}",
                        load_pct=r.load_pct, rejected=list(r.rejected),
                        detail="the UPS gives no usable ups.realpower, nor ups.load with ups.realpower.nominal: "
                               "the plug is not held to its limit on the UPS's measured load (the rest of the UPS "
                               "rules apply). Set the driver's override.ups.realpower.nominal (ups.conf), or use "
                               "another meter ([pdu], [mqtt.wall_meter])")
        else:
            log.info("ups_measured_load_available", ups=f"{self.cfg.name}@{self.cfg.host}:{self.cfg.port}",
                     realpower_w=r.wall_w())

    def _note_evidence(self) -> None:
        """On battery without ``OB`` (or back): one line per change, naming the evidence."""
        ev = self.guard.evidence
        for e in EVIDENCE:
            self.metrics.on_battery.labels(e).set(1 if e == ev else 0)
        if ev == self._evidence:
            return
        was, self._evidence = self._evidence, ev
        if ev is not None and ev != "OB":
            r = self.guard.last
            log.warning("ups_on_battery_inferred", evidence=ev, was=was,
                        status=None if r is None or r.flags is None else " ".join(sorted(r.flags)),
                        charge_pct=None if r is None else r.battery_charge_pct,
                        input_voltage_v=None if r is None else r.input_voltage_v,
                        detail={"OL DISCHRG": "the UPS says OL but discharges and the charge falls (NUT's "
                                              "onlinedischarge case): the mains are taken as lost",
                                "input.voltage": "the UPS says OL but its input voltage is near 0 V: the mains "
                                                 "are taken as lost"}[ev])

    def _note_plausibility(self) -> None:
        """The measured load's verdict: a metric per rejection, one line per change of trust."""
        v = self.guard.verdict
        if v is None:
            return
        if v.reason is not None:
            self.metrics.implausible.labels(v.reason).inc()
        self.metrics.trusted.set(1 if v.trusted else 0)
        if v.changed:
            kept = self.constraint.budget_w
            if v.trusted:
                log.info("budget_input_trusted", source=SOURCE, value_w=v.value_w, own_board_w=round(v.own_board_w, 1),
                         detail=v.detail)
            else:
                log.warning("budget_input_implausible", source=SOURCE, reason=v.reason, value_w=v.value_w,
                            own_board_w=round(v.own_board_w, 1), detail=v.detail,
                            ups_budget_kept_w=None if kept is None else round(kept, 1))

    def _set_state(self, state: str, detail: str) -> None:
        for s in STATES:
            self.metrics.state.labels(s).set(1 if s == state else 0)
        if state == self.state:
            return
        old, self.state = self.state, state
        self._state_since = self.clock()
        if self._state_said:  # flapping: one line per change of the budget, with the count
            self._flaps += 1
            return
        self._state_said = old != "waiting"  # the first answer after start is no flap
        self._log_state(old, detail)

    def _log_state(self, old: str, detail: str, **extra: Any) -> None:
        state = self.state
        self._logged_state = state
        where = f"{self.cfg.name}@{self.cfg.host}:{self.cfg.port}"
        if state == "ok":
            log.info("ups_ok", ups=where, was=old, detail=detail, **extra)
        else:
            kept = self.constraint.budget_w
            log.warning(
                "ups_unavailable", ups=where, state=state, was=old, detail=detail,
                ups_budget_kept_w=None if kept is None else round(kept, 1),
                action=_ADVICE.get(state, ""), **extra,
            )

    def _settle(self, now: float) -> None:
        """Flapping that has stopped (a state steady for :data:`SETTLE_S`): say the state
        with the count of flaps, and say the next change at once again."""
        if self._flaps and now - self._state_since >= SETTLE_S:
            flaps, self._flaps, self._state_said = self._flaps, 0, False
            self._log_state(self._logged_state, f"steady for {SETTLE_S:g} s", flaps=flaps)


_ADVICE = {
    "unreachable": "is upsd running and listening there (LISTEN in upsd.conf)? the budget in force is kept",
    "stale": "upsd has no fresh data from the driver: check the driver (upsdrvctl) and the cable",
    "unknown_ups": "upsd does not serve that UPS name: see `upsc -l HOST` and [ups] name",
    "auth_failed": "upsd refused the username or password: see upsd.users and [ups] username/password",
    "error": "an unexpected answer from upsd; the budget in force is kept",
}


def _client(cfg: UpsConfig) -> aionut.AIONUTClient:
    return aionut.AIONUTClient(
        cfg.host, cfg.port,
        username=cfg.username,
        password=None if cfg.password is None else cfg.password.get_secret_value(),
        timeout=cfg.timeout_s,
        persistent=True,
    )


__all__ = ["BudgetSink", "CAUSES", "KNOWN_FLAGS", "SOURCE", "UpsChannel", "UpsMetrics", "classify", "guard_params"]
