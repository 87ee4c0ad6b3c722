"""Soak: hours of simulated bank time with NVML faults injected at random.

Prints, per simulated hour, the violation ticks (after boot, the simulator's own sum of
limits that may be in force above the budget, not counting the 0.3 s after a limit was
changed behind the daemon's back: one tick plus the lag, and a tick of margin) and the
process's resident memory; at the end, the seconds over budget per outside event.
Injected: read errors, lost cards, refused and failing writes, missing instant power,
resets, limits set by another tool, outside floors, cards falling off the bus and coming
back at their default, limit calls NOT_SUPPORTED, hung writes (bank time) and impossible
power readings. Usage:

    python benchmarks/soak.py [--hours 24] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time

from powerbudgetd.control.controller import Controller
from powerbudgetd.service.logs import configure_logging
from powerbudgetd.core.model import Timings
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim.libnvml import Fault, SimNvmlLibrary
from powerbudgetd_sim.physics import BankEvent, SimBank
from powerbudgetd_sim.scenario import load_scenario

LIMIT_READS = ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit")
READ_CALLS = ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit")


def random_faults(rng: random.Random, hours: float, cards: int) -> tuple[list[Fault], list[BankEvent]]:
    """About one fault of each kind every few simulated minutes."""
    faults: list[Fault] = []
    events: list[BankEvent] = []
    t, end = 60.0, hours * 3600
    while t < end:
        card = rng.randrange(cards)
        kind = rng.choice(["read_error", "lost", "write_refused", "write_invalid", "no_instant", "reset", "outside",
                           "floor", "replug", "not_supported", "hang", "bad_reading"])
        span = rng.uniform(0.2, 20.0)
        if kind == "read_error":
            faults.append(Fault(rng.choice(READ_CALLS), "UNKNOWN", card=card, from_s=t, until_s=t + span))
        elif kind == "lost":
            faults.append(Fault("*", "GPU_IS_LOST", card=card, from_s=t, until_s=t + span))
            events.append(BankEvent(t + span, card, "reset"))
        elif kind == "write_refused":
            faults.append(Fault("nvmlDeviceSetPowerManagementLimit", "UNKNOWN", card=card, from_s=t, until_s=t + span))
        elif kind == "write_invalid":
            faults.append(Fault("nvmlDeviceSetPowerManagementLimit", "INVALID_ARGUMENT", card=card, from_s=t, count=1))
        elif kind == "no_instant":
            faults.append(Fault("nvmlDeviceGetFieldValues", "NOT_SUPPORTED", card=card, from_s=t, until_s=t + span))
        elif kind == "reset":
            events.append(BankEvent(t, card, "reset"))
        elif kind == "floor":  # an outside limiter holds enforced at the card's max for a while
            events += [BankEvent(t, card, "floor", limit_w=300.0), BankEvent(t + span, card, "floor")]
        elif kind == "replug":  # off the bus, back at its default
            events += [BankEvent(t, card, "disappear"), BankEvent(t + span, card, "appear")]
        elif kind == "not_supported":
            faults.append(Fault(rng.choice(LIMIT_READS), "NOT_SUPPORTED", card=card, from_s=t, until_s=t + span))
        elif kind == "hang":  # the next write hangs; it lands when the call returns
            faults.append(Fault("nvmlDeviceSetPowerManagementLimit", "HANG", card=card, from_s=t, count=1,
                                delay_s=span))
        elif kind == "bad_reading":
            events += [BankEvent(t, card, "bad_reading", limit_w=rng.choice([-5.0, 4e6])),
                       BankEvent(t + span, card, "bad_reading")]
        else:
            events.append(BankEvent(t, card, "set_limit", limit_w=300.0))
        t += rng.uniform(30.0, 300.0)
    return faults, events


def soak(hours: float, seed: int, report=print) -> int:
    """Run; return the number of violation ticks."""
    sc = load_scenario("workstation-4")
    rng = random.Random(seed)
    faults, events = random_faults(rng, hours, len(sc.cards))
    bank = SimBank(list(sc.cards), lag_s=sc.lag_s, seed=seed, events=events)
    nvml = Nvml(SimNvmlLibrary(bank, faults))
    nvml.init()
    ctl = Controller(nvml, sc.budget_w, Timings())
    ctl.start()
    # Outside events that can put the bank over budget behind our back.
    outside = sorted(e.at_s for e in events if e.action in ("reset", "set_limit", "floor", "appear"))
    violations = writes = 0
    over_s = 0.0
    k, j = 0, 0
    started = time.perf_counter()
    next_hour = 3600.0
    while (t := round(k * 0.1, 9)) <= hours * 3600:
        bank.advance_to(t)
        rep = ctl.tick(t)
        writes += len(rep.writes)
        while j < len(outside) and outside[j] < t - 0.3:
            j += 1
        recent = j < len(outside) and outside[j] <= t
        over = bank.sum_limit_bound_mw() > ctl.budget_mw
        if ctl.ready and not recent and over:
            violations += 1
        if ctl.ready and over:
            over_s += 0.1
        if t >= next_hour:
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            report(f"hour {t / 3600:5.1f}: violation ticks {violations}, writes {writes}, "
                   f"peak RSS {rss_mb:.1f} MB, {time.perf_counter() - started:.0f} s elapsed")
            next_hour += 3600.0
        k += 1
    report(f"{hours:g} h simulated, {k} ticks, {len(faults)} faults and {len(events)} outside changes injected: "
           f"{over_s:.1f} s over budget after boot, {over_s / max(len(outside), 1):.3f} s per outside event "
           f"({len(outside)}); {violations} violation ticks, {writes} writes, {time.perf_counter() - started:.0f} s")
    return violations


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    configure_logging(level="critical", stream=sys.stderr)
    return 1 if soak(args.hours, args.seed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
