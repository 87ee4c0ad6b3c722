"""Run a policy against a simulated bank on virtual time, and report.

powerbudgetd's controller talks to the simulator through the production NVML layer
(:class:`powerbudgetd.hw.nvml.Nvml` and the real bindings over the simulated NVML
library); so do the baselines
``static``, ``slurm`` and ``reactive`` (``powerbudgetd_sim.baselines``); the ``oracle``
writes straight into a bank without limit lag, the ``causal`` oracle and the ``ruled``
one (the causal oracle held to powerbudgetd's rules) into one with it.
Every tick, from the first (boot included), the simulator's own truth is checked: the
sum over cards of the highest limit that may be in force (requested, enforced or in
flight) against the budget. ``over_budget_s`` and ``over_budget_episodes`` count every
tick over it, whatever the cause; ``violation_ticks`` those the policy is to blame for:
over budget after it declared itself ready, or in a tick where it raised a limit
(``ready_s`` is when it declared itself ready, None if never). Every 100 ms
refresh, meters (``powerbudgetd_sim.meters``) account the work done, the draw above the
budget, the wall power against the feed's breaker and UPS, reclaims, and how often each
card's limit reverses direction (flapping).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from powerbudgetd.control.controller import Controller
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.fairshare import fair_shares
from powerbudgetd.core.model import Timings
from powerbudgetd.hw.card import CardBackend
from powerbudgetd_sim.backends import sim_backend
from powerbudgetd.control.budgetkeeper import BudgetKeeper
from powerbudgetd_sim.baselines import (
    CausalOraclePolicy, OraclePolicy, ReactivePolicy, RuledCausalOraclePolicy, SlurmPolicy, StaticPolicy,
)
from powerbudgetd_sim.feed import UPS_BANDS, feed_from_dict
from powerbudgetd_sim.libnvml import check_interrupt
from powerbudgetd_sim.mains import SimUps
from powerbudgetd_sim.meters import BankMeters
from powerbudgetd_sim.physics import SimBank
from powerbudgetd_sim.scenario import Scenario

POLICIES = ("static", "slurm", "reactive", "powerbudgetd", "oracle", "causal", "ruled")
ORACLES = ("oracle", "causal", "ruled")  # no fair share to return to: reclaims are not counted
RATE_MIN_S = 10.0  # s: the shortest run whose limit writes are given per minute


@dataclass
class Series:
    """Per-tick samples for plots: time (s), per card power and enforced limit (W),
    cumulative work (TGP-s) and wall power (W, where the scenario states a feed)."""

    t: list[float] = field(default_factory=list)
    avg_w: list[list[float]] = field(default_factory=list)
    instant_w: list[list[float]] = field(default_factory=list)
    limit_w: list[list[float]] = field(default_factory=list)
    work: list[float] = field(default_factory=list)
    wall_w: list[float] = field(default_factory=list)
    role: list[list[str]] = field(default_factory=list)  # per card: fair_share, donor, recipient, ...
    budget_w: list[float] = field(default_factory=list)  # the budget in force (a UPS on battery lowers it)
    on_battery: list[bool] = field(default_factory=list)  # the scenario's mains lost
    ups_rating_w: float | None = None  # the feed's UPS rating at the plug (W), where it states one


@dataclass
class SimResult:
    report: dict[str, Any]
    series: Series


def _budget_in_force_w(pol: Any, configured_w: float) -> float:
    """The budget the policy holds the bank to now (W): powerbudgetd's or the oracle's
    under a UPS on battery, else the scenario's."""
    if isinstance(pol, ControllerPolicy):
        return pol.ctl.budget_mw / 1000
    if isinstance(pol, UpsOracle):
        return pol.oracle.budget_mw / 1000
    return configured_w


class Policy(Protocol):
    """What the runner drives: see ``powerbudgetd_sim.baselines``."""

    @property
    def ready(self) -> bool: ...

    def start(self) -> Any: ...

    def tick(self, now: float) -> int: ...

    def role(self, index: int) -> str: ...


class ControllerPolicy:
    """powerbudgetd's :class:`Controller` in the shape the runner drives. With ``ups``
    (a mains loss in the scenario), the UPS's budget goes through the daemon's own
    budget arbiter and keeper before each tick, as in ``powerbudgetd run``."""

    name = "powerbudgetd"

    def __init__(self, ctl: Controller, ups: SimUps | None = None) -> None:
        self.ctl = ctl
        self.ups = ups
        self.arbiter = BudgetArbiter(ctl.budget_mw / 1000)
        self.keeper = BudgetKeeper(self.arbiter)

    @property
    def ready(self) -> bool:
        return self.ctl.ready

    def start(self) -> None:
        self.ctl.start()

    def tick(self, now: float) -> int:
        if self.ups is not None:
            offer = self.ups.budget_w(now, self.arbiter.configured_w, self.arbiter.floor_w)
            if offer is None:
                self.arbiter.withdraw("ups")
            else:
                self.arbiter.offer("ups", offer, now)
            self.keeper.apply(self.ctl, now)
        rep = self.ctl.tick(now)
        self.arbiter.set_floor(rep.snapshot.floor_w)
        return sum(1 for w in rep.writes if w.error is None and not w.dry_run)

    def role(self, index: int) -> str:
        return str(self.ctl.cards[index].role)


class UpsOracle:
    """An oracle (clairvoyant or causal) under the same UPS budget as powerbudgetd (on
    battery it has the same watts to split): the bound of work within the budget in force."""

    def __init__(self, oracle: OraclePolicy | CausalOraclePolicy, ups: SimUps, configured_w: float,
                 floor_w: float) -> None:
        self.oracle, self.ups = oracle, ups
        self.name = oracle.name
        self.configured_w, self.floor_w = configured_w, floor_w

    @property
    def ready(self) -> bool:
        return self.oracle.ready

    def start(self) -> None:
        self.oracle.start()

    def tick(self, now: float) -> int:
        offer = self.ups.budget_w(now, self.configured_w, self.floor_w)
        budget_w = self.configured_w if offer is None else max(self.floor_w, min(offer, self.configured_w))
        self.oracle.budget_mw = int(budget_w * 1000)
        return self.oracle.tick(now)

    def role(self, index: int) -> str:
        return self.oracle.role(index)


def _under_ups(oracle: OraclePolicy | CausalOraclePolicy, sc: Scenario, bank: SimBank) -> Policy:
    """``oracle`` as is, or under the scenario's UPS budget where it loses the mains."""
    if sc.mains is None:
        return oracle
    return UpsOracle(oracle, SimUps(sc.mains), sc.budget_w, sum(c.min_mw for c in bank.cards) / 1000)


def _job_start(sc: Scenario) -> Callable[[int, float], float | None]:
    def job_start(index: int, now: float) -> float | None:
        profile = sc.cards[index].profile
        phase = profile.phase_at(now)
        return None if phase.kind == "idle" else phase.at_s - profile.shift_s

    return job_start


def make_policy(name: str, sc: Scenario, bank: SimBank, nvml: CardBackend, timings: Timings) -> Policy:
    """The policy ``name`` (one of ``POLICIES``) over ``bank``. Raises ValueError."""
    if name == "powerbudgetd":
        return ControllerPolicy(Controller(nvml, sc.budget_w, timings), SimUps(sc.mains) if sc.mains else None)
    if name == "static":
        return StaticPolicy(nvml, sc.budget_w)
    if name == "slurm":
        return SlurmPolicy(nvml, sc.budget_w, _job_start(sc))
    if name == "reactive":
        return ReactivePolicy(nvml, sc.budget_w)
    if name == "oracle":
        return _under_ups(OraclePolicy(bank, sc.budget_w), sc, bank)
    if name == "causal":
        return _under_ups(CausalOraclePolicy(bank, sc.budget_w), sc, bank)
    if name == "ruled":
        return _under_ups(RuledCausalOraclePolicy(bank, sc.budget_w, timings.min_step_w), sc, bank)
    raise ValueError(f"policy {name!r} is not one of {', '.join(POLICIES)}")


def run_scenario(
    sc: Scenario,
    *,
    duration_s: float | None = None,
    seed: int | None = None,
    timings: Timings | None = None,
    keep_series: bool = False,
    policy: str = "powerbudgetd",
    oracle_work: float | None = None,
    causal_work: float | None = None,
    ruled_work: float | None = None,
    compare: bool = True,
) -> SimResult:
    """Simulate ``sc`` under ``policy`` and return the report (W, s; work in TGP-s).

    ``work_vs_oracle`` is this run's work over the oracle's on the same scenario, seed
    and duration: ``oracle_work`` when given, else the oracle is run too (``compare``
    False skips it and reports None); ``work_vs_causal`` the same against the causal
    oracle (``causal_work``), ``work_vs_ruled`` against the ruled one (``ruled_work``). Raises ValueError for an unknown policy, and
    BudgetInfeasible / ValueError when the minimum limits sum above the budget.
    """
    duration = sc.duration_s if duration_s is None else duration_s
    seed = sc.seed if seed is None else seed
    timings = timings or Timings(tick_s=sc.tick_s)
    bank = SimBank(
        list(sc.cards), lag_s=0.0 if policy == "oracle" else sc.lag_s, seed=seed, events=list(sc.events)
    )
    _lib, nvml, _tree = sim_backend(bank, sc.faults)  # NVML, hwmon for AMD / Intel cards, or both
    pol = make_policy(policy, sc, bank, nvml, timings)
    pol.start()
    budget_mw = int(sc.budget_w * 1000)
    shares = fair_shares(budget_mw, [c.min_mw for c in bank.cards], [c.max_mw for c in bank.cards])
    meters = BankMeters(
        bank, sc.budget_w, shares or [c.min_mw for c in bank.cards], feed_from_dict(sc.feed) if sc.feed else None,
        sc.mains,
    ).attach()

    series = Series()
    budget_in_force_mw = budget_mw
    violation_ticks = ticks = episodes = 0
    over_s = 0.0
    was_over = False
    boot_s: float | None = None
    max_sum_enforced = max_sum_bound = max_sum_avg = max_sum_instant = 0.0
    energy_start = [c.energy_mj for c in bank.cards]
    cap_changes = 0
    k = 0
    while (t := round(k * timings.tick_s, 9)) <= duration:
        check_interrupt()
        bank.advance_to(t)
        requested = [c.requested(t) for c in bank.cards]
        cap_changes += pol.tick(t)
        if isinstance(pol, ControllerPolicy) and pol.ups is not None and pol.ctl.budget_mw != budget_in_force_mw:
            budget_in_force_mw = pol.ctl.budget_mw
            in_force = fair_shares(budget_in_force_mw, [c.min_mw for c in bank.cards], [c.max_mw for c in bank.cards])
            meters.rebudget(in_force or [c.min_mw for c in bank.cards])
        ticks += 1
        bound = bank.sum_limit_bound_mw()
        over = bound > budget_mw
        over_s += timings.tick_s if over else 0.0
        episodes += over and not was_over
        was_over = over
        raised = any(c.requested(t) > r for c, r in zip(bank.cards, requested))
        if pol.ready or (over and raised):
            violation_ticks += over
        if pol.ready:
            meters.counting = policy not in ORACLES
            if boot_s is None:
                boot_s = t
            max_sum_bound = max(max_sum_bound, bound / 1000)
            max_sum_enforced = max(max_sum_enforced, sum(c.enforced_mw(t) for c in bank.cards) / 1000)
        max_sum_avg = max(max_sum_avg, sum(c.avg_w for c in bank.cards))
        max_sum_instant = max(max_sum_instant, sum(c.instant_w for c in bank.cards))
        if keep_series:
            series.t.append(t)
            series.avg_w.append([c.avg_w for c in bank.cards])
            series.instant_w.append([c.instant_w for c in bank.cards])
            series.limit_w.append([c.enforced_mw(t) / 1000 for c in bank.cards])
            series.work.append(sum(meters.work))
            series.wall_w.append(meters.wall_w)
            series.role.append([pol.role(c.index) for c in bank.cards])
            series.budget_w.append(_budget_in_force_w(pol, sc.budget_w))
            series.on_battery.append(bool(sc.mains and sc.mains.lost(t)))
        k += 1
    meters.close()
    series.ups_rating_w = meters.feed.ups_w if meters.feed is not None else None

    span = bank.now  # s simulated; 0 only for a run too short to have ticked past boot
    # A dark bank (a trip, an empty battery) draws nothing from then on.
    energy_end = meters.energy_at_dark_mj or [c.energy_mj for c in bank.cards]
    cards = []
    for c in bank.cards:
        cards.append(
            {
                "index": c.index,
                "uuid": c.spec.uuid,
                "name": c.spec.name,
                "min_w": c.min_mw / 1000,
                "max_w": c.max_mw / 1000,
                "mean_power_w": round((energy_end[c.index] - energy_start[c.index]) / 1000 / span, 1) if span > 0 else None,
                "final_limit_w": c.enforced_mw(bank.now) / 1000,
                "final_role": pol.role(c.index),
                "limit_writes": c.writes,
                "work": round(meters.work[c.index], 3),
            }
        )
    work = sum(meters.work)
    if policy == "oracle":
        oracle_work = work
    elif oracle_work is None and compare:
        oracle_work = run_scenario(sc, duration_s=duration, seed=seed, policy="oracle", compare=False).report["work"]
    if policy == "causal":
        causal_work = work
    elif causal_work is None and compare:
        causal_work = run_scenario(sc, duration_s=duration, seed=seed, policy="causal", compare=False).report["work"]
    if policy == "ruled":
        ruled_work = work
    elif ruled_work is None and compare:
        ruled_work = run_scenario(sc, duration_s=duration, seed=seed, policy="ruled", compare=False).report["work"]
    # Boot writes every card once or twice: over a run shorter than RATE_MIN_S that
    # alone reads as a storm of writes per minute, so no rate is given (only the count).
    minutes = span / 60
    per_card = [c.writes / minutes for c in bank.cards] if span >= RATE_MIN_S else []
    report = {
        "scenario": sc.name,
        "policy": policy,
        "seed": seed,
        "budget_w": sc.budget_w,
        "cards": cards,
        "duration_s": duration,
        "ticks": ticks,
        "boot_s": boot_s,
        "ready_s": boot_s,
        "max_sum_enforced_limit_w": round(max_sum_enforced, 3),
        "max_sum_limit_bound_w": round(max_sum_bound, 3),
        "violation_ticks": violation_ticks,
        "max_sum_power_avg_w": round(max_sum_avg, 1),
        "max_sum_power_instant_w": round(max_sum_instant, 1),
        "cap_changes": cap_changes,
        "work": round(work, 3),
        "work_vs_oracle": round(work / oracle_work, 4) if oracle_work else None,
        "work_vs_causal": round(work / causal_work, 4) if causal_work else None,
        "work_vs_ruled": round(work / ruled_work, 4) if ruled_work else None,
        "writes_per_card_per_min": {"mean": round(sum(per_card) / len(per_card), 2) if per_card else None,
                                    "max": round(max(per_card), 2) if per_card else None},
        "flapping": meters.flapping_summary(),
        "reclaim_latency_s": meters.reclaim_summary(),
        "over_budget_s": round(over_s, 3),
        "over_budget_episodes": episodes,
        "draw_over_budget_s": round(meters.over_budget_s, 1),
        "trips": meters.trips(),
        "trip_at_s": meters.trip_times(),
        "dark_at_s": meters.dark_at,  # a trip or an empty battery: no power from then on
        # Rounded down: a device that held never reads as all the way to a trip.
        "trip_margins": {d: {k: math.floor(1000 * x) / 1000 for k, x in m.items()}
                         for d, m in meters.trip_margins().items()},
        "max_wall_power_w": round(meters.max_wall_w, 1) if sc.feed else None,
        "battery": None if meters.battery is None else meters.battery.summary(),
        "work_before_mains_loss": None if meters.first_loss_s is None else round(meters.work_before_loss, 3),
        "mains_lost_at_s": meters.first_loss_s,
    }
    return SimResult(report, series)


def run_policies(
    sc: Scenario,
    policies: Sequence[str] = POLICIES,
    *,
    duration_s: float | None = None,
    seed: int | None = None,
    timings: Timings | None = None,
    keep_series: bool = False,
) -> dict[str, SimResult]:
    """Run each of ``policies`` on the same scenario, seed and duration; the three oracles
    run once (first) and every ``work_vs_oracle``, ``work_vs_causal`` and ``work_vs_ruled``
    is against them. Keyed by policy name, in the order given."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"policy {unknown[0]!r} is not one of {', '.join(POLICIES)}")
    kw: dict[str, Any] = dict(duration_s=duration_s, seed=seed, timings=timings, keep_series=keep_series)
    oracle = run_scenario(sc, policy="oracle", compare=False, **kw)
    causal = run_scenario(sc, policy="causal", compare=False, **kw)
    ruled = run_scenario(sc, policy="ruled", compare=False, **kw)
    bars = {"oracle_work": oracle.report["work"], "causal_work": causal.report["work"],
            "ruled_work": ruled.report["work"]}
    for r in (oracle, causal, ruled):
        for bar, work in bars.items():
            r.report[f"work_vs_{bar.removesuffix('_work')}"] = round(r.report["work"] / work, 4) if work else None
    done = {"oracle": oracle, "causal": causal, "ruled": ruled}
    return {name: done.get(name) or run_scenario(sc, policy=name, **bars, **kw) for name in policies}


def format_report(r: dict[str, Any]) -> str:
    """A readable multi-line summary of one report."""
    lines = [
        f"scenario {r['scenario']} (seed {r['seed']}){', policy ' + r['policy'] if 'policy' in r else ''}: {len(r['cards'])} cards, budget {r['budget_w']:g} W, "
        f"{r['duration_s']:g} s simulated",
        f"  ready after          {r['boot_s']} s" if r["boot_s"] is not None else "  NEVER READY",
        f"  violation ticks      {r['violation_ticks']} of {r['ticks']}",
        f"  max sum of limits    {r['max_sum_limit_bound_w']:g} W (enforced {r['max_sum_enforced_limit_w']:g} W)",
        f"  max sum of draw      {r['max_sum_power_avg_w']:g} W (1 s average), "
        f"{r['max_sum_power_instant_w']:g} W (instant)",
        f"  cap changes          {r['cap_changes']}",
    ]
    if "work" in r:
        rec = r["reclaim_latency_s"]
        margins = r.get("trip_margins", {})
        trips = ", ".join(f"{d} {'TRIPPED at ' + str(r['trip_at_s'][d]) + ' s, the bank dark from then on' if v else 'held'}"
                          + (f" (peak {100 * margins[d]['peak_of_rating']:.0f} % of its rating, "
                             f"{math.floor(100 * margins[d]['closest']):.0f} % of the way to a trip)" if d in margins else "")
                          for d, v in r["trips"].items() if v is not None)
        wvo = "-" if r["work_vs_oracle"] is None else f"{r['work_vs_oracle']:.3f}"
        wvc = "-" if r.get("work_vs_causal") is None else f"{r['work_vs_causal']:.3f}"
        wvr = "-" if r.get("work_vs_ruled") is None else f"{r['work_vs_ruled']:.3f}"
        flap = r["flapping"]
        lines += [
            f"  work                 {r['work']:g} TGP-s ({wvo} of the oracle's, {wvc} of the causal oracle's, "
            f"{wvr} of the ruled one's)",
            (f"  limit writes         {r['writes_per_card_per_min']['mean']:g} per card per minute "
             f"(busiest card {r['writes_per_card_per_min']['max']:g}); " if r['writes_per_card_per_min']['mean'] is not None
             else f"  limit writes         {sum(c['limit_writes'] for c in r['cards'])} in all (under {RATE_MIN_S:g} s "
             "simulated: too short for a per-minute rate); ")
            + f"at most {flap['max_reversals']} reversals of a card's limit in {flap['window_s']:g} s",
            f"  limits over budget   {r['over_budget_s']:g} s in {r['over_budget_episodes']} "
            f"episode{'' if r['over_budget_episodes'] == 1 else 's'} "
            "(boot included: the cards' limits as found, before its first writes)",
            f"  draw over budget     {r['draw_over_budget_s']:g} s (summed 1 s average draw above the budget)",
            "  reclaim latency      " + (
                f"p50 {rec['p50']:g} s, p99 {rec['p99']:g} s, max {rec['max']:g} s over {rec['events']} reclaims"
                if rec["events"] else "no reclaim"
            ),
            "  feed                 " + (
                f"max {r['max_wall_power_w']:g} W at the plug; {trips}" if r["max_wall_power_w"] is not None
                else "none stated"
            ),
        ]
        bat = r.get("battery")
        if bat is not None:
            lines.append("  battery              " + (
                f"EMPTY at {bat['empty_at_s']:g} s" if bat["empty_at_s"] is not None
                else f"{bat['energy_left_wh']:g} Wh left after {bat['on_battery_s']:g} s on battery: "
                + (f"{bat['runtime_left_s']:g} s of runtime at {bat['mean_wall_w']:g} W"
                   if bat["runtime_left_s"] is not None else "never on battery")
            ))
    lines.append("  card  limits      mean draw  final limit  role")
    for c in r["cards"]:
        lines.append(
            f"  {c['index']:>4}  {c['min_w']:g}-{c['max_w']:g} W  {c['mean_power_w']:>7.1f} W  "
            f"{c['final_limit_w']:>9.1f} W  {c['final_role']}"
            if c["mean_power_w"] is not None else
            f"  {c['index']:>4}  {c['min_w']:g}-{c['max_w']:g} W        - W  "
            f"{c['final_limit_w']:>9.1f} W  {c['final_role']}"
        )
    return "\n".join(lines)


ROLE_COLOURS = {"donor": "tab:green", "recipient": "tab:purple", "fair_share": "0.85", "fixed": "tab:brown",
                "lost": "tab:red"}


def plot(result: SimResult, budget_w: float, path: str, title: str) -> None:
    """Each card's draw, cap, floor and role over time, and the sums against the budget (PNG)."""
    fig = plot_figure(result, budget_w, title)
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_figure(result: SimResult, budget_w: float, title: str) -> Any:
    """The figure :func:`plot` saves: one panel per card (instant and 1 s average draw,
    enforced limit, the card's floor, its role as a band along the bottom), the bank
    panel (sum of limits, summed 1 s average and instant draw against the budget in
    force, a step line, and the configured one), with a feed the plug panel (wall power
    against the UPS rating); boot marked, on-battery windows shaded and trips marked on
    every panel, the title wrapped to the figure, and one legend for the figure."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SystemExit("--plot needs matplotlib: pip install 'powerbudgetd[plot]'") from exc
    s = result.series
    n = len(s.avg_w[0]) if s.avg_w else 0
    boot_s = result.report.get("boot_s")
    floors = [c["min_w"] for c in result.report["cards"]]
    wall = bool(s.wall_w) and any(w > 0 for w in s.wall_w)
    rows = n + 1 + int(wall)
    fig, axes = plt.subplots(rows, 1, figsize=(12, 2.2 * rows + 0.8), sharex=True, squeeze=False)
    axes = axes[:, 0]
    handles: dict[str, Any] = {}
    for i in range(n):
        ax = axes[i]
        handles["instant draw"], = ax.plot(s.t, [row[i] for row in s.instant_w], lw=0.4, color="tab:orange", alpha=0.6)
        handles["1 s average draw"], = ax.plot(s.t, [row[i] for row in s.avg_w], lw=0.9, color="tab:blue")
        handles["enforced limit"], = ax.plot(s.t, [row[i] for row in s.limit_w], lw=1.4, color="black",
                                             drawstyle="steps-post")
        handles["floor (minimum limit)"] = ax.axhline(floors[i], color="0.4", ls=":", lw=1.0)
        # The role as a band under the curves: where the watts were lent and borrowed.
        if s.role:
            start = 0
            for k in range(1, len(s.t) + 1):
                if k == len(s.t) or s.role[k][i] != s.role[start][i]:
                    role = s.role[start][i]
                    end_t = s.t[k] if k < len(s.t) else s.t[-1]
                    ax.axvspan(s.t[start], end_t, ymin=0, ymax=0.06, color=ROLE_COLOURS.get(role, "0.6"), lw=0)
                    start = k
        ax.set_ylabel(f"GPU {i} (W)")
    ax = axes[n]
    handles["summed instant draw"], = ax.plot(s.t, [sum(r) for r in s.instant_w], color="tab:orange", lw=0.4,
                                              alpha=0.6)
    handles["sum of limits"], = ax.plot(s.t, [sum(r) for r in s.limit_w], color="black", drawstyle="steps-post")
    handles["sum of 1 s average draw"], = ax.plot(s.t, [sum(r) for r in s.avg_w], color="tab:blue", lw=0.9)
    if s.budget_w and any(abs(b - budget_w) > 0.5 for b in s.budget_w):
        handles[f"configured budget {budget_w:g} W"] = ax.axhline(budget_w, color="tab:red", ls=":", lw=0.8)
    handles["budget in force"], = ax.plot(s.t, s.budget_w or [budget_w] * len(s.t), color="tab:red", ls="--",
                                          drawstyle="steps-post", label="budget in force")
    ax.set_ylabel("bank (W)")
    if wall:
        ax = axes[n + 1]
        handles["wall power (summed instant, through the PSU)"], = ax.plot(s.t, s.wall_w, color="tab:olive", lw=0.5)
        if s.ups_rating_w:
            handles[f"UPS rating {s.ups_rating_w:g} W (trips past {100 * UPS_BANDS[-1][0]:.0f} % "
                    f"held {UPS_BANDS[-1][1]:g} s, sooner above)"] = ax.axhline(s.ups_rating_w, color="tab:red", ls="-.")
        ax.set_ylabel("at the plug (W)")
    for a in axes:
        if boot_s is not None:
            handles["boot: caps in force (before it, the cards' limits as found)"] = a.axvline(
                boot_s, color="tab:gray", ls="-.", lw=1.0)
            a.axvspan(s.t[0] if s.t else 0, boot_s, color="0.93", lw=0)
        for t0, t1 in _windows(s.t, s.on_battery):
            handles["on battery (mains lost)"] = a.axvspan(t0, t1, color="tab:cyan", alpha=0.15, lw=0,
                                                           label="on battery")
        for device, at in (result.report.get("trip_at_s") or {}).items():
            if at is not None:
                handles[f"{device} trip"] = a.axvline(at, color="tab:red", lw=2.0)
        if result.report.get("dark_at_s") is not None and s.t:
            handles["bank dark (the cards' traces: what they would draw with power)"] = a.axvspan(
                result.report["dark_at_s"], s.t[-1], color="0.2", alpha=0.12, lw=0)
    for device, at in (result.report.get("trip_at_s") or {}).items():
        if at is not None:
            axes[n].annotate(f"{device} trips", (at, axes[n].get_ylim()[1]), xytext=(3, -12),
                             textcoords="offset points", color="tab:red", fontsize=8)
    axes[-1].set_xlabel("time (s)")
    seen_roles = sorted({r for row in s.role for r in row}) if s.role else []
    for role in seen_roles:
        handles[f"role: {role}"] = Patch(color=ROLE_COLOURS.get(role, "0.6"))
    wrapped = _wrap_title(title, fig.get_figwidth())
    fig.suptitle(wrapped, y=0.995, fontsize=11)
    lines = wrapped.count("\n") + 1
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=4, fontsize=7,
               bbox_to_anchor=(0.5, 1.0 - (0.12 + 0.2 * lines) / fig.get_figheight()))
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.6 + 0.2 * lines) / fig.get_figheight()))
    return fig


def _wrap_title(title: str, width_in: float, fontsize: float = 11) -> str:
    """``title`` broken into lines that fit a figure ``width_in`` inches wide (about
    0.55 x the font size in points per character)."""
    chars = max(20, int(width_in * 72 / (0.55 * fontsize)))
    return textwrap.fill(title, chars)


def _windows(t: list[float], flags: list[bool]) -> list[tuple[float, float]]:
    """The [start, end) spans of ``t`` (s) where ``flags`` holds."""
    out = []
    start = None
    for ti, f in zip(t, flags):
        if f and start is None:
            start = ti
        elif not f and start is not None:
            out.append((start, ti))
            start = None
    if start is not None and t:
        out.append((start, t[-1]))
    return out


def plot_compare(results: dict[str, SimResult], budget_w: float, path: str, title: str) -> None:
    """The policies side by side (PNG): small multiples, one panel per policy on shared
    axes (sum of enforced limits and summed 1 s average draw against the budget in
    force, on-battery windows shaded, trips marked), and below them every policy's work
    so far against the oracle's."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SystemExit("--plot needs matplotlib: pip install 'powerbudgetd[plot]'") from exc
    names = list(results)
    cols = 2 if len(names) > 1 else 1
    rows = -(-len(names) // cols)
    fig = plt.figure(figsize=(12, 2.4 * rows + 3.2))
    grid = fig.add_gridspec(rows + 1, cols, height_ratios=[1.0] * rows + [1.2])
    first = None
    handles: dict[str, Any] = {}
    for k, name in enumerate(names):
        s = results[name].series
        ax = fig.add_subplot(grid[k // cols, k % cols], sharex=first, sharey=first)
        first = first or ax
        handles["sum of enforced limits"], = ax.plot(s.t, [sum(r) for r in s.limit_w], lw=1.0, color="black",
                                                     drawstyle="steps-post")
        handles["sum of 1 s average draw"], = ax.plot(s.t, [sum(r) for r in s.avg_w], lw=0.7, color="tab:blue")
        handles["budget in force"], = ax.plot(s.t, s.budget_w or [budget_w] * len(s.t), color="tab:red", ls="--",
                                              lw=1.0, drawstyle="steps-post", label="budget in force")
        for t0, t1 in _windows(s.t, s.on_battery):
            handles["on battery (mains lost)"] = ax.axvspan(t0, t1, color="tab:cyan", alpha=0.15, lw=0)
        for device, at in (results[name].report.get("trip_at_s") or {}).items():
            if at is not None:
                handles["a trip (breaker or UPS)"] = ax.axvline(at, color="tab:red", lw=2.0)
                ax.annotate(f"{device} trips", (at, 0), xycoords=("data", "axes fraction"), xytext=(3, 4),
                            textcoords="offset points", color="tab:red", fontsize=7)
        ax.set_title(f"{name}: work {results[name].report['work']:g} TGP-s", fontsize=9, loc="left")
        if k % cols == 0:
            ax.set_ylabel("W")
        ax.tick_params(labelsize=7)
    work_ax = fig.add_subplot(grid[rows, :], sharex=first)
    ref = results["oracle"].series.work if "oracle" in results else None
    for name, res in results.items():
        s = res.series
        # Work so far against the oracle's so far shows where each policy loses.
        ys = [w / o if o > 0 else 1.0 for w, o in zip(s.work, ref)] if ref else s.work
        work_ax.plot(s.t, ys, lw=1.0, label=name)
    work_ax.set_ylabel("work so far\n/ oracle's" if ref else "work (TGP-s)")
    work_ax.set_xlabel("time (s)")
    work_ax.legend(loc="lower right", fontsize=7, ncol=len(results))
    wrapped = _wrap_title(title, fig.get_figwidth())
    lines = wrapped.count("\n") + 1
    fig.suptitle(wrapped, y=0.995, fontsize=11)
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=5, fontsize=7,
               bbox_to_anchor=(0.5, 1.0 - (0.12 + 0.2 * lines) / fig.get_figheight()))
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.3 + 0.2 * lines) / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)
