"""The MQTT bridge: one broker connection, the publish and receive loops. The only
module that imports ``aiomqtt``.

Two halves meet on the daemon's event-loop thread:

- :meth:`MqttBridge.on_tick` (the side-channel hook) is cheap and never waits: it keeps
  the tick's bank snapshot in a latest-value slot, the recent board power for the wall
  meter, and wakes the publisher.
- :meth:`MqttBridge.run` stays connected: publish, subscribe, and on any broker trouble
  reconnect with backoff and jitter. A dead broker costs this task, never a tick.

What is published lives in :mod:`.state`, what comes in in :mod:`.inbox`, who we are
on the broker in :mod:`.identity`; this module connects them to the broker.

Budgets: the wall meter and the remote budget report to the daemon's budget arbiter;
the daemon alone sets the controller's budget from it, between ticks.

Hostile input: every message is size-capped before it is parsed and handled in
isolation (any exception is counted and logged once per kind; the session goes on);
retained commands are ignored (a command is live, not history); the client id is unique
per host and process, and another instance announcing the same node id is warned about
by name; the reconnect backoff keeps growing while connections keep dropping.

Home Assistant (:mod:`.discovery`): a discovery config is sent when it changes (cards
appear, the budget number's bounds move on a reload), all of them again on Home
Assistant's birth message. Retained topics of ours that the current set no longer has
(a card gone since the last run, an entity no longer offered) are found by subscribing
to our own discovery and card topics, and cleared with an empty retained payload. Each
card has an availability topic: a card lost in this run reads unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import aiomqtt
import structlog
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.subscribeoptions import SubscribeOptions
from prometheus_client import REGISTRY, CollectorRegistry

import powerbudgetd.channels.mqtt.discovery as ha
from powerbudgetd.channels.mqtt.identity import Identity
from powerbudgetd.channels.mqtt.inbox import Inbox
from powerbudgetd.channels.mqtt.metrics import MqttMetrics
from powerbudgetd.channels.mqtt.peers import MeterPeers
from powerbudgetd.channels.mqtt.remote import RemoteBudget
from powerbudgetd.channels.mqtt.refusals import Refusals
from powerbudgetd.channels.mqtt.state import StatePublisher
from powerbudgetd.channels.mqtt.wallmeter import WallMeter
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.backoff import Backoff
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.sensor import Reach
from powerbudgetd.config import MqttConfig

if TYPE_CHECKING:
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.config import Settings

log = structlog.get_logger("powerbudgetd")

# A meter averages over ~1 s and its message arrives late; GPU draw in that time may
# have risen. Pairing the reading with the *lowest* board power of the last 2 s
# overstates the non-GPU draw, never understates it: the error lowers the budget.
BOARD_WINDOW_S = 2.0
MIN_PUBLISH_GAP_S = 0.25  # coalesce bursts of limit changes (boot, reclaim)
STABLE_SESSION_S = 30.0  # a connection that lasted less does not reset the backoff
TEARDOWN_S = 2.0  # a session's tasks get this long to end once cancelled
RETAIN_NOT_SUPPORTED = 154  # MQTT 5 CONNACK reason code 0x9A


class MqttBridge:
    """Connects a running daemon to an MQTT broker; see the module docstring.

    ``arbiter``: the daemon's budget arbiter (the configured budget is read there, the
    wall meter's and remote budgets offered there). ``feed``: needed with a wall meter
    (plug-side limit, PSU efficiency). Metrics go on ``registry`` (default: the
    process-wide one). ``energy_j``: reads a card's energy counter (J since driver load,
    by UUID; None: not reported), e.g. the NVML layer's ``energy_j``; called only from
    :meth:`run`, which the daemon runs while NVML is up. None: no energy entities.
    Register it with ``Daemon.register``.

    Set after construction: :attr:`configuration_url` (the device page's link: the
    metrics endpoint) and :meth:`attach_ups` (a UPS channel's state).

    Parts: :attr:`state` (what is published), :attr:`inbox` (what comes in),
    :attr:`identity` (the client id and the node id's announcement).

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
        energy_j: Callable[[str], float | None] | None = None,
    ) -> None:
        if cfg.wall_meter is not None and feed is None:
            raise ValueError("a wall meter needs the [feed] section (plug-side limit, PSU efficiency)")
        self.cfg = cfg
        self.arbiter = arbiter
        self.clock = clock
        self.metrics = MqttMetrics(registry)
        self.meter = WallMeter(cfg.wall_meter, feed, self.metrics, arbiter) if cfg.wall_meter and feed else None
        self.remote = RemoteBudget(arbiter, self.metrics, cfg.remote_budget.raise_interval_s)
        remote = cfg.remote_budget
        self.layout = ha.Layout(
            node_id=cfg.node_id, base=cfg.topic(), prefix=cfg.discovery_prefix,
            command_topic=(remote.command_topic or f"{cfg.topic()}/budget/set") if remote.enabled else None,
            response_topic=(remote.response_topic or f"{cfg.topic()}/budget/result") if remote.enabled else None,
        )
        self.connected: bool | None = None  # None: not tried yet
        self.refusals = Refusals(f"{cfg.host}:{cfg.port}", self.layout.availability)
        self._board: deque[tuple[float, float]] = deque(maxlen=256)  # (s, W); ~20 at 10 ticks/s
        self.state = StatePublisher(cfg, self.layout, arbiter, self.remote, self.meter, clock=clock,
                                    energy_j=energy_j)
        self.identity = Identity(cfg.node_id, self.layout.base, self.metrics)
        self.peers = MeterPeers(cfg.node_id, cfg.meters_topic)
        self.inbox = Inbox(cfg, self.state, self.identity, self.metrics, clock=clock,
                           board_power_w=self.board_power_w, peers=self.peers)
        if cfg.wall_meter is not None and self.meter is not None:
            self.peers.read({cfg.wall_meter.source_id(): (cfg.wall_meter.reach(), "[mqtt.wall_meter]")})
        self.metrics.meter_budget.set(arbiter.configured_w)
        self._sleep = asyncio.sleep  # tests watch the backoff through this

    @property
    def configured_w(self) -> float:
        """The configured budget (W), as the arbiter holds it."""
        return self.arbiter.configured_w

    @property
    def remote_w(self) -> float | None:
        return self.remote.budget_w

    @property
    def client_id(self) -> str:
        return self.identity.client_id

    @property
    def retain(self) -> bool:
        """Whether our topics are published retained ("auto": until the broker refuses)."""
        return self.state.retain

    @property
    def configuration_url(self) -> str | None:
        return self.state.configuration_url

    @configuration_url.setter
    def configuration_url(self, url: str | None) -> None:
        self.state.configuration_url = url

    def announce_meter(self, source: str, reach: Reach, setting: str) -> None:
        """Another meter this daemon closes a loop on (the UPS): announced with the wall
        meter, checked against the other daemons reading it (``peers``)."""
        self.peers.read({**self.peers.mine, source: (reach, setting)})

    def attach_ups(self, state: Callable[[], Mapping[str, Any]]) -> None:
        """Publish a UPS's state: ``state()`` returns at least ``state`` (``ok``, or why
        its data is silent) and ``status`` (NUT's flags, space-separated; ``OB``: on
        battery). Adds the *UPS* sensor and the *On battery* binary sensor."""
        self.state.ups = state
        self.state.changed.set()

    @property
    def budget_source(self) -> str | None:
        """The source of the budget in force at the last tick (None before one)."""
        latest = self.state.latest
        return None if latest is None else latest.budget_source

    # -- the side-channel hooks (event-loop thread, between ticks; must not block) -----
    def on_tick(self, report: TickReport) -> None:
        now = self.clock()
        snap = report.snapshot
        if (board_w := snap.sum_power_known_w) is not None:  # a card unread is not 0 W: kept out
            self._board.append((now, board_w))
        while self._board and now - self._board[0][0] > BOARD_WINDOW_S:
            self._board.popleft()
        if self.meter is not None:
            self.meter.check_age(now)
        latest = self.state.latest
        if latest is None or ha.limits_key(snap) != ha.limits_key(latest):
            self.state.changed.set()
        self.state.latest = snap

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        """The configured budget lives in the arbiter (the daemon replaced it there);
        publish the new state soon. ``[mqtt]`` itself needs a restart."""
        self.state.changed.set()

    def board_power_w(self) -> float | None:
        """The lowest summed GPU board power of the last :data:`BOARD_WINDOW_S` (W)."""
        return min((w for _, w in self._board), default=None)

    # -- the service ------------------------------------------------------------------
    async def run(self) -> None:
        """Stay connected until cancelled; every failure ends in a retry, never a raise."""
        backoff = Backoff(self.cfg.reconnect_min_s, self.cfg.reconnect_max_s)
        while True:
            up_at: float | None = None
            try:
                async with _client(self.cfg, self.client_id, self.layout.availability, self.retain) as client:
                    up_at = time.monotonic()
                    self.refusals.watch(client._client)  # PUBACK reasons: aiomqtt drops them
                    self._set_connected(True)
                    await self._session(client)
            except MqttConnectError as exc:
                if exc.rc == RETAIN_NOT_SUPPORTED and self.retain and self.cfg.retain == "auto":
                    self.state.retain = False
                    log.warning("mqtt_retain_unavailable", broker=f"{self.cfg.host}:{self.cfg.port}",
                                detail="the broker does not keep retained messages (retain_available false): "
                                "publishing state, discovery and the last will without retain")
                    continue
                if exc.rc == RETAIN_NOT_SUPPORTED:
                    self._set_connected(False, "the broker refuses retained messages (Retain not supported; "
                                        "mosquitto: retain_available false): set [mqtt] retain = false or \"auto\"")
                else:
                    self._set_connected(False, str(exc))
            except aiomqtt.MqttError as exc:
                self._set_connected(False, str(exc))
            except (OSError, ssl.SSLError, ValueError) as exc:  # e.g. an unreadable CA file
                self._set_connected(False, f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001 - a bug here must not end MQTT for good
                log.exception("mqtt_failed")
                self._set_connected(False, f"{type(exc).__name__}: {exc}")
            if up_at is not None and time.monotonic() - up_at >= STABLE_SESSION_S:
                backoff.reset()  # only a connection that held resets the backoff, not one kicked at once
            await self._sleep(backoff.next_s() * random.uniform(0.5, 1.0))  # jitter: no reconnect storms

    def _set_connected(self, up: bool, error: str | None = None) -> None:
        self.metrics.connected.set(1 if up else 0)
        if up == self.connected:
            return
        first = self.connected is None
        self.connected = up
        where = f"{self.cfg.host}:{self.cfg.port}"
        if up:
            log.info("mqtt_connected", broker=where, base_topic=self.layout.base)
        else:
            log.warning("mqtt_unavailable" if first else "mqtt_disconnected", broker=where, error=error,
                        detail="control goes on; retrying with backoff")

    def _subscriptions(self) -> list[str]:
        """Every topic a session subscribes to, in order."""
        topics = [self.layout.instance, self.layout.availability, self.peers.wildcard]
        if self.cfg.discovery:
            topics.append(self.layout.ha_status)
        if self.meter is not None:
            topics.append(self.meter.cfg.state_topic())
            if avail := self.meter.cfg.availability():
                topics.append(avail[0])
        if self.layout.command_topic is not None:
            topics.append(self.layout.command_topic)
        # Our own retained topics: those the current entities no longer have are cleared.
        # (Their retain flag means "held by the broker": set only when replayed.)
        topics.append(self.layout.card_wildcard)
        if self.cfg.discovery:
            topics += self.layout.config_wildcards()
        return topics

    async def _session(self, client: aiomqtt.Client) -> None:
        layout, retain = self.layout, self.retain
        try:
            await client.publish(layout.availability, "online", qos=1, retain=retain)
            self.state.new_session()
            # Commands keep their retain flag as published (MQTT 5), so a retained command
            # is recognised even when it arrives live, not only when replayed on subscribe.
            as_published = SubscribeOptions(qos=1, retainAsPublished=True)
            topics = self._subscriptions()
            granted = await client.subscribe([(t, as_published if t == layout.command_topic else SubscribeOptions(qos=1))
                                              for t in topics])
            self.refusals.check_suback(topics, granted)
            await client.publish(layout.instance, json.dumps(self.identity.announcement()), qos=1, retain=retain)
            if self.peers.mine:  # the meters it reads: hosts behind one meter see each other
                await client.publish(self.peers.own_topic, json.dumps(self.peers.announcement()), qos=1, retain=retain)
            tasks = [asyncio.create_task(self._publish_loop(client)), asyncio.create_task(self._receive_loop(client))]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
            finally:
                await _cancel_within(tasks, TEARDOWN_S)
        except asyncio.CancelledError:  # the daemon is stopping: last state, then offline
            await self._goodbye(client)
            raise

    async def _goodbye(self, client: aiomqtt.Client) -> None:
        """On stop: the last state, then offline, within a second (or not at all)."""
        try:
            async with asyncio.timeout(1.0):
                if self.state.latest is not None:
                    await self.state.publish_state(client, self.state.latest)
                await client.publish(self.layout.availability, "offline", qos=1, retain=self.retain)
                if self.retain:  # leave no announcement behind to be mistaken for a live twin
                    await client.publish(self.layout.instance, b"", qos=1, retain=True)
                    if self.peers.mine:  # ... nor a host behind a meter that is gone
                        await client.publish(self.peers.own_topic, b"", qos=1, retain=True)
        except (aiomqtt.MqttError, TimeoutError):
            pass

    async def _publish_loop(self, client: aiomqtt.Client) -> None:
        changed = self.state.changed
        while True:
            changed.clear()
            snap = self.state.latest
            if snap is not None:
                await self.state.publish(client, snap)
            await asyncio.sleep(MIN_PUBLISH_GAP_S)
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that lands as the event is set (a limit change while the daemon stops), and
            # the loop would outlive the daemon's stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, self.cfg.publish_interval_s - MIN_PUBLISH_GAP_S)):
                    await changed.wait()

    async def _receive_loop(self, client: aiomqtt.Client) -> None:
        async for msg in client.messages:
            topic = str(msg.topic)
            payload = msg.payload if isinstance(msg.payload, bytes | bytearray) else str(msg.payload).encode()
            kind = self.inbox.admit(topic, payload)  # capped before any parsing
            if kind is None:
                continue
            try:
                await self.inbox.handle(client, kind, bytes(payload), bool(msg.retain), topic)
            except (asyncio.CancelledError, aiomqtt.MqttError):
                raise  # the session's own end, not the message's fault
            except Exception as exc:  # noqa: BLE001 - one message must never end the session
                self.inbox.drop(kind, type(exc).__name__, str(exc)[:200])


def _client(cfg: MqttConfig, client_id: str, will_topic: str, retain: bool) -> aiomqtt.Client:
    """A client for one connection; its last will says ``offline`` on ``will_topic``."""
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
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,  # CONNACK reason codes say why a broker refuses
        will=aiomqtt.Will(will_topic, "offline", qos=1, retain=retain),
        keepalive=cfg.keepalive_s,
        timeout=10,
        tls_params=tls,
        tls_insecure=cfg.tls_insecure if cfg.tls else None,
        max_queued_outgoing_messages=1000,  # a stalled broker cannot grow memory without bound
    )


async def _cancel_within(tasks: list[asyncio.Task[Any]], deadline_s: float) -> None:
    """Cancel ``tasks`` and wait at most ``deadline_s`` for them: a task that ignores
    its cancellation is left behind (and said), never waited on forever."""
    for task in tasks:
        task.cancel()
    _, pending = await asyncio.wait(tasks, timeout=deadline_s)
    for task in pending:
        log.error("mqtt_task_stuck", task=task.get_coro().__qualname__, deadline_s=deadline_s)  # type: ignore[union-attr]
