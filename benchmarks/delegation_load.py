"""Load test: in-process hosts on a four-level power tree, before and after delegation.

A site over feeds A and B (UPSes), each over ``--panels`` panels, each panel over PDUs:
one PDU A and one PDU B per rack of ``--rack-size`` hosts, every host corded half to
each (a redundant pair). Three etcd members on loopback (``circuit_load.start_etcd``).

- ``before``: ``circuit_load.Client`` as the daemon does today: every ``--poll-s`` it
  reads the circuit, takes the grant policy's target and raises by a transaction that
  compares the whole circuit (any two raises conflict).
- ``after``: every PDU is ``delegate = true``. A host wakes on an etcd watch event that
  touches its zone (``core.delegation``: its rack's hosts and its PDUs' leases, or the
  spec, tree or feed marks; any lease's change while a lease holds its raise back), on
  its own want changing, for its lease keepalive, and every ``--idle-poll-s`` (the
  daemon's ``poll_s``: a host under a lease is never settled); it
  moves its grant as the daemon does (``core.circuit.GrantPolicy``: the tree's
  division, a grant above the share released after the hold) within what its PDUs'
  leases leave (a raise: a transaction on its zone's keys only). Its reads are the
  daemon's (``CircuitStore.read``): from the watch's mirror (``channels.circuit.mirror``),
  no key read from etcd while the watch stands (``--no-mirror``: every read a range read
  over the whole circuit, as before). A host whose room is below its share because of a
  lease asks for a larger one (``store.put_delegation``: a transaction comparing what
  the parent's check depends on, ``core.delegation.lease_compares``), and the first host
  of each PDU resizes its lease to its figure in the tree's priority division every
  ``--rebalance-s`` (only that host wakes for it), and at once where a host waits for
  watts it holds above that figure (``leases.gives_back``; ``--no-give-back``: only
  periodically, as before). One watch (``store.changes``, the
  daemon's) serves the process and keeps the mirror every client's store reads from (a
  daemon keeps its own; the in-process hosts share one Read per revision).

- ``after --outlets``: each host also on an outlet of its own on each PDU (a node of
  the tree, ``delegate = true``, the host's rating its budget): the outlet leases from
  its PDU's lease, so a raise compares only the host's own keys and its outlets'
  leases; the outlets under one PDU contend in their lease changes instead (a lease
  nested in a lease compares its siblings and its parent only).

Both: each client's want redrawn every ``--churn`` s on average; the etcd leader killed
halfway, feed A marked lost at ``--feed-down-at`` of the run. Reported: raise
transactions, conflict rate, time to grant (a want rising above the grant to the next
raise) p50/p90/p99, time to raise (from the first round whose division gives the host more
than it holds, by a step, to the raise that takes it: the protocol's delay, where the
time to grant also counts a want waiting for watts the pool does not have; one still
open at the end counted until the last round that found it open) p50/p90/p99, etcd requests/s, the audit of every revision (every node's committed
load, failover counted, within budget: ``circuit_load._audit_until``) and the modelled
draw sampled every 100 ms through where it flows, and the benchmark's own CPU time.

    python benchmarks/delegation_load.py --clients 200 --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from circuit_load import Client, _at, _audit_until, _draw_until, leader_index, start_etcd  # noqa: E402

from powerbudgetd.core.circuit import raise_allowed  # noqa: E402

from powerbudgetd.channels.circuit import leases  # noqa: E402
from powerbudgetd.channels.circuit.store import CircuitStore, LeaseGone, Read, StoreUnavailable  # noqa: E402
from powerbudgetd.core.tree import Host, Node, PowerTree  # noqa: E402


def hall_tree(args: argparse.Namespace, delegate: bool) -> PowerTree:
    """site -> feed-a/feed-b -> panels -> a PDU A and B per rack (``delegate`` marks the PDUs).
    Each PDU carries its rack's seats plus its share of the pool; each feed its seats
    plus half the pool (the feeds are contested); the site both feeds (not binding: a
    host under two delegated PDUs counts on both where their paths meet)."""
    racks = -(-args.clients // args.rack_size)
    seats_w = args.clients * args.reserve_w
    feed_w = seats_w + args.pool_w / 2
    nodes = {"site": Node("site", 2 * feed_w, None, "site")}
    hosts: dict[str, Host] = {}
    for side in ("a", "b"):
        nodes[f"feed-{side}"] = Node(f"feed-{side}", feed_w, "site", "ups")
        for p in range(args.panels):
            nodes[f"p{p}-{side}"] = Node(f"p{p}-{side}", feed_w, f"feed-{side}", "panel")
    for r in range(racks):
        members = [i for i in range(args.clients) if i // args.rack_size == r]
        rack_w = len(members) * (args.reserve_w + args.max_want * 0.6)
        for side in ("a", "b"):
            nodes[f"r{r}-{side}"] = Node(f"r{r}-{side}", rack_w, f"p{r % args.panels}-{side}", "pdu", delegate=delegate)
        for i in members:
            h = f"c{i:03d}"
            cords = {f"r{r}-a": 0.5, f"r{r}-b": 0.5}
            if args.outlets:  # the host's own outlet on each PDU, leased from its PDU's lease
                cords = {f"{h}-{side}": 0.5 for side in ("a", "b")}
                for side in ("a", "b"):
                    nodes[f"{h}-{side}"] = Node(f"{h}-{side}", args.reserve_w + args.max_want, f"r{r}-{side}",
                                                "outlet", delegate=delegate)
            hosts[h] = Host(h, cords, args.reserve_w)
    return PowerTree(nodes, hosts).with_mode("redundant")


class DelegClient(Client):
    """A host under delegated PDUs, woken by the watch (see the module docstring)."""

    def __init__(self, i: int, eps: list[str], name: str, args: argparse.Namespace, rng: random.Random,
                 tree: PowerTree) -> None:
        super().__init__(i, eps, name, args, rng)
        self.tree = tree
        self.pdus = sorted(tree.hosts[self.host].cords)
        self.leased = leases.delegated_above(tree, self.host)  # its outlets' and PDUs' leases (--outlets)
        self.wake = asyncio.Event()
        self.zone_hosts: frozenset[str] = frozenset(h for h in tree.hosts if set(tree.hosts[h].cords) & set(self.pdus))
        self.asked_at = 0.0
        self.rebalance_due = 0.0
        self.lease_writes = self.lease_conflicts = self.rounds = self.give_backs = 0
        self.given_at = float("-inf")  # the last give-back to a host waiting (leases.gives_back)
        self.round_at = float("-inf")
        self.retry_at = float("inf")
        self.held_back = False  # its last round found a lease holding its raise back
        self.staggered = False
        self.more_since: float | None = None  # since when its division has given it more than it holds
        self.more_seen = 0.0  # the last round that found it so (monotonic s)
        self.raise_waits: list[tuple[float, float]] = []  # each time to raise: (since when, how long), monotonic s
        # The PDUs this host resizes periodically (it is their first host): only those
        # hosts wake for the rebalance. Recomputed at each fresh read.
        self.first_of: list[str] = []
        # Set by the watch when an event touches this host's zone (its rack's seats,
        # grants, claims, its PDUs' leases, the spec, tree or feed marks): a round reads
        # the circuit again only then (or to resize a lease: a whole-circuit compare).
        self.dirty = True
        self.last_read: Read | None = None
        self.reads = self.reads_saved = 0

    async def run(self, lease: int, ttl_s: int, until: float) -> None:
        last_ka = time.monotonic()
        next_churn = time.monotonic()
        while time.monotonic() < until:
            now = time.monotonic()
            try:
                if now - last_ka >= ttl_s / 6:
                    await self.store.keepalive(lease)
                    self.valid_until = self.fence.valid_until(now, ttl_s)
                    last_ka = now
                if now >= next_churn:
                    self.want_w = round(self.rng.uniform(0, self.args.max_want), 0)
                    await self.store.put_want(self.host, self.want_w, lease)
                    if self.want_w > self.grant_w and self.want_rose_at is None:
                        self.want_rose_at = now
                    next_churn = now + self.rng.expovariate(1 / self.args.churn)
                    self.wake.set()
                if self.wake.is_set() or now >= self.retry_at or self._rebalance_due(now) \
                        or now >= self.round_at + self.args.idle_poll_s:
                    if self.wake.is_set():  # woken by the watch: a few ms for the events of one change to arrive
                        await asyncio.sleep(self.rng.uniform(0.0, 0.03))
                    self.wake.clear()
                    self.retry_at = float("inf")
                    await self._round(lease)
            except LeaseGone:
                self.grant_w = self.in_use_w = 0.0
                lease = await self.seat(ttl_s)
                last_ka = time.monotonic()
            except StoreUnavailable as exc:
                print(f"{self.host}: {exc}", file=sys.stderr)
                await asyncio.sleep(0.1)
            # Sleep until woken, the next keepalive, want change, rebalance or poll (the
            # daemon's: a host under a lease is never settled), whichever first.
            deadline = min(last_ka + ttl_s / 6, next_churn, self.retry_at, until, self.round_at + self.args.idle_poll_s,
                           self.rebalance_due if self.first_of else until)
            try:
                await asyncio.wait_for(self.wake.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                pass
        try:
            await self.store.revoke(lease)
        except (StoreUnavailable, LeaseGone):
            pass
        await self.store.close()

    def _rebalance_due(self, now: float) -> bool:
        return bool(self.first_of) and now >= self.rebalance_due

    def _rebalanced(self, now: float) -> None:
        self.rebalance_due = now + leases.rebalance_wait_s(self.rng, self.args.rebalance_s)  # the daemon's jitter

    async def _read(self, fresh: bool) -> Read:
        """The circuit, read again only where the watch saw a change in this host's zone
        since the last read (or ``fresh``): a raise compares only its zone's keys, so a
        read with none of them changed since is as good as a new one."""
        if fresh or self.dirty or self.last_read is None or not self.args.reuse_reads:
            self.dirty = False  # before the read: an event during it marks it again
            self.reads += 1
            self.last_read = await self.store.read()
            self.first_of = [p for p in self.leased if leases.first_host(self.last_read, self.tree, p) == self.host]
        else:
            self.reads_saved += 1
        return self.last_read

    async def _round(self, lease: int) -> None:
        self.rounds += 1
        now = self.round_at = time.monotonic()
        read = await self._read(fresh=False)
        held = read.view.grants.get(self.host, 0.0)
        if held < self.grant_w:
            self.grant_w, self.in_use_w = held, min(self.in_use_w, held)
        # The periodic resize, or the same at once to give back watts a host waits for
        # (channel._resize_leases).
        periodic = self._rebalance_due(now)
        give = not periodic and not self.args.no_give_back and now - self.given_at >= leases.ASK_S \
            and leases.gives_back(read, self.host, read.view.wants, self.args.lease_margin_w, self.args.step_w)
        if periodic:
            self._rebalanced(now)
        if give:
            self.given_at, self.give_backs = now, self.give_backs + 1
        if periodic or give:
            if await self._rebalance(await self._read(fresh=True), first_only=True):
                self.dirty = True
            read = await self._read(fresh=False)
        # Under the leases as the daemon (leases.room_w); with none, the whole tree's room.
        room = leases.room_w(read, self.host) if read.charges() is not None \
            else self.tree.room_for_w(self.host, read.held_w()) - read.view.seats.get(self.host, 0.0)
        conflicted = False
        # Raises in one zone are staggered by how much each host lacks (as read), most first:
        # two from one revision would conflict (they compare each other's grant).
        lacking = sorted((-(r.want_w - read.view.grants.get(h, 0.0)), h) for h, r in read.records.items()
                         if h in self.zone_hosts and r.want_w > read.view.grants.get(h, 0.0) + self.args.step_w)
        rank = next((i for i, (_, h) in enumerate(lacking) if h == self.host), 0)
        if rank and not self.staggered:
            self.staggered = True
            self.retry_at = now + 0.04 * rank
            return
        self.staggered = False
        # The daemon's target (channel._move_grant): the grant policy's (the tree's
        # division, a raise within the free watts, a grant above the share released after
        # the hold), within what the leases above leave.
        target = self.policy.target_w(read.view, self.host, self.grant_w, now)
        if now >= self.valid_until:
            target = 0.0
        if target > self.grant_w + self.args.step_w:  # the division gives it more than it holds: from now on
            self.more_since = now if self.more_since is None else self.more_since
            self.more_seen = now
        elif target <= self.grant_w:
            self.more_since = None
        target = min(target, max(self.grant_w, room))
        if target > self.grant_w and raise_allowed(read.view, self.host, target):
            self.raises += 1
            if await self.store.raise_grant(read, self.host, target, lease):
                self.grant_w = target
                if time.monotonic() < self.valid_until:
                    self.in_use_w = target
                if self.want_rose_at is not None:
                    self.time_to_grant.append(time.monotonic() - self.want_rose_at)
                    self.want_rose_at = None
                if self.more_since is not None:
                    self.raise_waits.append((self.more_since, time.monotonic() - self.more_since))
                    self.more_since = None
            else:
                self.conflicts += 1
                conflicted = True
                self.dirty = True
                self.retry_at = time.monotonic() + self.rng.uniform(0.02, 0.15)  # another in the zone won: back off
        elif target < self.grant_w:
            self.in_use_w = min(self.in_use_w, target)  # the cards first, then etcd
            await self.store.lower_grant(self.host, target, lease)
            self.grant_w = target
        if self.policy.releasing:  # a grant above the share, released after the hold: look again then
            self.retry_at = min(self.retry_at, now + self.args.release_hold_s / 4)
        # Held back by a lease below its share of the division: ask (channel._resize_leases).
        # (as the daemon: its fair share of the wants; spare room is no ask)
        self.held_back = leases.held_back(read, self.host, self.args.step_w)
        if not conflicted and self.held_back and now - self.asked_at >= leases.ASK_S:
            self.asked_at = now
            if await self._rebalance(await self._read(fresh=True), first_only=False):
                self.dirty = True
                self.wake.set()
        if self.want_w <= self.grant_w:
            self.want_rose_at = None

    async def _rebalance(self, read: Read, *, first_only: bool) -> bool:
        """The daemon's lease resizing (``channels.circuit.leases.resize``). True when a
        lease changed."""
        sent, failed, changed = await leases.resize(self.store, read, self.host, wants_w=read.view.wants,
                                                    margin_w=self.args.lease_margin_w,
                                                    periodic=first_only)
        self.lease_writes += sent
        self.lease_conflicts += failed
        return changed


async def _watch(eps: list[str], store: CircuitStore, clients: list[DelegClient], until: float) -> None:
    """One watch on the circuit (``store.changes``: the daemon's, keeping ``store.mirror``,
    which every client's store reads from): each change wakes the clients whose zone it
    touches."""
    by_host: dict[str, list[DelegClient]] = {}
    by_pdu: dict[str, list[DelegClient]] = {}
    for c in clients:
        for h in c.zone_hosts:
            by_host.setdefault(h, []).append(c)
        for p in c.leased:
            by_pdu.setdefault(p, []).append(c)
    kinds = (store.seats, store.grants, store.claims)
    index = 0
    while time.monotonic() < until:
        ep = eps[index % len(eps)]
        index += 1
        try:
            async for key in store.changes(ep):
                kind = None if key is None else next((k for k in kinds if key.startswith(k)), None)
                if key is None:
                    woken: list[DelegClient] = clients  # in place: every host looks once
                elif kind is not None:
                    woken = by_host.get(key[len(kind):].decode(), [])
                elif key.startswith(store.delegations):  # and the hosts a lease holds back (a daemon wakes on any)
                    woken = by_pdu.get(key[len(store.delegations):].decode(), []) + [c for c in clients if c.held_back]
                elif key.startswith(store.wants):
                    woken = []  # a want moves no room: the host itself acts on its own
                else:
                    woken = clients  # spec, tree, feed marks
                for c in woken:
                    c.dirty = True
                    c.wake.set()
                if time.monotonic() >= until:
                    return
        except Exception as exc:  # noqa: BLE001 - a killed member: the next one
            print(f"watch {ep}: {type(exc).__name__}", file=sys.stderr)
            await asyncio.sleep(0.1)


def _pct(sorted_s: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``sorted_s`` (s, ascending; the median for 0.5), None if empty."""
    if not sorted_s:
        return None
    return round(statistics.median(sorted_s) if q == 0.5 else sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))], 3)


async def run_mode(args: argparse.Namespace, eps: list[str], procs: list, delegate: bool) -> dict:
    name = "after" if delegate else "before"
    tree = hall_tree(args, delegate)
    admin = CircuitStore(eps, name, timeout_s=10.0)  # its watch first reads the whole circuit, on a busy loop
    assert await admin.init(tree.nodes["site"].budget_w, args.ttl, tree=tree)
    start_rev = (await admin.read()).revision
    rng = random.Random(args.seed)
    if delegate:
        clients: list[Client] = [DelegClient(i, eps, name, args, random.Random(rng.random()), tree)
                                 for i in range(args.clients)]
    else:
        clients = [Client(i, eps, name, args, random.Random(rng.random())) for i in range(args.clients)]
    leases = []
    for c in clients:  # one at a time: every seat's join compares the whole circuit
        leases.append(await c.seat(args.ttl))
    if delegate:  # the leases, as a earlier run leaves them (persistent): each PDU's first host takes one
        for c in clients:
            assert isinstance(c, DelegClient)
            if not args.no_mirror:
                c.store.mirror = admin.mirror  # one watch serves the process (each daemon keeps its own)
            await c._rebalance(await c._read(fresh=True), first_only=True)
            c._rebalanced(time.monotonic())
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    calls0 = sum(c.store.calls for c in clients)
    ranges0, keys0 = sum(c.store.range_reads for c in clients), sum(c.store.keys_read for c in clients)
    t0 = time.monotonic()
    until = t0 + args.duration
    lost: dict[str, float] = {}

    async def feed_down() -> int | None:
        for _ in range(20):
            try:
                await admin.feed_down("feed-a", "benchmark")
                break
            except StoreUnavailable:
                await asyncio.sleep(0.1)
        lost["feed-a"] = time.monotonic()
        return 0

    async def kill_leader() -> int | None:
        i = leader_index(eps)
        if i is not None:
            procs[i].kill()
            print(f"{name}: leader {eps[i]} killed", file=sys.stderr)
        return i

    draw_task = asyncio.create_task(_draw_until(clients, tree.nodes["site"].budget_w, until, tree, lost))
    leader_task = asyncio.create_task(_at(t0 + args.duration / 2, kill_leader))
    down_task = asyncio.create_task(_at(t0 + args.duration * args.feed_down_at, feed_down))
    watch_task = asyncio.create_task(_watch(eps, admin, clients, until)) if delegate else None  # type: ignore[arg-type]
    await asyncio.gather(*(c.run(lease, args.ttl, until) for c, lease in zip(clients, leases, strict=True)))
    elapsed = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    if prof is not None:
        prof.disable()
        prof.dump_stats(f"{args.profile}.{name}")
    calls = sum(c.store.calls for c in clients) - calls0
    draw = await draw_task
    killed = await leader_task
    await down_task
    if watch_task is not None:
        watch_task.cancel()
    stop = asyncio.Event()
    stop.set()
    audit = await _audit_until([e for i, e in enumerate(eps) if i != killed], name,
                               tree.nodes["site"].budget_w, start_rev, stop, tree)
    final = await CircuitStore([e for i, e in enumerate(eps) if i != killed], name).read()
    charges = final.charges()
    await admin.close()
    ttg = sorted(t for c in clients for t in c.time_to_grant)
    waits = [x for c in clients for x in getattr(c, "raise_waits", [])]
    # A wait still open at the end counts until the last round that found it open (a lower
    # bound): left out, the longest waits (those the run ends inside) would not count at all.
    still = [(c.more_since, c.more_seen - c.more_since) for c in clients
             if getattr(c, "more_since", None) is not None]
    waits += still
    ttr = sorted(w for _, w in waits)
    raises = sum(c.raises for c in clients)
    conflicts = sum(c.conflicts for c in clients)
    cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {
        "mode": name, "clients": args.clients, "nodes": len(tree.nodes), "duration_s": round(elapsed, 1),
        "raise_txns": raises, "conflict_rate": round(conflicts / raises, 3) if raises else None,
        "grants_per_s": round((raises - conflicts) / elapsed, 1),
        "time_to_grant_p50_s": _pct(ttg, 0.5),
        "time_to_grant_p90_s": _pct(ttg, 0.90),
        "time_to_grant_p99_s": _pct(ttg, 0.99),
        "grants_timed": len(ttg),
        "time_to_raise_p50_s": _pct(ttr, 0.5),
        "time_to_raise_p90_s": _pct(ttr, 0.90),
        "time_to_raise_p99_s": _pct(ttr, 0.99),
        "raises_timed": len(ttr), "raise_waits_open": len(still), "etcd_ops_per_s": round(calls / elapsed, 1),
        # The longest waits and when each began (s into the run): the leader is killed
        # at half the run, the feed lost at --feed-down-at of it.
        "longest_raise_waits": [(round(at - t0, 1), round(w, 1)) for at, w in
                                sorted(waits, key=lambda x: -x[1])[:5]],
        "bench_cpu_pct": round(100 * cpu_s / elapsed, 1),
        "reads": sum(getattr(c, "reads", 0) for c in clients),
        "range_reads": sum(c.store.range_reads for c in clients) - ranges0,
        "keys_read": sum(c.store.keys_read for c in clients) - keys0,
        "mirror_lagged": sum(c.store.mirror_lagged for c in clients),
        "reads_saved": sum(getattr(c, "reads_saved", 0) for c in clients),
        "lease_writes": sum(getattr(c, "lease_writes", 0) for c in clients),
        "give_backs": sum(getattr(c, "give_backs", 0) for c in clients),
        "lease_conflicts": sum(getattr(c, "lease_conflicts", 0) for c in clients),
        "leases_in_force": len(final.delegations),
        "charges_within_bounds_at_end": None if charges is None else not charges.over_w(final.held_w()),
        "leader_killed": killed, "feed_lost_at_s": round(lost["feed-a"] - t0, 1) if lost else None,
        "audit": audit, "draw": draw,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--duration", type=float, default=60.0, help="wall seconds of each mode's run")
    p.add_argument("--modes", nargs="+", choices=("before", "after"), default=["before", "after"])
    p.add_argument("--rack-size", type=int, default=10)
    p.add_argument("--panels", type=int, default=2, help="panels per feed")
    p.add_argument("--reserve-w", type=float, default=500.0)
    p.add_argument("--pool-w", type=float, default=60_000.0, help="each feed's budget above the seats, x2 (W)")
    p.add_argument("--max-want", type=float, default=800.0)
    p.add_argument("--churn", type=float, default=10.0, help="mean seconds between a client's want changes")
    p.add_argument("--poll-s", type=float, default=0.2, help="before: the daemon's round")
    p.add_argument("--outlets", action="store_true",
                   help="after: each host on an outlet of its own on each PDU, delegated too (leased from the PDU's lease)")
    p.add_argument("--rebalance-s", type=float, default=5.0, help="after: each PDU's lease resized this often")
    p.add_argument("--no-give-back", action="store_true",
                   help="after: a lease gives watts back to a host waiting only at its periodic resize (as before)")
    p.add_argument("--idle-poll-s", type=float, default=1.0,
                   help="after: a round at least this often (the daemon's poll_s: a host under a lease is never settled)")
    p.add_argument("--lease-margin-w", type=float, default=None,
                   help="after: a lease's room above its wants, W (default: the daemon's, 5 %% of each node's budget)")
    p.add_argument("--profile", metavar="FILE", help="cProfile the run's window into FILE.<mode>")
    p.add_argument("--no-mirror", action="store_true",
                   help="after: every read a range read over the whole circuit (as before the watch's mirror)")
    p.add_argument("--reuse-reads", action="store_true",
                   help="after: a round reuses the host's last read where the watch saw no change in its zone "
                        "(fewer reads; more conflicts where the watch lags a saturated loop)")
    p.add_argument("--step-w", type=float, default=20.0)
    p.add_argument("--release-hold-s", type=float, default=2.0)
    p.add_argument("--ttl", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--feed-down-at", type=float, default=0.66)
    args = p.parse_args()
    # circuit_load.Client's knobs this benchmark does not exercise: no pauses or leaves.
    args.event_every_s, args.watchdog_s, args.fallback_s = 1e9, 1.5, 2.0
    args.no_grace = args.unsafe = False
    results = []
    for mode in args.modes:
        with tempfile.TemporaryDirectory() as tmp:
            procs, eps = start_etcd(Path(tmp), 3)
            try:
                results.append(asyncio.run(run_mode(args, eps, procs, mode == "after")))
            finally:
                for proc in procs:
                    proc.terminate()
                    proc.wait()
    print(json.dumps(results, indent=2))
    keys = ["raise_txns", "conflict_rate", "time_to_grant_p50_s", "time_to_grant_p90_s", "time_to_grant_p99_s",
            "grants_timed", "time_to_raise_p50_s", "time_to_raise_p90_s", "time_to_raise_p99_s", "raises_timed", "raise_waits_open",
            "etcd_ops_per_s", "bench_cpu_pct", "reads", "range_reads", "keys_read", "mirror_lagged", "reads_saved", "lease_writes", "lease_conflicts", "give_backs",
            "leases_in_force"]
    print(f"{'':<22}" + "".join(f"{r['mode']:>12}" for r in results))
    for k in keys:
        print(f"{k:<22}" + "".join(f"{r.get(k)!s:>12}" for r in results))
    for r in results:
        a, d = r["audit"], r["draw"]
        print(f"{r['mode']}: audit {a['revisions_checked']} revisions, {a['violations']} over; draw {d['samples']} samples, "
              f"{d['violations']} over outside the shed window (worst margin {d['worst_margin_w']} W)")


if __name__ == "__main__":
    main()
