"""Prometheus metrics: what each card is capped at and draws, and how the bank stands.

Every name, label set and help text is declared in :mod:`~powerbudgetd.channels.metricnames`
(the contract every reader uses); no hostname label (the scrape target adds
``instance``). Beside them: ``process_*`` (CPU, memory, descriptors), and no counter
``_created`` series (they would only repeat the process's start time).

The daemon feeds :class:`Metrics` each tick's bank snapshot through the side-channel
hook (cheap: a reference kept and a few counter increments on the event loop); the
HTTP server (:func:`serve`) answers scrapes from its own threads and renders that snapshot. Energy is the
one NVML read done at scrape time, not per tick: ``nvmlDeviceGetTotalEnergyConsumption``
costs ~3 ms median, 16 ms p99 on an H200 (brief), too much for a 100 ms control loop
but nothing for a scrape every 15 s.
"""

from __future__ import annotations

import asyncio
from collections import deque
import ipaddress
import logging
import platform
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry, ProcessCollector, disable_created_metrics, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from powerbudgetd import __version__
from powerbudgetd.channels import metricnames as names
from powerbudgetd.channels.metricnames import PEAK_WINDOW_S
from powerbudgetd.errors import NvmlError
from powerbudgetd.core.model import Mode, Role

if TYPE_CHECKING:
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.core.snapshot import BankSnapshot, CardSnapshot
    from powerbudgetd.hw.nvml import Nvml
    from powerbudgetd.config import Settings

DEFAULT_PORT = 19400  # outside 9100-9999 (all claimed by exporters); not 9400 (dcgm-exporter)
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

        self.tick_duration = names.histogram(names.TICK_DURATION, registry, TICK_BUCKETS_S)
        self.last_tick = names.gauge(names.LAST_TICK, registry)
        self.limit_changes = names.counter(names.LIMIT_CHANGES, registry)
        self.nvml_errors = names.counter(names.NVML_ERRORS, registry)
        self.reload_success = names.gauge(names.RELOAD_SUCCESS, registry)
        self.reload_timestamp = names.gauge(names.RELOAD_TIMESTAMP, registry)
        # A counter's _created series says when this process made it: the start time,
        # which process_start_time_seconds already gives once.
        disable_created_metrics()
        names.info(names.BUILD, registry).info({"version": __version__, "python_version": platform.python_version()})
        ProcessCollector(registry=registry)  # process_* (CPU, memory, descriptors, start time)
        self._peaks: dict[str, PeakWindow] = {}
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
        for c in snap.cards:
            window = self._peaks.get(c.uuid)
            if window is None:  # not setdefault: that would build a window a card a tick
                window = self._peaks[c.uuid] = PeakWindow(PEAK_WINDOW_S)
            if c.power_instant_w is not None:
                window.add(report.now, c.power_instant_w)
            else:
                window.expire(report.now)
        self._snapshot = snap

    def peak_w(self, uuid: str) -> float | None:
        """The card's highest instant reading (W) over the last :data:`PEAK_WINDOW_S`
        of ticks; None when it read none (no instant field, or unreadable)."""
        window = self._peaks.get(uuid)
        return None if window is None else window.max_w

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


def held_at_floors(s: BankSnapshot) -> bool:
    """A budget source asks for less than the bank's floor: the cards are held at their
    minimums (the arbiter's ``below_floor``, from the sources' values in ``s``)."""
    wanted = min((w for _, w in s.sources), default=s.budget_w)
    return wanted < s.floor_w - 0.5


class PeakWindow:
    """The maximum of readings over a sliding window of ``window_s`` (s, on the
    readings' clock): a monotonic queue, O(1) amortised per reading."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._q: deque[tuple[float, float]] = deque()  # (at s, W), W decreasing

    def add(self, at_s: float, w: float) -> None:
        while self._q and self._q[-1][1] <= w:
            self._q.pop()
        self._q.append((at_s, w))
        self.expire(at_s)

    def expire(self, now_s: float) -> None:
        while self._q and self._q[0][0] < now_s - self.window_s:
            self._q.popleft()

    @property
    def max_w(self) -> float | None:
        return self._q[0][1] if self._q else None


class _StateCollector(Collector):
    """Renders the last tick's snapshot (and energy, read now) at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def describe(self) -> Iterable[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self.m._snapshot))

    def _families(self, s: BankSnapshot | None) -> Iterator[Metric]:
        def gauge(spec: names.MetricSpec) -> GaugeMetricFamily:
            return GaugeMetricFamily(spec.name, spec.doc, labels=spec.labels, unit=spec.unit)

        def counter(spec: names.MetricSpec) -> CounterMetricFamily:
            return CounterMetricFamily(spec.name, spec.doc, labels=spec.labels, unit=spec.unit)

        bank = {
            "budget": gauge(names.BUDGET), "sum_limits": gauge(names.SUM_LIMITS), "sum_draw": gauge(names.SUM_DRAW),
            "headroom": gauge(names.HEADROOM), "floor": gauge(names.FLOOR),
        }
        held = gauge(names.HELD_AT_FLOORS)
        over = gauge(names.OVER_BUDGET)
        over_episodes = counter(names.OVER_BUDGET_EPISODES)
        over_seconds = counter(names.OVER_BUDGET_SECONDS)
        mode = gauge(names.MODE)
        source_w = gauge(names.BUDGET_SOURCE_WATTS)
        in_force = gauge(names.BUDGET_SOURCE_IN_FORCE)
        card = {
            "limit": gauge(names.GPU_LIMIT), "enforced": gauge(names.GPU_ENFORCED), "min": gauge(names.GPU_LIMIT_MIN),
            "max": gauge(names.GPU_LIMIT_MAX), "draw": gauge(names.GPU_DRAW), "instant": gauge(names.GPU_DRAW_INSTANT),
            "peak": gauge(names.GPU_DRAW_PEAK),
        }
        contested = gauge(names.GPU_CONTESTED)
        outside_cap = gauge(names.GPU_OUTSIDE_CAP)
        excursions = counter(names.GPU_EXCURSIONS)
        rejected = counter(names.GPU_READINGS_REJECTED)
        peak = gauge(names.GPU_EXCURSION_PEAK)
        mig = gauge(names.GPU_MIG)
        role = gauge(names.GPU_ROLE)
        energy = counter(names.GPU_ENERGY)
        if s is not None:
            bank["budget"].add_metric([], s.budget_w)
            bank["sum_limits"].add_metric([], s.sum_limit_bound_w)
            if s.power_complete:
                bank["sum_draw"].add_metric([], s.sum_power_avg_w)
            bank["headroom"].add_metric([], s.headroom_w)
            bank["floor"].add_metric([], s.floor_w)
            held.add_metric([], 1.0 if held_at_floors(s) else 0.0)
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
                    ("peak", self.m.peak_w(c.uuid)),
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
        yield held
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


# Descriptors the metrics server leaves to everything else in the process (NVML, the
# flight recorder, MQTT, etcd, a reload's config file): its connection cap is lowered to
# fit under RLIMIT_NOFILE minus these.
RESERVED_FDS = 128
SCRAPE_THREADS = 2  # scrapes answered at once; every other connection waits on the one I/O thread


def connection_cap(max_connections: int, nofile_soft: int) -> int:
    """How many connections :func:`serve` holds at once: ``max_connections``, lowered so
    that they and :data:`RESERVED_FDS` fit under the soft descriptor limit
    ``nofile_soft`` (``resource.RLIM_INFINITY``: no limit); at least 4."""
    if nofile_soft == resource.RLIM_INFINITY or nofile_soft < 0:
        return max_connections
    return max(4, min(max_connections, nofile_soft - RESERVED_FDS))


class MetricsServer:
    """A running :func:`serve`: ``server_port`` (the port bound), ``max_connections``
    (the cap in force); :meth:`close` stops it."""

    def __init__(self, server: Any, thread: threading.Thread, max_connections: int) -> None:
        self._server = server
        self._thread = thread
        self.server_port: int = server.effective_port
        self.max_connections = max_connections

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop accepting, close every connection, wait up to ``timeout_s`` for the I/O thread."""
        self._server.close()
        self._server.task_dispatcher.shutdown(timeout=timeout_s)
        self._thread.join(timeout_s)


class _ServerLog(logging.Handler):
    """The HTTP server's own warnings (the connection cap reached, and left) as the
    daemon's log events (``metrics_server``), not bare lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        event = structlog.get_logger("powerbudgetd").warning if record.levelno >= logging.WARNING else None
        if event is not None:
            event("metrics_server", detail=record.getMessage()[:200])


def serve(registry: CollectorRegistry, address: str, port: int, *, max_connections: int = 256,
          idle_timeout_s: float = 10.0) -> MetricsServer:
    """Serve ``registry`` on ``http://address:port/metrics`` (see :func:`metrics_app`)
    with waitress: one I/O thread multiplexes every connection (an idle one costs a
    descriptor, never a thread), :data:`SCRAPE_THREADS` render scrapes. At most
    :func:`connection_cap` connections are held (more wait in the listen backlog); a
    connection silent for ``idle_timeout_s`` (s) — idle between requests or stalled in
    one — is closed; request headers are capped at 8 KiB and bodies at 1 KiB.

    Raises OSError when the address cannot be bound (port in use, address not on this
    host)."""
    from waitress.server import create_server

    waitress_log = logging.getLogger("waitress")
    if not any(isinstance(h, _ServerLog) for h in waitress_log.handlers):
        waitress_log.addHandler(_ServerLog())
        waitress_log.propagate = False  # no bare lines on stderr beside the JSON log
    cap = connection_cap(max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    server = create_server(
        metrics_app(registry), host=address, port=port, threads=SCRAPE_THREADS, connection_limit=cap,
        channel_timeout=idle_timeout_s, cleanup_interval=max(0.5, idle_timeout_s / 4), asyncore_use_poll=True,
        max_request_header_size=8192, max_request_body_size=1024, backlog=64, ident="powerbudgetd",
        expose_tracebacks=False, clear_untrusted_proxy_headers=True,
    )
    thread = threading.Thread(target=server.run, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(server, thread, cap)


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

