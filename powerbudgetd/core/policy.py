"""The lending policy: which cap each controllable card should have (pure logic).

No I/O, no clock: the controller passes ``now`` and what it observed. The policy keeps
only per-card timers (how long a card has been quiet, pinned, or not busy), so that its
decisions have hysteresis and hold times and a bursty load does not move caps each tick.

Rules (fractions and holds in :class:`~powerbudgetd.core.model.Timings`):

- a card whose draw (max of 1 s average and instant) has stayed at or under
  ``donor_enter_fraction`` x its floor for ``donor_hold_s`` may become a **donor**: its
  cap drops to its floor (its minimum limit). It lends only while some card borrows.
- a card that has stayed **pinned** for ``recipient_hold_s`` may become a **recipient**:
  it gets its fair share plus the watts donors free, water-filled by priority, never
  above its max. Pinned: its 1 s average is at ``pinned_fraction`` x its cap or more, or
  (a bursty load, whose average hides its peaks) its instant draw has been at the cap
  for ``burst_pinned_share`` of the last ``burst_window_s``.
- **reclaim**: a donor whose instant (or average) draw reaches ``wake_fraction`` x its
  floor returns to fair share at once; the plan lowers the recipients first.
- a recipient whose average stays under ``release_fraction`` x its fair share, and
  whose instant draw is at the cap less than ``burst_release_share`` of the time, for
  ``release_hold_s`` returns to fair share.

Cards without an instant reading (field 186) get one estimated from the average: a
10-sample mean that rose by d since the last read had a newest sample about 10 d above
the one it dropped, which on a steady card is the previous mean. So a wake shows in
100-200 ms instead of the second the average needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from powerbudgetd.core.fairshare import waterfill
from powerbudgetd.core.model import Role, Timings


@dataclass(frozen=True)
class CardView:
    """What the policy sees of one controllable card; every value in integer mW."""

    uuid: str
    share_mw: int  # fair share
    min_mw: int
    max_mw: int
    cap_mw: int  # the limit in force (enforced read-back)
    power_avg_mw: int | None
    power_instant_mw: int | None
    priority: int = 0  # higher borrows first


@dataclass(frozen=True)
class Target:
    """A card's target cap (mW), its role, and why it changed (``""`` if unchanged)."""

    limit_mw: int
    role: Role
    reason: str = ""


@dataclass
class _Track:
    role: Role = Role.FAIR
    quiet_since: float | None = None
    pinned_since: float | None = None
    idle_since: float | None = None
    limit_mw: int | None = None
    at_cap: float = 0.0  # share of recent time the instant draw sat at the cap (moving average)
    last_t: float | None = None
    prev_avg_mw: int | None = None
    instant_mw: int | None = None  # read, or estimated from the average (see module docstring)


@dataclass
class LendingPolicy:
    """Decide targets each tick; see the module docstring for the rules."""

    timings: Timings = field(default_factory=Timings)
    _tracks: dict[str, _Track] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget every timer and role (after a fault: start again from fair share)."""
        self._tracks.clear()

    def role(self, uuid: str) -> Role:
        return self._tracks[uuid].role if uuid in self._tracks else Role.FAIR

    def decide(self, now: float, cards: Sequence[CardView], pool_mw: int) -> dict[str, Target]:
        """Targets for ``cards`` whose sum stays within ``pool_mw``.

        ``pool_mw`` is the budget left for these cards after fixed and lost ones are
        reserved; it must cover the fair shares (the controller guarantees it). A card
        is donor or recipient, never both, so the targets sum to at most ``pool_mw``
        (a property test holds this for any timings :class:`Timings` accepts).
        """
        tm = self.timings
        reasons: dict[str, str] = {}
        for c in cards:
            tr = self._tracks.setdefault(c.uuid, _Track())
            self._update_timers(tr, c, now)
            draw = _draw(c, tr)
            if draw is None:  # power unknown: neither donor nor recipient
                if tr.role != Role.FAIR:
                    reasons[c.uuid] = "power_unknown"
                tr.role = Role.FAIR
            elif tr.role == Role.DONOR and draw >= tm.wake_fraction * c.min_mw:
                tr.role, reasons[c.uuid] = Role.FAIR, "reclaim"
                tr.quiet_since = None
            elif tr.role == Role.RECIPIENT and _held(tr.idle_since, now, tm.release_hold_s):
                tr.role, reasons[c.uuid] = Role.FAIR, "release"

        by_id = {c.uuid: c for c in cards}
        tracks = {c.uuid: self._tracks[c.uuid] for c in cards}
        recipients = [u for u, t in tracks.items() if t.role == Role.RECIPIENT]
        for u, t in tracks.items():
            if t.role == Role.FAIR and u not in reasons and _held(t.pinned_since, now, tm.recipient_hold_s):
                recipients.append(u)
        if recipients:
            for u, t in tracks.items():
                c = by_id[u]
                lendable = c.min_mw < c.share_mw
                if (t.role == Role.FAIR and u not in reasons and u not in recipients and lendable
                        and _held(t.quiet_since, now, tm.donor_hold_s)):
                    t.role, reasons[u] = Role.DONOR, "lend"
        else:
            for u, t in tracks.items():
                if t.role == Role.DONOR:
                    t.role, reasons[u] = Role.FAIR, "no_recipient"

        # What is left for recipients once everyone else has its target.
        fixed_mw = sum(c.min_mw if tracks[c.uuid].role == Role.DONOR else c.share_mw for c in cards)
        spare = pool_mw - fixed_mw
        min_step = int(tm.min_step_w * 1000)
        if recipients and spare < min_step:
            # Nothing worth lending: recipients-to-be stay at fair share.
            for u in recipients:
                if tracks[u].role == Role.RECIPIENT:
                    tracks[u].role, reasons[u] = Role.FAIR, "nothing_to_lend"
            recipients = []
        extras = _by_priority(spare, [by_id[u] for u in recipients])

        out: dict[str, Target] = {}
        for c in cards:
            t = tracks[c.uuid]
            if c.uuid in extras:
                if t.role != Role.RECIPIENT:
                    t.role, reasons[c.uuid] = Role.RECIPIENT, "lend"
                limit = c.share_mw + extras[c.uuid]
                # Hysteresis on raises: a few watts more are not worth a write.
                if t.limit_mw is not None and t.limit_mw < limit < t.limit_mw + min_step:
                    limit = t.limit_mw
            elif t.role == Role.DONOR:
                limit = c.min_mw
            else:
                limit = c.share_mw
            t.limit_mw = limit
            out[c.uuid] = Target(limit, t.role, reasons.get(c.uuid, ""))
        return out

    def _update_timers(self, tr: _Track, c: CardView, now: float) -> None:
        tm = self.timings
        avg = c.power_avg_mw
        dt = tm.tick_s if tr.last_t is None else now - tr.last_t
        tr.last_t = now
        tr.instant_mw = c.power_instant_mw
        if tr.instant_mw is None and avg is not None and tr.prev_avg_mw is not None:
            tr.instant_mw = tr.prev_avg_mw + 10 * (avg - tr.prev_avg_mw)
        tr.prev_avg_mw = avg
        sample = tr.instant_mw if tr.instant_mw is not None else avg
        at_cap = sample is not None and sample >= tm.pinned_fraction * c.cap_mw
        tr.at_cap += min(1.0, dt / tm.burst_window_s) * (float(at_cap) - tr.at_cap)
        draw = _draw(c, tr)
        quiet = draw is not None and draw <= tm.donor_enter_fraction * c.min_mw
        # A card quiet now is not pinned now, whatever its recent time at the cap says:
        # otherwise it could lend its watts and borrow them back in the same tick.
        pinned = not quiet and (
            (avg is not None and avg >= tm.pinned_fraction * c.cap_mw) or tr.at_cap >= tm.burst_pinned_share
        )
        idle = (avg is None or avg < tm.release_fraction * c.share_mw) and tr.at_cap < tm.burst_release_share
        tr.quiet_since = (tr.quiet_since if tr.quiet_since is not None else now) if quiet else None
        tr.pinned_since = (tr.pinned_since if tr.pinned_since is not None else now) if pinned else None
        tr.idle_since = (tr.idle_since if tr.idle_since is not None else now) if idle else None


def _draw(c: CardView, tr: _Track) -> int | None:
    known = [p for p in (c.power_avg_mw, tr.instant_mw) if p is not None]
    return max(known) if known else None


def _held(since: float | None, now: float, hold_s: float) -> bool:
    return since is not None and now - since >= hold_s - 1e-9


def _by_priority(spare_mw: int, recipients: list[CardView]) -> dict[str, int]:
    """Split ``spare_mw`` over recipients: higher priority groups fill first, an even
    level within a group, each capped at max - share. Returns extra mW per uuid."""
    extras: dict[str, int] = {}
    for prio in sorted({c.priority for c in recipients}, reverse=True):
        group = [c for c in recipients if c.priority == prio]
        got = waterfill(max(spare_mw, 0), [0] * len(group), [c.max_mw - c.share_mw for c in group])
        for c, extra in zip(group, got):
            extras[c.uuid] = extra
        spare_mw -= sum(got)
    return extras
