"""A power tree: budgets at every level, A/B cords, failover and priorities (pure).

Real racks are not one circuit. A site feeds two UPSes (A and B), each a panel, each
panel a PDU per rack; a GPU server has two power supplies, one corded to the rack's
PDU A, one to its PDU B. Every *node* (site, feed or UPS, panel, PDU, circuit) has a
budget in wall W (``budget_w``: derived from its breaker and UPS by ``core.feed``, see
``config.tree``). A *host* hangs off one leaf (single-corded) or two (dual-corded); each
cord carries its ``share`` of the host's draw (about half), and all of it when the other
cord's feed is lost.

A dual-corded host's two cords meet at their lowest common node; the two children of
that node on its cords' paths are the host's *feed pair*. Each pair has a mode:

- ``redundant`` (the default): each cord must be able to carry the whole host, so a
  node counts the host's whole draw on each of its cords. A feed loss then overloads
  nothing.
- ``oversubscribed``: a node counts the host's normal split (its cord's share). On a
  feed loss the surviving side carries both shares and must be brought back within its
  budget (the hosts lowered: :func:`divide` under the loss) within the pair's
  ``shed_s``, shorter than what the surviving breaker and UPS tolerate at that overload.

What the invariant bounds, at every node ``n`` (*committed*, failover counted)::

    sum over hosts h of  coefficient(h, n) x (reserve_h + grant_h)  <=  budget_w(n)

with ``coefficient`` 1 for a single-corded or redundant host with a cord under ``n``,
the cord's share for an oversubscribed one (1 when both its cords are under ``n``), 0
otherwise. Under a feed loss the *flow* coefficients apply: a host's live cords carry
its draw in proportion to their shares; a host with no live cord is down.

*Priorities*: each host has a class (``priority``, higher is more important). When a
node is short, :func:`divide` fills every class's reserves (highest first) before any
watt above a reserve, then the wants above the reserves class by class: lower classes
are lowered first and lend first, and a higher class is never lowered below its reserve
to feed a lower one. Within a class the division is max-min fair (``core.circuit``'s).

Pure: no I/O, no clock. Figures in wall W, shed times in s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar, cast

from powerbudgetd.core.fair import max_min_fair

MODES = ("redundant", "oversubscribed")
KINDS = ("site", "feed", "ups", "panel", "pdu", "circuit", "outlet")
EPS_W = 1e-6
# Limits on a tree's size, so that every check is bounded: a hall of 200 racks with an A
# and a B PDU each, its panels and feeds, is under 500 nodes and a few thousand hosts;
# a site's feeds -> UPS -> panels -> PDUs -> circuits is under ten levels.
MAX_NODES = 4096
MAX_HOSTS = 4096
MAX_DEPTH = 32  # nodes on the path from a leaf to the root, both counted
MAX_NAME = 63  # characters in a node's or host's name


@dataclass(frozen=True)
class Node:
    """One level of the tree: ``budget_w`` (wall W, on averages: what its hosts may
    commit), its ``parent`` (None at the root), its ``kind`` (one of :data:`KINDS`, for
    the operator), the ``meter`` that measures it (a source id, ``core.nodemeter``; None:
    not metered) and the ``unmanaged_w`` taken off its budget (W: a load no host
    reports, ``core.nodemeter.unmanaged_by_node``; :meth:`PowerTree.with_unmanaged`) and
    whether its budget may be delegated to its subtree (``delegate``: ``core.delegation``)."""

    name: str
    budget_w: float
    parent: str | None = None
    kind: str = "circuit"
    meter: str | None = None
    unmanaged_w: float = 0.0
    delegate: bool = False

    @property
    def rated_w(self) -> float:
        """The node's whole budget (W): what its hosts may commit plus the unmanaged load."""
        return self.budget_w + self.unmanaged_w


@dataclass(frozen=True)
class Host:
    """One host: its ``cords`` (leaf name -> share of its draw, summing to 1; one or two),
    its seat ``reserve_w`` (wall W it may always use) and its ``priority`` class."""

    name: str
    cords: Mapping[str, float]
    reserve_w: float = 0.0
    priority: int = 0


@dataclass(frozen=True)
class Pair:
    """A feed pair (two sibling nodes) and its redundancy mode; ``shed_s``: the time the
    operator states for shedding on a feed loss (oversubscribed only)."""

    feeds: frozenset[str]
    mode: str = "redundant"
    shed_s: float | None = None


@dataclass(frozen=True)
class PowerTree:
    """Nodes, hosts and the declared pairs (a pair not declared is redundant).

    Raises ValueError naming the node or host for a tree that is not one: an unknown
    parent or cord, a cycle, not exactly one root, a cord on a node with children, not
    one cord or two, shares that do not sum to 1.
    """

    nodes: Mapping[str, Node]
    hosts: Mapping[str, Host]
    pairs: Mapping[frozenset[str], Pair] = field(default_factory=dict)
    _coefficients: dict[tuple[str | None, bool], dict[str, dict[str, float]]] = field(default_factory=dict, compare=False, repr=False)
    _checked: bool = field(default=False, compare=False, repr=False)  # the shape checked (a copy of a checked tree)
    # What one shape computes once for others (``core.delegation``'s charged coefficients),
    # shared by the copies of the same shape as ``_coefficients`` is.
    _memo: dict[tuple[object, ...], object] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self._checked:
            return
        problems = list(self._size_problems())
        if not problems:
            problems = [*self._node_problems(), *self._host_problems()]
        if problems:
            raise ValueError("; ".join(problems))

    def _size_problems(self) -> Iterable[str]:
        """The limits (:data:`MAX_NODES`, :data:`MAX_HOSTS`, :data:`MAX_NAME`), checked
        before anything whose cost grows with the tree."""
        if len(self.nodes) > MAX_NODES:
            yield f"nodes: {len(self.nodes)} nodes, more than {MAX_NODES}"
        if len(self.hosts) > MAX_HOSTS:
            yield f"hosts: {len(self.hosts)} hosts, more than {MAX_HOSTS}"
        for what, names in (("nodes", self.nodes), ("hosts", self.hosts)):
            long = next((n for n in names if len(n) > MAX_NAME), None)
            if long is not None:
                yield f"{what}.{long[:MAX_NAME]}...: a name longer than {MAX_NAME} characters ({len(long)})"

    def _node_problems(self) -> Iterable[str]:
        """One pass over the parents (each node visited once): a missing parent, each
        cycle once (nodes that hang below it are not cycles), not one root, a leaf
        deeper than :data:`MAX_DEPTH`."""
        roots = [n.name for n in self.nodes.values() if n.parent is None]
        if len(roots) != 1:
            shown = ", ".join(roots[:5]) + (f" and {len(roots) - 5} more" if len(roots) > 5 else "")
            yield f"the tree needs exactly one root (a node without parent), found {len(roots)}: {shown or 'none'}"
        depth: dict[str, int] = {}  # settled: levels from the node up to its root (or to a problem: -1)
        for start in self.nodes:
            if start in depth:
                continue
            walk: list[str] = []
            on_walk: dict[str, int] = {}
            at: str | None = start
            below = 0
            while True:
                if at is None:
                    below = 0
                    break
                if at in depth:
                    below = depth[at]
                    break
                if at in on_walk:  # a new cycle: reported once, from its first node met
                    cycle = walk[on_walk[at]:]
                    yield f"nodes.{at}.parent: a cycle ({' -> '.join([*cycle, at])})"
                    below = -1
                    break
                node = self.nodes[at]
                if node.parent is not None and node.parent not in self.nodes:
                    yield f"nodes.{at}.parent: no node {node.parent!r}"
                    on_walk[at] = len(walk)
                    walk.append(at)
                    below = -1
                    break
                on_walk[at] = len(walk)
                walk.append(at)
                at = node.parent
            for name in reversed(walk):
                below = -1 if below < 0 else below + 1
                depth[name] = below
        deepest = max(depth.items(), key=lambda kv: kv[1], default=("", 0))
        if deepest[1] > MAX_DEPTH:
            yield f"nodes.{deepest[0]}: {deepest[1]} levels from the root, more than {MAX_DEPTH}"

    def _host_problems(self) -> Iterable[str]:
        parents = {n.parent for n in self.nodes.values()}
        for host in self.hosts.values():
            if not 1 <= len(host.cords) <= 2:
                yield f"hosts.{host.name}.cords: one cord or two, got {len(host.cords)}"
            for leaf in host.cords:
                if leaf not in self.nodes:
                    yield f"hosts.{host.name}.cords: no node {leaf!r}"
                elif leaf in parents:
                    yield f"hosts.{host.name}.cords: {leaf!r} has children: a cord goes to a leaf"
            if abs(sum(host.cords.values()) - 1.0) > 1e-6 or any(s <= 0 for s in host.cords.values()):
                yield f"hosts.{host.name}.cords: shares must be > 0 and sum to 1, got {dict(host.cords)}"

    # -- shape ------------------------------------------------------------------------
    def path(self, node: str) -> list[str]:
        """``node`` and its ancestors up to the root."""
        out = []
        at: str | None = node
        while at is not None:
            out.append(at)
            at = self.nodes[at].parent
        return out

    def pair_of(self, host: str) -> frozenset[str] | None:
        """The feed pair a dual-corded host's cords part at (None: single-corded)."""
        cords = list(self.hosts[host].cords)
        if len(cords) < 2:
            return None
        a, b = self.path(cords[0]), self.path(cords[1])
        on_b = set(b)
        common = next(n for n in a if n in on_b)
        return frozenset((a[a.index(common) - 1], b[b.index(common) - 1]))

    def mode_of(self, host: str) -> str:
        """``redundant`` or ``oversubscribed`` for a dual-corded host (its pair's mode);
        a single-corded host counts whole on its one cord, as ``redundant``."""
        pair = self.pair_of(host)
        return "redundant" if pair is None else self.pairs.get(pair, Pair(pair)).mode

    def feeds(self) -> list[str]:
        """Every node that is one side of some host's feed pair: the feeds whose loss
        moves a host's draw onto its other cord."""
        return sorted({f for h in self.hosts for f in (self.pair_of(h) or ())})

    def with_mode(self, mode: str, shed_s: float | None = None) -> PowerTree:
        """The same tree with every feed pair in ``mode`` (``shed_s`` for oversubscribed)."""
        pairs = {p: Pair(p, mode, shed_s if mode == "oversubscribed" else None)
                 for p in {self.pair_of(h) for h in self.hosts} if p is not None}
        return replace(self, pairs=pairs, _coefficients={}, _checked=True, _memo={})

    def with_reserves(self, reserves_w: Mapping[str, float]) -> PowerTree:
        """The same tree with each host's reserve as given (W; 0 for one not given): the
        seats a circuit's store holds, rather than the file's plan."""
        hosts = {h: replace(host, reserve_w=reserves_w.get(h, 0.0)) for h, host in self.hosts.items()}
        # The same shape: not checked again, and the coefficients (cords, pairs) shared.
        return replace(self, hosts=hosts, _coefficients=self._coefficients, _checked=True, _memo=self._memo)

    def with_unmanaged(self, unmanaged_w: Mapping[str, float]) -> PowerTree:
        """The same tree with each node's budget lowered by its unmanaged load (W, >= 0; 0
        for a node not given), from its whole budget (:attr:`Node.rated_w`), never below
        0: every division, room and check then leaves that load its watts."""
        nodes = {}
        for name, node in self.nodes.items():
            load = max(0.0, unmanaged_w.get(name, 0.0))
            rated = node.rated_w
            nodes[name] = replace(node, budget_w=max(0.0, rated - load), unmanaged_w=min(load, rated))
        return replace(self, nodes=nodes, _coefficients=self._coefficients, _checked=True, _memo=self._memo)

    # -- what each node carries -------------------------------------------------------
    def coefficients(self, lost: str | None = None, *, flow: bool = False) -> dict[str, dict[str, float]]:
        """node -> host -> the fraction of the host's wall draw the node carries (> 0).

        ``lost`` None (and not ``flow``): *committed* coefficients, failover counted
        (module docstring). ``flow``, or ``lost`` a node: where the current flows, with
        that node and all below it dead: a host's live cords share its draw in
        proportion to their shares; dead nodes and hosts with no live cord are left out."""
        key = (lost, flow or lost is not None)
        if key not in self._coefficients:
            self._coefficients[key] = self._coefficients_of(*key)
        return self._coefficients[key]

    def _coefficients_of(self, lost: str | None, flow: bool) -> dict[str, dict[str, float]]:
        # Each host's cords walked up once: O(hosts x depth), whatever the tree's width.
        dead = set() if lost is None else {n for n in self.nodes if lost in self.path(n)}
        out: dict[str, dict[str, float]] = {n: {} for n in self.nodes if n not in dead}
        for host in self.hosts.values():
            live = {leaf: s for leaf, s in host.cords.items() if leaf not in dead}
            if not live:
                continue
            whole = not flow and self.mode_of(host.name) == "redundant"
            total = sum(live.values())
            under: dict[str, float] = {}
            for leaf, share in live.items():
                for node in self.path(leaf):
                    under[node] = under.get(node, 0.0) + share
            for node, share in under.items():
                out[node][host.name] = 1.0 if whole else min(1.0, share / total)
        return out

    def loads_w(self, draw_w: Mapping[str, float], lost: str | None = None, *, flow: bool = False) -> dict[str, float]:
        """Each node's load (wall W) for each host's ``draw_w`` (a seat plus grant, or a
        measured draw): committed, or the flow (``flow``, or ``lost`` dead)."""
        return {n: sum(c * draw_w.get(h, 0.0) for h, c in hs.items())
                for n, hs in self.coefficients(lost, flow=flow).items()}

    def loads_known_w(self, figure_w: Mapping[str, float | None], lost: str | None = None, *,
                      flow: bool = False) -> dict[str, float | None]:
        """As :meth:`loads_w` for hosts' figures that may be unknown (None: that host's
        caps or measured draw not known): None at every node such a host loads. Hosts
        without a figure count 0 (not running)."""
        out: dict[str, float | None] = {}
        for n, hs in self.coefficients(lost, flow=flow).items():
            vals = [(c, figure_w[h]) for h, c in hs.items() if h in figure_w]
            out[n] = None if any(x is None for _, x in vals) else sum(c * (x or 0.0) for c, x in vals)
        return out

    def over_w(self, draw_w: Mapping[str, float], lost: str | None = None, *, flow: bool = False) -> dict[str, float]:
        """The nodes whose load (as :meth:`loads_w`) exceeds their budget, and by how much (W)."""
        loads = self.loads_w(draw_w, lost, flow=flow)
        return {n: w - self.nodes[n].budget_w for n, w in loads.items() if w > self.nodes[n].budget_w + EPS_W}

    def room_for_w(self, host: str, held_w: Mapping[str, float], lost: str | None = None) -> float:
        """The most ``host`` may draw in all (wall W, may be < 0) beside every other
        host's ``held_w`` so that every node on its cords' paths stays within its budget:
        committed (``lost`` None: failover counted) or the flow with ``lost`` dead
        (inf for a host no live node carries)."""
        best = math.inf
        for node, hs in self.coefficients(lost).items():
            if host in hs:
                others = sum(c * held_w.get(h, 0.0) for h, c in hs.items() if h != host)
                best = min(best, (self.nodes[node].budget_w - others) / hs[host])
        return best

    def largest_grant_w(self, host: str, held_w: Mapping[str, float]) -> float:
        """The largest grant (wall W above its reserve) ``host`` may hold beside every
        other host's ``held_w`` (reserve + grant) so that every node on its cords' paths
        stays within its budget, failover counted (redundant: the host's whole draw on
        each cord; oversubscribed: its share). 0 when even its reserve does not fit."""
        return max(0.0, self.room_for_w(host, held_w) - self.hosts[host].reserve_w)


_T = TypeVar("_T")


class LastDivision(Generic[_T]):
    """The last few divisions a process computed and what each was computed from: the
    tree's shape (held by its memo: copies of one parsed tree share it), its nodes'
    budgets (copies of one shape may differ in them) and a key of the other figures it
    depends on. Successive reads of a circuit mostly differ in grants and leases, which
    no division depends on: they divide alike, once; and a few are kept, as the hosts
    of one process (the load test's) may hold reads a revision or two apart, which one
    entry would compute again turn by turn. The value is shared: callers do not change
    it."""

    def __init__(self, size: int = 4) -> None:
        self._size = size
        self._last: list[tuple[object, object, _T]] = []  # the most recent last

    def get(self, tree: PowerTree, key: object, compute: Callable[[], _T]) -> _T:
        """The value for ``tree``'s shape and budgets and ``key`` (``compute()`` where
        none kept matches)."""
        full = (tuple(n.budget_w for n in tree.nodes.values()), key)
        for i in range(len(self._last) - 1, -1, -1):
            memo, was, value = self._last[i]
            if memo is tree._memo and was == full:
                return value
        value = compute()
        self._last = [*self._last, (tree._memo, full, value)][-self._size:]
        return value


def divide(tree: PowerTree, wants_w: Mapping[str, float], lost: str | None = None,
           ceilings_w: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each host's allowed wall draw (reserve + grant, W) for its ``wants_w`` (W, total),
    so that every node's committed load fits its budget, and with ``lost`` dead also its
    flow (the two the records are held to: ``CircuitView.node_loads_w``).

    Priority-aware: the reserves first, class by class from the highest (each host up to
    min(want, reserve)), then the wants above them class by class; within a class,
    progressive filling (max-min fair, :func:`core.fair.max_min_fair` at each node)
    until the host's want or a node on its paths is full. Never over any node's budget
    (a node already over stays where it is: nothing is added under it).

    ``ceilings_w`` (W, total; None: none): the most each host could ever draw (its
    nameplate: every card at its maximum limit). Once every want is met as far as the
    nodes allow, the room left is handed out, class by class and max-min fair as the
    wants were, up to each host's ceiling (never below its want): *spare room*, so that
    a host's rise is met before its next want is published. Spare room never needs
    shedding: with no feed lost, it also fits every node's flow with any one feed lost
    (an oversubscribed pair's wants may need shedding on a loss; the room lent above
    them does not add to it). Where every nameplate fits every node with pairs
    redundant (the nameplate count), every host is given its nameplate. A host without
    a ceiling gets none.

    Failover-invariant where the loss asks nothing new: a node's flow under the loss
    counts only where it carries some host more than committed (an oversubscribed
    host's surviving cord). A redundant pair's hosts are committed whole on each cord,
    so losing either feed of it adds no bound, and the division is the normal one: the
    loss moves no grant. A host with no live cord (down) draws nothing, but keeps its
    share where committed: its records hold it there until its lease ends."""
    committed = tree.coefficients()
    bounds: dict[object, Mapping[str, float]] = {n: hs for n, hs in committed.items()}
    room: dict[object, float] = {n: tree.nodes[n].budget_w for n in committed}
    if lost is not None:
        flow = tree.coefficients(lost)
        for node, hs in flow.items():
            if any(c > committed[node].get(h, 0.0) + EPS_W for h, c in hs.items()):
                bounds[("flow", node)] = hs
                room[("flow", node)] = tree.nodes[node].budget_w
    return divide_over(tree, bounds, room, wants_w, ceilings_w=ceilings_w, lost=lost)


def divide_over(tree: PowerTree, bounds: dict[object, Mapping[str, float]], room: dict[object, float],
                wants_w: Mapping[str, float], then_w: Mapping[str, float] | None = None, *,
                ceilings_w: Mapping[str, float] | None = None, lost: str | None = None) -> dict[str, float]:
    """:func:`divide`'s stages over given ``bounds`` (a key -> each host's coefficient on
    it; spare room's loss bounds are added to it) and their ``room`` (W, updated in
    place): every class's reserves from the highest, then every class's wants, then
    with ``ceilings_w`` every class's spare room (bounded by each feed's loss unless
    ``lost`` is one already); then ``then_w`` (W each, keys that are not the tree's
    hosts: last, after every class). Returns W for each tree host and each key of
    ``then_w``."""
    alloc = {h: 0.0 for h in tree.hosts}
    hosts = sorted({h for hs in bounds.values() for h in hs if h in tree.hosts})
    classes = sorted({tree.hosts[h].priority for h in hosts}, reverse=True)
    stages = ("reserve", "want", "spare") if ceilings_w else ("reserve", "want")
    for stage in stages:
        if stage == "spare" and lost is None:
            _bound_spare_by_each_loss(tree, bounds, room, alloc)
        for cls in classes:
            members = [h for h in hosts if tree.hosts[h].priority == cls]
            caps = {h: max(0.0, wants_w.get(h, 0.0)) for h in members}
            if stage == "reserve":
                caps = {h: min(w, tree.hosts[h].reserve_w) for h, w in caps.items()}
            elif stage == "spare":
                assert ceilings_w is not None
                caps = {h: max(w, ceilings_w.get(h, 0.0)) for h, w in caps.items()}
            _fill(bounds, room, alloc, caps)
    if then_w:
        alloc.update(dict.fromkeys(then_w, 0.0))
        _fill(bounds, room, alloc, {k: max(0.0, w) for k, w in then_w.items()})
    return alloc


def _bound_spare_by_each_loss(tree: PowerTree, bounds: dict[object, Mapping[str, float]], room: dict[object, float],
                              alloc: Mapping[str, float]) -> None:
    """Spare room must not need shedding: each node's flow with each feed lost is a
    bound too, its room what the division so far leaves it (a node the wants already put
    over on that loss has none: nothing spare is added under it)."""
    for feed in tree.feeds():
        for node, hs in tree.coefficients(feed).items():
            key = ("spare", feed, node)
            bounds[key] = hs
            room[key] = tree.nodes[node].budget_w - sum(c * alloc[h] for h, c in hs.items())


def _fill(coefficients: Mapping[object, Mapping[str, float]], room: dict[object, float], alloc: dict[str, float],
          caps: Mapping[str, float]) -> None:
    """Raise each host in ``caps`` towards its cap by equal steps (progressive filling):
    at each round the node whose max-min fair level is lowest is the bottleneck; its
    hosts stop there. Updates ``alloc`` and ``room`` (W) in place."""
    on: dict[str, list[tuple[object, float]]] = {h: [] for h in caps}  # each host's bounds and its coefficient there
    for node, hs in coefficients.items():
        for h, c in hs.items():
            if h in on:
                on[h].append((node, c))
    for h, c in caps.items():
        # A cap within EPS_W of what the host has (a seat of a microwatt) is given whole
        # where every bound it is on has room: the filling below stops short of EPS_W
        # steps, and a seat the division leaves out is one no lease figure counts.
        rest = c - alloc[h]
        if 0.0 < rest <= EPS_W and all(room[node] >= k * rest for node, k in on[h]):
            alloc[h] = c
            for node, k in on[h]:
                room[node] -= k * rest
    open_w = {h: c - alloc[h] for h, c in caps.items() if c - alloc[h] > EPS_W}
    while open_w:
        step, bottleneck = math.inf, cast(object, None)  # a node, or a node's flow under the loss
        for node, hs in coefficients.items():
            # A bound whose open hosts' whole rest fits its room stops nobody this round
            # (the water-fill would give each its rest): most bounds, most rounds.
            need, members = 0.0, {}
            for h, k in hs.items():
                left = open_w.get(h)
                if left is not None:
                    members[h] = left
                    need += k * left
            if not members or need <= room[node]:
                continue
            fair = max_min_fair(room[node], members, {h: hs[h] for h in members})
            short = [fair[h] for h in members if fair[h] < members[h] - EPS_W]
            if short and max(short) < step:
                step, bottleneck = max(short), node
        for h in list(open_w):
            inc = min(open_w[h], step)
            alloc[h] += inc
            for node, k in on[h]:
                room[node] -= k * inc
            open_w[h] -= inc
            if open_w[h] <= EPS_W or (bottleneck is not None and h in coefficients[bottleneck]):
                del open_w[h]
