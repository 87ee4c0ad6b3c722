"""The host's own draw measured: the CPU packages' RAPL power (``hw.rapl``,
``core.rapl``) plus ``[rapl] other_w`` in place of the constant ``[feed] host_w`` where
it is higher, and the board budget the feed then allows offered to the budget arbiter
under the source name ``rapl`` (an offer can only lower the budget).

Sampled on the tick (a few small sysfs reads), a window every ``window_s``. A counter
that cannot be read is said once (``rapl_unavailable``, naming the file) and the offer
withdrawn: the feed's budget on ``host_w`` alone is back in force.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from prometheus_client import REGISTRY, CollectorRegistry

from powerbudgetd.channels import metricnames as names
from powerbudgetd.channels.ups import BudgetSink
from powerbudgetd.config import FeedConfig
from powerbudgetd.config.meters import RaplConfig
from powerbudgetd.core.rapl import RaplPower
from powerbudgetd.hw.rapl import RaplError, package_zones, read_zones

if TYPE_CHECKING:
    from powerbudgetd.config import Settings
    from powerbudgetd.control.report import TickReport

log = structlog.get_logger("powerbudgetd")

SOURCE = "rapl"


class RaplMetrics:
    """The measured host draw's series: the packages' power, its age, the draw in force."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.cpu = names.gauge(names.HOST_CPU_POWER, registry)
        self.host = names.gauge(names.HOST_DRAW, registry)
        self.age = names.gauge(names.HOST_CPU_POWER_AGE, registry)


class RaplChannel:
    """See the module docstring. ``feed``: the ``[feed]`` whose ``host_w`` the measured
    draw stands in for; ``state``: ``waiting``, ``ok`` or ``unreadable``."""

    def __init__(self, cfg: RaplConfig, feed: FeedConfig, sink: BudgetSink, *, registry: CollectorRegistry = REGISTRY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg, self.feed, self.sink, self.clock = cfg, feed, sink, clock
        self.power = RaplPower(cfg.window_s)
        self.state = "waiting"
        self.cpu_w: float | None = None  # the packages' power over the last window (W)
        self.host_w: float | None = None  # the host draw in force: max(host_w, packages + other_w) (W)
        self.budget_w: float | None = None  # the feed's board budget on it (W)
        self._zones: list[Path] | None = None
        metrics = RaplMetrics(registry)
        self.metrics_cpu, self.metrics_host, self.metrics_age = metrics.cpu, metrics.host, metrics.age
        self._sampled_at: float | None = None
        for g in (self.metrics_cpu, self.metrics_age):
            g.set(float("nan"))
        self.metrics_host.set(feed.host_w)

    def on_tick(self, report: TickReport) -> None:
        self.sample(self.clock())

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        """``[rapl]`` and ``[feed]`` as started stay (a restart applies new ones)."""

    async def run(self) -> None:
        await asyncio.Event().wait()  # nothing to poll: the tick samples

    def sample(self, now: float) -> None:
        """Read the counters; at a window's end, the power and the budget it allows."""
        if self._sampled_at is not None:
            self.metrics_age.set(now - self._sampled_at)
        try:
            if self._zones is None:
                self._zones = package_zones(self.cfg.root)
            zones = read_zones(self._zones)
            watts = self.power.add(now, zones)
        except (RaplError, ValueError) as exc:
            self._zones = None
            self.power.reset()
            self._unreadable(str(exc))
            return
        if watts is None:
            return
        self._sampled_at = now
        self.metrics_age.set(0.0)
        self.cpu_w = watts
        self.host_w = max(self.feed.host_w, watts + self.cfg.other_w)
        self.budget_w = self.feed.model_copy(update={"host_w": self.host_w}).board_budget_w()
        self.metrics_cpu.set(watts)
        self.metrics_host.set(self.host_w)
        if self.state != "ok":
            log.info("rapl_ok", zones=[z.name for z in self._zones or []], cpu_w=round(watts, 1),
                     host_w=round(self.host_w, 1), was=self.state,
                     detail=f"the host's draw is measured: packages + other_w {self.cfg.other_w:g} W, "
                            f"at least [feed] host_w {self.feed.host_w:g} W")
            self.state = "ok"
        if self.host_w > self.feed.host_w:  # the feed's lines at the highest transient factor: never above
            self.sink.offer(SOURCE, max(0.0, self.budget_w), now)
        else:  # host_w's budget (worked out for the cards found) is the one in force
            self.sink.withdraw(SOURCE)

    def _unreadable(self, detail: str) -> None:
        self.metrics_cpu.set(float("nan"))
        self.metrics_host.set(self.feed.host_w)
        self.cpu_w = self.host_w = self.budget_w = None
        self.sink.withdraw(SOURCE)
        if self.state != "unreadable":
            log.warning("rapl_unavailable", root=str(self.cfg.root), was=self.state, detail=detail,
                        action=f"the feed's budget on [feed] host_w {self.feed.host_w:g} W is in force; energy_uj "
                               "is readable by root only (Linux 5.10 on)")
            self.state = "unreadable"


__all__ = ["SOURCE", "RaplChannel", "RaplMetrics"]
