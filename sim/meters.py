"""Meters on the simulator's own truth, read at every 100 ms refresh of a bank.

What the scoreboard reports beyond the limits: the work done (``work.py``), seconds
the summed 1 s average draw spent above the budget, the wall power and whether the
feed's breaker or UPS would have tripped (``feed.py``), reclaim latencies, and flapping.
From a trip on the bank is dark: no work, no wall power, nothing more measured (the
cards' own figures after it are what they would have drawn with power).

A *reclaim* starts when a card whose enforced limit sits below its fair share wakes —
its demand rises above its floor (its minimum limit) — and ends when its enforced limit
is back at fair share (within 1 W). Reclaims still open when the run ends count with
the time they had been open (a lower bound).

*Flapping*: a card's enforced limit reversing direction (a rise after a cut, or a cut
after a rise) more than :data:`MAX_REVERSALS` times within :data:`FLAP_WINDOW_S`. Each
card's reversals are kept and the most found in any such window is reported. Beside it,
the rule on writes: no card written more than :data:`MAX_WRITES_PER_MIN` times a
minute over the run (the simulator's report, ``writes_per_card_per_min``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from powerbudgetd_sim.feed import Breaker, Feed, Ups
from powerbudgetd_sim.mains import Battery, Mains
from powerbudgetd_sim.physics import REFRESH_S, SimBank
from powerbudgetd_sim.work import work_rate

SHARE_TOLERANCE_MW = 1000
FLAP_WINDOW_S = 10.0  # no card's limit may reverse direction ...
MAX_REVERSALS = 2  # ... more than this many times within the window
MAX_WRITES_PER_MIN = 12  # no card may be written more often a minute, over the run


@dataclass
class BankMeters:
    """Attach to ``bank`` with :meth:`attach`; set :attr:`counting` once the policy is
    ready (reclaims are counted from then on). Powers in W, times in s."""

    bank: SimBank
    budget_w: float
    share_mw: list[int]
    feed: Feed | None = None
    mains: Mains | None = None
    counting: bool = False
    work: list[float] = field(default_factory=list)  # TGP-seconds per card
    over_budget_s: float = 0.0
    max_wall_w: float = 0.0
    wall_w: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    unresolved: int = 0

    def __post_init__(self) -> None:
        n = len(self.bank.cards)
        self.work = [0.0] * n
        self._awake = [True] * n  # no wake event at the first refresh
        self._wake_at: list[float | None] = [None] * n
        self.breaker = Breaker(self.feed.breaker_a) if self.feed and self.feed.breaker_a else None
        self.ups = Ups(self.feed.ups_w) if self.feed and self.feed.ups_w else None
        self.battery = Battery(self.mains) if self.mains is not None and self.feed is not None else None
        # Work up to the first mains loss: where every policy still has the same budget.
        self.first_loss_s = self.mains.outages[0][0] if self.mains is not None and self.mains.outages else None
        self.work_before_loss = 0.0
        self.dark_at: float | None = None  # the first refresh that found the bank dark (s)
        self.energy_at_dark_mj: list[float] | None = None  # each card's energy counter then
        self._last_t = 0.0
        self._limit_mw: list[int | None] = [None] * n
        self._direction = [0] * n  # sign of the last change of each card's enforced limit
        self.reversals: list[list[float]] = [[] for _ in range(n)]  # times (s), per card

    def attach(self) -> BankMeters:
        self.bank.observers.append(self.observe)
        return self

    @property
    def dark(self) -> bool:
        """The feed's breaker or UPS has tripped, or the battery ran empty in an outage:
        the bank is without power from then on (a tripped device stays off until someone
        resets it; a box cut off does not boot again by itself), so it does no work and
        draws nothing at the wall."""
        return (any(d is not None and d.tripped_at is not None for d in (self.breaker, self.ups))
                or (self.battery is not None and self.battery.empty_at_s is not None))

    def observe(self, t: float) -> None:
        if self.dark:  # nothing more measured: a reclaim still open ends here, unresolved
            if self.dark_at is None:
                self.dark_at = t
                self.energy_at_dark_mj = [c.energy_mj for c in self.bank.cards]
            self.wall_w = 0.0
            return
        self._last_t = t
        sum_avg = sum_instant = 0.0
        for i, card in enumerate(self.bank.cards):
            spec = card.spec
            limit_mw = card.enforced_mw(t)
            self._track_direction(i, t, limit_mw)
            rate = work_rate(spec.profile.workload_at(t), card.demand_w, limit_mw / 1000, spec.idle_w, spec.board_tgp_w)
            self.work[i] += REFRESH_S * rate
            if self.first_loss_s is not None and t < self.first_loss_s:
                self.work_before_loss += REFRESH_S * rate
            sum_avg += card.avg_w
            sum_instant += card.instant_w
            awake = card.demand_w > card.min_mw / 1000
            share = self.share_mw[i] - SHARE_TOLERANCE_MW
            if self.counting and awake and not self._awake[i] and self._wake_at[i] is None and limit_mw < share:
                self._wake_at[i] = t
            woke = self._wake_at[i]
            if woke is not None and limit_mw >= share:
                self.latencies_s.append(round(t - woke, 9))
                self._wake_at[i] = None
            self._awake[i] = awake
        if sum_avg > self.budget_w:
            self.over_budget_s += REFRESH_S
        if self.feed is not None:
            self.wall_w = self.feed.wall_w(sum_instant)
            self.max_wall_w = max(self.max_wall_w, self.wall_w)
            if self.breaker:
                self.breaker.step(t, self.wall_w / self.feed.volts, REFRESH_S)
            if self.ups:
                self.ups.step(t, self.wall_w, REFRESH_S)
            if self.battery:
                self.battery.step(t, self.wall_w, REFRESH_S)

    def rebudget(self, share_mw: list[int]) -> None:
        """The fair shares of the budget in force changed (a UPS on battery): a reclaim
        ends once the card is back at the share of the budget in force."""
        self.share_mw = share_mw

    def _track_direction(self, i: int, t: float, limit_mw: int) -> None:
        last = self._limit_mw[i]
        self._limit_mw[i] = limit_mw
        if last is None or limit_mw == last:
            return
        direction = 1 if limit_mw > last else -1
        if self._direction[i] and direction != self._direction[i]:
            self.reversals[i].append(t)
        self._direction[i] = direction

    def flapping_summary(self) -> dict[str, object]:
        """``max_reversals``: the most reversals of one card's enforced limit within any
        ``window_s``; ``per_card``: that count for each card; ``flapping``: the cards over
        :data:`MAX_REVERSALS`; ``reversals``: all reversals counted."""
        per_card = [_most_in_window(ts, FLAP_WINDOW_S) for ts in self.reversals]
        return {
            "window_s": FLAP_WINDOW_S,
            "max_reversals": max(per_card, default=0),
            "per_card": per_card,
            "flapping": [i for i, k in enumerate(per_card) if k > MAX_REVERSALS],
            "reversals": sum(len(ts) for ts in self.reversals),
        }

    def close(self) -> None:
        """End the run: reclaims still open count with the time they have been open."""
        for i, woke in enumerate(self._wake_at):
            if woke is not None and self._last_t > woke:  # one woken at the last refresh: no time to act
                self.latencies_s.append(round(self._last_t - woke, 9))
                self.unresolved += 1
            self._wake_at[i] = None

    def reclaim_summary(self) -> dict[str, float | int | None]:
        """``p50``, ``p99``, ``max`` of the reclaim latencies (s; None without any),
        ``events`` and ``unresolved`` (still open at the end)."""
        xs = sorted(self.latencies_s)
        return {
            "p50": _percentile(xs, 50),
            "p99": _percentile(xs, 99),
            "max": xs[-1] if xs else None,
            "events": len(xs),
            "unresolved": self.unresolved,
        }

    def trips(self) -> dict[str, bool | None]:
        """Whether the breaker and the UPS tripped (None: the scenario states none)."""
        return {
            "breaker": None if self.breaker is None else self.breaker.tripped_at is not None,
            "ups": None if self.ups is None else self.ups.tripped_at is not None,
        }

    def trip_margins(self) -> dict[str, dict[str, float]]:
        """For each device stated: ``peak_of_rating``, the highest load seen over its
        rating (wall current over the breaker's amps, wall power over the UPS's watts), and
        ``closest``, how near its overload model came to a trip (0-1: the breaker's
        heat, the UPS's overload; 1 = tripped). A UPS carries up to 110 % of its rating
        indefinitely (``UPS_BANDS``): a peak above 100 % is not by itself a trip."""
        out: dict[str, dict[str, float]] = {}
        if self.breaker is not None and self.feed is not None:
            out["breaker"] = {"peak_of_rating": self.max_wall_w / self.feed.volts / self.breaker.rating_a,
                              "closest": self.breaker.closest}
        if self.ups is not None:
            out["ups"] = {"peak_of_rating": self.max_wall_w / self.ups.rating_w, "closest": self.ups.closest}
        return out

    def trip_times(self) -> dict[str, float | None]:
        return {
            "breaker": self.breaker.tripped_at if self.breaker else None,
            "ups": self.ups.tripped_at if self.ups else None,
        }


def _most_in_window(times_s: list[float], window_s: float) -> int:
    """The most of the sorted ``times_s`` that fall within any span shorter than ``window_s``."""
    best = lo = 0
    for hi, t in enumerate(times_s):
        while t - times_s[lo] >= window_s - 1e-9:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def _percentile(sorted_xs: list[float], q: float) -> float | None:
    """Linear-interpolated percentile ``q`` (0-100) of sorted values; None if empty."""
    if not sorted_xs:
        return None
    pos = (len(sorted_xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return round(sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo), 6)
