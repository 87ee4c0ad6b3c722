"""Plausibility of a measured budget input against the bank's own draw: one rule for every
source that reports power at the plug (a UPS's load or real power, a wall meter).

The one figure the daemon can trust is what its own cards draw (board power, read every
100 ms). A wall reading is checked against it before it may move the budget:

- **sentinel**: exactly 0 W, or a value drivers and firmwares use for "no data"
  (0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF), or one above :data:`MAX_WALL_W` or not
  finite (a garbled figure: a Redfish 1e300, a PDU's raw 2^31 scaled): a host that is
  running never draws 0 W, and no plug carries a megawatt;
- **below our own draw**: less than what our cards alone draw at the plug, board power
  / PSU efficiency (the ``core.feed`` model): the meter cannot be on this host's plug,
  or it lies;
- **not watts**: a figure its source gives in other units (a PDU's sensor whose units
  column says volt-amperes), or one above the apparent power (VA) the same source
  gives beside it: real power never exceeds apparent power, so the two are swapped (NUT's
  ``snmp-ups`` maps a Raritan PX2's outlet VA as ``realpower``) (:func:`not_watts`);
- **frozen**: the same value :data:`FROZEN_READINGS` refreshes in a row (polls, for a
  source that changes at every poll; :meth:`InputCheck.unchanged` is told how many
  polls a refresh of the source takes) while our own draw moved by more than
  :data:`FROZEN_SPAN_W` at the plug (and three times the reading's resolution): a
  meter on our plug would have moved too.

A new value (:meth:`InputCheck.check`) is checked against our draw *at the time it was
taken* (``core.sensor`` pairs them); a value seen again (:meth:`InputCheck.unchanged`)
is no new reading: only the frozen rule looks at it, against our draw now.

A rejected reading moves nothing: the budget the source allows keeps its last good
value. The source is *distrusted* from then on, until :data:`TRUST_AFTER` plausible
readings in a row have come back; while distrusted its plausible readings may lower its
budget but never raise it (:meth:`InputCheck.admit`). A lying input can only ever make
the budget lower or hold it.

Pure: no I/O, no clock; the caller logs :attr:`Verdict.detail` once, when
:attr:`Verdict.changed` says the source's trust changed.
"""

from __future__ import annotations

from dataclasses import dataclass

REASONS = ("sentinel", "below_own_draw", "frozen", "not_watts")
SENTINELS_W = frozenset({0.0, float(0x7FFF), float(0xFFFF), float(0x7FFFFFFF), float(0xFFFFFFFF)})
TRUST_AFTER = 5  # plausible readings in a row before a distrusted source may raise the budget again
FROZEN_READINGS = 10  # identical readings in a row ...
FROZEN_SPAN_W = 100.0  # ... while our own draw at the plug moved by more than this (W)
MAX_WALL_W = 1_000_000.0  # no plug a powerbudgetd host draws through carries more (the UPS's bound too)
RAW_SENTINELS = frozenset({0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF})  # a register's "no data", before scaling


def raw_sentinel(raw: int) -> bool:
    """A raw register or SNMP integer that means "no data" (before any scaling to W): a
    negative one (APC's -1 for "not available") or one of :data:`RAW_SENTINELS`."""
    return raw < 0 or raw in RAW_SENTINELS


def not_watts(value_w: float, units: str, apparent_va: float | None, resolution_w: float = 1.0) -> str | None:
    """Why a figure said to be real power is not watts, or None when it may be: ``units``
    as the source states them (``W``, ``VA``, ...); ``apparent_va``: the apparent power
    the same source gives beside it (None: not given); ``resolution_w``: their step."""
    if units != "W":
        return f"the source gives it in {units}, not W"
    if apparent_va is not None and value_w > apparent_va + resolution_w:
        return (f"{value_w:g} W is above the {apparent_va:g} VA of apparent power beside it: real power never is, "
                "so the two are swapped (a VA figure read as W)")
    return None


@dataclass(frozen=True)
class Verdict:
    """One reading's verdict. ``reason``: one of :data:`REASONS`, None when plausible;
    ``trusted``: after this reading, the source may raise the budget; ``changed``: its
    trust changed with this reading (say so once); ``detail``: the source, the value (W)
    and what our cards drew (board W, and at the plug), for the operator; ``value_w`` and
    ``own_board_w``: the reading (W at the plug) and our cards' board power (W)."""

    reason: str | None
    trusted: bool
    changed: bool
    detail: str
    value_w: float
    own_board_w: float

    @property
    def plausible(self) -> bool:
        return self.reason is None


class InputCheck:
    """The plausibility of one source's wall readings; see the module docstring.

    ``source``: its name in messages (``ups``, ``wall_meter``). Feed every reading to
    :meth:`check`; pass the budget it would allow through :meth:`admit`.
    """

    def __init__(self, source: str, *, trust_after: int = TRUST_AFTER, frozen_readings: int = FROZEN_READINGS,
                 frozen_span_w: float = FROZEN_SPAN_W) -> None:
        if trust_after < 1 or frozen_readings < 2 or frozen_span_w <= 0:
            raise ValueError("trust_after >= 1, frozen_readings >= 2 and frozen_span_w > 0")
        self.source = source
        self.trust_after = trust_after
        self.frozen_readings = frozen_readings
        self.frozen_span_w = frozen_span_w
        self.trusted = True
        self.good_run = 0  # plausible readings in a row since the last rejection
        self.rejected = 0  # readings rejected since the source was last trusted
        self._same: float | None = None  # the value repeated ...
        self._same_count = 0  # ... this many readings in a row
        self._own_lo_w = self._own_hi_w = 0.0  # our own draw at the plug over that run (W)

    def check(self, wall_w: float, board_w: float, psu_efficiency: float, *, resolution_w: float = 1.0,
              polls_a_refresh: float = 1.0) -> Verdict:
        """A wall reading (W at the plug) paired with our cards' board power (W).
        ``psu_efficiency`` in (0, 1]; ``resolution_w``: the reading's step (a UPS's
        ``ups.load`` is 1 % of its nominal power); ``polls_a_refresh``: how many polls
        a refresh of the source takes (the frozen rule counts refreshes)."""
        own_wall_w = board_w / psu_efficiency
        reason = self._reason(wall_w, own_wall_w, resolution_w, polls_a_refresh)
        return self._verdict(reason, wall_w, board_w, psu_efficiency, own_wall_w)

    def unchanged(self, wall_w: float, board_w: float, psu_efficiency: float, *, resolution_w: float = 1.0,
                  polls_a_refresh: float = 1.0) -> Verdict | None:
        """The same value seen again while our cards draw ``board_w`` now (W): no new
        reading, so only the frozen rule is applied; a Verdict when it finds the source
        frozen, None otherwise."""
        own_wall_w = board_w / psu_efficiency
        if wall_w != self._same:
            return None
        self._same_count += 1
        self._own_lo_w, self._own_hi_w = min(self._own_lo_w, own_wall_w), max(self._own_hi_w, own_wall_w)
        if not self._frozen(resolution_w, polls_a_refresh):
            return None
        return self._verdict("frozen", wall_w, board_w, psu_efficiency, own_wall_w)

    def confirm(self, wall_w: float, board_w: float, psu_efficiency: float) -> Verdict:
        """A distrusted source's plausible value standing through another poll (checked
        when it came, against ``board_w``, our draw then): one more plausible reading
        toward trust."""
        return self._verdict(None, wall_w, board_w, psu_efficiency, board_w / psu_efficiency)

    def reject(self, reason: str, wall_w: float, board_w: float, psu_efficiency: float, why: str) -> Verdict:
        """A figure refused before it is a reading (``not_watts``, a raw ``sentinel``):
        ``why`` says what was wrong; the source is distrusted as for any rejection."""
        if reason not in REASONS:
            raise ValueError(f"reason must be one of {REASONS}, got {reason!r}")
        return self._verdict(reason, wall_w, board_w, psu_efficiency, board_w / psu_efficiency, why)

    def _verdict(self, reason: str | None, wall_w: float, board_w: float, psu_efficiency: float,
                 own_wall_w: float, why: str | None = None) -> Verdict:
        drew = (f"{self.source} reads {wall_w:g} W at the plug while our cards drew {board_w:.0f} W of board power "
                f"({own_wall_w:.0f} W at the plug at PSU efficiency {psu_efficiency:g})")
        if reason is not None:
            self.good_run = 0
            self.rejected += 1
            changed, self.trusted = self.trusted, False
            garbled = not 0 <= wall_w <= MAX_WALL_W
            why = why or {"sentinel": f"not a figure any plug gives (0 to {MAX_WALL_W:g} W)" if garbled
                          else "a no-data sentinel", "not_watts": "not watts",
                          "below_own_draw": "less than our own cards draw",
                          "frozen": f"the same value {self._same_count} polls in a row while our draw moved "
                                    f"{self._own_hi_w - self._own_lo_w:.0f} W"}[reason]
            return Verdict(reason, False, changed,
                           f"{drew}: {why}; ignored, the budget it allows keeps its last good value", wall_w, board_w)
        self.good_run += 1
        if not self.trusted and self.good_run >= self.trust_after:
            self.trusted = True
            detail = f"{drew}: trusted again after {self.good_run} plausible readings ({self.rejected} rejected)"
            self.rejected = 0
            return Verdict(None, True, True, detail, wall_w, board_w)
        return Verdict(None, self.trusted, False, drew, wall_w, board_w)

    def admit(self, current_w: float | None, next_w: float | None) -> float | None:
        """The budget (W; None: not limiting) the source may hold after a plausible
        reading that allows ``next_w``: that, when trusted; while distrusted, only
        lower than ``current_w``, never higher (never from limiting to not)."""
        if self.trusted:
            return next_w
        if next_w is None:
            return current_w
        return next_w if current_w is None else min(current_w, next_w)

    def _frozen(self, resolution_w: float, polls_a_refresh: float) -> bool:
        span_w = max(self.frozen_span_w, 3 * resolution_w)
        return (self._same_count >= self.frozen_readings * max(1.0, polls_a_refresh)
                and self._own_hi_w - self._own_lo_w > span_w)

    def _reason(self, wall_w: float, own_wall_w: float, resolution_w: float, polls_a_refresh: float = 1.0) -> str | None:
        if wall_w == self._same:
            self._same_count += 1
            self._own_lo_w, self._own_hi_w = min(self._own_lo_w, own_wall_w), max(self._own_hi_w, own_wall_w)
        else:
            self._same, self._same_count, self._own_lo_w, self._own_hi_w = wall_w, 1, own_wall_w, own_wall_w
        if wall_w in SENTINELS_W or not 0 <= wall_w <= MAX_WALL_W:  # NaN fails the range too
            return "sentinel"
        if wall_w < own_wall_w:
            return "below_own_draw"
        return "frozen" if self._frozen(resolution_w, polls_a_refresh) else None
