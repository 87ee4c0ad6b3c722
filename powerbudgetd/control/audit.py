"""Per-card audit: what a read tells beyond the bound. Drift (someone else changed the
limit), contest (they keep doing it), excursions (instant draw above the enforced limit,
normal at load onset: counted, not acted on) and readings that cannot be believed.

None of this decides the bound (that is :mod:`powerbudgetd.control.ledger`); it decides
whether a card may lend or borrow and what the operator is told.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from powerbudgetd.control.ledger import CardLedger
from powerbudgetd.core.model import Timings
from powerbudgetd.core.units import to_mw, to_w
from powerbudgetd.hw.nvml import PowerReading

log = structlog.get_logger("powerbudgetd")

# A board reading this many times the card's highest limit is not a reading: the 1 s
# average is capped at the limit and instant peaks were measured at 1.35x it.
IMPOSSIBLE_FACTOR = 3.0
# NVML reports power in unsigned mW: a wrapped or garbage value reads this high.
OVERFLOW_W = to_w(2**31)
# Readings are judged over a short window, with hysteresis: an impossible value is taken
# for a fault (power unknown: the card neither lends nor borrows) only once readings have
# been impossible for this long, and believed again only once they have been plausible
# for as long. A lone bad sample (one 100 ms reading) is dropped: the last plausible
# values stand, so it changes no role and causes no write.
IMPLAUSIBLE_WINDOW_S = 0.3
# A 1 s average that has not moved by one mW for this long is suspect (it refreshes every
# 100 ms and carries noise): the energy counter is then asked, at most once per
# ENERGY_CHECK_S, whether the card really drew that much. More than the tolerance apart
# (the larger of FROZEN_TOLERANCE_W and FROZEN_TOLERANCE of the reading): frozen. Only a
# counter that moves is evidence.
FROZEN_AFTER_S = 2.0
ENERGY_CHECK_S = 2.0
FROZEN_TOLERANCE_W = 10.0
FROZEN_TOLERANCE = 0.1


def _impossible(v: float | None, limit_w: float) -> bool:
    """A power reading (W) no card can draw: negative, overflowed, or far above ``limit_w``."""
    return v is not None and (v < 0 or v >= OVERFLOW_W or v > IMPOSSIBLE_FACTOR * limit_w)


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
    implausible_readings: int = 0  # impossible readings not believed (exported as a counter)
    frozen_readings: int = 0  # frozen readings not believed (exported as a counter)
    frozen: bool = False  # the power reading is stuck while the energy counter moves
    _bad_since: float | None = None  # impossible readings in a row since (s)
    _good_since: float | None = None  # plausible readings in a row since (s), in an episode
    _plausible: PowerReading | None = None  # the last reading believed (its power, W, stands in)
    _same_w: float | None = None  # the 1 s average last seen ...
    _same_since: float = 0.0  # ... unchanged since (s)
    _energy_mark: tuple[float, float] | None = None  # (s, J) of the last energy read while suspect
    _unknown_said: bool = False

    @property
    def readings_rejected(self) -> tuple[tuple[str, int], ...]:
        """Power readings not believed so far, by reason (exported as a counter)."""
        if not self.frozen_readings and not self.implausible_readings:
            return (("frozen", 0), ("impossible", 0))  # a constant: read for every card every tick
        return (("frozen", self.frozen_readings), ("impossible", self.implausible_readings))

    def contested(self, now: float) -> bool:
        return now < self.contested_until

    def drifted_at(self, now: float) -> bool:
        return bool(self.drift_times) and self.drift_times[-1] == now

    def check_power(self, now: float, r: PowerReading, worst_mw: int, index: int, uuid: str) -> PowerReading:
        """The reading judged over ``IMPLAUSIBLE_WINDOW_S``: an impossible power value
        (negative, an overflowed counter, far above the card's highest limit) at ``now``
        (s) is replaced by the last plausible values until impossible readings have
        lasted the window; then the power is unknown (logged once per episode) until
        plausible readings have lasted the window too. Every impossible reading is counted."""
        limit_w = max(to_w(worst_mw), 1.0)
        why = None
        # Every card every tick: the two fields judged without a tuple built to loop over.
        if _impossible(avg := r.power_avg_w, limit_w):
            why = f"power_avg_w {avg:g} W outside 0..{IMPOSSIBLE_FACTOR * limit_w:g} W"
        if _impossible(instant := r.power_instant_w, limit_w):
            why = f"power_instant_w {instant:g} W outside 0..{IMPOSSIBLE_FACTOR * limit_w:g} W"
        if why is None:
            self._bad_since = None
            if self.implausible is not None:
                self._good_since = now if self._good_since is None else self._good_since
                if now - self._good_since < IMPLAUSIBLE_WINDOW_S - 1e-9:
                    return PowerReading(None, None, r.requested_limit_w, r.enforced_limit_w)
                log.info("power_reading_plausible_again", index=index, uuid=uuid)
                self.implausible = None
            self._plausible = r
            return r
        self.implausible_readings += 1
        self._good_since = None
        self._bad_since = now if self._bad_since is None else self._bad_since
        if self.implausible is None and now - self._bad_since < IMPLAUSIBLE_WINDOW_S - 1e-9:
            last = self._plausible
            return PowerReading(None if last is None else last.power_avg_w,
                                None if last is None else last.power_instant_w,
                                r.requested_limit_w, r.enforced_limit_w)
        if self.implausible is None:
            log.warning("power_reading_impossible", index=index, uuid=uuid, reason=why,
                        impossible_for_s=round(now - self._bad_since, 3),
                        action="treated as unknown: the card neither lends nor borrows until it reads sane")
        self.implausible = why
        return PowerReading(None, None, r.requested_limit_w, r.enforced_limit_w)

    def check_frozen(self, now: float, r: PowerReading, energy_j: Callable[[str], float | None],
                     index: int, uuid: str) -> PowerReading:
        """The reading with its power made unknown while it is frozen: the 1 s average
        unchanged for ``FROZEN_AFTER_S`` while the energy counter (``energy_j(uuid)``, J,
        read only while suspect) says the card drew something else. Logged once per episode."""
        avg = r.power_avg_w
        if avg is None or avg != self._same_w:
            if self.frozen:
                log.info("power_reading_moving_again", index=index, uuid=uuid)
            self._same_w, self._same_since, self._energy_mark, self.frozen = avg, now, None, False
            return r
        if now - self._same_since >= FROZEN_AFTER_S:
            mark = self._energy_mark
            if mark is None or now - mark[0] >= ENERGY_CHECK_S:
                self._energy_sample(now, energy_j(uuid), avg, index, uuid)
        if not self.frozen:
            return r
        self.frozen_readings += 1
        return PowerReading(None, None, r.requested_limit_w, r.enforced_limit_w)

    def _energy_sample(self, now: float, joules: float | None, avg_w: float, index: int, uuid: str) -> None:
        mark = self._energy_mark
        if joules is None:  # no energy counter (or it failed): no verdict either way
            return
        self._energy_mark = (now, joules)
        if mark is None or now <= mark[0] or joules <= mark[1]:
            return  # a counter standing still is no evidence either (it may be stuck itself)
        drawn_w = (joules - mark[1]) / (now - mark[0])
        frozen = abs(drawn_w - avg_w) > max(FROZEN_TOLERANCE_W, FROZEN_TOLERANCE * abs(avg_w))
        if frozen and not self.frozen:
            log.warning("power_reading_frozen", index=index, uuid=uuid, reading_w=avg_w,
                        energy_counter_w=round(drawn_w, 1), unchanged_s=round(now - self._same_since, 1),
                        action="treated as unknown: the card neither lends nor borrows until the reading moves")
        self.frozen = frozen

    def lost(self) -> None:
        self.expected_mw = None  # whatever the card reads when it is back is news

    def confirmed(self, target_mw: int) -> None:
        self.expected_mw = target_mw  # our write is in force: expect it from now on

    def audit(self, led: CardLedger, r: PowerReading, target_mw: int | None, now: float, index: int, uuid: str) -> None:
        """Check one read for drift, contest, unknown power and excursions (logs)."""
        requested = led.requested_mw
        if self.expected_mw is not None and not led.inflight and requested is not None and requested != self.expected_mw:
            found_w = to_w(requested)
            log.warning("limit_drift", index=index, uuid=uuid, expected_w=to_w(self.expected_mw), found_w=found_w,
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
            if unknown:  # an impossible or frozen reading has said so already, once
                self._unknown_said = self.implausible is None and not self.frozen
                if self._unknown_said:
                    log.warning("power_reading_unknown", index=index, uuid=uuid)
            elif self._unknown_said:
                log.info("power_reading_back", index=index, uuid=uuid)
        enforced = led.enforced_mw
        over = r.power_instant_w is not None and enforced is not None and to_mw(r.power_instant_w) > enforced
        if over:
            self.peak_excursion_w = max(self.peak_excursion_w or 0.0, r.power_instant_w)  # type: ignore[type-var]
            if not self.over_limit:
                self.excursions += 1
        self.over_limit = over
