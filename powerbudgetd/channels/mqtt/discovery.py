"""What goes on the wire: the state payloads and Home Assistant's discovery payloads,
all built from one tick's :class:`~powerbudgetd.core.snapshot.BankSnapshot` (W)."""

from __future__ import annotations

from typing import Any

from powerbudgetd import __version__
from powerbudgetd.core.snapshot import BankSnapshot, CardSnapshot


def card_state(card: CardSnapshot) -> dict[str, Any]:
    """``gpu/<index>``: one card. ``limit_w`` is the enforced limit; None: unknown."""
    return {
        "index": card.index, "uuid": card.uuid, "name": card.name, "role": card.role,
        "limit_w": card.enforced_limit_w, "requested_limit_w": card.requested_limit_w,
        "limit_bound_w": card.limit_bound_w, "min_limit_w": card.min_limit_w, "max_limit_w": card.max_limit_w,
        "power_avg_w": card.power_avg_w, "power_instant_w": card.power_instant_w, "error": card.error,
        "mig_mode": card.mig_mode,
    }


def bank_state(snap: BankSnapshot, **extra: Any) -> dict[str, Any]:
    """``state``: the bank, with the budget in force and its source, plus ``extra``
    (configured budget, wall meter and remote budget fields); with a circuit, its
    ``circuit_*`` fields (:meth:`CircuitStatus.fields`)."""
    return {
        "budget_w": snap.budget_w, "sum_limits_w": snap.sum_limit_bound_w,
        "sum_power_w": round(snap.sum_power_avg_w, 1), "mode": snap.mode, "ready": snap.ready,
        "gpus": len(snap.cards), "budget_source": snap.budget_source,  # of the budget in force
        "floor_w": snap.floor_w, "over_budget": snap.over_budget,
        "over_budget_cause": snap.over_budget_cause if snap.over_budget else None,
        "over_budget_episodes": snap.over_budget_episodes, "over_budget_s": snap.over_budget_s,
        **({} if snap.circuit is None else snap.circuit.fields()), **extra,
    }


def cards_key(snap: BankSnapshot) -> tuple:
    """Changes with the set of cards: discovery is sent again then."""
    return tuple((c.index, c.uuid, c.name) for c in snap.cards)


def limits_key(snap: BankSnapshot) -> tuple:
    """Changes with any limit, role, the budget or the over-budget state: state is
    published at once then."""
    return (snap.budget_w, snap.over_budget, tuple((c.limit_bound_w, c.enforced_limit_w, c.requested_limit_w, c.role) for c in snap.cards))


def discovery(
    snap: BankSnapshot, *, node_id: str, prefix: str, state_topic: str, availability_topic: str,
    card_topic: str, wall_meter: bool,
) -> list[tuple[str, dict[str, Any]]]:
    """Home Assistant MQTT discovery: (config topic, payload) for every sensor, grouped
    under one device. ``card_topic`` has ``{index}`` where a card's index goes."""
    device = {
        "identifiers": [f"powerbudgetd_{node_id}"], "name": f"powerbudgetd {node_id}",
        "manufacturer": "powerbudgetd", "model": "GPU power budget", "sw_version": __version__,
    }
    sensors = [
        ("budget", "Budget", state_topic, "budget_w"),
        ("sum_limits", "Sum of power limits", state_topic, "sum_limits_w"),
        ("sum_power", "Sum of GPU power", state_topic, "sum_power_w"),
    ]
    if wall_meter:
        sensors.append(("wall_power", "Wall power", state_topic, "wall_power_w"))
    for c in snap.cards:
        topic = card_topic.format(index=c.index)
        sensors.append((f"{c.uuid}_limit", f"GPU {c.index} power limit", topic, "limit_w"))
        sensors.append((f"{c.uuid}_power", f"GPU {c.index} power", topic, "power_avg_w"))
    out = []
    for key, name, topic, field in sensors:
        object_id = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in key)
        out.append((
            f"{prefix}/sensor/powerbudgetd_{node_id}/{object_id}/config",
            {
                "name": name, "unique_id": f"powerbudgetd_{node_id}_{object_id}",
                "state_topic": topic, "value_template": f"{{{{ value_json.{field} }}}}",
                "device_class": "power", "unit_of_measurement": "W", "state_class": "measurement",
                "availability_topic": availability_topic,
                "payload_available": "online", "payload_not_available": "offline",
                "device": device, "origin": {"name": "powerbudgetd", "sw_version": __version__},
            },
        ))
    return out
