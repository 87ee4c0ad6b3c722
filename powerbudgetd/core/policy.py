"""The lending policy: which cap each controllable card should have (pure logic).

No I/O, no clock: the controller passes ``now`` and what it observed. The policy keeps
per-card timers and a short memory of each card's load pattern, so that it lends as
soon as a quiet spell is likely to last, keeps a bursty card's share while its pattern
holds, and never moves a card's limit back and forth faster than a limit should move.

Rules (fractions and holds in :class:`~powerbudgetd.core.model.Timings`):

- **quiet**: a card's draw (its instant reading, and its 1 s average too where it has
  no instant field) is at or under ``donor_enter_fraction`` x its floor (its minimum
  limit). A quiet card may become a **donor** (its cap drops to its floor) while some
  card borrows. It lends after ``donor_hold_s`` of quiet whatever its pattern; sooner
  (after :data:`QUIET_MIN_S`, or ``donor_hold_s`` if shorter) when its recent quiet
  spells say this one will likely last: the mean of what remained of the spells (that
  ended in the last :data:`PATTERN_MEMORY_S`) as long as this one so far is at least
  :data:`LEND_RESIDUAL_S`, or none lasted this long (the pattern no longer holds). A
  serving card idling 0.3-3 s between bursts therefore keeps its share through its
  gaps; a batch card idle for seconds between steps lends at once.
- **busy, below its limit**: a fair card that is not quiet and does not want more now,
  whose highest draw in each second of the last ``donor_hold_s`` (watched that long)
  stays at or under ``donor_enter_fraction`` x a limit :data:`LEND_MIN_MW` or more under
  its fair share, lends the difference while some card borrows: it becomes a donor at
  that limit (its highest draw / ``donor_enter_fraction``, whole steps of
  :data:`LEND_STEP_MW` up, never under its floor), the same margin a quiet donor keeps
  under its floor; should it turn quiet long enough to lend, it lends down to its floor.
- **wants more**: its instant draw is at ``pinned_fraction`` x its cap or more, or its
  1 s average is, or (a bursty load, whose average hides its peaks) its instant draw
  has been at the cap for ``burst_pinned_share`` of the last ``burst_window_s``. A card
  that has wanted more for ``recipient_hold_s`` — gaps shorter than
  :data:`WANT_GAP_S` (or ``burst_window_s``) do not restart that hold — may become a
  **recipient** (at once if it wants more now and donors' watts are already free,
  lent and not taken), unless it is quiet long enough to lend now (it lends instead;
  its wish outlives a short gap, so on waking it borrows again at once, but expires
  once it has been quiet for ``donor_hold_s``: then it earns its hold again): it gets its fair share plus
  the watts donors free, water-filled by priority, never above its max, nor above what
  it has shown it can use (a card that has not drawn near its cap for
  :data:`USE_MEMORY_S` gains nothing from a higher one: its raise is held to its
  highest recent draw / ``pinned_fraction``).
- **reclaim**: a donor whose draw (its instant reading; without one, the larger of
  the estimate and the average) reaches ``wake_fraction`` x the limit it lends down to
  (its floor, or a busy card's lent limit) returns to fair
  share at once; the plan lowers the recipients first.
- **release**: a recipient whose average stays under ``release_fraction`` x its fair
  share, and whose instant draw is at the cap less than ``burst_release_share`` of the
  time, for ``release_hold_s`` returns to fair share; donors return when no card has
  borrowed for ``release_hold_s``.
- **no flapping**: a move by choice (lending, a raise) that reverses the direction of
  the card's last move is made only if the card's limit has reversed so few times in
  the last :data:`FLAP_WINDOW_S` that this reversal, and the one a move back forced
  on it at any moment (a reclaim) would add, still leave at most
  :data:`MAX_REVERSALS` in any such window. Moves toward fair share (reclaim,
  release, a recipient cut to make room) are never held back; two of them in a row
  go the same way, so they add at most that one reversal.

Cards without an instant reading (field 186) get one estimated from the average: a
10-sample mean that rose by d since the last read had a newest sample about 10 d above
the one it dropped, which on a steady card is the previous mean. So a wake shows in
100-200 ms instead of the second the average needs.

A card is donor or recipient, never both, and every target is its floor, a lent limit
between its floor and its fair share, its fair share, or its fair share plus a part of
what the donors free: so the targets sum to at
most the pool (a property test holds this for any timings :class:`Timings` accepts).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from powerbudgetd.core.fairshare import waterfill
from powerbudgetd.core.model import Role, Timings
from powerbudgetd.core.units import budget_mw

QUIET_MIN_S = 0.5  # the shortest quiet spell a card lends on (5 readings at 100 ms)
PATTERN_MEMORY_S = 60.0  # quiet spells that ended this recently make a card's pattern
PATTERN_SPELLS = 16  # ... at most this many of them
LEND_RESIDUAL_S = 2.0  # lend early when a quiet spell is expected to last this much longer
WANT_GAP_S = 5.0  # gaps between bursts this short do not restart a card's recipient hold
USE_MEMORY_S = 10.0  # a recipient's raise is held to what it drew in this long ...
CEILING_STEP_MW = 25_000  # ... rounded up to whole steps of this
FLAP_WINDOW_S = 10.0  # no card's limit reverses direction more than ...
MAX_REVERSALS = 2  # ... this many times in any window this long
_FLAP_MARGIN_S = 0.5  # the limit lag and a tick or two between a target and the card
LEND_MIN_MW = 50_000  # a busy card lends only this much or more (at 25 W, hgx-8-day lost 0.2 % of work) ...
LEND_STEP_MW = 5_000  # ... down to a limit in whole steps of this


class CardView(NamedTuple):
    """What the policy sees of one controllable card; every value in integer mW. Named
    tuples, this and :class:`Target`: one of each is built per card every tick."""

    uuid: str
    share_mw: int  # fair share
    min_mw: int
    max_mw: int
    cap_mw: int  # the limit in force (enforced read-back)
    power_avg_mw: int | None
    power_instant_mw: int | None
    priority: int = 0  # higher borrows first


class Target(NamedTuple):
    """A card's target cap (mW), its role, and why it changed (``""`` if unchanged)."""

    limit_mw: int
    role: Role
    reason: str = ""


@dataclass
class _Track:
    role: Role = Role.FAIR
    quiet_since: float | None = None
    wants_since: float | None = None  # wanting more, gaps under burst_window_s forgiven
    last_wanted: float | None = None
    wants_now: bool = False
    cap_seen_mw: int | None = None
    idle_since: float | None = None
    limit_mw: int | None = None
    lend_mw: int | None = None  # a donor's limit: its floor, or a busy card's lent limit
    at_cap: float = 0.0  # share of recent time the instant draw sat at the cap (moving average)
    last_t: float | None = None
    prev_avg_mw: int | None = None
    instant_mw: int | None = None  # read, or estimated from the average (see module docstring)
    # Quiet spells that ended in a wake: (ended at s, lasted s), oldest first.
    spells: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=PATTERN_SPELLS))
    # Highest draw seen per second (s, mW), and whether the card sat at its cap in it.
    peaks: deque[tuple[float, int, bool]] = field(default_factory=deque)
    # Direction (+1 up, -1 down) of the last change of the target, and when it reversed.
    direction: int = 0
    reversals: deque[float] = field(default_factory=deque)


@dataclass
class LendingPolicy:
    """Decide targets each tick; see the module docstring for the rules."""

    timings: Timings = field(default_factory=Timings)
    _tracks: dict[str, _Track] = field(default_factory=dict)
    _last_borrow: float | None = None

    def reset(self) -> None:
        """Forget every timer and role (after a fault: start again from fair share)."""
        self._tracks.clear()
        self._last_borrow = None

    def role(self, uuid: str) -> Role:
        return self._tracks[uuid].role if uuid in self._tracks else Role.FAIR

    def decide(self, now: float, cards: Sequence[CardView], pool_mw: int) -> dict[str, Target]:
        """Targets for ``cards`` whose sum stays within ``pool_mw``.

        ``pool_mw`` is the budget left for these cards after fixed and lost ones are
        reserved; it must cover the fair shares (the controller guarantees it). A card
        is donor or recipient, never both, so the targets sum to at most ``pool_mw``
        (a property test holds this for any timings :class:`Timings` accepts).
        """
        reasons = self._returns(now, cards)
        by_id = {c.uuid: c for c in cards}
        tracks = {c.uuid: self._tracks[c.uuid] for c in cards}
        recipients = self._recipients(now, by_id, tracks, reasons)
        self._donors(now, by_id, tracks, reasons, recipients)
        extras = self._extras(now, pool_mw, by_id, tracks, reasons, recipients)
        min_step = budget_mw(self.timings.min_step_w)
        out: dict[str, Target] = {}
        for c in cards:
            t = tracks[c.uuid]
            if c.uuid in extras:
                if t.role != Role.RECIPIENT:
                    t.role, reasons[c.uuid] = Role.RECIPIENT, "lend"
                    t.idle_since = None  # its release hold starts now, not before it borrowed
                limit = c.share_mw + extras[c.uuid]
                # Hysteresis on raises: a few watts more are not worth a write.
                if t.limit_mw is not None and t.limit_mw < limit < t.limit_mw + min_step:
                    limit = t.limit_mw
            elif t.role == Role.DONOR:
                limit = _lent(t, c)
            else:
                limit = c.share_mw
            self._moved(t, limit, now)
            out[c.uuid] = Target(limit, t.role, reasons.get(c.uuid, ""))
        return out

    def _returns(self, now: float, cards: Sequence[CardView]) -> dict[str, str]:
        """Take each card's readings in; return to fair share the donors that woke
        (reclaim), the recipients idle for ``release_hold_s`` (release) and the cards
        whose power is unknown. Returns the reasons so far, by UUID."""
        tm = self.timings
        reasons: dict[str, str] = {}
        for c in cards:
            tr = self._tracks.get(c.uuid)
            if tr is None:  # not setdefault: that would build a track every tick
                tr = self._tracks[c.uuid] = _Track()
            self._update(tr, c, now)
            if tr.wants_since is not None and _held(tr.quiet_since, now, tm.donor_hold_s):
                # Quiet the whole hold: the wish expires. Not on the early lend (a serving
                # card's gap): expiring it there cost ada-2 work on the scoreboard.
                tr.wants_since = tr.last_wanted = None
            if _draw(c, tr) is None:  # power unknown: neither donor nor recipient
                if tr.role != Role.FAIR:
                    reasons[c.uuid] = "power_unknown"
                tr.role = Role.FAIR
            elif tr.role == Role.DONOR and _wake_draw(c, tr) >= tm.wake_fraction * _lent(tr, c):
                tr.role, reasons[c.uuid] = Role.FAIR, "reclaim"
            elif tr.role == Role.RECIPIENT and _held(tr.idle_since, now, tm.release_hold_s):
                tr.role, reasons[c.uuid] = Role.FAIR, "release"
        return reasons

    def _recipients(self, now: float, by_id: dict[str, CardView], tracks: dict[str, _Track],
                    reasons: dict[str, str]) -> list[str]:
        """The recipients: those that are, and the fair cards that have wanted more for
        ``recipient_hold_s`` (at once where donors' watts are free and unused)."""
        recipients = [u for u, t in tracks.items() if t.role == Role.RECIPIENT]
        # Watts already lent and not taken go at once to a card at its cap now.
        unused = any(t.role == Role.DONOR for t in tracks.values()) and all(
            (tracks[u].limit_mw or 0) >= by_id[u].max_mw for u in recipients)
        for u, t in tracks.items():
            held = _held(t.wants_since, now, self.timings.recipient_hold_s) or (unused and t.wants_now)
            if (t.role == Role.FAIR and u not in reasons and held and not self._quiet_lasts(t, now)
                    and self._may_move(t, by_id[u], now, up=True)):
                recipients.append(u)
        if any(by_id[u].max_mw > by_id[u].share_mw for u in recipients):
            self._last_borrow = now  # a card that can take more wants it
        return recipients

    def _donors(self, now: float, by_id: dict[str, CardView], tracks: dict[str, _Track],
                reasons: dict[str, str], recipients: list[str]) -> None:
        """While some card has borrowed within ``release_hold_s``, the fair cards whose
        quiet is likely to last become donors; otherwise every donor returns."""
        lending = self._last_borrow is not None and now - self._last_borrow < self.timings.release_hold_s
        borrowing = set(recipients)
        for u, t in tracks.items():
            c = by_id[u]
            if not lending and t.role == Role.DONOR:
                t.role, reasons[u] = Role.FAIR, "no_recipient"
            elif not lending or u in reasons or u in borrowing or c.min_mw >= c.share_mw:
                continue
            elif self._quiet_lasts(t, now):
                # Quiet long enough: lend down to the floor (a busy lender that went
                # quiet lends the rest: a move further down, no reversal).
                if (t.role == Role.FAIR or (t.role == Role.DONOR and _lent(t, c) > c.min_mw)) and \
                        self._may_move(t, c, now, up=False):
                    reasons.setdefault(u, "lend")
                    t.role, t.lend_mw = Role.DONOR, c.min_mw
            elif t.role == Role.FAIR and (lent := self._busy_lends(t, c, now)) is not None and \
                    self._may_move(t, c, now, up=False):
                t.role, t.lend_mw, reasons[u] = Role.DONOR, lent, "lend"

    def _extras(self, now: float, pool_mw: int, by_id: dict[str, CardView], tracks: dict[str, _Track],
                reasons: dict[str, str], recipients: list[str]) -> dict[str, int]:
        """What each recipient gets above its fair share (mW): the pool left once every
        other card has its target, by priority, within what each has shown it can use,
        and without a raise or a cut that would flap."""
        fixed_mw = sum(_lent(tracks[u], c) if tracks[u].role == Role.DONOR else c.share_mw for u, c in by_id.items())
        spare = pool_mw - fixed_mw
        if recipients and spare < budget_mw(self.timings.min_step_w):
            # Nothing worth lending: recipients-to-be stay at fair share.
            for u in recipients:
                if tracks[u].role == Role.RECIPIENT:
                    tracks[u].role, reasons[u] = Role.FAIR, "nothing_to_lend"
            return {}
        ceilings = {u: self._ceiling(tracks[u], by_id[u], now) for u in recipients}
        for u in recipients:  # a raise that would flap waits: the card keeps what it has
            t, c = tracks[u], by_id[u]
            if t.limit_mw is not None and not self._may_move(t, c, now, up=True):
                ceilings[u] = max(0, min(ceilings[u], t.limit_mw - c.share_mw))
        extras = _by_priority(spare, [by_id[u] for u in recipients], ceilings)
        # A recipient squeezed only because the spare is shared out differently (not a
        # reclaim or a release) keeps its limit where lowering it would flap; the others
        # share what is left. When the pool itself shrank, it has to give way.
        keep = {
            u: tracks[u].limit_mw - by_id[u].share_mw  # type: ignore[operator]
            for u in recipients
            if tracks[u].limit_mw is not None and tracks[u].direction == 1
            and extras[u] < tracks[u].limit_mw - by_id[u].share_mw  # type: ignore[operator]
            and not self._may_move(tracks[u], by_id[u], now, up=False)
        }
        if keep and sum(keep.values()) <= spare:
            rest = [by_id[u] for u in recipients if u not in keep]
            extras = {**_by_priority(spare - sum(keep.values()), rest, ceilings), **keep}
        return extras

    # -- what the readings say --------------------------------------------------------
    def _update(self, tr: _Track, c: CardView, now: float) -> None:
        tm = self.timings
        avg = c.power_avg_mw
        dt = tm.tick_s if tr.last_t is None else now - tr.last_t
        tr.last_t = now
        tr.instant_mw = c.power_instant_mw
        if tr.instant_mw is None and avg is not None and tr.prev_avg_mw is not None:
            tr.instant_mw = tr.prev_avg_mw + 10 * (avg - tr.prev_avg_mw)
        tr.prev_avg_mw = avg
        sample = tr.instant_mw if tr.instant_mw is not None else avg
        if tr.cap_seen_mw is not None and c.cap_mw > tr.cap_seen_mw:
            tr.at_cap = 0.0  # time at a lower cap says nothing about the new one
        tr.cap_seen_mw = c.cap_mw
        at_cap_now = sample is not None and sample >= tm.pinned_fraction * c.cap_mw
        tr.at_cap += min(1.0, dt / tm.burst_window_s) * (float(at_cap_now) - tr.at_cap)
        draw = _draw(c, tr)
        # Quiet on the instant reading (the average trails a burst's end by a second);
        # a card without the instant field is quiet only when its average agrees.
        quiet_at = tm.donor_enter_fraction * c.min_mw
        quiet = sample is not None and sample <= quiet_at and (
            c.power_instant_mw is not None or (avg is not None and avg <= quiet_at)
        )
        wants = not quiet and (
            at_cap_now or (avg is not None and avg >= tm.pinned_fraction * c.cap_mw)
            or tr.at_cap >= tm.burst_pinned_share
        )
        idle = (avg is None or avg < tm.release_fraction * c.share_mw) and tr.at_cap < tm.burst_release_share
        if quiet:
            tr.quiet_since = tr.quiet_since if tr.quiet_since is not None else now
        elif tr.quiet_since is not None:
            tr.spells.append((now, now - tr.quiet_since))
            tr.quiet_since = None
        while tr.spells and now - tr.spells[0][0] > PATTERN_MEMORY_S:
            tr.spells.popleft()
        # A bursty card's gaps (quiet or not) do not restart its hold: only a spell
        # without wanting longer than WANT_GAP_S (or burst_window_s) does.
        gap_s = max(WANT_GAP_S, tm.burst_window_s)
        if wants:
            gap_ok = tr.last_wanted is not None and now - tr.last_wanted <= gap_s
            tr.wants_since = tr.wants_since if tr.wants_since is not None and gap_ok else now
            tr.last_wanted = now
        elif tr.last_wanted is None or now - tr.last_wanted > gap_s:
            tr.wants_since = None
        tr.wants_now = wants
        tr.idle_since = (tr.idle_since if tr.idle_since is not None else now) if idle else None
        if draw is not None:
            second = float(int(now))
            if tr.peaks and tr.peaks[-1][0] == second:
                _, mw, capped = tr.peaks[-1]
                if draw > mw or (at_cap_now and not capped):  # else unchanged: no tuple built
                    tr.peaks[-1] = (second, max(mw, draw), capped or at_cap_now)
            else:
                tr.peaks.append((second, draw, at_cap_now))
            while tr.peaks and now - tr.peaks[0][0] > USE_MEMORY_S + 1.0:
                tr.peaks.popleft()

    def _quiet_lasts(self, tr: _Track, now: float) -> bool:
        """Quiet long enough to lend: ``donor_hold_s``, or sooner where the card's
        recent quiet spells say this one is likely to last (module docstring)."""
        tm = self.timings
        if tr.quiet_since is None:
            return False
        quiet_s = now - tr.quiet_since
        if quiet_s >= tm.donor_hold_s - 1e-9:
            return True
        if quiet_s < min(QUIET_MIN_S, tm.donor_hold_s) - 1e-9:
            return False
        longer = [lasted - quiet_s for _, lasted in tr.spells if lasted > quiet_s]
        return not longer or sum(longer) / len(longer) >= LEND_RESIDUAL_S

    def _busy_lends(self, tr: _Track, c: CardView, now: float) -> int | None:
        """The limit a busy card below its fair share may lend down to (mW), or None:
        its highest draw in each second of the last ``donor_hold_s`` (watched that long,
        never at its cap, not wanting more now) / ``donor_enter_fraction``, rounded up to
        :data:`LEND_STEP_MW`, at least its floor, and :data:`LEND_MIN_MW` or more under
        its fair share."""
        tm = self.timings
        window = tm.donor_hold_s
        peaks = tr.peaks
        if tr.wants_now or not peaks or now - peaks[0][0] < window + 1.0:
            return None  # seconds are whole: one more covers the window from its start
        highest = 0
        for s, mw, capped in peaks:
            if now - s <= window + 1.0:
                if capped:
                    return None
                highest = mw if mw > highest else highest
        steps = -(-int(highest / tm.donor_enter_fraction) // LEND_STEP_MW)
        lent = max(c.min_mw, steps * LEND_STEP_MW)
        return lent if lent <= c.share_mw - LEND_MIN_MW else None

    def _ceiling(self, tr: _Track, c: CardView, now: float) -> int:
        """The most extra (mW above fair share) a recipient has shown it can use: up to
        its max if it sat at its cap in the last :data:`USE_MEMORY_S` (or has not been
        watched that long), else its highest draw then / ``pinned_fraction``, in whole
        steps of :data:`CEILING_STEP_MW` and one more, so that a wandering draw does not
        move its cap."""
        room = c.max_mw - c.share_mw
        peaks = tr.peaks
        if not peaks or now - peaks[0][0] < USE_MEMORY_S:
            return room  # not watched that long
        highest = None
        for s, mw, capped in peaks:  # one pass: read for every recipient, every tick
            if now - s <= USE_MEMORY_S:
                if capped:
                    return room
                highest = mw if highest is None or mw > highest else highest
        if highest is None:
            return room
        usable = highest / self.timings.pinned_fraction - c.share_mw
        # Rounded up, plus a step: at a ceiling of exactly draw / pinned_fraction the same
        # draw reads as pinned again, lifting the ceiling and lowering it 10 s later.
        steps = -(-int(usable) // CEILING_STEP_MW) + 1
        return max(0, min(room, steps * CEILING_STEP_MW))

    # -- flapping ---------------------------------------------------------------------
    def _reversals(self, tr: _Track, now: float) -> int:
        while tr.reversals and now - tr.reversals[0] > FLAP_WINDOW_S + _FLAP_MARGIN_S:
            tr.reversals.popleft()
        return len(tr.reversals)

    def _may_move(self, tr: _Track, c: CardView, now: float, up: bool) -> bool:
        """Whether the card's target may move away from fair share by choice (up: a
        raise, else lending). A reclaim may force it back at any moment, so a move that
        reverses the last one, or that leaves fair share, is allowed only if it and
        that move back leave at most MAX_REVERSALS in the window. A move further out
        on the side the card already is on adds nothing: that move back was counted."""
        direction = 1 if up else -1
        reverses = bool(tr.direction) and direction != tr.direction
        current = tr.limit_mw if tr.limit_mw is not None else c.share_mw
        away = current > c.share_mw if up else current < c.share_mw
        if away and not reverses:
            return True
        return self._reversals(tr, now) + int(reverses) + 1 <= MAX_REVERSALS

    def _moved(self, tr: _Track, limit_mw: int, now: float) -> None:
        if tr.limit_mw is not None and limit_mw != tr.limit_mw:
            direction = 1 if limit_mw > tr.limit_mw else -1
            if tr.direction and direction != tr.direction:
                tr.reversals.append(now)
            tr.direction = direction
        tr.limit_mw = limit_mw


def _draw(c: CardView, tr: _Track) -> int | None:
    """The larger of the average and the instant reading (or its estimate); None: neither."""
    avg, instant = c.power_avg_mw, tr.instant_mw
    if avg is None or instant is None:
        return instant if avg is None else avg
    return avg if avg > instant else instant


def _wake_draw(c: CardView, tr: _Track) -> int:
    """What a donor's wake is judged on: its instant reading where it has one (its 1 s
    average still shows the load it lent after), else the larger of the estimate and
    the average."""
    if c.power_instant_mw is not None:
        return c.power_instant_mw
    return _draw(c, tr) or 0


def _lent(tr: _Track, c: CardView) -> int:
    """A donor's limit (mW): what it lends down to, within its floor and its fair share
    (a share that fell since keeps the targets within the pool)."""
    lent = c.min_mw if tr.lend_mw is None else tr.lend_mw
    return max(c.min_mw, min(lent, c.share_mw))


def _held(since: float | None, now: float, hold_s: float) -> bool:
    return since is not None and now - since >= hold_s - 1e-9


def _by_priority(spare_mw: int, recipients: list[CardView], ceilings: dict[str, int]) -> dict[str, int]:
    """Split ``spare_mw`` over recipients: higher priority groups fill first, an even
    level within a group, each capped at ``ceilings`` (mW above its share). Returns
    extra mW per uuid."""
    extras: dict[str, int] = {}
    for prio in sorted({c.priority for c in recipients}, reverse=True):
        group = [c for c in recipients if c.priority == prio]
        got = waterfill(max(spare_mw, 0), [0] * len(group), [ceilings[c.uuid] for c in group])
        for c, extra in zip(group, got):
            extras[c.uuid] = extra
        spare_mw -= sum(got)
    return extras
