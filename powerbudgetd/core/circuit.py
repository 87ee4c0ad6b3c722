"""One circuit shared by several hosts: seats, grants, the fair division, the fence (pure).

A *circuit* (breaker, PDU branch, UPS) has a wall budget in W. Each host on it has a
*seat*: its reserve (wall W), which it may always use. Above the reserve a host holds a
*grant* (wall W) under its lease in the store; the store changes a grant upward only
by a transaction that fails when any seat or grant changed since it was read, so at
every revision::

    sum(seats) + sum(grants) <= circuit budget

On a *power tree* (``core.tree``: feeds, PDUs, breakers above the hosts, A/B cords) the
same holds at every node, failover counted::

    sum over hosts h of coefficient(h, n) x (seat_h + grant_h) <= budget(n)

and a grant is raised only where it fits every node on the host's cords' paths. The
whole tree is one circuit in the store, so the same transaction guards it: a race
between two hosts under different branches cannot overfill a shared parent.

Grants follow a max-min fair division of the pool (budget - seats - unseated
reserves) over the hosts' *wants* (what their recipients could use, wall W), with
hysteresis (``step_w``) and a release hold, so the circuit neither starves nor
oscillates.

*Fencing*: a grant is valid on the host only until a deadline it computes on its own
monotonic clock from the send time of the last keepalive the store acknowledged (see
:class:`Fence`). Past it the host is back at its reserve, confirmed, before the store
can expire the lease and hand the watts to another host.

Pure: no I/O, no clock (``now`` in s, on the caller's monotonic clock).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from powerbudgetd.core.delegation import divide_charged
from powerbudgetd.core.fair import max_min_fair
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.snapshot import BankSnapshot
from powerbudgetd.core.tree import EPS_W, LastDivision, PowerTree, divide

# The tree division of the last view divided in this process (views of successive reads
# differ mostly in grants, which it does not depend on).
_LAST_DIVISION: LastDivision[dict[str, float]] = LastDivision()

# A host's rounds woken by a change come at least this far apart (s): one change's events
# are read once (``channels.circuit.channel.wake_gap_s``; the simulator's store model too).
WAKE_GAP_S = 0.1

# A host's rounds woken by a change, beyond its polls: WOKEN_BURST at once after a quiet
# spell, then one every WOKEN_EVERY_S on average (``WakeBudget``). On a busy circuit each
# host's lowering wakes every host held back, and slow hosts see more of them (their
# raises' compares fail, their cards lag their grants): bounded by count, a host costs
# etcd at most 1/poll_s + 1/WOKEN_EVERY_S rounds a second however many such chances it
# is told. A change that may lower a grant does not wait for the budget (the channel's).
WOKEN_BURST = 3
WOKEN_EVERY_S = 2.0

# A quartz oscillator without NTP drifts by tens of ppm; 1000 ppm is a wide allowance
# for the host's and the store leader's clocks each.
DEFAULT_CLOCK_RATE_ALLOWANCE = 1e-3


@dataclass
class WakeBudget:
    """The rounds a host may start early on a change (a token bucket on the caller's
    monotonic clock, s): ``burst`` at most, one more every ``every_s``. A round that
    comes when its poll (or keepalive) was due anyway spends nothing."""

    burst: int = WOKEN_BURST
    every_s: float = WOKEN_EVERY_S
    _tokens: float = field(default=math.nan, init=False)
    _at: float = field(default=-math.inf, init=False)

    def _level(self, now: float) -> float:
        if math.isnan(self._tokens):
            return float(self.burst)
        return min(float(self.burst), self._tokens + (now - self._at) / self.every_s)

    def wait_s(self, now: float) -> float:
        """Seconds (>= 0) until a woken round may start."""
        return max(0.0, (1.0 - self._level(now)) * self.every_s)

    def spend(self, now: float) -> None:
        """A woken round started at ``now``."""
        self._tokens, self._at = max(0.0, self._level(now) - 1.0), now


@dataclass(frozen=True)
class CircuitView:
    """The circuit as read at one store revision. Every figure in wall W.

    ``seats``: each seated host's reserve; ``grants``: each live grant (under a
    lease); ``wants``: what each live host's recipients could use above its reserve;
    ``pending``: reserves of hosts whose seat did not fit (they run on them anyway,
    so the pool counts them); ``unknown_seats``, ``unknown_grants``: hosts whose seat,
    or grant, could not be read (counted at the whole budget: nothing is raised while
    one is there, but nobody's grant is taken back for it; :attr:`unknown`: either);
    ``seat_order``: each seat's create revision (the earlier seat keeps its place when
    seats no longer fit a changed budget); ``tree``:
    the power tree the circuit is (None: one flat circuit), with each host's seat as its
    reserve; ``tree_bad``: a tree is stored but could not be read (nothing is seated or
    raised until it can: no node can be checked); ``lost``: a feed of the tree known
    lost (``circuit feed-down``): every node must then also carry the seats and grants
    where they now flow, with that feed and all below it dead; ``unseated``: each live
    host without a seat (a claim under a lease, no seat): its claimed reserve, which it
    runs on anyway, so :meth:`seat_fits` and :func:`raise_allowed` count the others'
    beside the host they are asked about (:meth:`unseated_others_w`); ``ceilings``: the
    most each live host could use above its seat (W: its nameplate, every card at its
    maximum limit, at the wall, less its seat), where it published one: the room left once
    every want is met is handed out up to these (:meth:`fair_w`), and given back at once
    when another host's want needs it (:class:`GrantPolicy`).
    """

    budget_w: float
    seats: Mapping[str, float] = field(default_factory=dict)
    grants: Mapping[str, float] = field(default_factory=dict)
    wants: Mapping[str, float] = field(default_factory=dict)
    pending: Mapping[str, float] = field(default_factory=dict)
    revision: int = 0
    unknown_seats: frozenset[str] = frozenset()
    unknown_grants: frozenset[str] = frozenset()
    seat_order: Mapping[str, int] = field(default_factory=dict)
    tree: PowerTree | None = None
    tree_bad: bool = False
    lost: str | None = None
    unseated: Mapping[str, float] = field(default_factory=dict)
    ceilings: Mapping[str, float] = field(default_factory=dict)
    # The tree's division, computed once per view (a copy made by replace() has its own).
    _memo: dict[str, dict[str, float]] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def unknown(self) -> frozenset[str]:
        """Hosts whose seat or grant (or both) could not be read."""
        return self.unknown_seats | self.unknown_grants

    @property
    def seats_w(self) -> float:
        return sum(self.seats.values())

    @property
    def grants_w(self) -> float:
        return sum(self.grants.values())

    @property
    def committed_w(self) -> float:
        """sum(seats) + sum(grants): what the invariant bounds (W)."""
        return self.seats_w + self.grants_w

    @property
    def unseated_w(self) -> float:
        """The claimed reserves of the live hosts without a seat (W)."""
        return sum(self.unseated.values())

    @property
    def carried_w(self) -> float:
        """:attr:`committed_w` plus :attr:`unseated_w`: what the budget must carry (W)."""
        return self.committed_w + self.unseated_w

    def unseated_others_w(self, host: str) -> float:
        """The claimed reserves of the live hosts without a seat other than ``host`` (W):
        room that a seat or a raise of ``host`` must leave them."""
        return sum(w for h, w in self.unseated.items() if h != host)

    @property
    def pool_w(self) -> float:
        """What grants may share: budget - seats - unseated reserves (W; may be < 0)."""
        return self.budget_w - self.seats_w - sum(self.pending.values())

    @property
    def free_w(self) -> float:
        """Not seated, not granted, not pending (W; < 0 when over-committed)."""
        return self.pool_w - self.grants_w

    @property
    def known_pool_w(self) -> float:
        """:attr:`pool_w` over the seats that could be read (W): what the fair shares
        divide (raises stay bounded by :attr:`free_w`, which counts the unknown)."""
        return self.budget_w - sum(w for h, w in self.seats.items() if h not in self.unknown_seats) - sum(self.pending.values())

    @property
    def free_known_w(self) -> float:
        """:attr:`free_w` over the records that could be read (W): what says whether
        the grants themselves over-commit the circuit."""
        seats = sum(w for h, w in self.seats.items() if h not in self.unknown_seats)
        grants = sum(w for h, w in self.grants.items() if h not in self.unknown_grants)
        return self.budget_w - seats - sum(self.pending.values()) - grants

    def seat_in_budget(self, host: str) -> bool:
        """Whether ``host``'s seat lies within the budget when seats are counted in the
        order they were created (a budget lowered under the seats leaves the latest out;
        an unreadable seat puts nobody else out)."""
        if host not in self.seats:
            return False
        order = sorted((h for h in self.seats if h not in self.unknown_seats or h == host),
                       key=lambda h: (self.seat_order.get(h, 0), h))
        total = 0.0
        for h in order:
            total += self.seats[h]
            if h == host:
                return total <= self.budget_w + 1e-9
        return False

    def seat_fits(self, reserve_w: float, host: str) -> bool:
        """Whether ``host``'s seat of ``reserve_w`` (W) fits beside every other seat and
        grant (its own seat and grant replaced) and every other live host without a seat
        (its claimed reserve); on a tree, at every node on its cords' paths too (a host
        the tree does not name has no place: False). The others' unseated reserves are
        counted on this host's paths, where they may not run: safe, as nothing tells
        where they will be seated."""
        asked = reserve_w + self.unseated_others_w(host)
        others = {h: w for h, w in self.seats.items() if h != host}
        grants = sum(w for h, w in self.grants.items() if h != host)
        if sum(others.values()) + grants + asked > self.budget_w + 1e-9:
            return False
        return self.fits_tree(host, asked)

    def held_w(self, *, known_only: bool = False) -> dict[str, float]:
        """Each host's seat (or pending reserve) plus grant (W): what the invariant counts
        (``known_only``: leaving out each seat and grant that could not be read)."""
        seats, grants = self.seats, self.grants
        if known_only:
            seats = {h: w for h, w in seats.items() if h not in self.unknown_seats}
            grants = {h: w for h, w in grants.items() if h not in self.unknown_grants}
        out = {h: seats.get(h, 0.0) + grants.get(h, 0.0) for h in {*seats, *grants}}
        for h, w in self.pending.items():
            out[h] = out.get(h, 0.0) + w
        return out

    def carried_by_host_w(self) -> dict[str, float]:
        """:meth:`held_w` with each live unseated host's claimed reserve added (W): what
        each host makes the budget carry, as :attr:`carried_w` sums it."""
        out = self.held_w()
        for h, w in self.unseated.items():
            out[h] = out.get(h, 0.0) + w
        return out

    def fits_tree(self, host: str, total_w: float) -> bool:
        """Whether ``host`` holding ``total_w`` (W, seat + grant) in all fits every node on
        its cords' paths beside the others' seats and grants, failover counted (True off
        a tree; False on a tree that could not be read or does not name the host)."""
        if self.tree is None:
            return not self.tree_bad
        if host not in self.tree.hosts:
            return False
        return total_w <= self._room_for_w(host) + 1e-9

    def _room_for_w(self, host: str) -> float:
        """The most ``host`` may hold in all (W) beside the others at every node on its
        paths: committed, failover counted, and where it flows with the lost feed dead."""
        assert self.tree is not None
        held = self.held_w()
        room = self.tree.room_for_w(host, held)
        return room if self.lost is None else min(room, self.tree.room_for_w(host, held, self.lost))

    def room_w(self, host: str) -> float:
        """The largest grant (W) ``host`` may hold beside the others' seats and grants at
        every node on its cords' paths (inf off a tree; 0 where its seat already fills one)."""
        if self.tree is None or host not in self.tree.hosts:
            return math.inf if self.tree is None else 0.0
        seat = self.seats.get(host, 0.0) + self.pending.get(host, 0.0)
        return max(0.0, self._room_for_w(host) - seat)

    def node_loads_w(self, *, known_only: bool = False) -> dict[str, float]:
        """Each node's seats and grants (W): failover counted, and with a feed lost the
        larger of that and where they now flow; empty off a tree (``known_only``: as
        :meth:`held_w`)."""
        if self.tree is None:
            return {}
        held = self.held_w(known_only=known_only)
        loads = self.tree.loads_w(held)
        if self.lost is not None:
            for n, w in self.tree.loads_w(held, self.lost).items():
                loads[n] = max(w, loads[n])
        return loads

    def nodes_over_w(self, *, known_only: bool = False) -> dict[str, float]:
        """Each node whose :meth:`node_loads_w` exceed its budget, and by how much (W).
        ``known_only``: over by the records that could be read (what says the grants
        themselves must shed; an unreadable one, counted at the whole budget, takes no
        one's grant back)."""
        tree = self.tree
        if tree is None:
            return {}
        loads = self.node_loads_w(known_only=known_only)
        return {n: w - tree.nodes[n].budget_w for n, w in loads.items() if w > tree.nodes[n].budget_w + EPS_W}

    def short_under_loss(self, host: str) -> bool:
        """With a feed lost, whether the surviving side cannot carry even ``host``'s seat
        beside the higher classes' (the tree's division under the loss gives it less;
        a host with no live cord gets nothing)."""
        if self.tree is None or self.lost is None or host not in self.tree.hosts:
            return False
        seat = self.seats.get(host, 0.0)
        return self.division().get(host, 0.0) < seat - 1e-6

    def division(self) -> dict[str, float]:
        """The tree's division (``core.tree.divide``, under the lost feed if any) of each
        host's seat plus want (W, in all), over the hosts whose seat could be read (as
        :attr:`known_pool_w`: an unreadable seat, counted at the whole budget, would
        otherwise take every share). Computed once per view. Raises AssertionError off
        a tree."""
        if "divide" not in self._memo:
            self._memo["divide"] = self._divide_now()
        return self._memo["divide"]

    def _divide_now(self) -> dict[str, float]:
        assert self.tree is not None
        totals = {h: self.seats.get(h, 0.0) + self.pending.get(h, 0.0) + self.wants.get(h, 0.0)
                  for h in self.tree.hosts if h not in self.unknown_seats}
        # A live host whose seat did not fit counts its reserve as a seat, before any
        # want: the others shed to make room for it, rather than it waiting behind them.
        reserves = {h: self.seats.get(h, 0.0) + self.pending.get(h, 0.0) for h in self.tree.hosts}
        tree, lost = self.tree, self.lost
        key = (lost, tuple(totals.items()), tuple(reserves.items()))
        if any(node.delegate for node in tree.nodes.values()):
            # Delegated subtrees: the same division over what the leases charge, so what
            # it gives each host is what the leases sized by it carry (core.delegation).
            # No spare room there: the leases are sized to the wants, not the nameplates.
            return _LAST_DIVISION.get(tree, ("charged", key),
                                      lambda: divide_charged(tree.with_reserves(reserves), totals, lost))
        ceilings = {h: reserves[h] + w for h, w in self.ceilings.items() if h in totals} or None
        return _LAST_DIVISION.get(tree, (key, None if ceilings is None else tuple(sorted(ceilings.items()))),
                                  lambda: divide(tree.with_reserves(reserves), totals, lost, ceilings))

    def unseated_hold_w(self, host: str, reserve_w: float, floor_w: float) -> float:
        """What a live host whose seat of ``reserve_w`` does not fit holds its cards at
        (wall W) until it does: what every node on its cords' paths can carry beside
        every other host's seat, grant and pending reserve (and, with a feed lost, where
        they flow), within [``floor_w``, ``reserve_w``]: never below its cards' floors
        (``floor_w``: the least they can be held to), and never what nobody counted.
        Off a tree: what the budget leaves beside the others."""
        if self.tree is not None and host in self.tree.hosts:
            held = self.held_w()
            held.pop(host, None)
            carry = self.tree.room_for_w(host, held)
            if self.lost is not None:
                carry = min(carry, self.tree.room_for_w(host, held, self.lost))
        elif self.tree is not None:
            carry = 0.0  # the tree has no place for it
        else:
            others = sum(w for h, w in self.held_w().items() if h != host)
            carry = self.budget_w - others
        return max(floor_w, min(reserve_w, carry))

    def holds(self) -> bool:
        """The invariant at this revision: sum(seats) + sum(grants) <= budget, and on a
        tree the same at every node, failover counted."""
        return self.committed_w <= self.budget_w + 1e-9 and not self.nodes_over_w() and not self.tree_bad

    def fair_w(self, host: str) -> float:
        """``host``'s fair grant (W above its seat): max-min fair over the pool; on a
        tree, the tree's division (every node's budget, priorities: ``core.tree.divide``)
        of each host's seat plus want, under the lost feed if any. With
        :attr:`ceilings`, the room left once every want is met is shared out too, max-min
        fair, up to each host's ceiling (spare room: a rise is met before the next round)."""
        if self.tree is None:
            fair = max_min_fair(self.known_pool_w, self.wants)
            if not self.ceilings:
                return fair.get(host, 0.0)
            left = self.known_pool_w - sum(fair.values())
            spare = {h: max(0.0, w - fair.get(h, 0.0)) for h, w in self.ceilings.items()
                     if h in self.wants or h in self.seats}
            return fair.get(host, 0.0) + (max_min_fair(left, spare).get(host, 0.0) if left > EPS_W else 0.0)
        if host not in self.tree.hosts:
            return 0.0
        return max(0.0, self.division().get(host, 0.0) - self.seats.get(host, 0.0))


@dataclass
class GrantPolicy:
    """This host's grant target from one read of the circuit, with hysteresis.

    ``step_w``: a raise smaller than this is not worth a transaction; ``release_hold_s``:
    a grant above the fair share (or above the want) is lowered to it only after it has
    been so for this long, however little above (small excesses on many hosts would
    otherwise add up to a share that another host never gets), and at once while the
    records that could be read over-commit the circuit or put a node over (a feed lost).
    Spare room (a grant above both the fair share and what the host asked for, where the
    host published a ceiling: :attr:`CircuitView.ceilings`) is given back at once: the
    hold protects what a host asked for, not room it was lent because nobody else asked.
    What it asked for is its highest want over the last hold (a dip in its want is held
    like any excess, not taken for room it never asked).
    Stateful (the hold's start, the want's recent peak), but pure: ``now`` in s is passed in.
    """

    step_w: float = 20.0
    release_hold_s: float = 10.0
    _above_since: float | None = None
    _asked_w: float = 0.0  # the highest want (W) since _asked_at
    _asked_at: float = -math.inf

    @property
    def releasing(self) -> bool:
        """A grant above the fair share is being held (its release is due at a time, not
        on a change of the records)."""
        return self._above_since is not None

    def target_w(self, view: CircuitView, host: str, current_w: float, now: float) -> float:
        """The grant (W) this host should hold now: a raise only within the free watts
        of ``view``; a lowering after the hold; else ``current_w``."""
        fair = view.fair_w(host)
        want = view.wants.get(host, 0.0)
        if want >= self._asked_w or now - self._asked_at >= self.release_hold_s:
            self._asked_w, self._asked_at = want, now
        if fair > current_w:
            self._above_since = None
            raise_to = current_w + min(fair - current_w, max(0.0, view.free_w), max(0.0, view.room_w(host) - current_w))
            return raise_to if raise_to - current_w >= self.step_w else current_w
        if view.free_known_w < 0 or view.nodes_over_w(known_only=True):  # over-committed, or a feed lost
            self._above_since = None  # every host above its share gives back, however little: their
            return fair  # slivers under EPS_W each may add up to more than EPS_W at a node
        if current_w <= fair + EPS_W:
            self._above_since = None
            return current_w
        if host in view.ceilings:  # spare room (above its own want) goes back at once: another host needs it
            keep = max(fair, min(current_w, self._asked_w))
            if keep < current_w - EPS_W:
                if keep <= fair + EPS_W:
                    self._above_since = None
                elif self._above_since is None:
                    self._above_since = now
                return keep
        if self._above_since is None:
            self._above_since = now
        if now - self._above_since >= self.release_hold_s:
            self._above_since = None
            return fair
        return current_w


def raise_allowed(view: CircuitView, host: str, grant_w: float) -> bool:
    """Whether setting ``host``'s grant to ``grant_w`` (W) keeps the invariant at
    ``view``'s revision, at every node of a tree (the transaction then guards that
    nothing changed since), leaving room for every other live host without a seat (its
    claimed reserve, counted on this host's paths as in :meth:`CircuitView.seat_fits`)."""
    if grant_w < 0 or not math.isfinite(grant_w) or host not in view.seats:
        return False
    grant_w = grant_w + view.unseated_others_w(host)
    others = sum(w for h, w in view.grants.items() if h != host)
    flat = view.seats_w + others + grant_w <= view.budget_w + 1e-9 and grant_w <= max(0.0, view.pool_w - others) + 1e-9
    return flat and view.fits_tree(host, view.seats[host] + view.pending.get(host, 0.0) + grant_w)


@dataclass(frozen=True)
class Fence:
    """When a grant stops being valid on this host, from its lease keepalives.

    The store expires a lease no earlier than TTL after it received the last keepalive,
    which is after the host sent it. Both clocks may run fast or slow by
    ``clock_rate_allowance``. The host must be at its reserve, confirmed, ``lower_s``
    (its own clock: tick, write, read-back) before that::

        valid until = sent + TTL x (1 - r) / (1 + r) - lower_s

    so that in real time, valid-until plus the time to lower ends before the earliest
    server-side expiry. Raises ValueError when TTL leaves no validity at all.
    """

    lower_s: float
    clock_rate_allowance: float = DEFAULT_CLOCK_RATE_ALLOWANCE

    def __post_init__(self) -> None:
        if not self.lower_s >= 0 or not 0 <= self.clock_rate_allowance < 0.1:
            raise ValueError("lower_s must be >= 0 and clock_rate_allowance in [0, 0.1)")

    def usable_s(self, ttl_s: float) -> float:
        """How long after a keepalive's send time a grant stays valid (s; <= 0: never)."""
        r = self.clock_rate_allowance
        return ttl_s * (1 - r) / (1 + r) - self.lower_s

    def valid_until(self, sent_s: float, ttl_s: float) -> float:
        """The local deadline (s, the caller's monotonic clock) for a keepalive sent at
        ``sent_s`` and acknowledged with ``ttl_s`` s to live."""
        return sent_s + self.usable_s(ttl_s)


def grace_s(watchdog_s: float, fallback_s: float, clock_rate_allowance: float = DEFAULT_CLOCK_RATE_ALLOWANCE) -> int:
    """Whole seconds a host's lease outlives the circuit's TTL (the *grace*), so that a
    daemon that hangs (or is stopped) right after a keepalive is killed by its watchdog
    (``watchdog_s``) and has its cards at the reserve share (``fallback_s``: the
    ExecStopPost failsafe) before etcd can expire the lease and hand its grant to
    another host. Stretched by the clock-rate allowance, as the fence is."""
    r = clock_rate_allowance
    return math.ceil((watchdog_s + fallback_s) * (1 + r) / (1 - r))


def fenced_lease_ttl_s(ttl_s: int, watchdog_s: float, fallback_s: float,
                       clock_rate_allowance: float = DEFAULT_CLOCK_RATE_ALLOWANCE) -> int:
    """The TTL (s) a sharing host asks for its lease: the circuit's ``ttl_s`` (keepalives
    every ``ttl_s``/6, the fence from it) plus :func:`grace_s`.

    Why it bounds the overlap: the last keepalive etcd acknowledged was sent at t0; the
    next is due by t0 + ttl_s/6, so a daemon that stops renewing hung by then; its
    watchdog kills it by t0 + ttl_s/6 + watchdog_s, and the failsafe has the cards at
    the reserve share by t0 + ttl_s/6 + watchdog_s + fallback_s. etcd expires the lease
    (and the grant under it) no earlier than (ttl_s + grace) x (1 - r) / (1 + r) after
    t0, which is later. A daemon alive but cut off is at its reserve by its fence, earlier
    still."""
    return int(ttl_s) + grace_s(watchdog_s, fallback_s, clock_rate_allowance)


@dataclass(frozen=True)
class HostPower:
    """One host's conversion between its circuit figures (wall W) and board W, with the
    one feed model: board = wall x PSU efficiency - host draw."""

    feed: Feed
    reserve_w: float

    def __post_init__(self) -> None:
        if self.feed.host_w is None:
            raise ValueError("a circuit host needs its host draw (host_w): the circuit counts wall watts")
        if not self.reserve_w > 0:
            raise ValueError(f"reserve_w must be > 0 W, got {self.reserve_w!r}")

    def board_w(self, wall_w: float) -> float:
        """Board W that ``wall_w`` at the plug allows (may be <= 0)."""
        return wall_w * self.feed.psu_efficiency - (self.feed.host_w or 0.0)

    def board_budget_w(self, grant_w: float = 0.0) -> float:
        """Board budget for the reserve plus ``grant_w`` (W)."""
        return self.board_w(self.reserve_w + max(0.0, grant_w))

    def grant_covering_w(self, board_w: float) -> float:
        """The least grant (W above the reserve, >= 0) whose board budget covers
        ``board_w`` (board W): the inverse of :meth:`board_budget_w` (a residue of its
        rounding, under a microwatt, is none)."""
        w = self.feed.wall_w(board_w) - self.reserve_w
        return w if w > 1e-6 else 0.0

    def lowered_grant_w(self, held_w: float, in_use_w: float, cards_board_w: float | None) -> float:
        """What the store's grant may be lowered to while the cards come down to
        ``in_use_w`` (W): the least grant covering ``cards_board_w`` (board W: the most
        the cards may draw from now on, their bound and the budget in force; None when
        not known), never below ``in_use_w`` nor above ``held_w``. Stepwise, so that a
        shed lowered a little further each round still reaches the store each round
        the cards have come part of the way, not only once they stop."""
        if cards_board_w is None:
            return held_w
        covering = self.grant_covering_w(cards_board_w)
        return min(held_w, in_use_w if covering <= in_use_w + 1e-6 else covering)

    def given_back(self, held_w: float, in_use_w: float, cards_board_w: float | None) -> bool:
        """Whether a grant above what is in use (W) may go down to it in the store now:
        the cards (``cards_board_w``, board W, None when not known) are all the way down
        to ``in_use_w``. The daemon wakes a round for it then, not at its next poll."""
        return in_use_w < held_w and self.lowered_grant_w(held_w, in_use_w, cards_board_w) <= in_use_w

    def nameplate_w(self, snapshot: BankSnapshot) -> float | None:
        """This host's nameplate at the wall (W): every card at its maximum limit (a card
        that is not controllable at its bound), through the feed model; None while a
        card's maximum is unknown."""
        board = 0.0
        for c in snapshot.cards:
            hi = c.max_limit_w if c.controllable else c.limit_bound_w
            if hi is None:
                return None
            board += hi
        return self.feed.wall_w(board)

    def want_w(self, snapshot: BankSnapshot, pinned_fraction: float = 0.9, margin: float = 1.15) -> float:
        """What this host's recipients could use above its reserve (wall W, >= 0).

        Per card: a pinned card (1 s average >= ``pinned_fraction`` x its bound) could
        use its max limit; another needs its draw x ``margin`` within its constraints; a
        card that is not controllable counts at its bound. The sum goes through the
        feed model to the plug, less the reserve.
        """
        board = 0.0
        for c in snapshot.cards:
            lo = c.min_limit_w or 0.0
            hi = c.max_limit_w if c.max_limit_w is not None else c.limit_bound_w
            if not c.controllable or c.power_avg_w is None:
                board += c.limit_bound_w
            elif c.power_avg_w >= pinned_fraction * c.limit_bound_w:
                board += hi
            else:
                board += min(hi, max(lo, c.power_avg_w * margin))
        return max(0.0, self.feed.wall_w(board) - self.reserve_w)
