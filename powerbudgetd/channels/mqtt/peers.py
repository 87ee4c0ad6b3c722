"""Who else is behind our meter: each daemon announces the meters it reads, and a meter
read by more controlled hosts than its ``hosts`` says is warned of.

Each daemon publishes, retained, on ``<meters_topic>/<node_id>`` (``[mqtt]
meters_topic``, ``powerbudgetd/meters`` by default) the source ids of the meters it
closes a loop on (``ups:NAME@HOST``, ``mqtt:TOPIC``: ``core.nodemeter``), and reads
everyone's. Hosts naming the same source are behind the same meter. Where this host's
loop on a meter assumes fewer hosts than are seen (``[ups] hosts`` or
``[mqtt.wall_meter] hosts``, 1 when left out, and no ``share`` given), each host
corrects the whole excess alone and together they overshoot (the loop gain is the
number of hosts): one ``meter_shared_unconfigured`` warning per meter and count, naming
the other hosts and the setting to change; one line again when the count is back.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from typing import Any

import structlog

from powerbudgetd.core.sensor import Reach

log = structlog.get_logger("powerbudgetd")

MAX_METERS = 16  # sources one announcement may name (a host reads one or two)


class MeterPeers:
    """The meters this daemon reads (source id -> its :class:`Reach` and the setting
    that states it) and the other daemons seen reading each; see the module docstring."""

    def __init__(self, node_id: str, topic: str) -> None:
        self.node_id, self.topic = node_id, topic.rstrip("/")
        self.mine: dict[str, tuple[Reach, str]] = {}
        self.peers: dict[str, frozenset[str]] = {}  # node id -> the sources it announced
        self._said: dict[str, int] = {}  # source -> the count last warned of

    @property
    def own_topic(self) -> str:
        return f"{self.topic}/{self.node_id}"

    @property
    def wildcard(self) -> str:
        return f"{self.topic}/+"

    def read(self, sources: Mapping[str, tuple[Reach, str]]) -> None:
        """The meters this daemon closes a loop on: source id -> (reach, the setting)."""
        self.mine = dict(sources)
        self._check()

    def announcement(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "host": socket.gethostname(), "pid": os.getpid(),
                "meters": sorted(self.mine)}

    def is_peer_topic(self, topic: str) -> bool:
        rest = topic.removeprefix(self.topic + "/")
        return rest != topic and bool(rest) and "/" not in rest

    def on_announcement(self, topic: str, payload: bytes) -> None:
        """Another daemon's announcement (empty: it left). Raises ValueError for one that
        is not an object naming up to :data:`MAX_METERS` source ids (the caller drops it)."""
        node = topic.removeprefix(self.topic + "/")
        if node == self.node_id:
            return
        if not payload:
            self.peers.pop(node, None)
        else:
            doc = json.loads(payload)
            meters = doc.get("meters") if isinstance(doc, dict) else None
            if not isinstance(meters, list) or len(meters) > MAX_METERS or not all(
                    isinstance(m, str) and 0 < len(m) <= 200 for m in meters):
                raise ValueError(f"a meter announcement names a list of at most {MAX_METERS} source ids")
            self.peers[node] = frozenset(meters)
        self._check()

    def behind(self, source: str) -> list[str]:
        """The other daemons (node ids) announcing ``source``."""
        return sorted(n for n, meters in self.peers.items() if source in meters)

    def _check(self) -> None:
        for source, (reach, setting) in self.mine.items():
            others = self.behind(source)
            seen = 1 + len(others)
            said = self._said.get(source, 1)
            if reach.share is None and seen > reach.hosts:
                if seen != said:
                    self._said[source] = seen
                    log.warning(
                        "meter_shared_unconfigured", meter=source, hosts_seen=seen, hosts_configured=reach.hosts,
                        others=others, setting=setting,
                        detail=f"{seen} powerbudgetd hosts read this meter, but this host's loop assumes "
                        f"{reach.hosts}: each corrects {'the whole' if reach.hosts == 1 else 'too large a part of the'} "
                        f"excess and together they overshoot. Set {setting} hosts = {seen} (or share) on each, or, "
                        "on a shared circuit, name the meter on its node of the power tree")
            elif said > reach.hosts:
                self._said[source] = 1
                log.info("meter_shared_resolved", meter=source, hosts_seen=seen, hosts_configured=reach.hosts,
                         share=reach.share, setting=setting)
