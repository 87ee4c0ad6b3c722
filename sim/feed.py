"""The electrical feed of a simulated box, and whether its breaker or UPS would trip.

A scenario's ``[feed]`` table states what the bank hangs off::

    [feed]
    host_w = 300            # CPU, RAM, drives, fans: drawn at the PSU output, W
    psu_efficiency = 0.9    # 80 PLUS Gold at 115 V: ~0.87-0.90 (the brief)
    breaker_a = 15          # the branch circuit's breaker rating, A
    volts = 120
    ups_w = 1200            # the UPS's real watt rating (not VA); omit if none

The feed itself and its arithmetic are ``powerbudgetd.core.feed.Feed`` (the model the
daemon's config, wall meter and flight recorder use too). Wall power (W) = (sum of
instant board power + host_w) / psu_efficiency: the instant samples, because both devices see the current at the plug, and a UPS acts faster than a
1 s average can show.

Trip models (the brief, "Protective devices"):

- :class:`Breaker`, UL 489 style thermal-magnetic: holds 100 % of its rating forever;
  the thermal element is an inverse-time accumulator ``dA/dt = (x**2 - 1) / K`` over the
  load ``x`` (current / rating), cooling the same way below 100 %, tripping at ``A = 1``.
  ``K`` is set so that 200 % trips at 2 min, the slowest the standard allows; 135 % then
  trips after 7.3 min, within the standard's 1 h. The magnetic element trips at once
  at 5x.
- :class:`Ups`: the brief's overload table taken at the short end of each band, since
  a UPS has to be budgeted against the least forgiving unit: over 110 % trips in 30 s,
  over 130 % in 3 s, over 150 % in 0.5 s ("under 0.5 s"). Overload time accumulates as
  a fraction of the band's time; at or under 100 % it drains at the 30 s band's rate.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from powerbudgetd.core.feed import Feed
from powerbudgetd_sim.tables import Builds, Number, problems


class FeedTable(Builds):
    """A scenario's ``[feed]`` table (W, A, V; see above); it builds the :class:`Feed`,
    whose own checks give the ranges."""

    host_w: Number
    breaker_a: Number
    volts: Number
    psu_efficiency: Number | None = None
    ups_w: Number | None = None

    def build(self) -> Feed:
        return Feed(**{k: float(v) for k, v in self.given().items() if k in FEED_KEYS})


FEED_KEYS = set(FeedTable.model_fields)

__all__ = ["FEED_KEYS", "Breaker", "Feed", "FeedTable", "Ups", "feed_from_dict"]


def feed_from_dict(data: dict[str, Any]) -> Feed:
    """The feed (``powerbudgetd.core.feed.Feed``, the one model every part uses) from a
    scenario's ``[feed]`` table. Raises ValueError naming each bad key ("; " between them)."""
    try:
        return FeedTable.model_validate(data).built
    except ValidationError as exc:
        raise ValueError("; ".join(problems(exc, FeedTable, "feed"))) from None


BREAKER_K = 120.0 * (2.0**2 - 1.0)  # s: 200 % trips in 2 min
BREAKER_MAGNETIC_X = 5.0


class Breaker:
    """Inverse-time trip model of a UL 489 breaker; feed it the load each sample."""

    def __init__(self, rating_a: float) -> None:
        self.rating_a = rating_a
        self.heat = 0.0  # 1.0 = trip
        self.closest = 0.0  # the most heat seen: how near it came to a trip (1.0 = tripped)
        self.tripped_at: float | None = None

    def step(self, t_s: float, current_a: float, dt_s: float) -> bool:
        """Account ``current_a`` held for ``dt_s`` ending at ``t_s``; True once tripped."""
        x = current_a / self.rating_a
        self.heat = max(0.0, self.heat + dt_s * (x * x - 1.0) / BREAKER_K)
        self.closest = max(self.closest, min(1.0, self.heat))
        if self.tripped_at is None and (x >= BREAKER_MAGNETIC_X or self.heat >= 1.0):
            self.tripped_at = t_s
        if self.tripped_at is not None:
            self.closest = 1.0  # the magnetic trip too, however little heat
        return self.tripped_at is not None

    @staticmethod
    def trip_time_s(x: float) -> float:
        """Seconds to trip from cold at a steady load ``x`` (current / rating)."""
        if x >= BREAKER_MAGNETIC_X:
            return 0.0
        return math.inf if x <= 1.0 else BREAKER_K / (x * x - 1.0)


UPS_BANDS = ((1.50, 0.5), (1.30, 3.0), (1.10, 30.0))  # (load above, seconds to trip)
UPS_DRAIN_S = 30.0


class Ups:
    """Overload trip model of a UPS rated ``rating_w`` (real watts)."""

    def __init__(self, rating_w: float) -> None:
        self.rating_w = rating_w
        self.overload = 0.0  # 1.0 = trip
        self.closest = 0.0  # the most overload seen: how near it came to a trip (1.0 = tripped)
        self.tripped_at: float | None = None

    def step(self, t_s: float, load_w: float, dt_s: float) -> bool:
        """Account ``load_w`` held for ``dt_s`` ending at ``t_s``; True once tripped."""
        x = load_w / self.rating_w
        trip_s = self.trip_time_s(x)
        if trip_s < math.inf:
            self.overload += dt_s / trip_s
        elif x <= 1.0:
            self.overload = max(0.0, self.overload - dt_s / UPS_DRAIN_S)
        self.closest = max(self.closest, min(1.0, self.overload))
        if self.tripped_at is None and self.overload >= 1.0 - 1e-9:
            self.tripped_at = t_s
        if self.tripped_at is not None:
            self.closest = 1.0
        return self.tripped_at is not None

    @staticmethod
    def trip_time_s(x: float) -> float:
        """Seconds to trip at a steady load ``x`` (load / rating); inf if it holds."""
        for above, seconds in UPS_BANDS:
            if x > above:
                return seconds
        return math.inf
