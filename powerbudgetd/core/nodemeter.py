"""A power-tree node held against its own meter: measured and reported draw, and the
unmanaged load between them (pure).

A node of the tree may name a *meter*: a source id, the same text on every host that
reads it (``ups:NAME@HOST`` for a UPS through NUT, ``mqtt:TOPIC`` for a wall meter's
state topic; :func:`source_id`). A host under the node that reads that meter publishes
its latest reading (:class:`MeterReport`) under its own lease; every host then reads
every report and computes the same figures from the same store revision:

- *measured* draw: the meter's value (wall W), from the report seen most recently;
- *reported* draw: the sum of the live hosts' published draw through the node (where
  it flows now, ``core.tree.PowerTree.loads_known_w``);
- *unmanaged* load: measured - reported, floored at 0: switches, storage, a host
  without the daemon. Only a *fresh* reading counts (:func:`stale_after_s`); a stale
  one, or a node whose reported draw is unknown, counts none and says why
  (:attr:`NodeMeter.why`).

A node's unmanaged load also loads every node above it, so the load a node must leave
is the larger of its own meter's and the sum of its children's
(:func:`unmanaged_by_node`): a parent's meter sees its children's unmanaged loads too,
and is never counted twice. ``core.tree.PowerTree.with_unmanaged`` takes it off the
node's budget, so the division, every raise and every check leave it its watts.

The reading and the hosts' draw are not taken at the same instant: after the hosts
step down, a slow meter still shows their old draw for up to a refresh, and the
unmanaged load is overstated for that long (the safe side: hosts are lowered, never
raised, on it).

Pure: no I/O, no clock (``now``: wall-clock s, passed in; reports carry wall-clock
stamps, as hosts on one circuit keep NTP time).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from powerbudgetd.core.tree import PowerTree

MIN_STALE_S = 10.0  # a reading is stale after at least this long unseen ...
STALE_REFRESHES = 3.0  # ... or this many of the source's refresh intervals, the longer
UNKNOWN_REFRESH_S = 30.0  # a source's interval before it is known (usbhid-ups's default pollfreq)
MAX_SOURCE = 200  # characters in a source id
SOURCE_RE = re.compile(r"^[a-z][a-z0-9]*:\S+$")


def source_id(kind: str, name: str) -> str:
    """The meter's source id: ``kind:name`` (``ups``, ``NAME@HOST``; ``mqtt``, TOPIC).
    Raises ValueError for one :func:`check_source` refuses."""
    out = f"{kind}:{name}"
    check_source(out)
    return out


def check_source(text: str) -> str:
    """``text`` as a source id (``scheme:rest``, lower-case scheme, no blanks, at most
    :data:`MAX_SOURCE` characters). Raises ValueError saying what is wrong."""
    if len(text) > MAX_SOURCE or not SOURCE_RE.match(text):
        raise ValueError(f"meter {text[:MAX_SOURCE]!r} is no source id: give 'ups:NAME@HOST' (a UPS through NUT), "
                         f"'mqtt:TOPIC' (a wall meter's state topic), 'pdu:HOST/inletN' (a PDU over SNMP) or "
                         f"'bmc:HOST' (a BMC over Redfish), without blanks, at most {MAX_SOURCE} characters")
    return text


def stale_after_s(refresh_s: float | None) -> float:
    """How long a reading unseen stays fresh (s): :data:`STALE_REFRESHES` refreshes of
    the source, at least :data:`MIN_STALE_S` (an unknown refresh counts as
    :data:`UNKNOWN_REFRESH_S`)."""
    refresh = UNKNOWN_REFRESH_S if refresh_s is None else refresh_s
    return max(MIN_STALE_S, STALE_REFRESHES * refresh)


@dataclass(frozen=True)
class Sample:
    """A source's latest value as its host holds it (the daemon's monotonic clock, s):
    ``value_w`` (wall W), ``changed_at`` (when it changed), ``seen_at`` (the last poll
    that still showed it), ``refresh_s`` (the interval the source shows; None: unknown)."""

    value_w: float
    changed_at: float
    seen_at: float
    refresh_s: float | None


@dataclass(frozen=True)
class MeterReport:
    """One host's published reading of a node's meter: ``value_w`` (wall W); ``age_s``:
    since a poll last showed it, ``changed_s``: since it changed (s, at publication);
    ``refresh_s``: the source's interval (None: unknown); ``at``: when published
    (wall-clock s)."""

    node: str
    host: str
    value_w: float
    age_s: float
    changed_s: float
    refresh_s: float | None
    at: float

    def age_at(self, now: float) -> float:
        """Seconds since a poll last showed the value, at ``now`` (wall clock; a stamp
        from the future counts as now)."""
        return self.age_s + max(0.0, now - self.at)

    def fresh_at(self, now: float) -> bool:
        return self.age_at(now) <= stale_after_s(self.refresh_s)


def report_of(sample: Sample, node: str, host: str, mono_now: float, wall_now: float) -> MeterReport:
    """The report of ``sample`` (monotonic times) published at ``mono_now``/``wall_now``."""
    return MeterReport(node, host, sample.value_w, max(0.0, mono_now - sample.seen_at),
                       max(0.0, mono_now - sample.changed_at), sample.refresh_s, wall_now)


@dataclass(frozen=True)
class NodeMeter:
    """A metered node's figures at one read (wall W): ``source`` (its meter),
    ``measured_w`` (None: no report), ``reported_w`` (the hosts' draw through it; None:
    unknown), ``unmanaged_w`` (its own meter's: measured - reported, floored at 0, from a
    fresh reading only; else 0), ``age_s``/``refresh_s``/``host`` of the report used,
    ``fresh``, and ``why`` no unmanaged load is counted (empty when one is)."""

    node: str
    source: str
    measured_w: float | None
    reported_w: float | None
    unmanaged_w: float
    age_s: float | None
    refresh_s: float | None
    host: str | None
    fresh: bool
    why: str


def node_meters(tree: PowerTree, reports: Mapping[str, Mapping[str, MeterReport]],
                reported_w: Mapping[str, float | None], now: float) -> dict[str, NodeMeter]:
    """Each metered node's :class:`NodeMeter` from ``reports`` (node -> host -> report,
    already checked to come from hosts under the node) and the hosts' ``reported_w``
    (node -> W; None: a host's draw unknown), at ``now`` (wall-clock s). Of several
    hosts' reports the one seen most recently is used (the highest value on a tie)."""
    out: dict[str, NodeMeter] = {}
    for name, node in tree.nodes.items():
        if node.meter is None:
            continue
        reported = reported_w.get(name)
        mine = list(reports.get(name, {}).values())
        if not mine:
            out[name] = NodeMeter(name, node.meter, None, reported, 0.0, None, None, None, False,
                                  "no host under the node has published a reading of its meter")
            continue
        best = min(mine, key=lambda r: (r.age_at(now), -r.value_w))
        age = best.age_at(now)
        fresh = best.fresh_at(now)
        why = ""
        unmanaged = 0.0
        if not fresh:
            why = (f"the reading is stale ({age:.0f} s old, stale after {stale_after_s(best.refresh_s):.0f} s): "
                   "no unmanaged load counted")
        elif reported is None:
            why = "a host's draw under the node is unknown: no unmanaged load counted"
        else:
            unmanaged = max(0.0, best.value_w - reported)
        out[name] = NodeMeter(name, node.meter, best.value_w, reported, unmanaged, round(age, 1), best.refresh_s,
                              best.host, fresh, why)
    return out


def unmanaged_by_node(tree: PowerTree, meters: Mapping[str, NodeMeter]) -> dict[str, float]:
    """The unmanaged load each node must leave (W): the larger of its own meter's and
    the sum of its children's (a load under a child loads the parent too; a parent's
    meter already sees it). Only nodes with a load above 0."""
    children: dict[str | None, list[str]] = {}
    for node in tree.nodes.values():
        children.setdefault(node.parent, []).append(node.name)
    out: dict[str, float] = {}

    def visit(name: str) -> float:
        below = sum(visit(c) for c in children.get(name, []))
        own = meters[name].unmanaged_w if name in meters else 0.0
        load = max(own, below)
        if load > 0 and math.isfinite(load):
            out[name] = load
        return load if math.isfinite(load) else 0.0

    for root in children.get(None, []):
        visit(root)
    return out
