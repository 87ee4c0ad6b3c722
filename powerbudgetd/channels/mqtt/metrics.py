"""The MQTT side channel's Prometheus metrics (names kept from the single-module days)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

READING_ERRORS = ("stale", "garbled", "negative", "implausible")


class MqttMetrics:
    """Broker connection, wall meter and remote budget metrics, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.connected = Gauge(
            "powerbudgetd_mqtt_connected", "1 while connected to the MQTT broker", registry=registry
        )
        # No wall-power series until a valid reading exists: 0 W would read as measured.
        self._wall_power: Gauge | None = None
        self._non_gpu_wall: Gauge | None = None
        self.meter_waiting = Gauge(
            "powerbudgetd_wall_meter_waiting", "1 until the wall meter's first valid reading", registry=registry
        )
        self.dropped = Counter(
            "powerbudgetd_mqtt_messages_dropped", "MQTT messages dropped unhandled, by topic kind and reason",
            ["kind", "reason"], registry=registry,
        )
        self.message_age = Gauge(
            "powerbudgetd_mqtt_last_message_age_seconds", "Seconds since the last message on each subscribed topic",
            ["topic"], registry=registry,
        )
        self.instance_conflicts = Counter(
            "powerbudgetd_mqtt_node_id_conflicts", "Other instances seen announcing this node id", registry=registry
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
        for result in ("accepted", "rejected", "retained_ignored", "rate_limited"):
            self.remote.labels(result)

    def wall_power(self, wall_w: float, non_gpu_w: float) -> None:
        """Export a valid reading (W); the series exist from the first one on."""
        if self._wall_power is None or self._non_gpu_wall is None:
            self._wall_power = Gauge(
                "powerbudgetd_wall_power_watts", "Last valid wall (plug) power reading", registry=self.registry
            )
            self._non_gpu_wall = Gauge(
                "powerbudgetd_wall_non_gpu_watts", "Wall power not explained by GPU board power / PSU efficiency",
                registry=self.registry,
            )
        self._wall_power.set(wall_w)
        self._non_gpu_wall.set(non_gpu_w)
