"""Benchmark: how long a host's circuit round holds the event loop on a hall.

A hall's circuit as a host's watch holds it (the tests' ``support/hall.py``: ``--hosts``
hosts in racks of ten on delegated PDUs, two feeds of two panels, every host seated with
a want; ``--leases``: every PDU leased at its figure in the tree's division), read by a
``CircuitStore`` that is never connected (its mirror loaded as a live, confirmed watch's).
Each of ``--rounds`` rounds moves another host's want (a watch event, a new revision),
then computes what a round computes before it decides, whatever the host
(``CircuitChannel._read``): the read, the tree's division and, under leases, the leases'
figures and who waits and gives back. Done on the circuit's worker thread, as the daemon
does; ``--on-loop``: on the event loop, as before it did, for the comparison.

Beside the rounds a task sleeping 5 ms times the loop's lateness (each wake's delay past
its 5 ms), the control tick's view of it. Printed per hall: the lateness while rounds
run, max and p99 (ms), the median round (ms) and the full collections meanwhile
(``--no-gc`` holds the collector off: what is left is the round's own hold).

    python benchmarks/round_lag.py [--hosts 1000 3000] [--leases] [--rounds 15] [--on-loop]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' hall (support.hall)

PULSE_S = 0.005  # the lateness probe's sleep (s)


async def _inline(fn: Callable[..., Any], *args: Any) -> Any:
    """``store.off_loop`` as it was: the work on the event loop."""
    return fn(*args)


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def hall(hosts_n: int, leased: bool, rounds: int, on_loop: bool) -> dict[str, float]:
    from powerbudgetd.channels.circuit import channel, leases, records
    from powerbudgetd.channels.circuit import store as store_mod
    from powerbudgetd.channels.circuit.store import CircuitStore
    from support.hall import hall_kvs, mirrored

    store = CircuitStore(["127.0.0.1:1"], "hall")  # never connected: every read from the mirror
    kvs, rev = hall_kvs(store, hosts_n)
    mirrored(store, kvs, rev)
    if leased:
        first = await store.read()
        kvs, rev = hall_kvs(store, hosts_n, leases.fair_w(first, first.view.wants, None), seed=2)
        mirrored(store, kvs, rev)
    step_w = 20.0
    work: Callable[..., Awaitable[Any]] = _inline if on_loop else store_mod.off_loop
    if on_loop:
        store_mod.off_loop = _inline  # type: ignore[assignment]  # the read's own build too

    late: list[tuple[float, float]] = []
    windows: list[tuple[float, float]] = []
    done = asyncio.Event()

    async def pulse() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(PULSE_S)
            t1 = time.perf_counter()
            late.append((t1, t1 - t0 - PULSE_S))

    collections = gc.get_stats()[2]["collections"]
    probe = asyncio.create_task(pulse())
    await asyncio.sleep(0.05)
    names = sorted({k.rsplit(b"/", 1)[1].decode() for k in kvs if k.startswith(store.wants)})
    took: list[float] = []
    for r in range(rounds):
        host = names[(r * 97) % len(names)]
        rev += 1
        store.mirror.put(store.key(store.wants, host), records.dumps(want_w=float(50 + 10 * r)), rev, rev, 7)
        t0 = time.perf_counter()
        read = await store.read()
        await work(channel._prepare, read, "vm", step_w)
        t1 = time.perf_counter()
        took.append(t1 - t0)
        windows.append((t0, t1 + PULSE_S))
        await asyncio.sleep(0.02)
    done.set()
    await probe
    if on_loop:
        store_mod.off_loop = work  # type: ignore[assignment]
    during = [x for t, x in late if any(a <= t <= b for a, b in windows)] or [0.0]
    return {"late_max_ms": 1000 * max(during), "late_p99_ms": 1000 * _percentile(during, 0.99),
            "round_ms": 1000 * statistics.median(took),
            "full_gcs": gc.get_stats()[2]["collections"] - collections}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[1000, 3000])
    ap.add_argument("--leases", action="store_true", help="every PDU leased at its figure")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--on-loop", action="store_true", help="the work on the event loop, as before")
    ap.add_argument("--no-gc", action="store_true", help="hold the collector off while measuring")
    args = ap.parse_args(argv)
    if any(n < 2 for n in args.hosts) or args.rounds < 1:
        ap.error("--hosts needs at least 2 hosts, --rounds at least 1")
    where = "on the event loop" if args.on_loop else "on the circuit's worker thread"
    print(f"rounds {where}; {'PDUs leased' if args.leases else 'no lease'}; collector {'off' if args.no_gc else 'on'}")
    for n in args.hosts:
        if args.no_gc:
            gc.disable()
        try:
            res = asyncio.run(hall(n, args.leases, args.rounds, args.on_loop))
        finally:
            gc.enable()
        print(f"{n:>5} hosts   loop late max {res['late_max_ms']:7.1f} ms   p99 {res['late_p99_ms']:7.1f} ms"
              f"   round {res['round_ms']:7.1f} ms (median)   full collections {res['full_gcs']}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
