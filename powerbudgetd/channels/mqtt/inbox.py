"""What comes in over MQTT: wall-meter readings and availability, remote budget
commands, Home Assistant's birth message, other instances' announcements, and our own
retained topics replayed by the broker.

Hostile input: a message is size-capped by kind before it is parsed (:meth:`Inbox.admit`);
a message that cannot be handled is dropped, counted, and logged once per kind and
reason (:meth:`Inbox.drop`); retained commands are ignored (a command is live, not
history). No ``aiomqtt`` here: the session's receive loop feeds :meth:`Inbox.handle`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import structlog

from powerbudgetd.channels.mqtt._text import shown
from powerbudgetd.channels.mqtt.discovery import ONLINE
from powerbudgetd.channels.mqtt.identity import Identity
from powerbudgetd.channels.mqtt.metrics import MqttMetrics
from powerbudgetd.channels.mqtt.peers import MeterPeers
from powerbudgetd.channels.mqtt.state import Publisher, StatePublisher
from powerbudgetd.config import MqttConfig

log = structlog.get_logger("powerbudgetd")

MAX_COMMAND_BYTES = 1024  # a budget command is a number or a small JSON object
MAX_METER_BYTES = 16 << 10  # a Tasmota SENSOR message is ~300 B; Shelly status ~1 KiB
MAX_OTHER_BYTES = 1024  # availability, Home Assistant status, instance announcements
MAX_OWN_BYTES = 64 << 10  # our own retained discovery configs and card states (~1 KiB each)


class Inbox:
    """Takes the messages of one bridge. ``board_power_w``: the recent lowest summed GPU
    board power (W), paired with each wall reading; ``clock``: monotonic seconds."""

    def __init__(
        self,
        cfg: MqttConfig,
        state: StatePublisher,
        identity: Identity,
        metrics: MqttMetrics,
        *,
        clock: Callable[[], float],
        board_power_w: Callable[[], float | None],
        peers: MeterPeers | None = None,
    ) -> None:
        self.cfg, self.state, self.identity, self.metrics = cfg, state, identity, metrics
        self.peers = peers
        self.layout, self.meter, self.remote = state.layout, state.meter, state.remote
        self.clock, self.board_power_w = clock, board_power_w
        self._dropped_said: set[tuple[str, str]] = set()
        self._last_message: dict[str, float] = {}
        self._retained_said: bytes | None = None

    def kind(self, topic: str) -> tuple[str, int] | None:
        """(topic kind, size cap in bytes) of a subscribed topic; None if not ours."""
        if self.meter is not None and topic == self.meter.cfg.state_topic():
            return "meter", MAX_METER_BYTES
        avail = self.meter.cfg.availability() if self.meter else None
        if avail is not None and topic == avail[0]:
            return "meter_availability", MAX_OTHER_BYTES
        if topic == self.layout.command_topic and self.cfg.remote_budget.enabled:
            return "command", MAX_COMMAND_BYTES
        if topic == self.layout.ha_status and self.cfg.discovery:
            return "ha_status", MAX_OTHER_BYTES
        if topic == self.layout.instance:
            return "instance", MAX_OTHER_BYTES
        if self.peers is not None and self.peers.is_peer_topic(topic):
            return "meter_peer", MAX_OTHER_BYTES
        if topic == self.layout.availability:
            return "availability", MAX_OTHER_BYTES
        if self.layout.is_ours(topic):
            return "own", MAX_OWN_BYTES
        return None

    def admit(self, topic: str, payload: bytes | bytearray) -> str | None:
        """The kind of a message to handle; None: not ours, or over its kind's size cap
        (dropped before any parsing)."""
        kind = self.kind(topic)
        if kind is None:
            return None
        if kind[0] != "own":  # (our own echo: no age series per discovery topic)
            self._seen(topic)
        if len(payload) > kind[1]:
            self.drop(kind[0], "oversize", f"{len(payload)} bytes, over {kind[1]}")
            return None
        return kind[0]

    def _seen(self, topic: str) -> None:
        if topic not in self._last_message:
            self.metrics.message_age.labels(topic).set_function(lambda: time.monotonic() - self._last_message[topic])
        self._last_message[topic] = time.monotonic()

    def drop(self, kind: str, reason: str, detail: str) -> None:
        """Count a message that was not taken; the first of each kind and reason is logged."""
        self.metrics.dropped.labels(kind, reason).inc()
        if (kind, reason) not in self._dropped_said:  # logged once per kind; counted always
            self._dropped_said.add((kind, reason))
            log.warning("mqtt_message_dropped", kind=kind, reason=reason, detail=detail,
                        note="further drops of this kind are only counted")

    async def handle(self, client: Publisher, kind: str, payload: bytes, retained: bool, topic: str = "") -> None:
        """Take one admitted message. Raises whatever its parsing raises (the caller
        drops it)."""
        if kind == "instance":
            self.identity.on_announcement(payload)
        elif kind == "meter_peer" and self.peers is not None:
            self.peers.on_announcement(topic, payload)
        elif kind == "availability":
            # We are connected (this arrived): anything but "online" on our own topic (a
            # will or a goodbye of another client with our node id, a stale retained
            # "offline") is corrected at once.
            if payload != ONLINE.encode():
                log.info("mqtt_availability_restored", topic=topic, found=shown(payload))
                await client.publish(topic, ONLINE, qos=1, retain=self.state.retain)
        elif kind == "own":
            # Our own topics: only what the broker held from before counts (a live
            # message here is our own publish coming back; an empty one a clearing).
            if retained and payload:
                self.state.held(topic)
        elif kind == "ha_status":
            latest = self.state.latest
            if payload == b"online" and latest is not None:  # HA restarted: tell it again
                await self.state.publish_discovery(client, latest, every=True)
                await self.state.publish_state(client, self.state.latest or latest)  # (the newest by now)
        elif kind == "meter" and self.meter is not None:
            self.meter.reading(payload, self.clock(), self.board_power_w(), retained=retained)
            self.state.changed.set()
        elif kind == "meter_availability" and self.meter is not None:
            avail = self.meter.cfg.availability()
            if avail is not None and payload.decode("utf-8", "replace").strip() in avail[1]:
                self.meter.offline()
        elif kind == "command":
            await self._command(client, payload, retained)

    async def _command(self, client: Publisher, payload: bytes, retained: bool) -> None:
        if retained:  # history, not a command: a stale "restore" must not undo a curtailment
            self.metrics.remote.labels("retained_ignored").inc()
            if payload and payload != self._retained_said:
                self._retained_said = payload
                log.warning("remote_budget_retained_ignored", topic=self.layout.command_topic,
                            requested=shown(payload), detail="retained commands are ignored; publish commands "
                            "without retain (and clear this one: an empty retained message)")
            return
        # Retained: a refused value stays visible (Home Assistant's last command sensor).
        assert self.layout.response_topic is not None  # (set whenever commands are taken)
        await client.publish(self.layout.response_topic, json.dumps(self.remote_command(payload)), qos=1,
                             retain=self.state.retain)

    def remote_command(self, payload: bytes) -> dict[str, Any]:
        """Validate and take a remote budget command; returns the response payload (see
        :class:`~powerbudgetd.channels.mqtt.remote.RemoteBudget`)."""
        snap = self.state.latest
        response = self.remote.command(payload, self.clock(), None if snap is None else snap.floor_w)
        self.state.changed.set()  # the budget number shows the request at once
        return response
