"""A polled meter (a PDU over SNMP, the host's BMC over Redfish) turned into a budget
offer, through the sensor model every measured source goes through.

Two halves on the daemon's event-loop thread, as the UPS's:

- :meth:`MeterChannel.run` asks the meter every ``poll_s`` through its ``read``
  coroutine (``channels.pdu``, ``channels.bmc``: the protocol is theirs) and passes the
  figure to :meth:`MeterChannel.figure`: a raw "no data" value or a figure that is not
  watts is refused by the plausibility rule (``core.plausible``); any other goes to the
  source's :class:`~powerbudgetd.core.sensor.MeterLoop` (each change used once, paired
  with our own draw when it was taken, frozen figures caught, a bounded rise). A read
  that fails is a *silence* with a cause (:data:`CAUSES`): one warning per change, a
  metric, the budget in force kept; polls back off until the meter answers again.
- :meth:`MeterChannel.on_tick` records the cards' board power (what the readings are
  paired with) and the figure's age.

The budget is offered to the daemon's budget arbiter under the source's name (``pdu``,
``bmc``): an offer can only lower the budget. A rejected figure or a silence keeps the
last good budget, never raises it.
"""

from __future__ import annotations

import asyncio
import random
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import structlog
from prometheus_client import REGISTRY, CollectorRegistry

from powerbudgetd.channels import metricnames as names
from powerbudgetd.channels.ups import BudgetSink
from powerbudgetd.core.backoff import Backoff
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.pdumib import Figure
from powerbudgetd.core.plausible import REASONS, Verdict, not_watts
from powerbudgetd.core.sensor import LoopParams, MeterLoop

if TYPE_CHECKING:
    from powerbudgetd.config.meters import _PolledMeter
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.config import Settings

log = structlog.get_logger("powerbudgetd")

CAUSES = ("unreachable", "timeout", "auth_failed", "absent", "garbled", "error")
STATES = ("waiting", "ok", "implausible", *CAUSES)
MAX_SHOWN = 160  # characters of an agent's error quoted in logs


class MeterError(Exception):
    """A read that gave no figure; ``cause``: one of :data:`CAUSES`."""

    def __init__(self, cause: str, message: str) -> None:
        if cause not in CAUSES:
            raise ValueError(f"cause must be one of {CAUSES}, got {cause!r}")
        super().__init__(message)
        self.cause = cause


class MeterMetrics:
    """A polled meter's series, labelled ``source``; a figure not known is NaN, never 0."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.state = names.gauge(names.METER_STATE, registry)
        self.power = names.gauge(names.METER_POWER, registry)
        self.part = names.gauge(names.METER_PART_POWER, registry)
        self.age = names.gauge(names.METER_READING_AGE, registry)
        self.budget = names.gauge(names.METER_BUDGET, registry)
        self.trusted = names.gauge(names.METER_TRUSTED, registry)
        self.implausible = names.counter(names.METER_READINGS_IMPLAUSIBLE, registry)
        self.failed = names.counter(names.METER_POLLS_FAILED, registry)


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, MeterMetrics] = weakref.WeakKeyDictionary()


def meter_metrics(registry: CollectorRegistry) -> MeterMetrics:
    """The one :class:`MeterMetrics` of ``registry`` (the PDU and the BMC share the series)."""
    found = _METRICS.get(registry)
    if found is None:
        found = _METRICS[registry] = MeterMetrics(registry)
    return found


class MeterChannel:
    """One polled meter: see the module docstring. ``source``: its name at the arbiter,
    in logs and metrics; ``where``: the meter for the logs; ``read``: one poll's figure
    (raises :class:`MeterError`); ``feed``: the PSU efficiency and, where ``cfg.limit_w``
    is not given, the plug-side limit. Raises ValueError with neither."""

    def __init__(self, source: str, cfg: _PolledMeter, where: str, read: Callable[[], Awaitable[Figure]],
                 sink: BudgetSink, feed: Feed, *, registry: CollectorRegistry = REGISTRY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        limit = cfg.limit_w if cfg.limit_w is not None else feed.wall_limit_w()
        if limit is None:
            raise ValueError(f"[{source}] needs limit_w, or a [feed] with breaker_a or ups_w")
        self.source, self.cfg, self.where, self.read, self.sink, self.clock = source, cfg, where, read, sink, clock
        self.limit_w = limit
        self.loop = MeterLoop(source, LoopParams(limit, feed.psu_efficiency, cfg.hysteresis_w, cfg.reach()))
        self.metrics = meter_metrics(registry)
        self.state = "waiting"
        self.value_w: float | None = None  # the last figure accepted (W)
        self.polls = 0
        self._offered: float | None = None
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        for state in STATES:
            self.metrics.state.labels(source, state).set(1 if state == "waiting" else 0)
        for reason in REASONS:
            self.metrics.implausible.labels(source, reason)
        for cause in CAUSES:
            self.metrics.failed.labels(source, cause)
        self.metrics.power.labels(source).set(float("nan"))
        self.metrics.age.labels(source).set(float("nan"))
        self.metrics.trusted.labels(source).set(1)
        self.metrics.budget.labels(source).set(sink.configured_w)

    # -- the side-channel protocol ---------------------------------------------------------
    def on_tick(self, report: TickReport) -> None:
        self.bank(self.clock(), report.snapshot.sum_power_known_w)

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        """The connection and rules stay as started (a restart applies new ones)."""

    def bank(self, now: float, board_w: float | None) -> None:
        """One tick's summed GPU board power (W; None: unknown) and the figure's age."""
        if board_w is not None:
            self.loop.own_draw(now, board_w)
        changed = self.loop.sensor.changed_at
        self.metrics.age.labels(self.source).set(float("nan") if changed is None else max(0.0, now - changed))

    # -- polling -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Poll until cancelled; every failure is a silence and a retry, never a raise."""
        backoff = Backoff(self.cfg.poll_s, self.cfg.reconnect_max_s)
        while True:
            started = self.clock()
            try:
                async with asyncio.timeout(self.cfg.timeout_s * 2 + 1):  # not wait_for: it may swallow a cancel (3.11)
                    fig = await self.read()
            except asyncio.CancelledError:
                raise
            except MeterError as exc:
                self.failed(exc.cause, str(exc))
                await self._sleep(backoff.next_s() * random.uniform(0.8, 1.0))
                continue
            except TimeoutError:
                self.failed("timeout", f"no answer within {self.cfg.timeout_s * 2 + 1:g} s")
                await self._sleep(backoff.next_s() * random.uniform(0.8, 1.0))
                continue
            except Exception as exc:  # noqa: BLE001 - the task must live on
                log.exception("meter_poll_failed", source=self.source)
                self.failed("error", f"{type(exc).__name__}: {exc}")
                await self._sleep(backoff.next_s() * random.uniform(0.8, 1.0))
                continue
            backoff.reset()
            self.figure(fig)
            await self._sleep(max(0.0, started + self.cfg.poll_s - self.clock()))

    def figure(self, fig: Figure) -> Verdict | None:
        """One poll's figure: refused (raw sentinel, not watts), or a poll of the loop.
        Returns the plausibility verdict (None: nothing to check, no own draw yet, or
        the same figure again)."""
        now = self.clock()
        self.polls += 1
        for part, watts in fig.parts.items():
            self.metrics.part.labels(self.source, part).set(watts)
        why = ("a no-data value" if fig.sentinel
               else not_watts(fig.value_w, fig.units, fig.apparent_va, fig.resolution_w))
        if why is not None:
            verdict = self.loop.reject("sentinel" if fig.sentinel else "not_watts", fig.value_w, why)
        else:
            verdict = self.loop.poll(fig.value_w, now, self.sink.configured_w, resolution_w=fig.resolution_w)
        self._note(verdict, fig)
        self._offer(now)
        return verdict

    def failed(self, cause: str, detail: str) -> None:
        """A poll that gave no figure: a silence with ``cause``; the budget in force is kept."""
        self.metrics.failed.labels(self.source, cause).inc()
        self.loop.gap()
        self._set_state(cause, detail[:MAX_SHOWN])

    # -- the offer and the log -----------------------------------------------------------------
    def _note(self, verdict: Verdict | None, fig: Figure) -> None:
        if verdict is None:
            if self.state in ("waiting", *CAUSES) and self.loop.reading is not None:
                self._set_state("ok", f"{self.loop.sensor.value_w:g} W")
            return
        if verdict.reason is not None:
            self.metrics.implausible.labels(self.source, verdict.reason).inc()
        self.metrics.trusted.labels(self.source).set(1 if verdict.trusted else 0)
        if not verdict.plausible:
            kept = self.loop.budget_w
            if verdict.changed or self.state != "implausible":
                log.warning("budget_input_implausible", source=self.source, meter=self.where, reason=verdict.reason,
                            value_w=verdict.value_w, own_board_w=round(verdict.own_board_w, 1), detail=verdict.detail,
                            meter_budget_kept_w=None if kept is None else round(kept, 1))
            self._set_state("implausible", verdict.detail, said=True)
            return
        self.value_w = fig.value_w
        self.metrics.power.labels(self.source).set(fig.value_w)
        if verdict.changed and verdict.trusted:
            log.info("budget_input_trusted", source=self.source, meter=self.where, value_w=verdict.value_w,
                     detail=verdict.detail)
        self._set_state("ok", verdict.detail)

    def _offer(self, now: float) -> None:
        budget = self.loop.budget_w
        configured = self.sink.configured_w
        self.metrics.budget.labels(self.source).set(configured if budget is None else min(budget, configured))
        if budget == self._offered:
            return
        if budget is None:
            self.sink.withdraw(self.source)
        else:
            self.sink.offer(self.source, budget, now)
        log.info(f"{self.source}_budget", budget_w=None if budget is None else round(budget, 1),
                 was_w=None if self._offered is None else round(self._offered, 1), configured_w=configured,
                 value_w=self.loop.sensor.value_w, own_board_w=self.loop.paired_w, meter=self.where)
        self._offered = budget

    def _set_state(self, state: str, detail: str, *, said: bool = False) -> None:
        for s in STATES:
            self.metrics.state.labels(self.source, s).set(1 if s == state else 0)
        if state == self.state:
            return
        old, self.state = self.state, state
        if said:
            return
        if state == "ok":
            log.info(f"{self.source}_ok", meter=self.where, was=old, detail=detail)
        else:
            kept = self.loop.budget_w
            log.warning(f"{self.source}_unavailable", meter=self.where, state=state, was=old, detail=detail,
                        meter_budget_kept_w=None if kept is None else round(kept, 1))

    def record(self) -> dict[str, object]:
        """The meter for the flight recorder and status: state, last figure, budget."""
        budget = self.loop.budget_w
        return {"state": self.state, "value_w": self.value_w,
                "budget_w": None if budget is None else round(budget, 1)}


__all__ = ["CAUSES", "MeterChannel", "MeterError", "MeterMetrics", "STATES", "meter_metrics"]
