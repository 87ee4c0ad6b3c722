"""What an operator would run instead of powerbudgetd, and the best any controller could do.

Every policy has the shape the scoreboard drives: ``start()``, then ``tick(now)`` every
tick (returns how many limits it wrote), ``ready`` (the boot limits are in force) and
``role(index)``. The first three talk to the simulated bank through the production NVML
layer (:class:`powerbudgetd.hw.nvml.Nvml` over the real bindings on the simulated NVML library), so they see the same
readings, read-back and limit lag as powerbudgetd:

- :class:`StaticPolicy`: every card at budget / N forever — ``nvidia-smi -pl`` in a boot
  unit, or DCGM's group power budget.
- :class:`SlurmPolicy`: the rules of Slurm's power plugin as the brief gives them; every
  30 s, from each card's mean draw since the last balance (energy counter): cut a card
  drawing under 90 % of its cap by half its slack, at most 50 % of (max - min); keep a
  card at 90-95 %; raise a card above 95 % by at most 20 % of (max - min); a card whose
  job started in the last 300 s gets an even split of what is left, up to its max.
- :class:`ReactivePolicy`: boots every card at max and cuts every card to budget / N
  when the summed 1 s average draw reaches 95 % of the budget; back to max after 5 s
  under 80 % (the capping and uncapping bands of a data-centre capper). The design the
  brief warns against: its limits sum above the budget whenever it is not cutting.
- :class:`OraclePolicy`: knows each card's demand at the next refresh, writes limits
  with no lag, and each tick splits the budget to maximise work (see :func:`allocate`).
  No controller can do better within the budget: the upper bound of the scoreboard.
- :class:`CausalOraclePolicy`: the same allocation on the demand a controller could have
  seen — the latest refresh, not the next one — written with the scenario's limit lag,
  every decrease confirmed (in force) before an increase that needs its watts. What
  perfect knowledge of each card's demand and work curve is worth to a controller that
  obeys the same timing and ordering as powerbudgetd.
- :class:`RuledCausalOraclePolicy`: the causal oracle held to the rules powerbudgetd
  is scored under (reversals per card per 10 s, writes per card per minute, the
  smallest move worth a write): the like-for-like bar. Greedy, so a bar, not a bound.

Static and Slurm order their writes as powerbudgetd does (decreases first, increases
only into the budget minus the limits that may be in force), so that they keep the
budget: the comparison is about how watts are shared, not about write ordering.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from powerbudgetd.errors import NvmlError
from powerbudgetd.core.fairshare import fair_shares, waterfill
from powerbudgetd.core.model import Timings
from powerbudgetd.core.units import to_mw
from powerbudgetd.hw.card import CardBackend, GpuInfo, PowerReading
from powerbudgetd.core.plan import Step, Write, plan_writes
from powerbudgetd_sim.meters import FLAP_WINDOW_S, MAX_REVERSALS, MAX_WRITES_PER_MIN
from powerbudgetd_sim.physics import REFRESH_S, SimBank, SimCard
from powerbudgetd_sim.work import POWER_FRACTIONS, work_rate

_RULE_MARGIN_S = 0.2  # a write shows on the enforced limit a lag and a refresh later

JobStart = Callable[[int, float], "float | None"]  # (card index, now) -> job start s, None if idle


class NvmlPolicy:
    """Shared plumbing of the baselines that drive the bank through the NVML layer."""

    name = "nvml"

    def __init__(self, nvml: CardBackend, budget_w: float) -> None:
        self.nvml = nvml
        self.budget_mw = int(budget_w * 1000)  # rounded down: toward safety
        self.ready = False
        self.cards: list[GpuInfo] = []
        self.min_mw: list[int] = []
        self.max_mw: list[int] = []
        self.share_mw: list[int] = []
        self.readings: list[PowerReading | None] = []

    def start(self) -> None:
        """Enumerate the cards and their fair shares. Raises ValueError when the
        minimum limits sum above the budget."""
        self.cards = [c for c in self.nvml.devices() if c.min_limit_w is not None and c.max_limit_w is not None]
        self.min_mw = [to_mw(c.min_limit_w) for c in self.cards]  # type: ignore[arg-type]
        self.max_mw = [to_mw(c.max_limit_w) for c in self.cards]  # type: ignore[arg-type]
        shares = fair_shares(self.budget_mw, self.min_mw, self.max_mw)
        if shares is None:
            raise ValueError(
                f"budget {self.budget_mw / 1000:g} W is below the minimum limits' sum {sum(self.min_mw) / 1000:g} W"
            )
        self.share_mw = shares

    def role(self, index: int) -> str:
        return self.name

    def _read_all(self) -> None:
        self.readings = []
        for c in self.cards:
            try:
                self.readings.append(self.nvml.read(c.uuid))
            except NvmlError:
                self.readings.append(None)

    def _bound_mw(self, i: int) -> int:
        """Highest limit that may be in force, from read-back (unknown: the max)."""
        r = self.readings[i]
        known = [to_mw(v) for v in (r.requested_limit_w, r.enforced_limit_w) if v is not None] if r else []
        return max(known) if known else self.max_mw[i]

    def _enforced_mw(self, i: int) -> int | None:
        r = self.readings[i]
        return None if r is None or r.enforced_limit_w is None else to_mw(r.enforced_limit_w)

    def _requested_mw(self, i: int) -> int | None:
        r = self.readings[i]
        return None if r is None or r.requested_limit_w is None else to_mw(r.requested_limit_w)

    def _write(self, i: int, mw: int) -> bool:
        try:
            self.nvml.set_power_limit(self.cards[i].uuid, mw / 1000)
        except NvmlError:
            return False
        return True

    def _apply_safely(self, targets: Sequence[int]) -> int:
        """Move toward ``targets`` (mW): decreases first, increases that fit the budget."""
        steps = [
            Step(c.uuid, self._bound_mw(i), targets[i], self._requested_mw(i))
            for i, c in enumerate(self.cards)
            if self.readings[i] is not None
        ]
        index = {c.uuid: i for i, c in enumerate(self.cards)}
        return sum(self._write(index[w.uuid], w.to_mw) for w in plan_writes(steps, self.budget_mw))

    def _at(self, targets: Sequence[int]) -> bool:
        return all(self._enforced_mw(i) == t and self._requested_mw(i) == t for i, t in enumerate(targets))


class StaticPolicy(NvmlPolicy):
    """Every card at its fair share (budget / N, clamped to its constraints), forever."""

    name = "static"

    def tick(self, now: float) -> int:
        self._read_all()
        writes = self._apply_safely(self.share_mw)
        self.ready = self.ready or self._at(self.share_mw)
        return writes


@dataclass(frozen=True)
class SlurmRules:
    """Slurm power plugin parameters (its defaults; the brief, "Prior art")."""

    balance_interval_s: float = 30.0
    lower_threshold: float = 0.90  # cut a card drawing under this x its cap
    upper_threshold: float = 0.95  # raise a card drawing over this x its cap
    decrease_rate: float = 0.50  # a cut is at most this x (max - min)
    increase_rate: float = 0.20  # a raise is at most this x (max - min)
    recent_job_s: float = 300.0  # a job this young gets an even split, up to max


class SlurmPolicy(NvmlPolicy):
    """Slurm's power-plugin rules, per card instead of per node; see the module docstring.

    ``job_start(index, now)`` says when the card's current job started (None: no job):
    the scheduler knows, having started it.
    """

    name = "slurm"

    def __init__(self, nvml: CardBackend, budget_w: float, job_start: JobStart, rules: SlurmRules | None = None) -> None:
        super().__init__(nvml, budget_w)
        self.job_start = job_start
        self.rules = rules or SlurmRules()
        self.cap_mw: list[int] = []
        self._last_balance: float | None = None
        self._energy_j: list[float | None] = []

    def start(self) -> None:
        super().start()
        self.cap_mw = list(self.share_mw)  # "initially distributed evenly"

    def tick(self, now: float) -> int:
        self._read_all()
        if not self.ready:
            writes = self._apply_safely(self.cap_mw)
            if self._at(self.cap_mw):
                self.ready = True
                self._last_balance = now
                self._energy_j = self._energies()
            return writes
        assert self._last_balance is not None
        if now - self._last_balance >= self.rules.balance_interval_s - 1e-9:
            energy = self._energies()
            span = now - self._last_balance
            draws = [
                None if e1 is None or e0 is None else (e1 - e0) / span * 1000
                for e0, e1 in zip(self._energy_j, energy)
            ]
            self.cap_mw = self.rebalance(now, draws)
            self._energy_j, self._last_balance = energy, now
        return self._apply_safely(self.cap_mw)

    def _energies(self) -> list[float | None]:
        out = []
        for c in self.cards:
            try:
                out.append(self.nvml.energy_j(c.uuid))
            except NvmlError:
                out.append(None)
        return out

    def rebalance(self, now: float, draws_mw: Sequence[float | None]) -> list[int]:
        """New caps (mW) from each card's mean draw (mW) since the last balance."""
        r = self.rules
        new: dict[int, int] = {}
        raise_: list[tuple[int, bool]] = []  # (index, recent job)
        for i, cap in enumerate(self.cap_mw):
            lo, hi, draw = self.min_mw[i], self.max_mw[i], draws_mw[i]
            started = self.job_start(i, now)
            if started is not None and now - started < r.recent_job_s:
                raise_.append((i, True))
            elif draw is None:
                new[i] = cap  # unknown: leave it
            elif draw < r.lower_threshold * cap:
                cut = min(r.decrease_rate * (hi - lo), (cap - draw) / 2)
                new[i] = max(lo, int(cap - cut))
            elif draw <= r.upper_threshold * cap:
                new[i] = max(lo, cap)
            else:
                raise_.append((i, False))
        # Make room for the raised cards' minimums by cutting the others evenly.
        short = max(sum(new.values()) - self.budget_mw, sum(self.min_mw[i] for i, _ in raise_) - (self.budget_mw - sum(new.values())))
        if short > 0 and new:
            each = -(-short // len(new))
            for i in new:
                new[i] = max(self.min_mw[i], new[i] - each)
        avail = self.budget_mw - sum(new.values())
        for k, (i, recent) in enumerate(raise_):
            even = max(avail, 0) // (len(raise_) - k)
            lo, hi = self.min_mw[i], self.max_mw[i]
            want = even if recent else min(self.cap_mw[i] + int(r.increase_rate * (hi - lo)), even)
            new[i] = min(max(want, lo), hi)
            avail -= new[i]
        caps = [new[i] for i in range(len(self.cap_mw))]
        return caps if sum(caps) <= self.budget_mw else list(self.share_mw)


class ReactivePolicy(NvmlPolicy):
    """Boot at max; cut to fair share near the budget; uncap after a quiet spell."""

    name = "reactive"
    cap_at = 0.95  # cut when the summed 1 s average reaches this x the budget
    uncap_at = 0.80  # back to max after the sum stays under this x the budget ...
    uncap_hold_s = 5.0  # ... for this long

    def __init__(self, nvml: CardBackend, budget_w: float) -> None:
        super().__init__(nvml, budget_w)
        self.capped = False
        self._low_since: float | None = None

    def role(self, index: int) -> str:
        return "capped" if self.capped else "uncapped"

    def tick(self, now: float) -> int:
        if not self.ready:  # boot: every card at max, without waiting for read-back
            self.ready = True
            return sum(self._write(i, m) for i, m in enumerate(self.max_mw))
        self._read_all()
        total_mw = sum(to_mw(r.power_avg_w) for r in self.readings if r is not None and r.power_avg_w is not None)
        if not self.capped:
            if total_mw >= self.cap_at * self.budget_mw:
                self.capped, self._low_since = True, None
                return sum(self._write(i, s) for i, s in enumerate(self.share_mw))
            return 0
        if total_mw > self.uncap_at * self.budget_mw:
            self._low_since = None
            return 0
        if self._low_since is None:
            self._low_since = now
        if now - self._low_since >= self.uncap_hold_s - 1e-9:
            self.capped = False
            return sum(self._write(i, m) for i, m in enumerate(self.max_mw))
        return 0


@dataclass(frozen=True)
class CardDemand:
    """One card as the oracle sees it: limits (mW), its coming demand and idle (W)."""

    min_mw: int
    max_mw: int
    demand_w: float
    idle_w: float
    tgp_w: float
    workload: str

    @property
    def wanted_w(self) -> float:
        """The draw that buys work: demand above TGP is a transient (``work.work_rate``)."""
        return min(self.demand_w, self.tgp_w)


def _upper_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Upper concave hull of points sorted by x."""
    hull: list[tuple[float, float]] = []
    for p in points:
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            if (y1 - y0) * (p[0] - x0) <= (p[1] - y0) * (x1 - x0):  # hull[-1] under the chord
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def _hull_segments(c: CardDemand) -> list[tuple[int, int, float]]:
    """(from mW, to mW, work per mW) along the upper concave hull of a card's work over
    [min, min(demand, max)]; slopes decrease along the list."""
    top = min(max(math.ceil(c.wanted_w * 1000), c.min_mw), c.max_mw)  # up: all of the demand
    if top <= c.min_mw:
        return []
    inner = (to_mw(c.wanted_w * f) for f in POWER_FRACTIONS)
    xs = sorted({c.min_mw, top, *(x for x in inner if c.min_mw < x < top)})
    hull = _upper_hull([(float(x), _work(c, x)) for x in xs])
    return [
        (int(x0), int(x1), (y1 - y0) / (x1 - x0))
        for (x0, y0), (x1, y1) in zip(hull, hull[1:])
        if y1 > y0
    ]


def _work(c: CardDemand, mw: float) -> float:
    return work_rate(c.workload, c.demand_w, mw / 1000, c.idle_w, c.tgp_w)


def _fill(alloc: list[int], left: int, segments: list[tuple[int, int, float, int]]) -> int:
    """Pour ``left`` mW into ``segments`` (from, to, slope, card), steepest first, each
    only from where its card's allocation stands. Returns the mW left over."""
    for x0, x1, _, i in sorted(segments, key=lambda s: -s[2]):
        if left <= 0:
            break
        if alloc[i] < x0 or alloc[i] >= x1:
            continue
        take = min(x1 - alloc[i], left)
        alloc[i] += take
        left -= take
    return left


def allocate(budget_mw: int, cards: Sequence[CardDemand]) -> list[int]:
    """:func:`split`, remembered: demand comes in phases, and an oracle asks for the same
    split at every reading of one (the suite runs each scenario under three of them)."""
    return list(_split_cached(budget_mw, tuple(cards)))


@lru_cache(maxsize=4096)
def _split_cached(budget_mw: int, cards: tuple[CardDemand, ...]) -> tuple[int, ...]:
    return tuple(split(budget_mw, cards))


def split(budget_mw: int, cards: Sequence[CardDemand]) -> list[int]:
    """Split ``budget_mw`` over ``cards`` (limits in mW) to maximise the summed work rate.

    Water-filling on marginal work: every card starts at its minimum; the rest goes to
    the card whose next watts buy the most work, up to its demand (a watt above demand
    buys nothing), along each card's upper concave hull. That is exact where the work
    curves are concave. On their convex foot (below ~45-55 % of the draw) a card may end
    part-way along a hull chord, doing less than the hull promises; then both roundings
    are tried, a few levels deep — that card back to the chord's start with its watts
    poured into the others, or on to the chord's end with watts taken from the others'
    flattest segments — and the allocation doing the most work is kept. Watts nobody can
    use are spread evenly up to each card's max. Raises ValueError if the minimums do
    not fit.
    """
    base = [c.min_mw for c in cards]
    if sum(base) > budget_mw:
        raise ValueError("the minimum limits sum above the budget")
    segs = [(x0, x1, slope, i) for i, c in enumerate(cards) for x0, x1, slope in _hull_segments(c)]
    alloc = list(base)
    _fill(alloc, budget_mw - sum(base), segs)
    best = _rounded(alloc, cards, segs, depth=3)
    if sum(best) < budget_mw:
        best = waterfill(budget_mw, best, [c.max_mw for c in cards])
    # The roundings are a heuristic on the convex foot: never do worse than fair share.
    fair = waterfill(budget_mw, base, [c.max_mw for c in cards])
    if sum(_work(c, x) for c, x in zip(cards, fair)) > sum(_work(c, x) for c, x in zip(cards, best)):
        return fair
    return best


def hull_bound(budget_mw: int, cards: Sequence[CardDemand]) -> float:
    """An upper bound on the summed work rate any split of ``budget_mw`` can reach: the
    water-fill along each card's concave hull, which never lies under the curve (to
    within the rounding of breakpoints to whole mW). Where :func:`allocate`'s work
    equals it, that allocation is optimal."""
    segs = sorted((s for c in cards for s in _hull_segments(c)), key=lambda s: -s[2])
    left = budget_mw - sum(c.min_mw for c in cards)
    value = sum(_work(c, c.min_mw) for c in cards)
    for x0, x1, slope in segs:
        take = min(x1 - x0, left)
        if take <= 0:
            break
        value += slope * take
        left -= take
    return value


def _total(cards: Sequence[CardDemand], alloc: list[int]) -> float:
    return sum(_work(c, x) for c, x in zip(cards, alloc))


def _rounded(
    alloc: list[int], cards: Sequence[CardDemand], segs: list[tuple[int, int, float, int]], depth: int
) -> list[int]:
    """``alloc``, or a rounding of its card stranded on a convex chord that does more work."""
    if depth == 0:
        return alloc
    for x0, x1, slope, p in segs:
        if not x0 < alloc[p] < x1:
            continue
        if _work(cards[p], alloc[p]) >= _work(cards[p], x0) + slope * (alloc[p] - x0) - 1e-12:
            continue  # on a concave piece: the hull is the curve
        others = [s for s in segs if s[3] != p]
        down = list(alloc)
        down[p] = x0
        _fill(down, alloc[p] - x0, others)
        candidates = [alloc, _rounded(down, cards, segs, depth - 1)]
        up, need = list(alloc), x1 - alloc[p]
        for y0, _, _, i in sorted(others, key=lambda s: s[2]):
            give = min(max(up[i] - y0, 0), need)
            up[i] -= give
            need -= give
        if need <= 0:
            up[p] = x1
            candidates.append(_rounded(up, cards, segs, depth - 1))
        return max(candidates, key=lambda a: _total(cards, a))
    return alloc


def demands_at(bank: SimBank, t: float) -> list[CardDemand]:
    """Every card of ``bank`` as the oracles see it at bank time ``t``."""
    out = []
    for card in bank.cards:
        spec = card.spec
        out.append(
            CardDemand(
                card.min_mw, card.max_mw,
                spec.profile.demand_w(t, spec.idle_w, spec.board_tgp_w),
                spec.idle_w, spec.board_tgp_w, spec.profile.workload_at(t),
            )
        )
    return out


class OraclePolicy:
    """Clairvoyant and lag-free: each tick, the budget split for the next refresh's demand.

    Writes limits straight into the simulated bank (build that bank with ``lag_s=0``).
    """

    name = "oracle"

    def __init__(self, bank: SimBank, budget_w: float) -> None:
        self.bank = bank
        self.budget_mw = int(budget_w * 1000)
        self.ready = False

    def start(self) -> None:
        allocate(self.budget_mw, self._demands(0.0))  # raises ValueError when infeasible

    def role(self, index: int) -> str:
        return "oracle"

    def _demands(self, t: float) -> list[CardDemand]:
        return demands_at(self.bank, t)

    def tick(self, now: float) -> int:
        t_next = round((int(now / REFRESH_S + 1e-6) + 1) * REFRESH_S, 9)
        writes = 0
        for card, mw in zip(self.bank.cards, allocate(self.budget_mw, self._demands(t_next))):
            if mw != card.requested_mw:
                card.set_limit(now, mw)
                writes += 1
        self.ready = True
        return writes


class CausalOraclePolicy:
    """The oracle's allocation, acting as a controller could: on the demand of the latest
    refresh (known at ``now``), through the limit lag, decreases confirmed before the
    increases they make room for.

    Writes straight into the simulated bank (build it with the scenario's ``lag_s``). Its
    decreases come from :func:`~powerbudgetd.core.plan.plan_writes` on the bank's own
    bounds (requested, enforced or in flight), one write in flight per card, as
    powerbudgetd's controller orders its own; increases go into what the bounds leave
    under the budget, in part if that is all there is. So it keeps the budget at every
    instant, and with a 100 ms lag a raise that needs a cut first lands two readings
    after the demand that asked for it.
    """

    name = "causal"

    def __init__(self, bank: SimBank, budget_w: float) -> None:
        self.bank = bank
        self.budget_mw = int(budget_w * 1000)
        self.ready = False

    def start(self) -> None:
        allocate(self.budget_mw, demands_at(self.bank, 0.0))  # raises ValueError when infeasible

    def role(self, index: int) -> str:
        return "causal"

    def targets(self, now: float, demands: list[CardDemand]) -> list[int]:
        """Each card's target limit (mW) for ``demands`` (the latest refresh)."""
        return allocate(self.budget_mw, demands)

    def write(self, now: float, index: int, mw: int) -> None:
        self.bank.cards[index].set_limit(now, mw)

    def tick(self, now: float) -> int:
        seen = round(int(now / REFRESH_S + 1e-6) * REFRESH_S, 9)  # the latest refresh, already read
        targets = self.targets(now, demands_at(self.bank, seen))
        cards = self.bank.cards
        steps = [
            Step(str(c.index), c.limit_bound_mw(now), mw, c.requested_mw, busy=_in_flight(c, now))
            for c, mw in zip(cards, targets)
        ]
        writes = [w for w in plan_writes(steps, self.budget_mw) if not w.is_increase]
        # Increases into whatever the confirmed bounds leave, a part of one if that is all
        # that fits (the plan waits for all of it): never a reading later than it must.
        headroom = self.budget_mw - sum(st.bound_mw for st in steps)
        for st in sorted(steps, key=lambda st: st.target_mw - st.bound_mw):
            if st.target_mw > st.bound_mw and not st.busy and headroom > 0:
                to_mw = st.bound_mw + min(st.target_mw - st.bound_mw, headroom)
                headroom -= to_mw - st.bound_mw
                writes.append(Write(st.uuid, st.bound_mw, to_mw))
        for w in writes:
            self.write(now, int(w.uuid), w.to_mw)
        # Ready (counted) once the limits that may be in force fit the budget, as at boot.
        self.ready = self.ready or self.bank.sum_limit_bound_mw() <= self.budget_mw
        return len(writes)


class RuledCausalOraclePolicy(CausalOraclePolicy):
    """The causal oracle held to the rules powerbudgetd is scored under (the like-for-like
    bar): no card's limit reverses direction more than ``MAX_REVERSALS`` times in any
    ``FLAP_WINDOW_S``, nor is written more than ``MAX_WRITES_PER_MIN`` times a minute
    over the run (as the scoreboard counts writes: all of them, boot included, over the
    minutes run; the first minute has the whole minute's allowance); no move is smaller
    than powerbudgetd's ``min_step_w``. The same demand (the latest refresh), limit lag
    and write ordering as :class:`CausalOraclePolicy`.

    It keeps the rules as powerbudgetd's policy does (``powerbudgetd.core.policy``): a
    move away from fair share is made only while it and the move back to fair share
    still fit both allowances, and a move back to fair share is always allowed. Greedy,
    each tick: the split of the budget that does the most work; a card whose move there
    the rules do not allow goes to fair share where that lies on its way, else keeps
    its limit, and the other cards split what is left (again, until every move is
    allowed).
    """

    name = "ruled"

    def __init__(self, bank: SimBank, budget_w: float, min_step_w: float = Timings().min_step_w) -> None:
        super().__init__(bank, budget_w)
        n = len(bank.cards)
        self.min_step_mw = to_mw(min_step_w)
        self._direction = [0] * n  # sign of each card's last write (+1 up, -1 down)
        self._reversals: list[deque[float]] = [deque() for _ in range(n)]  # when each card's writes reversed
        self._writes = [0] * n  # writes to each card so far

    def role(self, index: int) -> str:
        return "ruled"

    def targets(self, now: float, demands: list[CardDemand]) -> list[int]:
        cards = self.bank.cards
        shares = fair_shares(self.budget_mw, [c.min_mw for c in cards], [c.max_mw for c in cards])
        if not self.ready or shares is None:  # boot: the bank brought under the budget first (its writes count)
            return super().targets(now, demands)
        current = [c.requested_mw for c in cards]
        kept: dict[int, int] = {}
        while True:
            free = [i for i in range(len(cards)) if i not in kept]
            try:
                wanted = allocate(self.budget_mw - sum(kept.values()), [demands[i] for i in free])
            except ValueError:  # what the kept cards hold leaves too little: they go back to fair share
                return [shares[i] if i in kept else t for i, t in enumerate(super().targets(now, demands))]
            ruled = {i: self.allowed(i, now, current[i], mw, shares[i]) for i, mw in zip(free, wanted)}
            refused = {i: mw for (i, mw), want in zip(ruled.items(), wanted) if mw != want}
            if not refused:
                return [kept.get(i, ruled.get(i, 0)) for i in range(len(cards))]
            kept |= refused

    def allowed(self, index: int, now: float, current_mw: int, target_mw: int, share_mw: int) -> int:
        """Where card ``index`` may move from ``current_mw`` toward ``target_mw`` now: the
        target if the rules allow it, else fair share if that is on the way, else nowhere."""
        if abs(target_mw - current_mw) < self.min_step_mw:
            return current_mw
        reversals = self._reversals[index]
        while reversals and now - reversals[0] > FLAP_WINDOW_S + _RULE_MARGIN_S:
            reversals.popleft()
        up = target_mw > current_mw
        back = share_mw <= target_mw < current_mw if not up else current_mw < target_mw <= share_mw
        if back and target_mw == share_mw:
            return target_mw  # the move back: kept in reserve by every move away
        reverses = self._direction[index] == (-1 if up else 1)
        beyond = current_mw > share_mw if up else current_mw < share_mw  # already out on that side
        writes_left = MAX_WRITES_PER_MIN * max(now, 60.0) / 60.0 - self._writes[index]
        room = writes_left >= 2 and (  # this move and the move back
            back or (beyond and not reverses) or len(reversals) + reverses + 1 <= MAX_REVERSALS)
        if room:
            return target_mw
        on_the_way = (current_mw < share_mw) == up and current_mw != share_mw
        return share_mw if on_the_way else current_mw

    def write(self, now: float, index: int, mw: int) -> None:
        direction = 1 if mw > self.bank.cards[index].requested_mw else -1
        if self._direction[index] and direction != self._direction[index]:
            self._reversals[index].append(now)
        self._direction[index] = direction
        self._writes[index] += 1
        super().write(now, index, mw)


def _in_flight(card: SimCard, now: float) -> bool:
    """A write to ``card`` has not taken effect yet (its enforced limit is not the requested one)."""
    return card.enforced_mw(now) != card.requested_mw
