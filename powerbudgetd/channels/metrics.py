"""Prometheus metrics: what each card is capped at and draws, and how the bank stands.

Every name, label set and help text is declared in :mod:`~powerbudgetd.channels.metricnames`
(the contract every reader uses); no hostname label (the scrape target adds
``instance``). Beside them: ``process_*`` (CPU, memory, descriptors), and no counter
``_created`` series (they would only repeat the process's start time).

The daemon feeds :class:`Metrics` each tick's bank snapshot through the side-channel
hook (cheap: a reference kept and a few counter increments on the event loop); the
HTTP server (:func:`serve`) answers scrapes from its own threads. Nothing on the scrape
path calls NVML: a hung card's call would hold the scrape past Prometheus' scrape
timeout (``up == 0``, a page saying nothing keeps the bank under budget, where the
truth is the failsafe). The energy counters, the one reading not in the tick's
snapshot, are read by :meth:`Metrics.run` off the loop, each card within a deadline
(:mod:`~powerbudgetd.channels.energy`); a card whose read failed or hangs has no
energy series until it reads again (Prometheus marks it stale).

A scrape is served from bytes rendered at most once per change (a tick, a reload, an
energy round) or :data:`MAX_RENDER_AGE_S`, so a flood of scrapes renders nothing more;
scrape answers are paced (:data:`MIN_SCRAPE_INTERVAL_S`) so that clients scraping back
to back cost the control loop's threads nothing measurable (``benchmarks/metrics_scrape.py``).
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
from prometheus_client import CollectorRegistry, ProcessCollector, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from powerbudgetd import __version__
from powerbudgetd.channels import metricnames as names
from powerbudgetd.channels.energy import MIN_ENERGY_INTERVAL_S, EnergyCounters, Reading
from powerbudgetd.channels.metricnames import PEAK_WINDOW_S
from powerbudgetd.errors import NvmlError
from powerbudgetd.core.model import Mode, Role

if TYPE_CHECKING:
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.core.snapshot import BankSnapshot, CardSnapshot
    from powerbudgetd.hw.card import CardBackend as Nvml  # any backend: the name its callers know
    from powerbudgetd.config import Settings

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
    s) stamps timestamps. ``nvml``: where :meth:`run` reads the energy counters (the
    daemon runs it between NVML init and shutdown); never read at scrape time.
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
        self._counters = None if nvml is None else EnergyCounters(lambda uuid: nvml.energy_j(uuid))
        self._energy: dict[str, float] = {}  # J by UUID, the last round's good readings
        self._no_energy: set[str] = set()  # cards whose NVML has no energy counter
        # The exposition rendered for scrapes: re-rendered when _version moved past it.
        self._version = 0
        self._rendered: tuple[int, float, bytes] | None = None  # (version, clock s, bytes)
        self._render_lock = threading.Lock()
        self._labels: dict[str, tuple[str, str, str]] = {}
        self._read_errors_seen: dict[tuple[str, str], int] = {}

        self.tick_duration = names.histogram(names.TICK_DURATION, registry, TICK_BUCKETS_S)
        self.last_tick = names.gauge(names.LAST_TICK, registry)
        self.limit_changes = names.counter(names.LIMIT_CHANGES, registry)
        self.nvml_errors = names.counter(names.NVML_ERRORS, registry)
        self.gpu_info = names.gauge(names.GPU_INFO, registry)
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
        """Read the energy counters every :data:`MIN_ENERGY_INTERVAL_S` (from the first
        tick on), off the loop; runs between NVML init and shutdown."""
        if self._counters is None:
            await asyncio.Event().wait()
            return
        while True:
            if self._snapshot is None:
                await asyncio.sleep(0.1)
                continue
            self.energy_readings(await self._counters.read_off_loop(self._energy_uuids()))
            await asyncio.sleep(MIN_ENERGY_INTERVAL_S)

    def read_energy(self) -> None:
        """One round of energy reads now, on this thread (blocks up to the per-card deadline)."""
        if self._counters is not None:
            self.energy_readings(self._counters.read(self._energy_uuids()))

    def _energy_uuids(self) -> list[str]:
        snap = self._snapshot
        return [] if snap is None else [c.uuid for c in snap.cards if c.uuid not in self._no_energy]

    def energy_readings(self, readings: dict[str, Reading]) -> None:
        """Take one round of energy readings (J by UUID): a card whose read failed or
        hung counts an NVML error and has no energy series until it reads again; one
        without the counter (None) is not asked again."""
        fresh: dict[str, float] = {}
        for uuid, j in readings.items():
            if isinstance(j, NvmlError):
                if uuid in self._labels:
                    self.nvml_errors.labels(*self._labels[uuid], j.kind).inc()
            elif j is None:
                self._no_energy.add(uuid)
            else:
                fresh[uuid] = j
        self._energy = fresh
        self._version += 1

    def energy_j(self, uuid: str) -> float | None:
        """The card's energy counter (J) as last read; None: unread, unsupported, or its
        last read failed."""
        return self._energy.get(uuid)

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        self.reload_result(ok)

    def reload_result(self, ok: bool) -> None:
        """Record a configuration load (at start, and on each reload): ``ok`` or failed."""
        self.reload_success.set(1 if ok else 0)
        self.reload_timestamp.set(self._wall())
        self._version += 1

    def on_tick(self, report: TickReport) -> None:
        """Called with each tick's report; never blocks."""
        self.tick_duration.observe(max(0.0, self._clock() - report.now))
        self.last_tick.set(self._wall())
        snap = report.snapshot
        for c in snap.cards:
            if c.uuid not in self._labels:
                self._labels[c.uuid] = card_labels(c)
                self.gpu_info.labels(*self._labels[c.uuid], c.vendor, c.backend).set(1)
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
        self._version += 1

    def exposition(self) -> bytes:
        """The text exposition (Prometheus' format 0.0.4) as a scrape serves it: the
        bytes last rendered, rendered afresh only when something changed since (a tick,
        a reload, energy read) or they are older than :data:`MAX_RENDER_AGE_S` (the
        process_* series, a stalled loop's last tick). One render at a time."""
        with self._render_lock:
            version, now = self._version, time.monotonic()
            cached = self._rendered
            if cached is not None and cached[0] == version and now - cached[1] < MAX_RENDER_AGE_S:
                return cached[2]
            body = generate_latest(self.registry)
            self._rendered = (version, now, body)
            return body

    def peak_w(self, uuid: str) -> float | None:
        """The card's highest instant reading (W) over the last :data:`PEAK_WINDOW_S`
        of ticks; None when it read none (no instant field, or unreadable)."""
        window = self._peaks.get(uuid)
        return None if window is None else window.max_w


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
    """Renders the last tick's snapshot and the last energy readings."""

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
                j = self.m.energy_j(c.uuid)
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
# Scrape answers at least this far apart (s), all clients together: Prometheus scrapes
# every 15-60 s (two replicas, a `status`, a curl: a handful a minute); 20 a second is
# far above that and bounds what a flood of back-to-back scrapes can take from the loop.
MIN_SCRAPE_INTERVAL_S = 0.05
# Rendered bytes are re-rendered after this (s) even with nothing changed (process_*).
MAX_RENDER_AGE_S = 1.0


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


def serve(metrics: Metrics, address: str, port: int, *, max_connections: int = 256,
          idle_timeout_s: float = 10.0, request_timeout_s: float = 5.0,
          min_interval_s: float | None = None) -> MetricsServer:
    """Serve ``metrics`` on ``http://address:port/metrics`` (see :func:`metrics_app`)
    with waitress: one I/O thread multiplexes every connection (an idle one costs a
    descriptor, never a thread), :data:`SCRAPE_THREADS` answer scrapes. At most
    :func:`connection_cap` connections are held (more wait in the listen backlog). A
    connection is closed when silent for ``idle_timeout_s`` (s) between requests, or
    when a request has not arrived in full ``request_timeout_s`` (s) after its first
    byte (or after the connection was accepted): a client dribbling a byte at a time
    (slowloris) holds its slot that long at most. Request headers are capped at 8 KiB
    and bodies at 1 KiB; answers are paced ``min_interval_s`` apart (default
    :data:`MIN_SCRAPE_INTERVAL_S`).

    Raises OSError when the address cannot be bound (port in use, address not on this
    host)."""
    from waitress.adjustments import Adjustments
    from waitress.task import ThreadedTaskDispatcher

    waitress_log = logging.getLogger("waitress")
    if not any(isinstance(h, _ServerLog) for h in waitress_log.handlers):
        waitress_log.addHandler(_ServerLog())
        waitress_log.propagate = False  # no bare lines on stderr beside the JSON log
    cap = connection_cap(max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    adj = Adjustments(
        host=address, port=port, threads=SCRAPE_THREADS, connection_limit=cap, channel_timeout=idle_timeout_s,
        cleanup_interval=max(0.1, min(idle_timeout_s, request_timeout_s) / 4), asyncore_use_poll=True,
        max_request_header_size=8192, max_request_body_size=1024, backlog=64, ident="powerbudgetd",
        expose_tracebacks=False, clear_untrusted_proxy_headers=True,
    )
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    interval = MIN_SCRAPE_INTERVAL_S if min_interval_s is None else min_interval_s
    server = _server_class()(metrics_app(metrics, interval), map={}, dispatcher=dispatcher, adj=adj,
                             sockinfo=adj.listen[0], request_timeout_s=request_timeout_s)
    thread = threading.Thread(target=server.run, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(server, thread, cap)


def _server_class() -> type:
    """waitress' TCP server whose connections must deliver each request in full within
    a deadline (waitress itself closes a connection only when silent: one sending a
    byte every few seconds would hold its slot for ever). Built on first use: waitress
    is imported only where metrics are served."""
    from waitress.channel import HTTPChannel
    from waitress.server import TcpWSGIServer

    class Channel(HTTPChannel):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            # When the request being read began (monotonic s); None: not reading one
            # (idle between requests, the idle timeout's business, or answering).
            self.reading_since: float | None = time.monotonic()

        def received(self, data: bytes) -> bool:
            before = self.request
            out: bool = super().received(data)
            if self.request is None:
                self.reading_since = None  # every request in ``data`` arrived in full
            elif self.request is not before or self.reading_since is None:
                self.reading_since = time.monotonic()  # a new one began in ``data``
            return out

    class Server(TcpWSGIServer):
        channel_class = Channel

        def __init__(self, *args: Any, request_timeout_s: float, **kw: Any) -> None:
            self.request_timeout_s = request_timeout_s
            super().__init__(*args, **kw)

        def maintenance(self, now: float) -> None:
            super().maintenance(now)  # the idle ones
            cutoff = time.monotonic() - self.request_timeout_s
            for channel in list(self.active_channels.values()):
                since = getattr(channel, "reading_since", None)
                if since is not None and since < cutoff and not channel.requests:
                    channel.will_close = True

    return Server


class _Pace:
    """Answers at least ``interval_s`` (s) apart, whoever asks: a client scraping back to
    back (or several) waits its turn, sleeping, instead of taking the GIL from the
    control loop's threads answer after answer."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._next = 0.0

    def wait(self) -> None:
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next)
            self._next = at + self.interval_s
        if at > now:
            time.sleep(at - now)


def metrics_app(metrics: Metrics, min_interval_s: float = 0.0) -> Callable[[dict[str, Any], Any], Iterable[bytes]]:
    """The WSGI app :func:`serve` runs: ``/metrics`` (:meth:`Metrics.exposition`, the
    text format), ``/`` (a pointer to it), 404 otherwise; answers ``min_interval_s``
    (s) apart at least."""
    pace = _Pace(min_interval_s)

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        pace.wait()
        path = environ.get("PATH_INFO") or "/"
        if path == METRICS_PATH:
            body = metrics.exposition()
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
            return [body]
        if path == "/":
            text, status = f"powerbudgetd {__version__}: metrics at {METRICS_PATH}\n", "200 OK"
        else:
            text, status = f"not found: {path} (powerbudgetd serves {METRICS_PATH})\n", "404 Not Found"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [text.encode()]

    return app


METRICS_PATH = "/metrics"

