"""Prometheus metrics: what each card is capped at and draws, and how the bank stands.

Names carry the ``powerbudgetd_`` prefix and base units (W, J, s). Per-card series are
labelled ``gpu`` (index), ``UUID`` and ``modelName``, spelled as dcgm-exporter spells
them, so a dashboard can join our caps with its draw; no hostname label (the scrape
target adds ``instance``).

The daemon feeds :class:`Metrics` from its tick listener hook (cheap: a snapshot of
the controller's state and a few counter increments on the event loop); the HTTP
server answers scrapes from its own threads and renders that snapshot. Energy is the
one NVML read done at scrape time, not per tick: ``nvmlDeviceGetTotalEnergyConsumption``
costs ~3 ms median, 16 ms p99 on an H200 (brief), too much for a 100 ms control loop
but nothing for a scrape every 15 s.
"""

from __future__ import annotations

import asyncio
import platform
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from powerbudgetd import __version__
from powerbudgetd.errors import NvmlError
from powerbudgetd.core.model import Mode, Role

if TYPE_CHECKING:
    from powerbudgetd.control.controller import CardState, Controller, TickReport
    from powerbudgetd.service.daemon import Daemon
    from powerbudgetd.hw.nvml import Nvml

DEFAULT_PORT = 19400  # outside 9100-9999 (all claimed by exporters); not 9400 (dcgm-exporter)
CARD_LABELS = ("gpu", "UUID", "modelName")  # dcgm-exporter's spelling
# Every kind an NvmlError can carry, so each card's error counters start at 0 and the
# first error shows in increase() (a series born at 1 does not).
ERROR_KINDS = tuple(dict.fromkeys([NvmlError.kind] + [cls.kind for cls in NvmlError.__subclasses__()]))
# Tick durations: a tick is a few NVML reads (~2 us each) plus the occasional write
# (~0.2 ms); the upper buckets catch a stalled driver against the 100 ms period.
TICK_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True)
class _Card:
    labels: tuple[str, str, str]
    uuid: str
    role: str
    min_w: float | None
    max_w: float | None
    limit_w: float | None  # requested limit, read back from the card
    enforced_w: float | None
    draw_w: float | None  # 1 s average
    instant_w: float | None
    contested_w: float | None  # the limit another tool keeps writing, while contested
    excursions: int  # instant draw rising above the enforced limit (load onsets)
    peak_excursion_w: float | None


@dataclass(frozen=True)
class _Snapshot:
    budget_w: float
    sum_limits_w: float
    sum_draw_w: float | None
    mode: str
    cards: tuple[_Card, ...]


def _w(mw: int | None) -> float | None:
    return None if mw is None else mw / 1000


def card_labels(c: CardState) -> tuple[str, str, str]:
    """``(gpu, UUID, modelName)`` label values of one card."""
    return (str(c.index), c.uuid, c.info.name)


class Metrics:
    """The daemon's metrics on ``registry`` (pass a fresh one; never the global).

    Wire it with :meth:`attach`; serve it with :func:`serve`. Thread-safe: the tick
    listener runs on the event loop, scrapes on the HTTP server's threads. ``clock``
    (s) is the clock of ``TickReport.now``; ``wall_clock`` (Unix s) stamps timestamps.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self._clock = clock  # the clock of TickReport.now (attach takes the daemon's)
        self._wall = wall_clock
        self._snapshot: _Snapshot | None = None
        # The NVML layer energy is read from at scrape time, set only while NVML is up
        # (attach does that for the daemon's lifetime); None: no energy series.
        self.nvml: Nvml | None = None
        self._no_energy: set[str] = set()
        self._labels: dict[str, tuple[str, str, str]] = {}
        self._read_errors_seen: dict[tuple[str, str], int] = {}

        self.tick_duration = Histogram(
            "powerbudgetd_tick_duration_seconds",
            "Wall time of one control tick (reads, decisions, writes), start to the metrics listener",
            buckets=TICK_BUCKETS_S, registry=registry,
        )
        self.last_tick = Gauge(
            "powerbudgetd_last_tick_timestamp_seconds",
            "Unix time at which the last control tick completed", registry=registry,
        )
        self.limit_changes = Counter(
            "powerbudgetd_gpu_limit_changes",
            "Power limit writes that NVML accepted, by reason (boot, lend, reclaim, release, fail_static, shutdown, ...)",
            [*CARD_LABELS, "reason"], registry=registry,
        )
        self.nvml_errors = Counter(
            "powerbudgetd_nvml_errors",
            "NVML calls that failed, by kind (reads each tick, limit writes, energy reads at scrape time)",
            [*CARD_LABELS, "kind"], registry=registry,
        )
        self.reload_success = Gauge(
            "powerbudgetd_config_last_reload_success",
            "1 if the last configuration load succeeded, 0 if it failed (the previous one stays in force)",
            registry=registry,
        )
        self.reload_timestamp = Gauge(
            "powerbudgetd_config_last_reload_timestamp_seconds",
            "Unix time of the last configuration load, successful or not", registry=registry,
        )
        Info("powerbudgetd_build", "powerbudgetd build", registry=registry).info(
            {"version": __version__, "python_version": platform.python_version()}
        )
        registry.register(_StateCollector(self))

    # -- hooks ----------------------------------------------------------------------
    def attach(self, daemon: Daemon) -> None:
        """Listen to ``daemon``'s ticks, and read energy only while its NVML is up."""
        self._clock = daemon.clock
        daemon.listeners.append(self.on_tick)
        daemon.services.append(self._nvml_service)
        daemon.reload_listeners.append(self.reload_result)

    async def _nvml_service(self, daemon: Daemon) -> None:
        # Services run between NVML init and shutdown: no scrape reads energy outside.
        self.nvml = daemon.nvml
        try:
            await asyncio.Event().wait()
        finally:
            self.nvml = None

    def reload_result(self, ok: bool) -> None:
        """Record a configuration load (at start, and on each reload): ``ok`` or failed."""
        self.reload_success.set(1 if ok else 0)
        self.reload_timestamp.set(self._wall())

    def on_tick(self, report: TickReport, ctl: Controller) -> None:
        """The daemon's tick listener: called with each (TickReport, Controller); never blocks."""
        self.tick_duration.observe(max(0.0, self._clock() - report.now))
        self.last_tick.set(self._wall())
        for c in ctl.cards:
            if c.uuid not in self._labels:
                self._labels[c.uuid] = card_labels(c)
                for kind in ERROR_KINDS:
                    self.nvml_errors.labels(*self._labels[c.uuid], kind)
            for kind, n in c.read_errors.items():
                seen = self._read_errors_seen.get((c.uuid, kind), 0)
                if n > seen:
                    self.nvml_errors.labels(*self._labels[c.uuid], kind).inc(n - seen)
                    self._read_errors_seen[(c.uuid, kind)] = n
        for w in report.writes:
            labels = self._labels[w.uuid]
            if w.error_kind is not None:
                self.nvml_errors.labels(*labels, w.error_kind).inc()
            elif not w.dry_run:  # a dry run changes nothing
                self.limit_changes.labels(*labels, w.reason).inc()
        self._snapshot = self._snap(ctl, report.now)

    def _snap(self, ctl: Controller, now: float) -> _Snapshot:
        cards = []
        for c in ctl.cards:
            r = c.reading if c.readable else None  # an unreadable card's last values are stale
            cards.append(_Card(
                labels=self._labels[c.uuid], uuid=c.uuid, role=str(c.role),
                min_w=None if c.info.min_limit_w is None else c.min_mw / 1000,
                max_w=None if c.info.max_limit_w is None else c.max_mw / 1000,
                limit_w=None if r is None else _w(c.requested_mw),
                enforced_w=None if r is None else _w(c.enforced_mw),
                draw_w=None if r is None else r.power_avg_w,
                instant_w=None if r is None else r.power_instant_w,
                contested_w=c.contested_w if c.contested(now) else None,
                excursions=c.excursions, peak_excursion_w=c.peak_excursion_w,
            ))
        draws = [c.draw_w for c in cards]
        return _Snapshot(
            ctl.budget_mw / 1000, ctl.sum_bound_mw / 1000,
            None if any(d is None for d in draws) else sum(draws),  # type: ignore[arg-type]
            str(ctl.mode), tuple(cards),
        )

    # -- scrape time ----------------------------------------------------------------
    def _energy(self, uuid: str) -> float | None:
        nvml = self.nvml
        if nvml is None or uuid in self._no_energy:
            return None
        try:
            j = nvml.energy_j(uuid)
        except NvmlError as exc:
            self.nvml_errors.labels(*self._labels[uuid], exc.kind).inc()
            return None
        if j is None:  # not supported on this card: stop asking
            self._no_energy.add(uuid)
        return j


class _StateCollector(Collector):
    """Renders the last tick's snapshot (and energy, read now) at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def describe(self) -> Iterable[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self.m._snapshot))

    def _families(self, s: _Snapshot | None) -> Iterator[Metric]:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = (), unit: str = "") -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels, unit=unit)

        bank = {
            "budget": gauge("powerbudgetd_budget_watts", "The bank's board-power budget", unit="watts"),
            "sum_limits": gauge(
                "powerbudgetd_sum_power_limits_watts",
                "Sum over cards of the highest power limit that may be in force (requested, enforced or "
                "in flight); stays <= the budget once booted",
                unit="watts",
            ),
            "sum_draw": gauge(
                "powerbudgetd_sum_power_draw_watts",
                "Sum of the cards' 1 s average board power (absent while a card is unreadable)", unit="watts",
            ),
            "headroom": gauge(
                "powerbudgetd_headroom_watts", "Budget minus the sum of power limits", unit="watts"
            ),
        }
        mode = gauge("powerbudgetd_mode", "1 for the bank's current operating mode, 0 for the others", ("mode",))
        card = {
            "limit": gauge(
                "powerbudgetd_gpu_power_limit_watts",
                "Power limit set on the card (nvmlDeviceGetPowerManagementLimit, read back)", CARD_LABELS, "watts",
            ),
            "enforced": gauge(
                "powerbudgetd_gpu_enforced_power_limit_watts",
                "Power limit in force after every limiter (nvmlDeviceGetEnforcedPowerLimit)", CARD_LABELS, "watts",
            ),
            "min": gauge(
                "powerbudgetd_gpu_power_limit_min_watts", "Lowest power limit the card accepts", CARD_LABELS, "watts"
            ),
            "max": gauge(
                "powerbudgetd_gpu_power_limit_max_watts",
                "Highest power limit powerbudgetd will set (the card's, or lower from [cards] max_w)",
                CARD_LABELS, "watts",
            ),
            "draw": gauge(
                "powerbudgetd_gpu_power_draw_watts",
                "Board power, trailing 1 s average (nvmlDeviceGetPowerUsage)", CARD_LABELS, "watts",
            ),
            "instant": gauge(
                "powerbudgetd_gpu_power_draw_instant_watts",
                "Board power, instant (NVML field 186, refreshed every 100 ms)", CARD_LABELS, "watts",
            ),
        }
        contested = gauge(
            "powerbudgetd_gpu_contested_power_limit_watts",
            "The power limit another tool keeps writing on this card; present only while the card is "
            "contested (nothing is raised then)", CARD_LABELS, "watts",
        )
        excursions = CounterMetricFamily(
            "powerbudgetd_gpu_power_excursions",
            "Times the instant draw rose above the enforced limit (normal at load onset: the limit caps "
            "the 1 s average)", labels=CARD_LABELS,
        )
        peak = gauge(
            "powerbudgetd_gpu_power_excursion_peak_watts",
            "Highest instant draw seen above the enforced limit", CARD_LABELS, "watts",
        )
        role = gauge(
            "powerbudgetd_gpu_role", "1 for the card's current role, 0 for the others", (*CARD_LABELS, "role")
        )
        energy = CounterMetricFamily(
            "powerbudgetd_gpu_energy_joules",
            "Board energy since the driver loaded (nvmlDeviceGetTotalEnergyConsumption), read at scrape time",
            labels=CARD_LABELS, unit="joules",
        )
        if s is not None:
            bank["budget"].add_metric([], s.budget_w)
            bank["sum_limits"].add_metric([], s.sum_limits_w)
            if s.sum_draw_w is not None:
                bank["sum_draw"].add_metric([], s.sum_draw_w)
            bank["headroom"].add_metric([], s.budget_w - s.sum_limits_w)
            for m in Mode:
                mode.add_metric([str(m)], 1.0 if str(m) == s.mode else 0.0)
            for c in s.cards:
                for key, value in (
                    ("limit", c.limit_w), ("enforced", c.enforced_w), ("min", c.min_w), ("max", c.max_w),
                    ("draw", c.draw_w), ("instant", c.instant_w),
                ):
                    if value is not None:  # unknown is absent, never 0 W
                        card[key].add_metric(list(c.labels), value)
                for r in Role:
                    role.add_metric([*c.labels, str(r)], 1.0 if str(r) == c.role else 0.0)
                if c.contested_w is not None:
                    contested.add_metric(list(c.labels), c.contested_w)
                excursions.add_metric(list(c.labels), c.excursions)
                if c.peak_excursion_w is not None:
                    peak.add_metric(list(c.labels), c.peak_excursion_w)
                j = self.m._energy(c.uuid)
                if j is not None:
                    energy.add_metric(list(c.labels), j)
        yield from bank.values()
        yield mode
        yield from card.values()
        yield role
        yield contested
        yield excursions
        yield peak
        yield energy


def serve(registry: CollectorRegistry, address: str, port: int) -> WSGIServer:
    """Serve ``registry`` on ``http://address:port/metrics`` from a daemon thread.

    Returns the server (``shutdown()`` it to stop). Raises OSError when the address
    cannot be bound (port in use, address not on this host).
    """
    httpd, _thread = start_http_server(port, addr=address, registry=registry)
    return httpd
