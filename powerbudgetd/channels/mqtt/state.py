"""What the MQTT bridge publishes: the bank's and each card's state, every card's
availability, Home Assistant's discovery configs, and the clearing of retained topics
of ours that nothing current uses. Payloads come from :mod:`.discovery`; this module
keeps what was sent in this broker session and what the broker held from before.

No ``aiomqtt`` here: the session hands in its client as a :class:`Publisher`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import structlog

import powerbudgetd.channels.mqtt.discovery as ha
from powerbudgetd.channels.mqtt.remote import RemoteBudget
from powerbudgetd.channels.mqtt.wallmeter import WallMeter
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.snapshot import BankSnapshot
from powerbudgetd.errors import NvmlError
from powerbudgetd.channels.energy import MIN_ENERGY_INTERVAL_S, EnergyCounters
from powerbudgetd.config import MqttConfig

log = structlog.get_logger("powerbudgetd")



class Publisher(Protocol):
    """The broker client, as far as publishing goes."""

    async def publish(self, topic: str, payload: str | bytes = ..., qos: int = ..., retain: bool = ...) -> None: ...


class StatePublisher:
    """The bank's published state and Home Assistant's view of it.

    ``latest``: the last tick's snapshot (set by the bridge's tick hook); ``changed``:
    set when something published changed (publish soon). ``retain``: whether our
    topics are published retained (the session drops it if the broker refuses).
    ``energy_j``: see :class:`~powerbudgetd.channels.mqtt.session.MqttBridge`.
    """

    def __init__(
        self,
        cfg: MqttConfig,
        layout: ha.Layout,
        arbiter: BudgetArbiter,
        remote: RemoteBudget,
        meter: WallMeter | None,
        *,
        clock: Callable[[], float],
        energy_j: Callable[[str], float | None] | None = None,
    ) -> None:
        self.cfg, self.layout, self.arbiter, self.remote, self.meter = cfg, layout, arbiter, remote, meter
        self.clock = clock
        self.latest: BankSnapshot | None = None
        self.changed = asyncio.Event()
        self.retain = cfg.retain is not False  # "auto" starts with retain, drops it if refused
        self.configuration_url: str | None = None
        self.ups: Callable[[], Mapping[str, Any]] | None = None
        self._energy = None if energy_j is None else EnergyCounters(energy_j)
        self.energy = ha.BankEnergy()
        self._energy_at = float("-inf")
        # Home Assistant's view, per broker session: every card seen in this run (by
        # UUID; a card that vanishes stays, unavailable), the configs and availability
        # last sent, and the retained topics of ours the broker holds.
        self._cards: dict[str, ha.CardEntry] = {}
        self._sent_configs: dict[str, str] = {}
        self._sent_avail: dict[int, str] = {}
        self._retained: set[str] = set()

    def new_session(self) -> None:
        """A new broker session: nothing sent in it yet, nothing known to be held."""
        self._sent_configs, self._sent_avail, self._retained = {}, {}, set()

    def held(self, topic: str) -> None:
        """The broker holds a retained message of ours on ``topic`` from before."""
        self._retained.add(topic)
        self.changed.set()

    # -- payloads ---------------------------------------------------------------------
    def bank_state(self, snap: BankSnapshot) -> dict[str, Any]:
        """The ``state`` payload. Wall power is null unless the meter's last reading is
        fresh and valid: a stale meter reads *unknown*, never its last value."""
        meter = self.meter
        fresh = meter is not None and meter.state == "ok"
        extra: dict[str, Any] = {}
        if self.ups is not None:
            extra.update(self._ups_state())
        energy_kwh = self.energy.bank_kwh()
        configured_w, remote_w = self.arbiter.configured_w, self.remote.budget_w
        return ha.bank_state(
            snap,
            lost=self.lost_cards(snap),
            configured_budget_w=configured_w,
            remote_budget_w=remote_w,
            requested_budget_w=ha.requested_budget_w(remote_w, configured_w, snap.floor_w),
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
        assert self.ups is not None
        try:
            record = self.ups()
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
            floor_w=snap.floor_w, configured_w=self.arbiter.configured_w,
            wall_meter=self.meter is not None, ups=self.ups is not None,
            remote=self.cfg.remote_budget.enabled, bank_energy=bool(self.energy.cards),
            configuration_url=self.configuration_url,
        )

    def discovery(self, snap: BankSnapshot) -> list[tuple[str, dict[str, Any]]]:
        """Home Assistant MQTT discovery: (config topic, payload) for every entity."""
        return ha.discovery(self.layout, self.entities(snap))

    def current_topics(self) -> set[str]:
        """The retained topics of ours the current entities use."""
        topics = set(self._sent_configs)
        for entry in self._cards.values():
            topics |= {self.layout.card(entry.index), self.layout.card_availability(entry.index)}
        return topics

    # -- publishing -------------------------------------------------------------------
    async def publish(self, client: Publisher, snap: BankSnapshot) -> None:
        """One round of the publish loop: energy, discovery (if on), state, clearing."""
        await self.read_energy(snap)
        self.track_cards(snap)
        if self.cfg.discovery:
            await self.publish_discovery(client, snap)
        await self.publish_state(client, snap)
        await self.clear_stale(client)

    async def publish_state(self, client: Publisher, snap: BankSnapshot) -> None:
        await client.publish(self.layout.state, json.dumps(self.bank_state(snap)), retain=self.retain)
        present = {c.uuid: c for c in snap.cards}
        for card in snap.cards:
            state = ha.card_state(card, self.energy.card_kwh(card.uuid))
            await client.publish(self.layout.card(card.index), json.dumps(state), retain=self.retain)
        # Availability per card seen in this run: offline once it is lost or stops answering.
        for uuid, entry in self._cards.items():
            now_card = present.get(uuid)
            avail = ha.ONLINE if now_card is not None and ha.card_available(now_card) else ha.OFFLINE
            if self._sent_avail.get(entry.index) != avail:
                await client.publish(self.layout.card_availability(entry.index), avail, qos=1, retain=self.retain)
                self._sent_avail[entry.index] = avail

    async def publish_discovery(self, client: Publisher, snap: BankSnapshot, *, every: bool = False) -> None:
        """Send the discovery configs that changed since last sent (``every``: all); one
        sent before and no longer offered is left to :meth:`clear_stale`."""
        configs = self.discovery(snap)
        for topic in set(self._sent_configs) - {t for t, _ in configs}:
            del self._sent_configs[topic]
            self._retained.add(topic)
        for topic, payload in configs:
            text = json.dumps(payload, sort_keys=True)
            if every or self._sent_configs.get(topic) != text:
                await client.publish(topic, text, qos=1, retain=self.retain)
                self._sent_configs[topic] = text

    async def clear_stale(self, client: Publisher) -> None:
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

    # -- energy -----------------------------------------------------------------------
    async def read_energy(self, snap: BankSnapshot) -> None:
        """Every card's energy counter, once per publish interval (never more often than
        MIN_ENERGY_INTERVAL_S), off the loop (:mod:`~powerbudgetd.channels.energy`). A
        card whose read failed or is still hung is left out (its problem shows in its
        availability)."""
        now = self.clock()
        if self._energy is None or now - self._energy_at < max(self.cfg.publish_interval_s, MIN_ENERGY_INTERVAL_S):
            return
        self._energy_at = now
        uuids = [c.uuid for c in snap.cards if ha.card_available(c) and c.uuid not in self.energy.unsupported]
        for uuid, joules in (await self._energy.read_off_loop(uuids)).items():
            if not isinstance(joules, NvmlError):
                self.energy.reading(uuid, joules)
