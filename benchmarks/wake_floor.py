"""Benchmark: what the daemon's wake-ups cost with no work in them, on this machine.

The daemon wakes every tick on three threads: the event loop (its timer), the tick's
thread (``service.tickthread.TickThread``) and an NVML worker (``hw.calls.DeadlineCalls``),
each handing over to the next and back. This runs that pattern with nothing to do, in
three steps, each for ``--duration`` s at ``--tick`` s, and prints the process's CPU
(``time.process_time``) as a share of one core:

- **timer**: the event loop sleeping to a fixed cadence (one timer and one future a tick);
- **tick**: and each tick handed to the tick's thread, a call that returns at once;
- **nvml**: and in it one batch of ``--cards`` calls that return at once, through the
  deadline workers.

What ``daemon_cost.py --driver null`` prints above the last figure is the daemon's work;
the last figure itself is the floor no trimming of a tick can go below, set by the
machine's cost of waking a thread whose caches have gone cold (far above what the same
calls cost back to back).

    python benchmarks/wake_floor.py [--duration 30] [--tick 0.1] [--cards 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time

from powerbudgetd.errors import NvmlTimeout
from powerbudgetd.hw.calls import DeadlineCalls
from powerbudgetd.service.tickthread import TickThread

STEPS = ("timer", "tick", "nvml")


def _answer() -> int:
    return 0


async def _share(step: str, duration_s: float, tick_s: float, cards: int) -> tuple[float, int]:
    """The process's CPU (% of one core) over ``duration_s`` of ``step``'s wake pattern,
    and the calls that missed their deadline (a tick with one did less than the others)."""
    loop = asyncio.get_running_loop()
    ticks = TickThread(name="bench-tick")
    calls = DeadlineCalls(0.05) if step == "nvml" else None
    batch = {f"card-{i}": (_answer, ()) for i in range(cards)}
    missed = 0

    def tick() -> None:
        nonlocal missed
        if calls is not None:
            missed += sum(isinstance(v, NvmlTimeout) for v in calls.many(batch).values())

    try:
        if step != "timer":
            await ticks.run(tick)  # the threads started outside the measured span
            missed = 0
        cpu0, t0 = time.process_time(), loop.time()
        due = t0
        while loop.time() - t0 < duration_s:
            if step != "timer":
                await ticks.run(tick)
            due += tick_s
            waiter = loop.create_future()
            timer = loop.call_later(max(0.0, due - loop.time()), waiter.set_result, None)
            try:
                await waiter
            finally:
                timer.cancel()
        return 100 * (time.process_time() - cpu0) / (loop.time() - t0), missed
    finally:
        ticks.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per step (default 30)")
    ap.add_argument("--tick", type=float, default=0.1, help="tick, s (default 0.1)")
    ap.add_argument("--cards", type=int, default=8, help="calls in the nvml step's batch (default 8)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not (0 < args.tick <= args.duration < math.inf) or args.cards < 1:
        ap.error("--tick must be positive, --duration at least one tick and finite, --cards at least 1")
    out: dict[str, float] = {}
    for step in STEPS:
        share, missed = asyncio.run(_share(step, args.duration, args.tick, args.cards))
        out[step] = round(share, 3)
        if step == "nvml":
            out["nvml_deadline_misses"] = missed
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"the daemon's wake-ups with no work, {args.duration:g} s each at {args.tick:g} s ticks, % of one core:")
    print(f"  event loop timer only {out['timer']:.3f}; + the tick's thread {out['tick']:.3f}; "
          f"+ a batch of {args.cards} instant calls on the NVML workers {out['nvml']:.3f} "
          f"({out['nvml_deadline_misses']:g} calls past their deadline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
