"""Benchmark: how long the bank stays over budget after another tool raises a limit.

Two busy 150-300 W cards share a 500 W budget (both at their 250 W share). At t = 10 s
another tool writes 300 W on card 0 (a ``set_limit`` event); the card applies every
limit after ``lag_s``. The controller ticks every 100 ms on virtual time; between ticks
the bank's own sum of the highest limit that may be in force (requested, enforced or in
flight) is sampled every 10 ms. Reported per lag:

- ``over_budget_s``: time that sum spent above the budget after the raise;
- ``claim_s``: the stated window, one tick plus the lag;
- ``undercount_w``: the largest amount by which the controller's own sum of bounds read
  below that truth after the raise (0: every write that may still land was counted).

Default timings (``confirm_timeout_s`` 3 s, below the longest lag: the controller learns
the card's lag from the bites it sees).

    python benchmarks/outside_raise.py [--lags 0.1 0.5 1 2 4] [--json]
"""

from __future__ import annotations

import argparse
import json

from powerbudgetd.control.controller import Controller
from powerbudgetd.core.model import Timings
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.service.logs import configure_logging
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import BankEvent, CardSpec, SimBank
from powerbudgetd_sim.profiles import Phase, Profile

RAISE_AT_S = 10.0
SAMPLE_S = 0.01


def measure(lag_s: float, run_s: float = 10.0) -> dict:
    """One run at ``lag_s`` (s): the over-budget time (s) and undercount (W) after the raise."""
    busy = Profile((Phase(0.0, "constant", power_w=300.0),))
    specs = [CardSpec(f"GPU-bench-{i}", "bench card", 150.0, 300.0, 300.0, 30.0, profile=busy) for i in range(2)]
    bank = SimBank(specs, lag_s=lag_s, seed=1, events=[BankEvent(RAISE_AT_S, 0, "set_limit", limit_w=300.0)])
    nvml = Nvml(SimNvmlLibrary(bank))
    nvml.init()
    timings = Timings()
    ctl = Controller(nvml, 500.0, timings)
    ctl.start()
    budget_mw = ctl.budget_mw
    over_s = undercount_mw = 0.0
    t = 0.0
    while t < RAISE_AT_S + run_s:
        bank.advance_to(t)
        ctl.tick(t)
        if t >= RAISE_AT_S - 1e-9:
            undercount_mw = max(undercount_mw, bank.sum_limit_bound_mw() - ctl.sum_bound_mw)
        steps = round(timings.tick_s / SAMPLE_S)
        for k in range(steps):  # the truth between this tick and the next
            ts = round(t + k * SAMPLE_S, 9)
            bank.advance_to(ts)
            if ts >= RAISE_AT_S - 1e-9 and bank.sum_limit_bound_mw() > budget_mw:
                over_s += SAMPLE_S
        t = round(t + timings.tick_s, 9)
    return {"lag_s": lag_s, "over_budget_s": round(over_s, 3), "claim_s": round(timings.tick_s + lag_s, 3),
            "undercount_w": undercount_mw / 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lags", type=float, nargs="+", default=[0.1, 0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    configure_logging("critical")
    rows = [measure(lag) for lag in args.lags]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'lag s':>6} {'over budget s':>14} {'tick + lag s':>13} {'undercount W':>13}")
    for r in rows:
        print(f"{r['lag_s']:>6g} {r['over_budget_s']:>14.2f} {r['claim_s']:>13.2f} {r['undercount_w']:>13g}")


if __name__ == "__main__":
    main()
