"""The MQTT side channel's Prometheus metrics (declared in ``channels.metricnames``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from powerbudgetd.channels import metricnames as names

READING_ERRORS = ("stale", "garbled", "negative", "implausible")


class MqttMetrics:
    """Broker connection, wall meter and remote budget metrics, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.connected = names.gauge(names.MQTT_CONNECTED, registry)
        # No wall-power series until a valid reading exists: 0 W would read as measured.
        self._wall_power: Gauge | None = None
        self._non_gpu_wall: Gauge | None = None
        self.meter_waiting = names.gauge(names.WALL_METER_WAITING, registry)
        self.dropped = names.counter(names.MQTT_DROPPED, registry)
        self.message_age = names.gauge(names.MQTT_MESSAGE_AGE, registry)
        self.instance_conflicts = names.counter(names.MQTT_NODE_ID_CONFLICTS, registry)
        self.meter_budget = names.gauge(names.WALL_METER_BUDGET, registry)
        self.meter_ok = names.gauge(names.WALL_METER_OK, registry)
        self.ignored = names.counter(names.WALL_READINGS_IGNORED, registry)
        self.remote = names.counter(names.REMOTE_COMMANDS, registry)
        for reason in READING_ERRORS:
            self.ignored.labels(reason)
        for result in ("accepted", "rejected", "retained_ignored", "rate_limited"):
            self.remote.labels(result)

    def wall_power(self, wall_w: float, non_gpu_w: float) -> None:
        """Export a valid reading (W); the series exist from the first one on."""
        if self._wall_power is None or self._non_gpu_wall is None:
            self._wall_power = names.gauge(names.WALL_POWER, self.registry)
            self._non_gpu_wall = names.gauge(names.WALL_NON_GPU, self.registry)
        self._wall_power.set(wall_w)
        self._non_gpu_wall.set(non_gpu_w)
