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

Each announcement also gives this host's loop gain on each meter (``gains``: source id
-> ``Reach.fraction``). Where every host seen behind a meter has given its gain, their
sum is checked as well: above 1 (``share = 1`` with ``hosts = 2``, ``share = 0.5`` on
three hosts, one host left at the default beside others with a share) they overshoot
together just the same, and are warned of the same way.
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
GAIN_SLACK = 1e-6  # loop gains summing to 1 within this are one correction, not an overshoot


class MeterPeers:
    """The meters this daemon reads (source id -> its :class:`Reach` and the setting
    that states it) and the other daemons seen reading each; see the module docstring."""

    def __init__(self, node_id: str, topic: str) -> None:
        self.node_id, self.topic = node_id, topic.rstrip("/")
        self.mine: dict[str, tuple[Reach, str]] = {}
        self.peers: dict[str, frozenset[str]] = {}  # node id -> the sources it announced
        self.gains: dict[str, dict[str, float]] = {}  # node id -> source -> its loop gain, where it gave one
        self._said: dict[str, tuple[int, float | None]] = {}  # source -> (hosts seen, gains' sum) last warned of

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
                "meters": sorted(self.mine), "gains": {m: reach.fraction for m, (reach, _) in self.mine.items()}}

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
            self.gains.pop(node, None)
        else:
            doc = json.loads(payload)
            meters = doc.get("meters") if isinstance(doc, dict) else None
            if not isinstance(meters, list) or len(meters) > MAX_METERS or not all(
                    isinstance(m, str) and 0 < len(m) <= 200 for m in meters):
                raise ValueError(f"a meter announcement names a list of at most {MAX_METERS} source ids")
            gains = doc.get("gains", {})
            if not isinstance(gains, dict) or not all(
                    m in meters and isinstance(g, int | float) and not isinstance(g, bool) and 0 < g <= 1
                    for m, g in gains.items()):
                raise ValueError("a meter announcement's gains map its source ids to loop gains in (0, 1]")
            self.peers[node] = frozenset(meters)
            self.gains[node] = {m: float(g) for m, g in gains.items()}
        self._check()

    def behind(self, source: str) -> list[str]:
        """The other daemons (node ids) announcing ``source``."""
        return sorted(n for n, meters in self.peers.items() if source in meters)

    def gain_sum(self, source: str) -> float | None:
        """The loop gains of every host seen behind ``source`` (this one's included)
        summed; None while another host there has not given its gain."""
        mine = self.mine.get(source)
        others = self.behind(source)
        if mine is None or any(source not in self.gains.get(n, {}) for n in others):
            return None
        return mine[0].fraction + sum(self.gains[n][source] for n in others)

    def _check(self) -> None:
        for source, (reach, setting) in self.mine.items():
            others = self.behind(source)
            seen = 1 + len(others)
            total = self.gain_sum(source)
            said = self._said.get(source)
            too_many = reach.share is None and seen > reach.hosts
            too_much = total is not None and total > 1 + GAIN_SLACK
            if too_many or too_much:
                key = (seen, None if total is None else round(total, 3))
                if key != said:
                    self._said[source] = key
                    if too_many:
                        detail = (f"{seen} powerbudgetd hosts read this meter, but this host's loop assumes "
                                  f"{reach.hosts}: each corrects "
                                  f"{'the whole' if reach.hosts == 1 else 'too large a part of the'} excess and "
                                  f"together they overshoot. Set {setting} hosts = {seen} (or share) on each, or, on "
                                  "a shared circuit, name the meter on its node of the power tree")
                    else:
                        detail = (f"the {seen} powerbudgetd hosts reading this meter take {total:.3g} of its excess "
                                  f"together (this one {reach.fraction:.3g}): above 1 they overshoot. Set {setting} "
                                  "share on each so the shares sum to 1 at most (or hosts, without share), or, on a "
                                  "shared circuit, name the meter on its node of the power tree")
                    log.warning(
                        "meter_shared_unconfigured", meter=source, hosts_seen=seen, hosts_configured=reach.hosts,
                        share=reach.share, gains_sum=None if total is None else round(total, 3), others=others,
                        setting=setting, detail=detail)
            elif said is not None:
                del self._said[source]
                log.info("meter_shared_resolved", meter=source, hosts_seen=seen, hosts_configured=reach.hosts,
                         share=reach.share, setting=setting)
