"""Delegated subtrees: a lease of watts from a parent, so a subtree grants on its own (pure).

A node marked ``delegate`` in the tree file may hold a *delegation* ``D(m)`` (wall W): the
most its subtree may commit at ``m``. While one is stored, ``m``'s ancestors count ``D(m)``
in place of the hosts below ``m``, so a host under ``m`` that raises checks only the nodes
from its cords up to ``m`` (and ``D(m)``), and its transaction compares only the keys
those nodes depend on: raises under different delegated nodes never conflict.

*Charged load* at node ``k`` (what its bound is checked against)::

    C(k) = sum over m in top(k) of D(m)  +  sum over hosts h of resid(h, k) x held(h)
    resid(h, k) = max(0, coef(h, k) - sum over m in top(k) of coef(h, m))

with ``top(k)`` the delegated nodes strictly below ``k`` with no delegated node between,
``coef`` the tree's committed coefficients (``core.tree``: failover counted) and ``held``
each host's seat (or pending reserve) plus grant. Every node keeps
``C(k) <= bound(k) = min(budget(k), D(k))`` (``D(k)`` only where ``k`` holds one).

Why that bounds the true committed load ``L(k) = sum coef(h, k) x held(h)`` everywhere:
``coef`` is subadditive over disjoint subtrees (a redundant host counts 1 at a node and
at least 1 over the subtrees holding its cords; an oversubscribed one
``min(1, s1 + s2) <= min(1, s1) + min(1, s2)``), so ``L(k) <= sum over top(k) of L(m) +
sum resid(h, k) x held(h)``; and ``L(m) <= C(m) <= D(m)`` by induction from the leaves.
With a feed lost, the same with the flow coefficients (additive), and each node's bound
holds for the larger of the two charges (as ``CircuitView.node_loads_w``).

Removing a delegation never raises any ancestor's charge (``D(m)`` is replaced by what it
bounded, ``C(m) <= D(m)``); creating or changing one is a transaction over the whole
circuit that checks every node (:func:`over_w`).

What a raise of host ``h`` depends on (:func:`zone`): the nodes ``R(h)`` where
``resid(h, k) > 0`` (its charge moves only there), the hosts charged at any of them,
and the delegation of every delegate-marked node in ``R(h)`` or below one (one created,
changed or removed there changes a charge in ``R(h)`` or its bound). A raise whose
compares cover exactly that keeps every bound.

Pure: no I/O. Figures in wall W.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from powerbudgetd.core.tree import EPS_W, PowerTree


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
    for m in live:
        at = tree.nodes[m].parent
        while at is not None:
            out[at].append(m)
            if at in live:
                break
            at = tree.nodes[at].parent
    return out


@dataclass(frozen=True)
class Charges:
    """The charge tables of one tree and one set of live delegations: ``resid[k][h]``
    (committed, and under ``lost`` the flow's too), ``top[k]`` and the bound of each node."""

    tree: PowerTree
    live: Mapping[str, float]
    lost: str | None = None
    top: dict[str, list[str]] = field(init=False, repr=False, compare=False)
    _tables: list[dict[str, dict[str, float]]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "top", tops(self.tree, self.live))
        object.__setattr__(self, "_tables", [self._resid(False)] + ([self._resid(True)] if self.lost is not None else []))

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

    def bound_w(self, node: str) -> float:
        budget = self.tree.nodes[node].budget_w
        return min(budget, self.live[node]) if node in self.live else budget

    def loads_w(self, held_w: Mapping[str, float]) -> dict[str, float]:
        """Each node's charge ``C(k)`` (W): the larger of committed and, with a feed lost,
        flow (a node dead under the loss: committed only)."""
        top = self.top
        out: dict[str, float] = {}
        for table in self.tables():
            for k, row in table.items():
                c = sum(self.live[m] for m in top[k]) + sum(r * held_w.get(h, 0.0) for h, r in row.items())
                out[k] = max(out.get(k, -math.inf), c)
        return out

    def over_w(self, held_w: Mapping[str, float], slack_w: float = EPS_W) -> dict[str, float]:
        """The nodes whose charge exceeds their bound by more than ``slack_w``, and by how
        much (W)."""
        return {k: c - self.bound_w(k) for k, c in self.loads_w(held_w).items() if c > self.bound_w(k) + slack_w}

    def room_for_w(self, host: str, held_w: Mapping[str, float]) -> float:
        """The most ``host`` may hold in all (W, seat + grant) beside the others' ``held_w``
        so every node where it is charged stays within its bound (inf: charged nowhere)."""
        top = self.top
        best = math.inf
        for table in self.tables():
            for k, row in table.items():
                if host in row:
                    others = sum(self.live[m] for m in top[k]) + sum(
                        r * held_w.get(h, 0.0) for h, r in row.items() if h != host)
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
                    node: str, watts: float | None, lost: str | None = None) -> bool:
    """Whether setting ``node``'s delegation to ``watts`` (W; None removes it) keeps every
    node within its bound: the check of the parent's transaction (which compares the
    whole circuit). ``node`` must be marked ``delegate`` (else False), ``watts`` within its
    own budget. No rounding slack:
    a lease is itself a bound, and slacks would add up down a chain of them."""
    if node not in tree.nodes or not tree.nodes[node].delegate:
        return False
    after = dict(delegations_w)
    if watts is None:
        after.pop(node, None)
    elif not (math.isfinite(watts) and 0 <= watts <= tree.nodes[node].budget_w):
        return False  # above its own budget: watts the parent lends that nobody could use
    else:
        after[node] = watts
    return within_bounds(tree, held_w, after, lost, 0.0)


def proposed_w(tree: PowerTree, held_w: Mapping[str, float], wants_w: Mapping[str, float],
               delegations_w: Mapping[str, float], node: str, *, margin_w: float = 0.0,
               lost: str | None = None) -> float:
    """The delegation ``node`` should hold at the next rebalance (W): its subtree's charge
    at ``node`` with every host there holding its seat plus want (``wants_w``, W above
    the seat; and each host's ``held_w`` if more) plus ``margin_w``, within ``node``'s
    budget and what its ancestors can spare beside the others (never below what the
    subtree holds now: a shrink below that is refused by :func:`delegation_fits`)."""
    live = active(tree, delegations_w)
    live.pop(node, None)
    need = {h: max(held_w.get(h, 0.0), held_w.get(h, 0.0) + wants_w.get(h, 0.0)) for h in tree.hosts}
    inner = Charges(tree, live, lost)
    wish = inner.loads_w(need).get(node, 0.0) + margin_w
    now = inner.loads_w(held_w).get(node, 0.0)
    target = min(max(wish, now), tree.nodes[node].budget_w)
    # With the lease at 0 W, each ancestor whose charge counts it (the node in its top)
    # has that charge grow by exactly the lease: the most it may be is the least room.
    at_zero = Charges(tree, {**live, node: 0.0}, lost)
    loads = at_zero.loads_w(held_w)
    spare = min((at_zero.bound_w(a) - loads[a] for a in at_zero.top if node in at_zero.top[a]), default=math.inf)
    best = max(now, min(target, spare))
    if best <= now or delegation_fits(tree, held_w, delegations_w, node, best, lost):
        return best
    # Float residue (or an ancestor over already): the largest figure the check accepts.
    lo, hi = now, best
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delegation_fits(tree, held_w, delegations_w, node, mid, lost) else (lo, mid)
    return lo


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


def raise_compares(charges: Charges, host: str) -> RaiseCompares:
    """The compares a raise of ``host`` needs under ``charges`` (its :meth:`Charges.zone`;
    the whole circuit where the zone reaches the root or would not fit a transaction)."""
    zone = charges.zone(host)
    if zone.reaches_root or 3 * len(zone.hosts) + len(zone.delegations) + 6 > MAX_ZONE_COMPARES:
        return RaiseCompares(True)
    return RaiseCompares(False, zone.hosts, zone.delegations)
