"""Hosts per feed: how many hosts a fixed power tree carries with zero trips, per policy.

For a tree file (``sim/trees``), the hosts of its ``[hosts]`` and ``[sim] scenarios``
are a *template*: the sweep puts ``n`` hosts on the tree, taking the template's hosts in
turn across its leaves (the first of each cord set, then the second, ...; after the
last, the template again, names suffixed ``~2``, ``~3``). ``N``, the *nameplate count*,
is the largest ``n`` whose hosts, every card at its maximum limit plus the host's own
draw (through its scenario's ``[feed]``: wall W), fit every node's continuous rating
(``budget_w``: the derated breaker, the UPS less its margin) with every feed pair
redundant (either side carries the whole host): how a row is provisioned by nameplate.
The sweep runs ``N x`` :data:`STEPS` hosts (and, given ``beyond``, on until nameplate
trips) under four policies:

- ``nameplate``: every card at its maximum limit, for good (no capping: each host's
  work here is its *unconstrained* work, the denominator of ``work_per_host``);
- ``best-cap``: one cap for every card, a fraction of its maximum limit (as operators
  provision at a fraction of TDP; never under its minimum), the largest of
  :data:`CAP_FRACTIONS` with zero trips at that count (work grows with the cap, so the
  largest is the most work): from the largest whose worst case fits every rating
  (which cannot trip), up while none trips;
- ``powerbudgetd``: each host's controller under the tree's grants (``tree.py``'s store
  model, the file's pair modes: its ``declared`` split);
- ``oracle``: every tick the declared tree divided over the hosts' true wants, and the
  room left handed out up to each host's nameplate (``core.tree.divide`` with ceilings,
  as powerbudgetd's division does, but clairvoyant: no rounds, no hold, writes landing at
  once). Where every nameplate fits (at N) every host holds its nameplate: the
  unconstrained work. Above N it is the division's bound, not the most work there is (a
  static cap found in hindsight may do more: it is held to the trip models, not to the
  nodes' continuous ratings).

Each run lasts ``duration_s``; where the tree has a feed pair, its ``[sim] feed_lost``
(else its first feed) is lost half-way: the run's first half is the normal state, its
second the failover. A *trip* is a trip of a node's breaker or UPS model (``feed.py``)
fed the instant flow, or a trip the run's steady states would bring were they to last
(a short run must not hide a slow trip): in the *normal* state (from :data:`WARMUP_S` to
the loss, or the end) or the *failover* (from the loss plus the tree's stated shed
time to the end), a breaker whose mean (I / rating)^2 is above 1 (its thermal element
heats on net) or a UPS whose overload accumulator rises on net (over 110 % of its
rating more than it drains at or under 100 %).

Work and satisfaction are counted from :data:`WARMUP_S` on (every policy past its boot
and first rounds of grants); trips over the whole run.

Per node, the *satisfaction ratio* (nvPAX's): each 1 s interval, the wall power the
hosts below it were granted (each card's draw, min(demand, limit in force), plus the
host's own draw) over what they requested (each card's demand up to its maximum limit,
plus the host's); its mean and 5th percentile over the run.

This model is the simulator's, never the product's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powerbudgetd.config.tree import TreeFile, load_tree, tree_from_dict
from powerbudgetd.core.circuit import GrantPolicy
from powerbudgetd.core.model import Timings
from powerbudgetd.core.tree import PowerTree, divide
from powerbudgetd_sim.circuit import floor_wall_w, host_feed, make_host
from powerbudgetd_sim.scenario import Scenario, ScenarioError, load_scenario
from powerbudgetd_sim.feed import UPS_DRAIN_S, Ups
from powerbudgetd_sim.tree import DEFAULT_SHED_S, Client, NodeMeter, _meters, _round, _wall, tree_path, wake_for_cards

STEPS = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)
BEYOND = (1.6, 1.7, 1.8, 1.9, 2.0)  # played on only until nameplate trips (``simulate --sweep``)
POLICIES = ("nameplate", "best-cap", "powerbudgetd", "oracle")
CAP_FRACTIONS = tuple(round(1.0 - 0.05 * k, 2) for k in range(15))  # 1.0 down to 0.3 of the max limit
SATISFACTION_S = 1.0  # the interval the satisfaction ratio is taken over
DEFAULT_DURATION_S = 30.0
WARMUP_S = 5.0  # work and satisfaction count from then on: every policy past its boot and first rounds
POLL_S = 1.0
RELEASE_HOLD_S = 10.0
STEP_W = 20.0
SEAT_MARGIN = 1.05  # a generated host's seat: its floor plus 5 % (as the packaged row's)

ScenarioSource = Callable[[Scenario, int], Scenario]  # (the host's scenario, its index) -> what it plays
DEMANDS = ("scenario", "inference", "training")


@dataclass(frozen=True)
class Template:
    """The tree file's nodes and pairs, and its hosts in the order the sweep adds them."""

    file: TreeFile
    order: list[str]  # template host names, interleaved across cord sets
    scenarios: dict[str, str]  # template host -> scenario name


def load_template(tree: str) -> Template:
    """The template of a packaged tree or file. Raises ScenarioError (no such tree, a host
    without a scenario) or ConfigError (a bad file)."""
    base, file = load_tree(tree_path(tree))
    missing = sorted(set(base.hosts) - set(file.sim.scenarios))
    if missing:
        raise ScenarioError(f"{tree}: [sim] scenarios names no scenario for {', '.join(missing)}")
    if not base.hosts:
        raise ScenarioError(f"{tree}: no [hosts]: nothing to sweep")
    groups: dict[tuple[str, ...], list[str]] = {}
    for name in sorted(base.hosts):
        groups.setdefault(tuple(sorted(base.hosts[name].cords)), []).append(name)
    order = [g[i] for i in range(max(len(g) for g in groups.values())) for g in groups.values() if i < len(g)]
    return Template(file, order, dict(file.sim.scenarios))


def nameplate_wall_w(sc: Scenario) -> float:
    """A host's nameplate (wall W): every card at its maximum limit, plus its own draw."""
    return host_feed(sc).wall_w(sum(c.max_w for c in sc.cards))


def cap_wall_w(sc: Scenario, fraction: float) -> float:
    """A host's worst case (wall W) with every card capped at ``fraction`` of its maximum."""
    return host_feed(sc).wall_w(sum(_cap_w(c.min_w, c.max_w, fraction) for c in sc.cards))


def _cap_w(min_w: float, max_w: float, fraction: float) -> float:
    return max(min_w, fraction * max_w)


@dataclass
class Layout:
    """``count`` hosts on the template's tree: the tree, each host's scenario name."""

    tree: PowerTree
    file: TreeFile
    scenarios: dict[str, str]

    def redundant(self) -> PowerTree:
        return self.tree.with_mode("redundant") if self.tree.pairs else self.tree


def layout(t: Template, count: int, scenario_of: dict[str, Scenario]) -> Layout:
    """The template's tree with ``count`` hosts (module docstring). Each host's seat is
    its template's, or its scenario's floor plus 5 % where that is higher. Raises
    ScenarioError where the seats alone do not fit the tree."""
    if count < 1:
        raise ValueError("count must be >= 1")
    hosts: dict[str, Any] = {}
    scenarios: dict[str, str] = {}
    for k in range(count):
        tmpl = t.order[k % len(t.order)]
        cycle = k // len(t.order)
        name = tmpl if cycle == 0 else f"{tmpl}~{cycle + 1}"
        table = t.file.hosts[tmpl]
        sc = scenario_of[t.scenarios[tmpl]]
        hosts[name] = {"cords": dict(table.cords), "priority": table.priority,
                       "reserve_w": max(table.reserve_w, round(floor_wall_w(sc) * SEAT_MARGIN))}
        scenarios[name] = t.scenarios[tmpl]
    data = t.file.model_dump(exclude_none=True)
    data["hosts"] = hosts
    data["sim"] = {k: v for k, v in data.get("sim", {}).items() if k != "scenarios"}
    try:
        tree, file = tree_from_dict(data)
    except ValueError as exc:
        raise ScenarioError(f"{count} hosts do not fit the tree by their seats alone:\n{exc}") from None
    return Layout(tree, file, scenarios)


def nameplate_count(t: Template, scenario_of: dict[str, Scenario], limit: int = 4096) -> int:
    """``N``: the most hosts whose nameplates fit every node's rating, pairs redundant
    (module docstring); 0 when not even one fits."""
    n = 0
    while n < limit:
        lay = layout(t, n + 1, scenario_of)
        walls = {h: nameplate_wall_w(scenario_of[s]) for h, s in lay.scenarios.items()}
        if lay.redundant().over_w(walls):
            break
        n += 1
    return n


def worst_case_fits(lay: Layout, scenario_of: dict[str, Scenario], fraction: float) -> bool:
    """Whether every card capped at ``fraction`` of its max fits every rating, pairs redundant."""
    walls = {h: cap_wall_w(scenario_of[s], fraction) for h, s in lay.scenarios.items()}
    return not lay.redundant().over_w(walls)


@dataclass
class _Satisfaction:
    """Granted and requested wall W per node, summed over each interval's ticks."""

    granted: dict[str, float] = field(default_factory=dict)
    requested: dict[str, float] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)

    def add(self, granted: dict[str, float], requested: dict[str, float]) -> None:
        for n, w in requested.items():
            self.requested[n] = self.requested.get(n, 0.0) + w
            self.granted[n] = self.granted.get(n, 0.0) + granted.get(n, 0.0)

    def close_interval(self) -> None:
        for n, req in self.requested.items():
            if req > 0:
                self.ratios.setdefault(n, []).append(min(1.0, self.granted[n] / req))
        self.granted.clear()
        self.requested.clear()

    def summary(self) -> dict[str, dict[str, float]]:
        return {n: {"mean": round(sum(r) / len(r), 4), "p5": round(_percentile(r, 5), 4)}
                for n, r in sorted(self.ratios.items()) if r}


def _percentile(values: list[float], p: float) -> float:
    """The ``p`` th percentile (nearest rank) of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def run_layout(lay: Layout, scenario_of: dict[str, Scenario], policy: str, *, duration_s: float = DEFAULT_DURATION_S,
               cap_fraction: float = 1.0, lost: str | None = None, seed: int = 1) -> dict[str, Any]:
    """One run of ``lay``'s hosts under ``policy`` (``nameplate``, ``best-cap`` at
    ``cap_fraction``, ``powerbudgetd``, ``oracle``) for ``duration_s`` virtual s, feed
    ``lost`` (None: none) lost half-way. Returns each host's work (TGP-s), the trips per
    node (module docstring) and the satisfaction ratio per node."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}")
    timings = Timings(tick_s=0.1)
    tree = lay.tree
    lost_at = duration_s / 2
    static = policy in ("nameplate", "best-cap")
    fraction = 1.0 if policy == "nameplate" else cap_fraction
    clients: dict[str, Client] = {}
    for i, name in enumerate(sorted(tree.hosts)):
        sc = scenario_of[lay.scenarios[name]]
        seat = cap_wall_w(sc, fraction) if static else tree.hosts[name].reserve_w
        kind = "static" if static else ("oracle" if policy == "oracle" else "circuit")
        h = make_host(name, sc, seat, timings, seed + i, kind)
        if static:  # one cap per card, written once; the controller never ticks
            for card in h.bank.cards:
                card.set_limit(0.0, round(_cap_w(card.min_mw / 1000, card.max_mw / 1000, fraction) * 1000))
        reserve = h.power.reserve_w
        clients[name] = Client(h, reserve, reserve, POLL_S * i / len(tree.hosts), reserve,
                               GrantPolicy(STEP_W, RELEASE_HOLD_S))
    store_tree = tree.with_reserves({n: c.host.power.reserve_w for n, c in clients.items()})
    meters = _meters(tree, lay.file)
    states = _states(lay, lost, duration_s)
    steady = {state: _Steady() for state in states}
    peak: dict[str, float] = {}  # nodes with a trip model: the highest instant load / rating
    sat = _Satisfaction()
    warm: dict[str, float] | None = None  # each host's work at WARMUP_S
    k = 0
    per_interval = max(1, round(SATISFACTION_S / timings.tick_s))
    while (t := round(k * timings.tick_s, 9)) <= duration_s:
        gone = lost if lost is not None and t >= lost_at else None
        live = {h for hs in tree.coefficients(gone, flow=True).values() for h in hs}
        if policy == "oracle":
            wants = {h: c.host.power.reserve_w + c.host.want_w(t) for h, c in clients.items()}
            fair = divide(tree, wants, gone, {h: c.host.power.reserve_w + c.host.ceiling_w() for h, c in clients.items()})
        for name, c in clients.items():
            if name not in live:
                continue
            h = c.host
            h.bank.advance_to(t)
            if static:
                continue
            if policy == "oracle":
                c.held_w = c.in_use_w = fair[name]
            elif t >= c.next_poll:
                c.next_poll += POLL_S
                _round(store_tree, clients, c, t, gone)
            h.keeper.arbiter.offer("circuit", h.power.board_w(c.in_use_w), t)
            h.keeper.apply(h.ctl, t)
            h.ctl.tick(t)
            if policy != "oracle":
                wake_for_cards(store_tree, clients, c, t, gone)
        instant = tree.loads_w({n: _wall(c, "instant") for n, c in clients.items() if n in live}, gone, flow=True)
        for node, load in instant.items():
            m = meters[node]
            m.step(t, load, timings.tick_s)
            if m.breaker is not None or m.ups is not None:
                peak[node] = max(peak.get(node, 0.0), load / m.rating_w())
        for state, (a, b) in states.items():
            if a - 1e-9 <= t < b - 1e-9:
                steady[state].add(meters, instant, timings.tick_s)
        k += 1
        if t < WARMUP_S - 1e-9:
            continue
        if warm is None:
            warm = {n: sum(c.host.meters.work) for n, c in clients.items()}
        granted, requested = {}, {}
        for n, c in clients.items():
            if n in live:
                granted[n], requested[n] = _granted_requested(c, t)
        sat.add(tree.loads_w(granted, gone, flow=True), tree.loads_w(requested, gone, flow=True))
        if k % per_interval == 0:
            sat.close_interval()
    trips = {n: m.trips() for n, m in meters.items() if m.trips()}
    for state, (a, _) in states.items():
        for node, why in steady[state].trips(meters).items():
            if node not in trips:
                trips[node] = [f"{why} {state} (from {a:g} s): it trips if that state lasts"]
    return {"policy": policy, "hosts": len(clients), "cap_fraction": fraction if static else None,
            "work_tgp_s": {n: sum(c.host.meters.work) - (warm or {}).get(n, 0.0) for n, c in clients.items()},
            "trips": trips, "satisfaction": sat.summary(),
            "heating": {state: st.heating() for state, st in steady.items()},
            "peak_of_rating": {n: round(x, 3) for n, x in sorted(peak.items())}}


def _states(lay: Layout, lost: str | None, duration_s: float) -> dict[str, tuple[float, float]]:
    """The run's steady states (module docstring): ``normal`` from :data:`WARMUP_S` to the
    loss (or the end), ``failover`` from the loss plus the tree's stated shed time to the end."""
    if lost is None:
        return {"normal": (WARMUP_S, duration_s + 1e-6)}
    lost_at = duration_s / 2
    shed = max((p.shed_s for p in lay.tree.pairs.values() if p.shed_s is not None), default=DEFAULT_SHED_S)
    return {"normal": (WARMUP_S, lost_at), "failover": (min(lost_at + shed, duration_s), duration_s + 1e-6)}


@dataclass
class _Steady:
    """Per node over one steady state: the integral of (I / rating)^2 dt (breakers) and
    the net rate of the UPS's overload accumulator (its bands as ``feed.Ups``: it rises
    above 110 % of the rating, drains at or under 100 %)."""

    span_s: float = 0.0
    heat: dict[str, float] = field(default_factory=dict)
    overload: dict[str, float] = field(default_factory=dict)

    def add(self, meters: dict[str, NodeMeter], loads_w: dict[str, float], dt_s: float) -> None:
        self.span_s += dt_s
        for node, load in loads_w.items():
            m = meters[node]
            if m.breaker is not None:
                self.heat[node] = self.heat.get(node, 0.0) + dt_s * (load / m.volts / m.breaker.rating_a) ** 2
            if m.ups is not None:
                x = load / m.ups.rating_w
                trip_s = Ups.trip_time_s(x)
                rate = 1.0 / trip_s if trip_s < math.inf else (-1.0 / UPS_DRAIN_S if x <= 1.0 else 0.0)
                self.overload[node] = self.overload.get(node, 0.0) + dt_s * rate

    def heating(self) -> dict[str, float]:
        return {n: round(i / self.span_s, 3) for n, i in sorted(self.heat.items())} if self.span_s else {}

    def trips(self, meters: dict[str, NodeMeter]) -> dict[str, str]:
        """Each node that would trip were the state to last: a breaker whose mean (I /
        rating)^2 is over 1 (its thermal element heats on net), a UPS whose overload
        rises on net."""
        out: dict[str, str] = {}
        if self.span_s <= 0:
            return out
        for node, integral in self.heat.items():
            if integral / self.span_s > 1.0:
                out[node] = f"breaker heating on net (mean (I/rating)^2 {integral / self.span_s:.2f})"
        for node, net in self.overload.items():
            if node not in out and net > 1e-9:
                out[node] = f"UPS overload rising on net ({net / self.span_s * 100:.1f} % of a trip a second)"
        return out


def _granted_requested(c: Client, t: float) -> tuple[float, float]:
    """A host's granted and requested wall W now (module docstring)."""
    granted = requested = 0.0
    for card in c.host.bank.cards:
        want = min(card.max_mw / 1000, card.demand_w)
        requested += want
        granted += min(want, card.enforced_mw(t) / 1000)
    feed = c.host.power.feed
    return feed.wall_w(granted), feed.wall_w(requested)


def _feed_to_lose(lay: Layout) -> str | None:
    feeds = lay.tree.feeds()
    if not feeds:
        return None
    chosen = lay.file.sim.feed_lost
    return chosen if chosen in feeds else feeds[0]


def sweep(tree: str, *, steps: tuple[float, ...] = STEPS, duration_s: float = DEFAULT_DURATION_S, seed: int = 1,
          scenario_source: ScenarioSource | None = None, beyond: tuple[float, ...] = (),
          on_step: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """The hosts-per-feed sweep of ``tree`` (module docstring): for each count ``N x``
    ``steps`` (rounded, repeats dropped), each policy's trips, work per host relative to
    the same hosts unconstrained, and the satisfaction ratio per node; per policy the
    largest count with zero trips (every count up to it without a trip too).
    ``beyond``: further steps played after ``steps`` only while nameplate has not
    tripped (and while the seats fit the tree), so that the table shows where it does.
    ``scenario_source(scenario, host_index)`` gives what each host plays (default: its
    template's scenario; :func:`inference_source`: demand shaped like inference;
    :func:`training_source`: training jobs in lockstep). Raises ScenarioError for a tree the sweep cannot
    play (no hosts, a host without a scenario, not one host at nameplate)."""
    if not steps or any(s <= 0 for s in steps):
        raise ValueError("steps must be > 0")
    if duration_s <= WARMUP_S:
        raise ValueError(f"duration_s must be over the warm-up, {WARMUP_S:g} s")
    t = load_template(tree)
    scenario_of = {name: load_scenario(name) for name in sorted(set(t.scenarios.values()))}
    n = nameplate_count(t, scenario_of)
    if n == 0:
        raise ScenarioError(f"{tree}: not one host fits the tree at its nameplate (every card at its maximum limit)")
    counts = sorted({max(1, round(n * s)) for s in steps})
    more = [c for c in sorted({max(1, round(n * s)) for s in beyond}) if c > counts[-1]]
    rows: list[dict[str, Any]] = []
    seats_full: int | None = None
    for count in counts + more:
        if count in more and any(row["runs"]["nameplate"]["trips"] for row in rows):
            break  # past the steps only until nameplate trips
        try:
            lay = layout(t, count, scenario_of)
        except ScenarioError:
            if count not in more:
                raise
            seats_full = count  # the seats alone fill a node: no policy can play this count
            break
        by_host = scenario_of
        if scenario_source is not None:  # each host its own scenario, keyed by its name
            by_host = {h: scenario_source(scenario_of[lay.scenarios[h]], i) for i, h in enumerate(sorted(lay.tree.hosts))}
            lay = Layout(lay.tree, lay.file, {h: h for h in lay.tree.hosts})
        lost = _feed_to_lose(lay)
        runs: dict[str, dict[str, Any]] = {}
        for policy in POLICIES:
            if on_step:
                on_step(count, policy)
            if policy == "best-cap":
                runs[policy] = _best_cap(lay, by_host, duration_s, lost, seed)
            else:
                runs[policy] = run_layout(lay, by_host, policy, duration_s=duration_s, lost=lost, seed=seed)
        unconstrained = runs["nameplate"]["work_tgp_s"]
        total = sum(unconstrained.values())
        for r in runs.values():
            r["work_per_host"] = round(sum(r["work_tgp_s"].values()) / total, 4) if total > 0 else None
            sats = r["satisfaction"]
            r["satisfaction_mean"] = round(min(s["mean"] for s in sats.values()), 4) if sats else None
            r["satisfaction_p5"] = round(min(s["p5"] for s in sats.values()), 4) if sats else None
        rows.append({"count": count, "of_nameplate": round(count / n, 3), "feed_lost": lost, "runs": runs})
    largest: dict[str, int | None] = {}
    for p in POLICIES:
        best: int | None = None
        for row in rows:
            if row["runs"][p]["trips"]:
                break
            best = row["count"]
        largest[p] = best
    return {"tree": tree, "demand": "scenario" if scenario_source is None else "given", "nameplate_count": n,
            "duration_s": duration_s, "steps": list(steps), "rows": rows,
            "largest_zero_trip_count": largest, "seats_do_not_fit_at": seats_full,
            "largest_of_nameplate": {p: None if c is None else round(c / n, 3) for p, c in largest.items()}}


def inference_source(seed: int, day_s: float) -> ScenarioSource:
    """Each host's bank driven by inference demand (``inference.py``) on a ``day_s`` day
    under ``seed``: the seed sets the phase and the mix of models."""
    from powerbudgetd_sim.inference import inference_scenario

    return lambda sc, i: inference_scenario(sc, seed, i, day_s)


def training_source(seed: int, run_s: float) -> ScenarioSource:
    """Each host's bank in a training job (``training.py``) of a ``run_s`` run under
    ``seed``: the seed sets which host runs which job."""
    from powerbudgetd_sim.training import training_scenario

    return lambda sc, i: training_scenario(sc, seed, i, run_s)


def _best_cap(lay: Layout, scenario_of: dict[str, Scenario], duration_s: float, lost: str | None,
              seed: int) -> dict[str, Any]:
    """``best-cap`` at this count: the largest of :data:`CAP_FRACTIONS` with zero trips,
    from the largest whose worst case fits (it cannot trip) up while none trips; with
    none that fits, down from the top until one does not trip (the least if all do)."""
    fits = [f for f in CAP_FRACTIONS if worst_case_fits(lay, scenario_of, f)]
    start = CAP_FRACTIONS.index(fits[0]) if fits else len(CAP_FRACTIONS) - 1
    best = run_layout(lay, scenario_of, "best-cap", duration_s=duration_s, cap_fraction=CAP_FRACTIONS[start],
                      lost=lost, seed=seed)
    if best["trips"]:  # even the worst-case fit tripped (none fits): try lower
        for f in CAP_FRACTIONS[start + 1:]:
            best = run_layout(lay, scenario_of, "best-cap", duration_s=duration_s, cap_fraction=f, lost=lost, seed=seed)
            if not best["trips"]:
                break
        return best
    for f in reversed(CAP_FRACTIONS[:start]):  # upward from the fit
        r = run_layout(lay, scenario_of, "best-cap", duration_s=duration_s, cap_fraction=f, lost=lost, seed=seed)
        if r["trips"]:
            break
        best = r
    return best


def format_sweep(result: dict[str, Any]) -> str:
    """The hosts-per-feed table: per count and policy, trips, work per host (relative to
    the same hosts unconstrained), the least node's satisfaction mean and p5; then the
    largest zero-trip count per policy."""
    n = result["nameplate_count"]
    lines = [f"hosts per feed: tree {result['tree']} ({result['demand']} demand), nameplate N = {n} hosts (every card at its maximum limit, "
             f"pairs redundant), {result['duration_s']:g} s a run"
             + (f", {result['rows'][0]['feed_lost']} lost half-way" if result["rows"][0]["feed_lost"] else ""),
             f"  {'hosts':>5} {'x N':>5}  {'policy':<13}{'trips':>6}{'work/host':>10}{'cap':>6}"
             f"{'satisf. mean':>13}{'p5':>7}"]
    for row in result["rows"]:
        for p, r in row["runs"].items():
            cap = "-" if r["cap_fraction"] is None or p == "nameplate" else f"{r['cap_fraction']:.2f}"
            wph = "-" if r["work_per_host"] is None else f"{r['work_per_host']:.3f}"
            mean = "-" if r["satisfaction_mean"] is None else f"{r['satisfaction_mean']:.4f}"
            p5 = "-" if r["satisfaction_p5"] is None else f"{r['satisfaction_p5']:.3f}"
            lines.append(f"  {row['count']:>5} {row['count'] / n:>5.2f}  {p:<13}{len(r['trips']):>6}{wph:>10}"
                         f"{cap:>6}{mean:>13}{p5:>7}")
    if result.get("seats_do_not_fit_at"):
        lines.append(f"  {result['seats_do_not_fit_at']} hosts: their seats alone do not fit the tree (not played)")
    lines.append("  largest count with zero trips: " + "; ".join(
        f"{p} {'none' if c is None else f'{c} ({c / n:.2f} N)'}" for p, c in result["largest_zero_trip_count"].items()))
    for row in result["rows"]:
        ours, oracle = row["runs"]["powerbudgetd"]["work_per_host"], row["runs"]["oracle"]["work_per_host"]
        if ours is not None and oracle is not None and ours > oracle:
            lines.append(f"  {row['count']} hosts: powerbudgetd {ours:.3f} above the oracle's {oracle:.3f}: the oracle divides "
                         "the true wants every tick (the room left up to each nameplate), no more; a grant kept above its "
                         "fair share through the release hold serves a demand that comes back: the oracle bounds the "
                         "division, not the work")
    for row in result["rows"]:
        for p, r in row["runs"].items():
            for node, trips in r["trips"].items():
                lines.append(f"  {row['count']} hosts, {p}: {node} tripped: {', '.join(trips)}")
    return "\n".join(lines)


def plot_sweep(result: dict[str, Any], path: str) -> None:
    """Hosts vs work per host, one line per policy, trips marked with an x. Needs
    matplotlib (the ``plot`` extra). Raises OSError if ``path`` cannot be written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - the plot extra is installed with the tests
        raise SystemExit("--plot needs matplotlib: pip install 'powerbudgetd[plot]'") from exc
    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = {"nameplate": ("s", "--"), "best-cap": ("^", ":"), "powerbudgetd": ("o", "-"), "oracle": ("D", "-.")}
    for p in POLICIES:
        xs = [row["count"] for row in result["rows"]]
        ys = [row["runs"][p]["work_per_host"] or 0.0 for row in result["rows"]]
        marker, style = styles[p]  # nameplate and best-cap often coincide: both stay visible
        (line,) = ax.plot(xs, ys, marker=marker, linestyle=style, label=p)
        tripped = [(x, y) for row, x, y in zip(result["rows"], xs, ys) if row["runs"][p]["trips"]]
        if tripped:
            ax.scatter([x for x, _ in tripped], [y for _, y in tripped], marker="x", s=120, color=line.get_color(),
                       zorder=3)
    n = result["nameplate_count"]
    ax.axvline(n, color="0.6", linestyle="--", linewidth=1)
    ax.set_xlabel(f"hosts (nameplate N = {n}; x: a breaker or UPS tripped)")
    ax.set_ylabel("work per host (of unconstrained)")
    ax.set_title(f"hosts per feed: {result['tree']} ({result['demand']} demand)")
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
