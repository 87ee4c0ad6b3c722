"""Benchmark: what sampling every card's instant draw at the 100 ms refresh costs.

Two figures, over the simulated bank through the production NVML layer:

1. CPU per sampler pass (one field-186 read per card), for 4, 8 and 64 cards, and the
   share of one core at 10 passes a second. Over real NVML each read is a driver call
   (``GetFieldValues`` ~3 ms median, 16 ms p99 on an H200, the brief): wall time spent
   on the sampler's own thread, not CPU, and never on the event loop.
2. Whether the sampler thread slows the control loop: the controller ticking every
   100 ms on the wall clock for ``--seconds``, with and without the sampler running;
   tick duration p50 / p99 / max and the largest gap between tick starts.

    python benchmarks/peak_sampler.py [--passes 2000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

from powerbudgetd.control.controller import Controller
from powerbudgetd.core.model import Timings
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.powerlog.peaks import PeakSampler
from powerbudgetd.service.logs import configure_logging
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import CardSpec, SimBank
from powerbudgetd_sim.profiles import Phase, Profile


def specs(n: int) -> list[CardSpec]:
    return [CardSpec(uuid=f"GPU-{i:04d}", name="bench", min_w=150, max_w=300, default_w=300, idle_w=30,
                     profile=Profile((Phase(0.0, "trace", trace="h200-serving", offset_s=i * 3.7),)))
            for i in range(n)]


def pass_cost(n: int, passes: int) -> tuple[float, float]:
    bank = SimBank(specs(n), seed=1)
    nvml = Nvml(SimNvmlLibrary(bank))
    nvml.init()
    sampler = PeakSampler(nvml, keep_costs=passes)
    sampler.set_cards([c.spec.uuid for c in bank.cards])
    for k in range(passes):
        bank.advance_to(k * 0.1)
        sampler.sample_once()
    costs = sorted(sampler.stats.pass_cpu_s)
    return statistics.fmean(costs), costs[int(0.99 * (len(costs) - 1))]


def tick_times(n: int, seconds: float, with_sampler: bool) -> dict[str, float]:
    bank = SimBank(specs(n), seed=1, clock=time.monotonic)
    nvml = Nvml(SimNvmlLibrary(bank))
    nvml.init()
    ctl = Controller(nvml, 250.0 * n, Timings(tick_s=0.1))
    ctl.start()
    sampler = PeakSampler(nvml)
    sampler.set_cards([c.uuid for c in ctl.cards])
    if with_sampler:
        sampler.start()
    durations, starts = [], []
    t0 = time.monotonic()
    due = t0
    while (now := time.monotonic()) - t0 < seconds:
        starts.append(now)
        ctl.tick(now - t0)
        durations.append(time.monotonic() - now)
        due += 0.1
        time.sleep(max(0.0, due - time.monotonic()))
    sampler.stop()
    durations.sort()
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    return {
        "p50_ms": 1000 * durations[len(durations) // 2],
        "p99_ms": 1000 * durations[int(0.99 * (len(durations) - 1))],
        "max_ms": 1000 * durations[-1],
        "max_gap_ms": 1000 * max(gaps),
        "sampler_passes": sampler.stats.passes,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    configure_logging(level="error")
    print("sampler pass (CPU, the simulated NVML library included)")
    for n in (4, 8, 64):
        mean_s, p99_s = pass_cost(n, args.passes)
        print(f"  {n:>3} cards: {mean_s * 1e3:.3f} ms mean, {p99_s * 1e3:.3f} ms p99 per pass; "
              f"{mean_s * 10 * 100:.2f} % of one core at 10 passes/s")
    print(f"controller tick on the wall clock, 4 cards, {args.seconds:g} s each")
    for on in (False, True):
        r = tick_times(4, args.seconds, on)
        print(f"  sampler {'on ' if on else 'off'}: tick p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
              f"max {r['max_ms']:.2f} ms; largest gap between ticks {r['max_gap_ms']:.1f} ms; "
              f"{r['sampler_passes']} sampler passes")


if __name__ == "__main__":
    main()
