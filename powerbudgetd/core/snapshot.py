"""The bank as one tick left it, in watts: what every side channel consumes.

Built once per tick (``control.report.bank_snapshot``) and carried by the tick's
report; metrics, MQTT and the flight recorder read it and nothing else of the
controller. Immutable: a side channel cannot change what another one sees. A card is a
named tuple, not a frozen dataclass: built for every card every tick, a frozen
dataclass of 23 fields took 5.7 us to make, a named tuple 0.95 us.

A value NVML could not read is None, never 0: an unreadable card's limits and draw are
None (its last values would be stale), and so is a sum that would miss one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from powerbudgetd.core.arbiter import CONFIGURED, Decision


class CardSnapshot(NamedTuple):
    """One card. Limits and draw in W; None: unknown (not reported, or unreadable now).

    ``min_limit_w``/``max_limit_w``: the constraints control works within (``max`` may be
    lowered by ``[cards] max_w``); ``hw_min_limit_w``/``hw_max_limit_w``: as the card
    reports them. ``limit_bound_w``: the highest limit that may be in force (requested,
    enforced or in flight). ``contested_w``: the value another tool keeps writing, while
    the card is contested. ``outside_cap_w``: the enforced limit an outside limiter (a
    BMC, a node-level cap) holds it at, below what was requested. ``read_errors``: failed reads so far, by NvmlError kind;
    ``readings_rejected``: power readings not believed so far (``impossible``: negative,
    overflowed, far above the card's maximum; ``frozen``: stuck while the energy counter
    moves), by reason: the card's draw is unknown (None) while they last.
    """

    index: int  # type: ignore[assignment]  # the GPU index; shadows tuple.index, which nothing calls
    uuid: str
    name: str
    role: str
    controllable: bool
    readable: bool
    requested_limit_w: float | None
    enforced_limit_w: float | None
    limit_bound_w: float
    min_limit_w: float | None
    max_limit_w: float | None
    hw_min_limit_w: float | None
    hw_max_limit_w: float | None
    power_avg_w: float | None
    power_instant_w: float | None
    error: str | None = None
    contested_w: float | None = None
    excursions: int = 0
    peak_excursion_w: float | None = None
    read_errors: tuple[tuple[str, int], ...] = ()
    readings_rejected: tuple[tuple[str, int], ...] = ()
    mig_mode: bool | None = None  # MIG enabled on this (parent) GPU; None: no MIG
    outside_cap_w: float | None = None  # an outside limiter holds it at this (W); None: none seen
    vendor: str = "nvidia"  # nvidia, amd, intel
    backend: str = "nvml"  # nvml, hwmon: how the daemon reaches the card

    @property
    def power_peak_w(self) -> float | None:
        """The instant draw, else the 1 s average (a card without field 186) (W)."""
        return self.power_instant_w if self.power_instant_w is not None else self.power_avg_w


@dataclass(frozen=True)
class CircuitStatus:
    """This host on a shared circuit (wall W, s): the circuit's budget, this host's
    reserve, the grant in use (and as etcd holds it), how long the grant stays valid
    without a renewal, whether etcd answers, whether the seat fits and grants are
    allowed (seat, TTL vs watchdog)."""

    name: str
    budget_w: float | None
    reserve_w: float
    grant_w: float
    held_w: float
    lease_left_s: float
    etcd_reachable: bool
    seat_fits: bool
    grants_allowed: bool

    def fields(self) -> dict[str, object]:
        """Flat ``circuit_*`` fields for state payloads and records."""
        return {
            "circuit": self.name, "circuit_budget_w": self.budget_w, "circuit_reserve_w": self.reserve_w,
            "circuit_grant_w": round(self.grant_w, 1), "circuit_grant_held_w": round(self.held_w, 1),
            "circuit_lease_left_s": round(self.lease_left_s, 2), "circuit_etcd_reachable": self.etcd_reachable,
            "circuit_seat_fits": self.seat_fits, "circuit_grants_allowed": self.grants_allowed,
        }


@dataclass(frozen=True)
class BankSnapshot:
    """The bank. ``budget_w``: the budget in force (W) and ``budget_source`` the source
    that set it (see ``core.arbiter``); ``sources``: every budget source's current value
    (W); ``circuit``: this host on a shared circuit, when it has one. ``sum_limit_bound_w``: the sum over cards of the highest limit that may be in
    force; ``floor_w``: the lowest budget the bank can be held to (controllable cards at
    their minimum limits, the others at their bounds). ``sum_power_avg_w``: the summed
    1 s average over the cards that report one; ``power_complete``: every card did.

    Over budget (``sum_limit_bound_w`` above ``budget_w``, whatever the cause: boot's
    descent, a limit held or raised elsewhere, a card that appeared): ``over_budget``
    now, ``over_budget_cause`` of the current (or last) episode, ``over_budget_episodes``
    and ``over_budget_s`` (s, on the controller's clock) since start."""

    now: float
    mode: str
    ready: bool
    budget_w: float
    sum_limit_bound_w: float
    floor_w: float
    cards: tuple[CardSnapshot, ...]
    budget_source: str = CONFIGURED
    configured_budget_w: float | None = None
    sources: tuple[tuple[str, float], ...] = ()
    over_budget: bool = False
    over_budget_cause: str | None = None
    over_budget_episodes: int = 0
    over_budget_s: float = 0.0
    circuit: CircuitStatus | None = None  # with a [circuit]: this host's place on it

    @property
    def headroom_w(self) -> float:
        return self.budget_w - self.sum_limit_bound_w

    @property
    def sum_power_avg_w(self) -> float:
        return sum(c.power_avg_w or 0.0 for c in self.cards)

    @property
    def power_complete(self) -> bool:
        return all(c.power_avg_w is not None for c in self.cards)

    @property
    def sum_power_known_w(self) -> float | None:
        """:attr:`sum_power_avg_w` where every card reported its 1 s average, else None:
        a card unread is not a card drawing 0 W (W)."""
        return self.sum_power_avg_w if self.power_complete else None

    @property
    def sum_power_peak_w(self) -> float | None:
        """Summed instant draw (each card's :attr:`CardSnapshot.power_peak_w`); None when
        no card reports any."""
        seen = [w for c in self.cards if (w := c.power_peak_w) is not None]
        return sum(seen) if seen else None

    @property
    def sum_enforced_limit_w(self) -> float:
        return sum(c.enforced_limit_w or 0.0 for c in self.cards)

    def with_budget(self, decision: Decision | None) -> BankSnapshot:
        """This snapshot with the arbiter's account of the budget in force."""
        if decision is None:
            return self
        return replace(
            self, budget_source=decision.source, configured_budget_w=decision.configured_w,
            sources=decision.sources,
        )
