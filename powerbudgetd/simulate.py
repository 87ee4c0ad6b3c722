"""Run the real controller against a simulated bank on virtual time, and report.

The controller talks to the simulator through the production NVML layer
(:class:`powerbudgetd.nvml.Nvml` over the fake ``pynvml``). Every tick the simulator's
own truth is checked: the sum over cards of the highest limit that may be in force
(requested, enforced or in flight) against the budget, from the moment the controller
declared itself ready (before that, boot is bringing the bank down from its defaults).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from powerbudgetd.controller import Controller
from powerbudgetd.model import Timings
from powerbudgetd.nvml import Nvml
from powerbudgetd_sim.fake_pynvml import FakePynvml
from powerbudgetd_sim.physics import SimBank
from powerbudgetd_sim.scenario import Scenario


@dataclass
class Series:
    """Per-tick samples for plots: time (s), and per card power and enforced limit (W)."""

    t: list[float] = field(default_factory=list)
    avg_w: list[list[float]] = field(default_factory=list)
    instant_w: list[list[float]] = field(default_factory=list)
    limit_w: list[list[float]] = field(default_factory=list)


@dataclass
class SimResult:
    report: dict[str, Any]
    series: Series


def run_scenario(
    sc: Scenario,
    *,
    duration_s: float | None = None,
    seed: int | None = None,
    timings: Timings | None = None,
    keep_series: bool = False,
) -> SimResult:
    """Simulate ``sc`` under the controller and return the report (W, s)."""
    duration = sc.duration_s if duration_s is None else duration_s
    seed = sc.seed if seed is None else seed
    timings = timings or Timings(tick_s=sc.tick_s)
    bank = SimBank(list(sc.cards), lag_s=sc.lag_s, seed=seed, events=list(sc.events))
    nvml = Nvml(FakePynvml(bank, list(sc.faults)))
    nvml.init()
    ctl = Controller(nvml, sc.budget_w, timings)
    ctl.start()
    budget_mw = ctl.budget_mw

    series = Series()
    violation_ticks = ticks = 0
    boot_s: float | None = None
    max_sum_enforced = max_sum_bound = max_sum_avg = max_sum_instant = 0.0
    energy_start = [c.energy_mj for c in bank.cards]
    cap_changes = 0
    k = 0
    while (t := round(k * timings.tick_s, 9)) <= duration:
        bank.advance_to(t)
        rep = ctl.tick(t)
        cap_changes += sum(1 for w in rep.writes if w.error is None and not w.dry_run)
        ticks += 1
        bound = bank.sum_limit_bound_mw()
        if ctl.ready:
            if boot_s is None:
                boot_s = t
            violation_ticks += bound > budget_mw
            max_sum_bound = max(max_sum_bound, bound / 1000)
            max_sum_enforced = max(max_sum_enforced, sum(c.enforced_mw(t) for c in bank.cards) / 1000)
        max_sum_avg = max(max_sum_avg, sum(c.avg_w for c in bank.cards))
        max_sum_instant = max(max_sum_instant, sum(c.instant_w for c in bank.cards))
        if keep_series:
            series.t.append(t)
            series.avg_w.append([c.avg_w for c in bank.cards])
            series.instant_w.append([c.instant_w for c in bank.cards])
            series.limit_w.append([c.enforced_mw(t) / 1000 for c in bank.cards])
        k += 1

    span = max(bank.now, 1e-9)
    cards = []
    for c, st in zip(bank.cards, ctl.cards):
        cards.append(
            {
                "index": c.index,
                "uuid": c.spec.uuid,
                "name": c.spec.name,
                "min_w": c.min_mw / 1000,
                "max_w": c.max_mw / 1000,
                "mean_power_w": round((c.energy_mj - energy_start[c.index]) / 1000 / span, 1),
                "final_limit_w": c.enforced_mw(bank.now) / 1000,
                "final_role": str(st.role),
                "limit_writes": c.writes,
            }
        )
    report = {
        "scenario": sc.name,
        "seed": seed,
        "budget_w": sc.budget_w,
        "cards": cards,
        "duration_s": duration,
        "ticks": ticks,
        "boot_s": boot_s,
        "max_sum_enforced_limit_w": round(max_sum_enforced, 3),
        "max_sum_limit_bound_w": round(max_sum_bound, 3),
        "violation_ticks": violation_ticks,
        "max_sum_power_avg_w": round(max_sum_avg, 1),
        "max_sum_power_instant_w": round(max_sum_instant, 1),
        "cap_changes": cap_changes,
    }
    return SimResult(report, series)


def format_report(r: dict[str, Any]) -> str:
    """A readable multi-line summary of one report."""
    lines = [
        f"scenario {r['scenario']} (seed {r['seed']}): {len(r['cards'])} cards, budget {r['budget_w']:g} W, "
        f"{r['duration_s']:g} s simulated",
        f"  ready after          {r['boot_s']} s" if r["boot_s"] is not None else "  NEVER READY",
        f"  violation ticks      {r['violation_ticks']} of {r['ticks']}",
        f"  max sum of limits    {r['max_sum_limit_bound_w']:g} W (enforced {r['max_sum_enforced_limit_w']:g} W)",
        f"  max sum of draw      {r['max_sum_power_avg_w']:g} W (1 s average), "
        f"{r['max_sum_power_instant_w']:g} W (instant)",
        f"  cap changes          {r['cap_changes']}",
        "  card  limits      mean draw  final limit  role",
    ]
    for c in r["cards"]:
        lines.append(
            f"  {c['index']:>4}  {c['min_w']:g}-{c['max_w']:g} W  {c['mean_power_w']:>7.1f} W  "
            f"{c['final_limit_w']:>9.1f} W  {c['final_role']}"
        )
    return "\n".join(lines)


def plot(result: SimResult, budget_w: float, path: str, title: str) -> None:
    """Each card's draw and cap over time, and the sums against the budget (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SystemExit("--plot needs matplotlib: pip install 'powerbudgetd[plot]'") from exc
    s = result.series
    n = len(s.avg_w[0]) if s.avg_w else 0
    fig, axes = plt.subplots(n + 1, 1, figsize=(12, 2.2 * (n + 1)), sharex=True)
    for i in range(n):
        ax = axes[i]
        ax.plot(s.t, [row[i] for row in s.instant_w], lw=0.4, color="tab:orange", alpha=0.6, label="instant draw")
        ax.plot(s.t, [row[i] for row in s.avg_w], lw=0.9, color="tab:blue", label="1 s average draw")
        ax.plot(s.t, [row[i] for row in s.limit_w], lw=1.4, color="black", drawstyle="steps-post", label="enforced limit")
        ax.set_ylabel(f"GPU {i} (W)")
        if i == 0:
            ax.legend(loc="upper right", fontsize=7, ncol=3)
    ax = axes[n]
    ax.plot(s.t, [sum(r) for r in s.limit_w], color="black", drawstyle="steps-post", label="sum of limits")
    ax.plot(s.t, [sum(r) for r in s.avg_w], color="tab:blue", lw=0.9, label="sum of 1 s average draw")
    ax.axhline(budget_w, color="tab:red", ls="--", label=f"budget {budget_w:g} W")
    ax.set_ylabel("bank (W)")
    ax.set_xlabel("time (s)")
    ax.legend(loc="lower right", fontsize=7, ncol=3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
