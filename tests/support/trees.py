"""Random power trees for property tests (``core.tree``, the circuit's view of one)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from powerbudgetd.core.circuit import CircuitView
from powerbudgetd.core.tree import Host, Node, Pair, PowerTree


@st.composite
def trees(draw, mode=None):
    """A random tree (a root, 1-10 more nodes each under an earlier one), 1-8 hosts on
    one or two distinct leaves, random budgets, seats, classes and pair modes."""
    n = draw(st.integers(2, 11))
    parents = [None] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    nodes = {f"n{i}": Node(f"n{i}", draw(st.floats(0, 20000)), None if p is None else f"n{p}") for i, p in enumerate(parents)}
    leaves = sorted(set(nodes) - {nd.parent for nd in nodes.values()})
    hosts = {}
    for i in range(draw(st.integers(1, 8))):
        if len(leaves) > 1 and draw(st.booleans()):
            a, b = draw(st.lists(st.sampled_from(leaves), min_size=2, max_size=2, unique=True))
            share = draw(st.floats(0.1, 0.9))
            cords = {a: share, b: 1 - share}
        else:
            cords = {draw(st.sampled_from(leaves)): 1.0}
        hosts[f"h{i}"] = Host(f"h{i}", cords, draw(st.floats(0, 3000)), draw(st.integers(0, 2)))
    tree = PowerTree(nodes, hosts)
    pairs = {tree.pair_of(h) for h in hosts} - {None}
    chosen = {p: Pair(p, mode or draw(st.sampled_from(["redundant", "oversubscribed"])), None) for p in pairs if p}
    tree = PowerTree(nodes, hosts, {p: Pair(p, c.mode, 2.0 if c.mode == "oversubscribed" else None) for p, c in chosen.items()})
    wants = {h: draw(st.floats(0, 6000)) for h in hosts}
    return tree, wants


def seated_in_order(tree: PowerTree, order: list[str]) -> CircuitView:
    """The circuit's view once the hosts of ``tree`` have taken their seats in ``order``,
    each only where the view as it stands lets it (as the store's transaction guards a
    seat); asserts every node within its budget after each seat."""
    root = next(n for n in tree.nodes.values() if n.parent is None)
    v = CircuitView(root.budget_w, tree=tree.with_reserves({}))
    for host in order:
        reserve = tree.hosts[host].reserve_w
        if v.seat_fits(reserve, host):
            seats = {**v.seats, host: reserve}
            v = replace(v, seats=seats, tree=tree.with_reserves(seats))
            assert v.holds(), v.nodes_over_w()
    return v
