"""Who resizes a delegated node's lease of watts, and when (``core.delegation``).

A node marked ``delegate`` holds a lease from its parent, stored persistently
(``delegations/<node>``). It is written only by a host under it (its role allows no
other: ``roles``), by ``CircuitStore.put_delegation``'s transaction, which checks the
parent's sum and compares what that depends on (``core.delegation.lease_compares``).
A lease moves toward its figure in the tree's priority division among its siblings
(``core.delegation.fair_leases_w``: its hosts' seats and wants plus a margin), as far
as its subtree's holdings and the ancestors allow (``core.delegation.proposed_w``):

- *periodic*: every ``rebalance_s`` (give or take :data:`REBALANCE_JITTER`) the first
  live host under the node (the least name among those with a record) moves it to that
  figure when that moves it by half the margin or more: a lease shrinks to give watts
  back to its siblings, a lower class's first; and gives back by a watt or more where
  its ancestors spare it less than half its margin (:func:`_pressed`: its siblings can
  grow only by what the others give back, and watts kept inside the dead band stalled
  their hosts until the wants moved);
- *on demand*: a host whose raise is held back by a step or more (its room below its
  fair share) grows the leases above it, the nearest the root first, at most every
  ``ask_s``, by whatever each lacks of its figure as far as the ancestors spare, a watt
  or more (with a step's dead band at each, a parent a few watts short of its figure
  held its child's larger lack back until the wants moved); and only where those
  growths together give the host a watt or more of room (:func:`_ask_helps`: a lease
  grown on one cord of a redundant pair while the other cannot grow is no room);
- *given back*: where a host waits on a lease (:func:`waiting`: its room a step or more
  below its fair share, as its ask tests), a lease above its figure outside that host's but
  under the same nearest leased ancestor (anywhere, where none) is resized at once, as
  periodically, by its first host, at most every ``ask_s``; and so are the leases below
  such a lease (it can shrink only once they have: :func:`giving`). The watts waited
  for come back in a round or two, not at the next periodic resize of each level;
- a node without a lease: its first host takes one at once.

The raises under a delegated node compare only its zone, and do not fail a resize
elsewhere.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Mapping
from functools import partial
from typing import TypeVar

from powerbudgetd.channels.circuit.store import CircuitStore, Read
from powerbudgetd.core.circuit import CircuitView
from powerbudgetd.core.delegation import fair_leases_w, leased_above, proposed_w
from powerbudgetd.core.tree import EPS_W, LastDivision, PowerTree

REBALANCE_S = 5.0  # the periodic resize (s): slower than a round, so whole-circuit transactions stay rare
# Each wait until the next periodic resize is REBALANCE_S x (1 +/- this): hosts started
# together (power restored to a hall) do not resize in step, where sibling leases'
# transactions, comparing each other, would fail all but one.
REBALANCE_JITTER = 0.2
ASK_S = 0.5  # a host held back by a lease asks for more at most this often (s)
ASK_MIN_W = 1.0  # an ask moves a lease by this much or more (W): the host asks only when a step short
MARGIN_FRACTION = 0.05  # a lease's room above its hosts' seats and wants: this much of the node's budget


T = TypeVar("T")


def rebalance_wait_s(rng: random.Random, every_s: float = REBALANCE_S) -> float:
    """The wait until a host's next periodic resize (s): ``every_s`` give or take
    :data:`REBALANCE_JITTER` of it."""
    return every_s * rng.uniform(1 - REBALANCE_JITTER, 1 + REBALANCE_JITTER)


def delegated_above(tree: PowerTree, host: str) -> list[str]:
    """The nodes marked ``delegate`` on ``host``'s cords' paths (none off the tree), the
    nearest the root first: a lease nested under another grows once its parent has."""
    if host not in tree.hosts:
        return []
    marked = {n for leaf in tree.hosts[host].cords for n in tree.path(leaf) if tree.nodes[n].delegate}
    return sorted(marked, key=lambda n: (len(tree.path(n)), n))


def _per_read(read: Read, name: tuple[object, ...], of: object, compute: Callable[[], T]) -> T:
    """``compute()`` once per read and per ``of`` (the object it was computed from: the
    tree, a hosts' wants mapping; the in-process hosts of the load test share one read)."""
    hit = read._memo.get(name)
    if hit is None or hit[0] is not of:
        hit = read._memo[name] = (of, compute())
    out: T = hit[1]
    return out


def first_host(read: Read, tree: PowerTree, node: str) -> str | None:
    """The least-named live host (a record under its lease) with a cord under ``node``;
    before any record, the least-named seated one."""
    def first_hosts() -> dict[str, str]:  # every node's, in one pass over the hosts
        first: dict[str, str] = {}
        for h in sorted(read.records or read.view.seats):
            if h in tree.hosts:
                for leaf in tree.hosts[h].cords:
                    for n in tree.path(leaf):
                        first.setdefault(n, h)
        return first
    return _per_read(read, ("first_hosts",), tree, first_hosts).get(node)


def margins_w(read: Read, tree: PowerTree, margin_w: float | None) -> dict[str, float]:
    """Each delegated node with a live host under it: its lease's margin (W; ``margin_w``,
    None: :data:`MARGIN_FRACTION` of its budget). A node with none is given no margin."""
    live = set(read.records or read.view.seats)
    under = {n for h in live if h in tree.hosts for leaf in tree.hosts[h].cords for n in tree.path(leaf)}
    return {n: _margin_w(tree, n, margin_w)
            for n, node in tree.nodes.items() if node.delegate and n in under}


def _margin_w(tree: PowerTree, node: str, margin_w: float | None) -> float:
    """``node``'s lease margin (W): ``margin_w``, or :data:`MARGIN_FRACTION` of its budget."""
    return tree.nodes[node].budget_w * MARGIN_FRACTION if margin_w is None else margin_w


_LAST_FAIR: LastDivision[dict[str, float]] = LastDivision()


def fair_w(read: Read, wants_w: Mapping[str, float], margin_w: float | None) -> dict[str, float]:
    """Each delegated node's lease in the tree's priority division
    (``core.delegation.fair_leases_w``) at this read (W), computed again only when what
    it depends on moved."""
    tree = read.view.tree
    assert tree is not None

    def divided() -> dict[str, float]:
        seats = {h: read.view.seats.get(h, 0.0) + read.view.pending.get(h, 0.0) for h in tree.hosts}
        margins = margins_w(read, tree, margin_w)
        key = (read.view.lost, tuple(seats.items()), tuple(sorted(wants_w.items())), tuple(sorted(margins.items())))
        return _LAST_FAIR.get(tree, key, lambda: fair_leases_w(tree, seats, wants_w, margins, read.view.lost))
    return _per_read(read, ("fair", margin_w), wants_w, divided)


def _within(read: Read) -> bool:
    """Whether every node's charge at ``read`` is within its bound."""
    charges = read.charges()
    return charges is not None and all(c <= charges.bound_w(k) + EPS_W for k, c in read.charged_w().items())


def _proposed_w(read: Read, node: str, wants_w: Mapping[str, float], margin_w: float,
                fair: float | None) -> float:
    """``core.delegation.proposed_w`` at ``read``, from the read's own charges."""
    assert read.view.tree is not None
    return proposed_w(read.view.tree, read.held_w(), wants_w, read.delegations, node, margin_w=margin_w,
                      lost=read.view.lost, fair_w=fair, charged=read.table_charged_w())


async def resize(store: CircuitStore, read: Read, host: str, *, wants_w: Mapping[str, float],
                 margin_w: float | None, periodic: bool, tries: int = 3) -> tuple[int, int, bool]:
    """Resize the leases of the delegated nodes above ``host`` (see the module docstring;
    ``periodic``: only where ``host`` is the node's first host, else only growing;
    ``margin_w`` None: :data:`MARGIN_FRACTION` of each node's budget; W).
    Returns (transactions sent, of them failed, whether a lease changed). Raises
    StoreUnavailable."""
    tree = read.view.tree
    sent = failed = 0
    changed = stale = False
    if tree is None or read.view.tree_bad or not (periodic or _ask_helps(read, host, wants_w, margin_w)):
        return sent, failed, changed
    for node in delegated_above(tree, host):
        if periodic and first_host(read, tree, node) != host:
            continue
        if stale:  # a lease above changed: this one's transaction compares it
            read, stale = await store.read(), False
            if not _resizable(read, node):
                break
        margin = _margin_w(tree, node, margin_w)
        for _ in range(tries if node in read.delegations else 3 * tries):
            current = read.delegations.get(node)
            fair = fair_w(read, wants_w, margin_w).get(node)
            if current is not None and fair is not None and (not periodic or _within(read)):
                # The proposal lies between what the subtree holds and its division's
                # figure (at most the larger; ``proposed_w``), and, every node within its
                # bound, the ancestors spare the lease at least what it is: where that
                # range leaves the lease where it is, it is not computed (most rounds of
                # most hosts). A node over (an unmanaged load appeared) may need the
                # lease shrunk below its figure: computed then.
                now = read.charged_w().get(node, 0.0)
                spare = periodic and max(fair, now) <= current - ASK_MIN_W  # watts to give back, if pressed
                if now <= current and _settled(periodic, fair - current, margin) and not spare:
                    break
            target = _per_read(read, ("proposed", node, margin_w), wants_w,
                               partial(_proposed_w, read, node, wants_w, margin, fair))
            if current is not None and _settled(periodic, target - current, margin) and not (
                    periodic and target <= current - ASK_MIN_W and _pressed(read, node, wants_w, margin, current)):
                break
            sent += 1
            if await store.put_delegation(read, node, target, host):
                changed = stale = True
                break
            failed += 1
            read = await store.read()
            if not _resizable(read, node):
                return sent, failed, changed
    return sent, failed, changed


def prepare(read: Read, step_w: float) -> None:
    """What every round under a lease computes from ``read`` whoever the host (the
    leases' figures, :func:`fair_w`, and who waits and who gives back, :func:`giving`,
    with the daemon's margin and ``step_w``), computed once for the read, to be called in a worker
    thread: on a hall of a thousand hosts it is near a tenth of a second of Python,
    which on the event loop would hold up the control ticks."""
    tree = read.view.tree
    if tree is None or read.view.tree_bad or read.charges() is None:
        return
    fair_w(read, read.view.wants, None)
    giving(read, read.view.wants, None, step_w)


def _seat_w(view: CircuitView, host: str) -> float:
    """``host``'s seat as read, a pending one included (W)."""
    return view.seats.get(host, 0.0) + view.pending.get(host, 0.0)


def room_w(read: Read, host: str) -> float:
    """The largest grant (W) the leases of watts above ``host`` leave it at ``read``: its
    room under them (``Read.room_for_w``), its seat aside; inf where none is in force."""
    return read.room_for_w(host) - _seat_w(read.view, host)


def held_back(read: Read, host: str, step_w: float, view: CircuitView | None = None) -> bool:
    """Whether the leases of watts above ``host`` hold its raise back at ``read``: its room
    under them (:func:`room_w`) below its fair share of the wants
    (``CircuitView.fair_w``; spare room is no ask) by ``step_w`` (W) or more. What a host
    asks on. ``view``: ``read.view`` without ceilings, where the caller has it."""
    view = view or dataclasses.replace(read.view, ceilings={})
    return room_w(read, host) < view.fair_w(host) - step_w


def waiting(read: Read, step_w: float) -> frozenset[str]:
    """The live hosts the leases hold back at ``read`` (:func:`held_back`, with this
    host's ``step_w``: every host's ask tests the same, with its own). Computed once per
    read."""
    def compute() -> frozenset[str]:
        view, held = dataclasses.replace(read.view, ceilings={}), read.held_w()
        out = set()
        for h in read.records or view.seats:
            # The cheap test first (a host holding its share is held back by nothing),
            # then its room under the leases against the same figure.
            short_of = view.fair_w(h) - step_w
            if held.get(h, 0.0) - _seat_w(view, h) < short_of and room_w(read, h) < short_of:
                out.add(h)
        return frozenset(out)
    return _per_read(read, ("waiting", step_w), read.view, compute)


def _hosts_under(tree: PowerTree) -> dict[str, frozenset[str]]:
    """Each node's hosts: those with a cord below it (the tree's memo)."""
    memo = tree._memo.get(("hosts_under",))
    if memo is None:
        under: dict[str, set[str]] = {n: set() for n in tree.nodes}
        for h, host in tree.hosts.items():
            for leaf in host.cords:
                for n in tree.path(leaf):
                    under[n].add(h)
        memo = tree._memo[("hosts_under",)] = {n: frozenset(hs) for n, hs in under.items()}
    return memo  # type: ignore[return-value]


def giving(read: Read, wants_w: Mapping[str, float], margin_w: float | None, step_w: float) -> frozenset[str]:
    """The delegated nodes whose lease is to give watts back now, not at the next
    periodic resize: leased :data:`ASK_MIN_W` or more above their figure
    (:func:`fair_w`) while a host waits (:func:`waiting`, ``step_w``) outside them but under their
    nearest leased ancestor (anywhere, where none), or while that ancestor is to give
    back itself (it can shrink only as far as its children have). A lease's figure is
    its share of the division its siblings' are too, so watts given back down to it are
    watts those waiting are due. Computed once per read."""
    def compute() -> frozenset[str]:
        tree = read.view.tree
        assert tree is not None
        waits = waiting(read, step_w)
        if not waits:
            return frozenset()
        fair = fair_w(read, wants_w, margin_w)
        under = _hosts_under(tree)
        charges = read.charges()
        live = {} if charges is None else charges.live
        above = leased_above(tree, live)
        out: set[str] = set()
        for n in sorted(live, key=lambda m: len(tree.path(m))):  # the root's side first
            if n not in fair or live[n] - fair[n] < ASK_MIN_W:
                continue
            p = above.get(n)
            scope = waits if p is None else waits & under[p]
            if p in out or scope - under[n]:
                out.add(n)
        return frozenset(out)
    return _per_read(read, ("giving", margin_w, step_w), wants_w, compute)


def gives_back(read: Read, host: str, wants_w: Mapping[str, float], margin_w: float | None, step_w: float) -> bool:
    """Whether ``host`` is to resize now (as periodically) to give watts back: it is the
    first host of a node above it that is :func:`giving`, holds a watt or more above
    what its subtree is charged (it can shrink), and would move in a periodic resize
    (half its margin or more above its figure, or its ancestors pressed: ``_pressed``;
    else the resize would write nothing, and the host's own ask goes first)."""
    tree = read.view.tree
    if tree is None or read.view.tree_bad or not read.delegations:
        return False
    give = giving(read, wants_w, margin_w, step_w)
    if not give:
        return False
    charged, fair = read.charged_w(), fair_w(read, wants_w, margin_w)
    for n in delegated_above(tree, host):
        if n in give and first_host(read, tree, n) == host and read.delegations[n] - charged.get(n, 0.0) >= ASK_MIN_W:
            margin, current = _margin_w(tree, n, margin_w), read.delegations[n]
            if current - fair[n] >= margin / 2 or _pressed(read, n, wants_w, margin, current):
                return True
    return False


def _ask_helps(read: Read, host: str, wants_w: Mapping[str, float], margin_w: float | None) -> bool:
    """Whether the ask's growths, each landing (on the one before it, the nearest the
    root first), leave ``host`` a watt or more of room it does not have now. A lease
    grown on one cord of a redundant pair while the other's cannot grow (its parent
    full) is no room for the host, only watts locked away from its siblings."""
    tree = read.view.tree
    assert tree is not None
    after = read
    for node in delegated_above(tree, host):
        current = after.delegations.get(node)
        if current is None:
            return True  # a node without a lease takes one at once
        margin = _margin_w(tree, node, margin_w)
        target = _proposed_w(after, node, wants_w, margin, fair_w(after, wants_w, margin_w).get(node))
        if target - current >= ASK_MIN_W:
            after = dataclasses.replace(after, delegations={**after.delegations, node: target}, _memo={})
    return after.room_for_w(host) - read.room_for_w(host) >= ASK_MIN_W


def _pressed(read: Read, node: str, wants_w: Mapping[str, float], margin: float, current: float) -> bool:
    """Whether the ancestors of ``node`` spare less than half its ``margin`` (W) above
    its ``current`` lease: its siblings can grow only by what the others give back, so
    watts it leases above its figure, inside its dead band, are watts they wait for."""
    most = _per_read(read, ("most", node), wants_w, partial(_proposed_w, read, node, wants_w, margin, math.inf))
    return most - current < margin / 2


def _resizable(read: Read, node: str) -> bool:
    """Whether ``node``'s lease can still be resized at ``read`` (read again: the circuit
    may have been wiped, or its tree changed or marked bad, since the first read)."""
    tree = read.view.tree
    return tree is not None and not read.view.tree_bad and node in tree.nodes and tree.nodes[node].delegate


def _settled(periodic: bool, move: float, margin: float) -> bool:
    """Whether a lease that could move by ``move`` (W; < 0: shrink) stays where it is:
    within half the ``margin`` (W) for the periodic resize, under :data:`ASK_MIN_W` of
    growth for an ask (module docstring)."""
    return abs(move) < margin / 2 if periodic else move < ASK_MIN_W
