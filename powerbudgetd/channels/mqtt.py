"""MQTT side channel: published state, Home Assistant discovery, wall-meter feedback and
a bounded remote budget. The only module that imports ``aiomqtt``.

Two halves meet on the daemon's event-loop thread:

- :meth:`MqttBridge.on_tick` is a tick listener. It is cheap and never waits: it stores
  a snapshot in a latest-value slot, wakes the publisher, and applies a changed budget
  through :meth:`Controller.set_budget` *between* ticks (never while a tick runs in its
  worker thread), so decreases go first on the next tick.
- :meth:`MqttBridge.run` is a daemon service: connect, publish, subscribe, and on any
  broker trouble reconnect with backoff and jitter. A dead broker costs this task,
  never a tick.

Budget sources, lowest wins: the configured budget, the wall meter's (which can only
lower it), and a remote command within [floor, configured budget].
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiomqtt
import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from powerbudgetd import __version__
from powerbudgetd.service.config import FeedConfig, MqttConfig, WallMeterConfig
from powerbudgetd.control.controller import Controller, TickReport
from powerbudgetd.service.daemon import Daemon
from powerbudgetd.errors import BudgetInfeasible

log = structlog.get_logger("powerbudgetd")

# A meter averages over ~1 s and its message arrives late; GPU draw in that time may
# have risen. Pairing the reading with the *lowest* board power of the last 2 s
# overstates the non-GPU draw, never understates it: the error lowers the budget.
BOARD_WINDOW_S = 2.0
MIN_PUBLISH_GAP_S = 0.25  # coalesce bursts of limit changes (boot, reclaim)
MAX_SHOWN_PAYLOAD = 64  # characters of a bad payload quoted back in logs and responses

READING_ERRORS = ("stale", "garbled", "negative", "implausible")


class ReadingError(ValueError):
    """A wall reading that must be ignored; ``reason`` is one of :data:`READING_ERRORS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _shown(payload: bytes | str) -> str:
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    return text if len(text) <= MAX_SHOWN_PAYLOAD else text[:MAX_SHOWN_PAYLOAD] + "..."


def _finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def parse_power_w(payload: bytes, path: Sequence[str]) -> float:
    """The watts at ``path`` (dotted keys, list items by number) in a JSON payload.

    Raises ReadingError ``garbled`` (not JSON, path missing, not a finite number) or
    ``negative``.
    """
    try:
        value: Any = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise ReadingError("garbled", f"not JSON: {_shown(payload)!r}") from None
    for i, key in enumerate(path):
        where = ".".join(path[: i + 1])
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise ReadingError("garbled", f"no {where} in {_shown(payload)!r}")
    watts = _finite_number(value)
    if watts is None:
        hint = "; point json_path at one channel, e.g. ENERGY.Power.0" if isinstance(value, list) else ""
        raise ReadingError("garbled", f"{'.'.join(path) or 'payload'} is not a number: {_shown(json.dumps(value))}{hint}")
    if watts < 0:
        raise ReadingError("negative", f"negative wall power: {watts:g} W")
    return watts


def allowed_board_budget_w(wall_w: float, board_w: float, wall_limit_w: float, efficiency: float) -> tuple[float, float]:
    """(non-GPU wall draw, board budget the feed allows), both W.

    non-GPU wall draw = wall power - board power / PSU efficiency; the board budget is
    what is left of the plug-side limit, converted back to board watts:
    (wall limit - non-GPU wall draw) x efficiency.
    """
    non_gpu_w = wall_w - board_w / efficiency
    return non_gpu_w, (wall_limit_w - non_gpu_w) * efficiency


def next_meter_budget_w(current_w: float | None, allowed_w: float, configured_w: float, hysteresis_w: float) -> float | None:
    """The meter's budget after a reading (W); None when the meter does not limit.

    Below what is in force: drop to ``allowed - hysteresis`` at once (protection
    first, and one dead band of margin so noise does not trigger the next drop). Rise
    only once the meter allows a full band more; give up limiting once it allows the
    configured budget plus a band. Never above ``configured_w``.
    """
    in_force = configured_w if current_w is None else min(current_w, configured_w)
    if allowed_w < in_force:
        return max(0.0, allowed_w - hysteresis_w)
    if current_w is None or allowed_w >= configured_w + hysteresis_w:
        return None
    if allowed_w >= current_w + 2 * hysteresis_w:
        return allowed_w - hysteresis_w
    return current_w


def parse_budget_command(payload: bytes) -> float:
    """A remote budget command: ``850``, ``850.5`` or ``{"budget_w": 850}`` (W).

    Raises ValueError with the reason.
    """
    try:
        value: Any = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"not a number of watts: {_shown(payload)!r}") from None
    if isinstance(value, dict):
        if "budget_w" not in value:
            raise ValueError('expected a number of watts or {"budget_w": <watts>}')
        value = value["budget_w"]
    watts = _finite_number(value)
    if watts is None:
        raise ValueError(f"not a number of watts: {_shown(payload)!r}")
    return watts


class MqttMetrics:
    """The MQTT side channel's Prometheus metrics, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connected = Gauge(
            "powerbudgetd_mqtt_connected", "1 while connected to the MQTT broker", registry=registry
        )
        self.wall_power = Gauge(
            "powerbudgetd_wall_power_watts", "Last valid wall (plug) power reading", registry=registry
        )
        self.non_gpu_wall = Gauge(
            "powerbudgetd_wall_non_gpu_watts", "Wall power not explained by GPU board power / PSU efficiency",
            registry=registry,
        )
        self.meter_budget = Gauge(
            "powerbudgetd_wall_meter_budget_watts",
            "Board budget the wall meter allows after hysteresis (the configured budget when it does not limit)",
            registry=registry,
        )
        self.meter_ok = Gauge(
            "powerbudgetd_wall_meter_ok", "1 while the wall meter's last reading is fresh and valid", registry=registry
        )
        self.ignored = Counter(
            "powerbudgetd_wall_readings_ignored", "Wall readings ignored, by reason", ["reason"], registry=registry
        )
        self.remote = Counter(
            "powerbudgetd_remote_budget_commands", "Remote budget commands, by result", ["result"], registry=registry
        )
        for reason in READING_ERRORS:
            self.ignored.labels(reason)
        for result in ("accepted", "rejected"):
            self.remote.labels(result)


class WallMeter:
    """A wall meter's readings turned into a board budget; clock-free (``now`` in s).

    ``state``: ``waiting`` (no reading yet), ``ok``, ``stale``, ``garbled``,
    ``negative``, ``implausible`` or ``offline``; a warning is logged once per change of
    state. A bad or missing reading keeps the last meter budget: only a fresh, valid
    reading moves it, and it never exceeds the configured budget.
    """

    def __init__(self, cfg: WallMeterConfig, feed: FeedConfig, metrics: MqttMetrics) -> None:
        self.cfg = cfg
        self.wall_limit_w = feed.wall_limit_w()
        self.efficiency = feed.psu_efficiency
        self.metrics = metrics
        self.state = "waiting"
        self.wall_w: float | None = None
        self.non_gpu_w: float | None = None
        self.allowed_w: float | None = None
        self.budget_w: float | None = None  # None: the meter does not limit
        self.last_ok_at = float("-inf")

    def reading(self, payload: bytes, now: float, board_w: float | None, configured_w: float, *, retained: bool = False) -> None:
        """One message from the meter; ``board_w`` is the GPU board power to pair it with."""
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
            non_gpu_w, allowed_w = allowed_board_budget_w(wall_w, board_w, self.wall_limit_w, self.efficiency)
            if non_gpu_w < 0:
                raise ReadingError(
                    "implausible",
                    f"wall power {wall_w:g} W is below GPU board power {board_w:.0f} W / PSU efficiency "
                    f"{self.efficiency:g}: is the meter on this host's plug?",
                )
        except ReadingError as exc:
            self.metrics.ignored.labels(exc.reason).inc()
            self._set_state(exc.reason, str(exc))
            return
        self.wall_w, self.non_gpu_w, self.allowed_w = wall_w, non_gpu_w, allowed_w
        self.budget_w = next_meter_budget_w(self.budget_w, allowed_w, configured_w, self.cfg.hysteresis_w)
        self.last_ok_at = now
        self.metrics.wall_power.set(wall_w)
        self.metrics.non_gpu_wall.set(non_gpu_w)
        self.metrics.meter_budget.set(configured_w if self.budget_w is None else min(self.budget_w, configured_w))
        self._set_state("ok", f"wall {wall_w:g} W, non-GPU {non_gpu_w:.0f} W, allows {allowed_w:.0f} W of board power")

    def offline(self) -> None:
        """The meter's own last will or availability says it is gone."""
        self._set_state("offline", "the meter reports itself offline")

    def check_age(self, now: float) -> None:
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


@dataclass(frozen=True)
class Snapshot:
    """What one tick left behind, JSON-ready (W). ``limits_key`` changes with any limit
    or the budget; ``cards_key`` with the set of cards (for discovery)."""

    bank: dict[str, Any]
    cards: tuple[dict[str, Any], ...]
    floor_w: float
    sum_power_w: float
    limits_key: tuple
    cards_key: tuple


def _w(mw: int | None) -> float | None:
    return None if mw is None else mw / 1000


def floor_w(ctl: Controller) -> float:
    """The lowest budget the bank can be held to (W): controllable cards at their
    minimum limits, the others at the highest limit they may have."""
    return sum(c.min_mw if c.controllable else c.bound_mw for c in ctl.cards) / 1000


def take_snapshot(report: TickReport, ctl: Controller) -> Snapshot:
    cards = []
    for c in ctl.cards:
        r = c.reading
        cards.append({
            "index": c.index, "uuid": c.uuid, "name": c.info.name, "role": str(c.role),
            "limit_w": _w(c.enforced_mw), "requested_limit_w": _w(c.requested_mw), "limit_bound_w": _w(c.bound_mw),
            "min_limit_w": _w(c.min_mw), "max_limit_w": _w(c.max_mw),
            "power_avg_w": None if r is None else r.power_avg_w,
            "power_instant_w": None if r is None else r.power_instant_w,
            "error": c.error,
        })
    sum_power_w = sum(c.reading.power_avg_w or 0.0 for c in ctl.cards if c.reading is not None)
    bank = {
        "budget_w": ctl.budget_mw / 1000, "sum_limits_w": ctl.sum_bound_mw / 1000, "sum_power_w": round(sum_power_w, 1),
        "mode": str(report.mode), "ready": report.ready, "gpus": len(cards),
    }
    return Snapshot(
        bank, tuple(cards), floor_w(ctl), sum_power_w,
        (ctl.budget_mw, tuple((c.bound_mw, c.enforced_mw, c.requested_mw, str(c.role)) for c in ctl.cards)),
        tuple((c.index, c.uuid, c.info.name) for c in ctl.cards),
    )


class MqttBridge:
    """Connects a running daemon to an MQTT broker; see the module docstring.

    ``configured_budget_w``: the budget from the config (W). ``feed``: needed with a wall
    meter (plug-side limit, PSU efficiency). Metrics go on ``registry`` (default: the
    process-wide one). :meth:`attach` registers it with a daemon.
    """

    def __init__(
        self,
        cfg: MqttConfig,
        configured_budget_w: float,
        feed: FeedConfig | None = None,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cfg.wall_meter is not None and feed is None:
            raise ValueError("a wall meter needs the [feed] section (plug-side limit, PSU efficiency)")
        self.cfg = cfg
        self.configured_w = configured_budget_w
        self.clock = clock
        self.metrics = MqttMetrics(registry)
        self.meter = WallMeter(cfg.wall_meter, feed, self.metrics) if cfg.wall_meter and feed else None
        self.remote_w: float | None = None
        self.base = cfg.topic()
        self.availability_topic = f"{self.base}/availability"
        self.state_topic = f"{self.base}/state"
        remote = cfg.remote_budget
        self.command_topic = remote.command_topic or f"{self.base}/budget/set"
        self.response_topic = remote.response_topic or f"{self.base}/budget/result"
        self.ha_status_topic = f"{cfg.discovery_prefix}/status"
        self.connected: bool | None = None  # None: not tried yet
        self._latest: Snapshot | None = None
        self._changed = asyncio.Event()
        self._board: deque[tuple[float, float]] = deque(maxlen=256)  # (s, W); ~20 at 10 ticks/s
        self._applied_mw: int | None = None
        self.budget_source = "config"  # which source set the budget in force
        self._infeasible_said: int | None = None
        self._discovered: tuple | None = None  # the card set discovery was last sent for
        self.metrics.meter_budget.set(configured_budget_w)

    def attach(self, daemon: Daemon) -> None:
        """Run beside ``daemon``: a tick listener, a reload listener and a service."""
        daemon.listeners.append(self.on_tick)
        daemon.reload_listeners.append(lambda ok: self.on_reload(daemon.controller))
        daemon.services.append(self.run)

    # -- the tick listener (event-loop thread, between ticks; must not block) ---------
    def on_tick(self, report: TickReport, ctl: Controller) -> None:
        now = self.clock()
        self._apply_budget(ctl)
        snap = take_snapshot(report, ctl)
        self._board.append((now, snap.sum_power_w))
        while self._board and now - self._board[0][0] > BOARD_WINDOW_S:
            self._board.popleft()
        if self.meter is not None:
            self.meter.check_age(now)
        if self._latest is None or snap.limits_key != self._latest.limits_key:
            self._changed.set()
        self._latest = snap

    def on_reload(self, ctl: Controller | None) -> None:
        """After a reload, before the tick that acts on it: the file's budget is the
        configured one now, and a lower meter or remote budget stays in force."""
        if ctl is not None and self._applied_mw is not None:
            self._apply_budget(ctl)

    def desired_budget_w(self) -> tuple[float, str]:
        """The budget the sources ask for (W), and which source sets it."""
        candidates = [(self.configured_w, "config")]
        if self.meter is not None and self.meter.budget_w is not None:
            candidates.append((self.meter.budget_w, "wall_meter"))
        if self.remote_w is not None:
            candidates.append((self.remote_w, "remote"))
        return min(candidates, key=lambda c: c[0])

    def _apply_budget(self, ctl: Controller) -> None:
        if self._applied_mw is not None and ctl.budget_mw != self._applied_mw:
            # Someone else (a reload) set the budget: that is the configured one now.
            self.configured_w = ctl.budget_mw / 1000
            log.info("configured_budget_changed", budget_w=self.configured_w)
        want_w, source = self.desired_budget_w()
        lowest_w = floor_w(ctl)
        if want_w < lowest_w:
            if self._infeasible_said != int(want_w * 1000):
                log.error("budget_below_floor", wanted_w=round(want_w, 1), source=source, floor_w=lowest_w,
                          detail="holding the cards at their minimum limits instead")
                self._infeasible_said = int(want_w * 1000)
            want_w = lowest_w
        if int(want_w * 1000) != ctl.budget_mw:
            old_w = ctl.budget_mw / 1000
            try:
                ctl.set_budget(want_w, reason=source)
            except BudgetInfeasible as exc:
                if self._infeasible_said != int(want_w * 1000):
                    log.error("budget_change_refused", wanted_w=round(want_w, 1), source=source, error=str(exc))
                    self._infeasible_said = int(want_w * 1000)
            else:
                log.info("budget_changed", from_w=old_w, to_w=ctl.budget_mw / 1000, source=source)
        if int(want_w * 1000) == ctl.budget_mw:
            self.budget_source = source
        self._applied_mw = ctl.budget_mw

    def board_power_w(self) -> float | None:
        """The lowest summed GPU board power of the last :data:`BOARD_WINDOW_S` (W)."""
        return min((w for _, w in self._board), default=None)

    # -- payloads ---------------------------------------------------------------------
    def bank_state(self, snap: Snapshot) -> dict[str, Any]:
        meter = self.meter
        return {
            **snap.bank,
            "budget_source": self.budget_source,  # of the budget in force, not one still to apply
            "configured_budget_w": self.configured_w,
            "floor_w": snap.floor_w,
            "remote_budget_w": self.remote_w,
            "meter_budget_w": None if meter is None or meter.budget_w is None else round(meter.budget_w, 1),
            "wall_meter": None if meter is None else meter.state,
            "wall_power_w": None if meter is None else meter.wall_w,
            "non_gpu_wall_w": None if meter is None or meter.non_gpu_w is None else round(meter.non_gpu_w, 1),
        }

    def card_topic(self, index: int) -> str:
        return f"{self.base}/gpu/{index}"

    def discovery(self, snap: Snapshot) -> list[tuple[str, dict[str, Any]]]:
        """Home Assistant MQTT discovery: (config topic, payload) for every sensor."""
        node = self.cfg.node_id
        device = {
            "identifiers": [f"powerbudgetd_{node}"], "name": f"powerbudgetd {node}",
            "manufacturer": "powerbudgetd", "model": "GPU power budget", "sw_version": __version__,
        }
        sensors = [
            ("budget", "Budget", self.state_topic, "budget_w"),
            ("sum_limits", "Sum of power limits", self.state_topic, "sum_limits_w"),
            ("sum_power", "Sum of GPU power", self.state_topic, "sum_power_w"),
        ]
        if self.meter is not None:
            sensors.append(("wall_power", "Wall power", self.state_topic, "wall_power_w"))
        for c in snap.cards:
            topic = self.card_topic(c["index"])
            sensors.append((f"{c['uuid']}_limit", f"GPU {c['index']} power limit", topic, "limit_w"))
            sensors.append((f"{c['uuid']}_power", f"GPU {c['index']} power", topic, "power_avg_w"))
        out = []
        for key, name, topic, field in sensors:
            object_id = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in key)
            out.append((
                f"{self.cfg.discovery_prefix}/sensor/powerbudgetd_{node}/{object_id}/config",
                {
                    "name": name, "unique_id": f"powerbudgetd_{node}_{object_id}",
                    "state_topic": topic, "value_template": f"{{{{ value_json.{field} }}}}",
                    "device_class": "power", "unit_of_measurement": "W", "state_class": "measurement",
                    "availability_topic": self.availability_topic,
                    "payload_available": "online", "payload_not_available": "offline",
                    "device": device, "origin": {"name": "powerbudgetd", "sw_version": __version__},
                },
            ))
        return out

    # -- the service ------------------------------------------------------------------
    async def run(self, daemon: Daemon | None = None) -> None:
        """Stay connected until cancelled; every failure ends in a retry, never a raise."""
        attempt = 0
        while True:
            try:
                async with self._client() as client:
                    attempt = 0
                    self._set_connected(True)
                    await self._session(client)
            except aiomqtt.MqttError as exc:
                self._set_connected(False, str(exc))
            except (OSError, ssl.SSLError, ValueError) as exc:  # e.g. an unreadable CA file
                self._set_connected(False, f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001 - a bug here must not end MQTT for good
                log.exception("mqtt_failed")
                self._set_connected(False, f"{type(exc).__name__}: {exc}")
            delay = min(self.cfg.reconnect_max_s, self.cfg.reconnect_min_s * 2**attempt)
            attempt = min(attempt + 1, 30)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))  # jitter: no reconnect storms

    def _client(self) -> aiomqtt.Client:
        cfg = self.cfg
        tls = None
        if cfg.tls:
            tls = aiomqtt.TLSParameters(
                ca_certs=None if cfg.ca_file is None else str(cfg.ca_file),
                certfile=None if cfg.cert_file is None else str(cfg.cert_file),
                keyfile=None if cfg.key_file is None else str(cfg.key_file),
            )
        return aiomqtt.Client(
            cfg.host, cfg.port,
            username=cfg.username,
            password=None if cfg.password is None else cfg.password.get_secret_value(),
            identifier=f"powerbudgetd-{cfg.node_id}",
            will=aiomqtt.Will(self.availability_topic, "offline", qos=1, retain=True),
            keepalive=cfg.keepalive_s,
            timeout=10,
            tls_params=tls,
            tls_insecure=cfg.tls_insecure if cfg.tls else None,
            max_queued_outgoing_messages=1000,  # a stalled broker cannot grow memory without bound
        )

    def _set_connected(self, up: bool, error: str | None = None) -> None:
        self.metrics.connected.set(1 if up else 0)
        if up == self.connected:
            return
        first = self.connected is None
        self.connected = up
        where = f"{self.cfg.host}:{self.cfg.port}"
        if up:
            log.info("mqtt_connected", broker=where, base_topic=self.base)
        else:
            log.warning("mqtt_unavailable" if first else "mqtt_disconnected", broker=where, error=error,
                        detail="control goes on; retrying with backoff")

    async def _session(self, client: aiomqtt.Client) -> None:
        try:
            await client.publish(self.availability_topic, "online", qos=1, retain=True)
            topics = [self.ha_status_topic] if self.cfg.discovery else []
            if self.meter is not None:
                topics.append(self.meter.cfg.state_topic())
                if avail := self.meter.cfg.availability():
                    topics.append(avail[0])
            if self.cfg.remote_budget.enabled:
                topics.append(self.command_topic)
            if topics:
                await client.subscribe([(t, 1) for t in topics])
            self._discovered = None
            tasks = [asyncio.create_task(self._publish_loop(client)), asyncio.create_task(self._receive_loop(client))]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:  # the daemon is stopping: last state, then offline
            try:
                async with asyncio.timeout(1.0):
                    if self._latest is not None:
                        await self._publish_state(client, self._latest)
                    await client.publish(self.availability_topic, "offline", qos=1, retain=True)
            except (aiomqtt.MqttError, TimeoutError):
                pass
            raise

    async def _publish_loop(self, client: aiomqtt.Client) -> None:
        while True:
            self._changed.clear()
            snap = self._latest
            if snap is not None:
                if self.cfg.discovery and self._discovered != snap.cards_key:
                    await self._publish_discovery(client, snap)
                await self._publish_state(client, snap)
            await asyncio.sleep(MIN_PUBLISH_GAP_S)
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=max(0.0, self.cfg.publish_interval_s - MIN_PUBLISH_GAP_S))
            except TimeoutError:
                pass

    async def _publish_state(self, client: aiomqtt.Client, snap: Snapshot) -> None:
        await client.publish(self.state_topic, json.dumps(self.bank_state(snap)), retain=True)
        for card in snap.cards:
            await client.publish(self.card_topic(card["index"]), json.dumps(card), retain=True)

    async def _publish_discovery(self, client: aiomqtt.Client, snap: Snapshot) -> None:
        for topic, payload in self.discovery(snap):
            await client.publish(topic, json.dumps(payload), qos=1, retain=True)
        self._discovered = snap.cards_key

    async def _receive_loop(self, client: aiomqtt.Client) -> None:
        meter_topic = self.meter.cfg.state_topic() if self.meter else None
        meter_avail = self.meter.cfg.availability() if self.meter else None
        async for msg in client.messages:
            topic = str(msg.topic)
            payload = msg.payload if isinstance(msg.payload, bytes) else str(msg.payload).encode()
            if topic == self.ha_status_topic and self.cfg.discovery:
                if payload == b"online" and self._latest is not None:  # HA restarted: tell it again
                    await self._publish_discovery(client, self._latest)
                    await self._publish_state(client, self._latest)
            elif self.meter is not None and topic == meter_topic:
                self.meter.reading(payload, self.clock(), self.board_power_w(), self.configured_w, retained=msg.retain)
                self._changed.set()
            elif meter_avail is not None and topic == meter_avail[0]:
                if payload.decode("utf-8", "replace").strip() in meter_avail[1]:
                    self.meter.offline()  # type: ignore[union-attr]
            elif topic == self.command_topic and self.cfg.remote_budget.enabled:
                await client.publish(self.response_topic, json.dumps(self.remote_command(payload)), qos=1)

    def remote_command(self, payload: bytes) -> dict[str, Any]:
        """Validate and take a remote budget command; returns the response payload.

        Accepted: a value in [floor, configured budget] (W), applied at the next tick
        through the controller. Rejected: anything else, with the reason.
        """
        snap = self._latest
        lo = None if snap is None else snap.floor_w
        response: dict[str, Any] = {"ok": False, "requested": _shown(payload), "min_w": lo, "max_w": self.configured_w}
        try:
            watts = parse_budget_command(payload)
            if lo is None:
                raise ValueError("not ready: the cards are not enumerated yet")
            if watts < lo:
                raise ValueError(f"{watts:g} W is below the sum of the cards' minimum power limits ({lo:g} W)")
            if watts > self.configured_w:
                raise ValueError(
                    f"{watts:g} W is above the configured budget ({self.configured_w:g} W): "
                    "a remote budget may lower or restore it, never exceed it"
                )
        except ValueError as exc:
            self.metrics.remote.labels("rejected").inc()
            log.warning("remote_budget_rejected", requested=_shown(payload), reason=str(exc))
            return {**response, "error": str(exc)}
        self.metrics.remote.labels("accepted").inc()
        self.remote_w = None if watts >= self.configured_w else watts
        log.info("remote_budget_accepted", budget_w=watts)
        effective_w, source = self.desired_budget_w()
        return {**response, "ok": True, "budget_w": watts, "effective_budget_w": effective_w, "budget_source": source}
