"""The wall meter: a smart plug's or metered PDU's readings turned into a board budget
that is offered to the budget arbiter (it can only lower the budget).

From each reading and the GPUs' board power (``core.feed``)::

    non-GPU wall draw = wall power - board power / PSU efficiency
    board budget      = (plug-side limit - non-GPU wall draw) x PSU efficiency

through the sensor model every measured source goes through (``core.sensor``: each
reading used once, when it changes, paired with our board power when it was taken;
a bounded rise; ``hosts``/``share`` for a meter other controlled hosts draw through),
once the reading has passed the plausibility rule every wall figure passes
(``core.plausible``). Clock-free: ``now`` (s) is passed in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import structlog

from powerbudgetd.channels.mqtt._text import shown
from powerbudgetd.channels.mqtt.metrics import READING_ERRORS, MqttMetrics
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.meterpath import PathError, watts_at
from powerbudgetd.core.sensor import LoopParams, MeterLoop
from powerbudgetd.config import WallMeterConfig

log = structlog.get_logger("powerbudgetd")

SOURCE = "wall_meter"  # its name at the budget arbiter

__all__ = ["READING_ERRORS", "SOURCE", "ReadingError", "WallMeter", "parse_power_w"]


class ReadingError(ValueError):
    """A wall reading that must be ignored; ``reason`` is one of :data:`READING_ERRORS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_power_w(payload: bytes, path: Sequence[str]) -> float:
    """The watts at ``path`` in a JSON payload (``core.meterpath``: dotted keys, list
    items by number, ``*`` to sum a list's items).

    Raises ReadingError ``garbled`` (not JSON, path missing, not a finite number) or
    ``negative``.
    """
    try:
        value: Any = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ReadingError("garbled", f"not JSON: {shown(payload)!r}") from None
    try:
        watts = watts_at(value, path)
    except PathError as exc:
        raise ReadingError("garbled", f"{exc}: {shown(payload)!r}") from None
    except RecursionError:
        raise ReadingError("garbled", f"nested too deep: {shown(payload)!r}") from None
    if watts < 0:
        raise ReadingError("negative", f"negative wall power: {watts:g} W")
    return watts


class WallMeter:
    """A wall meter's readings turned into a board budget; clock-free (``now`` in s).

    ``state``: ``waiting`` (no reading yet), ``ok``, ``stale``, ``garbled``,
    ``negative``, ``implausible`` or ``offline``; a warning is logged once per change of
    state. A bad or missing reading keeps the last meter budget: only a fresh, valid
    reading moves it, and it never exceeds the configured budget. With an ``arbiter``
    every good reading offers the meter's budget there (source ``wall_meter``), or
    withdraws it when the meter does not limit.

    Raises ValueError when ``feed`` has no plug-side limit (neither breaker nor UPS).
    """

    def __init__(self, cfg: WallMeterConfig, feed: Feed, metrics: MqttMetrics, arbiter: BudgetArbiter | None = None) -> None:
        if feed.wall_limit_w() is None:
            raise ValueError("a wall meter needs a plug-side limit: [feed] breaker_a or ups_w")
        self.cfg = cfg
        self.feed = feed
        self.metrics = metrics
        self.arbiter = arbiter
        self.state = "waiting"
        self.wall_w: float | None = None
        self.non_gpu_w: float | None = None
        self.allowed_w: float | None = None
        self.budget_w: float | None = None  # None: the meter does not limit
        self.last_ok_at = float("-inf")
        self.started_at: float | None = None  # first age check: the daemon's first tick
        self.silence_warned = False
        limit = feed.wall_limit_w()
        assert limit is not None
        self.loop = MeterLoop(SOURCE, LoopParams(limit, feed.psu_efficiency, cfg.hysteresis_w, cfg.reach()))
        self.plausibility = self.loop.plausibility
        metrics.meter_waiting.set(1)

    def reading(
        self, payload: bytes, now: float, board_w: float | None, configured_w: float | None = None, *,
        retained: bool = False,
    ) -> None:
        """One message from the meter; ``board_w`` is the GPU board power to pair it with;
        ``configured_w`` the configured budget (default: the arbiter's)."""
        if configured_w is None:
            if self.arbiter is None:
                raise ValueError("give configured_w, or an arbiter to take it from")
            configured_w = self.arbiter.configured_w
        try:
            if retained:  # replayed by the broker on subscribe: its age is unknown
                raise ReadingError("stale", "a retained reading of unknown age")
            wall_w = parse_power_w(payload, self.cfg.power_path())
            if not self.cfg.min_w <= wall_w <= self.cfg.max_w:
                raise ReadingError(
                    "implausible", f"wall power {wall_w:g} W outside [{self.cfg.min_w:g}, {self.cfg.max_w:g}] W"
                )
            if board_w is None:
                return  # no tick yet: nothing to pair the reading with
            self.loop.own_draw(now, board_w)
            checked = self.loop.poll(wall_w, now, configured_w)
            if checked is None:  # the same figure again: no new information
                self.last_ok_at = now
                return
            verdict = checked
            if not verdict.plausible:
                hint = ": is the meter on this host's plug?" if verdict.reason == "below_own_draw" else ""
                raise ReadingError("implausible", verdict.detail + hint)
        except ReadingError as exc:
            self.metrics.ignored.labels(exc.reason).inc()
            self._set_state(exc.reason, str(exc))
            return
        non_gpu_w = self.feed.non_gpu_wall_w(wall_w, self.loop.paired_w if self.loop.paired_w is not None else board_w)
        allowed_w = self.loop.allowed_w if self.loop.allowed_w is not None else 0.0
        self.wall_w, self.non_gpu_w, self.allowed_w = wall_w, non_gpu_w, allowed_w
        self.budget_w = self.loop.budget_w
        self.last_ok_at = now
        if self.arbiter is not None:
            if self.budget_w is None:
                self.arbiter.withdraw(SOURCE)
            else:
                self.arbiter.offer(SOURCE, self.budget_w, now)
        self.metrics.wall_power(wall_w, non_gpu_w)
        self.metrics.meter_waiting.set(0)
        self.metrics.meter_budget.set(configured_w if self.budget_w is None else min(self.budget_w, configured_w))
        if not verdict.trusted:  # plausible again, not yet trusted: it may lower the budget, not raise it
            return
        detail = f"wall {wall_w:g} W, non-GPU {non_gpu_w:.0f} W, allows {allowed_w:.0f} W of board power"
        self._set_state("ok", verdict.detail if verdict.changed else detail)

    def offline(self) -> None:
        """The meter's own last will or availability says it is gone."""
        self._set_state("offline", "the meter reports itself offline")

    def check_age(self, now: float) -> None:
        if self.started_at is None:
            self.started_at = now
        if self.state == "waiting" and not self.silence_warned and now - self.started_at > self.cfg.max_age_s:
            self.silence_warned = True  # silence is a state: say it once, by topic
            log.warning(
                "wall_meter_silent", topic=self.cfg.state_topic(), waited_s=round(now - self.started_at, 1),
                detail=f"no valid reading within max_age_s ({self.cfg.max_age_s:g} s) of start: is the meter "
                "publishing under this topic? The budget is not lowered by the meter until it is heard",
            )
        if self.state == "ok" and now - self.last_ok_at > self.cfg.max_age_s:
            self.metrics.ignored.labels("stale").inc()
            self._set_state("stale", f"no reading for {self.cfg.max_age_s:g} s")

    def _set_state(self, state: str, detail: str) -> None:
        self.metrics.meter_ok.set(1 if state == "ok" else 0)
        if state == self.state:
            return
        old, self.state = self.state, state
        kept = None if self.budget_w is None else round(self.budget_w, 1)
        if state == "ok":
            log.info("wall_meter_ok", was=old, detail=detail)
        else:
            log.warning("wall_meter_ignored", state=state, was=old, detail=detail, meter_budget_kept_w=kept)
