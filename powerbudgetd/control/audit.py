"""Per-card audit: what a read tells beyond the bound. Drift (someone else changed the
limit), contest (they keep doing it), excursions (instant draw above the enforced limit,
normal at load onset: counted, not acted on) and readings that cannot be believed.

None of this decides the bound (that is :mod:`powerbudgetd.control.ledger`); it decides
whether a card may lend or borrow and what the operator is told.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from powerbudgetd.control.ledger import CardLedger
from powerbudgetd.core.model import Timings
from powerbudgetd.hw.nvml import PowerReading, to_mw

log = structlog.get_logger("powerbudgetd")

# A board reading this many times the card's highest limit is not a reading: the 1 s
# average is capped at the limit and instant peaks were measured at 1.35x it.
IMPOSSIBLE_FACTOR = 3.0
# NVML reports power in unsigned mW: a wrapped or garbage value reads this high.
OVERFLOW_W = 2**31 / 1000


@dataclass
class CardAudit:
    """Drift, contest, excursions and reading checks of one card (W, mW, s)."""

    timings: Timings
    expected_mw: int | None = None  # the requested limit we last confirmed
    drift_times: list[float] = field(default_factory=list)
    contested_until: float = float("-inf")
    contested_w: float | None = None  # the competing value last found (W)
    excursions: int = 0
    peak_excursion_w: float | None = None
    over_limit: bool = False
    power_unknown: bool = False
    implausible: str | None = None  # why the last power reading was not believed
    implausible_readings: int = 0  # readings not believed (exported as a counter)

    def contested(self, now: float) -> bool:
        return now < self.contested_until

    def drifted_at(self, now: float) -> bool:
        return bool(self.drift_times) and self.drift_times[-1] == now

    def check_power(self, r: PowerReading, worst_mw: int, index: int, uuid: str) -> PowerReading:
        """The reading with impossible power values (negative, an overflowed counter, far
        above the card's highest limit) made unknown; logged once per episode."""
        limit_w = max(worst_mw / 1000, 1.0)
        why = None
        for name, v in (("power_avg_w", r.power_avg_w), ("power_instant_w", r.power_instant_w)):
            if v is not None and (v < 0 or v >= OVERFLOW_W or v > IMPOSSIBLE_FACTOR * limit_w):
                why = f"{name} {v:g} W outside 0..{IMPOSSIBLE_FACTOR * limit_w:g} W"
        if why is None:
            if self.implausible is not None:
                log.info("power_reading_plausible_again", index=index, uuid=uuid)
            self.implausible = None
            return r
        self.implausible_readings += 1
        if self.implausible is None:
            log.warning("power_reading_impossible", index=index, uuid=uuid, reason=why,
                        action="treated as unknown: the card neither lends nor borrows until it reads sane")
        self.implausible = why
        return PowerReading(None, None, r.requested_limit_w, r.enforced_limit_w)

    def lost(self) -> None:
        self.expected_mw = None  # whatever the card reads when it is back is news

    def confirmed(self, target_mw: int) -> None:
        self.expected_mw = target_mw  # our write is in force: expect it from now on

    def audit(self, led: CardLedger, r: PowerReading, target_mw: int | None, now: float, index: int, uuid: str) -> None:
        """Check one read for drift, contest, unknown power and excursions (logs)."""
        requested = led.requested_mw
        if self.expected_mw is not None and not led.inflight and requested not in (None, self.expected_mw):
            found_w = requested / 1000
            log.warning("limit_drift", index=index, uuid=uuid, expected_w=self.expected_mw / 1000, found_w=found_w,
                        action="re-applied (a driver reload, a GPU reset or another tool)")
            window = self.timings.contest_window_s
            self.drift_times = [t for t in self.drift_times if now - t < window] + [now]
            self.contested_w = found_w
            if len(self.drift_times) >= self.timings.contest_reverts:
                if not self.contested(now):
                    log.error("limit_contested", index=index, uuid=uuid, competing_w=found_w,
                              reverts=len(self.drift_times), window_s=window,
                              action="another tool keeps setting this limit: nothing is raised until it stops")
                self.contested_until = now + self.timings.contest_hold_s
            self.expected_mw = None
        elif self.contested_until != float("-inf") and not self.contested(now):
            log.info("limit_uncontested", index=index, uuid=uuid)
            self.contested_until = float("-inf")
        if not led.inflight and requested is not None and requested == target_mw:
            self.expected_mw = requested
        unknown = r.power_avg_w is None and r.power_instant_w is None
        if unknown != self.power_unknown:
            self.power_unknown = unknown
            (log.warning if unknown else log.info)(
                "power_reading_unknown" if unknown else "power_reading_back", index=index, uuid=uuid
            )
        enforced = led.enforced_mw
        over = r.power_instant_w is not None and enforced is not None and to_mw(r.power_instant_w) > enforced
        if over:
            self.peak_excursion_w = max(self.peak_excursion_w or 0.0, r.power_instant_w)  # type: ignore[type-var]
            if not self.over_limit:
                self.excursions += 1
        self.over_limit = over
