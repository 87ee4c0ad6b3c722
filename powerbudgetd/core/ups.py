"""The UPS as a budget source: NUT variables in, a budget constraint out.

Pure and clock-free: :class:`UpsGuard` is fed parsed NUT variables (:func:`parse_vars`)
or a silence (NUT unreachable, stale data, the UPS gone) with the time ``now`` (s, any
monotonic clock) and answers, through :meth:`UpsGuard.evaluate`, the board budget (W)
the UPS allows, or None when it does not constrain. It can only lower the budget:

- on battery for ``on_battery_delay_s``: ``on_battery_w`` (reason ``ups_on_battery``);
  restored once ``OL`` has been read, fresh, for ``online_hold_s``. On battery is
  ``OB``, or ``OL DISCHRG`` (not ``CHRG``/``CAL``) with a falling charge (usbhid-ups's
  ``onlinedischarge`` case), or ``OL`` with an input voltage near 0 V
  (:attr:`UpsGuard.evidence` says which);
- ``WAIT`` (upsd has no data from the driver yet) is no status: a silence;
- ``LB``, ``FSD`` or ``OVER``: the bank's floor, every card at its minimum limit, at
  once (``ups_low_battery``, ``ups_forced_shutdown``, ``ups_overload``), until the flag
  has been clear for ``online_hold_s``;
- measured load: the UPS's real power (``ups.realpower``, else ``ups.load`` % x
  ``ups.realpower.nominal``) is wall truth, like a wall meter's reading, once it has
  passed the plausibility rule every wall figure passes (``core.plausible``: not a
  sentinel, not below our own cards' draw at the plug, not frozen). Above the plug-side
  limit it lowers the budget by the excess, in board watts, with a dead band
  (``ups_measured_load``); an implausible reading keeps the last good figure;
- silence: the constraint in force is kept (timers toward a restore do not run without
  fresh data); with ``stale_as_on_battery`` it falls to ``on_battery_w`` as well
  (``ups_stale``).

Flags follow NUT's ``ups.status`` (docs: "Status data"). Unknown flags are kept for
display and never change the budget; a value out of its bounds is dropped, never
clamped into something that could raise the budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from powerbudgetd.core.plausible import InputCheck, Verdict
from powerbudgetd.core.nodemeter import Sample
from powerbudgetd.core.sensor import RISE_FRACTION_S, RISE_GAIN, LoopParams, MeterLoop, Reach

# ups.status flags NUT defines. Anything else is unknown: shown, never acted on.
KNOWN_FLAGS = frozenset({
    "OL", "OB", "LB", "HB", "RB", "CHRG", "DISCHRG", "BYPASS", "CAL", "OFF", "OVER", "TRIM", "BOOST", "FSD",
    "ALARM", "TEST", "ECO",
})
# Flags that take every card to its floor, most severe first (that one names the reason).
FLOOR_FLAGS = (("FSD", "ups_forced_shutdown"), ("LB", "ups_low_battery"), ("OVER", "ups_overload"))
REASONS = (
    "ups_forced_shutdown", "ups_low_battery", "ups_overload", "ups_on_battery", "ups_stale", "ups_measured_load",
)
# NUT's "no data yet" (upsd serves it until the driver's first data): not a status.
NO_DATA_FLAGS = frozenset({"WAIT"})
# Mains gone although ``OB`` is not said: NUT's usbhid-ups ``onlinedischarge`` case
# (``OL DISCHRG`` with a falling charge; ``CHRG``/``CAL`` rule it out) and an input
# voltage near 0 V under ``OL``. The evidence names it in the log line and the metric.
EVIDENCE = ("OB", "OL DISCHRG", "input.voltage")
NO_INPUT_V = 20.0  # an input voltage below this is no mains (V)
MAX_STATUS_CHARS = 256  # a longer ups.status is not a UPS talking
MAX_FLAGS = 16

# (NUT variable, field, lowest, highest) accepted; outside: dropped as implausible.
BOUNDS: tuple[tuple[str, str, float, float], ...] = (
    ("ups.load", "load_pct", 0.0, 1000.0),
    ("ups.realpower", "realpower_w", 0.0, 1_000_000.0),
    ("ups.realpower.nominal", "realpower_nominal_w", 1.0, 1_000_000.0),
    ("battery.charge", "battery_charge_pct", 0.0, 100.0),
    ("battery.runtime", "battery_runtime_s", 0.0, 7 * 86400.0),  # a week: above it no battery, a sentinel
    ("input.voltage", "input_voltage_v", 0.0, 1000.0),
)


# Values firmwares and drivers use for "no data" (NUT passes them on), rejected like an
# out-of-bounds value: 0xFFFF s or minutes of runtime (65535 min = 3932100 s), and the like.
SENTINELS: Mapping[str, frozenset[float]] = {
    "battery.runtime": frozenset({65535.0, 3932100.0, 4294967295.0, 2147483647.0}),
    "battery.charge": frozenset({255.0}),
}


@dataclass(frozen=True)
class UpsReading:
    """One poll's variables, parsed and bounded. ``flags``: the known ``ups.status``
    flags; None when ``ups.status`` is missing (the UPS's state is unknown).
    ``unknown_flags``: the rest. ``rejected``: NUT variables dropped as non-numeric or
    out of bounds. Loads in %, powers in W, runtime in s, voltage in V."""

    flags: frozenset[str] | None
    unknown_flags: frozenset[str] = frozenset()
    load_pct: float | None = None
    realpower_w: float | None = None
    realpower_nominal_w: float | None = None
    battery_charge_pct: float | None = None
    battery_runtime_s: float | None = None
    input_voltage_v: float | None = None
    rejected: tuple[str, ...] = ()
    waiting: bool = False  # ``WAIT``: upsd has no data from the driver yet

    @property
    def on_battery(self) -> bool:
        return self.flags is not None and "OB" in self.flags

    @property
    def online(self) -> bool:
        """On line power, and saying so: ``OL`` without ``OB``."""
        return self.flags is not None and "OL" in self.flags and "OB" not in self.flags

    def wall_w(self) -> float | None:
        """The UPS's output real power (W): ``ups.realpower``, else ``ups.load`` % of
        ``ups.realpower.nominal``; None when neither is known."""
        if self.realpower_w is not None:
            return self.realpower_w
        if self.load_pct is not None and self.realpower_nominal_w is not None:
            return self.load_pct / 100.0 * self.realpower_nominal_w
        return None


def parse_status(text: str) -> tuple[frozenset[str], frozenset[str]] | None:
    """``ups.status`` -> (known flags, unknown flags); None when it is not a status
    (empty, too long, too many words, not printable)."""
    if not text or len(text) > MAX_STATUS_CHARS or not text.isprintable():
        return None
    words = text.upper().split()
    if not words or len(words) > MAX_FLAGS:
        return None
    known = frozenset(w for w in words if w in KNOWN_FLAGS)
    return known, frozenset(words) - known - NO_DATA_FLAGS


def _number(text: str, lo: float, hi: float, name: str | None = None) -> float | None:
    if len(text) > 32:
        return None
    if name is not None and name in SENTINELS:
        try:
            if float(text) in SENTINELS[name]:
                return None
        except ValueError:
            return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and lo <= value <= hi else None


def parse_vars(variables: Mapping[str, str]) -> UpsReading:
    """The variables of NUT's ``LIST VAR`` (name -> text) as a :class:`UpsReading`.
    Never raises on what a server sends: a bad value becomes None and is named in
    ``rejected``; a bad or missing ``ups.status`` gives ``flags`` None."""
    status = variables.get("ups.status")
    parsed = parse_status(status) if isinstance(status, str) else None
    rejected: list[str] = [] if status is None or parsed is not None else ["ups.status"]
    values: dict[str, float | None] = {}
    for name, key, lo, hi in BOUNDS:
        text = variables.get(name)
        if text is None:
            values[key] = None
            continue
        value = _number(text, lo, hi, name) if isinstance(text, str) else None
        if value is None:
            rejected.append(name)
        values[key] = value
    waiting = isinstance(status, str) and bool(NO_DATA_FLAGS & set(status.upper().split()))
    return UpsReading(
        waiting=waiting,
        flags=None if parsed is None else parsed[0],
        unknown_flags=frozenset() if parsed is None else parsed[1],
        rejected=tuple(rejected),
        **values,
    )


@dataclass(frozen=True)
class UpsParams:
    """How the UPS shapes the budget. ``on_battery_w`` (W) or ``on_battery_fraction``
    (of the configured budget) on battery; delays and holds in s. ``wall_limit_w``: the
    plug-side limit the measured load is held to (W; None: measured load ignored);
    ``psu_efficiency`` converts wall watts to board watts; ``hysteresis_w`` (board W) is
    the dead band of the measured-load budget.

    Raises ValueError naming the field for a value out of range."""

    on_battery_w: float | None = None
    on_battery_fraction: float | None = 0.5
    on_battery_delay_s: float = 0.0
    online_hold_s: float = 60.0
    stale_as_on_battery: bool = False
    wall_limit_w: float | None = None
    psu_efficiency: float = 0.9
    hysteresis_w: float = 20.0
    reach: Reach = Reach()  # the controlled hosts behind this UPS (``[ups] hosts`` / ``share``)
    rise_gain: float = RISE_GAIN  # core.sensor's bounded rise (the simulator's reference loop sets 1)
    rise_fraction_s: float = RISE_FRACTION_S

    def __post_init__(self) -> None:
        checks = [
            ("on_battery_w", self.on_battery_w is None or 0 <= self.on_battery_w < math.inf),
            ("on_battery_fraction", self.on_battery_fraction is None or 0 <= self.on_battery_fraction <= 1),
            ("on_battery_delay_s", 0 <= self.on_battery_delay_s < math.inf),
            ("online_hold_s", 0 <= self.online_hold_s < math.inf),
            ("wall_limit_w", self.wall_limit_w is None or 0 < self.wall_limit_w < math.inf),
            ("psu_efficiency", 0.5 < self.psu_efficiency <= 1),
            ("hysteresis_w", 0 <= self.hysteresis_w < math.inf),
        ]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"ups.{name} out of range: {getattr(self, name)!r}")
        if self.on_battery_w is None and self.on_battery_fraction is None:
            raise ValueError("ups: give on_battery_budget_w or on_battery_fraction")

    def battery_budget_w(self, configured_w: float) -> float:
        """The budget on battery (W): the fixed one, else the fraction of ``configured_w``."""
        if self.on_battery_w is not None:
            return min(self.on_battery_w, configured_w)
        return configured_w * (self.on_battery_fraction or 0.0)


@dataclass(frozen=True)
class UpsConstraint:
    """What the UPS offers: ``budget_w`` (W, never above the configured budget; None:
    no constraint) and the reason (one of :data:`REASONS`; None with no constraint)."""

    budget_w: float | None
    reason: str | None


@dataclass
class _Timers:
    on_battery_since: float | None = None  # first fresh OB of this outage
    online_since: float | None = None  # first fresh OL after an outage (the hold runs from it)
    online_run_since: float | None = None  # first fresh OL since the last OB or silence (after an outage or not)
    floor_flag: str | None = None  # the floor reason in force (latched until the hold passes)
    floor_clear_since: float | None = None
    silent_since: float | None = None


@dataclass
class UpsGuard:
    """The state machine; see the module docstring. Feed it with :meth:`observe` (a
    fresh reading) and :meth:`silence` (no usable data), ask it with :meth:`evaluate`.
    Times are ``now`` in s on one monotonic clock."""

    params: UpsParams
    last: UpsReading | None = None
    last_fresh_at: float | None = None
    battery_in_force: bool = False  # the on-battery budget applies (after the delay, until the hold)
    # ... and a fresh reading said on battery (not a silence taken as one): the feed is lost
    on_battery_seen: bool = False
    verdict: Verdict | None = None  # the last measured load's, None when it was not checked
    evidence: str | None = None  # why the last fresh reading is on battery (EVIDENCE), None: it is not
    _charge: float | None = None  # the battery charge last reported (%)
    _t: _Timers = field(default_factory=_Timers)
    _loop: MeterLoop | None = None

    # -- the measured load: a reading, through the sensor model (core.sensor) -----------
    @property
    def loop(self) -> MeterLoop | None:
        """The loop on the measured load; None without a plug-side limit."""
        p = self.params
        if p.wall_limit_w is None:
            self._loop = None
            return None
        params = LoopParams(p.wall_limit_w, p.psu_efficiency, p.hysteresis_w, p.reach, p.rise_gain, p.rise_fraction_s)
        if self._loop is None:
            self._loop = MeterLoop("ups", params)
        elif self._loop.params != params:
            self._loop.set_params(params)
        return self._loop

    @property
    def plausibility(self) -> InputCheck:
        loop = self.loop
        return loop.plausibility if loop is not None else InputCheck("ups")

    @property
    def meter_w(self) -> float | None:
        """The measured-load budget (board W) after the dead band; None: not limiting."""
        return None if self._loop is None or self.params.wall_limit_w is None else self._loop.budget_w

    @property
    def allowed_w(self) -> float | None:
        """What the last measured load allowed (board W), before dead band and rise bound."""
        return None if self._loop is None else self._loop.allowed_w

    def sample(self) -> Sample | None:
        """The measured load standing now, while plausible (``core.sensor.MeterLoop.sample``):
        what a power-tree node's meter report carries; None without a measured-load loop."""
        return None if self._loop is None else self._loop.sample()

    def own_draw(self, now: float, board_w: float) -> None:
        """Our cards' summed board power at ``now`` (W), every tick: the measured load
        is paired with it at the time the UPS's figure changed."""
        loop = self.loop
        if loop is not None:
            loop.own_draw(now, board_w)

    # -- inputs -----------------------------------------------------------------------
    def observe(self, reading: UpsReading, now: float, *, board_w: float | None, configured_w: float) -> None:
        """A fresh poll. ``board_w``: the GPUs' summed board power now (W; None: given
        by :meth:`own_draw` every tick instead); ``configured_w``: the configured budget
        (W). A reading without a known ``ups.status`` flag (missing, garbled, unknown
        words only) is a silence: it moves nothing."""
        if not reading.flags:
            self.last = reading
            self.silence(now)
            return
        t = self._t
        t.silent_since = None
        self.last, self.last_fresh_at = reading, now
        flags = reading.flags
        # Low battery, forced shutdown, overload: the floor at once, held until clear for the hold.
        floor = next((reason for flag, reason in FLOOR_FLAGS if flag in flags), None)
        if floor is not None:
            if t.floor_flag is None or REASONS.index(floor) < REASONS.index(t.floor_flag):
                t.floor_flag = floor
            t.floor_clear_since = None
        elif t.floor_flag is not None:
            t.floor_clear_since = now if t.floor_clear_since is None else t.floor_clear_since
            if now - t.floor_clear_since >= self.params.online_hold_s:
                t.floor_flag, t.floor_clear_since = None, None
        # On battery, after the delay; back on line for the hold.
        evidence = self._battery_evidence(reading)
        self.evidence = evidence
        on_battery = evidence is not None
        online = reading.online and not on_battery
        if on_battery:  # restarted as the budget's hold is: by OB or a silence, not by OFF or BYPASS
            t.online_run_since = None
        elif online and t.online_run_since is None:
            t.online_run_since = now
        if on_battery:
            t.online_since = None
            if t.on_battery_since is None:
                t.on_battery_since = now
            if now - t.on_battery_since >= self.params.on_battery_delay_s:
                self.battery_in_force = self.on_battery_seen = True
        elif online:
            t.on_battery_since = None
            if self.battery_in_force:
                t.online_since = now if t.online_since is None else t.online_since
                if now - t.online_since >= self.params.online_hold_s:
                    self.battery_in_force, self.on_battery_seen, t.online_since = False, False, None
        # neither OL nor OB (OFF, BYPASS, unknown words only): keep what is in force.
        self.verdict = None
        if board_w is not None:
            self.own_draw(now, board_w)
        self._measure(reading, now, configured_w)

    def _battery_evidence(self, r: UpsReading) -> str | None:
        """Why this reading says the UPS runs on battery (one of :data:`EVIDENCE`), None
        when it does not: ``OB``; ``OL DISCHRG`` (not ``CHRG`` or ``CAL``) with the
        charge falling; ``OL`` with the input voltage under :data:`NO_INPUT_V`."""
        flags = r.flags or frozenset()
        charge, self._charge = self._charge, r.battery_charge_pct if r.battery_charge_pct is not None else self._charge
        if "OB" in flags:
            return "OB"
        if "DISCHRG" in flags and not flags & {"CHRG", "CAL"}:
            was = self.evidence == "OL DISCHRG"
            if r.battery_charge_pct is not None and charge is not None and (
                    r.battery_charge_pct < charge or (was and r.battery_charge_pct <= charge)):
                return "OL DISCHRG"
        if r.input_voltage_v is not None and r.input_voltage_v < NO_INPUT_V and "OL" in flags:
            return "input.voltage"
        return None

    def silence(self, now: float) -> None:
        """No usable data at ``now`` (unreachable, stale, the UPS gone, refused): keep
        what is in force; the hold toward a restore starts over with fresh data."""
        t = self._t
        if t.silent_since is None:
            t.silent_since = now
        t.online_since = t.online_run_since = None
        t.floor_clear_since = None
        if self._loop is not None:
            self._loop.gap()
        if self.params.stale_as_on_battery and now - t.silent_since >= self.params.on_battery_delay_s:
            self.battery_in_force = True

    def feed_lost(self, now: float) -> bool | None:
        """Whether the feed this UPS carries is lost, for the power tree: True while a
        fresh on-battery reading's budget is in force (:attr:`on_battery_seen`); False
        once fresh on-line readings have lasted ``online_hold_s`` (at ``now``, s); None
        in between (on battery within the delay, on line within the hold, neither, a
        silence): neither mark nor lift. So a daemon started during an outage, or just
        after one, leaves a mark it made before as it is until the UPS says which."""
        if self.on_battery_seen:
            return True
        since = self._t.online_run_since
        return False if since is not None and now - since >= self.params.online_hold_s else None

    @property
    def silent(self) -> bool:
        return self._t.silent_since is not None

    def data_age_s(self, now: float) -> float | None:
        """Seconds since the last fresh reading; None before the first."""
        return None if self.last_fresh_at is None else max(0.0, now - self.last_fresh_at)

    def _measure(self, reading: UpsReading, now: float, configured_w: float) -> None:
        loop = self.loop
        wall_w = reading.wall_w()
        if loop is None or wall_w is None:
            return  # no figure to act on: the last measured-load budget stays
        from_load = reading.realpower_w is None and reading.realpower_nominal_w is not None
        step_w = reading.realpower_nominal_w / 100.0 if from_load and reading.realpower_nominal_w else 1.0
        # Used once, when it changes, paired with our draw when it was taken (core.sensor);
        # an implausible one keeps the last good measured-load budget.
        self.verdict = loop.poll(wall_w, now, configured_w, resolution_w=step_w)

    # -- output -----------------------------------------------------------------------
    def evaluate(self, now: float, configured_w: float, floor_w: float | None) -> UpsConstraint:
        """The budget the UPS allows at ``now`` (W) and why; never above
        ``configured_w``. ``floor_w``: the lowest budget the bank can be held to (W; None:
        unknown, then 0 W stands for it: the arbiter holds the cards at their minimums)."""
        t = self._t
        if t.floor_flag is not None:
            return UpsConstraint(min(configured_w, floor_w if floor_w is not None else 0.0), t.floor_flag)
        candidates: list[tuple[float, str]] = []
        if self.battery_in_force:
            candidates.append((self.params.battery_budget_w(configured_w), "ups_on_battery"))
        if self.meter_w is not None:
            candidates.append((self.meter_w, "ups_measured_load"))
        if not candidates:
            return UpsConstraint(None, None)
        budget_w, reason = min(candidates, key=lambda c: c[0])
        if budget_w >= configured_w:
            return UpsConstraint(None, None)
        if self.silent:
            reason = "ups_stale"  # a value kept (or set) through a silence
        return UpsConstraint(max(0.0, budget_w), reason)
