"""The per-card ledger: what makes the budget invariant true for one card. Pure.

No I/O, no clock: the controller passes ``now`` (s) and what it read (integer mW).
For each card the ledger keeps the **bound**, the highest limit that may be in force:

    bound = max(requested, enforced, every write of ours not yet confirmed,
                a raise someone else sent that may still be landing,
                a request replaced, until it can no longer land)

and, where any of those is unknown, the card's **worst case**: the largest limit ever
read for it or stated for it (its maximum constraint, its default, the operator's
``[cards] max_w``). A card that has just appeared (or come back) counts at its worst
case until a write of ours is confirmed on it. The bound is derived from that state by
:func:`powerbudgetd.core.worstcase.limit_bound_mw` in one property, never stored.
The controller plans increases only into ``budget - sum(bounds)``, so the sum of what
may be in force never passes the budget through an action of ours.

Besides the bound it keeps the write bookkeeping the bound depends on: writes in flight
and their confirmation by read-back, holds with a doubling backoff after a write that
did not take, and the values NVML refused (never resent).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from powerbudgetd.core.backoff import doubled
from powerbudgetd.core.model import Timings
from powerbudgetd.core.worstcase import limit_bound_mw


@dataclass
class CardLedger:
    """One card's bound and write bookkeeping; every limit in integer mW, times in s.

    ``worst_mw``: the highest limit the card may have (or come back with); raised by
    every value read. ``new``: the card appeared or came back and no write of ours has
    been confirmed on it since; it counts at ``worst_mw`` until one is.
    """

    timings: Timings
    worst_mw: int
    new: bool = False
    # The backend reads a requested limit apart from the enforced one (NVML). Without
    # (hwmon, AMD SMI: one cap read back), a read still showing what the card had says
    # nothing of a reset or another tool: the write is waited for (counted in flight)
    # until read back or confirm_timeout_s, and the card counts at what it read; except
    # once a cut of ours is later than any has taken to show on it, and a read above ours
    # showing a third value: another writer's (``observe``).
    separate_requested: bool = True
    requested_mw: int | None = None
    enforced_mw: int | None = None
    inflight: list[tuple[int, float]] = field(default_factory=list)  # (target mW, sent at s)
    overdue: bool = False  # a write in flight did not return in time: it may land whenever it returns
    requested_before_mw: int | None = None  # the requested limit read before our first write in flight
    seen_ours: bool = False  # our write in flight has been read back in requested
    # Requests replaced (by ours, another tool's, a reset, a failed read) before they
    # settled, with when they were replaced (the latest they may have been sent: one
    # sent again at the same value is invisible): a card may apply queued writes in turn,
    # each after the lag, so one may still bite. Counted for confirm_timeout_s (the
    # longest a write of ours is waited for) or twice the longest lag seen on the card,
    # whichever is longer, after that time.
    superseded: list[tuple[int, float]] = field(default_factory=list)
    lag_seen_s: float = 0.0  # the longest a write was seen taking to bite on this card (s)
    cut_shown_s: float | None = None  # one cap read back: the longest a cut of ours took to show in it (s)
    last_sent: tuple[int, float, int | None] | None = None  # our last write until read back: (mW, sent at s, the request before)
    unread: int = 0  # writes in a row never read back while the card kept what it had
    missed: bool = False  # our last write was given up unshown (expire()): until one is read back
    overwritten: int = 0  # one cap: writes in a row replaced by another writer's above them
    foreign_mw: int | None = None  # a raise we did not make, maybe still in flight
    foreign_since: float | None = None
    # A write that did not take (unconfirmed, refused, overdue) holds the card: it counts
    # at its bound and is left alone until hold_until, the hold doubling each time (or,
    # once until a write of ours is read back, until it asks for another limit).
    hold_until: float = float("-inf")
    backoff_s: float = 0.0
    held_mw: int | None = None  # the requested limit (one cap: the cap) read when last held
    lifted: bool = False  # a hold was lifted early since a write of ours was last read back
    refused: set[int] = field(default_factory=set)  # values NVML refused: never resent
    requested_since: float = float("-inf")  # when the requested limit read was first seen
    # The requested limit was read in force with nothing of ours in flight and no
    # replaced request left that may land before it: settled, it is not counted once
    # replaced (even if still queued, nothing queued before it can land first, and it
    # would land on the value already in force). Any other request may still be queued.
    request_settled: bool = False
    # Our write was sent since the last read: the request it replaced is accounted for.
    # Read again unchanged, that value is a request of its own (sent back after ours).
    replaced_by_ours: bool = False

    @property
    def bound_mw(self) -> int:
        """The highest limit that may be in force (mW): requested, enforced, every write
        that may still land (ours in flight or replaced, another tool's raise), and the
        worst case where a limit is unknown, the card is new or a call on it is overdue."""
        landing: list[int] | tuple[()] = ()  # the common case, every card every tick: no list built
        if self.inflight or self.superseded:
            landing = [mw for mw, _ in self.inflight] + [mw for mw, _ in self.superseded]
        if self.foreign_mw is not None:
            landing = [*landing, self.foreign_mw]
        return limit_bound_mw(self.requested_mw, self.enforced_mw, self.worst_mw, landing,
                              unknown=self.new or self.overdue)

    # -- what the card reads ---------------------------------------------------------
    def observe(self, now: float, requested_mw: int | None, enforced_mw: int | None) -> int | None:
        """Take one read-back of the card's limits (None: unknown). Returns the target
        (mW) of the write of ours it confirms, if any (the in-flight list is then cleared)."""
        self._forget_expired(now, self._take(now, requested_mw, enforced_mw))
        if self.held(now) and not self.lifted and self.held_mw is not None and requested_mw not in (None, self.held_mw):
            # Held with its request known, it asks for another now (one cap: a floor lifted,
            # our write landing late; a reset, another tool): the bank may need it moved
            # now. Tried again at once, once: a further miss holds it for twice as long
            # (the backoff is kept) until a write of ours is read back.
            self.hold_until = float("-inf")
            self.lifted = True
        self._shown(now, requested_mw)
        ours = [mw for mw, _ in self.inflight] if self.inflight else ()  # every card every tick: mostly none
        if requested_mw is not None and requested_mw in ours:
            self.seen_ours = True  # our write reached the card: whatever replaces it is news
        if self.inflight and not self.overdue and requested_mw is not None and requested_mw not in ours:
            if self.separate_requested:
                # Our writes returned (NVML sets requested before it returns), yet the card
                # asks for something else: a reset or another tool wrote after us, and the
                # latest request supersedes ours: waiting for a confirmation would block the
                # correction (a card that queues writes may still apply ours after the lag:
                # it stays counted, in superseded). Still reading what it had, and never
                # ours, it may instead have ignored the write: once is news (resent), twice
                # in a row a card that ignores us (expire() then holds it).
                if requested_mw == self.requested_before_mw and not self.seen_ours:
                    self.unread += 1
                if self.unread < 2:
                    self.superseded += self.inflight
                    self.inflight.clear()
            elif requested_mw > self.inflight[-1][0] and requested_mw != self.requested_before_mw:
                # One cap read back above ours, and not what it had before our write: another
                # writer (a reset's default, another tool), or a floor set since. Ours is no
                # longer waited for, so the card is corrected now rather than after
                # confirm_timeout_s (a floor then holds the resent write off, as any write
                # that does not take); it stays counted (superseded) while it may still land.
                # Twice in a row, not ours: a writer fighting ours (expire() then holds it).
                self.overwritten += 1
                if self.overwritten < 2:
                    self.superseded += self.inflight
                    self.inflight.clear()
            elif (requested_mw > self.inflight[-1][0] and requested_mw == self.requested_before_mw
                    and not self.seen_ours and self.cut_shown_s is not None
                    and now - self._first_sent_at() > self.cut_shown_s + self.timings.tick_s / 2):
                # A cut of ours not shown, later than any cut of ours took to show on this card
                # (a cut shows once it bites, after the card's lag; a raise at once): ignored,
                # or the value it had put back by another writer (a reset). As with a separate
                # request: once is news (resent), twice in a row a card that ignores us.
                # Before any cut has shown, a slow card cannot be told apart: waited for
                # until confirm_timeout_s.
                self.unread += 1
                if self.unread < 2:
                    self.superseded += self.inflight
                    self.inflight.clear()
        confirmed = self.inflight[-1][0] if self.inflight and self.confirmed(now) else None
        if confirmed is not None:
            self.inflight.clear()
            self.new = self.overdue = self.missed = False
            self.unread = 0
        self._foreign(now)
        if requested_mw is not None and enforced_mw == requested_mw and not self.superseded and not self.inflight:
            self.request_settled = True
        return confirmed

    def _shown(self, now: float, requested_mw: int | None) -> None:
        """Our last write read back, in flight or not (a resent or superseded one landing
        late): the card does not ignore us, whatever missed before; on one cap, a cut's
        time to show is learned from it (a cut shows once it bites, after the lag)."""
        sent = self.last_sent
        if sent is None or requested_mw != sent[0]:
            return
        self.last_sent = None
        self.unread = self.overwritten = 0
        self.lifted = self.missed = False
        if (not self.separate_requested and sent[2] is not None and sent[0] < sent[2]
                and now - sent[1] <= self.timings.confirm_timeout_s):  # not a value merely read again later
            self.cut_shown_s = max(self.cut_shown_s or 0.0, now - sent[1])

    def _take(self, now: float, requested_mw: int | None, enforced_mw: int | None) -> bool:
        """Keep the limits read (and the worst case they may raise); True when enforced
        moved since the last read."""
        if requested_mw != self.requested_mw:
            # One cap read back showing our write: the cap it replaced is no longer in
            # force (the read is what is in force); ours is counted in flight meanwhile.
            ours = not self.separate_requested and any(mw == requested_mw for mw, _ in self.inflight)
            if not self.replaced_by_ours and not ours:
                self._request_replaced(now)
            self.request_settled = False
            self.requested_since = now
        self.replaced_by_ours = False
        moved = enforced_mw is not None and self.enforced_mw is not None and enforced_mw != self.enforced_mw
        self.requested_mw, self.enforced_mw = requested_mw, enforced_mw
        if requested_mw is not None and requested_mw > self.worst_mw:
            self.worst_mw = requested_mw
        if enforced_mw is not None and enforced_mw > self.worst_mw:
            self.worst_mw = enforced_mw
        return moved

    def _forget_expired(self, now: float, moved: bool) -> None:
        """Drop the replaced requests that can no longer land, learning the card's lag from
        each bite seen (``moved``: enforced changed since the last read)."""
        e = self.enforced_mw
        if moved and e == self.requested_mw:  # the request seen biting: how long that took
            self.lag_seen_s = max(self.lag_seen_s, now - self.requested_since)
        if not self.superseded:
            return  # the common case, every tick: nothing replaced is waited for
        bit = [t for mw, t in self.superseded if moved and mw == e]
        if bit:  # a replaced write seen biting (the earliest of that value): how long that took
            self.lag_seen_s = max(self.lag_seen_s, now - min(bit))
        # Replaced requests are counted while they may still land: as long as a write of
        # ours is waited for, or twice the longest lag seen on this card, whichever is
        # longer. Not less, even once one is seen in force: a limiter lifting (a floor
        # gone) moves enforced just as a bite does, to a value that may equal a request
        # still queued, so no read proves which of the writes queued on a card landed.
        keep_s = max(self.timings.confirm_timeout_s, 2 * self.lag_seen_s)
        self.superseded = [(mw, t) for mw, t in self.superseded if now - t < keep_s]

    def observe_unknown(self, now: float) -> None:
        """The card could not be read (or a call on it is overdue): it counts at the
        highest limit it may have or come back with; whatever it reads next is news. The
        request last read may still be landing: it stays counted as a replaced one (a
        write of ours sent before the next good read would otherwise forget it)."""
        self._request_replaced(now)
        self.foreign_mw = self.foreign_since = None
        self.requested_mw = self.enforced_mw = None
        self.replaced_by_ours = False

    def _request_replaced(self, at: float) -> None:
        """The requested limit read is replaced (by another request read, a write of ours
        or the unknown) at ``at`` (s): unless it settled, a card that queues writes may
        still apply it, so it is counted among the replaced requests from ``at`` (it may
        have been sent again, at the same value, until then). Ours in flight are counted
        as such already."""
        r = self.requested_mw
        if r is None or self.request_settled or r in [mw for mw, _ in self.inflight]:
            return
        if (r, at) not in self.superseded:
            self.superseded.append((r, at))

    def appeared(self, now: float) -> None:
        """The card appeared at runtime or came back: worst case until a write confirms.

        With one cap read back (no separate request), a write of ours in flight when the
        card went (its call returned) is no longer waited for: the card came back with
        what it has (a reset's default), which a read that does not show our write would
        otherwise leave uncorrected until ``confirm_timeout_s``. The write stays counted
        among the replaced ones while it may still land; an overdue one (its call never
        returned) stays in flight."""
        self.new = True
        if not self.separate_requested and self.inflight and not self.overdue:
            self.superseded += [(mw, now) for mw, _ in self.inflight]
            self.inflight.clear()

    def _foreign(self, now: float) -> None:
        """A raise we did not make may still be on its way: requested above enforced with
        nothing of ours in flight (a run killed mid-write, another tool). It is counted
        until it lands (or ``settle_s`` shows another limiter holds enforced lower); a
        write of ours over it keeps it counted (see :meth:`record_write`), so it is
        corrected in the tick it is first read, whatever the card's lag."""
        if self.requested_mw is None or self.enforced_mw is None:
            return  # a read without both limits tells nothing of what landed
        pending = not self.inflight and self.held_below
        if not pending:
            self.foreign_mw = self.foreign_since = None
        elif self.foreign_mw != self.requested_mw:
            self.foreign_mw, self.foreign_since = self.requested_mw, now
        elif self.foreign_since is not None and now - self.foreign_since >= self.timings.settle_s:
            self.foreign_mw = None  # settled: a tighter limiter, not a write in flight

    @property
    def held_below(self) -> bool:
        """Enforced below requested: a write landing, or a tighter limiter elsewhere."""
        r, e = self.requested_mw, self.enforced_mw
        return r is not None and e is not None and r > e

    @property
    def above_requested(self) -> bool:
        """Enforced above requested, whatever is in flight: a decrease still biting (the
        lag), or a floor elsewhere. Either way writing lower cannot bring it down now.
        With one cap read back (no separate request): the cap reads above our decrease in
        flight (still biting, ignored, or held by a floor)."""
        r, e = self.requested_mw, self.enforced_mw
        if not self.separate_requested:
            return bool(self.inflight) and e is not None and e > self.inflight[-1][0]
        return r is not None and e is not None and e > r

    @property
    def unshown_cut_mw(self) -> int | None:
        """One cap read back: a cut of ours in flight (its call returned) that the cap
        does not show yet (mW), else None. A slow card that has not shown it cannot be told
        from one whose cap another writer put back (a reset's default, a tool writing the
        value the card had) before any cut has been seen to show, nor within that time
        after; sending the same cut again is safe either way (it lands no higher than what
        is counted), so a bank over budget resends it every tick rather than wait on it."""
        if self.separate_requested or not self.inflight or self.overdue or self.requested_mw is None:
            return None
        cut = self.inflight[-1][0]
        return cut if self.requested_mw > cut else None

    @property
    def held_above(self) -> bool:
        """Enforced above requested with nothing of ours in flight: a floor set elsewhere
        (firmware, a BMC, another limiter). Writing lower cannot bring the card down."""
        return not self.inflight and self.above_requested

    # -- what we write ---------------------------------------------------------------
    def record_write(self, to_mw: int, sent_at: float) -> None:
        """A write of ours was sent at ``sent_at``: it may be in force from now on. The
        request it replaces (ours, or another tool's raise), unless settled, may still
        land after it on a card that queues writes, whatever the card's lag: it stays
        counted."""
        if not self.inflight:
            self.requested_before_mw = self.requested_mw
            self.seen_ours = False
            self._request_replaced(sent_at)
            self.request_settled, self.replaced_by_ours = False, True
            self.foreign_mw = self.foreign_since = None
        if not self._resending(to_mw) or self.last_sent is None:
            self.last_sent = (to_mw, sent_at, self.requested_mw)
        self.inflight.append((to_mw, sent_at))

    def _resending(self, to_mw: int) -> bool:
        """``to_mw`` is the write in flight sent again (a cut not shown yet, see
        :attr:`unshown_cut_mw`): its wait and its time to show count from the first send."""
        return bool(self.inflight) and self.inflight[-1][0] == to_mw

    def _first_sent_at(self) -> float:
        """When the write in flight was first sent (s), its resends of the same value
        aside."""
        mw, at = self.inflight[-1]
        for m, t in reversed(self.inflight):
            if m != mw:
                break
            at = t
        return at

    def record_overdue_write(self, to_mw: int, sent_at: float) -> None:
        """A write that did not return in time may land whenever it returns: worst case."""
        self.record_write(to_mw, sent_at)
        self.overdue = True

    def confirmed(self, now: float) -> bool:
        """The last write is in force: requested reads it back and enforced equals it; or,
        ``settle_s`` after it was sent, enforced is what other limiters make of it: below
        (a tighter limiter) or above (a floor held elsewhere: the card is then held above)."""
        if not self.inflight:
            return True
        target, sent_at = self.inflight[-1]
        if self.requested_mw != target or self.enforced_mw is None:
            # One cap read back (no separate request): after settle_s a cap read below the
            # target is what a tighter limiter makes of it; one above it is a floor elsewhere
            # only once the write cannot still be landing, so it is left to expire.
            return (not self.separate_requested and self.enforced_mw is not None and self.enforced_mw < target
                    and now - sent_at >= self.timings.settle_s)
        return self.enforced_mw == target or now - sent_at >= self.timings.settle_s

    def expire(self, now: float) -> tuple[int, float] | None:
        """The last write, if it did not take: still unconfirmed ``confirm_timeout_s``
        after it was sent, or the second in a row the card ignored (the in-flight list is
        then dropped: the card counts at what it reads)."""
        if self.inflight and (now - self._first_sent_at() > self.timings.confirm_timeout_s or self.unread >= 2
                              or self.overwritten >= 2):
            last = self.inflight[-1]
            self.superseded += self.inflight  # expired at once (ignored twice): it may still be queued
            self.inflight.clear()
            self.overdue = False
            self.unread = min(self.unread, 1)  # after the hold, one more miss holds it again
            self.overwritten = 0
            self.missed = True
            return last
        return None

    def hold(self, now: float) -> bool:
        """Leave the card alone for a doubling backoff. True when it was not held before."""
        first = not self.backoff_s
        tm = self.timings
        self.backoff_s = doubled(self.backoff_s, tm.retry_backoff_s, tm.retry_backoff_max_s)
        self.hold_until = now + self.backoff_s
        self.held_mw = self.requested_mw
        return first

    def release(self) -> bool:
        """A write of ours was confirmed after a hold: controllable again. True if it was held."""
        was = bool(self.backoff_s)
        self.hold_until, self.backoff_s = float("-inf"), 0.0
        self.lifted = False
        return was

    def held(self, now: float) -> bool:
        return now < self.hold_until

    def refuse(self, mw: int) -> None:
        """NVML refused ``mw`` (INVALID_ARGUMENT): never send it again."""
        self.refused.add(mw)

    def avoid_refused(self, target_mw: int, min_mw: int) -> int:
        """The nearest whole watt at or below ``target_mw`` that NVML did not refuse (lower
        is always within the budget), down to ``min_mw``; with none left, the target."""
        candidate = target_mw
        while candidate in self.refused and candidate - 1000 >= min_mw:
            candidate -= 1000
        return candidate

    @property
    def doubted(self) -> bool:
        """A write of ours was accepted and did not show, none read back since: given up
        unshown (the card held, its hold perhaps run out: it is retried), or ignored once
        and resent. Its next write may not take either. A write the call itself failed
        (an error, a refused value, a timeout) says nothing of the next: not doubted."""
        return self.missed or self.unread > 0

    def at_rest(self) -> None:
        """The card reads the limit we would send, nothing of ours in flight: no write is
        outstanding, so none is doubted (a card that takes writes again is trusted at its
        next; one that still ignores them is found out by it, as any card)."""
        if not self.inflight:
            self.missed, self.unread = False, 0

    @property
    def writing(self) -> bool:
        """A write of ours is not confirmed yet: send nothing more (an enforced limit that
        has not moved could read equal to a newer target and "confirm" it early)."""
        return bool(self.inflight)

    @property
    def busy(self) -> bool:
        """A write (ours or another's) may still be landing."""
        return bool(self.inflight) or self.foreign_mw is not None
