"""The budget arbiter: every budget source in one place, the lowest current one in force.

Sources report a budget (board W) with their name and, where it can age out, when it
expires. The *configured* source is the config file's budget (``budget_w``, or what
``[feed]`` derives): it is the ceiling, replaced only by :meth:`BudgetArbiter.configure`
(start and reload). Every other source — the wall meter, a remote budget, later a UPS
or a circuit lease — can only lower the budget::

    wanted    = min(configured, every current offer)
    effective = min(configured, max(wanted, floor))

``floor`` is the lowest budget the bank can be held to (controllable cards at their
minimum limits, the others at the highest limit they may have). A wanted budget below
it cannot be met: the cards are held at their minimums instead (the best there is) and
:attr:`Decision.below_floor` says so; it is never raised above the configured budget.

Pure: no I/O, no clock (``now`` in s is passed in, on the caller's clock). The daemon
is the only caller of ``Controller.set_budget``, and only with :meth:`resolve`'s result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CONFIGURED = "config"  # the config file's budget (or its [feed] derivation)


@dataclass(frozen=True)
class Offer:
    """One source's budget (W) as reported at ``at_s``. After ``expires_at_s`` it counts
    as ``expired_w`` (None: it no longer constrains): a lease that lapses should give
    its safe fallback there, a reading that ages out nothing."""

    source: str
    budget_w: float
    at_s: float
    expires_at_s: float | None = None
    expired_w: float | None = None

    def value_w(self, now: float) -> float | None:
        """The budget this offer asks for at ``now`` (W), None when it does not constrain."""
        if self.expires_at_s is not None and now >= self.expires_at_s:
            return self.expired_w
        return self.budget_w


@dataclass(frozen=True)
class Decision:
    """The budget in force and why. ``budget_w``: effective (W); ``source``: the source
    whose value is in force (``config`` when nothing lower is); ``wanted_w``: the lowest
    constraint before the floor; ``below_floor``: wanted lay below the floor, so the
    cards are held at their minimums; ``sources``: each source's current value (W)."""

    budget_w: float
    source: str
    configured_w: float
    wanted_w: float
    floor_w: float | None
    below_floor: bool
    sources: tuple[tuple[str, float], ...]


class BudgetArbiter:
    """Resolves the effective budget from the configured one and every source's offer.

    Raises ValueError for a budget that is not a positive finite number of watts, or
    an offer named ``config`` (only :meth:`configure` sets that).
    """

    def __init__(self, configured_w: float) -> None:
        self._configured_w = _watts(configured_w, CONFIGURED)
        self._offers: dict[str, Offer] = {}
        self._floor_w: float | None = None
        self._leases_end_s: float | None = None  # see end_leases()

    @property
    def configured_w(self) -> float:
        """The configured budget (W): the ceiling no source can exceed."""
        return self._configured_w

    @property
    def floor_w(self) -> float | None:
        """The lowest budget the bank can be held to (W), as last reported; None: unknown."""
        return self._floor_w

    def configure(self, budget_w: float) -> None:
        """Replace the configured budget (start, reload). Offers stay: a lower meter or
        remote budget stays in force through a reload."""
        self._configured_w = _watts(budget_w, CONFIGURED)

    def set_floor(self, floor_w: float | None) -> None:
        """The lowest budget the bank can be held to now (W); None: unknown."""
        self._floor_w = None if floor_w is None else max(0.0, float(floor_w))

    def offer(
        self, source: str, budget_w: float, now: float, *, expires_at_s: float | None = None,
        expired_w: float | None = None,
    ) -> None:
        """``source`` asks for at most ``budget_w`` (W) from ``now`` on (until
        ``expires_at_s``, then ``expired_w``). Replaces that source's previous offer. A
        value above the configured budget does not constrain: a source only lowers."""
        if source == CONFIGURED:
            raise ValueError(f"{CONFIGURED!r} is set by configure(), not offered")
        _watts(budget_w, source, allow_zero=True)
        if expired_w is not None:
            _watts(expired_w, source, allow_zero=True)
        if expires_at_s is not None and self._leases_end_s is not None:
            expires_at_s = min(expires_at_s, self._leases_end_s)
        self._offers[source] = Offer(source, float(budget_w), now, expires_at_s, expired_w)

    def end_leases(self, now: float) -> None:
        """From ``now`` on, every offer that expires (a lease) counts as expired, and so
        does every such offer made later: a stopping daemon falls back to what it may
        use without any lease (the circuit's reserve) and takes no new one."""
        self._leases_end_s = now
        for name, offer in list(self._offers.items()):
            if offer.expires_at_s is not None and offer.expires_at_s > now:
                self._offers[name] = Offer(offer.source, offer.budget_w, offer.at_s, now, offer.expired_w)

    @property
    def leases_ended(self) -> bool:
        return self._leases_end_s is not None

    def withdraw(self, source: str) -> None:
        """``source`` no longer constrains the budget."""
        self._offers.pop(source, None)

    def offered(self, source: str) -> Offer | None:
        return self._offers.get(source)

    def sources(self, now: float) -> tuple[tuple[str, float], ...]:
        """Each source's current value (W), ``config`` first, then by name."""
        out = [(CONFIGURED, self._configured_w)]
        for name in sorted(self._offers):
            value = self._offers[name].value_w(now)
            if value is not None:
                out.append((name, value))
        return tuple(out)

    def resolve(self, now: float) -> Decision:
        """The budget in force at ``now``; see the module docstring."""
        current = self.sources(now)
        source, wanted = CONFIGURED, self._configured_w
        for name, value in current[1:]:
            if value < wanted:  # ties keep the earlier: config, then by name
                source, wanted = name, value
        floor = self._floor_w
        below = floor is not None and wanted < floor
        effective = min(self._configured_w, floor if floor is not None and below else wanted)
        return Decision(effective, source, self._configured_w, wanted, floor, below, current)


def _watts(value: float, source: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"budget from {source!r} must be a finite number of watts, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"budget from {source!r} must be {'>= 0' if allow_zero else '> 0'} W, got {value:g}")
    return float(value)
