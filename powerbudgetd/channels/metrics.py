"""Prometheus metrics: what each card is capped at and draws, and how the bank stands.

Names carry the ``powerbudgetd_`` prefix and base units (W, J, s). Per-card series are
labelled ``gpu`` (index), ``UUID`` and ``modelName``, spelled as dcgm-exporter spells
them, so a dashboard can join our caps with its draw; no hostname label (the scrape
target adds ``instance``).

The daemon feeds :class:`Metrics` each tick's bank snapshot through the side-channel
hook (cheap: a reference kept and a few counter increments on the event loop); the
HTTP server answers scrapes from its own threads and renders that snapshot. Energy is the
one NVML read done at scrape time, not per tick: ``nvmlDeviceGetTotalEnergyConsumption``
costs ~3 ms median, 16 ms p99 on an H200 (brief), too much for a 100 ms control loop
but nothing for a scrape every 15 s.
"""

from __future__ import annotations

import asyncio
import ipaddress
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from powerbudgetd import __version__
from powerbudgetd.errors import NvmlError
from powerbudgetd.core.model import Mode, Role

if TYPE_CHECKING:
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.core.snapshot import BankSnapshot, CardSnapshot
    from powerbudgetd.hw.nvml import Nvml
    from powerbudgetd.config import Settings

DEFAULT_PORT = 19400  # outside 9100-9999 (all claimed by exporters); not 9400 (dcgm-exporter)
CARD_LABELS = ("gpu", "UUID", "modelName")  # dcgm-exporter's spelling
# Every kind an NvmlError can carry, so each card's error counters start at 0 and the
# first error shows in increase() (a series born at 1 does not).
ERROR_KINDS = tuple(dict.fromkeys([NvmlError.kind] + [cls.kind for cls in NvmlError.__subclasses__()]))
# Tick durations: a tick is a few NVML reads (~2 us each) plus the occasional write
# (~0.2 ms); the upper buckets catch a stalled driver against the 100 ms period.
TICK_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def endpoint_url(address: str, port: int) -> str | None:
    """The URL of ``/metrics`` served on ``address:port`` as another host reaches it: an
    unspecified address (all interfaces) becomes this host's name. None on a loopback
    address: no other host can follow that link."""
    ip = ipaddress.ip_address(address) if _is_ip(address) else None
    if ip is not None and ip.is_loopback:
        return None
    host = socket.getfqdn() if ip is not None and ip.is_unspecified else address
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def card_labels(c: CardSnapshot) -> tuple[str, str, str]:
    """``(gpu, UUID, modelName)`` label values of one card."""
    return (str(c.index), c.uuid, c.name)


class Metrics:
    """The daemon's metrics on ``registry`` (pass a fresh one; never the global).

    A side channel: register it with ``Daemon.register``; serve it with :func:`serve`.
    Thread-safe: the hooks run on the event loop, scrapes on the HTTP server's threads.
    ``clock`` (s) is the clock of ``TickReport.now`` (the daemon's); ``wall_clock`` (Unix
    s) stamps timestamps. ``nvml``: where energy is read at scrape time, only while
    :meth:`run` runs (the daemon runs it between NVML init and shutdown).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        nvml: Nvml | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self._clock = clock
        self._wall = wall_clock
        self._snapshot: BankSnapshot | None = None
        self._nvml_source = nvml
        # The NVML layer energy is read from at scrape time, set only while NVML is up
        # (run() does that for the daemon's lifetime); None: no energy series.
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
    async def run(self) -> None:
        # Runs between NVML init and shutdown: no scrape reads energy outside.
        self.nvml = self._nvml_source
        try:
            await asyncio.Event().wait()
        finally:
            self.nvml = None

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        self.reload_result(ok)

    def reload_result(self, ok: bool) -> None:
        """Record a configuration load (at start, and on each reload): ``ok`` or failed."""
        self.reload_success.set(1 if ok else 0)
        self.reload_timestamp.set(self._wall())

    def on_tick(self, report: TickReport) -> None:
        """Called with each tick's report; never blocks."""
        self.tick_duration.observe(max(0.0, self._clock() - report.now))
        self.last_tick.set(self._wall())
        snap = report.snapshot
        for c in snap.cards:
            if c.uuid not in self._labels:
                self._labels[c.uuid] = card_labels(c)
                for kind in ERROR_KINDS:
                    self.nvml_errors.labels(*self._labels[c.uuid], kind)
            for kind, n in c.read_errors:
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
        self._snapshot = snap

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

    def _families(self, s: BankSnapshot | None) -> Iterator[Metric]:
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
        over = gauge(
            "powerbudgetd_over_budget",
            "1 while the sum of power limits that may be in force is above the budget (any cause: boot's "
            "descent, a limit held or raised elsewhere, a card that appeared); corrected by decreases only",
        )
        over_episodes = CounterMetricFamily(
            "powerbudgetd_over_budget_episodes",
            "Episodes of the bank over budget since start (one over_budget log line each, with the cause)",
        )
        over_seconds = CounterMetricFamily(
            "powerbudgetd_over_budget_seconds", "Time the bank spent over budget since start", unit="seconds",
        )
        mode = gauge("powerbudgetd_mode", "1 for the bank's current operating mode, 0 for the others", ("mode",))
        source_w = gauge(
            "powerbudgetd_budget_source_watts",
            "Each budget source's current value: config (the file or its [feed] derivation), wall_meter, remote; "
            "the lowest is in force, never above config", ("source",), "watts",
        )
        in_force = gauge(
            "powerbudgetd_budget_source_in_force",
            "1 for the budget source whose value is in force, 0 for the others", ("source",),
        )
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
        outside_cap = gauge(
            "powerbudgetd_gpu_outside_power_cap_watts",
            "The enforced limit an outside limiter (a BMC, a node-level cap) holds this card at, below what "
            "powerbudgetd requested; present only while it does (the card is given what it can use, the rest "
            "lent)", CARD_LABELS, "watts",
        )
        excursions = CounterMetricFamily(
            "powerbudgetd_gpu_power_excursions",
            "Times the instant draw rose above the enforced limit (normal at load onset: the limit caps "
            "the 1 s average)", labels=CARD_LABELS,
        )
        rejected = CounterMetricFamily(
            "powerbudgetd_gpu_power_readings_rejected",
            "Power readings not believed, by reason: impossible (negative, overflowed, far above the card's "
            "maximum) or frozen (stuck while the energy counter moves); the draw counts as unknown meanwhile",
            labels=(*CARD_LABELS, "reason"),
        )
        peak = gauge(
            "powerbudgetd_gpu_power_excursion_peak_watts",
            "Highest instant draw seen above the enforced limit", CARD_LABELS, "watts",
        )
        mig = gauge(
            "powerbudgetd_gpu_mig_mode",
            "1 while MIG is enabled on the GPU, 0 while disabled; absent where the card has no MIG. Limits "
            "are set on the parent GPU and cover all its MIG devices", CARD_LABELS,
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
            bank["sum_limits"].add_metric([], s.sum_limit_bound_w)
            if s.power_complete:
                bank["sum_draw"].add_metric([], s.sum_power_avg_w)
            bank["headroom"].add_metric([], s.headroom_w)
            over.add_metric([], 1.0 if s.over_budget else 0.0)
            over_episodes.add_metric([], s.over_budget_episodes)
            over_seconds.add_metric([], s.over_budget_s)
            for m in Mode:
                mode.add_metric([str(m)], 1.0 if str(m) == s.mode else 0.0)
            sources = dict(s.sources) or {s.budget_source: s.budget_w}
            for name, value in sources.items():
                source_w.add_metric([name], value)
                in_force.add_metric([name], 1.0 if name == s.budget_source else 0.0)
            for c in s.cards:
                labels = self.m._labels.get(c.uuid) or card_labels(c)
                values: tuple[tuple[str, float | None], ...] = (
                    ("limit", c.requested_limit_w), ("enforced", c.enforced_limit_w), ("min", c.min_limit_w),
                    ("max", c.max_limit_w), ("draw", c.power_avg_w), ("instant", c.power_instant_w),
                )
                for key, reading in values:
                    if reading is not None:  # unknown is absent, never 0 W
                        card[key].add_metric(list(labels), reading)
                if c.mig_mode is not None:
                    mig.add_metric(list(labels), 1.0 if c.mig_mode else 0.0)
                for r in Role:
                    role.add_metric([*labels, str(r)], 1.0 if str(r) == c.role else 0.0)
                if c.contested_w is not None:
                    contested.add_metric(list(labels), c.contested_w)
                if c.outside_cap_w is not None:
                    outside_cap.add_metric(list(labels), c.outside_cap_w)
                excursions.add_metric(list(labels), c.excursions)
                for reason, n in c.readings_rejected:
                    rejected.add_metric([*labels, reason], n)
                if c.peak_excursion_w is not None:
                    peak.add_metric(list(labels), c.peak_excursion_w)
                j = self.m._energy(c.uuid)
                if j is not None:
                    energy.add_metric(list(labels), j)
        yield from bank.values()
        yield over
        yield over_episodes
        yield over_seconds
        yield mode
        yield source_w
        yield in_force
        yield from card.values()
        yield role
        yield mig
        yield contested
        yield outside_cap
        yield excursions
        yield rejected
        yield peak
        yield energy


def serve(registry: CollectorRegistry, address: str, port: int) -> WSGIServer:
    """Serve ``registry`` on ``http://address:port/metrics`` from a daemon thread; ``/``
    answers with a pointer to it, any other path 404 (a scraper or a person with a
    wrong path learns so instead of getting metrics anyway).

    Returns the server (``shutdown()`` it to stop). Raises OSError when the address
    cannot be bound (port in use, address not on this host).
    """

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True  # a stuck scraper never holds up the daemon's exit

    family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    Server.address_family = family  # an IPv6 listen_address binds as IPv6
    httpd = make_server(str(sockaddr[0]), port, metrics_app(registry), Server, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    return httpd


def metrics_app(registry: CollectorRegistry) -> Callable[[dict[str, Any], Any], Iterable[bytes]]:
    """The WSGI app :func:`serve` runs: ``/metrics`` (Prometheus' exposition, as
    ``prometheus_client`` serves it), ``/`` (a pointer to it), 404 otherwise."""
    exposition = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == METRICS_PATH:
            return exposition(environ, start_response)
        if path == "/":
            body, status = f"powerbudgetd {__version__}: metrics at {METRICS_PATH}\n", "200 OK"
        else:
            body, status = f"not found: {path} (powerbudgetd serves {METRICS_PATH})\n", "404 Not Found"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [body.encode()]

    return app


METRICS_PATH = "/metrics"


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape (the daemon's own log is for events)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass
