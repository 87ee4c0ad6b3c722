"""A power tree's checks are linear and bounded: limits on nodes, hosts, depth and name
length, each cycle reported once, the node loads as the definition says on any tree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from powerbudgetd.core.tree import MAX_DEPTH, MAX_HOSTS, MAX_NAME, MAX_NODES, Host, Node, PowerTree
from support.examples import examples
from support.trees import trees


def chain(depth: int) -> PowerTree:
    nodes = {f"n{i}": Node(f"n{i}", 1e5, None if i == 0 else f"n{i - 1}") for i in range(depth)}
    return PowerTree(nodes, {"h": Host("h", {f"n{depth - 1}": 1.0}, 500.0)})


def problems(nodes: dict[str, Node], hosts: dict[str, Host]) -> list[str]:
    with pytest.raises(ValueError) as exc:
        PowerTree(nodes, hosts)
    return str(exc.value).split("; ")


def test_a_tree_as_deep_as_the_limit_loads():
    assert len(chain(MAX_DEPTH).path(f"n{MAX_DEPTH - 1}")) == MAX_DEPTH


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 3000])
def test_a_tree_deeper_than_the_limit_is_refused_on_one_line(depth):
    nodes = {f"n{i}": Node(f"n{i}", 1e5, None if i == 0 else f"n{i - 1}") for i in range(depth)}
    assert problems(nodes, {"h": Host("h", {f"n{depth - 1}": 1.0}, 500.0)}) == [
        f"nodes.n{depth - 1}: {depth} levels from the root, more than {MAX_DEPTH}"]


def test_too_many_nodes_or_hosts_or_a_long_name_is_refused_before_any_walk():
    many = {f"n{i}": Node(f"n{i}", 1.0, "n0" if i else None) for i in range(MAX_NODES + 1)}
    assert problems(many, {}) == [f"nodes: {MAX_NODES + 1} nodes, more than {MAX_NODES}"]
    root = {"r": Node("r", 1e6)}
    hosts = {f"h{i}": Host(f"h{i}", {"r": 1.0}) for i in range(MAX_HOSTS + 1)}
    assert problems(root, hosts) == [f"hosts: {MAX_HOSTS + 1} hosts, more than {MAX_HOSTS}"]
    long = "p" * (MAX_NAME + 1)
    assert problems({"r": Node("r", 1.0), long: Node(long, 1.0, "r")}, {}) == [
        f"nodes.{'p' * MAX_NAME}...: a name longer than {MAX_NAME} characters ({MAX_NAME + 1})"]


def test_a_cycle_is_reported_once_and_the_nodes_below_it_are_not_cycles():
    nodes = {"r": Node("r", 1e3), "e": Node("e", 10, "r"), "a": Node("a", 10, "b"), "b": Node("b", 10, "a"),
             "c": Node("c", 10, "a"), "d": Node("d", 10, "c")}
    assert problems(nodes, {"h": Host("h", {"e": 1.0})}) == ["nodes.a.parent: a cycle (a -> b -> a)"]


def test_a_missing_parent_is_named_once_and_nothing_below_it_is_blamed():
    nodes = {"r": Node("r", 1e3), "a": Node("a", 10, "gone"), "b": Node("b", 10, "a")}
    assert problems(nodes, {}) == ["nodes.a.parent: no node 'gone'"]


@settings(max_examples=examples(300), deadline=None)
@given(trees())
def test_the_coefficients_are_the_definitions_on_any_tree(case):
    """What each node carries of each host, committed and under each feed loss, as the
    module's definition states it, computed the slow way here."""
    tree, _ = case
    for lost in [None, *tree.feeds()]:
        dead = set() if lost is None else {n for n in tree.nodes if lost in tree.path(n)}
        want: dict[str, dict[str, float]] = {n: {} for n in tree.nodes if n not in dead}
        for h, host in tree.hosts.items():
            live = {leaf: s for leaf, s in host.cords.items() if leaf not in dead}
            whole = lost is None and tree.mode_of(h) == "redundant"
            for node in want:
                under = sum(s for leaf, s in live.items() if node in tree.path(leaf))
                if under > 0:
                    want[node][h] = 1.0 if whole else min(1.0, under / sum(live.values()))
        got = tree.coefficients(lost)
        assert got.keys() == want.keys()
        for node in want:
            assert got[node] == pytest.approx(want[node])


def test_a_copy_with_other_reserves_is_not_checked_again_and_shares_its_coefficients():
    tree = chain(5)
    tree.coefficients()
    seated = tree.with_reserves({"h": 700.0})
    assert seated.hosts["h"].reserve_w == 700.0
    assert seated.coefficients() is tree.coefficients()
