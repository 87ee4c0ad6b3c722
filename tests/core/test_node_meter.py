"""Every power-tree node held against its own meter (``core.nodemeter``): measured and
reported draw, the unmanaged load between them taken off the node's budget (a fresh
reading only), never counted twice up the tree, and the hosts under that node lowered
by it while the others are not."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from powerbudgetd.core.circuit import CircuitView, GrantPolicy, raise_allowed
from powerbudgetd.core.nodemeter import (
    MeterReport,
    Sample,
    check_source,
    node_meters,
    report_of,
    stale_after_s,
    unmanaged_by_node,
)
from powerbudgetd.core.sensor import Sensor
from powerbudgetd.core.tree import Host, Node, PowerTree
from support.examples import examples
from support.trees import trees

NOW = 1_750_000_000.0


def metered_tree() -> PowerTree:
    """A 3000 W root over two 1500 W PDUs; PDU A metered by its UPS; a and a2 under A, b under B."""
    nodes = {"root": Node("root", 3000.0), "A": Node("A", 1500.0, "root", "pdu", meter="ups:pdu-a@nut1"),
             "B": Node("B", 1500.0, "root", "pdu")}
    hosts = {"a": Host("a", {"A": 1.0}), "a2": Host("a2", {"A": 1.0}), "b": Host("b", {"B": 1.0})}
    return PowerTree(nodes, hosts)


def report(value_w: float, *, age_s: float = 1.0, refresh_s: float | None = 2.0, host: str = "a",
           node: str = "A", at: float = NOW) -> MeterReport:
    return MeterReport(node, host, value_w, age_s, age_s, refresh_s, at)


def view_with(tree: PowerTree, meters: dict, seats: dict[str, float], wants: dict[str, float]) -> CircuitView:
    t = tree.with_reserves(seats).with_unmanaged(unmanaged_by_node(tree, meters))
    return CircuitView(t.nodes["root"].budget_w + t.nodes["root"].unmanaged_w, seats, {}, wants, tree=t)


def test_source_ids():
    assert check_source("ups:pdu-a@nut1") == "ups:pdu-a@nut1"
    assert check_source("mqtt:tele/plug7/SENSOR")
    for bad in ("pdu-a@nut1", "UPS:x", "ups:", "ups:a b", "x:" + "y" * 300):
        with pytest.raises(ValueError, match="no source id"):
            check_source(bad)


def test_the_unmanaged_load_is_measured_less_reported_from_a_fresh_reading():
    tree = metered_tree()
    m = node_meters(tree, {"A": {"a": report(1400.0)}}, {"A": 900.0, "B": 300.0, "root": 1200.0}, NOW)
    assert set(m) == {"A"}
    a = m["A"]
    assert (a.measured_w, a.reported_w, a.unmanaged_w, a.fresh, a.why) == (1400.0, 900.0, 500.0, True, "")
    # Below what the hosts report: no negative load (floored at 0)
    assert node_meters(tree, {"A": {"a": report(700.0)}}, {"A": 900.0}, NOW)["A"].unmanaged_w == 0.0


def test_a_stale_reading_is_ignored_with_the_reason():
    tree = metered_tree()
    assert stale_after_s(2.0) == 10.0 and stale_after_s(30.0) == 90.0 and stale_after_s(None) == 90.0
    # published 9 s ago, 2 s old then: 11 s > 10 s
    m = node_meters(tree, {"A": {"a": report(1400.0, age_s=2.0, at=NOW - 9.0)}}, {"A": 900.0}, NOW)["A"]
    assert not m.fresh and m.unmanaged_w == 0.0 and m.measured_w == 1400.0 and "stale" in m.why
    # a 30 s meter stays fresh for 90 s
    assert node_meters(tree, {"A": {"a": report(1400.0, age_s=50.0, refresh_s=30.0)}}, {"A": 900.0}, NOW)["A"].fresh
    unknown = node_meters(tree, {"A": {"a": report(1400.0)}}, {"A": None}, NOW)["A"]
    assert unknown.unmanaged_w == 0.0 and "unknown" in unknown.why
    none = node_meters(tree, {}, {"A": 900.0}, NOW)["A"]
    assert none.measured_w is None and "no host" in none.why


def test_of_two_hosts_reports_the_one_seen_last_is_used():
    tree = metered_tree()
    m = node_meters(tree, {"A": {"a": report(1400.0, age_s=4.0), "a2": report(1300.0, age_s=1.0, host="a2")}},
                    {"A": 900.0}, NOW)["A"]
    assert (m.measured_w, m.host) == (1300.0, "a2")


def test_a_load_under_a_child_is_counted_once_up_the_tree():
    tree = PowerTree({"root": Node("root", 5000.0, meter="mqtt:site"), "A": Node("A", 2000.0, "root", meter="ups:a@x"),
                      "B": Node("B", 2000.0, "root", meter="ups:b@x")},
                     {"a": Host("a", {"A": 1.0}), "b": Host("b", {"B": 1.0})})
    reported = {"A": 1000.0, "B": 1000.0, "root": 2000.0}
    reps = {"A": {"a": report(1300.0)}, "B": {"b": report(1200.0, node="B", host="b")},
            "root": {"a": report(2400.0, node="root")}}
    u = unmanaged_by_node(tree, node_meters(tree, reps, reported, NOW))
    assert u == {"A": 300.0, "B": 200.0, "root": 500.0}  # the root's meter sees 400 W: its children's 500 W count
    reps["root"] = {"a": report(2900.0, node="root")}  # 400 W more beside the PDUs, at the root
    assert unmanaged_by_node(tree, node_meters(tree, reps, reported, NOW))["root"] == 900.0


def test_with_unmanaged_lowers_the_budget_the_hosts_share_and_keeps_the_rating():
    t = metered_tree().with_unmanaged({"A": 400.0})
    assert (t.nodes["A"].budget_w, t.nodes["A"].unmanaged_w, t.nodes["A"].rated_w) == (1100.0, 400.0, 1500.0)
    again = t.with_unmanaged({"A": 100.0})  # from the rating, not from the last lowered budget
    assert (again.nodes["A"].budget_w, again.nodes["A"].rated_w) == (1400.0, 1500.0)
    assert t.with_unmanaged({"A": 9000.0}).nodes["A"].budget_w == 0.0


def test_an_unmanaged_load_lowers_the_hosts_under_that_node_only():
    """PDU A's meter reads 600 W beyond what a and a2 report: their fair grants fall by
    300 W each; b, under B, keeps its grant."""
    tree = metered_tree()
    seats = {"a": 200.0, "a2": 200.0, "b": 200.0}
    wants = {h: 2000.0 for h in seats}
    before = view_with(tree, {}, seats, wants)
    meters = node_meters(tree, {"A": {"a": report(1200.0)}}, {"A": 600.0}, NOW)
    after = view_with(tree, meters, seats, wants)
    assert before.fair_w("a") == before.fair_w("a2") == 550.0 and before.fair_w("b") == 1500.0 - 200.0
    assert after.fair_w("a") == after.fair_w("a2") == pytest.approx(250.0)
    assert after.fair_w("b") == before.fair_w("b")
    # a grant raised before the load appeared is given back at once (a node over), not after the hold
    held = replace(after, grants={"a": 550.0, "a2": 550.0})
    assert held.nodes_over_w() == {"A": pytest.approx(600.0)}
    assert GrantPolicy(release_hold_s=60).target_w(held, "a", 550.0, 0.0) == pytest.approx(250.0)
    beside = replace(after, grants={"a2": 250.0})
    assert not raise_allowed(beside, "a", 300.0) and raise_allowed(beside, "a", 250.0)


def test_a_stale_reading_lowers_no_one():
    tree = metered_tree()
    seats = {"a": 200.0, "a2": 200.0, "b": 200.0}
    stale = node_meters(tree, {"A": {"a": report(1200.0, age_s=30.0)}}, {"A": 600.0}, NOW)
    assert view_with(tree, stale, seats, {h: 2000.0 for h in seats}).fair_w("a") == 550.0


def test_a_sensor_sample_reports_its_age_and_refresh():
    s = Sensor()
    assert s.sample() is None
    s.poll(500.0, 10.0)
    s.poll(500.0, 12.0)
    s.poll(520.0, 20.0)
    s.poll(520.0, 24.0)
    sample = s.sample()
    assert sample == Sample(520.0, 20.0, 24.0, 10.0)
    r = report_of(sample, "A", "a", 25.0, NOW)
    assert (r.value_w, r.age_s, r.changed_s, r.refresh_s, r.at) == (520.0, 1.0, 5.0, 10.0, NOW)
    s.gap()
    assert s.sample() is None


@st.composite
def metered_cases(draw):
    """A random tree, some nodes metered with a reading each (some stale), and the hosts'
    reported draw; the seats must fit beside the unmanaged loads (a load that eats into
    the reserves no division can leave room for: said by the over check, not shed)."""
    tree, wants = draw(trees())
    nodes = {}
    for name, node in tree.nodes.items():
        nodes[name] = replace(node, meter=f"ups:{name}@nut" if draw(st.booleans()) else None)
    tree = PowerTree(nodes, tree.hosts, tree.pairs)
    # the seats scaled to fit every node (a tree whose seats do not fit is refused anyway)
    loads = tree.loads_w({h: tree.hosts[h].reserve_w for h in tree.hosts})
    scale = min([1.0] + [tree.nodes[n].budget_w / w for n, w in loads.items() if w > 0])
    tree = tree.with_reserves({h: tree.hosts[h].reserve_w * scale * 0.999 for h in tree.hosts})
    reported = {h: draw(st.floats(0, 3000)) for h in tree.hosts}
    through = tree.loads_w(reported, flow=True)
    under = tree.coefficients()
    seat_load = tree.loads_w({h: tree.hosts[h].reserve_w for h in tree.hosts})
    reps: dict[str, dict[str, MeterReport]] = {}
    for name, node in nodes.items():
        if node.meter is None or not under[name]:
            continue
        host = draw(st.sampled_from(sorted(under[name])))
        # mostly a load the seats leave room for (else the case is discarded below)
        extra = draw(st.floats(0, max(0.0, node.budget_w - seat_load[name]) * 1.1))
        age = draw(st.sampled_from([0.5, 3.0, 60.0]))  # the last: stale at a 2 s refresh
        reps[name] = {host: MeterReport(name, host, through[name] + extra, age, age, 2.0, NOW)}
    meters = node_meters(tree, reps, through, NOW)
    u = unmanaged_by_node(tree, meters)
    seats = {h: tree.hosts[h].reserve_w for h in tree.hosts}
    return tree, wants, meters, u, seats


@settings(max_examples=examples(300), deadline=None)
@given(metered_cases(), st.data())
def test_once_every_host_has_taken_its_turn_no_node_carries_more_than_its_budget(case, data):
    """With random trees, node meters and unmanaged loads (a stale reading: none), from
    any grants held before the loads were known, once every host has taken one turn of
    its grant policy (the shed window: a round each) and then any raises the view
    allows: at every node, committed load (seats + grants, failover counted) plus its
    unmanaged load is within its whole budget."""
    tree, wants, meters, u, seats = case
    t = tree.with_reserves(seats)
    seat_load = tree.loads_w(seats)  # counted as the check below counts every load (failover included)
    # Precondition: the seats fit beside the unmanaged load (reserves are never shed)
    assume(all(seat_load[n] + u.get(n, 0.0) <= tree.nodes[n].budget_w + 1e-6 for n in tree.nodes))
    for m in meters.values():
        assert m.unmanaged_w == 0.0 or m.fresh
    root = next(n for n in tree.nodes.values() if n.parent is None)
    before = CircuitView(root.budget_w, seats, {}, wants, tree=t)
    grants = {}
    for h in data.draw(st.permutations(sorted(tree.hosts))):  # grants raised before the loads were known
        target = GrantPolicy(step_w=0.0).target_w(before, h, 0.0, 0.0)
        if raise_allowed(before, h, target):
            before = replace(before, grants={**before.grants, h: target})
    grants = dict(before.grants)
    v = replace(before, tree=t.with_unmanaged(u), grants=grants)
    policy = {h: GrantPolicy(step_w=data.draw(st.floats(0, 100)), release_hold_s=60) for h in tree.hosts}
    for h in data.draw(st.permutations(sorted(tree.hosts))):  # the shed window: one turn each
        current = v.grants.get(h, 0.0)
        target = policy[h].target_w(v, h, current, 0.0)
        if target < current or raise_allowed(v, h, target):
            v = replace(v, grants={**v.grants, h: target})
    for _ in range(data.draw(st.integers(0, 6))):  # afterwards: any raise the view allows
        h = data.draw(st.sampled_from(sorted(tree.hosts)))
        asked = data.draw(st.floats(0, 6000))
        if raise_allowed(v, h, asked):
            v = replace(v, grants={**v.grants, h: asked})
    loads = tree.loads_w(v.held_w())
    for n, node in tree.nodes.items():
        assert loads[n] + u.get(n, 0.0) <= node.budget_w + 1e-6, (n, loads[n], u.get(n), node.budget_w, v.grants)
