"""Delegated subtrees: a lease of watts from a parent, so a subtree grants on its own (pure).

A node marked ``delegate`` in the tree file may hold a *delegation* ``D(m)`` (wall W): the
most its subtree may commit at ``m``. While one is stored, ``m``'s ancestors count ``D(m)``
in place of the hosts below ``m``, so a host under ``m`` that raises checks only the nodes
from its cords up to ``m`` (and ``D(m)``), and its transaction compares only the keys
those nodes depend on: raises under different delegated nodes never conflict.

*Charged load* at node ``k`` (what its bound is checked against)::

    C(k) = sum over m in top(k) of max(D(m), C(m))  +  sum over hosts h of resid(h, k) x held(h)
    resid(h, k) = max(0, coef(h, k) - sum over m in top(k) of coef(h, m))

with ``top(k)`` the delegated nodes strictly below ``k`` with no delegated node between,
``coef`` the tree's committed coefficients (``core.tree``: failover counted) and ``held``
each host's seat (or pending reserve) plus grant; ``max(D(m), C(m))`` is ``D(m)`` while
``m`` keeps its bound, and its own charge where a feed lost moves more flow into it
than its lease (an oversubscribed host's other cord), until the lease is resized. Every node keeps
``C(k) <= bound(k) = min(budget(k), D(k))`` (``D(k)`` only where ``k`` holds one).

Why that bounds the true committed load ``L(k) = sum coef(h, k) x held(h)`` everywhere:
``coef`` is subadditive over disjoint subtrees (a redundant host counts 1 at a node and
at least 1 over the subtrees holding its cords; an oversubscribed one
``min(1, s1 + s2) <= min(1, s1) + min(1, s2)``), so ``L(k) <= sum over top(k) of L(m) +
sum resid(h, k) x held(h)``; and ``L(m) <= C(m)`` by induction from the leaves.
With a feed lost, the same with the flow coefficients (additive), and each node's bound
holds for the larger of the two charges (as ``CircuitView.node_loads_w``); a delegated
node dead under the loss carries no flow (its flow coefficients are 0), so the flow's
charge above it leaves its lease out and counts its hosts' flow through their live
cords in their residual.

Removing a delegation never raises any ancestor's charge (``max(D(m), C(m))`` is replaced
by what ``C(m)`` counted); creating or changing one is a transaction that checks every
node (:func:`over_w`) and compares what that check depends on (:func:`lease_compares`):
every seat and claim and the feed marks (rare writes: whole ranges), the grant of each
host charged *outside* any lease at ``m`` or an ancestor of ``m`` up to ``p``, the
nearest ancestor holding a lease (``resid(h, a) > 0``; up to the root where there is
none), and the records of ``p``, of every delegate-marked node whose nearest leased
ancestor is ``p`` too and of every one whose nearest leased ancestor is ``m`` (its own
bound counts them: created, changed or removed, exact mod revisions). A host under a
sibling lease ``m'`` is not compared: its raise keeps ``C(m') <= D(m')`` (its own
compares see ``D(m')`` unchanged), so ``max(D(m'), C(m'))`` at the ancestors stays
``D(m')``; where a feed lost has put ``C(m')`` above ``D(m')`` no raise there is allowed
(its room is what it holds) and a lowering only lowers it. So a lease resize and a raise
under another lease never conflict. Nor does anything above ``p`` or under another
lease: the check keeps ``C(p) <= D(p)`` (``p``'s bound), so every ancestor of ``p``
counts ``D(p)`` before and after (or, where a feed lost had put ``C(p)`` above ``D(p)``,
less after), and a lease nested under a sibling lease ``m'`` is hidden behind
``max(D(m'), C(m'))`` by the same argument. Leases nested under one parent lease (a
PDU's outlets under its rack's lease) thus resize against their siblings only. A resize
of a lease ``m`` holds needs half of that: a growth can break only what lies above
``m`` (the hosts and leases below it each compare ``D(m)``, so they are left out), a
shrink only ``m``'s own bound (only the hosts and leases below it are compared).

What a raise of host ``h`` depends on (:func:`zone`): the nodes ``R(h)`` where
``resid(h, k) > 0`` (its charge moves only there), the hosts charged at any of them,
and the delegation of every delegate-marked node in ``R(h)`` or below one (one created,
changed or removed there changes a charge in ``R(h)`` or its bound). A raise whose
compares cover exactly that keeps every bound.

*The lease each node should hold* (:func:`fair_leases_w`): the tree's own division
(``core.tree.divide``: reserves class by class from the highest, then wants class by
class, max-min fair within a class) over the *charged* coefficients, with every
delegate-marked node leased::

    chat(h, k) = resid(h, k) + sum over m in top(k) of chat(h, m)

(each table; at a delegated node the larger of committed and flow), so that what the
division gives each host fits every node's charge once each lease is
``D(m) = sum over h of chat(h, m) x alloc(h)``; then each lease's margin, after every
class. Siblings under one parent thus share its room as their hosts would: a subtree
whose hosts want more at a higher class gets its watts before a lower-class sibling's
lease grows, and a lease above that figure is shrunk to it (never below what its
subtree holds). Where no host's cords cross a delegated node's boundary ``chat`` is
the tree's coefficient and the division is the tree's; a host corded under two
delegated nodes is counted on each lease (the cost of delegating there).

Pure: no I/O. Figures in wall W.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import cast

from powerbudgetd.core.tree import EPS_W, PowerTree, divide_over


def active(tree: PowerTree, delegations_w: Mapping[str, float]) -> dict[str, float]:
    """The delegations that count: on a node of ``tree`` marked ``delegate``, a finite
    figure >= 0 (W). Others (a node since unmarked, a figure that could not be read) are
    left out, which only ever lowers an ancestor's charge."""
    return {n: w for n, w in delegations_w.items()
            if n in tree.nodes and tree.nodes[n].delegate and math.isfinite(w) and w >= 0}


def _children(tree: PowerTree) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {n: [] for n in tree.nodes}
    for node in tree.nodes.values():
        if node.parent is not None:
            out[node.parent].append(node.name)
    return out


def tops(tree: PowerTree, live: Mapping[str, float]) -> dict[str, list[str]]:
    """node -> its delegated nodes strictly below with no delegated node between (``top``)."""
    out: dict[str, list[str]] = {n: [] for n in tree.nodes}
    for m in sorted(live):  # one order whatever the mapping's: a charge's sum is one float
        at = tree.nodes[m].parent
        while at is not None:
            out[at].append(m)
            if at in live:
                break
            at = tree.nodes[at].parent
    return out


# A tree shape's memo is emptied past this many entries: a host's own resizes need a few
# (its delegated nodes each left out, with and without a feed lost); in-process hosts
# sharing one shape (the load test) one for each delegated node of the tree.
MEMO_ENTRIES = 256

# What Charges keeps per tree shape, leased nodes and feed lost: top, the residual
# tables, each table's walk (``Charges.table_loads_w``).
_Plan = list[tuple[str, tuple[str, ...], tuple[tuple[str, float], ...]]]
_ChargeTables = tuple[dict[str, list[str]], list[dict[str, dict[str, float]]], list[_Plan]]


@dataclass(frozen=True)
class Charges:
    """The charge tables of one tree and one set of live delegations: ``resid[k][h]``
    (committed, and under ``lost`` the flow's too), ``top[k]`` and the bound of each node."""

    tree: PowerTree
    live: Mapping[str, float]
    lost: str | None = None
    top: dict[str, list[str]] = field(init=False, repr=False, compare=False)
    _tables: list[dict[str, dict[str, float]]] = field(init=False, repr=False, compare=False)
    _plans: list[_Plan] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The tables depend on the tree's shape, which nodes hold a lease and the feed
        # lost, not on the figures: computed once for the copies of one shape (its memo).
        key = ("charges", frozenset(self.live), self.lost)
        memo = self.tree._memo.get(key)
        if memo is None:
            depth = {n: len(self.tree.path(n)) for n in self.tree.nodes}
            top = tops(self.tree, self.live)
            order = sorted(self.tree.nodes, key=lambda n: -depth[n])
            tables = [self._resid(False)] + ([self._resid(True)] if self.lost is not None else [])
            # Each table's walk, leaves first: a node, what of top(k) the table counts
            # (``counted``), its residual row.
            plans = [[(k, tuple(m for m in top[k] if m in table), tuple(table[k].items())) for k in order if k in table]
                     for table in tables]
            memo = (top, tables, plans)
            if len(self.tree._memo) > MEMO_ENTRIES:
                self.tree._memo.clear()
            self.tree._memo[key] = memo
        top, tables, plans = cast(_ChargeTables, memo)
        object.__setattr__(self, "top", top)
        object.__setattr__(self, "_tables", tables)
        object.__setattr__(self, "_plans", plans)

    def _resid(self, flow: bool) -> dict[str, dict[str, float]]:
        # Walked per host along its cords' paths: at each node, top(k) as far as this host
        # is concerned is the last delegated node passed on each path (O(hosts x depth)).
        coef = self.tree.coefficients(self.lost) if flow else self.tree.coefficients()
        out: dict[str, dict[str, float]] = {k: {} for k in coef}
        for h, host in self.tree.hosts.items():
            below: dict[str, set[str]] = {}
            for leaf in host.cords:
                last: str | None = None
                for k in self.tree.path(leaf):
                    ms = below.setdefault(k, set())
                    if last is not None:
                        ms.add(last)
                    if k in self.live:
                        last = k
            for k, ms in below.items():
                c = coef.get(k, {}).get(h)
                if c is None:
                    continue
                r = c - sum(coef.get(m, {}).get(h, 0.0) for m in ms)
                if r > EPS_W:
                    out[k][h] = r
        return out

    def tables(self) -> list[dict[str, dict[str, float]]]:
        """The residual coefficients to check: committed, and the flow with a feed lost."""
        return self._tables

    @cached_property
    def bounds_w(self) -> dict[str, float]:
        """Each node's bound (W): its budget, and its lease where it holds one."""
        live = self.live
        return {n: min(nd.budget_w, live[n]) if n in live else nd.budget_w for n, nd in self.tree.nodes.items()}

    def bound_w(self, node: str) -> float:
        return self.bounds_w[node]

    def counted(self, table: Mapping[str, Mapping[str, float]], node: str) -> list[str]:
        """``top(node)`` as ``table`` counts it: a delegated node dead under the lost feed
        (not in the flow's table) carries no flow, so its lease is counted committed only
        (its hosts' flow is in their residual through their live cords: the flow
        coefficients are additive, and a dead node's is 0)."""
        return [m for m in self.top[node] if m in table]

    def table_loads_w(self, held_w: Mapping[str, float]) -> list[dict[str, float]]:
        """Each node's charge ``C(k)`` (W) in each of :meth:`tables`. A delegated node
        counts at its ancestors as the larger of its lease and its own charge: a feed
        lost can move more flow into a subtree than its lease (an oversubscribed host's
        other cord), and its ancestors then carry that (``L(m) <= C(m)`` still holds)."""
        out = []
        live = self.live
        for plan in self._plans:
            loads: dict[str, float] = {}
            for k, below, row in plan:  # the leaves first: top(k) done before k
                loads[k] = sum(max(live[m], loads[m]) for m in below) + sum(r * held_w.get(h, 0.0) for h, r in row)
            out.append(loads)
        return out

    def fits_resized(self, held_w: Mapping[str, float], table_loads: Sequence[Mapping[str, float]],
                     node: str, watts: float) -> bool:
        """Whether every node stays within its bound with ``node``'s lease (live here) at
        ``watts`` (W), given :meth:`table_loads_w` at ``held_w`` under these leases: the
        check of :func:`within_bounds`, bit for bit, but only ``node``'s ancestors
        counted again (no other charge depends on its lease): O(depth) sums and one pass
        over the bounds. A figure not within [0, its budget] does not fit
        (:func:`delegation_fits`)."""
        if not _figure_allowed(self.tree, node, watts):
            return False
        live = {**self.live, node: watts}
        ancestors = self.tree.path(node)[1:]  # the nearest first: the leaves-first order
        for steps, loads in zip(self._steps(), table_loads, strict=True):
            moved: dict[str, float] = {}
            for k in ancestors:
                if k in steps:
                    below, row = steps[k]
                    moved[k] = sum(max(live[m], moved.get(m, loads[m])) for m in below) + \
                        sum(r * held_w.get(h, 0.0) for h, r in row)
            bounds = self.bounds_w
            if any(c > bounds[k] for k, c in loads.items() if k != node and k not in moved) \
                    or any(c > bounds[k] for k, c in moved.items()) \
                    or (node in loads and loads[node] > min(self.tree.nodes[node].budget_w, watts)):
                return False
        return True

    def _steps(self) -> list[dict[str, tuple[tuple[str, ...], tuple[tuple[str, float], ...]]]]:
        """Each table's walk (:meth:`table_loads_w`) by node (shared by the copies of one shape)."""
        key = ("steps", frozenset(self.live), self.lost)
        steps = self.tree._memo.get(key)
        if steps is None:
            steps = self.tree._memo[key] = [{k: (below, row) for k, below, row in plan} for plan in self._plans]
        return cast(list[dict[str, tuple[tuple[str, ...], tuple[tuple[str, float], ...]]]], steps)

    def loads_w(self, held_w: Mapping[str, float]) -> dict[str, float]:
        """Each node's charge ``C(k)`` (W): the larger of committed and, with a feed lost,
        flow (a node dead under the loss: committed only)."""
        return larger_w(self.table_loads_w(held_w))

    def over_w(self, held_w: Mapping[str, float], slack_w: float = EPS_W) -> dict[str, float]:
        """The nodes whose charge exceeds their bound by more than ``slack_w``, and by how
        much (W)."""
        return {k: c - self.bound_w(k) for k, c in self.loads_w(held_w).items() if c > self.bound_w(k) + slack_w}

    def room_for_w(self, host: str, held_w: Mapping[str, float],
                   table_loads: Sequence[Mapping[str, float]] | None = None) -> float:
        """The most ``host`` may hold in all (W, seat + grant) beside the others' ``held_w``
        so every node where it is charged stays within its bound (inf: charged nowhere);
        ``table_loads``: :meth:`table_loads_w` at ``held_w`` where the caller has it.

        No more than it holds while any node on its cords' paths is over its bound: a feed
        lost puts a lease's ancestors over in the flow (the lease counted where the flow
        now also carries the other side) until the lease shrinks to what its subtree holds;
        its hosts must not fill it meanwhile."""
        paths = {k for leaf in self.tree.hosts[host].cords for k in self.tree.path(leaf)} \
            if host in self.tree.hosts else set()
        best = math.inf
        for table, loads in zip(self.tables(), table_loads or self.table_loads_w(held_w)):
            for k in paths & loads.keys():
                if loads[k] > self.bound_w(k) + EPS_W:
                    best = min(best, held_w.get(host, 0.0))
            for k in paths:  # (a host is charged only on its cords' paths)
                row = table.get(k)
                if row is not None and host in row:
                    others = loads[k] - row[host] * held_w.get(host, 0.0)
                    best = min(best, (self.bound_w(k) - others) / row[host])
        return best

    def zone(self, host: str) -> Zone:
        """What a raise of ``host`` depends on (module docstring), for its compares."""
        nodes = {k for table in self.tables() for k, row in table.items() if host in row}
        hosts = {h for table in self.tables() for k in nodes for h in table.get(k, {})}
        kids = _children(self.tree)
        marked: set[str] = set()
        todo = list(nodes)
        while todo:
            k = todo.pop()
            if self.tree.nodes[k].delegate:
                marked.add(k)
            todo.extend(kids[k])
        root = next(n for n, nd in self.tree.nodes.items() if nd.parent is None)
        return Zone(frozenset(nodes), frozenset(hosts), frozenset(marked), root in nodes)


def larger_w(table_loads: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each node's larger charge over ``table_loads`` (W; ``Charges.table_loads_w``:
    committed and, with a feed lost, flow; a node dead under the loss: committed only)."""
    out: dict[str, float] = {}
    for loads in table_loads:
        for k, c in loads.items():
            out[k] = max(out.get(k, -math.inf), c)
    return out


@dataclass(frozen=True)
class Zone:
    """``nodes``: where a host's raise moves a charge; ``hosts``: every host charged at
    one of them (their seats, grants and claims); ``delegations``: the delegate-marked
    nodes whose record a raise must see unchanged (created, changed or removed);
    ``reaches_root``: the raise loads the root's charge (no delegation cuts it off: it
    depends on the whole circuit)."""

    nodes: frozenset[str]
    hosts: frozenset[str]
    delegations: frozenset[str]
    reaches_root: bool


def within_bounds(tree: PowerTree, held_w: Mapping[str, float], delegations_w: Mapping[str, float],
                  lost: str | None = None, slack_w: float = EPS_W) -> bool:
    """Whether every node's charge is within its bound (the invariant with delegations)."""
    return not Charges(tree, active(tree, delegations_w), lost).over_w(held_w, slack_w)


def delegation_fits(tree: PowerTree, held_w: Mapping[str, float], delegations_w: Mapping[str, float],
                    node: str, watts: float | None, lost: str | None = None,
                    charged: Sequence[Mapping[str, float]] | None = None) -> bool:
    """Whether setting ``node``'s delegation to ``watts`` (W; None removes it) keeps every
    node within its bound: the check of the parent's transaction (which compares the
    whole circuit). ``node`` must be marked ``delegate`` (else False), ``watts`` within its
    own budget. No rounding slack:
    a lease is itself a bound, and slacks would add up down a chain of them.
    ``charged``: ``Charges.table_loads_w`` at ``held_w`` under ``delegations_w``, where the
    caller has it: a lease resized in place is then checked along its ancestors only
    (``Charges.fits_resized``, the same verdict)."""
    if node not in tree.nodes or not tree.nodes[node].delegate:
        return False
    after = dict(delegations_w)
    if watts is None:
        after.pop(node, None)
    elif not _figure_allowed(tree, node, watts):
        return False
    else:
        after[node] = watts
        live = active(tree, delegations_w)
        if charged and node in live:
            return Charges(tree, live, lost).fits_resized(held_w, charged, node, watts)
    return within_bounds(tree, held_w, after, lost, 0.0)


def _figure_allowed(tree: PowerTree, node: str, watts: float) -> bool:
    """A lease figure is finite, >= 0 and within the node's own budget (above it: watts
    the parent lends that nobody could use)."""
    return math.isfinite(watts) and 0 <= watts <= tree.nodes[node].budget_w


def proposed_w(tree: PowerTree, held_w: Mapping[str, float], wants_w: Mapping[str, float],
               delegations_w: Mapping[str, float], node: str, *, margin_w: float = 0.0,
               lost: str | None = None, fair_w: float | None = None,
               charged: Sequence[Mapping[str, float]] | None = None) -> float:
    """The delegation ``node`` should hold at the next rebalance (W): its subtree's charge
    at ``node`` with every host there holding its seat plus want (``wants_w``, W above
    the seat; and each host's ``held_w`` if more) plus ``margin_w``, or ``fair_w`` where
    given (its figure in the tree's priority division, :func:`fair_leases_w`: what the
    resizes use), within ``node``'s budget and what its ancestors can spare beside the
    others (never below what the subtree holds now: a shrink below that is refused by
    :func:`delegation_fits`). ``charged``: each node's charge at ``held_w`` per table
    (``Charges.table_loads_w`` under ``delegations_w``), where the caller has it (empty
    or None: computed)."""
    live = active(tree, delegations_w)
    # C(node) is the same whether or not node holds a lease (its lease bounds it and is
    # counted above it): the read's own tables serve (one shape, where a table with the
    # node left out would be one more per delegated node in a process's memo).
    inner = Charges(tree, live, lost)
    loads = charged or inner.table_loads_w(held_w)  # (a read's, with none in force: empty)
    # Its figure in the division where given: it counts every delegated node below as
    # leased (a lease below not yet taken would otherwise be left no room under this one).
    if fair_w is None:
        need = {h: max(held_w.get(h, 0.0), held_w.get(h, 0.0) + wants_w.get(h, 0.0)) for h in tree.hosts}
        wish = inner.loads_w(need).get(node, 0.0) + margin_w
    else:
        wish = fair_w
    now = max((c[node] for c in loads if node in c), default=0.0)
    target = min(max(wish, now), tree.nodes[node].budget_w)
    # With the lease at 0 W, each ancestor whose charge counts it (the node in its top)
    # has that charge grow by exactly the lease: the most it may be is the least room.
    # (Per table: where the node is dead under the lost feed, the flow does not count it.)
    # Held already, the node counts max(D, C(node)) there, so the room at 0 W is this
    # read's room plus that; not held, its hosts count there as residuals instead: the
    # charges with a 0 W lease are computed.
    if node in live:
        spare = min((inner.bound_w(a) - c[a] + max(live[node], c[node])
                     for table, c in zip(inner.tables(), loads)
                     for a in tree.path(node)[1:] if a in table and node in inner.counted(table, a)), default=math.inf)
    else:
        at_zero = Charges(tree, {**live, node: 0.0}, lost)
        # (At 0 W the node counts its own charge there, the larger: that is added back.)
        spare = min((at_zero.bound_w(a) - c[a] + c[node]
                     for table, c in zip(at_zero.tables(), at_zero.table_loads_w(held_w))
                     for a in tree.path(node)[1:] if a in table and node in at_zero.counted(table, a)),
                    default=math.inf)
    best = max(now, min(target, spare))
    # (A lease held: checked along its ancestors from these charges, as delegation_fits would.)
    fits = partial(inner.fits_resized, held_w, loads, node) if node in live and loads else \
        partial(delegation_fits, tree, held_w, delegations_w, node, lost=lost, charged=loads)
    if best <= now or fits(best):
        return best
    if not fits(now):
        return now  # a node over already (a feed lost): no figure above fits either
    # Float residue: the largest figure the check accepts.
    lo, hi = now, best
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


MARGIN_KEY = "\x00margin:"  # a lease's margin in the division: not a host's name (names are checked)


def charged_tables(tree: PowerTree, lost: str | None = None,
                   margins: frozenset[str] = frozenset()) -> tuple[dict[object, dict[str, float]], dict[str, dict[str, float]]]:
    """The charged coefficients (module docstring) with every delegate-marked node
    leased: the bounds to divide over (``(table, node)`` -> host -> ``chat``; a flow
    table's node only where it asks more than committed, as ``core.tree.divide``), and
    each marked node's lease coefficients (host -> ``chat(h, m)``). Each node in
    ``margins`` has its margin as one more entry (``MARGIN_KEY + node``, 1 at the node).
    Computed once per tree shape, feed lost and margins (the tree's memo)."""
    key = ("charged", lost, margins)
    memo = tree._memo.get(key)
    if memo is None:
        memo = _charged_tables(tree, lost, margins)
        tree._memo[key] = memo
    return memo  # type: ignore[return-value]


def _charged_tables(tree: PowerTree, lost: str | None,
                    margins: frozenset[str]) -> tuple[dict[object, dict[str, float]], dict[str, dict[str, float]]]:
    marked = {n for n, nd in tree.nodes.items() if nd.delegate and nd.parent is not None}
    charges = Charges(tree, dict.fromkeys(marked, 0.0), lost)
    tables = [{k: dict(row) for k, row in table.items()} for table in charges.tables()]
    for m in margins & marked:
        for table in tables:
            if m in table:
                table[m][MARGIN_KEY + m] = 1.0
    depth = {n: len(tree.path(n)) for n in tree.nodes}
    lease: dict[str, dict[str, float]] = {}
    out: list[dict[str, dict[str, float]]] = [{} for _ in tables]
    for k in sorted(tree.nodes, key=lambda n: -depth[n]):  # the leaves first: top(k) done before k
        for table, done in zip(tables, out):
            if k not in table:
                continue
            row = dict(table[k])
            for m in charges.counted(table, k):
                for h, c in lease.get(m, {}).items():
                    row[h] = row.get(h, 0.0) + c
            done[k] = row
        if k in marked:
            whole: dict[str, float] = {}
            for done in out:
                for h, c in done.get(k, {}).items():
                    whole[h] = max(whole.get(h, 0.0), c)
            lease[k] = whole
    bounds: dict[object, dict[str, float]] = {("c", k): row for k, row in out[0].items()}
    for k, row in (out[1].items() if len(out) > 1 else ()):
        if any(c > out[0].get(k, {}).get(h, 0.0) + EPS_W for h, c in row.items()):
            bounds[("f", k)] = row
    return bounds, lease


def divide_charged(tree: PowerTree, wants_w: Mapping[str, float], lost: str | None = None,
                   margins_w: Mapping[str, float] | None = None) -> dict[str, float]:
    """The tree's division (``core.tree.divide``: ``tree``'s reserves, then ``wants_w``,
    W in all per host) over the charged coefficients with every delegate-marked node
    leased (module docstring), then each node's margin in ``margins_w`` (W) after every
    class. W per host, and per ``MARGIN_KEY + node``."""
    margins = {m: w for m, w in (margins_w or {}).items() if m in tree.nodes and tree.nodes[m].delegate}
    bounds, _ = charged_tables(tree, lost, frozenset(margins))
    # A few EPS_W short of each budget: where the division fills a parent exactly, a
    # lease held at its subtree's seats (a hair above its figure) still fits beside the
    # siblings' figures, whatever the float residue.
    room: dict[object, float] = {b: tree.nodes[b[1]].budget_w - 4 * EPS_W for b in bounds}  # type: ignore[index]
    return divide_over(tree, dict(bounds), room, wants_w, {MARGIN_KEY + m: w for m, w in margins.items()})


def fair_leases_w(tree: PowerTree, seats_w: Mapping[str, float], wants_w: Mapping[str, float],
                  margins_w: Mapping[str, float], lost: str | None = None) -> dict[str, float]:
    """Each delegate-marked node's lease under the tree's priority division (module
    docstring; W): its hosts' share of the division of each host's seat (``seats_w``,
    its reserve there) plus want (``wants_w``, W above the seat), counted as the lease
    counts them, plus the margin (``margins_w``, W) the room left after every class
    allows; within the node's budget. What a periodic resize moves a lease to (as far
    as its subtree's holdings and the ancestors allow: :func:`proposed_w`)."""
    totals = {h: seats_w.get(h, 0.0) + wants_w.get(h, 0.0) for h in tree.hosts}
    alloc = divide_charged(tree.with_reserves(seats_w), totals, lost, margins_w)
    margins = frozenset(m for m in margins_w if m in tree.nodes and tree.nodes[m].delegate)
    _, lease = charged_tables(tree, lost, margins)
    figures = {m: min(tree.nodes[m].budget_w, sum(c * alloc.get(h, 0.0) for h, c in row.items()))
               for m, row in lease.items()}
    return _nested_fit(tree, figures, alloc, lost)


# What a lease over other leases is allowed above its charge as its own check counts it,
# relative (a few thousand float roundings of the sums; far inside the EPS_W the division
# leaves at every bound).
RESIDUE = 1e-12


def _nested_fit(tree: PowerTree, figures: dict[str, float], alloc_w: Mapping[str, float],
                lost: str | None) -> dict[str, float]:
    """``figures`` with each lease that has leases below it raised to its charge as its
    transaction's check counts it (W): its children at their figures (``max(D, C)``)
    and its own hosts at ``alloc_w``, plus :data:`RESIDUE`, within its budget. A
    parent's figure summed over its hosts and its children's figures summed at its
    check differ by float residue; without this, children at their figures can exceed
    their parent's figure by an ulp, and the check (no slack) refuses the last of them
    for good. Leaves first, one pass per level of nesting."""
    charges = Charges(tree, figures, lost)
    level: dict[str, int] = {}
    for m in sorted(figures, key=lambda n: -len(tree.path(n))):
        level[m] = 1 + max((level[t] for t in charges.top[m]), default=-1) if charges.top[m] else 0
    for depth in range(1, max(level.values(), default=0) + 1):
        loads = Charges(tree, figures, lost).loads_w(alloc_w)
        for m in (n for n, d in level.items() if d == depth):
            counted = loads.get(m, 0.0)
            figures[m] = min(tree.nodes[m].budget_w, max(figures[m], counted + abs(counted) * RESIDUE))
    return figures


# etcd allows 128 operations in a transaction by default; past this many a raise compares
# the circuit's whole ranges instead (safe: a superset, it only conflicts more).
MAX_ZONE_COMPARES = 96


@dataclass(frozen=True)
class RaiseCompares:
    """What a raise's transaction compares. ``whole``: every key range of the circuit
    (seats, grants, claims, delegations: no newer than the read), as without delegation.
    Else each of ``hosts``' seat, grant and claim no newer than the read, and each of
    ``delegations``' record at exactly the mod revision read (0: absent), so one
    created, changed or removed since fails it. Both also compare the spec, the tree and
    the feed marks, as every raise does."""

    whole: bool
    hosts: frozenset[str] = frozenset()
    delegations: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LeaseCompares:
    """What a transaction changing a node's delegation compares (module docstring): the
    spec, the tree, the feed marks and the whole seat and claim ranges (no newer than the
    read), each of ``hosts``' grant (no newer than the read) and each of ``delegations``'
    record at exactly the mod revision read (0: absent); ``delegations`` None: the whole
    delegation range (no newer than the read). ``whole``: every grant and delegation too
    (too many keys for one transaction)."""

    whole: bool
    hosts: frozenset[str] = frozenset()
    delegations: frozenset[str] | None = None


def leased_above(tree: PowerTree, live: Mapping[str, float]) -> dict[str, str | None]:
    """node -> its nearest strict ancestor holding a lease in ``live`` (None: none). O(nodes)."""
    out: dict[str, str | None] = {}
    kids = _children(tree)
    todo: list[tuple[str, str | None]] = [(n, None) for n, nd in tree.nodes.items() if nd.parent is None]
    while todo:
        n, above = todo.pop()
        out[n] = above
        todo.extend((k, n if n in live else above) for k in kids[n])
    return out


def lease_compares(charges: Charges, node: str, to_w: float | None = None) -> LeaseCompares:
    """The compares of a change to ``node``'s delegation under ``charges`` (the read's
    delegations in force; module docstring): with ``p`` the nearest ancestor holding a
    lease, the hosts charged outside any lease from ``node`` up to ``p`` (to the root
    where there is none), and ``node``, ``p`` and the delegate-marked nodes whose nearest
    leased ancestor is ``p`` (beside ``node``) or ``node`` (below it: its own check
    counts them).

    ``to_w`` (W), where ``node`` holds a lease in ``charges``, narrows that to what the
    move can break. A **growth** can break only the nodes above ``node`` (up to ``p``):
    the hosts charged at ``node`` and the leases below it are left out, as a sibling
    lease's hosts are, since each of their raises and growths compares ``node``'s lease:
    checked against the old figure (it landed first) or failing and reading the new one,
    ``C(node)`` stays within the smaller. A **shrink** lowers every charge above
    ``node``: only ``node``'s own bound can break, so only the hosts charged at ``node``
    and the leases below it are compared. (A raise under a lease is the very thing its
    growth is asked for: comparing its hosts failed growths on a busy subtree.) A lease
    created compares everything: no raise under it compared one."""
    tree = charges.tree
    above = leased_above(tree, charges.live)
    parent = above[node]
    path = tree.path(node)
    if parent is not None:
        path = path[:path.index(parent) + 1]
    current = charges.live.get(node)
    grow = current is not None and to_w is not None and to_w >= current
    shrink = current is not None and to_w is not None and to_w < current
    if grow:
        path = path[1:]
    elif shrink:
        path = path[:1]
    hosts = {h for table in charges.tables() for a in path for h in table.get(a, {})}
    near = (parent,) if grow else (node,) if shrink else (parent, node)
    scope = {m for m, nd in tree.nodes.items() if nd.delegate and above[m] in near} | {node}
    if parent is not None and not shrink:
        scope.add(parent)
    if len(hosts) + 8 > MAX_ZONE_COMPARES:
        return LeaseCompares(True)
    if len(hosts) + len(scope) + 8 > MAX_ZONE_COMPARES:
        return LeaseCompares(False, frozenset(hosts))
    return LeaseCompares(False, frozenset(hosts), frozenset(scope))


def raise_compares(charges: Charges, host: str) -> RaiseCompares:
    """The compares a raise of ``host`` needs under ``charges`` (its :meth:`Charges.zone`;
    the whole circuit where the zone reaches the root or would not fit a transaction)."""
    zone = charges.zone(host)
    if zone.reaches_root or 3 * len(zone.hosts) + len(zone.delegations) + 6 > MAX_ZONE_COMPARES:
        return RaiseCompares(True)
    return RaiseCompares(False, zone.hosts, zone.delegations)
