"""A hall's circuit as a host's watch holds it, for the tests (and ``benchmarks/round_lag.py``)
that time a round at the size of a hall without an etcd to seat thousands of hosts in.

:func:`hall_kvs` lays the keys out as ``CircuitStore`` does (its own key names and
record format); :func:`mirrored` loads them into a store that is never connected, as a
live, confirmed watch's mirror, so its reads take no key from etcd.
"""

from __future__ import annotations

import json
import random
import time

from powerbudgetd.channels.circuit import records
from powerbudgetd.channels.circuit.mirror import Entry
from powerbudgetd.channels.circuit.store import CircuitStore, tree_doc
from powerbudgetd.core.tree import Host, Node, PowerTree

SEAT_W = 500.0  # each host's seat (W)
WANT_MAX_W = 400.0  # each host's want above it, drawn uniformly below this (W)


def hall_kvs(store: CircuitStore, hosts_n: int, leases_w: dict[str, float] | None = None,
             seed: int = 1) -> tuple[dict[bytes, Entry], int]:
    """A hall of ``hosts_n`` hosts (the last named ``vm``), in racks of ten on a
    delegated PDU per feed (``r<k>-a``, ``r<k>-b``; every host corded half to each), under
    two feeds (``feed-a``, ``feed-b``) of two panels each; every host seated at
    :data:`SEAT_W` with a want drawn by ``seed``, and each PDU's lease of watts
    (``leases_w``, W) where given. Returns the keys (as ``store`` names them) with their
    entries, and the last revision."""
    names = [f"h{i:04d}" for i in range(hosts_n - 1)] + ["vm"]
    racks = -(-hosts_n // 10)
    feed_w = hosts_n * SEAT_W + hosts_n * 150.0
    nodes = {"site": Node("site", 2 * feed_w, None, "site")}
    for side in "ab":
        nodes[f"feed-{side}"] = Node(f"feed-{side}", feed_w, "site", "ups")
        for p in range(2):
            nodes[f"p{p}-{side}"] = Node(f"p{p}-{side}", feed_w / 2 + 5000, f"feed-{side}", "panel")
        for r in range(racks):
            nodes[f"r{r}-{side}"] = Node(f"r{r}-{side}", 10 * 800.0, f"p{r % 2}-{side}", "pdu", delegate=True)
    tree = PowerTree(nodes, {h: Host(h, {f"r{i // 10}-a": 0.5, f"r{i // 10}-b": 0.5}) for i, h in enumerate(names)})
    rng, rev = random.Random(seed), 0

    def entry(value: bytes, lease: int = 0) -> Entry:
        nonlocal rev
        rev += 1
        return Entry(value, rev, rev, lease)

    kvs = {store.spec_key: entry(records.dumps(budget_w=2 * feed_w, ttl_s=30)),
           store.tree_key: entry(json.dumps(tree_doc(tree.with_mode("redundant")), sort_keys=True).encode())}
    for h in names:
        kvs[store.key(store.seats, h)] = entry(records.dumps(reserve_w=SEAT_W))
        kvs[store.key(store.wants, h)] = entry(records.dumps(want_w=round(rng.uniform(0, WANT_MAX_W), 1)), lease=7)
    for node, w in (leases_w or {}).items():
        kvs[store.key(store.delegations, node)] = entry(records.dumps(watts_w=w))
    return kvs, rev


def mirrored(store: CircuitStore, kvs: dict[bytes, Entry], revision: int) -> CircuitStore:
    """``store`` (never connected) reading ``kvs`` at ``revision`` from its mirror: a live
    watch, confirmed, with no write of its own since (no probe of etcd)."""
    store.confirm_s, store._confirmed_at, store._wrote = float("inf"), time.monotonic(), False
    store.mirror.load(kvs.items(), revision)
    store.mirror.live = True
    return store
