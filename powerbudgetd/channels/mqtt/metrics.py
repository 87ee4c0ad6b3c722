"""The MQTT side channel's Prometheus metrics (names kept from the single-module days)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

READING_ERRORS = ("stale", "garbled", "negative", "implausible")


class MqttMetrics:
    """Broker connection, wall meter and remote budget metrics, on ``registry``."""

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
