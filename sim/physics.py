"""Board-power physics of a simulated GPU bank, taken from the recorded H200 traces.

What the model reproduces (measured on an H200, driver 580; see ``traces/TRACES.md``):

- readings refresh every 100 ms; between refreshes NVML returns the same values;
- ``nvmlDeviceGetPowerUsage`` is the trailing 1 s mean of the instant power (field 186);
- the limit caps the 1 s *average*: while pinned, instant samples wander about +-7 %
  around the limit (measured 600-750 W at 700 W) and the mean stays at or under it;
- at load onset the first instant sample overshoots, up to ~1.35x the limit (873-948 W
  measured at 700 W), for one refresh;
- a written limit takes effect after ``lag_s`` (not measured; public reports say tens of
  ms; default 100 ms). The requested limit reads back at once, the enforced one after
  the lag.
"""

from __future__ import annotations

import json
import os
import random
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Callable

from powerbudgetd_sim.profiles import Profile

REFRESH_S = 0.1  # NVML power readings refresh period (measured)
WINDOW = 10  # samples in the 1 s average
PIN_NOISE = 0.07  # +-7 % wander around the limit while pinned (measured)
ONSET_OVERSHOOT = (1.15, 1.35)  # first sample at load onset, x limit (measured 1.25-1.35)


@dataclass(frozen=True)
class CardSpec:
    """A simulated card. Limits and draws in W; ``tgp_w`` defaults to ``max_w``."""

    uuid: str
    name: str
    min_w: float
    max_w: float
    default_w: float
    idle_w: float
    tgp_w: float | None = None
    has_instant: bool = True
    persistence_mode: bool = True  # as the card boots; the daemon may turn it on
    profile: Profile = field(default_factory=Profile)
    # Misbehaviours seen in the field: constraints NVML reports that differ from the
    # real ones (may be nonsense, e.g. min above max), and a card whose limit stays put
    # whatever is written (the set call still succeeds).
    reported_min_w: float | None = None
    reported_max_w: float | None = None
    ignores_writes: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.min_w <= self.default_w <= self.max_w:
            raise ValueError(
                f"card {self.uuid}: need 0 < min_w <= default_w <= max_w, "
                f"got {self.min_w}, {self.default_w}, {self.max_w}"
            )
        if self.idle_w < 0:
            raise ValueError(f"card {self.uuid}: idle_w must be >= 0, got {self.idle_w}")

    @property
    def board_tgp_w(self) -> float:
        return self.tgp_w if self.tgp_w is not None else self.max_w


class SimCard:
    """One card's limits and power state; all limits kept in integer mW like NVML."""

    def __init__(self, index: int, spec: CardSpec, lag_s: float, seed: int) -> None:
        self.index = index
        self.spec = spec
        self.lag_s = lag_s
        self.rng = random.Random(f"{seed}:{index}")
        self.min_mw = round(spec.min_w * 1000)
        self.max_mw = round(spec.max_w * 1000)
        self.default_mw = round(spec.default_w * 1000)
        self.requested_mw = self.default_mw
        self._enforced_mw = self.default_mw
        self._pending: deque[tuple[float, int]] = deque()
        self.window: deque[float] = deque([spec.idle_w] * WINDOW, maxlen=WINDOW)
        self.instant_w = spec.idle_w
        self.avg_w = spec.idle_w
        self.demand_w = spec.idle_w
        self.energy_mj = 0.0
        self.writes = 0
        self.persistence_mode = spec.persistence_mode

    # -- limits ---------------------------------------------------------------------
    def enforced_mw(self, now: float) -> int:
        while self._pending and self._pending[0][0] <= now:
            self._enforced_mw = self._pending.popleft()[1]
        return self._enforced_mw

    def set_limit(self, now: float, mw: int) -> None:
        self.writes += 1
        if self.spec.ignores_writes:
            return
        self.requested_mw = mw
        self._pending.append((now + self.lag_s, mw))

    def reset_limits(self) -> None:
        """A driver reload or GPU reset: back to the default limit, at once."""
        self._pending.clear()
        self.requested_mw = self._enforced_mw = self.default_mw

    def limit_state(self, now: float) -> dict[str, object]:
        return {"requested_mw": self.requested_mw, "enforced_mw": self.enforced_mw(now),
                "pending": [[t - now, mw] for t, mw in self._pending]}

    def restore_limits(self, state: dict, now: float) -> None:
        self.requested_mw = int(state["requested_mw"])
        self._enforced_mw = int(state["enforced_mw"])
        self._pending = deque((now + dt, int(mw)) for dt, mw in state["pending"])

    def limit_bound_mw(self, now: float) -> int:
        """Highest limit that may be in force now: requested, enforced or in flight."""
        in_flight = max((mw for _, mw in self._pending), default=0)
        return max(self.requested_mw, self.enforced_mw(now), in_flight)

    # -- power ----------------------------------------------------------------------
    def refresh(self, t: float) -> None:
        """Advance the power state to the refresh at time ``t``."""
        spec = self.spec
        limit_w = self.enforced_mw(t) / 1000.0
        demand = spec.profile.demand_w(t, spec.idle_w, spec.board_tgp_w)
        self.demand_w = demand
        prev = self.window[-1]
        if demand > limit_w:
            if prev < 0.8 * limit_w:  # load onset: one sample above the limit
                p = min(demand, limit_w * self.rng.uniform(*ONSET_OVERSHOOT))
            else:
                p = limit_w * (1.0 + self.rng.uniform(-PIN_NOISE, PIN_NOISE))
        else:
            p = demand * (1.0 + self.rng.uniform(-0.01, 0.01))
        # The firmware holds the 1 s mean at or under the limit (it cannot go below idle).
        room = limit_w * WINDOW - (sum(self.window) - self.window[0])
        p = max(min(p, room), min(spec.idle_w, p))
        self.window.append(p)
        self.instant_w = p
        self.avg_w = sum(self.window) / WINDOW
        self.energy_mj += p * REFRESH_S * 1000.0


@dataclass(frozen=True)
class BankEvent:
    """Something that happens to a card behind the daemon's back, at ``at_s`` (bank time)
    and again every ``every_s`` if given.

    ``action``: ``reset`` (driver reload or GPU reset: limits back to the default at
    once) or ``set_limit`` (another tool writes ``limit_w``; it bites after the lag).
    """

    at_s: float
    card: int
    action: str
    limit_w: float | None = None
    every_s: float | None = None

    def __post_init__(self) -> None:
        if self.action not in ("reset", "set_limit"):
            raise ValueError(f"event action {self.action!r} is not one of reset, set_limit")
        if self.action == "set_limit" and self.limit_w is None:
            raise ValueError("a set_limit event needs limit_w")
        if self.every_s is not None and self.every_s <= 0:
            raise ValueError("every_s must be > 0")


class SimBank:
    """A bank of simulated cards on one clock.

    ``clock`` returns the current time in s (virtual in ``simulate``, monotonic in
    ``run --backend sim``). Every simulated NVML call first advances the physics to now.
    ``state_file``: where the cards' limits are kept across processes, as a real GPU
    keeps its limits when the daemon dies (for kill -9 tests); None keeps them in memory.
    """

    def __init__(
        self,
        specs: list[CardSpec],
        *,
        lag_s: float = 0.1,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
        events: list[BankEvent] | None = None,
        state_file: str | None = None,
    ) -> None:
        if lag_s < 0:
            raise ValueError(f"lag_s must be >= 0, got {lag_s}")
        self.cards = [SimCard(i, spec, lag_s, seed) for i, spec in enumerate(specs)]
        for e in events or []:
            if not 0 <= e.card < len(self.cards):
                raise ValueError(f"event for card {e.card}: the bank has {len(self.cards)} cards")
        self.now = 0.0
        # Called as observer(t) after every refresh (meters: work, wall power, trips).
        self.observers: list[Callable[[float], None]] = []
        self._clock = clock
        self._origin = clock() if clock else 0.0
        self._next_refresh = 0.0
        self._events = sorted(((e.at_s, i, e) for i, e in enumerate(events or [])), key=lambda x: x[:2])
        self.state_file = state_file
        if state_file and os.path.exists(state_file):
            with open(state_file) as fh:
                saved = json.load(fh)
            for card, state in zip(self.cards, saved["cards"]):
                card.restore_limits(state, 0.0)
        # The sum of limits that may be in force when this bank (process) started, and the
        # highest it reached just after any write or event since: what a test checks.
        self.start_bound_mw = self.peak_bound_mw = self.sum_limit_bound_mw()

    def save_state(self) -> None:
        """Write every card's limits to ``state_file`` atomically (no-op without one)."""
        self.peak_bound_mw = max(self.peak_bound_mw, self.sum_limit_bound_mw())
        if not self.state_file:
            return
        tmp = f"{self.state_file}.tmp"
        with open(tmp, "w") as fh:
            json.dump({
                "cards": [c.limit_state(self.now) for c in self.cards],
                "start_bound_mw": self.start_bound_mw,
                "peak_bound_mw": self.peak_bound_mw,
            }, fh)
        os.replace(tmp, self.state_file)

    def time(self) -> float:
        """Bank time in s since the bank was made."""
        if self._clock is not None:
            self.advance_to(self._clock() - self._origin)
        return self.now

    def advance_to(self, t: float) -> None:
        """Run every refresh up to and including ``t`` (virtual time only moves forward)."""
        while self._next_refresh <= t + 1e-9:
            self._fire_events(self._next_refresh)
            for card in self.cards:
                card.refresh(self._next_refresh)
            for observe in self.observers:
                observe(self._next_refresh)
            self._next_refresh = round(self._next_refresh + REFRESH_S, 9)
        self.now = max(self.now, t)

    def _fire_events(self, t: float) -> None:
        fired = False
        while self._events and self._events[0][0] <= t + 1e-9:
            at, order, e = self._events.pop(0)
            card = self.cards[e.card]
            if e.action == "reset":
                card.reset_limits()
            else:
                card.set_limit(at, round(e.limit_w * 1000))  # type: ignore[operator]
                card.writes -= 1  # not one of ours
            if e.every_s is not None:
                self._events.append((at + e.every_s, order, e))
                self._events.sort(key=lambda x: x[:2])
            fired = True
        if fired:
            self.save_state()

    def sum_limit_bound_mw(self) -> int:
        """Sum over cards of the highest limit that may be in force (the invariant's left side)."""
        return sum(c.limit_bound_mw(self.now) for c in self.cards)
