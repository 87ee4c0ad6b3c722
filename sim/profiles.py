"""Demand profiles: what a card's workload would draw (W) if nothing capped it.

A card's profile is a list of phases; the phase with the latest ``at_s`` not after
``t`` is in force. Each phase kind documents its own parameters:

- ``idle``: the card's idle draw.
- ``constant``: ``power_w``.
- ``square``: ``high_w`` for ``on_s``, then ``low_w`` (default idle) for ``off_s``.
- ``ramp``: from ``from_w`` (default idle) to ``to_w`` over ``over_s``, then holds.
- ``trace``: replay ``trace`` (a recorded H200 trace) from ``offset_s``, looping, scaled
  by ``scale`` (default: the card's TGP / 700 W, the limit the trace was recorded at).

A step is two phases. Demand never drops below the card's idle draw, and is never
clipped at the card's TGP: a trace replays the recorded instant samples, spikes above
the limit included, and the physics (``powerbudgetd_sim.physics``) decides what of it
the cap lets through.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from powerbudgetd_sim.traces import TRACE_LIMIT_W, load_trace

KINDS = ("idle", "constant", "square", "ramp", "trace")
WORKLOADS = ("compute", "memory")


@dataclass(frozen=True)
class Phase:
    at_s: float
    kind: str = "idle"
    power_w: float = 0.0
    high_w: float = 0.0
    low_w: float | None = None
    on_s: float = 0.2
    off_s: float = 0.3
    from_w: float | None = None
    to_w: float = 0.0
    over_s: float = 10.0
    trace: str = "h200-serving"
    offset_s: float = 0.0
    scale: float | None = None
    workload: str = "compute"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"phase kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload {self.workload!r} is not one of {', '.join(WORKLOADS)}")
        if self.kind == "trace":
            load_trace(self.trace)  # fail early on an unknown trace name
        if self.kind == "square" and (self.on_s <= 0 or self.off_s < 0):
            raise ValueError("square phase needs on_s > 0 and off_s >= 0")
        for key in ("power_w", "high_w", "low_w", "from_w", "to_w"):
            watts = getattr(self, key)
            if watts is not None and watts < 0:
                raise ValueError(f"{key} {watts:g} W: a card's demand is at or above 0 W")

    def demand_w(self, t_s: float, idle_w: float, tgp_w: float) -> float:
        local = t_s - self.at_s
        kind = self.kind
        if kind == "idle":
            return idle_w
        if kind == "constant":
            return self.power_w
        if kind == "square":
            low = idle_w if self.low_w is None else self.low_w
            return self.high_w if local % (self.on_s + self.off_s) < self.on_s else low
        if kind == "ramp":
            start = idle_w if self.from_w is None else self.from_w
            frac = min(max(local / self.over_s, 0.0), 1.0) if self.over_s > 0 else 1.0
            return start + (self.to_w - start) * frac
        scale = self.scale if self.scale is not None else tgp_w / TRACE_LIMIT_W
        return load_trace(self.trace).at(local + self.offset_s) * scale


@dataclass(frozen=True)
class Profile:
    """A card's demand over time; phases sorted by ``at_s``."""

    phases: tuple[Phase, ...] = field(default_factory=lambda: (Phase(0.0),))
    shift_s: float = 0.0  # the demand at t is the phases' at t + shift_s (s >= 0)

    def __post_init__(self) -> None:
        starts = tuple(p.at_s for p in self.phases)
        if not starts or list(starts) != sorted(starts):
            raise ValueError("profile phases must be non-empty and sorted by at_s")
        object.__setattr__(self, "_starts", starts)

    def phase_at(self, t_s: float) -> Phase:
        i = bisect.bisect_right(self._starts, t_s + self.shift_s) - 1  # type: ignore[attr-defined]
        return self.phases[max(i, 0)]

    def demand_w(self, t_s: float, idle_w: float, tgp_w: float) -> float:
        return max(idle_w, self.phase_at(t_s).demand_w(t_s + self.shift_s, idle_w, tgp_w))

    def workload_at(self, t_s: float) -> str:
        """The workload class (``compute`` or ``memory``) in force at ``t_s``."""
        return self.phase_at(t_s).workload
