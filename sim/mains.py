"""Mains loss behind a simulated UPS: when the box runs on battery, and how much is left.

A scenario's ``[feed]`` may give the UPS a battery and the times the mains go away::

    [feed]
    ups_w = 1500
    battery_wh = 150                 # the battery's usable energy, Wh
    mains_lost = [[40, 100]]         # [lost at s, back at s]; [[40]]: never back

While the mains are lost the UPS carries the whole wall power (board + host) / PSU
efficiency from its battery. The runtime a policy leaves on the battery is the energy
left over the mean wall draw on battery (what a UPS shows as ``battery.runtime``); a
battery that empties cuts the box off (``empty_at_s``). Energy in J inside, Wh out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from powerbudgetd.core.ups import UpsGuard, UpsParams, UpsReading

MAINS_KEYS = {"battery_wh", "mains_lost"}


@dataclass(frozen=True)
class Mains:
    """``battery_wh`` (Wh) and outages as (lost at s, back at s or inf)."""

    battery_wh: float
    outages: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.battery_wh, bool) or not 0 < self.battery_wh <= 1_000_000:
            raise ValueError(f"feed.battery_wh must be a battery energy in Wh, in (0, 1000000], got {self.battery_wh!r}")
        last = -math.inf
        for lost, back in self.outages:
            if not (0 <= lost < back and lost >= last):
                raise ValueError(f"feed.mains_lost: outages must be [lost_s, back_s] in order, got {[lost, back]}")
            last = back

    @classmethod
    def from_feed(cls, feed: dict[str, Any]) -> Mains | None:
        """The battery and outages of a scenario's ``[feed]``; None when it gives none.
        Raises ValueError naming the key."""
        if not MAINS_KEYS & set(feed):
            return None
        if "battery_wh" not in feed:
            raise ValueError("feed.mains_lost needs feed.battery_wh (the UPS battery's energy) and feed.ups_w")
        if "ups_w" not in feed:
            raise ValueError("feed.battery_wh needs feed.ups_w: a battery belongs to a UPS")
        spans = feed.get("mains_lost", [])
        if not isinstance(spans, list):
            raise ValueError(f"feed.mains_lost must be a list of [lost_s, back_s], got {spans!r}")
        outages = []
        for span in spans:
            ok = isinstance(span, list) and len(span) in (1, 2) and all(
                isinstance(x, int | float) and not isinstance(x, bool) for x in span)
            if not ok:
                raise ValueError(f"feed.mains_lost: each outage is [lost_s, back_s] or [lost_s], got {span!r}")
            outages.append((float(span[0]), float(span[1]) if len(span) == 2 else math.inf))
        battery = feed["battery_wh"]
        if isinstance(battery, bool) or not isinstance(battery, int | float):
            raise ValueError(f"feed.battery_wh must be a number, got {battery!r}")
        return cls(float(battery), tuple(outages))

    def lost(self, t: float) -> bool:
        """Whether the box runs on battery at ``t`` (s)."""
        return any(lost <= t < back for lost, back in self.outages)


@dataclass
class Battery:
    """The battery through a run: feed it the wall power each refresh with :meth:`step`."""

    mains: Mains
    left_j: float = field(init=False)
    on_battery_s: float = 0.0
    drawn_j: float = 0.0
    empty_at_s: float | None = None

    def __post_init__(self) -> None:
        self.left_j = self.mains.battery_wh * 3600.0

    def step(self, t: float, wall_w: float, dt_s: float) -> None:
        if not self.mains.lost(t) or self.empty_at_s is not None:
            return
        self.on_battery_s += dt_s
        self.drawn_j += wall_w * dt_s
        self.left_j = max(0.0, self.left_j - wall_w * dt_s)
        if self.left_j <= 0.0:
            self.empty_at_s = t

    def summary(self) -> dict[str, float | None]:
        """``energy_left_wh``, ``mean_wall_w`` on battery, ``runtime_left_s`` (energy
        left / that draw; None before any time on battery), ``on_battery_s``,
        ``empty_at_s`` (None: it held)."""
        mean_w = self.drawn_j / self.on_battery_s if self.on_battery_s > 0 else None
        runtime = None if not mean_w else self.left_j / mean_w
        return {
            "energy_left_wh": round(self.left_j / 3600.0, 2),
            "mean_wall_w": None if mean_w is None else round(mean_w, 1),
            "runtime_left_s": None if runtime is None else round(runtime, 1),
            "on_battery_s": round(self.on_battery_s, 1),
            "empty_at_s": self.empty_at_s,
        }


class SimUps:
    """The budget powerbudgetd's UPS channel would offer over a scenario's mains: the
    same state machine (``powerbudgetd.core.ups``), fed what upsd would serve (``OB
    DISCHRG`` while the mains are lost, ``OL CHRG`` otherwise) every ``poll_s``, with the
    ``[ups]`` defaults (on battery: half the configured budget, restored after 60 s on
    line). Only the status flags: the measured load is the wall meter's business here."""

    def __init__(self, mains: Mains, params: UpsParams | None = None, poll_s: float = 2.0) -> None:
        self.mains = mains
        self.guard = UpsGuard(params or UpsParams())
        self.poll_s = poll_s
        self._next_poll = 0.0

    def budget_w(self, now: float, configured_w: float, floor_w: float | None) -> float | None:
        """The UPS's budget at ``now`` (W; None: it does not constrain)."""
        if now + 1e-9 >= self._next_poll:
            flags = frozenset({"OB", "DISCHRG"}) if self.mains.lost(now) else frozenset({"OL", "CHRG"})
            self.guard.observe(UpsReading(flags=flags), now, board_w=None, configured_w=configured_w)
            self._next_poll = now + self.poll_s
        return self.guard.evaluate(now, configured_w, floor_w).budget_w
