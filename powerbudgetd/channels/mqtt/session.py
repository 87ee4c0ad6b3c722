"""The MQTT bridge: one broker connection, the publish and receive loops. The only
module that imports ``aiomqtt``.

Two halves meet on the daemon's event-loop thread:

- :meth:`MqttBridge.on_tick` (the side-channel hook) is cheap and never waits: it keeps
  the tick's bank snapshot in a latest-value slot, the recent board power for the wall
  meter, and wakes the publisher.
- :meth:`MqttBridge.run` stays connected: publish, subscribe, and on any broker trouble
  reconnect with backoff and jitter. A dead broker costs this task, never a tick.

Budgets: the wall meter and the remote budget report to the daemon's budget arbiter;
the daemon alone sets the controller's budget from it, between ticks.
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiomqtt
import structlog
from prometheus_client import REGISTRY, CollectorRegistry

from powerbudgetd.channels.mqtt import discovery as ha
from powerbudgetd.channels.mqtt.metrics import MqttMetrics
from powerbudgetd.channels.mqtt.remote import RemoteBudget
from powerbudgetd.channels.mqtt.wallmeter import WallMeter
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.snapshot import BankSnapshot
from powerbudgetd.service.config import MqttConfig

if TYPE_CHECKING:
    from powerbudgetd.control.controller import TickReport
    from powerbudgetd.service.config import Settings

log = structlog.get_logger("powerbudgetd")

# A meter averages over ~1 s and its message arrives late; GPU draw in that time may
# have risen. Pairing the reading with the *lowest* board power of the last 2 s
# overstates the non-GPU draw, never understates it: the error lowers the budget.
BOARD_WINDOW_S = 2.0
MIN_PUBLISH_GAP_S = 0.25  # coalesce bursts of limit changes (boot, reclaim)


class MqttBridge:
    """Connects a running daemon to an MQTT broker; see the module docstring.

    ``arbiter``: the daemon's budget arbiter (the configured budget is read there, the
    wall meter's and remote budgets offered there). ``feed``: needed with a wall meter
    (plug-side limit, PSU efficiency). Metrics go on ``registry`` (default: the
    process-wide one). Register it with ``Daemon.register``.

    Raises ValueError for a wall meter without a feed.
    """

    def __init__(
        self,
        cfg: MqttConfig,
        arbiter: BudgetArbiter,
        feed: Feed | None = None,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cfg.wall_meter is not None and feed is None:
            raise ValueError("a wall meter needs the [feed] section (plug-side limit, PSU efficiency)")
        self.cfg = cfg
        self.arbiter = arbiter
        self.clock = clock
        self.metrics = MqttMetrics(registry)
        self.meter = WallMeter(cfg.wall_meter, feed, self.metrics, arbiter) if cfg.wall_meter and feed else None
        self.remote = RemoteBudget(arbiter, self.metrics)
        self.base = cfg.topic()
        self.availability_topic = f"{self.base}/availability"
        self.state_topic = f"{self.base}/state"
        remote = cfg.remote_budget
        self.command_topic = remote.command_topic or f"{self.base}/budget/set"
        self.response_topic = remote.response_topic or f"{self.base}/budget/result"
        self.ha_status_topic = f"{cfg.discovery_prefix}/status"
        self.connected: bool | None = None  # None: not tried yet
        self._latest: BankSnapshot | None = None
        self._changed = asyncio.Event()
        self._board: deque[tuple[float, float]] = deque(maxlen=256)  # (s, W); ~20 at 10 ticks/s
        self._discovered: tuple | None = None  # the card set discovery was last sent for
        self.metrics.meter_budget.set(arbiter.configured_w)

    @property
    def configured_w(self) -> float:
        """The configured budget (W), as the arbiter holds it."""
        return self.arbiter.configured_w

    @property
    def remote_w(self) -> float | None:
        return self.remote.budget_w

    @property
    def budget_source(self) -> str | None:
        """The source of the budget in force at the last tick (None before one)."""
        return None if self._latest is None else self._latest.budget_source

    # -- the side-channel hooks (event-loop thread, between ticks; must not block) -----
    def on_tick(self, report: TickReport) -> None:
        now = self.clock()
        snap = report.snapshot
        self._board.append((now, snap.sum_power_avg_w))
        while self._board and now - self._board[0][0] > BOARD_WINDOW_S:
            self._board.popleft()
        if self.meter is not None:
            self.meter.check_age(now)
        if self._latest is None or ha.limits_key(snap) != ha.limits_key(self._latest):
            self._changed.set()
        self._latest = snap

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        """The configured budget lives in the arbiter (the daemon replaced it there);
        publish the new state soon. ``[mqtt]`` itself needs a restart."""
        self._changed.set()

    def board_power_w(self) -> float | None:
        """The lowest summed GPU board power of the last :data:`BOARD_WINDOW_S` (W)."""
        return min((w for _, w in self._board), default=None)

    # -- payloads ---------------------------------------------------------------------
    def bank_state(self, snap: BankSnapshot) -> dict[str, Any]:
        meter = self.meter
        return ha.bank_state(
            snap,
            configured_budget_w=self.configured_w,
            remote_budget_w=self.remote_w,
            meter_budget_w=None if meter is None or meter.budget_w is None else round(meter.budget_w, 1),
            wall_meter=None if meter is None else meter.state,
            wall_power_w=None if meter is None else meter.wall_w,
            non_gpu_wall_w=None if meter is None or meter.non_gpu_w is None else round(meter.non_gpu_w, 1),
        )

    def card_topic(self, index: int) -> str:
        return f"{self.base}/gpu/{index}"

    def discovery(self, snap: BankSnapshot) -> list[tuple[str, dict[str, Any]]]:
        """Home Assistant MQTT discovery: (config topic, payload) for every sensor."""
        return ha.discovery(
            snap, node_id=self.cfg.node_id, prefix=self.cfg.discovery_prefix, state_topic=self.state_topic,
            availability_topic=self.availability_topic, card_topic=f"{self.base}/gpu/{{index}}",
            wall_meter=self.meter is not None,
        )

    def remote_command(self, payload: bytes) -> dict[str, Any]:
        """Validate and take a remote budget command; returns the response payload (see
        :class:`~powerbudgetd.channels.mqtt.remote.RemoteBudget`)."""
        snap = self._latest
        return self.remote.command(payload, self.clock(), None if snap is None else snap.floor_w)

    # -- the service ------------------------------------------------------------------
    async def run(self) -> None:
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
                if self.cfg.discovery and self._discovered != ha.cards_key(snap):
                    await self._publish_discovery(client, snap)
                await self._publish_state(client, snap)
            await asyncio.sleep(MIN_PUBLISH_GAP_S)
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=max(0.0, self.cfg.publish_interval_s - MIN_PUBLISH_GAP_S))
            except TimeoutError:
                pass

    async def _publish_state(self, client: aiomqtt.Client, snap: BankSnapshot) -> None:
        await client.publish(self.state_topic, json.dumps(self.bank_state(snap)), retain=True)
        for card in snap.cards:
            await client.publish(self.card_topic(card.index), json.dumps(ha.card_state(card)), retain=True)

    async def _publish_discovery(self, client: aiomqtt.Client, snap: BankSnapshot) -> None:
        for topic, payload in self.discovery(snap):
            await client.publish(topic, json.dumps(payload), qos=1, retain=True)
        self._discovered = ha.cards_key(snap)

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
                self.meter.reading(payload, self.clock(), self.board_power_w(), retained=msg.retain)
                self._changed.set()
            elif meter_avail is not None and topic == meter_avail[0]:
                if payload.decode("utf-8", "replace").strip() in meter_avail[1]:
                    self.meter.offline()  # type: ignore[union-attr]
            elif topic == self.command_topic and self.cfg.remote_budget.enabled:
                await client.publish(self.response_topic, json.dumps(self.remote_command(payload)), qos=1)
