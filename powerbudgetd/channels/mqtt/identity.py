"""One host, one identity: the node id names the bank, the client id this process.

Each process announces itself on ``<base>/instance``; another process announcing the
same node id (a second host configured alike, a copied config) is warned about by
name, once per other instance, since its state, commands and Home Assistant device
would mix with ours.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from typing import Any

import structlog

from powerbudgetd.channels.mqtt.metrics import MqttMetrics

log = structlog.get_logger("powerbudgetd")


class Identity:
    """This process on the broker: ``client_id`` is unique per host and process (no
    broker take-overs between two daemons); ``base`` is the node id's topic root."""

    def __init__(self, node_id: str, base: str, metrics: MqttMetrics) -> None:
        self.node_id, self.base, self.metrics = node_id, base, metrics
        self.host = socket.gethostname()
        self.pid = os.getpid()
        digest = hashlib.sha256(f"{self.host}:{self.pid}:{time.time_ns()}".encode()).hexdigest()[:10]
        self.client_id = f"powerbudgetd-{node_id}-{digest}"
        self._conflicts_said: set[tuple[str, int]] = set()

    def announcement(self) -> dict[str, Any]:
        """This process's announcement on ``<base>/instance``: who holds the node id."""
        return {"node_id": self.node_id, "host": self.host, "pid": self.pid, "client_id": self.client_id}

    def on_announcement(self, payload: bytes) -> None:
        """Another announcement on our node id: warn by name, once per other instance.
        One of ours from before a restart on this host (its PID gone) is not a twin.
        Raises ValueError (JSON) for a malformed one: the caller counts it, dropped."""
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
            "mqtt_node_id_conflict", node_id=self.node_id, other_host=host, other_pid=pid,
            detail=f"another powerbudgetd announces node id {self.node_id!r} on {self.base}: their state, "
            "commands and Home Assistant device mix with ours. Give each host its own [mqtt] node_id",
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, another user's
    return True
