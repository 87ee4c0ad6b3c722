"""What arrives over MQTT: the wall meter ([mqtt.wall_meter]) and the remote budget
([mqtt.remote_budget]); the topic check."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from powerbudgetd.core.meterpath import PathError, watts_at
from powerbudgetd.config.base import _MeterReach, _Section

_TOPIC_LEVEL_CHARS = re.compile(r"[+#\x00]")


def _check_topic(value: str | None) -> str | None:
    """An MQTT topic we publish or subscribe to: not empty, no wildcards, no NUL."""
    if value is not None and (not value or _TOPIC_LEVEL_CHARS.search(value) or value.startswith("/") or value.endswith("/")):
        raise ValueError(f"not a usable MQTT topic: {value!r} (no '+', '#', leading or trailing '/')")
    return value


# What each preset's device publishes (the watts path's check): Tasmota's SENSOR
# telemetry from a single- and a two-channel device, a Shelly Gen2 switch's status.
METER_SAMPLES: dict[str, tuple[dict[str, Any], ...]] = {
    "tasmota": (
        {"Time": "2025-06-15T12:00:00", "ENERGY": {"Total": 12.3, "Power": 812, "Voltage": 230, "Current": 3.5}},
        {"Time": "2025-06-15T12:00:00", "ENERGY": {"Total": 12.3, "Power": [412, 400], "Voltage": 230,
                                                    "Current": [1.8, 1.7]}},
    ),
    "shelly": ({"id": 0, "source": "init", "output": True, "apower": 812.4, "voltage": 230.1, "current": 3.5,
                "aenergy": {"total": 1234.5, "by_minute": [13.1, 13.5, 13.2], "minute_ts": 1750000000}},),
}
_PRESET_PATHS = {"tasmota": "ENERGY.Power", "shelly": "apower"}


class WallMeterConfig(_MeterReach):
    """A smart plug or metered PDU that reports the host's wall (plug) power over MQTT.

    Presets: ``tasmota`` (``topic`` is the device topic: ``tele/<topic>/SENSOR``,
    ``ENERGY.Power``), ``shelly`` (Gen2/Plus, ``prefix``: ``<prefix>/status/switch:<switch>``,
    ``apower``) and ``generic`` (``topic`` is the full topic). ``json_path`` (required
    for ``generic``, else it replaces the preset's) is a dotted path to the watts, list
    items by number (``ENERGY.Power.1``: one channel of a multi-channel Tasmota) or
    ``*`` for their sum (``ENERGY.Power.*``); empty for a bare number
    (``core.meterpath``). Under a preset it must find watts in one of the preset's
    sample payloads (:data:`METER_SAMPLES`), or the config is refused.
    A reading older than ``max_age_s`` or outside [``min_w``, ``max_w``] is ignored.
    """

    preset: Literal["tasmota", "shelly", "generic"]
    topic: str | None = None
    prefix: str | None = None
    switch: int = Field(0, ge=0, le=63)  # shelly: the switch (output) whose meter reads the host
    json_path: str | None = None
    max_age_s: float = Field(30.0, gt=0, le=3600)
    min_w: float = Field(1.0, ge=0, le=100_000)  # a running host never draws 0 W
    max_w: float = Field(20_000.0, gt=0, le=100_000)
    hysteresis_w: float = Field(20.0, ge=0, le=1000)  # dead band against a noisy meter

    @field_validator("topic", "prefix")
    @classmethod
    def _topics(cls, value: str | None) -> str | None:
        return _check_topic(value)

    @model_validator(mode="after")
    def _check(self) -> WallMeterConfig:
        needs = {"tasmota": ("topic",), "shelly": ("prefix",), "generic": ("topic", "json_path")}[self.preset]
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"preset {self.preset!r} needs {' and '.join(missing)}")
        if self.min_w >= self.max_w:
            raise ValueError(f"min_w ({self.min_w:g} W) must be below max_w ({self.max_w:g} W)")
        if self.switch and self.preset != "shelly":
            raise ValueError("switch is the Shelly preset's: give the topic instead")
        if self.preset in METER_SAMPLES and self.json_path is not None:
            errors = []
            for sample in METER_SAMPLES[self.preset]:
                try:
                    watts_at(sample, self.power_path())
                    break
                except PathError as exc:
                    errors.append(str(exc))
            else:
                raise ValueError(f"json_path {self.json_path!r} finds no watts in a {self.preset} payload "
                                 f"({'; '.join(dict.fromkeys(errors))}); e.g. {_PRESET_PATHS[self.preset]}")
        return self

    def state_topic(self) -> str:
        if self.preset == "tasmota":
            return f"tele/{self.topic}/SENSOR"
        if self.preset == "shelly":
            return f"{self.prefix}/status/switch:{self.switch}"
        return self.topic  # type: ignore[return-value]

    def source_id(self) -> str:
        """The meter as a power-tree node's ``meter`` names it: ``mqtt:STATE_TOPIC``."""
        return f"mqtt:{self.state_topic()}"

    def power_path(self) -> tuple[str, ...]:
        path = self.json_path if self.json_path is not None else _PRESET_PATHS.get(self.preset, "")
        return tuple(p for p in path.split(".") if p)

    def availability(self) -> tuple[str, frozenset[str]] | None:
        """The meter's own online topic and the payloads that mean offline, if it has one."""
        if self.preset == "tasmota":
            return f"tele/{self.topic}/LWT", frozenset({"Offline"})
        if self.preset == "shelly":
            return f"{self.prefix}/online", frozenset({"false"})
        return None


class RemoteBudgetConfig(_Section):
    """Budget commands over MQTT: a value in [sum of card minimums, configured budget] (W)
    is applied, anything else rejected with the reason on ``response_topic``. Topics
    default to ``<base_topic>/budget/set`` and ``<base_topic>/budget/result``."""

    enabled: bool = False
    command_topic: str | None = None
    response_topic: str | None = None
    # A raise (toward the configured budget) is taken at most this often; a lower
    # budget is always taken at once (protection first).
    raise_interval_s: float = Field(10.0, ge=0, le=3600)

    @field_validator("command_topic", "response_topic")
    @classmethod
    def _topics(cls, value: str | None) -> str | None:
        return _check_topic(value)
