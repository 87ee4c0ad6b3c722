"""MQTT side channel: published state, Home Assistant discovery, wall-meter feedback and
a bounded remote budget. Off unless ``[mqtt]`` is configured (``aiomqtt`` is imported
only then, by :mod:`.session`).

- :mod:`.session`: the broker connection, publish and receive loops (:class:`MqttBridge`)
- :mod:`.state`: what is published (state, card availability, discovery, clearing)
- :mod:`.inbox`: what comes in (size caps, meter readings, commands, Home Assistant's birth)
- :mod:`.identity`: the client id, and another instance announcing our node id
- :mod:`.discovery`: state and Home Assistant discovery payloads from the bank snapshot
- :mod:`.wallmeter`: wall readings to a board budget, offered to the budget arbiter
- :mod:`.remote`: remote budget commands, offered to the budget arbiter
- :mod:`.metrics`: this channel's Prometheus metrics

Budget sources, lowest wins (``core.arbiter``): the configured budget, the wall meter's
(which can only lower it), and a remote command within [floor, configured budget].
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from powerbudgetd.channels.mqtt.metrics import READING_ERRORS, MqttMetrics
from powerbudgetd.channels.mqtt.remote import RemoteBudget, parse_budget_command
from powerbudgetd.channels.mqtt.wallmeter import ReadingError, WallMeter, parse_power_w

if TYPE_CHECKING:
    from powerbudgetd.channels.mqtt.session import MqttBridge

__all__ = [
    "READING_ERRORS", "MqttBridge", "MqttMetrics", "ReadingError", "RemoteBudget", "WallMeter",
    "parse_budget_command", "parse_power_w",
]


def __getattr__(name: str) -> Any:
    # The bridge (and with it aiomqtt) loads only when asked for.
    if name == "MqttBridge":
        from powerbudgetd.channels.mqtt.session import MqttBridge

        return MqttBridge
    raise AttributeError(name)
