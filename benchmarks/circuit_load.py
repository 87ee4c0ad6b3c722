"""Load test: N grant clients (the circuit protocol alone, no NVML) against one real etcd.

Starts ``--members`` etcd members (Debian's ``etcd``) in a temporary directory, creates a circuit
(budget = seats + a pool), and runs ``--clients`` clients in one event loop, each with
its own connection, lease, seat, want and grant, the same store and policy the daemon
uses (``channels.circuit.store``, ``core.circuit.GrantPolicy``). Every ``--churn`` s on
average a client draws a new want (0 .. ``--max-want``). A client without cards lowers at
once (it has nothing to confirm).

Churn: every ``--event-every-s`` s on average a client pauses (as SIGSTOP: a pause
longer than ``--watchdog-s`` is a watchdog kill, the failsafe lowers ``--fallback-s``
later, and the client restarts with a new lease) or leaves (its lease revoked, its seat
removed) and joins again later; with three ``--members`` or more the etcd leader is
killed halfway.

Measured over ``--duration`` s of wall time:

- grants/s: successful raise transactions; conflict rate: raise transactions that
  failed their compare / all raise transactions;
- time to grant: from a want that rose above the grant to the first raise after it
  (p50/p99);
- etcd operations/s: requests the clients sent (reads, puts, transactions, keepalives);
- audit: a watch on the circuit's prefix from the first revision replays every change
  and checks ``sum(seats) + sum(grants) <= budget`` at every revision. ``--unsafe``
  makes each client take its whole want with a plain put (no fit check, no compare):
  the audit must then find violations (the check checks itself);
- draw: every 100 ms each client's modelled wall draw (its reserve, plus the grant in
  use until its fence, or until its failsafe when paused) summed against the budget.
  ``--no-grace`` (leases of the circuit's TTL alone) makes it find violations.

``--tree redundant|oversubscribed``: the circuit is a power tree (``circuit init
--tree``): a root panel (the seats plus ``--pool-w``) over feeds A and B, each over one
PDU per rack of ``--rack-size`` clients; every client corded half to its rack's PDU A,
half to its PDU B; each feed (and PDU) budgeted at its hosts' seats plus half their
pool, so the feeds are what is contested. At ``--feed-down-at`` of the run feed A is
marked lost (``circuit feed-down``). The audit then checks every node at every
revision (seats and grants, failover counted) and counts the revisions over where the
draw flows with A dead (the records' shed); the draw check sums each client's modelled
draw through every node where it flows, and reports the time from the loss until
every node is within its budget (the shed time) and any sample over outside it.

    python benchmarks/circuit_load.py --clients 200 --duration 120
    python benchmarks/circuit_load.py --clients 40 --tree oversubscribed --poll-s 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from collections.abc import Awaitable, Callable

from powerbudgetd.channels.circuit.store import CircuitStore, LeaseGone, StoreUnavailable
from powerbudgetd.core.circuit import Fence, GrantPolicy, fenced_lease_ttl_s, raise_allowed
from powerbudgetd.core.tree import Host, Node, PowerTree


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_etcd(tmp: Path, members: int) -> tuple[list[subprocess.Popen], list[str]]:
    """``members`` etcd members on loopback (fast heartbeats), once every one is healthy."""
    ports = [(free_port(), free_port()) for _ in range(members)]
    cluster = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(ports))
    procs, eps = [], []
    for i, (cport, pport) in enumerate(ports):
        ep = f"127.0.0.1:{cport}"
        procs.append(subprocess.Popen([
            shutil.which("etcd") or "/usr/bin/etcd", "--name", f"m{i}", "--data-dir", str(tmp / f"etcd{i}"),
            "--listen-client-urls", f"http://{ep}", "--advertise-client-urls", f"http://{ep}",
            "--listen-peer-urls", f"http://127.0.0.1:{pport}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
            "--initial-cluster", cluster, "--heartbeat-interval", "50", "--election-timeout", "500",
            "--log-outputs", "stderr", "--logger", "zap",
        ], stdout=subprocess.DEVNULL, stderr=open(tmp / f"etcd{i}.log", "wb")))  # noqa: SIM115
        eps.append(ep)
    for ep in eps:
        for _ in range(400):
            try:
                with urllib.request.urlopen(f"http://{ep}/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            raise SystemExit(f"etcd {ep} did not start")
    return procs, eps


def leader_index(eps: list[str]) -> int | None:
    for i, ep in enumerate(eps):
        try:
            with urllib.request.urlopen(f"http://{ep}/metrics", timeout=1) as r:
                if b"\netcd_server_is_leader 1" in r.read():
                    return i
        except OSError:
            pass
    return None


class Client:
    """One host's protocol on a simulated bank: its *draw* is its reserve plus the grant
    in use (raised after etcd, lowered before it), back to the reserve at its fence
    (the circuit's TTL after the last acknowledged keepalive's send, as the daemon's).

    Churn: a paused client does nothing (no renewal, no lowering) and keeps its draw
    until its modelled watchdog kill and failsafe (``--watchdog-s`` + ``--fallback-s``
    after the pause began), then restarts with a new lease once the pause ends; a client
    that leaves gives its lease back and its seat up, and joins again later.
    """

    def __init__(self, i: int, eps: list[str], name: str, args: argparse.Namespace, rng: random.Random) -> None:
        self.host = f"c{i:03d}"
        self.store = CircuitStore(eps[i % len(eps):] + eps[:i % len(eps)], name, timeout_s=2.0)
        self.args = args
        self.rng = rng
        self.fence = Fence(lower_s=0.0)
        self.policy = GrantPolicy(step_w=args.step_w, release_hold_s=args.release_hold_s)
        self.grant_w = 0.0  # as etcd holds it (as far as this client knows)
        self.in_use_w = 0.0  # what the cards may draw above the reserve
        self.valid_until = float("-inf")
        self.down_at = float("inf")  # a pause's watchdog kill and failsafe: the cards at the reserve
        self.present = True
        self.paused = False
        self.want_w = 0.0
        self.want_rose_at: float | None = None
        self.raises = self.conflicts = self.pauses = self.leaves = 0
        self.time_to_grant: list[float] = []

    def draw_w(self, now: float) -> float:
        """The modelled wall draw (W) at ``now``: what the breaker sees from this host."""
        if not self.present:
            return 0.0
        if self.paused:  # nothing runs to lower the cards: only the watchdog kill and failsafe
            held = self.in_use_w if now < self.down_at else 0.0
        else:
            held = self.in_use_w if now < self.valid_until and now < self.down_at else 0.0
        return self.args.reserve_w + held

    async def seat(self, ttl_s: int) -> int:
        """Lease (the circuit's TTL + the grace) and seat, retried while etcd does not answer."""
        while True:
            try:
                return await self._seat(ttl_s)
            except (StoreUnavailable, LeaseGone) as exc:
                print(f"{self.host}: {exc}", file=sys.stderr)
                await asyncio.sleep(self.rng.uniform(0.1, 0.5))

    async def _seat(self, ttl_s: int) -> int:
        ttl = ttl_s if self.args.no_grace else fenced_lease_ttl_s(ttl_s, self.args.watchdog_s, self.args.fallback_s)
        lease, _ = await self.store.grant_lease(ttl)
        self.valid_until = self.fence.valid_until(time.monotonic(), ttl_s)
        read = await self.store.read()
        while read.view.seats.get(self.host) != self.args.reserve_w:
            if not await self.store.register_seat(read, self.host, self.args.reserve_w):
                await asyncio.sleep(self.rng.uniform(0, 0.05))
            read = await self.store.read()
        self.grant_w = self.in_use_w = 0.0
        self.down_at = float("inf")
        return lease

    async def run(self, lease: int, ttl_s: int, until: float) -> None:
        last_ka = time.monotonic()
        next_churn = time.monotonic()
        next_event = time.monotonic() + self.rng.expovariate(1 / self.args.event_every_s)
        while time.monotonic() < until:
            now = time.monotonic()
            try:
                if now >= next_event:
                    next_event = now + self.rng.expovariate(1 / self.args.event_every_s)
                    lease = await self._event(lease, ttl_s, until)
                    last_ka = time.monotonic()
                    continue
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
                await self._round(lease)
            except LeaseGone:
                self.grant_w = self.in_use_w = 0.0
                lease = await self.seat(ttl_s)
                last_ka = time.monotonic()
            except StoreUnavailable as exc:
                print(f"{self.host}: {exc}", file=sys.stderr)
            await asyncio.sleep(self.args.poll_s * self.rng.uniform(0.8, 1.2))
        try:
            await self.store.revoke(lease)
        except (StoreUnavailable, LeaseGone):
            pass
        await self.store.close()

    async def _round(self, lease: int) -> None:
        now = time.monotonic()
        read = await self.store.read()
        held = read.view.grants.get(self.host, 0.0)
        if held < self.grant_w:
            self.grant_w, self.in_use_w = held, min(self.in_use_w, held)
        target = self.policy.target_w(read.view, self.host, self.grant_w, now) if now < self.valid_until else 0.0
        if self.args.unsafe:  # the audit's own check: grab the want, no check, no compare
            target = max(target, self.want_w)
        if target > self.grant_w and (self.args.unsafe or raise_allowed(read.view, self.host, target)):
            self.raises += 1
            if self.args.unsafe:
                await self.store.lower_grant(self.host, target, lease)
                ok = True
            else:
                ok = await self.store.raise_grant(read, self.host, target, lease)
            if ok:
                self.grant_w = target
                if time.monotonic() < self.valid_until:
                    self.in_use_w = target
                if self.want_rose_at is not None:
                    self.time_to_grant.append(time.monotonic() - self.want_rose_at)
                    self.want_rose_at = None
            else:
                self.conflicts += 1
        elif target < self.grant_w:
            self.in_use_w = min(self.in_use_w, target)  # the cards first, then etcd
            await self.store.lower_grant(self.host, target, lease)
            self.grant_w = target
        if self.want_w <= self.grant_w:
            self.want_rose_at = None

    async def _event(self, lease: int, ttl_s: int, until: float) -> int:
        """A pause (SIGSTOP-like) or a leave and a later join; returns the lease in use."""
        if self.rng.random() < 0.5:
            self.pauses += 1
            paused = time.monotonic()
            pause_s = self.rng.uniform(0.2, 3 * ttl_s)
            if pause_s > self.args.watchdog_s:  # the watchdog kills it; the failsafe lowers
                self.down_at = paused + self.args.watchdog_s + self.args.fallback_s
            self.paused = True
            await asyncio.sleep(min(pause_s, max(0.0, until - paused)))
            self.paused = False
            if self.down_at == float("inf"):
                return lease
            return await self.seat(ttl_s)  # restarted: a new lease (the old one lapses)
        self.leaves += 1
        self.in_use_w = 0.0  # a clean stop: the cards at the reserve, then the grant back
        self.present = False
        try:
            await self.store.revoke(lease)
            await self.store.leave(self.host)
        except (StoreUnavailable, LeaseGone) as exc:  # the lease lapses, the seat stays: it joins again
            print(f"{self.host}: {exc}", file=sys.stderr)
        await asyncio.sleep(min(self.rng.uniform(0.5, 2 * ttl_s), max(0.0, until - time.monotonic())))
        lease = await self.seat(ttl_s)  # every client's seat fits the budget: the join cannot be refused
        self.present = True
        return lease


def row_tree(args: argparse.Namespace) -> PowerTree:
    """The ``--tree`` row: a root panel over feeds A and B, a PDU per rack on each; every
    client corded half to each of its rack's PDUs (see the module docstring)."""
    racks = -(-args.clients // args.rack_size)
    seats_w = args.clients * args.reserve_w
    nodes = {"panel": Node("panel", seats_w + args.pool_w, None, "panel")}
    hosts: dict[str, Host] = {}
    for side in ("a", "b"):
        nodes[f"feed-{side}"] = Node(f"feed-{side}", seats_w + args.pool_w / 2, "panel", "ups")
    for r in range(racks):
        members = [i for i in range(args.clients) if i // args.rack_size == r]
        rack_w = len(members) * args.reserve_w + args.pool_w * len(members) / args.clients / 2
        for side in ("a", "b"):
            nodes[f"r{r}-{side}"] = Node(f"r{r}-{side}", rack_w, f"feed-{side}", "pdu")
        for i in members:
            hosts[f"c{i:03d}"] = Host(f"c{i:03d}", {f"r{r}-a": 0.5, f"r{r}-b": 0.5}, args.reserve_w)
    return PowerTree(nodes, hosts).with_mode(args.tree, args.shed_s if args.tree == "oversubscribed" else None)


async def main_async(args: argparse.Namespace, eps: list[str], kill_leader: Callable[[], Awaitable[int | None]]) -> dict:
    name = "load"
    seats_w = args.clients * args.reserve_w
    budget_w = seats_w + args.pool_w
    admin = CircuitStore(eps, name)
    tree = row_tree(args) if args.tree else None
    assert await admin.init(budget_w, args.ttl, tree=tree)
    start_rev = (await admin.read()).revision
    stop = asyncio.Event()
    rng = random.Random(args.seed)
    clients = [Client(i, eps, name, args, random.Random(rng.random())) for i in range(args.clients)]
    leases = await asyncio.gather(*(c.seat(args.ttl) for c in clients))
    calls0 = sum(c.store.calls for c in clients)
    t0 = time.monotonic()
    until = t0 + args.duration
    lost: dict[str, float] = {}  # the feed marked lost, and when (monotonic s)

    async def feed_down() -> int | None:
        for _ in range(10):  # the admin's member may be the leader killed halfway: the next endpoint
            try:
                await admin.feed_down("feed-a", "benchmark")
                break
            except StoreUnavailable:
                await asyncio.sleep(0.1)
        lost["feed-a"] = time.monotonic()
        # A client paused (frozen) then cannot shed: only its watchdog kill and failsafe
        # (or the end of its pause) bring it down.
        return sum(c.paused for c in clients)

    draw_task = asyncio.create_task(_draw_until(clients, budget_w, until, tree, lost))
    leader_task = asyncio.create_task(_at(t0 + args.duration / 2, kill_leader))
    down_task = asyncio.create_task(_at(t0 + args.duration * args.feed_down_at, feed_down)) if tree else None
    await asyncio.gather(*(c.run(lease, args.ttl, until) for c, lease in zip(clients, leases)))
    elapsed = time.monotonic() - t0
    calls = sum(c.store.calls for c in clients) - calls0
    draw = await draw_task
    killed = await leader_task
    paused_at_loss = await down_task if down_task is not None else None
    stop.set()  # the audit replays etcd's history from the first revision, after the run
    result = await _audit_until([e for i, e in enumerate(eps) if i != killed], name, budget_w, start_rev, stop, tree)
    await admin.close()
    ttg = sorted(t for c in clients for t in c.time_to_grant)
    raises = sum(c.raises for c in clients)
    conflicts = sum(c.conflicts for c in clients)
    return {
        "clients": args.clients, "members": args.members, "duration_s": round(elapsed, 1), "budget_w": budget_w,
        "tree": None if tree is None else {"mode": args.tree, "nodes": len(tree.nodes), "feed_lost_at_s": round(
            lost["feed-a"] - t0, 1) if lost else None, "clients_paused_at_the_loss": paused_at_loss},
        "pool_w": args.pool_w, "grants_per_s": round((raises - conflicts) / elapsed, 1), "raise_txns": raises,
        "conflict_rate": round(conflicts / raises, 3) if raises else None,
        "time_to_grant_p50_s": round(statistics.median(ttg), 3) if ttg else None,
        "time_to_grant_p99_s": round(ttg[min(len(ttg) - 1, int(0.99 * len(ttg)))], 3) if ttg else None,
        "etcd_ops_per_s": round(calls / elapsed, 1),
        "pauses": sum(c.pauses for c in clients), "leaves_and_joins": sum(c.leaves for c in clients),
        "leader_killed": killed,
        "audit": result, "draw": draw,
    }


async def _at(when: float, fn: Callable[[], Awaitable[int | None]]) -> int | None:
    await asyncio.sleep(max(0.0, when - time.monotonic()))
    return await fn()


async def _draw_until(clients: list[Client], budget_w: float, until: float, tree: PowerTree | None = None,
                      lost: dict[str, float] | None = None) -> dict:
    """Every 100 ms the clients' modelled draw summed against the budget; on a tree,
    through every node where it flows (with the lost feed dead once it is), the samples
    within the stated shed time of the loss counted apart, and the shed time measured:
    from the loss to the first sample with every node within its budget."""
    samples = violations = shedding = 0
    worst = float("inf")
    shed_s: float | None = None
    while time.monotonic() < until:
        now = time.monotonic()
        draw = {c.host: c.draw_w(now) for c in clients}
        margin = budget_w - sum(draw.values())
        feed, since = next(iter((lost or {}).items()), (None, None))
        in_shed = False
        if tree is not None:
            loads = tree.loads_w(draw, feed, flow=True)
            margin = min([margin] + [tree.nodes[n].budget_w - w for n, w in loads.items()])
            if since is not None and shed_s is None:
                if margin >= -1e-6:
                    shed_s = now - since
                else:
                    in_shed = True
        samples += 1
        if in_shed:
            shedding += 1
        else:
            violations += margin < -1e-6
            worst = min(worst, margin)
        await asyncio.sleep(0.1)
    out: dict[str, float | None] = {"samples": samples, "violations": violations, "worst_margin_w": round(worst, 1)}
    if tree is not None:
        out |= {"samples_while_shedding": shedding, "shed_s": None if shed_s is None else round(shed_s, 2)}
    return out


async def _audit_until(eps: list[str], name: str, budget_w: float, start_rev: int, stop: asyncio.Event,
                       tree: PowerTree | None = None) -> dict:
    """Watch from ``start_rev``; after ``stop``, read on until the watch has caught up
    with the last revision, then report. On a tree every node at every revision (failover
    counted), and the revisions over where the seats and grants flow with a feed lost."""
    import aetcd

    store = CircuitStore(eps, name)
    seats: dict[bytes, float] = {}
    grants: dict[bytes, float] = {}
    revisions, violations, worst = 0, 0, float("inf")
    down: set[str] = set()
    over_under_loss = 0
    host, port = eps[-1].rsplit(":", 1)
    async with aetcd.Client(host, int(port)) as client:
        watch = await client.watch_prefix(store.base, start_revision=start_rev)
        events: asyncio.Queue = asyncio.Queue()

        async def pump() -> None:
            async for ev in watch:
                await events.put(ev)

        pumping = asyncio.create_task(pump())
        last_rev = start_rev
        final: int | None = None
        while True:
            if stop.is_set() and final is None:
                final = int((await client.get_prefix(store.base)).header.revision)
            if final is not None and last_rev >= final:
                break
            try:
                event = await asyncio.wait_for(events.get(), 0.5)
            except TimeoutError:
                continue
            key, rev = bytes(event.kv.key), int(event.kv.mod_revision)
            for prefix, table, field in ((store.seats, seats, "reserve_w"), (store.grants, grants, "grant_w")):
                if key.startswith(prefix):
                    if event.kind == "DELETE":
                        table.pop(key, None)
                    else:
                        table[key] = float(json.loads(event.kv.value)[field])
            if key.startswith(store.down):
                (down.discard if event.kind == "DELETE" else down.add)(key[len(store.down):].decode())
            if rev != last_rev:
                revisions += 1
            last_rev = rev
            margin = budget_w - sum(seats.values()) - sum(grants.values())
            if tree is not None:
                held: dict[str, float] = {}
                for table, prefix in ((seats, store.seats), (grants, store.grants)):
                    for k, w in table.items():
                        h = k[len(prefix):].decode()
                        held[h] = held.get(h, 0.0) + w
                loads = tree.loads_w(held)
                margin = min([margin] + [tree.nodes[n].budget_w - w for n, w in loads.items()])
                if down:
                    over_under_loss += bool(tree.over_w(held, next(iter(down))))
            worst = min(worst, margin)
            violations += margin < -1e-6
        await watch.cancel()
        pumping.cancel()
    await store.close()
    out = {"revisions_checked": revisions, "violations": violations, "worst_margin_w": round(worst, 1)}
    if tree is not None:
        out["revisions_over_with_the_feed_lost"] = over_under_loss
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--duration", type=float, default=120.0, help="wall seconds of churn")
    p.add_argument("--reserve-w", type=float, default=1000.0)
    p.add_argument("--pool-w", type=float, default=10_000.0, help="circuit budget above the seats (W)")
    p.add_argument("--max-want", type=float, default=800.0)
    p.add_argument("--churn", type=float, default=5.0, help="mean seconds between a client's want changes")
    p.add_argument("--poll-s", type=float, default=0.5)
    p.add_argument("--step-w", type=float, default=20.0)
    p.add_argument("--release-hold-s", type=float, default=2.0)
    p.add_argument("--ttl", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--members", type=int, default=3, help="etcd members (3 or more: the leader is killed halfway)")
    p.add_argument("--event-every-s", type=float, default=60.0,
                   help="mean seconds between a client's pauses or leave-and-joins (half each)")
    p.add_argument("--watchdog-s", type=float, default=1.5, help="modelled WatchdogSec (a pause longer is a kill)")
    p.add_argument("--fallback-s", type=float, default=2.0, help="modelled failsafe time after a kill")
    p.add_argument("--no-grace", action="store_true",
                   help="leases of the circuit's TTL alone: paused hosts' grants are handed on while their cards "
                   "still hold them, and the draw check must find it (the check checks itself)")
    p.add_argument("--tree", choices=("redundant", "oversubscribed"), help="the circuit is a power tree (see above)")
    p.add_argument("--rack-size", type=int, default=10, help="with --tree: clients per rack (a PDU A and B each)")
    p.add_argument("--shed-s", type=float, default=2.0, help="with --tree oversubscribed: the pair's stated shed time")
    p.add_argument("--feed-down-at", type=float, default=0.66, help="with --tree: feed A lost at this fraction of the run")
    p.add_argument("--unsafe", action="store_true",
                   help="take the whole want with plain puts, no check or compare: the audit must find violations")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        procs, eps = start_etcd(Path(tmp), args.members)

        async def kill_leader() -> int | None:
            """Halfway through, with three members or more: the leader killed (SIGKILL)."""
            i = leader_index(eps) if args.members >= 3 else None
            if i is not None:
                procs[i].kill()
                print(f"leader {eps[i]} killed", file=sys.stderr)
            return i

        try:
            out = asyncio.run(main_async(args, eps, kill_leader))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait()
    print(json.dumps(out, indent=2))

if __name__ == "__main__":
    main()
