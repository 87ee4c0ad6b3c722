"""Redundant means failover-invariant: on a redundant pair the normal division is the one
that holds with either feed lost, so a loss moves no grant."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from powerbudgetd.core.circuit import CircuitView, GrantPolicy
from powerbudgetd.core.tree import Host, Node, PowerTree, divide
from support.examples import examples
from support.trees import trees


def untouched_by(tree: PowerTree, feed: str) -> bool:
    """No oversubscribed host's flow changes when ``feed`` is lost (its cords all live)."""
    dead = {n for n in tree.nodes if feed in tree.path(n)}
    return not any(tree.mode_of(h) == "oversubscribed" and dead & set(host.cords) for h, host in tree.hosts.items())


@settings(max_examples=examples(400), deadline=None)
@given(trees())
def test_a_feed_lost_on_redundant_pairs_moves_no_live_hosts_share(case):
    tree, wants = case
    normal = divide(tree, wants)
    for feed in tree.feeds():
        if not untouched_by(tree, feed):
            continue
        live = {h for hs in tree.coefficients(feed).values() for h in hs}
        after = divide(tree, wants, lost=feed)
        for h in live:
            assert after[h] == pytest.approx(normal[h], abs=1e-6), (feed, h)
        assert not tree.over_w(after, feed) and not tree.over_w(after)


@settings(max_examples=examples(300), deadline=None)
@given(trees(mode="redundant"))
def test_hosts_holding_the_normal_division_are_not_lowered_when_either_feed_is_lost(case):
    """Each host holding its fair grant before the loss: after it, with the feed marked
    lost in the records, its target is the grant it holds."""
    tree, wants = case
    seats = {h: host.reserve_w for h, host in tree.hosts.items()}
    normal = divide(tree, {h: seats[h] + w for h, w in wants.items()})
    grants = {h: max(0.0, normal[h] - seats[h]) for h in tree.hosts}
    for feed in tree.feeds():
        view = CircuitView(1e9, seats, grants, wants, tree=tree, lost=feed)
        live = {h for hs in tree.coefficients(feed).values() for h in hs}
        for h in live:
            assert GrantPolicy(step_w=20.0).target_w(view, h, grants[h], 0.0) >= grants[h] - 1e-6, (feed, h)


def test_the_tighter_side_lost_lowers_nobody():
    """A redundant pair, side A the tighter: two dual-corded hosts held by A, two
    single-corded hosts on B beside them. Losing A (or B) moves nothing."""
    nodes = {"site": Node("site", 10_000), "A": Node("A", 300, "site"), "B": Node("B", 1200, "site"),
             "a": Node("a", 300, "A"), "b": Node("b", 1200, "B")}
    hosts = {"r1": Host("r1", {"a": 0.5, "b": 0.5}), "r2": Host("r2", {"a": 0.5, "b": 0.5}),
             "s1": Host("s1", {"b": 1.0}), "s2": Host("s2", {"b": 1.0})}
    tree = PowerTree(nodes, hosts)
    wants = dict.fromkeys(hosts, 1000.0)
    normal = divide(tree, wants)
    assert normal == pytest.approx({"r1": 150.0, "r2": 150.0, "s1": 450.0, "s2": 450.0})
    assert divide(tree, wants, lost="A") == pytest.approx(normal)
    assert divide(tree, wants, lost="B") == pytest.approx(normal)  # s1, s2 down: their shares still held where committed
