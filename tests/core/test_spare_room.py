"""Spare room: once every want is met, the room left is handed out up to each host's
nameplate (``divide(..., ceilings_w)``, ``CircuitView.ceilings``), still within every
node's budget, normally and with each feed lost; where every nameplate fits, every
host is given its nameplate; a grant above its own want and its fair share goes back at
once, while what a host asked for keeps its release hold."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.core.circuit import CircuitView, GrantPolicy, raise_allowed
from powerbudgetd.core.tree import Host, Node, PowerTree, divide
from support.examples import examples
from support.trees import seated_in_order, trees

EPS = 1e-6


@settings(max_examples=examples(300), deadline=None)
@given(trees(), st.data())
def test_spare_room_stays_within_every_node_and_only_adds_to_the_division_of_the_wants(case, data):
    tree, wants = case
    ceilings = {h: wants[h] + data.draw(st.floats(0, 6000)) for h in tree.hosts}
    for lost in (None, *tree.feeds()):
        before = divide(tree, wants, lost)
        after = divide(tree, wants, lost, ceilings)
        assert not tree.over_w(after), tree.over_w(after)
        if lost is not None:
            assert not tree.over_w(after, lost), (lost, tree.over_w(after, lost))
        for h in tree.hosts:
            assert before[h] - EPS <= after[h] <= ceilings[h] + EPS, (h, before[h], after[h], ceilings[h])
    # Spare room never needs shedding: on any one feed's loss, no node carries more
    # beyond its budget than the wants alone put there.
    before, after = divide(tree, wants), divide(tree, wants, None, ceilings)
    for feed in tree.feeds():
        load_before, load_after = tree.loads_w(before, feed), tree.loads_w(after, feed)
        for node, w in load_after.items():
            assert w <= max(tree.nodes[node].budget_w, load_before[node]) + 1e-3, (feed, node, w, load_before[node])


@settings(max_examples=examples(300), deadline=None)
@given(trees(), st.data())
def test_where_every_nameplate_fits_every_host_is_given_its_nameplate(case, data):
    """Nameplates that fit every node with pairs redundant (so on any one feed's loss
    too: a division of the redundant tree always does), wants at or under them: the
    division hands every host its nameplate, whatever it wants now."""
    tree, wants = case
    nameplates = divide(tree.with_mode("redundant"), {h: data.draw(st.floats(0, 6000)) for h in tree.hosts})
    wants = {h: min(w, nameplates[h]) for h, w in wants.items()}
    got = divide(tree, wants, None, nameplates)
    for h in tree.hosts:
        assert abs(got[h] - nameplates[h]) <= 1e-3, (h, got[h], nameplates[h])


@settings(max_examples=examples(300), deadline=None)
@given(trees(), st.data())
def test_raises_to_the_spare_room_are_still_checked_against_every_node(case, data):
    """As ``test_circuit_tree``'s: hosts seat and raise in any order with ceilings
    published; every node stays within its budget and every target the policy gives is
    a raise the view allows (the store's transaction then guards it)."""
    tree, wants = case
    v = seated_in_order(tree, data.draw(st.permutations(list(tree.hosts))))
    v = replace(v, wants={h: wants[h] for h in v.seats},
                ceilings={h: wants[h] + data.draw(st.floats(0, 6000)) for h in v.seats})
    policy = {h: GrantPolicy(step_w=0.0) for h in v.seats}
    for _ in range(data.draw(st.integers(1, 12))):
        host = data.draw(st.sampled_from(sorted(tree.hosts)))
        if host not in policy:
            continue
        current = v.grants.get(host, 0.0)
        target = policy[host].target_w(v, host, current, 0.0)
        if target > current:
            assert raise_allowed(v, host, target), (host, current, target)
        v = replace(v, grants={**v.grants, host: target})
        assert v.holds(), v.nodes_over_w()


def _two_on_one_pdu() -> PowerTree:
    """One 3000 W PDU, hosts a and b on it."""
    return PowerTree({"pdu": Node("pdu", 3000.0)}, {h: Host(h, {"pdu": 1.0}) for h in ("a", "b")})


def _view(grants: dict[str, float], wants: dict[str, float], ceilings: dict[str, float]) -> CircuitView:
    seats = {"a": 500.0, "b": 500.0}
    tree = _two_on_one_pdu().with_reserves(seats)
    return CircuitView(3000.0, seats, grants, wants, tree=tree, ceilings=ceilings)


def test_a_host_is_handed_the_room_nobody_wants_up_to_its_nameplate():
    """2000 W above the seats; a wants 300 W, b 200 W: each is handed spare room, max-min
    fair, up to its nameplate (a: 1200 W above its seat, b: 600 W): b 600, a 1200."""
    v = _view({}, {"a": 300.0, "b": 200.0}, {"a": 1200.0, "b": 600.0})
    assert v.fair_w("a") == 1200.0 and v.fair_w("b") == 600.0
    # Without ceilings the division is the wants (unchanged).
    assert replace(v, ceilings={}).fair_w("a") == 300.0


def test_spare_room_goes_back_at_once_and_a_want_keeps_its_hold():
    """a holds 1400 W (its want 300 W), b now wants 1500 W: the division gives a 500 W.
    a gives back what is above its own want at once (down to 500 W, its fair share),
    not after the release hold; a host holding within its own want keeps the hold."""
    v = _view({"a": 1400.0, "b": 100.0}, {"a": 300.0, "b": 1500.0}, {"a": 1500.0, "b": 1500.0})
    assert v.fair_w("a") == 500.0
    assert GrantPolicy(step_w=20.0, release_hold_s=10.0).target_w(v, "a", 1400.0, 0.0) == 500.0
    # a wants 1200 W of its 1400 W: above its share (a 1000 / b 1000), the 200 W above
    # its want go at once, the rest after the hold.
    v = _view({"a": 1400.0, "b": 100.0}, {"a": 1200.0, "b": 1500.0}, {"a": 1500.0, "b": 1500.0})
    assert v.fair_w("a") == 1000.0
    p = GrantPolicy(step_w=20.0, release_hold_s=10.0)
    assert p.target_w(v, "a", 1400.0, 0.0) == 1200.0
    assert p.target_w(v, "a", 1200.0, 5.0) == 1200.0
    assert p.target_w(v, "a", 1200.0, 10.0) == 1000.0


def test_on_a_flat_circuit_the_room_left_is_handed_out_too_and_the_raise_fits_the_budget():
    """3000 W, seats 500 W each: 2000 W to share; wants 300 / 200 W, nameplates 1200 / 600
    W above the seats: a 1200 W, b 600 W; the target is a raise the budget allows."""
    v = CircuitView(3000.0, {"a": 500.0, "b": 500.0}, {}, {"a": 300.0, "b": 200.0},
                    ceilings={"a": 1200.0, "b": 600.0})
    assert v.fair_w("a") == 1200.0 and v.fair_w("b") == 600.0
    target = GrantPolicy(step_w=20.0).target_w(v, "a", 0.0, 0.0)
    assert target == 1200.0 and raise_allowed(v, "a", target)
    v = replace(v, grants={"a": 1200.0})
    assert not raise_allowed(v, "b", 900.0) and raise_allowed(v, "b", 800.0)  # 500 + 500 + 1200 + 800 = 3000


def test_a_dip_in_a_host_s_want_is_held_like_any_excess_not_taken_for_spare_room():
    """a and b each hold their fair 1000 W, both wanting 1500 W. a's want dips to 700 W
    for a moment (a 1 s average): the 300 W between its dip and its grant are what it
    asked for a moment ago, held for the release hold, not given back at once (given
    back at once, b raises into them and a waits behind b's hold when its want comes
    back: three hosts of equal wants were seen at 240 / 160 / 200 W). Spare room above
    what it asked for over the hold still goes at once."""
    p = GrantPolicy(step_w=20.0, release_hold_s=10.0)
    wanting = _view({"a": 1000.0, "b": 1000.0}, {"a": 1500.0, "b": 1500.0}, {"a": 1500.0, "b": 1500.0})
    assert p.target_w(wanting, "a", 1000.0, 0.0) == 1000.0
    dipped = _view({"a": 1000.0, "b": 1000.0}, {"a": 700.0, "b": 1500.0}, {"a": 1500.0, "b": 1500.0})
    assert dipped.fair_w("a") == 700.0
    assert p.target_w(dipped, "a", 1000.0, 1.0) == 1000.0  # held
    assert p.target_w(dipped, "a", 1000.0, 11.5) == 700.0  # the hold over: given back
    # Asked 1200 W at most over the hold, holding 1400 W: the 200 W never asked go at once.
    p = GrantPolicy(step_w=20.0, release_hold_s=10.0)
    assert p.target_w(_view({"a": 1400.0, "b": 100.0}, {"a": 1200.0, "b": 1500.0},
                            {"a": 1500.0, "b": 1500.0}), "a", 1400.0, 0.0) == 1200.0
