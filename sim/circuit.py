"""A circuit of simulated hosts on virtual time: static reserves vs sharing vs an oracle.

N hosts, each a packaged scenario's bank under the real controller, hang off one circuit
(wall W). Three ways to split it:

- ``static``: each host holds its share of the circuit for good (proportional to its
  scenario's own budget at the wall);
- ``circuit``: each host has a seat (``reserve_fraction`` of its static share) and
  shares the rest through :class:`LeaseStore`, a model of etcd with the same lease TTL
  and compare-on-revision transactions, using the product's own pure parts
  (``GrantPolicy``, ``Fence``, ``HostPower``, ``raise_allowed``); the client follows the
  daemon's rules (raise in the store first; lower the offer first and the store as
  the cards come down; the fence from the last acknowledged keepalive);
- ``oracle``: the same seats, and each host's grant every tick is its max-min fair
  share of the pool over the hosts' true wants (clairvoyant, no lease, no hysteresis,
  writes land at once): the best the sharing rule itself can do, not a work-optimal
  split (static shares can beat it where they happen to follow the demand).

An etcd outage (``outage_at_s``, ``outage_s``): the store answers nothing; hosts fall to
their reserves at their fences; reported: work, and seconds each host spent at its
reserve from the outage's start until its grant was in use again.

This model is the simulator's, never the product's: the daemon talks to a real etcd.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from powerbudgetd.control.controller import Controller
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.circuit import WAKE_GAP_S, CircuitView, Fence, GrantPolicy, HostPower, WakeBudget, raise_allowed
from powerbudgetd.core.fair import max_min_fair
from powerbudgetd.core.fairshare import fair_shares
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.model import Timings
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim.feed import feed_from_dict
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.meters import BankMeters
from powerbudgetd_sim.physics import SimBank
from powerbudgetd_sim.scenario import Scenario, load_scenario
from powerbudgetd.control.budgetkeeper import BudgetKeeper

POLICIES = ("static", "circuit", "oracle")
OUTAGE_S = 30.0  # the etcd outage compare() plays, from half the run


@dataclass
class LeaseStore:
    """etcd as the circuit uses it: seats (persistent), grants and wants (leased), one
    revision counter, leases that expire TTL after their last keepalive, and outages
    during which nothing answers."""

    budget_w: float
    ttl_s: float
    outages: list[tuple[float, float]] = field(default_factory=list)
    revision: int = 1
    seats: dict[str, float] = field(default_factory=dict)
    grants: dict[str, tuple[float, int]] = field(default_factory=dict)  # host: (W, lease)
    wants: dict[str, tuple[float, int]] = field(default_factory=dict)
    leases: dict[int, float] = field(default_factory=dict)  # id: expires at (s)
    changed_rev: int = 1  # the last revision that changed a seat or a grant
    max_committed_w: float = 0.0
    _next_lease: int = 1

    def up(self, t: float) -> bool:
        return not any(a <= t < a + d for a, d in self.outages)

    def expire(self, t: float) -> None:
        """Leases past their TTL take their keys (the server side, on its own clock)."""
        dead = {lid for lid, exp in self.leases.items() if exp <= t}
        if not dead:
            return
        for lid in dead:
            del self.leases[lid]
        for table in (self.grants, self.wants):
            for host in [h for h, (_, lid) in table.items() if lid in dead]:
                del table[host]
                self.revision += 1
                if table is self.grants:
                    self.changed_rev = self.revision

    def grant(self, t: float) -> int:
        lid, self._next_lease = self._next_lease, self._next_lease + 1
        self.leases[lid] = t + self.ttl_s
        return lid

    def keepalive(self, t: float, lid: int) -> bool:
        if lid not in self.leases:
            return False
        self.leases[lid] = t + self.ttl_s
        return True

    def view(self) -> tuple[CircuitView, int]:
        return CircuitView(self.budget_w, dict(self.seats), {h: w for h, (w, _) in self.grants.items()},
                           {h: w for h, (w, _) in self.wants.items()}, revision=self.revision), self.revision

    def _bump(self, grant_or_seat: bool) -> None:
        self.revision += 1
        if grant_or_seat:
            self.changed_rev = self.revision
        committed = sum(self.seats.values()) + sum(w for w, _ in self.grants.values())
        self.max_committed_w = max(self.max_committed_w, committed)

    def seat(self, host: str, reserve_w: float) -> None:
        self.seats[host] = reserve_w
        self._bump(True)

    def put_want(self, host: str, want_w: float, lid: int) -> bool:
        if lid not in self.leases:
            return False
        self.wants[host] = (want_w, lid)
        self._bump(False)
        return True

    def raise_grant(self, read_rev: int, host: str, grant_w: float, lid: int) -> bool:
        """The transaction: fails when a seat or grant changed since ``read_rev``."""
        if self.changed_rev > read_rev or lid not in self.leases:
            return False
        self.grants[host] = (grant_w, lid)
        self._bump(True)
        return True

    def lower_grant(self, host: str, grant_w: float, lid: int) -> None:
        if grant_w <= 0:
            self.grants.pop(host, None)
        elif lid in self.leases:
            self.grants[host] = (grant_w, lid)
        self._bump(True)


@dataclass
class SimHost:
    """One host: its bank, controller and meters; its circuit client's state."""

    name: str
    sc: Scenario
    power: HostPower
    static_w: float
    bank: SimBank
    ctl: Controller
    meters: BankMeters
    policy: GrantPolicy
    keeper: BudgetKeeper
    lease: int | None = None
    valid_until: float = float("-inf")
    held_w: float = 0.0
    in_use_w: float = 0.0
    next_poll: float = 0.0
    woken: WakeBudget = field(default_factory=WakeBudget)  # the rounds a change may start early
    woken_round: bool = False  # next_poll is a woken round's, not the poll's
    last_keepalive: float = float("-inf")
    at_reserve_since: float | None = None
    reserve_spells: list[tuple[float, float]] = field(default_factory=list)

    def want_w(self, t: float) -> float:
        """True demand above the reserve (wall W): what each card would draw unlimited."""
        board = sum(min(c.max_mw / 1000, max(c.min_mw / 1000, c.spec.profile.demand_w(t, c.spec.idle_w, c.spec.board_tgp_w)))
                    for c in self.bank.cards)
        return max(0.0, self.power.feed.wall_w(board) - self.power.reserve_w)

    def ceiling_w(self) -> float:
        """The most this host could use above its reserve (wall W): its nameplate, every
        card at its maximum limit, through its feed model (as the daemon publishes it)."""
        return max(0.0, self.power.feed.wall_w(sum(c.max_mw for c in self.bank.cards) / 1000) - self.power.reserve_w)

    def seen_want_w(self) -> float:
        """What the daemon can see: the controller's own account (as ``HostPower.want_w``)."""
        return self.power.want_w(self.ctl.snapshot(self.bank.now))


def host_feed(sc: Scenario) -> Feed:
    """A scenario's feed model (300 W of host draw where it states none)."""
    feed = feed_from_dict(sc.feed) if sc.feed else Feed(psu_efficiency=0.9, host_w=300.0)
    if feed.host_w is None:
        feed = Feed(psu_efficiency=feed.psu_efficiency, host_w=300.0)
    return feed


def floor_wall_w(sc: Scenario) -> float:
    """The least seat a scenario's host can hold (wall W): every card at its minimum
    limit, through its feed model, and a watt of rounding."""
    return host_feed(sc).wall_w(sum(c.min_w for c in sc.cards)) + 1.0


def _host(name: str, sc: Scenario, share_w: float, reserve_fraction: float, timings: Timings, seed: int,
          policy: str, release_hold_s: float, step_w: float) -> SimHost:
    feed = host_feed(sc)
    # The oracle's bank applies writes at once (as the single-host oracle's does).
    bank = SimBank(list(sc.cards), lag_s=0.0 if policy == "oracle" else sc.lag_s, seed=seed, events=list(sc.events))
    # A seat holds at least the bank's floor (every card at its minimum limit).
    reserve = share_w if policy == "static" else max(floor_wall_w(sc), share_w * reserve_fraction)
    power = HostPower(feed, reserve)
    nvml = Nvml(SimNvmlLibrary(bank, []))
    nvml.init()
    ctl = Controller(nvml, power.board_budget_w(), timings)
    ctl.start()
    shares = fair_shares(int(power.board_budget_w() * 1000), [c.min_mw for c in bank.cards],
                         [c.max_mw for c in bank.cards]) or [c.min_mw for c in bank.cards]
    meters = BankMeters(bank, power.board_budget_w(), shares, None).attach()
    keeper = BudgetKeeper(BudgetArbiter(power.board_budget_w() if policy == "static" else 1e6))
    return SimHost(name, sc, power, share_w, bank, ctl, meters, GrantPolicy(step_w, release_hold_s), keeper)


def make_host(name: str, sc: Scenario, reserve_w: float, timings: Timings, seed: int, policy: str) -> SimHost:
    """One host for another model of sharing (``tree.py``): its seat ``reserve_w`` (wall
    W; at least its bank's floor), under ``policy`` (``static``: held at the seat;
    ``circuit``: the arbiter takes offers; ``oracle``: the same, writes landing at once)."""
    return _host(name, sc, reserve_w, 1.0, timings, seed, policy, release_hold_s=10.0, step_w=20.0)


def run_circuit(
    scenarios: list[str],
    *,
    policy: str = "circuit",
    duration_s: float = 300.0,
    tightness: float = 0.85,
    reserve_fraction: float = 0.6,
    ttl_s: float = 10.0,
    poll_s: float = 1.0,
    lower_s: float = 2.2,
    release_hold_s: float = 10.0,
    step_w: float = 20.0,
    outage_at_s: float | None = None,
    outage_s: float = 0.0,
    seed: int = 1,
) -> dict[str, Any]:
    """Run ``scenarios`` (one host each) on one circuit under ``policy`` for
    ``duration_s`` virtual s. The circuit's budget is ``tightness`` x the sum of the
    scenarios' own budgets at the wall. Returns work (TGP-s), the worst wall sum of
    limits against the budget, and the outage's time at reserve per host."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}")
    scs = [load_scenario(s) for s in scenarios]
    timings = Timings(tick_s=0.1)
    walls = []
    for sc in scs:
        feed = feed_from_dict(sc.feed) if sc.feed else Feed(psu_efficiency=0.9, host_w=300.0)
        walls.append(feed.wall_w(sc.budget_w) if feed.host_w is not None else (sc.budget_w + 300) / 0.9)
    budget_w = tightness * sum(walls)
    shares = [budget_w * w / sum(walls) for w in walls]
    hosts = [_host(f"h{i}-{sc.name}", sc, share, reserve_fraction, timings, seed + i, policy, release_hold_s, step_w)
             for i, (sc, share) in enumerate(zip(scs, shares))]
    store = LeaseStore(budget_w, ttl_s, [(outage_at_s, outage_s)] if outage_at_s is not None else [])
    for h in hosts:
        store.seat(h.name, h.power.reserve_w)
    fence = Fence(lower_s=lower_s)
    worst_wall = 0.0
    k = 0
    while (t := round(k * timings.tick_s, 9)) <= duration_s:
        store.expire(t)
        if policy == "oracle":
            pool = budget_w - sum(h.power.reserve_w for h in hosts)
            fair = max_min_fair(pool, {h.name: h.want_w(t) for h in hosts})
        for h in hosts:
            h.bank.advance_to(t)
            reserve_board = h.power.board_budget_w()
            if policy == "circuit":
                _client_round(h, store, fence, t, poll_s)
                grant = h.in_use_w if t < h.valid_until else 0.0
                # As the daemon: the grant is an offer that lapses to the reserve at the fence.
                h.keeper.arbiter.offer("circuit", h.power.board_budget_w(h.in_use_w), t,
                                       expires_at_s=h.valid_until, expired_w=reserve_board)
            elif policy == "oracle":
                grant = fair[h.name]
                h.keeper.arbiter.offer("circuit", h.power.board_budget_w(grant), t)
            else:
                grant = 0.0
            _track_reserve(h, t, grant, outage_at_s)
            h.keeper.apply(h.ctl, t)
            h.ctl.tick(t)
            if policy == "circuit" and h.power.given_back(h.held_w, h.in_use_w, h.bank.sum_limit_bound_mw() / 1000):
                # The cards are down to the grant in use: as the daemon's channel, a round
                # woken a wake gap later (within its wake budget) lowers the store's.
                woken_at = t + max(WAKE_GAP_S, h.woken.wait_s(t))
                if woken_at < h.next_poll:
                    h.next_poll, h.woken_round = woken_at, True
        wall = sum(h.power.feed.wall_w(h.bank.sum_limit_bound_mw() / 1000) for h in hosts if h.ctl.ready)
        worst_wall = max(worst_wall, wall)
        k += 1
    for h in hosts:
        if h.at_reserve_since is not None:
            h.reserve_spells.append((h.at_reserve_since, duration_s))
    work = sum(sum(h.meters.work) for h in hosts)
    after = {}
    if outage_at_s is not None:
        for h in hosts:
            spell = next(((a, b) for a, b in h.reserve_spells if a <= outage_at_s + 1e-9 < b or a >= outage_at_s), None)
            after[h.name] = None if spell is None else round(spell[1] - max(spell[0], outage_at_s), 1)
    return {
        "policy": policy, "hosts": [h.name for h in hosts], "budget_w": round(budget_w, 1),
        "seats_w": round(sum(h.power.reserve_w for h in hosts), 1), "work_tgp_s": round(work, 1),
        "worst_wall_w": round(worst_wall, 1), "within_budget": worst_wall <= budget_w + 1e-6,
        "store_max_committed_w": round(store.max_committed_w, 1),
        "at_reserve_after_outage_s": after,
    }


def _client_round(h: SimHost, store: LeaseStore, fence: Fence, t: float, poll_s: float) -> None:
    """The daemon's circuit round on virtual time (see ``channels.circuit.channel``)."""
    if t < h.next_poll:
        return
    if h.woken_round:
        h.woken.spend(t)
    h.next_poll, h.woken_round = t + poll_s, False
    if not store.up(t):
        return
    if h.lease is None or h.lease not in store.leases:
        if h.lease is not None:  # gone: the grant with it
            h.held_w = h.in_use_w = 0.0
        h.lease = store.grant(t)
        h.valid_until = fence.valid_until(t, store.ttl_s)
        h.last_keepalive = t
    if t - h.last_keepalive >= store.ttl_s / 6:
        store.keepalive(t, h.lease)
        h.last_keepalive = t
        h.valid_until = fence.valid_until(t, store.ttl_s)
    store.put_want(h.name, round(h.seen_want_w() / 5) * 5.0, h.lease)
    view, rev = store.view()
    allowed = t < h.valid_until
    target = h.policy.target_w(view, h.name, h.held_w, t) if allowed else 0.0
    if target > h.held_w and h.in_use_w == h.held_w:
        if raise_allowed(view, h.name, target) and store.raise_grant(rev, h.name, target, h.lease):
            h.held_w = h.in_use_w = target
        return
    if target < h.in_use_w:
        h.in_use_w = target
    lowered = h.power.lowered_grant_w(h.held_w, h.in_use_w, h.bank.sum_limit_bound_mw() / 1000)
    if lowered < h.held_w:
        store.lower_grant(h.name, lowered, h.lease)
        h.held_w = lowered


def _track_reserve(h: SimHost, t: float, grant_w: float, outage_at_s: float | None) -> None:
    if grant_w <= 0 and h.at_reserve_since is None:
        h.at_reserve_since = t
    elif grant_w > 0 and h.at_reserve_since is not None:
        h.reserve_spells.append((h.at_reserve_since, t))
        h.at_reserve_since = None


def compare(scenarios: list[str], **kw: Any) -> dict[str, Any]:
    """Every policy on the same hosts; the circuit also with an etcd outage."""
    out = {p: run_circuit(scenarios, policy=p, **kw) for p in POLICIES}
    oracle = out["oracle"]["work_tgp_s"]
    for r in out.values():
        r["work_vs_oracle"] = round(r["work_tgp_s"] / oracle, 3) if oracle else None
    duration = kw.get("duration_s", 300.0)
    outage = run_circuit(scenarios, policy="circuit", outage_at_s=duration / 2, outage_s=OUTAGE_S, **kw)
    outage["work_vs_oracle"] = round(outage["work_tgp_s"] / oracle, 3) if oracle else None
    outage["outage_at_s"], outage["duration_s"] = duration / 2, duration
    out["circuit_outage_30s"] = outage
    return out


def format_compare(result: dict[str, Any]) -> str:
    """The comparison as a table: work, against the oracle grants, the worst wall sum."""
    first = next(iter(result.values()))
    lines = [f"circuit {first['budget_w']:g} W at the wall, hosts: {', '.join(first['hosts'])}",
             f"  {'split':<20} {'seats W':>8} {'work TGP-s':>11} {'vs oracle':>9} {'worst wall W':>12}"]
    for name, r in result.items():
        lines.append(f"  {name:<20} {r['seats_w']:>8g} {r['work_tgp_s']:>11g} {r['work_vs_oracle']:>9} "
                     f"{r['worst_wall_w']:>12g}{'' if r['within_budget'] else '  OVER'}")
    run = result.get("circuit_outage_30s", {})
    outage = run.get("at_reserve_after_outage_s")
    if outage:
        at, duration = run.get("outage_at_s"), run.get("duration_s")
        cut = at is not None and duration is not None and at + OUTAGE_S > duration
        head = (f"the run ended {duration - at:g} s into a {OUTAGE_S:g} s etcd outage (a --duration of "
                f"{2 * OUTAGE_S:g} s or more sees it end); s at reserve per host until then: " if cut
                else f"after a {OUTAGE_S:g} s etcd outage, s at reserve per host: ")
        lines.append("  " + head + ", ".join(f"{h} {s:g}" for h, s in outage.items() if s is not None))
    return "\n".join(lines)
