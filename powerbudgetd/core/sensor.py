"""A measured figure is a reading, not a fact: the one model every measured source of
wall power goes through (a UPS's load through NUT, a wall meter over MQTT; later a PDU,
a BMC, the CPU's RAPL counters), and the budget loop closed on it.

A source is a stream of values polled (or pushed) at the caller's pace. A
:class:`Sensor` turns it into :class:`Reading` objects, one per *change*: a value
equal to the last one is no new information (a UPS driver refreshes every 30 s while
we poll every 2 s), so it never moves a budget again. Each reading carries

- ``changed_at``: when the value changed (the poll that first saw it; the source's own
  stamp where it gives one) and ``previous_at``, the last poll that still showed the
  old value: the reading was taken between the two;
- ``refresh_s``: the interval the source shows (the median of its last changes, or
  the one stated);
- ``reach``: what it covers (:class:`Reach`): this host alone, or a meter that other
  controlled hosts also draw through (``hosts``, or this host's ``share`` of it);
- its units: watts at the plug (a source in other units is converted or refused by
  its channel; :mod:`powerbudgetd.core.plausible` is the one plausibility rule).

:class:`MeterLoop` closes the budget loop on such a source::

    allowed (board W) = own board power at the reading
                        + share x (plug-side limit - reading) x PSU efficiency

using each reading once, paired with our own board power at the time it was taken
(the lowest of a short history over the reading's window: that can only overstate
what the rest of the plug draws). A value that stands through a whole refresh while
our draw held steady is confirmed: used again, at most once a refresh (it is what a
refresh reading the same would say), paired with our draw now but never above the
highest draw of the window it was taken in (a source slower than its learnt refresh
cannot show again the headroom our cards have taken since). Below the
budget in force it drops at once (with the dead band of :func:`powerbudgetd.core.feed.next_wall_budget_w`); it rises
:data:`RISE_GAIN` of the way to what the reading allows, and no faster than
:data:`RISE_FRACTION_S` of the configured budget a second, so two hosts that each
believe they alone are behind the meter still do not overshoot on the way up. ``share`` is the loop gain of this host:
1 / hosts by default, so N hosts behind one meter correct its excess once, together.

A noisy source (a figure that flips ±60 W around a steady draw at every refresh) would
otherwise make the budget cycle: each high reading drops it at once, each low one raises
it half the way back. So the loop learns the source's noise (:class:`Noise`): the
peak-to-peak size of the reversals of the rest of the plug (the reading less our own
wall draw, known only to within our draw's moves over the reading's window, so what our
own moves can explain is not noise) over its last :data:`NOISE_CHANGES` readings; one
reversal is a load that came and went, noise is the second largest. A rise then follows
what the reading allows less that band (this host's share of it, in board W): what the
next high reading will allow, so the budget settles where the high readings put it and
stays. The band adds to the dead band of the rise (twice ``hysteresis_w``), never
replaces it; a quiet source has none. Drops are never held back by it.

Pure: no I/O, no clock (``now`` in s on one monotonic clock is passed in).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from itertools import pairwise

from powerbudgetd.core.feed import next_wall_budget_w
from powerbudgetd.core.nodemeter import Sample
from powerbudgetd.core.plausible import InputCheck, Verdict

RISE_GAIN = 0.5  # of the way up to what a reading allows, taken at that reading
RISE_FRACTION_S = 0.1  # the fastest a measured budget rises: of the configured budget, per second
AVERAGING_S = 1.0  # a meter averages over about this long before its figure changes
MAX_PAIR_S = 10.0  # the longest window a reading is paired over
FIRST_PAIR_S = 2.0  # the window of a first reading (or the first after a silence): its age is unknown
OWN_HISTORY_S = 120.0  # our own draw kept this long
REFRESH_HISTORY = 8  # changes the refresh interval is learnt from
MAX_REFRESH_S = 300.0  # a source that changes less often than this is taken as refreshing this often
NOISE_CHANGES = 8  # the changes a source's noise is learnt from


@dataclass(frozen=True)
class Reach:
    """What a meter covers: ``hosts`` controlled hosts (powerbudgetd daemons) behind it,
    this one included; ``share``: the fraction of the meter's excess and headroom this
    host takes (None: 1 / hosts). One host, no share: the meter is this host's alone.

    Raises ValueError for hosts under 1 or a share outside (0, 1]."""

    hosts: int = 1
    share: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.hosts, bool) or not 1 <= self.hosts <= 1000:
            raise ValueError(f"hosts must be 1 to 1000, got {self.hosts!r}")
        if self.share is not None and not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], got {self.share!r}")

    @property
    def fraction(self) -> float:
        """This host's loop gain on the meter: ``share``, else 1 / ``hosts``."""
        return self.share if self.share is not None else 1.0 / self.hosts

    @property
    def shared(self) -> bool:
        return self.fraction < 1.0

    def describe(self) -> str:
        """For ``check-config`` and the logs: which rule applies."""
        if not self.shared:
            return "the meter is this host's alone (no other controlled host behind it): it corrects the whole excess"
        if self.share is not None:
            return f"a shared meter: this host takes a share of {self.share:g} of its excess and headroom"
        return (f"a meter shared by {self.hosts} controlled hosts: each takes 1/{self.hosts} of its excess and "
                "headroom")


@dataclass(frozen=True)
class Reading:
    """One change of a source's value: ``value_w`` (W at the plug); ``changed_at`` (s):
    when it was first seen (or the source's stamp); ``previous_at`` (s): the last poll
    that still showed the old value (None: the first reading, or the first after a
    silence); ``refresh_s``: the interval the source shows (None: not known yet);
    ``reach``: what the meter covers; ``units``: always ``W`` here."""

    value_w: float
    changed_at: float
    previous_at: float | None
    refresh_s: float | None
    reach: Reach
    units: str = "W"


class OwnDraw:
    """A short history of our own summed board power (W) by time (s)."""

    def __init__(self, keep_s: float = OWN_HISTORY_S) -> None:
        self.keep_s = keep_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, now: float, board_w: float) -> None:
        self._samples.append((now, board_w))
        while self._samples and now - self._samples[0][0] > self.keep_s:
            self._samples.popleft()

    @property
    def latest_w(self) -> float | None:
        return self._samples[-1][1] if self._samples else None

    def steady(self, tolerance_w: float) -> tuple[float, float] | None:
        """(since when, at what level) our draw has stayed within ``tolerance_w`` of its
        latest sample (s, W); None with no sample."""
        if not self._samples:
            return None
        level = self._samples[-1][1]
        since = self._samples[-1][0]
        for t, w in reversed(self._samples):
            if abs(w - level) > tolerance_w:
                break
            since = t
        return since, level

    def highest(self, since: float, until: float) -> float | None:
        """The highest board power over [``since``, ``until``] (W), counting the sample in
        force at ``since``; None when nothing is known by ``until``."""
        best: float | None = None
        for t, w in self._samples:
            if t > until:
                break
            if t <= since:  # only the latest of these was in force at since
                best = w
                continue
            best = w if best is None else max(best, w)
        return best

    def lowest(self, since: float, until: float) -> float | None:
        """The lowest board power over [``since``, ``until``] (W), counting the sample in
        force at ``since``; None when nothing is known by ``until``."""
        best: float | None = None
        before: float | None = None
        for t, w in self._samples:
            if t > until:
                break
            if t <= since:  # the latest of these is the sample in force at since
                before = w
                continue
            best = w if best is None else min(best, w)
        if before is not None:
            best = before if best is None else min(best, before)
        return best


class Noise:
    """A source's noise (W at the plug), learnt from its last :data:`NOISE_CHANGES`
    readings of the rest of the plug: each the reading less our own wall draw, a range as
    wide as our draw moved over the window the reading was taken in. A move the ranges
    allow to be none is none (our own moves are not noise); the others, joined into legs
    (consecutive moves one way), give *reversals*: a leg followed by one the other way,
    sized by the smaller. One reversal is a load that came and went; noise reverses again
    and again, so the band is the second largest reversal: 0 for a quiet source, a step
    or a trend, and never more than the spread of the readings."""

    def __init__(self, keep: int = NOISE_CHANGES) -> None:
        self._rest: deque[tuple[float, float]] = deque(maxlen=keep + 1)

    def add(self, low_w: float, high_w: float) -> None:
        """The rest of the plug at a new reading (W): between ``low_w`` and ``high_w``, as
        our draw moved over the window it was taken in."""
        self._rest.append((low_w, high_w))

    @property
    def band_w(self) -> float:
        """The noise's peak-to-peak size (W at the plug); 0 until it reversed twice."""
        moves: list[float] = []  # between the ranges the rest must have held, each as wide as it can be
        cur: tuple[float, float] | None = None
        for lo, hi in self._rest:
            if cur is not None and max(cur[0], lo) <= min(cur[1], hi):
                cur = (max(cur[0], lo), min(cur[1], hi))
                continue
            if cur is not None:
                move = lo - cur[1] if lo > cur[1] else hi - cur[0]
                if moves and move * moves[-1] > 0:
                    moves[-1] += move  # one leg
                else:
                    moves.append(move)
            cur = (lo, hi)
        sizes = sorted((min(abs(x), abs(y)) for x, y in pairwise(moves) if x * y < 0), reverse=True)
        return sizes[1] if len(sizes) >= 2 else 0.0


class Sensor:
    """A source's values to :class:`Reading` objects, one per change; see the module
    docstring. ``refresh_s``: the interval the source states (None: learnt from it)."""

    def __init__(self, reach: Reach | None = None, *, refresh_s: float | None = None) -> None:
        self.reach = reach or Reach()
        self.stated_refresh_s = refresh_s
        self.value_w: float | None = None
        self.changed_at: float | None = None
        self.seen_at: float | None = None  # the last poll that showed value_w
        self.polled_at: float | None = None
        self.poll_gap_s = 1.0  # the last interval between polls (s)
        self._intervals: deque[float] = deque(maxlen=REFRESH_HISTORY)

    def poll(self, value_w: float, now: float, *, stamp: float | None = None) -> Reading | None:
        """The source's value at ``now``: a :class:`Reading` when it changed, None when it
        did not (no new information)."""
        if self.polled_at is not None and now > self.polled_at:
            self.poll_gap_s = now - self.polled_at  # the caller's pace: a refresh counts this many polls
        self.polled_at = now
        if value_w == self.value_w:
            self.seen_at = now
            return None
        changed_at = now if stamp is None else min(stamp, now)
        if self.changed_at is not None and self.value_w is not None:
            self._intervals.append(changed_at - self.changed_at)
        previous_at = self.seen_at
        self.value_w, self.changed_at, self.seen_at = value_w, changed_at, now
        return Reading(value_w, changed_at, previous_at, self.refresh_s, self.reach)

    def gap(self) -> None:
        """A silence: the next value is paired over a fresh window, its interval not learnt."""
        self.seen_at = None
        self.value_w = None
        self.changed_at = None

    @property
    def refresh_s(self) -> float | None:
        """The interval the source shows (s): stated, else the shortest of its last
        changes (it cannot change faster than it refreshes; a value that stayed the same
        over a refresh makes an interval longer, never shorter)."""
        if self.stated_refresh_s is not None:
            return self.stated_refresh_s
        if not self._intervals:
            return None
        return min(MAX_REFRESH_S, min(self._intervals))

    def sample(self) -> Sample | None:
        """The value standing now, when it changed and was last seen (None: no value,
        or a silence since): what a power-tree node's meter report carries."""
        if self.value_w is None or self.changed_at is None or self.seen_at is None:
            return None
        return Sample(self.value_w, self.changed_at, self.seen_at, self.refresh_s)

    def unchanged_s(self, now: float) -> float:
        """Seconds the value has stood unchanged at ``now``."""
        return 0.0 if self.changed_at is None else max(0.0, now - self.changed_at)


@dataclass(frozen=True)
class LoopParams:
    """The loop on one measured source: ``limit_w`` (plug-side limit, W),
    ``psu_efficiency`` (wall to board), ``hysteresis_w`` (board W dead band), ``reach``.

    Raises ValueError for a value out of range."""

    limit_w: float
    psu_efficiency: float = 0.9
    hysteresis_w: float = 20.0
    reach: Reach = Reach()
    rise_gain: float = RISE_GAIN
    rise_fraction_s: float = RISE_FRACTION_S

    def __post_init__(self) -> None:
        if not 0 < self.limit_w < float("inf") or not 0.5 < self.psu_efficiency <= 1 or self.hysteresis_w < 0:
            raise ValueError("limit_w > 0, psu_efficiency in (0.5, 1], hysteresis_w >= 0")
        if not 0 < self.rise_gain <= 1 or not self.rise_fraction_s > 0:
            raise ValueError("rise_gain in (0, 1], rise_fraction_s > 0")


class MeterLoop:
    """The board budget (W; None: not limiting) one measured source allows; see the
    module docstring. Feed our own draw with :meth:`own_draw` (every tick) and the
    source's values with :meth:`poll`; :attr:`budget_w` is what it allows."""

    def __init__(self, source: str, params: LoopParams, *, refresh_s: float | None = None) -> None:
        self.source = source
        self.params = params
        self.sensor = Sensor(params.reach, refresh_s=refresh_s)
        self.own = OwnDraw()
        self.plausibility = InputCheck(source)
        self.budget_w: float | None = None
        self.budget_at: float | None = None  # when budget_w last changed (s)
        self.allowed_w: float | None = None  # what the last reading allowed, before dead band and rise bounds
        self.paired_w: float | None = None  # our board power the last reading was paired with
        self.reading: Reading | None = None  # the last one used
        self.verdict: Verdict | None = None  # the last poll's, None when nothing was checked
        self._value_verdict: Verdict | None = None  # the verdict on the value standing now
        self._used_at: float | None = None  # when the standing value was last used (s)
        self._taken_high_w: float | None = None  # our highest draw over the window it was taken in (W)
        self.noise = Noise()

    def set_params(self, params: LoopParams) -> None:
        """New rules (a reload); the readings and trust so far stay."""
        self.params = params
        self.sensor.reach = params.reach

    def sample(self) -> Sample | None:
        """The source's standing value (:meth:`Sensor.sample`) while plausible: what a
        power-tree node's meter report carries (None: none, or one rejected)."""
        verdict = self._value_verdict
        if verdict is not None and not verdict.plausible:
            return None
        return self.sensor.sample()

    def own_draw(self, now: float, board_w: float) -> None:
        """Our cards' summed board power at ``now`` (W)."""
        self.own.add(now, board_w)

    def gap(self) -> None:
        """The source went silent: the next value starts a fresh pairing window."""
        self.sensor.gap()

    def reject(self, reason: str, value_w: float, why: str) -> Verdict | None:
        """A figure refused before it is a reading (``not_watts``, a raw ``sentinel``:
        :func:`powerbudgetd.core.plausible.not_watts`, ``raw_sentinel``), ``why`` saying
        what was wrong. The budget keeps its last good value; the source is distrusted;
        the next figure starts a fresh pairing window. None while no own draw is known."""
        board_w = self.own.latest_w
        if board_w is None:
            return None
        self.verdict = self._value_verdict = self.plausibility.reject(
            reason, value_w, board_w, self.params.psu_efficiency, why)
        self.sensor.gap()
        return self.verdict

    def poll(self, value_w: float, now: float, configured_w: float, *, resolution_w: float = 1.0,
             stamp: float | None = None) -> Verdict | None:
        """The source's value at ``now`` (W at the plug); ``configured_w``: the configured
        budget (W); ``resolution_w``: the value's step. Returns the plausibility verdict
        (None: nothing to check yet, no own draw known); :attr:`budget_w` moves only on a
        changed, plausible value."""
        eff = self.params.psu_efficiency
        reading = self.sensor.poll(value_w, now, stamp=stamp)
        if reading is None:  # unchanged: no new information, but a frozen figure shows here
            board_now = self.own.latest_w
            refresh = self.sensor.refresh_s
            polls_a_refresh = 1.0 if refresh is None else max(1.0, refresh / max(1e-3, self.sensor.poll_gap_s))
            frozen = None if board_now is None else self.plausibility.unchanged(
                value_w, board_now, eff, resolution_w=resolution_w, polls_a_refresh=polls_a_refresh)
            last = self._value_verdict
            if frozen is not None:
                self.verdict = self._value_verdict = frozen
            elif last is not None and not last.plausible:  # rejected while it stands (said once)
                self.verdict = replace(last, changed=False)
            elif last is not None and self.plausibility.trusted and self._confirmable(now):
                assert self.reading is not None and self._used_at is not None
                self.verdict = None
                # Paired with our steady draw now, but never above the highest draw of the
                # window the value was taken in: a source slower than its learnt refresh (one
                # that slowed down, a driver restarted with a longer pollfreq) then cannot
                # credit the same headroom again on top of the draw our cards took on it.
                low = [w for w in (self.own.latest_w, self._taken_high_w) if w is not None]
                self.paired_w = min(low) if low else 0.0
                self._use(self.reading, self.paired_w, now, configured_w)
            elif last is not None and not self.plausibility.trusted and self.reading is not None:
                # plausible and standing: one more toward trust; once trusted it may raise the budget
                self.verdict = self.plausibility.confirm(value_w, last.own_board_w, eff)
                if self.verdict.trusted and self.paired_w is not None:
                    self._use(self.reading, self.paired_w, now, configured_w)
            else:
                self.verdict = None
            return self.verdict
        if reading.previous_at is None:  # its age unknown: the window the daemon always paired over
            since = now - FIRST_PAIR_S
        else:  # taken since the last poll that showed the old value, averaged over about a second
            since = max(reading.previous_at - AVERAGING_S, now - MAX_PAIR_S)
        paired = self.own.lowest(since, now)
        if paired is None:
            self.verdict = None
            self.sensor.gap()  # not used: the next value is a change again
            return None
        self.verdict = self._value_verdict = self.plausibility.check(value_w, paired, eff, resolution_w=resolution_w)
        if not self.verdict.plausible:
            return self.verdict  # a lie: the last good budget stays
        self.reading, self.paired_w = reading, paired
        self._taken_high_w = self.own.highest(since, now)
        high = paired if self._taken_high_w is None else self._taken_high_w
        self.noise.add(value_w - high / eff, value_w - paired / eff)  # what our own draw cannot explain moved
        self._use(reading, paired, now, configured_w)
        return self.verdict

    def _confirmable(self, now: float) -> bool:
        """The standing value may be used again, paired with our draw now: that draw has
        held (within half the dead band) for a whole refresh of the source and a poll
        since the value was last used, and the value did not change, so it was taken at
        that draw: the same as a refresh that read the same (at most once a refresh)."""
        refresh = self.sensor.refresh_s
        if self.reading is None or refresh is None or self._used_at is None:
            return False
        steady = self.own.steady(self.params.hysteresis_w / 2)
        if steady is None:
            return False
        wait_s = refresh + self.sensor.poll_gap_s
        return now - max(steady[0], self._used_at) >= wait_s

    @property
    def noise_band_w(self) -> float:
        """The source's noise as this host's board W (:class:`Noise`, through the PSU and
        this host's share): the dead band a rise must clear on top of the hysteresis."""
        p = self.params
        return p.reach.fraction * p.psu_efficiency * self.noise.band_w

    def _use(self, reading: Reading, paired_w: float, now: float, configured_w: float) -> None:
        p = self.params
        self._used_at = now
        headroom_w = (p.limit_w - reading.value_w) * p.psu_efficiency  # board W; negative: an excess
        allowed = paired_w + p.reach.fraction * headroom_w
        self.allowed_w = allowed
        current = self.budget_w
        wanted = next_wall_budget_w(current, allowed, configured_w, p.hysteresis_w)
        in_force = configured_w if current is None else min(current, configured_w)
        rising = current is not None and (wanted is None or wanted > in_force)
        if rising and self.noise_band_w > 0:
            # on a noisy source a rise follows what the reading allows were it at the top of
            # the noise (what the next high one will allow): within the band it holds
            quiet_w = allowed - self.noise_band_w
            wanted = current if quiet_w < in_force else next_wall_budget_w(current, quiet_w, configured_w,
                                                                            p.hysteresis_w)
            rising = wanted is None or wanted > in_force
        if rising:
            # a rise: part of the way to what the reading allows, no faster than the rate bound
            target = configured_w if wanted is None else wanted
            step = p.rise_gain * (target - in_force)
            if self.budget_at is not None:
                step = min(step, p.rise_fraction_s * configured_w * max(0.0, now - self.budget_at))
            wanted = None if wanted is None and in_force + step >= configured_w - p.hysteresis_w else in_force + step
        admitted = self.plausibility.admit(current, wanted)
        if admitted != current or self.budget_at is None:
            self.budget_w, self.budget_at = admitted, now
