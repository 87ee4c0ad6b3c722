"""Board-power physics of a simulated GPU bank, taken from the recorded H200 traces.

What the model reproduces (measured on an H200, driver 580; see ``traces/TRACES.md``):

- readings refresh every 100 ms; between refreshes NVML returns the same values;
- ``nvmlDeviceGetPowerUsage`` is the trailing 1 s mean of the instant power (field 186);
- the limit caps the 1 s *average*, not the instant: while pinned, instant samples
  wander about +-7 % around the limit (measured 600-750 W at 700 W) and the mean stays
  at or under it;
- a *transient* is a rise in demand the firmware has not yet throttled: at load onset
  from idle, and just as much from a card already at its cap (16 of the 17 recorded
  spikes above 770 W came from a card at 0.94-1.0x its cap). The throttle in force is
  the one that held the demand of two refreshes before at the limit, so a rise shows
  for 100-200 ms (measured: 1-2 refreshes), at what the workload wants through that
  throttle, up to 1.355x the limit (873-948 W measured at 700 W). A spike
  from a card at its cap is a short burst between two samples: it shows in the instant
  field but hardly moves the 1 s average (measured: 915 W instant, average unchanged at
  689 W), so the average integrates the throttled power, not the spike;
- lowering a busy card's limit puts its instant draw at the new limit at once; the
  1 s average then comes down over a second (it cannot be undone retroactively);
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
TRANSIENT_MAX = 1.355  # the highest transient sample, x limit (948 W measured at 700 W)
VENDORS = ("nvidia", "amd", "intel")
THROTTLE_DELAY = 2  # refreshes before the firmware's throttle bites (onsets: 100-200 ms over)


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
    present: bool = True  # on the bus when the bank starts (false: appears by an event)
    mig_devices: int = 0  # MIG mode enabled with this many MIG devices (0: MIG disabled)
    # Whose card: nvidia is served by the simulated NVML library, amd (amdgpu) and intel
    # (xe) by the simulated hwmon tree (powerbudgetd_sim.hwmon), from the same physics.
    vendor: str = "nvidia"

    def __post_init__(self) -> None:
        if not 0 < self.min_w <= self.default_w <= self.max_w:
            raise ValueError(
                f"card {self.uuid}: need 0 < min_w <= default_w <= max_w, "
                f"got {self.min_w}, {self.default_w}, {self.max_w}"
            )
        if self.idle_w < 0:
            raise ValueError(f"card {self.uuid}: idle_w must be >= 0, got {self.idle_w}")
        if self.vendor not in VENDORS:
            raise ValueError(f"card {self.uuid}: vendor must be one of {', '.join(VENDORS)}, got {self.vendor!r}")
        if not 0 <= self.mig_devices <= 7:
            raise ValueError(f"card {self.uuid}: mig_devices must be 0-7 (NVML's most), got {self.mig_devices}")

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
        self.level_w = spec.idle_w  # mean power over the last refresh: what the average integrates
        self.avg_w = spec.idle_w
        self.demand_w = spec.idle_w
        self._past_demand_w: deque[float] = deque([spec.idle_w] * THROTTLE_DELAY, maxlen=THROTTLE_DELAY)
        self.energy_mj = 0.0
        self._cut_until = -1.0  # bank time until which a limit cut is still draining the average
        self._last_limit_w = spec.default_w
        self.writes = 0
        self.persistence_mode = spec.persistence_mode
        self.present = spec.present
        # Behind the daemon's back (BankEvent): an outside limiter holding the enforced
        # limit at or above a floor / at or below a ceiling (mW), writes stuck in a hung
        # call (they land at their time), and readings that cannot be believed.
        self.outside_floor_mw: int | None = None
        self.outside_ceiling_mw: int | None = None
        self._stuck: list[tuple[float, int]] = []
        self.bogus_power_w: float | None = None  # every power reading returns this
        self.frozen_mw: tuple[int, int] | None = None  # (avg, instant) stuck while energy moves

    # -- limits ---------------------------------------------------------------------
    def _land_stuck(self, now: float) -> None:
        while self._stuck and self._stuck[0][0] <= now:
            t, mw = self._stuck.pop(0)
            self.requested_mw = mw
            self._pending.append((round(t + self.lag_s, 9), mw))

    def requested(self, now: float) -> int:
        """The requested limit (mW) as NVML reads it now."""
        self._land_stuck(now)
        return self.requested_mw

    def enforced_mw(self, now: float) -> int:
        self._land_stuck(now)
        while self._pending and self._pending[0][0] <= now:
            self._enforced_mw = self._pending.popleft()[1]
        mw = self._enforced_mw
        if self.outside_floor_mw is not None:
            mw = max(mw, self.outside_floor_mw)
        if self.outside_ceiling_mw is not None:
            mw = min(mw, self.outside_ceiling_mw)
        return mw

    def set_limit(self, now: float, mw: int, delay_s: float = 0.0) -> None:
        """Write a limit at ``now``; ``delay_s`` > 0: the call hangs and the write lands then."""
        self.writes += 1
        if self.spec.ignores_writes:
            return
        if delay_s > 0:
            self._stuck.append((now + delay_s, mw))
            self._stuck.sort()
            return
        self._land_stuck(now)
        self.requested_mw = mw
        self._pending.append((round(now + self.lag_s, 9), mw))  # bank time is rounded to 1 ns: 63.7 + 0.1 must read 63.8

    def reported_avg_mw(self, now: float) -> int:
        """``nvmlDeviceGetPowerUsage`` as the card answers it (mW), faults included."""
        if self.bogus_power_w is not None:
            return int(self.bogus_power_w * 1000)
        return self.frozen_mw[0] if self.frozen_mw else int(self.avg_w * 1000)

    def reported_instant_mw(self, now: float) -> int:
        if self.bogus_power_w is not None:
            return int(self.bogus_power_w * 1000)
        return self.frozen_mw[1] if self.frozen_mw else int(self.instant_w * 1000)

    def reset_limits(self) -> None:
        """A driver reload or GPU reset: back to the default limit, at once."""
        self._pending.clear()
        self._stuck.clear()
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
        enforced = self.enforced_mw(now)
        if not self.present:
            return 0  # off the bus: no limit of it is in force
        in_flight = max([mw for _, mw in self._pending] + [mw for _, mw in self._stuck], default=0)
        return max(self.requested_mw, enforced, in_flight)

    # -- power ----------------------------------------------------------------------
    def refresh(self, t: float) -> None:
        """Advance the power state to the refresh at time ``t``.

        ``demand_w`` is what the workload would draw uncapped (never clipped at TGP: a
        recorded trace carries its own spikes). Over the limit, the firmware throttles
        to the limit; a rise faster than it throttles (a transient) reads as a spike.
        """
        spec = self.spec
        limit_w = self.enforced_mw(t) / 1000.0
        if limit_w < self._last_limit_w:
            self._cut_until = t + WINDOW * REFRESH_S
        self._last_limit_w = limit_w
        throttled_demand = self._past_demand_w[0]  # what the throttle in force was set for
        demand = spec.profile.demand_w(t, spec.idle_w, spec.board_tgp_w)
        self._past_demand_w.append(demand)
        self.demand_w = demand
        spike = False
        if demand > limit_w:
            # What the card draws before the firmware reacts: the new demand at the
            # throttle that held an earlier demand at the limit.
            throttle = min(1.0, limit_w / throttled_demand) if throttled_demand > 0 else 1.0
            untamed = demand * throttle * (1.0 + self.rng.uniform(-0.01, 0.01))
            if untamed > limit_w * (1.0 + PIN_NOISE):
                p = min(untamed, limit_w * TRANSIENT_MAX)
                spike = True
            else:
                p = limit_w * (1.0 + self.rng.uniform(-PIN_NOISE, PIN_NOISE))
        else:
            p = demand * (1.0 + self.rng.uniform(-0.01, 0.01))
        level = p
        if t < self._cut_until:
            # After a cut the average is over the new limit whatever the card does now:
            # it runs at the new limit and the average drains.
            level = min(p, limit_w)
        else:
            # The firmware holds the 1 s mean at or under the limit (never below idle).
            room = limit_w * WINDOW - (sum(self.window) - self.window[0])
            level = max(min(p, room), min(spec.idle_w, p))
        self.level_w = level
        self.window.append(level)
        # A spike from a card already drawing near its cap is a short burst the instant
        # sample catches; from idle (load onset) it is the power itself.
        self.instant_w = p if spike else level
        self.avg_w = sum(self.window) / WINDOW
        self.energy_mj += level * REFRESH_S * 1000.0


ACTIONS = ("reset", "set_limit", "floor", "ceiling", "appear", "disappear", "reindex", "bad_reading",
           "freeze", "unfreeze")


@dataclass(frozen=True)
class BankEvent:
    """Something that happens to a card behind the daemon's back, at ``at_s`` (bank time)
    and again every ``every_s`` if given.

    ``action``:

    - ``reset``: a driver reload or GPU reset: limits back to the default at once;
    - ``set_limit``: another tool writes ``limit_w``; it bites after the lag;
    - ``floor`` / ``ceiling``: an outside limiter (board firmware, a BMC) holds the
      enforced limit at or above / at or below ``limit_w`` whatever is requested;
      without ``limit_w`` it lets go;
    - ``appear`` / ``disappear``: the card comes onto / falls off the bus (it appears at
      its default limit, as after a reset);
    - ``reindex``: NVML enumerates the cards in a new order: ``order`` lists the
      present cards' scenario positions in their new index order;
    - ``bad_reading``: every power reading of the card returns ``limit_w`` W (negative,
      huge: impossible), until a ``bad_reading`` without ``limit_w``;
    - ``freeze``: the power readings stop moving while the card (and its energy
      counter) goes on; ``unfreeze`` lets them move again.
    """

    at_s: float
    card: int
    action: str
    limit_w: float | None = None
    every_s: float | None = None
    order: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"event action {self.action!r} is not one of {', '.join(ACTIONS)}")
        if self.action == "reindex" and not self.order:
            raise ValueError("a reindex event needs order (the cards' positions in their new index order)")
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
        self.order: list[int] = list(range(len(self.cards)))  # NVML's index order (positions)
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
            # Time went on between the processes (on the same monotonic clock): a write
            # that was in flight at the save has landed since, as on a real card.
            elapsed = 0.0
            if clock is not None and saved.get("clock_origin_s") is not None and "now_s" in saved:
                elapsed = max(0.0, self._origin - (saved["clock_origin_s"] + saved["now_s"]))
            for card, state in zip(self.cards, saved["cards"]):
                card.restore_limits(state, -elapsed)
                card.enforced_mw(0.0)
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
                # Bank time at the save and its clock's origin: a reader on the same
                # monotonic clock can tell which writes in flight have landed since.
                "now_s": self.now,
                "clock_origin_s": self._origin if self._clock else None,
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
            self._apply(self.cards[e.card], e, at)
            if e.every_s is not None:
                self._events.append((at + e.every_s, order, e))
                self._events.sort(key=lambda x: x[:2])
            fired = True
        if fired:
            self.save_state()

    def _apply(self, card: SimCard, e: BankEvent, at: float) -> None:
        mw = None if e.limit_w is None else round(e.limit_w * 1000)
        if e.action == "reset":
            card.reset_limits()
        elif e.action == "set_limit":
            card.set_limit(at, mw)  # type: ignore[arg-type]
            card.writes -= 1  # not one of ours
        elif e.action == "floor":
            card.outside_floor_mw = mw
        elif e.action == "ceiling":
            card.outside_ceiling_mw = mw
        elif e.action in ("appear", "disappear"):
            card.present = e.action == "appear"
            if card.present:
                card.reset_limits()  # a card coming onto the bus starts at its default
        elif e.action == "reindex":
            self.order = list(e.order or ())
        elif e.action == "bad_reading":
            card.bogus_power_w = e.limit_w
        elif e.action == "freeze":
            card.frozen_mw = (int(card.avg_w * 1000), int(card.instant_w * 1000))
        else:
            card.frozen_mw = None

    def visible(self) -> list[SimCard]:
        """The cards on the bus, in NVML's current index order."""
        listed = set(self.order)  # asked on every NVML call: a list here costs N x N
        ordered = [self.cards[i] for i in self.order] + [c for i, c in enumerate(self.cards) if i not in listed]
        return [c for c in ordered if c.present]

    def present(self, card: SimCard) -> bool:
        return card.present

    def sum_limit_bound_mw(self) -> int:
        """Sum over cards of the highest limit that may be in force (the invariant's left side)."""
        return sum(c.limit_bound_mw(self.now) for c in self.cards)
