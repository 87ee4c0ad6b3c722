"""What goes on the wire: the state payloads and Home Assistant's discovery payloads,
all built from one tick's :class:`~powerbudgetd.core.snapshot.BankSnapshot` (W).

Home Assistant sees one device for the bank (*powerbudgetd <node_id>*) and one
sub-device per card (``via_device`` the bank, named with the card's model). Every
entity lists its availability: the daemon's (its last will) and, for a card's
entities, the card's own topic, so a lost card reads *unavailable* while the rest of
the bank stays live (``availability_mode: all``). A value that is not known now (a
stale wall meter, an unreadable card) is ``null`` in the state, which Home Assistant
shows as *unknown*, never as the last number.

Pure: no I/O, no clock. :class:`Layout` holds the topics; :class:`Entities` says which
entities exist; :func:`discovery` turns the two into (topic, payload) pairs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from powerbudgetd import __version__
from powerbudgetd.core.model import Mode
from powerbudgetd.core.snapshot import BankSnapshot, CardSnapshot

ONLINE, OFFLINE = "online", "offline"  # the payloads of every availability topic
COMPONENTS = ("sensor", "binary_sensor", "number")  # what discovery publishes under the prefix
POWER_DECIMALS = 0  # suggested display precision: W
ENERGY_DECIMALS = 2  # kWh
# A reading below this share of the last one is a counter reset (a driver reload), not
# a glitch: Home Assistant's own rule for total_increasing sensors (a dip under 10 %
# is not a reset).
RESET_SHARE = 0.9


@dataclass(frozen=True)
class Layout:
    """The topics of one daemon: ``base`` (``powerbudgetd/<node_id>``), Home Assistant's
    discovery ``prefix``, the remote budget's command and response topics."""

    node_id: str
    base: str
    prefix: str = "homeassistant"
    command_topic: str | None = None
    response_topic: str | None = None

    @property
    def state(self) -> str:
        return f"{self.base}/state"

    @property
    def availability(self) -> str:
        return f"{self.base}/availability"

    @property
    def instance(self) -> str:
        """Who holds the node id: each process announces itself here."""
        return f"{self.base}/instance"

    @property
    def ha_status(self) -> str:
        """Home Assistant's birth and last-will topic."""
        return f"{self.prefix}/status"

    def card(self, index: int) -> str:
        return f"{self.base}/gpu/{index}"

    def card_availability(self, index: int) -> str:
        return f"{self.base}/gpu/{index}/availability"

    @property
    def card_wildcard(self) -> str:
        """Every card topic (state and availability): subscribed to find retained ones of
        cards that are gone."""
        return f"{self.base}/gpu/#"

    def config_topic(self, component: str, object_id: str) -> str:
        return f"{self.prefix}/{component}/powerbudgetd_{self.node_id}/{object_id}/config"

    def config_wildcards(self) -> list[str]:
        """Every discovery topic this daemon may have published (any component)."""
        return [f"{self.prefix}/{c}/powerbudgetd_{self.node_id}/+/config" for c in COMPONENTS]

    def is_ours(self, topic: str) -> bool:
        """A retained topic this daemon publishes: a discovery config or a card topic."""
        if topic.startswith(f"{self.base}/gpu/"):
            return True
        parts = topic.split("/")
        return (
            topic.startswith(f"{self.prefix}/") and len(parts) >= 4 and parts[-1] == "config"
            and parts[-3] == f"powerbudgetd_{self.node_id}" and parts[-4] in COMPONENTS
        )


@dataclass(frozen=True)
class CardEntry:
    """A card Home Assistant knows in this run: its index, UUID and model name."""

    index: int
    uuid: str
    name: str
    energy: bool = False  # NVML reports its energy counter


@dataclass(frozen=True)
class Entities:
    """Which entities exist; discovery is sent again whenever this changes.

    ``floor_w``/``configured_w``: the budget number's min and max (W); ``remote``: the
    remote budget is enabled (the number and the last command's result);
    ``configuration_url``: where the device page links to (the metrics endpoint), None:
    nowhere.
    """

    cards: tuple[CardEntry, ...]
    floor_w: float
    configured_w: float
    wall_meter: bool = False
    ups: bool = False
    remote: bool = False
    bank_energy: bool = False
    configuration_url: str | None = None


# -- state payloads ---------------------------------------------------------------------
def card_state(card: CardSnapshot, energy_kwh: float | None = None) -> dict[str, Any]:
    """``gpu/<index>``: one card. ``limit_w`` is the enforced limit; None: unknown."""
    return {
        "index": card.index, "uuid": card.uuid, "name": card.name, "role": card.role,
        "limit_w": card.enforced_limit_w, "requested_limit_w": card.requested_limit_w,
        "limit_bound_w": card.limit_bound_w, "min_limit_w": card.min_limit_w, "max_limit_w": card.max_limit_w,
        "power_avg_w": _round(card.power_avg_w, 1), "power_instant_w": _round(card.power_instant_w, 1),
        "energy_kwh": _round(energy_kwh, 4), "error": card.error, "mig_mode": card.mig_mode,
    }


def card_available(card: CardSnapshot) -> bool:
    """The card answers: readable, without a standing error."""
    return card.readable and card.error is None


def requested_budget_w(remote_w: float | None, configured_w: float, floor_w: float) -> float:
    """The budget asked for over MQTT, as the budget number shows it (W): the remote
    budget, else the configured one (nothing asked for), inside [floor, configured]."""
    asked = configured_w if remote_w is None else remote_w
    return min(configured_w, max(floor_w, asked))


def bank_state(snap: BankSnapshot, lost: Sequence[int] = (), **extra: Any) -> dict[str, Any]:
    """``state``: the bank, with the budget in force and its source, its status (mode,
    readiness, over budget, lost cards: their indices), plus ``extra`` (configured
    budget, wall meter, remote budget, energy and UPS fields); with a circuit, its
    ``circuit_*`` fields (:meth:`CircuitStatus.fields`)."""
    return {
        "budget_w": snap.budget_w, "sum_limits_w": snap.sum_limit_bound_w,
        "sum_power_w": round(snap.sum_power_avg_w, 1), "mode": snap.mode, "ready": snap.ready,
        "gpus": len(snap.cards), "budget_source": snap.budget_source,  # of the budget in force
        "floor_w": snap.floor_w, "over_budget": snap.over_budget,
        "over_budget_cause": snap.over_budget_cause if snap.over_budget else None,
        "over_budget_episodes": snap.over_budget_episodes, "over_budget_s": snap.over_budget_s,
        "lost_gpus": sorted(lost), **({} if snap.circuit is None else snap.circuit.fields()), **extra,
    }


def limits_key(snap: BankSnapshot) -> tuple:
    """Changes with any limit, role, card availability, mode, the budget or the
    over-budget state: state is published at once then."""
    return (
        snap.budget_w, snap.over_budget, snap.mode, snap.ready,
        tuple((c.limit_bound_w, c.enforced_limit_w, c.requested_limit_w, c.role, card_available(c)) for c in snap.cards),
    )


# -- energy -----------------------------------------------------------------------------
@dataclass
class EnergyCounter:
    """One card's energy for Home Assistant (kWh, ``total_increasing``) from NVML's
    counter since driver load (J).

    Within a run the value never decreases unless the counter reset: a reading below
    :data:`RESET_SHARE` of the last one is a reset (driver reload) and is published as
    is, so Home Assistant starts a new cycle; a smaller dip is a glitch, and the last
    value is kept. ``run_j`` accumulates the energy seen since the daemon started,
    across resets (the bank's counter).
    """

    last_j: float | None = None
    run_j: float = 0.0
    resets: int = 0

    def update(self, counter_j: float) -> float:
        """Take one reading (J); returns the value to publish (J)."""
        last = self.last_j
        if last is None:
            self.last_j = counter_j
        elif counter_j >= last:
            self.run_j += counter_j - last
            self.last_j = counter_j
        elif counter_j < RESET_SHARE * last:  # reset: the counter started again from 0
            self.run_j += counter_j
            self.resets += 1
            self.last_j = counter_j
        return self.last_j if self.last_j is not None else counter_j


@dataclass
class BankEnergy:
    """Every card's :class:`EnergyCounter`, by UUID, and the bank's energy since the
    daemon started (kWh): a counter that starts at 0 with each run, which is what a
    ``total_increasing`` sensor expects of a meter that restarts."""

    cards: dict[str, EnergyCounter] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)

    def reading(self, uuid: str, counter_j: float | None) -> None:
        """One card's counter (J); None: NVML does not report it (asked no more)."""
        if counter_j is None:
            self.unsupported.add(uuid)
            return
        self.cards.setdefault(uuid, EnergyCounter()).update(counter_j)

    def card_kwh(self, uuid: str) -> float | None:
        counter = self.cards.get(uuid)
        return None if counter is None or counter.last_j is None else counter.last_j / 3.6e6

    def bank_kwh(self) -> float | None:
        if not self.cards:
            return None
        return sum(c.run_j for c in self.cards.values()) / 3.6e6


# -- discovery --------------------------------------------------------------------------
def bank_device(layout: Layout, configuration_url: str | None) -> dict[str, Any]:
    device: dict[str, Any] = {
        "identifiers": [f"powerbudgetd_{layout.node_id}"], "name": f"powerbudgetd {layout.node_id}",
        "manufacturer": "powerbudgetd", "model": "GPU power budget", "sw_version": __version__,
    }
    if configuration_url:
        device["configuration_url"] = configuration_url
    return device


def card_device(layout: Layout, card: CardEntry) -> dict[str, Any]:
    return {
        "identifiers": [f"powerbudgetd_{layout.node_id}_{card.uuid}"],
        "name": f"{layout.node_id} GPU {card.index} ({card.name})",
        "manufacturer": "NVIDIA", "model": card.name,
        "via_device": f"powerbudgetd_{layout.node_id}",
    }


def _object_id(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in key)


def _power(precision: int = POWER_DECIMALS) -> dict[str, Any]:
    return {"device_class": "power", "unit_of_measurement": "W", "state_class": "measurement",
            "suggested_display_precision": precision}


def _energy() -> dict[str, Any]:
    return {"device_class": "energy", "unit_of_measurement": "kWh", "state_class": "total_increasing",
            "suggested_display_precision": ENERGY_DECIMALS}


DIAGNOSTIC = {"entity_category": "diagnostic"}


def _flag(expr: str) -> str:
    """A binary sensor's template: ON when ``expr`` holds."""
    return f"{{{{ 'ON' if {expr} else 'OFF' }}}}"


def _field(name: str) -> str:
    return f"{{{{ value_json.{name} }}}}"


class _Configs:
    """The discovery configs being built, in publishing order: the bank's, then each card's."""

    def __init__(self, layout: Layout, entities: Entities) -> None:
        self.layout = layout
        self.bank_dev = bank_device(layout, entities.configuration_url)
        self.daemon_avail = {"topic": layout.availability, "payload_available": ONLINE,
                             "payload_not_available": OFFLINE}
        self.origin = {"name": "powerbudgetd", "sw_version": __version__}
        self.out: list[tuple[str, dict[str, Any]]] = []

    def add(self, component: str, key: str, name: str, topic: str, extra: Mapping[str, Any], *,
            device: dict[str, Any] | None = None, card_avail: str | None = None, entity_id: str | None = None) -> None:
        node, object_id = self.layout.node_id, _object_id(key)
        avail = [self.daemon_avail]
        if card_avail is not None:
            avail.append({"topic": card_avail, "payload_available": ONLINE, "payload_not_available": OFFLINE})
        self.out.append((self.layout.config_topic(component, object_id), {
            # unique_id: the card's UUID (stable across re-indexing); object_id (the
            # entity id Home Assistant makes at first sight): readable, by index.
            "name": name, "unique_id": f"powerbudgetd_{node}_{object_id}",
            "object_id": f"powerbudgetd_{node}_{_object_id(entity_id or key)}",
            "state_topic": topic, **extra,
            "availability": avail, "availability_mode": "all",
            "device": self.bank_dev if device is None else device, "origin": self.origin,
        }))


def discovery(layout: Layout, entities: Entities) -> list[tuple[str, dict[str, Any]]]:
    """Home Assistant MQTT discovery: (config topic, payload) for every entity of the
    bank and its cards. A card's entities also follow that card's availability."""
    configs = _Configs(layout, entities)
    _bank_entities(configs, entities)
    _optional_entities(configs, entities)
    for card in entities.cards:
        _card_entities(configs, card)
    return configs.out


def _bank_entities(configs: _Configs, entities: Entities) -> None:
    add, state = configs.add, configs.layout.state
    add("sensor", "budget", "Budget", state, {"value_template": _field("budget_w"), **_power(), **DIAGNOSTIC})
    add("sensor", "configured_budget", "Configured budget", state,
        {"value_template": _field("configured_budget_w"), **_power(), **DIAGNOSTIC})
    add("sensor", "sum_limits", "Sum of power limits", state,
        {"value_template": _field("sum_limits_w"), **_power(), **DIAGNOSTIC})
    add("sensor", "floor", "Budget floor", state, {"value_template": _field("floor_w"), **_power(), **DIAGNOSTIC})
    add("sensor", "sum_power", "Sum of GPU power", state, {"value_template": _field("sum_power_w"), **_power()})
    if entities.bank_energy:
        add("sensor", "energy", "GPU energy", state, {"value_template": _field("energy_kwh"), **_energy()})
    add("sensor", "mode", "Mode", state, {
        "value_template": _field("mode"), "device_class": "enum", "options": [str(m) for m in Mode], **DIAGNOSTIC,
    })
    add("sensor", "budget_source", "Budget source", state,
        {"value_template": _field("budget_source"), "icon": "mdi:source-branch", **DIAGNOSTIC})
    add("binary_sensor", "ready", "Ready", state, {"value_template": _flag("value_json.ready"), **DIAGNOSTIC})
    add("binary_sensor", "failsafe", "Failsafe", state,
        {"value_template": _flag(f"value_json.mode == '{Mode.FAILSAFE}'"), "device_class": "problem"})
    add("binary_sensor", "gpu_lost", "GPU lost", state,
        {"value_template": _flag("value_json.lost_gpus"), "device_class": "problem"})
    add("binary_sensor", "over_budget", "Over budget", state,
        {"value_template": _flag("value_json.over_budget"), "device_class": "problem"})


def _optional_entities(configs: _Configs, entities: Entities) -> None:
    """The wall meter's, the UPS's and the remote budget's entities, where configured."""
    add, layout = configs.add, configs.layout
    state = layout.state
    if entities.wall_meter:
        add("sensor", "wall_power", "Wall power", state, {"value_template": _field("wall_power_w"), **_power()})
        add("sensor", "wall_meter", "Wall meter", state,
            {"value_template": _field("wall_meter"), "icon": "mdi:meter-electric", **DIAGNOSTIC})
    if entities.ups:
        add("sensor", "ups", "UPS", state, {"value_template": _field("ups"), "icon": "mdi:battery-heart", **DIAGNOSTIC})
        add("binary_sensor", "on_battery", "On battery", state, {
            "value_template": "{{ 'None' if value_json.on_battery is none else ('ON' if value_json.on_battery else 'OFF') }}",
            "icon": "mdi:home-battery",
        })
    if entities.remote and layout.command_topic and layout.response_topic:
        # min/max: whole watts inside [floor, configured], so every value offered is taken.
        add("number", "budget_request", "Requested budget", state, {
            "command_topic": layout.command_topic, "value_template": _field("requested_budget_w"),
            "min": math.ceil(entities.floor_w - 1e-9), "max": math.floor(entities.configured_w + 1e-9), "step": 1,
            "mode": "box", "device_class": "power", "unit_of_measurement": "W", "icon": "mdi:gauge",
        })
        add("sensor", "budget_result", "Last budget command", layout.response_topic, {
            "value_template": "{{ 'accepted' if value_json.ok else 'refused' }}",
            "json_attributes_topic": layout.response_topic, "icon": "mdi:message-reply-text", **DIAGNOSTIC,
        })


def _card_entities(configs: _Configs, card: CardEntry) -> None:
    """One card's entities, on its sub-device, following its availability too."""
    add, layout = configs.add, configs.layout
    dev = card_device(layout, card)
    topic, avail = layout.card(card.index), layout.card_availability(card.index)
    gpu = f"gpu{card.index}"
    add("sensor", f"{card.uuid}_limit", "Power limit", topic,
        {"value_template": _field("limit_w"), **_power(), **DIAGNOSTIC}, device=dev, card_avail=avail,
        entity_id=f"{gpu}_limit")
    add("sensor", f"{card.uuid}_power", "Power", topic,
        {"value_template": _field("power_avg_w"), **_power()}, device=dev, card_avail=avail,
        entity_id=f"{gpu}_power")
    if card.energy:
        add("sensor", f"{card.uuid}_energy", "Energy", topic,
            {"value_template": _field("energy_kwh"), **_energy()}, device=dev, card_avail=avail,
            entity_id=f"{gpu}_energy")


def stale_topics(retained: Iterable[str], current: Iterable[str]) -> list[str]:
    """The retained topics of ours that the current set no longer has: to be cleared
    (an empty retained payload removes a Home Assistant entity, and a card's state)."""
    keep = set(current)
    return sorted(t for t in set(retained) if t not in keep)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
