"""Benchmark: the controller's time per tick for 4, 8 and 64 simulated cards.

Each bank has a mix that keeps the policy busy: a quarter of the cards flat out, a
quarter bursty (2 s on / 3 s off), a quarter waking and sleeping every 20 s, the rest
idle; the budget is 250 W a card (300 W cards, 150 W floors). The controller runs on
virtual time through the production NVML layer over the real bindings on the simulated NVML library; the time spent
inside the NVML layer (reads and writes, which on real hardware are driver calls) is
measured per tick and subtracted, leaving the controller's own work: bounds, decisions,
plan and bookkeeping. Times are CPU time of this process (``time.process_time``), so a
busy machine's preemptions do not count as the controller's.

    python benchmarks/tick_time.py [--ticks 3000] [--cards 4 8 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from powerbudgetd.control.controller import Controller
from powerbudgetd.service.logs import configure_logging
from powerbudgetd.core.model import Timings
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import CardSpec, SimBank
from powerbudgetd_sim.profiles import Phase, Profile


class TimedNvml(Nvml):
    """The NVML layer, with the CPU time spent in it accumulated in :attr:`spent_s`."""

    spent_s = 0.0

    def read(self, uuid):  # type: ignore[no-untyped-def]
        t0 = time.process_time()
        try:
            return super().read(uuid)
        finally:
            self.spent_s += time.process_time() - t0

    def set_power_limit(self, uuid, limit_w):  # type: ignore[no-untyped-def]
        t0 = time.process_time()
        try:
            return super().set_power_limit(uuid, limit_w)
        finally:
            self.spent_s += time.process_time() - t0


def bank_specs(n: int) -> list[CardSpec]:
    profiles = [
        Profile((Phase(0.0, "constant", power_w=300.0),)),
        Profile((Phase(0.0, "square", high_w=300.0, on_s=2.0, off_s=3.0),)),
        Profile(tuple(Phase(float(t), "constant" if t % 40 else "idle", power_w=280.0) for t in range(0, 3600, 20))),
        Profile(),
    ]
    return [
        CardSpec(f"GPU-bench-{i:04d}", "bench card", 150.0, 300.0, 300.0, 30.0, profile=profiles[i % 4])
        for i in range(n)
    ]


def measure(n: int, ticks: int) -> dict[str, float]:
    bank = SimBank(bank_specs(n), lag_s=0.1, seed=1)
    nvml = TimedNvml(SimNvmlLibrary(bank))
    nvml.init()
    timings = Timings()
    ctl = Controller(nvml, 250.0 * n, timings)
    ctl.start()
    own, total = [], []
    writes = 0
    for k in range(ticks):
        t = round(k * timings.tick_s, 9)
        bank.advance_to(t)
        nvml.spent_s = 0.0
        t0 = time.process_time()
        rep = ctl.tick(t)
        elapsed = time.process_time() - t0
        writes += len(rep.writes)
        total.append(elapsed)
        own.append(elapsed - nvml.spent_s)
    own.sort()
    return {
        "cards": n,
        "ticks": ticks,
        "limit_writes": writes,
        "tick_ms_mean": round(1000 * statistics.fmean(total), 4),
        "controller_ms_mean": round(1000 * statistics.fmean(own), 4),
        "controller_ms_p50": round(1000 * own[len(own) // 2], 4),
        "controller_ms_p99": round(1000 * own[int(len(own) * 0.99)], 4),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=3000, help="ticks per bank (default 3000 = 5 min at 100 ms)")
    ap.add_argument("--cards", type=int, nargs="+", default=[4, 8, 64])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    configure_logging(level="warning", stream=sys.stderr)
    rows = [measure(n, args.ticks) for n in args.cards]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"controller time per tick, NVML layer excluded ({args.ticks} ticks each):")
    print(f"  {'cards':>5} {'mean ms':>9} {'p50 ms':>8} {'p99 ms':>8} {'with NVML layer, mean ms':>26} {'writes':>7}")
    for r in rows:
        print(
            f"  {r['cards']:>5} {r['controller_ms_mean']:>9.3f} {r['controller_ms_p50']:>8.3f} "
            f"{r['controller_ms_p99']:>8.3f} {r['tick_ms_mean']:>26.3f} {r['limit_writes']:>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
