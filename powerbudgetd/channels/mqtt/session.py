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
import hashlib
import json
import os
import random
import socket
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

from powerbudgetd.core.backoff import Backoff
from powerbudgetd.channels.mqtt import discovery as ha
from powerbudgetd.channels.mqtt._text import shown
from powerbudgetd.channels.mqtt.metrics import MqttMetrics
from powerbudgetd.channels.mqtt.remote import RemoteBudget
from powerbudgetd.channels.mqtt.wallmeter import WallMeter
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.snapshot import BankSnapshot
from powerbudgetd.errors import NvmlError
from powerbudgetd.service.config import MqttConfig

if TYPE_CHECKING:
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.service.config import Settings

log = structlog.get_logger("powerbudgetd")

# A meter averages over ~1 s and its message arrives late; GPU draw in that time may
# have risen. Pairing the reading with the *lowest* board power of the last 2 s
# overstates the non-GPU draw, never understates it: the error lowers the budget.
BOARD_WINDOW_S = 2.0
MIN_PUBLISH_GAP_S = 0.25  # coalesce bursts of limit changes (boot, reclaim)
MAX_COMMAND_BYTES = 1024  # a budget command is a number or a small JSON object
MAX_METER_BYTES = 16 << 10  # a Tasmota SENSOR message is ~300 B; Shelly status ~1 KiB
MAX_OTHER_BYTES = 1024  # availability, Home Assistant status, instance announcements
STABLE_SESSION_S = 30.0  # a connection that lasted less does not reset the backoff
TEARDOWN_S = 2.0  # a session's tasks get this long to end once cancelled
RETAIN_NOT_SUPPORTED = 154  # MQTT 5 CONNACK reason code 0x9A
# NVML's energy counter costs ~3 ms a card (16 ms p99, brief): read in a worker thread,
# once per publish interval and never more often than this.
MIN_ENERGY_INTERVAL_S = 5.0
ENERGY_READ_GRACE_S = 1.0  # on stop: how long a read in flight may finish before NVML shuts down
MAX_OWN_BYTES = 64 << 10  # our own retained discovery configs and card states (~1 KiB each)


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
        self.layout = ha.Layout(
            node_id=cfg.node_id, base=self.base, prefix=cfg.discovery_prefix,
            command_topic=self.command_topic if remote.enabled else None,
            response_topic=self.response_topic if remote.enabled else None,
        )
        self.configuration_url: str | None = None
        self._ups: Callable[[], Mapping[str, Any]] | None = None
        self._energy_j = energy_j
        self.energy = ha.BankEnergy()
        self._energy_at = float("-inf")
        # Home Assistant's view, per broker session: every card seen in this run (by
        # UUID; a card that vanishes stays, unavailable), the configs and availability
        # last sent, and the retained topics of ours the broker holds.
        self._cards: dict[str, ha.CardEntry] = {}
        self._sent_configs: dict[str, str] = {}
        self._sent_avail: dict[int, str] = {}
        self._retained: set[str] = set()
        self.metrics.meter_budget.set(arbiter.configured_w)
        # One host, one identity: the node id names the bank; the client id this process.
        self.host = socket.gethostname()
        self.pid = os.getpid()
        digest = hashlib.sha256(f"{self.host}:{self.pid}:{time.time_ns()}".encode()).hexdigest()[:10]
        self.client_id = f"powerbudgetd-{cfg.node_id}-{digest}"
        self.instance_topic = f"{self.base}/instance"
        self.retain = cfg.retain is not False  # "auto" starts with retain, drops it if refused
        self._conflicts_said: set[tuple[str, int]] = set()
        self._dropped_said: set[tuple[str, str]] = set()
        self._last_message: dict[str, float] = {}
        self._retained_said: bytes | None = None
        self._sleep = asyncio.sleep  # tests watch the backoff through this

    @property
    def configured_w(self) -> float:
        """The configured budget (W), as the arbiter holds it."""
        return self.arbiter.configured_w

    @property
    def remote_w(self) -> float | None:
        return self.remote.budget_w

    def attach_ups(self, state: Callable[[], Mapping[str, Any]]) -> None:
        """Publish a UPS's state: ``state()`` returns at least ``state`` (``ok``, or why
        its data is silent) and ``status`` (NUT's flags, space-separated; ``OB``: on
        battery). Adds the *UPS* sensor and the *On battery* binary sensor."""
        self._ups = state
        self._changed.set()

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
        """The ``state`` payload. Wall power is null unless the meter's last reading is
        fresh and valid: a stale meter reads *unknown*, never its last value."""
        meter = self.meter
        fresh = meter is not None and meter.state == "ok"
        extra: dict[str, Any] = {}
        if self._ups is not None:
            extra.update(self._ups_state())
        energy_kwh = self.energy.bank_kwh()
        return ha.bank_state(
            snap,
            lost=self.lost_cards(snap),
            configured_budget_w=self.configured_w,
            remote_budget_w=self.remote_w,
            requested_budget_w=ha.requested_budget_w(self.remote_w, self.configured_w, snap.floor_w),
            meter_budget_w=None if meter is None or meter.budget_w is None else round(meter.budget_w, 1),
            wall_meter=None if meter is None else meter.state,
            wall_power_w=meter.wall_w if fresh and meter is not None else None,
            non_gpu_wall_w=(
                round(meter.non_gpu_w, 1) if fresh and meter is not None and meter.non_gpu_w is not None else None
            ),
            energy_kwh=None if energy_kwh is None else round(energy_kwh, 4),
            **extra,
        )

    def _ups_state(self) -> dict[str, Any]:
        assert self._ups is not None
        try:
            record = self._ups()
        except Exception:  # noqa: BLE001 - a UPS channel's bug costs its fields, not the state
            log.exception("mqtt_ups_state_failed")
            return {"ups": None, "on_battery": None}
        status = record.get("status")
        on_battery = None if not isinstance(status, str) else "OB" in status.split()
        return {"ups": record.get("state"), "ups_status": status, "on_battery": on_battery}

    def lost_cards(self, snap: BankSnapshot) -> list[int]:
        """Indices of the cards seen in this run that are gone or do not answer now."""
        present = {c.uuid: c for c in snap.cards}
        return sorted(
            entry.index for uuid, entry in self._cards.items()
            if uuid not in present or not ha.card_available(present[uuid])
        )

    def track_cards(self, snap: BankSnapshot) -> None:
        """Remember every card seen in this run (a card that vanishes stays, lost)."""
        for c in snap.cards:
            known = self._cards.get(c.uuid)
            energy = c.uuid in self.energy.cards
            if known is None or (known.index, known.name, known.energy) != (c.index, c.name, energy):
                # A new card taking a vanished one's index replaces it there.
                for uuid in [u for u, e in self._cards.items() if e.index == c.index and u != c.uuid]:
                    del self._cards[uuid]
                self._cards[c.uuid] = ha.CardEntry(c.index, c.uuid, c.name, energy)

    def entities(self, snap: BankSnapshot) -> ha.Entities:
        """Which Home Assistant entities exist now (see :class:`.discovery.Entities`)."""
        self.track_cards(snap)
        return ha.Entities(
            cards=tuple(sorted(self._cards.values(), key=lambda e: e.index)),
            floor_w=snap.floor_w, configured_w=self.configured_w,
            wall_meter=self.meter is not None, ups=self._ups is not None,
            remote=self.cfg.remote_budget.enabled, bank_energy=bool(self.energy.cards),
            configuration_url=self.configuration_url,
        )

    def card_topic(self, index: int) -> str:
        return f"{self.base}/gpu/{index}"

    def discovery(self, snap: BankSnapshot) -> list[tuple[str, dict[str, Any]]]:
        """Home Assistant MQTT discovery: (config topic, payload) for every entity."""
        return ha.discovery(self.layout, self.entities(snap))

    def remote_command(self, payload: bytes) -> dict[str, Any]:
        """Validate and take a remote budget command; returns the response payload (see
        :class:`~powerbudgetd.channels.mqtt.remote.RemoteBudget`)."""
        snap = self._latest
        response = self.remote.command(payload, self.clock(), None if snap is None else snap.floor_w)
        self._changed.set()  # the budget number shows the request at once
        return response

    # -- the service ------------------------------------------------------------------
    async def run(self) -> None:
        """Stay connected until cancelled; every failure ends in a retry, never a raise."""
        backoff = Backoff(self.cfg.reconnect_min_s, self.cfg.reconnect_max_s)
        while True:
            up_at: float | None = None
            try:
                async with self._client() as client:
                    up_at = time.monotonic()
                    self._set_connected(True)
                    await self._session(client)
            except MqttConnectError as exc:
                if exc.rc == RETAIN_NOT_SUPPORTED and self.retain and self.cfg.retain == "auto":
                    self.retain = False
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
            identifier=self.client_id,
            protocol=aiomqtt.ProtocolVersion.V5,  # CONNACK reason codes say why a broker refuses
            will=aiomqtt.Will(self.availability_topic, "offline", qos=1, retain=self.retain),
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
            await client.publish(self.availability_topic, "online", qos=1, retain=self.retain)
            topics = [self.instance_topic]
            if self.cfg.discovery:
                topics.append(self.ha_status_topic)
            if self.meter is not None:
                topics.append(self.meter.cfg.state_topic())
                if avail := self.meter.cfg.availability():
                    topics.append(avail[0])
            if self.cfg.remote_budget.enabled:
                topics.append(self.command_topic)
            # Our own retained topics: those the current entities no longer have are cleared.
            # (Their retain flag means "held by the broker": set only when replayed.)
            topics.append(self.layout.card_wildcard)
            if self.cfg.discovery:
                topics += self.layout.config_wildcards()
            self._sent_configs, self._sent_avail, self._retained = {}, {}, set()
            # Commands keep their retain flag as published (MQTT 5), so a retained command
            # is recognised even when it arrives live, not only when replayed on subscribe.
            as_published = SubscribeOptions(qos=1, retainAsPublished=True)
            await client.subscribe([(t, as_published if t == self.command_topic else SubscribeOptions(qos=1))
                                    for t in topics])
            await client.publish(self.instance_topic, json.dumps(self.instance()), qos=1, retain=self.retain)
            tasks = [asyncio.create_task(self._publish_loop(client)), asyncio.create_task(self._receive_loop(client))]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
            finally:
                await _cancel_within(tasks, TEARDOWN_S)
        except asyncio.CancelledError:  # the daemon is stopping: last state, then offline
            try:
                async with asyncio.timeout(1.0):
                    if self._latest is not None:
                        await self._publish_state(client, self._latest)
                    await client.publish(self.availability_topic, "offline", qos=1, retain=self.retain)
                    if self.retain:  # leave no announcement behind to be mistaken for a live twin
                        await client.publish(self.instance_topic, b"", qos=1, retain=True)
            except (aiomqtt.MqttError, TimeoutError):
                pass
            raise

    def instance(self) -> dict[str, Any]:
        """This process's announcement on ``<base>/instance``: who holds the node id."""
        return {"node_id": self.cfg.node_id, "host": self.host, "pid": self.pid, "client_id": self.client_id}

    def on_instance(self, payload: bytes) -> None:
        """Another announcement on our node id: warn by name, once per other instance.
        One of ours from before a restart on this host (its PID gone) is not a twin."""
        if not payload:
            return
        other = json.loads(payload)
        if not isinstance(other, dict) or other.get("client_id") == self.client_id:
            return
        host, pid = str(other.get("host"))[:100], other.get("pid")
        pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else -1
        if host == self.host and pid > 0 and not _pid_alive(pid):
            return
        if (host, pid) in self._conflicts_said:
            return
        self._conflicts_said.add((host, pid))
        self.metrics.instance_conflicts.inc()
        log.warning(
            "mqtt_node_id_conflict", node_id=self.cfg.node_id, other_host=host, other_pid=pid,
            detail=f"another powerbudgetd announces node id {self.cfg.node_id!r} on {self.base}: their state, "
            "commands and Home Assistant device mix with ours. Give each host its own [mqtt] node_id",
        )

    async def _publish_loop(self, client: aiomqtt.Client) -> None:
        while True:
            self._changed.clear()
            snap = self._latest
            if snap is not None:
                await self._read_energy(snap)
                self.track_cards(snap)
                if self.cfg.discovery:
                    await self._publish_discovery(client, snap)
                await self._publish_state(client, snap)
                await self._clear_stale(client, snap)
            await asyncio.sleep(MIN_PUBLISH_GAP_S)
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that lands as the event is set (a limit change while the daemon stops), and
            # the loop would outlive the daemon's stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, self.cfg.publish_interval_s - MIN_PUBLISH_GAP_S)):
                    await self._changed.wait()

    async def _publish_state(self, client: aiomqtt.Client, snap: BankSnapshot) -> None:
        await client.publish(self.state_topic, json.dumps(self.bank_state(snap)), retain=self.retain)
        present = {c.uuid: c for c in snap.cards}
        for card in snap.cards:
            state = ha.card_state(card, self.energy.card_kwh(card.uuid))
            await client.publish(self.card_topic(card.index), json.dumps(state), retain=self.retain)
        # Availability per card seen in this run: offline once it is lost or stops answering.
        for uuid, entry in self._cards.items():
            now_card = present.get(uuid)
            avail = ha.ONLINE if now_card is not None and ha.card_available(now_card) else ha.OFFLINE
            if self._sent_avail.get(entry.index) != avail:
                await client.publish(self.layout.card_availability(entry.index), avail, qos=1, retain=self.retain)
                self._sent_avail[entry.index] = avail

    async def _publish_discovery(self, client: aiomqtt.Client, snap: BankSnapshot, *, every: bool = False) -> None:
        """Send the discovery configs that changed since last sent (``every``: all); one
        sent before and no longer offered is left to :meth:`_clear_stale`."""
        configs = self.discovery(snap)
        for topic in set(self._sent_configs) - {t for t, _ in configs}:
            del self._sent_configs[topic]
            self._retained.add(topic)
        for topic, payload in configs:
            text = json.dumps(payload, sort_keys=True)
            if every or self._sent_configs.get(topic) != text:
                await client.publish(topic, text, qos=1, retain=self.retain)
                self._sent_configs[topic] = text

    def current_topics(self) -> set[str]:
        """The retained topics of ours the current entities use."""
        topics = set(self._sent_configs)
        for entry in self._cards.values():
            topics |= {self.card_topic(entry.index), self.layout.card_availability(entry.index)}
        return topics

    async def _clear_stale(self, client: aiomqtt.Client, snap: BankSnapshot) -> None:
        """Clear the retained topics of ours that no current entity uses: an empty
        retained payload removes the entity from Home Assistant and the card's state
        from the broker. Only once this session's discovery is out (it says what is
        current), or right away when discovery is off."""
        if not self.retain or (self.cfg.discovery and not self._sent_configs):
            return  # (a broker without retain holds nothing of ours)
        for topic in ha.stale_topics(self._retained, self.current_topics()):
            await client.publish(topic, b"", qos=1, retain=True)
            self._retained.discard(topic)
            log.info("mqtt_cleared", topic=topic, detail="no longer offered (a card or entity gone since last run)")

    async def _read_energy(self, snap: BankSnapshot) -> None:
        """Every card's energy counter, at most once per publish interval, in a worker
        thread. A read in flight when the task is cancelled is waited for (briefly): the
        daemon shuts NVML down once its channels are done."""
        now = self.clock()
        if self._energy_j is None or now - self._energy_at < max(self.cfg.publish_interval_s, MIN_ENERGY_INTERVAL_S):
            return
        self._energy_at = now
        uuids = [c.uuid for c in snap.cards if ha.card_available(c) and c.uuid not in self.energy.unsupported]
        read = asyncio.ensure_future(asyncio.to_thread(self._energy_readings, uuids))
        try:
            readings = await asyncio.shield(read)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(read, ENERGY_READ_GRACE_S)
            raise
        for uuid, joules in readings:
            self.energy.reading(uuid, joules)

    def _energy_readings(self, uuids: list[str]) -> list[tuple[str, float | None]]:
        assert self._energy_j is not None
        out: list[tuple[str, float | None]] = []
        for uuid in uuids:
            try:
                out.append((uuid, self._energy_j(uuid)))
            except NvmlError:  # this card's problem shows in its availability; try again next time
                continue
        return out

    def _kind(self, topic: str) -> tuple[str, int] | None:
        """(topic kind, size cap in bytes) of a subscribed topic; None if not ours."""
        if self.meter is not None and topic == self.meter.cfg.state_topic():
            return "meter", MAX_METER_BYTES
        avail = self.meter.cfg.availability() if self.meter else None
        if avail is not None and topic == avail[0]:
            return "meter_availability", MAX_OTHER_BYTES
        if topic == self.command_topic and self.cfg.remote_budget.enabled:
            return "command", MAX_COMMAND_BYTES
        if topic == self.ha_status_topic and self.cfg.discovery:
            return "ha_status", MAX_OTHER_BYTES
        if topic == self.instance_topic:
            return "instance", MAX_OTHER_BYTES
        if self.layout.is_ours(topic):
            return "own", MAX_OWN_BYTES
        return None

    async def _receive_loop(self, client: aiomqtt.Client) -> None:
        async for msg in client.messages:
            topic = str(msg.topic)
            kind = self._kind(topic)
            if kind is None:
                continue
            if kind[0] != "own":  # (our own echo: no age series per discovery topic)
                self._seen(topic)
            payload = msg.payload if isinstance(msg.payload, bytes | bytearray) else str(msg.payload).encode()
            if len(payload) > kind[1]:  # capped before any parsing
                self._drop(kind[0], "oversize", f"{len(payload)} bytes, over {kind[1]}")
                continue
            try:
                await self._handle(client, kind[0], bytes(payload), bool(msg.retain), topic)
            except (asyncio.CancelledError, aiomqtt.MqttError):
                raise  # the session's own end, not the message's fault
            except Exception as exc:  # noqa: BLE001 - one message must never end the session
                self._drop(kind[0], type(exc).__name__, str(exc)[:200])

    def _seen(self, topic: str) -> None:
        if topic not in self._last_message:
            self.metrics.message_age.labels(topic).set_function(lambda: time.monotonic() - self._last_message[topic])
        self._last_message[topic] = time.monotonic()

    def _drop(self, kind: str, reason: str, detail: str) -> None:
        self.metrics.dropped.labels(kind, reason).inc()
        if (kind, reason) not in self._dropped_said:  # logged once per kind; counted always
            self._dropped_said.add((kind, reason))
            log.warning("mqtt_message_dropped", kind=kind, reason=reason, detail=detail,
                        note="further drops of this kind are only counted")

    async def _handle(self, client: aiomqtt.Client, kind: str, payload: bytes, retained: bool, topic: str = "") -> None:
        if kind == "instance":
            self.on_instance(payload)
        elif kind == "own":
            # Our own topics: only what the broker held from before counts (a live
            # message here is our own publish coming back; an empty one a clearing).
            if retained and payload:
                self._retained.add(topic)
                self._changed.set()
        elif kind == "ha_status":
            if payload == b"online" and self._latest is not None:  # HA restarted: tell it again
                await self._publish_discovery(client, self._latest, every=True)
                await self._publish_state(client, self._latest)
        elif kind == "meter" and self.meter is not None:
            self.meter.reading(payload, self.clock(), self.board_power_w(), retained=retained)
            self._changed.set()
        elif kind == "meter_availability" and self.meter is not None:
            avail = self.meter.cfg.availability()
            if avail is not None and payload.decode("utf-8", "replace").strip() in avail[1]:
                self.meter.offline()
        elif kind == "command":
            if retained:  # history, not a command: a stale "restore" must not undo a curtailment
                self.metrics.remote.labels("retained_ignored").inc()
                if payload and payload != self._retained_said:
                    self._retained_said = payload
                    log.warning("remote_budget_retained_ignored", topic=self.command_topic, requested=shown(payload),
                                detail="retained commands are ignored; publish commands without retain (and clear "
                                "this one: an empty retained message)")
                return
            # Retained: a refused value stays visible (Home Assistant's last command sensor).
            await client.publish(self.response_topic, json.dumps(self.remote_command(payload)), qos=1,
                                 retain=self.retain)


async def _cancel_within(tasks: list[asyncio.Task[Any]], deadline_s: float) -> None:
    """Cancel ``tasks`` and wait at most ``deadline_s`` for them: a task that ignores
    its cancellation is left behind (and said), never waited on forever."""
    for task in tasks:
        task.cancel()
    _, pending = await asyncio.wait(tasks, timeout=deadline_s)
    for task in pending:
        log.error("mqtt_task_stuck", task=task.get_coro().__qualname__, deadline_s=deadline_s)  # type: ignore[union-attr]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, another user's
    return True
