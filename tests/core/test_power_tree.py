"""The power tree's pure arithmetic: every node within its budget (committed, and under
each feed loss), failover counted in redundant mode, the largest grant, priorities."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.core.fair import max_min_fair
from powerbudgetd.core.tree import Host, Node, Pair, PowerTree, divide
from support.examples import examples
from support.trees import trees

EPS = 1e-6


def seat(tree: PowerTree, wants: dict[str, float], host: str) -> float:
    """What a host's seat guarantees it: min(want, reserve), with a milliwatt of slack."""
    return min(wants[host], tree.hosts[host].reserve_w) + 1e-3


def _fits(tree: PowerTree, draw_w: dict[str, float], lost: str | None = None) -> bool:
    return not tree.over_w(draw_w, lost)


@settings(max_examples=examples(400), deadline=None)
@given(trees())
def test_every_node_within_its_budget_normally_and_with_each_feed_lost(case):
    tree, wants = case
    alloc = divide(tree, wants)
    assert _fits(tree, alloc), tree.over_w(alloc)
    for host, got in alloc.items():
        assert -EPS <= got <= wants[host] + EPS
    for feed in tree.feeds():
        shed = divide(tree, wants, lost=feed)
        assert _fits(tree, shed, lost=feed), (feed, tree.over_w(shed, feed))


@settings(max_examples=examples(400), deadline=None)
@given(trees(mode="redundant"))
def test_redundant_grants_survive_any_feed_loss_without_shedding(case):
    """Redundant: what fits committed (each cord carrying its whole host) fits the flow
    after any one feed is lost, every host's draw on its surviving cord, unchanged."""
    tree, wants = case
    alloc = divide(tree, wants)
    for feed in tree.feeds():
        assert _fits(tree, alloc, lost=feed), (feed, tree.over_w(alloc, feed))


@settings(max_examples=examples(400), deadline=None)
@given(trees())
def test_a_host_short_of_its_want_is_held_by_a_full_node_that_lower_classes_do_not_share_above_their_seats(case):
    """Priorities: a host below min(want, reserve) sits under a node full of seats alone
    (no host there above its seat, no lower class holding anything); a host below its
    want, under a full node where every lower class holds at most its seat. So nothing
    is left on the table either: a short host always has a full node on its paths."""
    tree, wants = case
    for lost in [None, *tree.feeds()]:
        alloc = divide(tree, wants, lost)
        # The bounds: every node committed, and with a feed lost each live node's flow.
        loads = {n: w for n, w in tree.loads_w(alloc).items()}
        coefficients = dict(tree.coefficients())
        budget = {n: tree.nodes[n].budget_w for n in tree.nodes}
        if lost is not None:
            for n, w in tree.loads_w(alloc, lost).items():
                loads[n + "/flow"], coefficients[n + "/flow"], budget[n + "/flow"] = w, tree.coefficients(lost)[n], budget[n]
        for h, got in alloc.items():
            host = tree.hosts[h]
            full = [n for n, hs in coefficients.items() if h in hs and loads[n] >= budget[n] - 1e-3]
            lower = {n: [g for g in coefficients[n] if tree.hosts[g].priority < host.priority] for n in full}
            if got < min(wants[h], host.reserve_w) - 1e-3:
                # Full of seats alone: no host there above its seat, no lower class at all.
                assert any(all(alloc[g] <= seat(tree, wants, g) for g in coefficients[n]) and all(alloc[g] <= 1e-3 for g in lower[n])
                           for n in full), (h, lost, alloc)
            elif got < wants[h] - 1e-3:
                assert any(all(alloc[g] <= seat(tree, wants, g) for g in lower[n]) for n in full), (h, lost, alloc)


@settings(max_examples=examples(300), deadline=None)
@given(trees(), st.data())
def test_the_largest_grant_fits_every_ancestor_and_one_watt_more_does_not(case, data):
    tree, wants = case
    held = divide(tree, wants)
    h = data.draw(st.sampled_from(sorted(tree.hosts)))
    host = tree.hosts[h]
    if not _fits(tree, {**held, h: host.reserve_w}):
        assert tree.largest_grant_w(h, held) == 0
        return
    grant = tree.largest_grant_w(h, held)
    assert grant >= 0
    assert _fits(tree, {**held, h: host.reserve_w + grant})
    assert not _fits(tree, {**held, h: host.reserve_w + grant + 1.0})


def _row(mode: str) -> PowerTree:
    """A site with feeds A and B, one rack's PDU under each, three dual-corded hosts."""
    nodes = {"site": Node("site", 10_000), "a": Node("a", 6000, "site"), "b": Node("b", 6000, "site"),
             "pdu-a": Node("pdu-a", 3000, "a"), "pdu-b": Node("pdu-b", 3000, "b")}
    hosts = {"serve": Host("serve", {"pdu-a": 0.5, "pdu-b": 0.5}, 1000, priority=2),
             "batch1": Host("batch1", {"pdu-a": 0.5, "pdu-b": 0.5}, 500, priority=0),
             "batch2": Host("batch2", {"pdu-a": 0.5, "pdu-b": 0.5}, 500, priority=0)}
    pair = frozenset({"a", "b"})
    return PowerTree(nodes, hosts, {pair: Pair(pair, mode, 2.0 if mode == "oversubscribed" else None)})


def test_a_short_node_lowers_the_low_class_first_and_the_high_class_keeps_its_demand():
    tree = _row("redundant")
    wants = {"serve": 1500.0, "batch1": 1500.0, "batch2": 1500.0}  # 4500 W wanted on a 3000 W PDU
    alloc = divide(tree, wants)
    assert alloc["serve"] == pytest.approx(1500)  # keeps its whole demand
    assert alloc["batch1"] == pytest.approx(750) and alloc["batch2"] == pytest.approx(750)  # lowered, evenly
    assert tree.loads_w(alloc)["pdu-a"] == pytest.approx(3000)


def test_the_high_class_is_never_lowered_below_its_seat_to_feed_a_lower_one():
    """Oversubscribed: normally each PDU carries half of each host; feed A lost, PDU B
    carries all of them and is short even of the seats: the batch hosts go below their
    seats, the serving host keeps its own."""
    tree = _row("oversubscribed")
    wants = {"serve": 3000.0, "batch1": 3000.0, "batch2": 3000.0}
    normal = divide(tree, wants)
    assert tree.loads_w(normal)["pdu-b"] == pytest.approx(3000)
    assert normal["serve"] == pytest.approx(3000)  # the high class takes the pool first
    small = PowerTree({**tree.nodes, "pdu-b": Node("pdu-b", 1200, "b")}, tree.hosts, tree.pairs)
    shed = divide(small, wants, lost="a")
    assert shed["serve"] == pytest.approx(1000)  # its seat, whole
    assert shed["batch1"] + shed["batch2"] == pytest.approx(200)  # the rest; below their 500 W seats
    assert shed["batch1"] == pytest.approx(shed["batch2"])


def test_redundant_counts_each_host_whole_on_each_cord_oversubscribed_its_share():
    red, over = _row("redundant"), _row("oversubscribed")
    draw = {"serve": 1000.0, "batch1": 600.0, "batch2": 400.0}
    assert red.loads_w(draw) == {"site": 2000, "a": 2000, "b": 2000, "pdu-a": 2000, "pdu-b": 2000}
    assert over.loads_w(draw) == {"site": 2000, "a": 1000, "b": 1000, "pdu-a": 1000, "pdu-b": 1000}
    # Feed A lost: everything on B, nothing under A.
    assert over.loads_w(draw, lost="a") == {"site": 2000, "b": 2000, "pdu-b": 2000}
    assert red.largest_grant_w("batch2", draw) == pytest.approx(3000 - 1600 - 500)
    assert over.largest_grant_w("batch2", draw) == pytest.approx((3000 - 800) / 0.5 - 500)


def test_a_single_corded_host_on_a_lost_feed_is_down_and_the_redundant_host_beside_it_does_not_move():
    """The host on the lost feed draws nothing (no flow through any node); its share
    stays where committed (its records hold it), so the redundant host keeps its own."""
    nodes = {"s": Node("s", 5000), "a": Node("a", 3000, "s"), "b": Node("b", 3000, "s")}
    hosts = {"dual": Host("dual", {"a": 0.5, "b": 0.5}, 100), "only-a": Host("only-a", {"a": 1.0}, 100)}
    tree = PowerTree(nodes, hosts)
    assert tree.feeds() == ["a", "b"]
    wants = {"dual": 4000.0, "only-a": 4000.0}
    after = divide(tree, wants, lost="a")
    assert after == divide(tree, wants) == {"dual": 1500.0, "only-a": 1500.0}
    assert tree.loads_w(after, "a") == {"s": 1500.0, "b": 1500.0}


@pytest.mark.parametrize("nodes, hosts, problem", [
    ({"a": Node("a", 1), "b": Node("b", 1)}, {}, "exactly one root"),
    ({"a": Node("a", 1), "b": Node("b", 1, "zz")}, {}, "nodes.b.parent: no node 'zz'"),
    ({"r": Node("r", 1), "a": Node("a", 1, "b"), "b": Node("b", 1, "a")}, {}, "nodes.a.parent: a cycle (a -> b -> a)"),
    ({"r": Node("r", 1), "a": Node("a", 1, "r")}, {"h": Host("h", {"r": 1.0})}, "hosts.h.cords: 'r' has children"),
    ({"r": Node("r", 1), "a": Node("a", 1, "r")}, {"h": Host("h", {"a": 0.7})}, "hosts.h.cords: shares must be > 0 and sum to 1"),
    ({"r": Node("r", 1)}, {"h": Host("h", {"x": 1.0})}, "hosts.h.cords: no node 'x'"),
])
def test_a_tree_that_is_not_one_is_refused_naming_the_node_or_host(nodes, hosts, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        PowerTree(nodes, hosts)


def test_max_min_fair_at_a_cost_fills_the_pool_at_each_hosts_share():
    # A node carrying half of a and all of b: a's watt costs it 0.5.
    out = max_min_fair(900, {"a": 2000, "b": 2000}, {"a": 0.5, "b": 1.0})
    assert out == {"a": 600, "b": 600}
    assert out["a"] * 0.5 + out["b"] <= 900 + EPS
    assert math.isclose(max_min_fair(900, {"a": 100, "b": 2000}, {"a": 0.5, "b": 1.0})["b"], 850)
