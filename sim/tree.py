"""A power tree of simulated hosts on virtual time: static reserves vs tree sharing
(redundant, oversubscribed) vs an oracle, through a feed loss part-way.

Each host of the tree file (``config.tree``) is a packaged scenario's bank under the
real controller (as in ``circuit.py``), corded to its leaves. Five ways to split the tree:

- ``static``: each host holds a fixed reserve for good: the priority-aware division of
  the tree in redundant mode over the hosts' own budgets at the wall (so a feed loss
  overloads nothing, and nothing is ever shed); not played, with a line saying so, where
  that leaves a host below its scenario's floor (a tree that fits only oversubscribed);
- ``declared``: each pair in the mode the file gives it (the tree as the daemons play it);
  ``redundant`` and ``oversubscribed``: every pair in that mode (what if), not played
  where the seats do not fit it. Each host holds its seat and shares the rest
  through a model of the store: every ``poll_s`` (hosts spread over the period) it
  publishes its want (``HostPower.want_w``, as the daemon sees it) and moves its grant
  to the daemon's target (``core.circuit.GrantPolicy`` over a ``CircuitView`` of the
  published wants, nameplates and held grants: the tree's division, the room left up to
  each nameplate, raised only by ``step_w`` or
  more and within what every ancestor leaves, lowered after ``release_hold_s`` unless
  a node is over, then at once: the shed); a raise only where ``raise_allowed`` (the
  transaction's check) and once the last lowering is confirmed; a lowering to the
  cards first and to the store as the cards' bound comes down (``HostPower.lowered_grant_w``)
  at the host's rounds, one of them woken a wake gap after the tick that finds the cards
  all the way down (the daemon's channel wakes a round then);
- ``oracle``: every tick, the division of the declared tree over the hosts' true wants,
  the room left handed out up to each host's nameplate as the store's division does
  (clairvoyant, no rounds, no hold, writes that land at once): the upper bound of the
  rule's fairness, not of the work: a policy that holds a grant above its fair share
  (the release hold) can do more, and the scoreboard then says so, with the watt-seconds
  it held above the oracle's shares.

The feed loss (``feed_lost`` at ``lost_at_s``) is known to the store at once (a UPS on
battery, an operator's ``feed-down``); each host acts on it at its next round. From then
on the flow moves every dual-corded host's draw onto its surviving cord.

Measured per node, every 100 ms (the refresh): the flow of the hosts' limits at the wall
(the highest that may be in force), of their 1 s average draw and of their instant
draw; the breaker and UPS trip models of ``feed.py`` fed the instant flow (a breaker
the current at its volts). The shed time is from the loss until every surviving node's
flow of limits (and, apart, of 1 s average draw) is back within its budget; the
tolerance is what the trip models allow the surviving breaker and UPS at the worst
instant load seen meanwhile.

This model is the simulator's, never the product's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from powerbudgetd.config.tree import TreeFile, load_tree
from powerbudgetd.core.circuit import WAKE_GAP_S, CircuitView, GrantPolicy, WakeBudget, raise_allowed
from powerbudgetd.core.model import Timings
from powerbudgetd.core.tree import PowerTree, divide
from powerbudgetd_sim.circuit import SimHost, floor_wall_w, make_host
from powerbudgetd_sim.feed import Breaker, Ups, feed_from_dict
from powerbudgetd_sim.scenario import ScenarioError, load_scenario

POLICIES = ("static", "redundant", "oversubscribed", "declared", "oracle")
DEFAULT_SHED_S = 2.0


class PolicyRefused(ScenarioError):
    """A policy this tree cannot be played under (its row says why); the others play."""


def _policy_tree(base: PowerTree, policy: str, shed_s: float) -> PowerTree:
    """The tree ``policy`` plays: the file's modes (``declared``, ``oracle``), or every
    pair in one mode. Raises PolicyRefused where the seats do not fit that mode."""
    if policy in ("declared", "oracle"):
        return base
    mode = "oversubscribed" if policy == "oversubscribed" else "redundant"
    tree = base.with_mode(mode, shed_s)
    over = tree.over_w({h: host.reserve_w for h, host in tree.hosts.items()})
    if over and policy != "static":
        node, w = max(over.items(), key=lambda kv: kv[1])
        raise PolicyRefused(f"the seats do not fit every pair {mode}: node {node} over by {w:.0f} W")
    return tree


def tree_path(name: str) -> Path:
    """A packaged tree (``row-4``) or a file. Raises ScenarioError for neither."""
    packaged = Path(str(resources.files("powerbudgetd_sim") / "trees")) / f"{name}.toml"
    if packaged.is_file():
        return packaged
    if Path(name).is_file():
        return Path(name)
    raise ScenarioError(f"no tree {name!r}: neither a file nor a packaged tree (row-4, lab-2)")


@dataclass
class NodeMeter:
    """One node's trip models (``feed.py``), fed the instant flow (W) at each refresh."""

    budget_w: float
    breaker: Breaker | None
    volts: float
    ups: Ups | None
    transient_factor: float

    def step(self, t: float, load_w: float, dt_s: float) -> None:
        if self.breaker is not None:
            self.breaker.step(t, load_w / self.volts, dt_s)
        if self.ups is not None:
            self.ups.step(t, load_w, dt_s)

    def tolerance_s(self, limits_w: float) -> float:
        """Seconds the trip models allow a steady flow of ``limits_w`` (wall W of limits:
        what the cards may draw on average): the breaker on that average, the UPS on its
        peak (x ``transient_factor``, the host's draw counted as spiking too). The least."""
        out = math.inf
        if self.breaker is not None:
            out = min(out, Breaker.trip_time_s(limits_w / self.volts / self.breaker.rating_a))
        if self.ups is not None:
            out = min(out, Ups.trip_time_s(limits_w * self.transient_factor / self.ups.rating_w))
        return out

    def rating_w(self) -> float:
        return self.ups.rating_w if self.ups is not None else self.breaker.rating_a * self.volts if self.breaker else math.inf

    def trips(self) -> list[str]:
        return [f"{dev} at {m.tripped_at:g} s" for dev, m in (("breaker", self.breaker), ("UPS", self.ups))
                if m is not None and m.tripped_at is not None]


@dataclass
class Client:
    """One host's place in the store model: what it holds there and offers its cards."""

    host: SimHost
    held_w: float  # in the store (reserve + grant, wall W)
    in_use_w: float  # offered to the cards (<= held_w)
    next_poll: float
    published_w: float  # its last published want (reserve + want, wall W)
    policy: GrantPolicy
    woken_at: float | None = None  # a round woken for the cards coming down is due then (s)
    woken: WakeBudget = field(default_factory=WakeBudget)  # the rounds a change may start early


@dataclass
class Spells:
    """When each surviving node's flow was last over its budget after the loss."""

    last_over: dict[str, float] = field(default_factory=dict)

    def note(self, t: float, over: dict[str, float]) -> None:
        for node in over:
            self.last_over[node] = t

    def shed_s(self, lost_at: float, tick_s: float) -> float | None:
        """From the loss until the last tick over, plus that tick; 0 when never over."""
        if not self.last_over:
            return 0.0
        return round(max(self.last_over.values()) + tick_s - lost_at, 3)


def _meters(tree: PowerTree, file: TreeFile) -> dict[str, NodeMeter]:
    out = {}
    for name, table in file.nodes.items():
        breaker = Breaker(table.breaker_a) if table.breaker_a is not None else None
        ups = Ups(table.ups_w) if table.ups_w is not None else None
        out[name] = NodeMeter(tree.nodes[name].budget_w, breaker, table.volts or 1.0, ups, table.transient_factor)
    return out


def _own_wall_w(scenario: str) -> float:
    sc = load_scenario(scenario)
    return feed_from_dict(sc.feed).wall_w(sc.budget_w)


def run_tree(
    tree_file: str,
    *,
    policy: str = "oversubscribed",
    duration_s: float = 120.0,
    lost_at_s: float | None = None,
    poll_s: float = 1.0,
    release_hold_s: float = 10.0,
    step_w: float = 20.0,
    seed: int = 1,
) -> dict[str, Any]:
    """Run the tree file's hosts under ``policy`` for ``duration_s`` virtual s, the
    file's ``[sim] feed_lost`` lost at ``lost_at_s`` (default: the file's ``lost_at_s``,
    half-way through a run that ends before it). Returns work (TGP-s), trips per node,
    the worst overs outside the stated shed time (records: seats plus grants; limits:
    the cards' bounds at the wall), the shed times (s) and the surviving devices'
    tolerance. Raises ScenarioError for a tree or scenario that cannot be found and
    ConfigError for a bad tree file."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}")
    base, file = load_tree(tree_path(tree_file))
    missing = sorted(set(base.hosts) - set(file.sim.scenarios))
    if missing:
        raise ScenarioError(f"{tree_file}: [sim] scenarios names no scenario for {', '.join(missing)}")
    floors = {h: floor_wall_w(load_scenario(file.sim.scenarios[h])) for h in base.hosts}
    below = [f"{tree_file}: hosts.{h}.reserve_w: {host.reserve_w:.0f} W is below the floor of its scenario "
             f"{file.sim.scenarios[h]} ({floors[h]:.0f} W at the wall: every card at its minimum limit)"
             for h, host in sorted(base.hosts.items()) if host.reserve_w < floors[h]]
    if below:
        raise ScenarioError("\n".join(below))
    declared = [p.shed_s for p in base.pairs.values() if p.mode == "oversubscribed" and p.shed_s is not None]
    shed_given = max(declared, default=DEFAULT_SHED_S)
    tree = _policy_tree(base, policy, shed_given)
    oversubscribed = any(tree.mode_of(h) == "oversubscribed" for h in tree.hosts)
    modes = sorted({tree.mode_of(h) for h in tree.hosts if tree.pair_of(h) is not None})
    mode = "/".join(modes) or "single-corded"
    feed_lost = file.sim.feed_lost
    lost_at = lost_at_s if lost_at_s is not None else file.sim.lost_at_s
    if lost_at is None or lost_at >= duration_s:  # a run shorter than the file's: half-way
        lost_at = duration_s / 2
    timings = Timings(tick_s=0.1)
    static_w = divide(tree, {h: _own_wall_w(file.sim.scenarios[h]) for h in tree.hosts}) if policy == "static" else {}
    short = sorted(h for h, w in static_w.items() if w < floors[h])
    if short:
        first = short[0]
        raise PolicyRefused(f"the redundant division leaves {len(short)} host(s) below the floor (first: {first}, "
                            f"{static_w[first]:.0f} W < {floors[first]:.0f} W): the tree fits only with oversubscribed pairs")
    clients = {}
    for i, (name, host) in enumerate(sorted(tree.hosts.items())):
        sc = load_scenario(file.sim.scenarios[name])
        seat = static_w[name] if policy == "static" else host.reserve_w
        kind = policy if policy in ("static", "oracle") else "circuit"
        sim_host = make_host(name, sc, seat, timings, seed + i, kind)
        reserve = sim_host.power.reserve_w
        clients[name] = Client(sim_host, reserve, reserve, poll_s * i / len(tree.hosts), reserve,
                               GrantPolicy(step_w, release_hold_s))
    # The store's tree: each host's seat its reserve (as ``CircuitStore.read`` builds it).
    store_tree = tree.with_reserves({n: c.host.power.reserve_w for n, c in clients.items()})
    meters = _meters(tree, file)
    limits_spells, draw_spells = Spells(), Spells()
    worst_instant: dict[str, float] = {}
    worst_limits: dict[str, float] = {}
    records_over_w = limits_over_w = 0.0
    above_fair_ws = 0.0  # watt-seconds held in use above the oracle's share of the true wants
    k = 0
    while (t := round(k * timings.tick_s, 9)) <= duration_s:
        lost = feed_lost if feed_lost is not None and t >= lost_at else None
        live = {h for hs in tree.coefficients(lost, flow=True).values() for h in hs}
        wants = {h: c.host.power.reserve_w + c.host.want_w(t) for h, c in clients.items()}
        # The oracle's: the declared tree over the true wants, the room left up to each nameplate.
        fair = divide(base, wants, lost, {h: c.host.power.reserve_w + c.host.ceiling_w() for h, c in clients.items()})
        for name, c in clients.items():
            if name not in live:
                continue  # no live cord: the host is down
            h = c.host
            h.bank.advance_to(t)
            if policy == "oracle":
                c.held_w = c.in_use_w = fair[name]
            elif policy != "static" and t >= c.next_poll:
                c.next_poll += poll_s
                c.woken_at = None  # a woken round due: this one reads what woke it, and spends nothing
                _round(store_tree, clients, c, t, lost)
            if policy != "static":
                h.keeper.arbiter.offer("circuit", h.power.board_w(c.in_use_w), t)
            h.keeper.apply(h.ctl, t)
            h.ctl.tick(t)
            if policy not in ("static", "oracle"):
                wake_for_cards(store_tree, clients, c, t, lost)
        above_fair_ws += timings.tick_s * sum(max(0.0, c.in_use_w - fair[n]) for n, c in clients.items() if n in live)
        limits = {n: _wall(c, "limit") for n, c in clients.items() if n in live and c.host.ctl.ready}
        draw = {n: _wall(c, "avg") for n, c in clients.items() if n in live}
        instant = tree.loads_w({n: _wall(c, "instant") for n, c in clients.items() if n in live}, lost, flow=True)
        for node, load in instant.items():
            meters[node].step(t, load, timings.tick_s)
        records = {n: c.held_w for n, c in clients.items() if n in live}
        over_records = tree.over_w(records, lost)  # committed; the flow once a feed is lost
        over_limits = tree.over_w(limits, lost, flow=True)
        if lost is not None:
            limits_spells.note(t, over_limits)
            draw_spells.note(t, tree.over_w(draw, lost, flow=True))
            flow = tree.loads_w(limits, lost, flow=True)
            for node in over_limits:  # while its shed lasts
                worst_instant[node] = max(worst_instant.get(node, 0.0), instant[node])
                worst_limits[node] = max(worst_limits.get(node, 0.0), flow[node])
        if lost is None or t >= lost_at + (shed_given if oversubscribed else 0.0):
            records_over_w = max(records_over_w, *over_records.values(), 0.0)
            limits_over_w = max(limits_over_w, *over_limits.values(), 0.0)
        k += 1
    shed = limits_spells.shed_s(lost_at, timings.tick_s) if feed_lost is not None else None
    return {
        "policy": policy, "mode": mode, "hosts": len(clients), "feed_lost": feed_lost, "lost_at_s": lost_at,
        "duration_s": duration_s, "shed_s_stated": shed_given if oversubscribed else None,
        "above_oracle_share_ws": round(above_fair_ws, 1),
        "work_tgp_s": round(sum(sum(c.host.meters.work) for c in clients.values()), 1),
        "trips": {n: m.trips() for n, m in meters.items() if m.trips()},
        "records_over_w": round(records_over_w, 1), "limits_over_w": round(limits_over_w, 1),
        "shed_s": shed, "draw_shed_s": draw_spells.shed_s(lost_at, timings.tick_s) if feed_lost is not None else None,
        "survivors": _survivors(meters, worst_limits, worst_instant, shed),
    }


def _wall(c: Client, what: str) -> float:
    """A host's wall power (W) from its cards: the sum of limits that may be in force,
    the 1 s average draw, or the instant draw, through its feed model."""
    bank = c.host.bank
    if what == "limit":
        board = bank.sum_limit_bound_mw() / 1000
    else:
        board = sum(card.avg_w if what == "avg" else card.instant_w for card in bank.cards)
    return c.host.power.feed.wall_w(board)


def _round(tree: PowerTree, clients: dict[str, Client], c: Client, t: float, lost: str | None) -> None:
    """One host's round in the store model (module docstring): ``tree`` is the store's,
    each host's seat its reserve."""
    h = c.host
    c.published_w = h.power.reserve_w + round(h.seen_want_w() / 5) * 5.0
    seats = {n: o.host.power.reserve_w for n, o in clients.items()}
    root = next(n for n in tree.nodes.values() if n.parent is None)
    view = CircuitView(root.budget_w, seats, {n: o.held_w - seats[n] for n, o in clients.items() if o.held_w > seats[n]},
                       {n: o.published_w - seats[n] for n, o in clients.items()}, tree=tree, lost=lost,
                       ceilings={n: o.host.ceiling_w() for n, o in clients.items()})
    seat = seats[h.name]
    target = seat + c.policy.target_w(view, h.name, c.held_w - seat, t)
    if target > c.held_w and c.in_use_w == c.held_w:
        if raise_allowed(view, h.name, target - seat):
            c.held_w = c.in_use_w = target
        return
    if target < c.in_use_w:
        c.in_use_w = target  # the cards first
    _lower_record(c)


def _lower_record(c: Client) -> None:
    """At a round, the store follows the cards down as far as their bound has come (held
    and in use are seat plus grant here; ``HostPower.lowered_grant_w``)."""
    h = c.host
    seat = h.power.reserve_w
    lowered = seat + h.power.lowered_grant_w(c.held_w - seat, c.in_use_w - seat, h.bank.sum_limit_bound_mw() / 1000)
    if lowered <= c.in_use_w + 1e-6:
        c.held_w = c.in_use_w
    elif lowered < c.held_w - 1e-9:
        c.held_w = lowered


def wake_for_cards(tree: PowerTree, clients: dict[str, Client], c: Client, t: float, lost: str | None) -> None:
    """After a host's tick: once its cards are all the way down to the grant in use, a
    round, ``WAKE_GAP_S`` later (a woken round's least gap) and within the host's wake
    budget (``core.circuit.WakeBudget``), as the daemon's channel wakes one then
    (``CircuitChannel.on_tick``) instead of waiting for its next poll."""
    if c.woken_at is not None:
        if t >= c.woken_at - 1e-9:
            c.woken_at = None
            c.woken.spend(t)
            _round(tree, clients, c, t, lost)
        return
    seat = c.host.power.reserve_w
    if c.host.power.given_back(c.held_w - seat, c.in_use_w - seat, c.host.bank.sum_limit_bound_mw() / 1000):
        c.woken_at = t + max(WAKE_GAP_S, c.woken.wait_s(t))


def _survivors(meters: dict[str, NodeMeter], worst_limits_w: dict[str, float], worst_instant_w: dict[str, float],
               shed_s: float | None) -> list[dict[str, Any]]:
    """Each surviving node with a trip model that was over its budget after the loss:
    the worst flow of limits while over (what its hosts may draw), the trip models'
    tolerance at that flow held steady (``NodeMeter.tolerance_s``), the margin to the
    shed, and the worst instant load the trip models were fed meanwhile."""
    out = []
    for node, limits in sorted(worst_limits_w.items()):
        m = meters[node]
        if m.breaker is None and m.ups is None:
            continue
        tolerance = m.tolerance_s(limits)
        out.append({"node": node, "budget_w": round(m.budget_w, 1), "worst_limits_w": round(limits, 1),
                    "worst_instant_w": round(worst_instant_w[node], 1),
                    "instant_of_rating": round(worst_instant_w[node] / m.rating_w(), 3),
                    "tolerance_s": None if math.isinf(tolerance) else round(tolerance, 1),
                    "margin_s": None if math.isinf(tolerance) or shed_s is None else round(tolerance - shed_s, 1)})
    return out


def compare(tree_file: str, **kw: Any) -> dict[str, Any]:
    """Every policy on the same tree and feed loss; work against the oracle's. A policy
    the tree cannot be played under is ``{"policy", "refused"}`` (why, one line)."""
    out: dict[str, Any] = {}
    for p in POLICIES:
        try:
            out[p] = run_tree(tree_file, policy=p, **kw)
        except PolicyRefused as exc:
            out[p] = {"policy": p, "refused": str(exc)}
    oracle = out["oracle"].get("work_tgp_s")
    for r in out.values():
        if "refused" not in r:
            r["work_vs_oracle"] = round(r["work_tgp_s"] / oracle, 3) if oracle else None
    return out


def format_compare(result: dict[str, Any]) -> str:
    """The scoreboard: work, trips, the worst overs outside the shed, the shed times, and
    the surviving devices' tolerance against the shed; a line for each policy not played
    and for each that did more work than the oracle (why)."""
    played = {n: r for n, r in result.items() if "refused" not in r}
    first = next(iter(played.values()))
    lines = [f"power tree: {first['hosts']} hosts, {first['duration_s']:g} s, "
             f"{first['feed_lost'] or 'no feed'} lost at {first['lost_at_s']:g} s",
             f"  {'split':<15} {'work TGP-s':>10} {'vs oracle':>9} {'trips':>6} {'over W (records/limits)':>24} "
             f"{'shed s (limits/draw)':>21}"]
    for name, r in result.items():
        if "refused" in r:
            lines.append(f"  {name:<15} not played: {r['refused']}")
            continue
        shed = "-" if r["shed_s"] is None else f"{r['shed_s']:g} / {r['draw_shed_s']:g}"
        lines.append(f"  {name:<15} {r['work_tgp_s']:>10g} {r['work_vs_oracle']!s:>9} {len(r['trips']):>6} "
                     f"{r['records_over_w']:>11g} / {r['limits_over_w']:<10g} {shed:>21}")
    for name, r in played.items():
        for node, trips in r["trips"].items():
            lines.append(f"  {name}: {node} tripped: {', '.join(trips)}")
        if name != "oracle" and (r["work_vs_oracle"] or 0) > 1:
            lines.append(f"  {name}: {r['work_vs_oracle']} of the oracle: the oracle is the fair division of the true "
                         f"wants every tick, not the most work; {name} held {r['above_oracle_share_ws']:g} W-s in use "
                         "above those shares (a grant kept through its release hold, a static seat above its share)")
    for name, r in played.items():
        if r["shed_s"] is None or r["shed_s_stated"] is None:
            continue
        lines.append(f"  {name}: shed in {r['shed_s']:g} s (stated {r['shed_s_stated']:g} s)" + (
            "; the surviving side while it was over its budget:" if r["survivors"] else
            "; no surviving node with a breaker or UPS went over its budget"))
        for s in r["survivors"]:
            tol = "holds for good" if s["tolerance_s"] is None else f"trips after {s['tolerance_s']:g} s, margin {s['margin_s']:g} s"
            lines.append(f"    {s['node']:<8} budget {s['budget_w']:g} W, limits up to {s['worst_limits_w']:g} W: {tol} "
                         f"(instant load seen: {s['worst_instant_w']:g} W, {100 * s['instant_of_rating']:.0f} % of its rating)")
    return "\n".join(lines)
