"""A circuit that is a power tree: every seat and grant fits every node on the host's
cords' paths, failover counted, whatever order hosts seat themselves and raise in; the
fair grant follows the tree's division (priorities); a host the tree does not name, or
a tree that cannot be read, takes nothing."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.core.circuit import CircuitView, GrantPolicy, raise_allowed
from powerbudgetd.core.tree import Host, Node, PowerTree
from support.examples import examples
from support.trees import trees


def two_branches(priority_b: int = 0) -> PowerTree:
    """A 1000 W root over two 600 W branches, host a under A and host b under B."""
    nodes = {"root": Node("root", 1000.0), "A": Node("A", 600.0, "root"), "B": Node("B", 600.0, "root")}
    hosts = {"a": Host("a", {"A": 1.0}), "b": Host("b", {"B": 1.0}, priority=priority_b)}
    return PowerTree(nodes, hosts)


def view_of(tree: PowerTree, seats: dict[str, float], grants: dict[str, float] | None = None,
            wants: dict[str, float] | None = None) -> CircuitView:
    root = next(n for n in tree.nodes.values() if n.parent is None)
    return CircuitView(root.budget_w, seats, grants or {}, wants or {}, tree=tree.with_reserves(seats))


def test_a_grant_fits_its_branch_and_the_shared_parent():
    v = view_of(two_branches(), {"a": 100.0, "b": 100.0})
    assert not raise_allowed(v, "a", 550.0)  # branch A: 100 + 550 > 600, though the root has room
    assert raise_allowed(v, "a", 500.0)
    v = replace(v, grants={"a": 500.0})
    assert not raise_allowed(v, "b", 350.0)  # the root: 100 + 500 + 100 + 350 > 1000
    assert raise_allowed(v, "b", 300.0)
    assert replace(v, grants={"a": 500.0, "b": 300.0}).holds()
    assert not replace(v, grants={"a": 500.0, "b": 350.0}).holds()
    assert replace(v, grants={"a": 500.0, "b": 350.0}).nodes_over_w() == {"root": 50.0}


def test_a_host_the_tree_does_not_name_takes_no_seat_and_no_grant():
    v = view_of(two_branches(), {"a": 100.0})
    assert not v.seat_fits(50.0, "stranger")
    assert not raise_allowed(replace(v, seats={"a": 100.0, "stranger": 50.0}), "stranger", 10.0)
    assert v.fair_w("stranger") == 0.0 and v.room_w("stranger") == 0.0


def test_a_tree_that_cannot_be_read_seats_and_raises_nothing():
    v = CircuitView(1000.0, {"a": 100.0}, tree_bad=True)
    assert not v.seat_fits(100.0, "b") and not raise_allowed(v, "a", 10.0) and not v.holds()


def test_the_fair_grant_follows_the_tree_and_its_classes():
    """Both hosts want 500 W above their 100 W seats under the 1000 W root: equal classes
    split the root's 800 W; b in a higher class takes its whole want first (its branch
    allows 500 W above its seat), a the 300 W left."""
    wants = {"a": 500.0, "b": 500.0}
    assert view_of(two_branches(), {"a": 100.0, "b": 100.0}, wants=wants).fair_w("a") == 400.0
    v = view_of(two_branches(priority_b=1), {"a": 100.0, "b": 100.0}, wants=wants)
    assert v.fair_w("b") == 500.0 and v.fair_w("a") == 300.0


@settings(max_examples=examples(300), deadline=None)
@given(trees(), st.data())
def test_seats_and_raises_checked_by_the_view_never_overfill_any_node(case, data):
    """Hosts seat themselves and raise their grants in any order, each step checked
    against the view as it stands (as the store's transaction guards it): every node
    stays within its budget, failover counted. The grant policy's target is always a
    raise the view allows."""
    tree, wants = case
    root = next(n for n in tree.nodes.values() if n.parent is None)
    v = CircuitView(root.budget_w, tree=tree.with_reserves({}))
    for host in data.draw(st.permutations(list(tree.hosts))):
        reserve = tree.hosts[host].reserve_w
        if v.seat_fits(reserve, host):
            seats = {**v.seats, host: reserve}
            v = replace(v, seats=seats, tree=tree.with_reserves(seats))
            assert v.holds(), v.nodes_over_w()
    v = replace(v, wants={h: wants[h] for h in v.seats})
    policy = {h: GrantPolicy(step_w=0.0) for h in v.seats}
    for _ in range(data.draw(st.integers(0, 12))):
        host = data.draw(st.sampled_from(sorted(tree.hosts)))
        asked = data.draw(st.floats(0, 8000))
        if raise_allowed(v, host, asked):
            v = replace(v, grants={**v.grants, host: asked})
        assert v.holds(), v.nodes_over_w()
        if host in policy:
            current = v.grants.get(host, 0.0)
            target = policy[host].target_w(v, host, current, 0.0)
            assert target <= current or raise_allowed(v, host, target), (host, current, target)
