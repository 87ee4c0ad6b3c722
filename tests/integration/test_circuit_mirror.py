"""Reads from the watch's mirror (``channels.circuit.mirror``) in a real etcd: while a
host's watch stands its reads take no key from etcd, whatever the circuit's size; they
see the other hosts' changes as the watch tells them and the host's own writes at once;
a transaction's keys are seen together; a raise from the mirror compares its zone as a
range read's would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from powerbudgetd.channels.circuit.store import CircuitStore, HostRecord
from powerbudgetd.core.nodemeter import MeterReport
from powerbudgetd.core.tree import Host, Node, PowerTree
from support.circuit import EtcdCluster

pytestmark = pytest.mark.slow  # real etcd members: the full run (CI) covers it


PDUS = 6


def _tree(hosts: int) -> PowerTree:
    """A 1 MW root over six delegated PDUs; host i under PDU i mod 6."""
    nodes = {"root": Node("root", 1_000_000, None, "panel")} | {
        f"p{k}": Node(f"p{k}", 100_000, "root", "pdu", delegate=True) for k in range(PDUS)}
    return PowerTree(nodes, {f"h{i:03d}": Host(f"h{i:03d}", {f"p{i % PDUS}": 1.0}, 100.0) for i in range(hosts)})


async def _watching(store: CircuitStore) -> asyncio.Task[None]:
    async def follow() -> None:
        async for _ in store.changes(store.endpoint):
            pass

    task = asyncio.create_task(follow())
    deadline = time.monotonic() + 10
    while not store.mirror.live:
        assert time.monotonic() < deadline, "the watch did not open"
        await asyncio.sleep(0.01)
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def _woken_reads(eps: list[str]) -> None:
    n = 120
    stores = {h: CircuitStore(eps, "hall", timeout_s=5) for h in (f"h{i:03d}" for i in range(n))}
    admin = stores["h000"]
    assert await admin.init(1_000_000, 30, tree=_tree(n))
    leases = {}
    for h, s in stores.items():
        leases[h] = (await s.grant_lease(30))[0]
        assert await s.register_seat(await s.read(), h, 100.0, lease_id=leases[h])
        await s.put_record(h, HostRecord(200.0), leases[h])
    for k in range(PDUS):
        assert await admin.put_delegation(await admin.read(), f"p{k}", 50_000.0, "h000")
    me, other = stores["h001"], stores["h002"]
    task = await _watching(me)
    try:
        first = await me.read()  # once after the watch opened: a probe, no key
        assert len(first.view.seats) == n and first.delegations == {f"p{k}": 50_000.0 for k in range(PDUS)}
        ranges, keys = me.range_reads, me.keys_read
        # Another host's raise (its own store): told by the watch, read with no key.
        fresh = await other.read()
        assert await other.raise_grant(fresh, "h002", 300.0, leases["h002"])
        deadline = time.monotonic() + 5
        while (await me.read()).view.grants.get("h002") != 300.0:
            assert time.monotonic() < deadline, "the other host's raise never seen"
            await asyncio.sleep(0.01)
        # Its own raise: seen by its very next read.
        read = await me.read()
        assert await me.raise_grant(read, "h001", 250.0, leases["h001"])
        assert (await me.read()).view.grants["h001"] == 250.0
        # From a read behind a raise in its zone (h007, under p1 as h001 is) its raise
        # fails its compare; behind one under another lease (h004, p4), it lands.
        behind = await me.read()
        assert await stores["h007"].raise_grant(await stores["h007"].read(), "h007", 50.0, leases["h007"])
        assert not await me.raise_grant(behind, "h001", 260.0, leases["h001"])
        behind = await me.read()
        assert await stores["h004"].raise_grant(await stores["h004"].read(), "h004", 50.0, leases["h004"])
        assert await me.raise_grant(behind, "h001", 260.0, leases["h001"])
        # Not one key read from etcd by all of that: probes answer the revision alone.
        assert (me.range_reads, me.keys_read) == (ranges, keys)
    finally:
        await _stop(task)
        for s in stores.values():
            await s.close()


def test_a_watching_host_reads_no_key_from_etcd(etcd1: EtcdCluster) -> None:
    """120 seated hosts under six leased PDUs (some 250 keys). A host whose watch stands
    reads the circuit with no range read (before: every read took them all): it sees another host's raise as
    told, its own at once, and a raise from a read behind its zone fails."""
    asyncio.run(_woken_reads(etcd1.endpoints))


async def _together(eps: list[str]) -> None:
    reader, writer = CircuitStore(eps, "pairs", timeout_s=5), CircuitStore(eps, "pairs", timeout_s=5)
    k1, k2 = reader.base + b"x/one", reader.base + b"x/two"
    task = await _watching(reader)
    seen = torn = 0
    stop = asyncio.Event()

    async def look() -> None:
        nonlocal seen, torn
        while not stop.is_set():
            a, b = reader.mirror.kvs.get(k1), reader.mirror.kvs.get(k2)
            if a is not None or b is not None:
                seen += 1
                torn += (a is None) != (b is None) or (a is not None and b is not None and a.value != b.value)
            await asyncio.sleep(0)

    looker = asyncio.create_task(look())
    try:
        for i in range(200):
            value = str(i).encode()
            await writer._call(lambda c, v=value: c.transaction(  # type: ignore[misc]
                compare=[], success=[c.transactions.put(k1, v), c.transactions.put(k2, v)], failure=[]))
        await asyncio.sleep(0.2)
    finally:
        stop.set()
        await looker
        await _stop(task)
        await reader.close()
        await writer.close()
    assert seen > 0 and torn == 0, (seen, torn)


def test_a_transaction_s_keys_are_seen_together(etcd1: EtcdCluster) -> None:
    """Two keys written by each of 200 transactions: a task looking at the mirror
    between any two steps of the event loop never sees one without the other."""
    asyncio.run(_together(etcd1.endpoints))


async def _grants_told(eps: list[str]) -> tuple[list[bytes], bytes]:
    watcher, other = CircuitStore(eps, "told", timeout_s=5), CircuitStore(eps, "told", timeout_s=5)
    assert await watcher.init(3000, 30)
    lease = (await other.grant_lease(30))[0]
    assert await other.register_seat(await other.read(), "b", 800.0, lease_id=lease)
    told: list[bytes] = []

    async def follow() -> None:
        async for key in watcher.changes(watcher.endpoint):
            if key is not None:
                told.append(key)

    task = asyncio.create_task(follow())
    try:
        while not watcher.mirror.live:
            await asyncio.sleep(0.01)
        for grant_w in (300.0, 500.0, 500.0):  # raised twice, then written again unchanged
            assert await other.raise_grant(await other.read(), "b", grant_w, lease)
        await other.lower_grant("b", 200.0, lease)
        # Given back whole (the key deleted), with the record under it in one transaction.
        await other.lower_grant("b", 0.0, lease, record=HostRecord(0.0, caps_w=790.0, seat_w=800.0, grant_w=0.0))
        read = await other.read()
        last = read.revision
        assert "b" not in read.view.grants and read.records["b"].grant_w == 0.0 and read.records["b"].caps_w == 790.0
        assert read.records["b"].lease == lease  # under the host's lease: gone with it
        assert await watcher.mirror.reached(last, 5.0)
    finally:
        await _stop(task)
        await watcher.close()
        await other.close()
    return told, watcher.key(watcher.grants, "b")


def test_a_grant_raised_is_not_told_and_one_lowered_or_removed_is(etcd1: EtcdCluster) -> None:
    """Another host's grant raised takes watts: nothing for a watching host to do at once
    (told, each raise on a busy circuit woke every host's round). Lowered or removed, it
    frees watts a host held back may take: told."""
    told, grant = asyncio.run(_grants_told(etcd1.endpoints))
    assert told.count(grant) == 2, told


async def _meters_told(eps: list[str]) -> list[tuple[str, bool]]:
    watcher = CircuitStore(eps, "metered", timeout_s=5)
    b, c = CircuitStore(eps, "metered", timeout_s=5), CircuitStore(eps, "metered", timeout_s=5)
    assert await watcher.init(3000, 30)
    lease_b, lease_c = (await b.grant_lease(30))[0], (await c.grant_lease(30))[0]
    told: list[tuple[str, bool]] = []

    async def follow() -> None:
        async for k in watcher.changes(watcher.endpoint):
            if k is not None and k.startswith(watcher.meters):
                told.append((k.decode().split("/")[-2], watcher.pressing(k)))  # as the channel asks, when told

    async def report(store: CircuitStore, host: str, lease: int, value_w: float, at: float) -> None:
        await store.put_meter(MeterReport("ups", host, value_w, 0.5, 10.0, 2.0, at), lease)

    task = asyncio.create_task(follow())
    try:
        while not watcher.mirror.live:
            await asyncio.sleep(0.01)
        now = time.time()
        # b alone: new; the same, fresh; lower; higher; the same an hour later (the last
        # one stale by then).
        for value_w, at in ((1000.0, now), (1000.0, now + 1), (900.0, now + 2), (950.0, now + 3),
                            (950.0, now + 3600)):
            await report(b, "b", lease_b, value_w, at)
        # c reports the same node lower: b's same reading may now replace c's as the
        # newest, so it is news; c gone, b alone again; then b's report removed.
        await report(c, "c", lease_c, 800.0, now + 3601)
        await report(b, "b", lease_b, 950.0, now + 3602)
        await c.revoke(lease_c)
        await report(b, "b", lease_b, 950.0, now + 3603)
        await b.revoke(lease_b)
        deadline = time.monotonic() + 5
        while len(told) < 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        await _stop(task)
        for store in (watcher, b, c):
            await store.close()
    return told


def test_a_meter_report_that_may_lower_a_grant_is_pressing_and_one_with_no_news_is_not(etcd1: EtcdCluster) -> None:
    """A meter is republished every few seconds, mostly unchanged: told at once, every
    report woke every host's round past its wake budget. Pressing (read at once) only
    where it may call for a grant to come down: a new report, a reading that rose, one
    replacing a stale reading (which counted no unmanaged load), a report removed, and
    any report of a node another host reports too (the newest counts, whoever's)."""
    told = asyncio.run(_meters_told(etcd1.endpoints))
    assert told == [("b", True), ("b", False), ("b", False), ("b", True), ("b", True),
                    ("c", True), ("b", True), ("c", True), ("b", False), ("b", True)], told
