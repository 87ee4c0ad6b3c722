"""Load test: N grant clients (the circuit protocol alone, no NVML) against one real etcd.

Starts a one-member etcd (Debian's ``etcd``) in a temporary directory, creates a circuit
(budget = seats + a pool), and runs ``--clients`` clients in one event loop, each with
its own connection, lease, seat, want and grant, the same store and policy the daemon
uses (``channels.circuit.store``, ``core.circuit.GrantPolicy``). Every ``--churn`` s on
average a client draws a new want (0 .. ``--max-want``). A client without cards lowers at
once (it has nothing to confirm).

Measured over ``--duration`` s of wall time:

- grants/s: successful raise transactions; conflict rate: raise transactions that
  failed their compare / all raise transactions;
- time to grant: from a want that rose above the grant to the first raise after it
  (p50/p99);
- etcd operations/s: requests the clients sent (reads, puts, transactions, keepalives);
- audit: a watch on the circuit's prefix from the first revision replays every change
  and checks ``sum(seats) + sum(grants) <= budget`` at every revision. ``--unsafe``
  makes each client take its whole want with a plain put (no fit check, no compare):
  the audit must then find violations (the check checks itself).

    python benchmarks/circuit_load.py --clients 50 --duration 60
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

from powerbudgetd.channels.circuit.store import CircuitStore, LeaseGone, StoreUnavailable
from powerbudgetd.core.circuit import GrantPolicy, raise_allowed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_etcd(tmp: Path) -> tuple[subprocess.Popen, str]:
    cport, pport = free_port(), free_port()
    ep = f"127.0.0.1:{cport}"
    proc = subprocess.Popen([
        shutil.which("etcd") or "/usr/bin/etcd", "--name", "bench", "--data-dir", str(tmp / "etcd"),
        "--listen-client-urls", f"http://{ep}", "--advertise-client-urls", f"http://{ep}",
        "--listen-peer-urls", f"http://127.0.0.1:{pport}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
        "--initial-cluster", f"bench=http://127.0.0.1:{pport}", "--log-outputs", "stderr", "--logger", "zap",
    ], stdout=subprocess.DEVNULL, stderr=open(tmp / "etcd.log", "wb"))  # noqa: SIM115
    for _ in range(200):
        try:
            with urllib.request.urlopen(f"http://{ep}/health", timeout=1) as r:
                if json.loads(r.read()).get("health") == "true":
                    return proc, ep
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("etcd did not start")


class Client:
    def __init__(self, i: int, ep: str, name: str, args: argparse.Namespace, rng: random.Random) -> None:
        self.host = f"c{i:03d}"
        self.store = CircuitStore([ep], name, timeout_s=2.0)
        self.args = args
        self.rng = rng
        self.policy = GrantPolicy(step_w=args.step_w, release_hold_s=args.release_hold_s)
        self.grant_w = 0.0
        self.want_w = 0.0
        self.want_rose_at: float | None = None
        self.raises = self.conflicts = 0
        self.time_to_grant: list[float] = []

    async def seat(self, ttl_s: int) -> int:
        """Lease and seat (every client is seated before any raises: seats fit the budget)."""
        lease, _ = await self.store.grant_lease(ttl_s)
        read = await self.store.read()
        while not await self.store.register_seat(read, self.host, self.args.reserve_w):
            await asyncio.sleep(self.rng.uniform(0, 0.05))
            read = await self.store.read()
        return lease

    async def run(self, lease: int, ttl_s: int, until: float) -> None:
        last_ka = time.monotonic()
        next_churn = time.monotonic()
        while time.monotonic() < until:
            now = time.monotonic()
            try:
                if now - last_ka >= ttl_s / 6:
                    await self.store.keepalive(lease)
                    last_ka = now
                if now >= next_churn:
                    self.want_w = round(self.rng.uniform(0, self.args.max_want), 0)
                    await self.store.put_want(self.host, self.want_w, lease)
                    if self.want_w > self.grant_w and self.want_rose_at is None:
                        self.want_rose_at = now
                    next_churn = now + self.rng.expovariate(1 / self.args.churn)
                read = await self.store.read()
                target = self.policy.target_w(read.view, self.host, self.grant_w, now)
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
                        if self.want_rose_at is not None:
                            self.time_to_grant.append(time.monotonic() - self.want_rose_at)
                            self.want_rose_at = None
                    else:
                        self.conflicts += 1
                elif target < self.grant_w:
                    await self.store.lower_grant(self.host, target, lease)
                    self.grant_w = target
                if self.want_w <= self.grant_w:
                    self.want_rose_at = None
            except (StoreUnavailable, LeaseGone) as exc:
                print(f"{self.host}: {exc}", file=sys.stderr)
            await asyncio.sleep(self.args.poll_s * self.rng.uniform(0.8, 1.2))
        await self.store.revoke(lease)
        await self.store.close()


async def main_async(args: argparse.Namespace, ep: str) -> dict:
    name = "load"
    seats_w = args.clients * args.reserve_w
    budget_w = seats_w + args.pool_w
    admin = CircuitStore([ep], name)
    assert await admin.init(budget_w, args.ttl)
    start_rev = (await admin.read()).revision
    stop = asyncio.Event()
    audit_task = asyncio.create_task(_audit_until(ep, name, budget_w, start_rev, stop))
    rng = random.Random(args.seed)
    clients = [Client(i, ep, name, args, random.Random(rng.random())) for i in range(args.clients)]
    leases = await asyncio.gather(*(c.seat(args.ttl) for c in clients))
    calls0 = sum(c.store.calls for c in clients)
    t0 = time.monotonic()
    until = t0 + args.duration
    await asyncio.gather(*(c.run(lease, args.ttl, until) for c, lease in zip(clients, leases)))
    elapsed = time.monotonic() - t0
    calls = sum(c.store.calls for c in clients) - calls0
    stop.set()
    result = await audit_task
    await admin.close()
    ttg = sorted(t for c in clients for t in c.time_to_grant)
    raises = sum(c.raises for c in clients)
    conflicts = sum(c.conflicts for c in clients)
    return {
        "clients": args.clients, "duration_s": round(elapsed, 1), "budget_w": budget_w, "pool_w": args.pool_w,
        "grants_per_s": round((raises - conflicts) / elapsed, 1), "raise_txns": raises,
        "conflict_rate": round(conflicts / raises, 3) if raises else None,
        "time_to_grant_p50_s": round(statistics.median(ttg), 3) if ttg else None,
        "time_to_grant_p99_s": round(ttg[min(len(ttg) - 1, int(0.99 * len(ttg)))], 3) if ttg else None,
        "etcd_ops_per_s": round(calls / elapsed, 1),
        "audit": result,
    }


async def _audit_until(ep: str, name: str, budget_w: float, start_rev: int, stop: asyncio.Event) -> dict:
    """Watch from ``start_rev``; after ``stop``, read on until the watch has caught up
    with the last revision, then report."""
    import aetcd

    store = CircuitStore([ep], name)
    seats: dict[bytes, float] = {}
    grants: dict[bytes, float] = {}
    revisions, violations, worst = 0, 0, float("inf")
    host, port = ep.rsplit(":", 1)
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
            if rev != last_rev:
                revisions += 1
            last_rev = rev
            margin = budget_w - sum(seats.values()) - sum(grants.values())
            worst = min(worst, margin)
            violations += margin < -1e-6
        await watch.cancel()
        pumping.cancel()
    await store.close()
    return {"revisions_checked": revisions, "violations": violations, "worst_margin_w": round(worst, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--duration", type=float, default=60.0, help="wall seconds of churn")
    p.add_argument("--reserve-w", type=float, default=1000.0)
    p.add_argument("--pool-w", type=float, default=10_000.0, help="circuit budget above the seats (W)")
    p.add_argument("--max-want", type=float, default=800.0)
    p.add_argument("--churn", type=float, default=5.0, help="mean seconds between a client's want changes")
    p.add_argument("--poll-s", type=float, default=0.5)
    p.add_argument("--step-w", type=float, default=20.0)
    p.add_argument("--release-hold-s", type=float, default=2.0)
    p.add_argument("--ttl", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--unsafe", action="store_true",
                   help="take the whole want with plain puts, no check or compare: the audit must find violations")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, ep = start_etcd(Path(tmp))
        try:
            out = asyncio.run(main_async(args, ep))
        finally:
            proc.terminate()
            proc.wait()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
