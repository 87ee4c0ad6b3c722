"""Delegated subtrees (``core.delegation``): the invariant at every ancestor, with raises
that compare only their zone, in any order of joins, raises, leaves, feed losses and
delegation changes computed from stale reads.

The store is modelled as etcd is: one revision per write, each key's mod revision, and
a transaction that commits only when its compares hold at that moment. The compares are
the ones ``core.delegation.raise_compares`` plans (the store sends the same)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from powerbudgetd.core.delegation import (Charges, LeaseCompares, RaiseCompares, active, delegation_fits,
                                          divide_charged, fair_leases_w, lease_compares, proposed_w, raise_compares,
                                          within_bounds)
from powerbudgetd.core.tree import EPS_W, Host, Node, PowerTree
from support.examples import examples
from support.trees import trees


@dataclass
class Etcd:
    """Keys ``("seat"|"grant"|"deleg", name)`` -> (value W, mod revision); ``down``: the
    lost feed and its mark's mod revision."""

    rev: int = 1
    kv: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    lost: str | None = None
    down_mod: int = 0

    def snapshot(self) -> Etcd:
        return Etcd(self.rev, dict(self.kv), self.lost, self.down_mod)

    def values(self, kind: str) -> dict[str, float]:
        return {n: v for (k, n), (v, _) in self.kv.items() if k == kind}

    def held(self) -> dict[str, float]:
        seats, grants = self.values("seat"), self.values("grant")
        return {h: seats.get(h, 0.0) + grants.get(h, 0.0) for h in {*seats, *grants}}

    def mod(self, kind: str, name: str) -> int:
        return self.kv.get((kind, name), (0.0, 0))[1]

    def put(self, kind: str, name: str, value: float) -> None:
        self.rev += 1
        self.kv[(kind, name)] = (value, self.rev)

    def delete(self, kind: str, name: str) -> None:
        if (kind, name) in self.kv:
            self.rev += 1
            del self.kv[(kind, name)]

    def whole_unchanged(self, read: Etcd) -> bool:
        return self.down_mod <= read.rev and all(mod <= read.rev for _, mod in self.kv.values())

    def lease_unchanged(self, read: Etcd, plan: LeaseCompares) -> bool:
        """A lease change's compares (the store's): every seat, the feed mark, the grants
        of ``plan.hosts`` and the delegations of ``plan.delegations`` at their mod
        revisions read (every delegation where None; every key where ``whole``)."""
        if plan.whole:
            return self.whole_unchanged(read)
        whole = ("deleg",) if plan.delegations is None else ()
        return self.down_mod <= read.rev and all(
            mod <= read.rev for (k, h), (_, mod) in self.kv.items()
            if k == "seat" or k in whole or (k == "grant" and h in plan.hosts)) and all(
            self.mod("deleg", m) == read.mod("deleg", m) for m in plan.delegations or ())

    def zone_unchanged(self, read: Etcd, plan: RaiseCompares) -> bool:
        if plan.whole:
            return self.whole_unchanged(read)
        return self.down_mod <= read.rev and all(
            self.mod(k, h) <= read.rev for h in plan.hosts for k in ("seat", "grant")) and all(
            self.mod("deleg", m) == read.mod("deleg", m) for m in plan.delegations)


@st.composite
def delegated_trees(draw):
    """``support.trees``' random trees (any shape, pairs in either mode), or trees up to
    four levels whose budgets leave room to raise, with random non-root nodes marked."""
    if draw(st.booleans()):
        tree, wants = draw(trees())
    else:
        n = draw(st.integers(2, 12))
        parents = [None] + [draw(st.integers(max(0, i - 4), i - 1)) for i in range(1, n)]
        nodes = {f"n{i}": Node(f"n{i}", draw(st.floats(500, 8000)), None if p is None else f"n{p}")
                 for i, p in enumerate(parents)}
        leaves = sorted(set(nodes) - {nd.parent for nd in nodes.values()})
        hosts = {}
        for i in range(draw(st.integers(2, 10))):
            cords = {draw(st.sampled_from(leaves)): 1.0}
            if len(leaves) > 1 and draw(st.booleans()):
                a, b = draw(st.lists(st.sampled_from(leaves), min_size=2, max_size=2, unique=True))
                cords = {a: 0.5, b: 0.5}
            hosts[f"h{i}"] = Host(f"h{i}", cords, draw(st.floats(0, 600)), draw(st.integers(0, 2)))
        base = PowerTree(nodes, hosts)
        tree = base.with_mode(draw(st.sampled_from(["redundant", "oversubscribed"])), 2.0)
        wants = {h: draw(st.floats(0, 3000)) for h in hosts}
    marked = {n for n, nd in tree.nodes.items() if nd.parent is not None and draw(st.booleans())}
    nodes = {n: replace(nd, delegate=n in marked) for n, nd in tree.nodes.items()}
    return PowerTree(nodes, tree.hosts, tree.pairs), wants


ops = st.lists(st.tuples(st.sampled_from(["join", "raise", "raise", "raise", "lower", "leave", "delegate",
                                          "delegate", "lose", "shed"]),
                         st.integers(0, 30), st.integers(0, 9), st.floats(0, 1)), min_size=10, max_size=80)


def check(tree: PowerTree, db: Etcd, shed_since_loss: bool) -> None:
    """The invariant at this revision: every node's true committed load within its
    budget; every charge within its bound; with a feed lost, once shed, no grant on a
    node whose flow is over."""
    held = db.held()
    assert not tree.over_w(held), (db.rev, tree.over_w(held))
    live = active(tree, db.values("deleg"))
    assert not Charges(tree, live).over_w(held)
    if db.lost is not None and shed_since_loss:
        grants = db.values("grant")
        for n in tree.over_w(held, db.lost):
            assert not any(grants.get(h, 0.0) > EPS_W for h in tree.coefficients(db.lost)[n]), n


def play(tree: PowerTree, wants: dict[str, float], steps) -> Etcd:
    db = Etcd()
    history = [db.snapshot()]
    hosts, marked = sorted(tree.hosts), sorted(n for n, nd in tree.nodes.items() if nd.delegate)
    shed = True
    # Every host tries to join first, then each marked node takes a lease for its hosts' wants.
    start = [("join", i, 0, 0.0) for i in range(len(hosts))] + [("delegate", i, 1, 1.0) for i in range(len(marked))]
    for op, pick, stale, frac in start + list(steps):
        read = history[max(0, len(history) - 1 - stale // 2)]  # stale // 2 writes behind
        held = read.held()
        h = hosts[pick % len(hosts)]
        if op == "join" and ("seat", h) not in db.kv:
            seat = tree.hosts[h].reserve_w
            if within_bounds(tree, {**held, h: held.get(h, 0.0) + seat}, read.values("deleg"), read.lost) \
                    and db.whole_unchanged(read):
                db.put("seat", h, seat)
        elif op == "raise" and ("seat", h) in read.kv:
            charges = Charges(tree, active(tree, read.values("deleg")), read.lost)
            room = charges.room_for_w(h, held) - read.values("seat")[h]
            grant = read.values("grant").get(h, 0.0)
            new = min(wants[h] * frac, room)
            if new > grant + EPS_W and db.zone_unchanged(read, raise_compares(charges, h)) and ("seat", h) in db.kv:
                db.put("grant", h, new)
        elif op == "lower" and ("grant", h) in db.kv:
            db.put("grant", h, db.kv[("grant", h)][0] * frac)  # a plain put: lowering
        elif op == "leave":
            db.delete("grant", h)
            db.delete("seat", h)
        elif op == "delegate" and marked:
            m = marked[pick % len(marked)]
            deleg = read.values("deleg")
            seats = read.values("seat")
            fair = fair_leases_w(tree, seats, {h: w for h, w in wants.items() if h in seats},
                                 dict.fromkeys(marked, 100 * frac), read.lost)[m] if stale % 4 == 1 else None
            w = proposed_w(tree, held, wants, deleg, m, margin_w=100 * frac, lost=read.lost, fair_w=fair) \
                if stale % 2 else frac * tree.nodes[m].budget_w
            plan = lease_compares(Charges(tree, active(tree, deleg), read.lost), m, w)
            if delegation_fits(tree, held, deleg, m, w, read.lost) and db.lease_unchanged(read, plan):
                db.put("deleg", m, w)
        elif op == "lose" and db.lost is None and tree.feeds():
            db.rev += 1
            db.lost, db.down_mod = tree.feeds()[pick % len(tree.feeds())], db.rev
            shed = False
        elif op == "shed" and db.lost is not None:  # the shed window ends: grants on an over node go
            for n in tree.over_w(db.held(), db.lost):
                for g in tree.coefficients(db.lost)[n]:
                    db.delete("grant", g)
            shed = True
        check(tree, db, shed)
        history.append(db.snapshot())
    return db


@settings(max_examples=examples(400), deadline=None)
@given(delegated_trees(), ops)
def test_no_node_over_its_budget_at_any_revision(case, steps):
    tree, wants = case
    play(tree, wants, steps)


def rack_tree(racks: int = 3, per_rack: int = 4) -> PowerTree:
    """A site over two feeds; each rack a panel under the site with a delegated PDU; hosts single-corded."""
    nodes = {"site": Node("site", 10_000)}
    hosts = {}
    for r in range(racks):
        nodes[f"pdu{r}"] = Node(f"pdu{r}", 5_000, "site", "pdu", delegate=True)
        for i in range(per_rack):
            hosts[f"r{r}h{i}"] = Host(f"r{r}h{i}", {f"pdu{r}": 1.0}, 300.0)
    return PowerTree(nodes, hosts)


def test_raises_under_different_delegated_pdus_touch_disjoint_keys():
    tree = rack_tree()
    seats = {h: 300.0 for h in tree.hosts}
    charges = Charges(tree, {"pdu0": 3000.0, "pdu1": 3000.0, "pdu2": 3000.0})
    assert within_bounds(tree, seats, {"pdu0": 3000.0, "pdu1": 3000.0, "pdu2": 3000.0})
    a, b = raise_compares(charges, "r0h0"), raise_compares(charges, "r1h0")
    assert not a.whole and not b.whole
    assert a.hosts == {f"r0h{i}" for i in range(4)} and a.delegations == {"pdu0"}
    assert not a.hosts & b.hosts and not a.delegations & b.delegations
    # Without a delegation record the raise depends on the whole circuit, as before.
    assert raise_compares(Charges(tree, {}), "r0h0").whole


def test_a_subtree_raises_only_within_its_lease():
    tree = rack_tree()
    seats = {h: 300.0 for h in tree.hosts}
    charges = Charges(tree, {"pdu0": 1500.0})
    # pdu0 holds 1200 W of seats: 300 W left of its lease, whatever the site could spare.
    assert charges.room_for_w("r0h0", seats) == pytest.approx(600.0)
    assert charges.loads_w(seats)["site"] == pytest.approx(1500.0 + 8 * 300.0)


def test_a_lease_the_parent_cannot_carry_is_refused():
    tree = rack_tree()
    seats = {h: 300.0 for h in tree.hosts}
    # site: 10 kW; pdu1 and pdu2 hold 2400 W of seats; pdu0 may have at most 7600 W but its budget is 5 kW.
    assert delegation_fits(tree, seats, {}, "pdu0", 5_000.0)
    assert not delegation_fits(tree, seats, {"pdu1": 4_000.0}, "pdu0", 5_000.0)  # 4000 + 5000 + 1200 > 10000
    assert not delegation_fits(tree, seats, {}, "pdu0", 1_000.0)  # below its own seats (1200 W)
    assert not delegation_fits(tree, seats, {}, "site", 1_000.0)  # not marked: no delegation
    assert not delegation_fits(tree, seats, {}, "pdu0", 5_001.0)  # above its own budget
    # Its hosts' seats plus wants (4 x 800 W), or as much of it as the site can spare.
    assert proposed_w(tree, seats, dict.fromkeys(tree.hosts, 500.0), {"pdu1": 4_000.0}, "pdu0") == pytest.approx(3_200.0)
    assert proposed_w(tree, seats, dict.fromkeys(tree.hosts, 2_000.0), {"pdu1": 4_000.0}, "pdu0") == \
        pytest.approx(4_800.0, abs=0.01)


def test_the_model_finds_a_raise_that_ignores_its_lease():
    """The check checks itself: raises that skip the delegation's compare break the invariant."""
    tree = rack_tree(2, 2)
    db = Etcd()
    for h in tree.hosts:
        db.put("seat", h, 300.0)
    stale = db.snapshot()  # no delegation yet: the site's 10 kW is free for everyone
    db.put("deleg", "pdu1", 9_000.0)
    assert db.whole_unchanged(db.snapshot())
    charges = Charges(tree, active(tree, stale.values("deleg")))
    plan = raise_compares(charges, "r0h0")
    assert plan.whole and not db.zone_unchanged(stale, plan)  # the stale raise fails its compare
    room = charges.room_for_w("r0h0", stale.held()) - 300.0
    db.put("grant", "r0h0", room)  # committed anyway: what the compare prevents
    with pytest.raises(AssertionError):
        check(tree, db, True)


def lease_and_leaf_tree() -> PowerTree:
    """A 2 kW site over two delegated PDUs (pa, pb) and a leaf q outside any lease; one
    100 W host under each."""
    nodes = {"site": Node("site", 2_000.0), "pa": Node("pa", 2_000.0, "site", "pdu", delegate=True),
             "pb": Node("pb", 2_000.0, "site", "pdu", delegate=True), "q": Node("q", 2_000.0, "site", "pdu")}
    hosts = {h: Host(h, {leaf: 1.0}, 100.0) for h, leaf in (("ha", "pa"), ("hb", "pb"), ("hq", "q"))}
    return PowerTree(nodes, hosts)


def seated_with_leases(tree: PowerTree) -> Etcd:
    db = Etcd()
    for h in tree.hosts:
        db.put("seat", h, 100.0)
    db.put("deleg", "pa", 500.0)
    db.put("deleg", "pb", 500.0)
    return db


def test_a_lease_change_read_before_a_raise_outside_any_lease_fails_its_compare():
    """The site counts pa's and pb's leases and hq (no lease above it): 1100 W of 2000.
    hq raises by 800 W; pa's growth to 800 W computed from the read before fits that
    read but not the site after the raise: its transaction compares hq's grant."""
    tree = lease_and_leaf_tree()
    db = seated_with_leases(tree)
    stale = db.snapshot()
    charges = Charges(tree, active(tree, stale.values("deleg")))
    assert delegation_fits(tree, stale.held(), stale.values("deleg"), "pa", 800.0)
    plan = lease_compares(charges, "pa")
    assert not plan.whole and plan.hosts == {"hq", "ha"}
    db.put("grant", "hq", 800.0)
    assert not db.lease_unchanged(stale, plan)
    db.put("deleg", "pa", 800.0)  # committed anyway: what the compare prevents
    with pytest.raises(AssertionError):
        check(tree, db, True)


def test_a_raise_under_a_sibling_lease_does_not_fail_a_lease_change():
    """hb raises within pb's lease (100 + 300 <= 500 W): pa's growth computed from the
    read before commits (the site counts pb's lease, not hb's grant), and every node
    stays within its budget. (Compared over the whole circuit, as before, it failed.)"""
    tree = lease_and_leaf_tree()
    db = seated_with_leases(tree)
    stale = db.snapshot()
    charges = Charges(tree, active(tree, stale.values("deleg")))
    room = charges.room_for_w("hb", stale.held()) - 100.0
    assert room == pytest.approx(400.0)
    db.put("grant", "hb", 300.0)
    assert not db.whole_unchanged(stale)
    assert delegation_fits(tree, stale.held(), stale.values("deleg"), "pa", 800.0)
    assert db.lease_unchanged(stale, lease_compares(charges, "pa"))
    db.put("deleg", "pa", 800.0)
    check(tree, db, True)


def test_a_resize_compares_only_what_its_direction_can_break():
    """From one read, ha raises within pa's lease (100 + 350 <= 500 W) and pb's lease
    grows by 1000 W. pa's growth to 800 W compares neither (ha's raise was checked
    against the 500 W it compared; pb's growth against pa's 500 W) and every node stays
    within its budget, both landed. pa's shrink to 300 W (allowed at the read: 100 W
    held) compares ha's grant and fails; committed anyway, pa would be over its lease.
    A shrink compares no sibling and nothing above (it lowers every charge there); a
    lease created compares everything whatever its size (no raise under it compared it)."""
    tree = lease_and_leaf_tree()
    db = seated_with_leases(tree)
    stale = db.snapshot()
    charges = Charges(tree, active(tree, stale.values("deleg")))
    grow, shrink = lease_compares(charges, "pa", 800.0), lease_compares(charges, "pa", 300.0)
    assert (grow.hosts, grow.delegations) == ({"hq"}, {"pa", "pb"})
    assert (shrink.hosts, shrink.delegations) == ({"ha"}, {"pa"})
    created = lease_compares(Charges(tree, {"pb": 500.0}), "pa", 100.0)
    assert (created.hosts, created.delegations) == ({"hq", "ha"}, {"pa", "pb"})
    assert db.zone_unchanged(stale, raise_compares(charges, "ha"))
    db.put("grant", "ha", 350.0)
    assert db.lease_unchanged(stale, lease_compares(charges, "pb", 1_500.0))
    db.put("deleg", "pb", 1_500.0)
    raised = db.snapshot()
    assert delegation_fits(tree, stale.held(), stale.values("deleg"), "pa", 300.0)
    assert not db.lease_unchanged(stale, shrink)
    db.put("deleg", "pa", 300.0)  # committed anyway: what the compare prevents
    with pytest.raises(AssertionError):
        check(tree, db, True)
    db = raised
    assert delegation_fits(tree, stale.held(), stale.values("deleg"), "pa", 800.0)
    assert not db.lease_unchanged(stale, grow)  # pb grew from the same read: 1500 + 800 + 100 > 2000
    db = seated_with_leases(tree)
    db.put("grant", "ha", 350.0)
    assert db.lease_unchanged(stale, grow)
    db.put("deleg", "pa", 800.0)
    check(tree, db, True)


def test_an_outlet_s_growth_read_before_its_pdu_s_lease_shrank_fails_and_its_shrink_does_not():
    """Outlets o1, o2 lease from pdu's lease (1000 W); one 100 W host on each. From one
    read, pdu shrinks to 600 W and o1 grows from 200 to 500 W, each fitting that read:
    o1's growth compares pdu's record and fails (committed anyway, pdu would carry
    500 + 200 W in 600). o1's shrink to 150 W compares neither pdu nor o2: it lowers
    pdu's charge, whatever they did."""
    nodes = {"site": Node("site", 2_000.0), "pdu": Node("pdu", 2_000.0, "site", "pdu", delegate=True),
             "o1": Node("o1", 1_000.0, "pdu", "outlet", delegate=True),
             "o2": Node("o2", 1_000.0, "pdu", "outlet", delegate=True)}
    tree = PowerTree(nodes, {h: Host(h, {leaf: 1.0}, 100.0) for h, leaf in (("h1", "o1"), ("h2", "o2"))})
    db = Etcd()
    for h in tree.hosts:
        db.put("seat", h, 100.0)
    for n, w in (("pdu", 1_000.0), ("o1", 200.0), ("o2", 200.0)):
        db.put("deleg", n, w)
    stale = db.snapshot()
    deleg = stale.values("deleg")
    charges = Charges(tree, active(tree, deleg))
    grow, shrink = lease_compares(charges, "o1", 500.0), lease_compares(charges, "o1", 150.0)
    assert grow.delegations == {"pdu", "o1", "o2"} and shrink.delegations == {"o1"}
    assert delegation_fits(tree, stale.held(), deleg, "pdu", 600.0) and delegation_fits(tree, stale.held(), deleg, "o1", 500.0)
    assert db.lease_unchanged(stale, lease_compares(charges, "pdu", 600.0))
    db.put("deleg", "pdu", 600.0)
    assert not db.lease_unchanged(stale, grow)
    assert db.lease_unchanged(stale, shrink)
    db.put("deleg", "o1", 150.0)
    check(tree, db, True)
    db.put("deleg", "o1", 500.0)  # the growth committed anyway: what its compare prevents
    with pytest.raises(AssertionError):
        check(tree, db, True)


def test_a_raise_read_before_its_lease_shrank_fails_its_compare():
    """pdu0's lease shrinks to 1500 W; a raise computed from the read before (5000 W)
    fails its compare (the delegation's record changed), and the invariant holds."""
    tree = rack_tree(2, 2)
    wants = dict.fromkeys(tree.hosts, 5_000.0)
    db = play(tree, wants, [("delegate", 0, 0, 0.3), ("raise", 0, 2, 1.0)])
    assert db.values("deleg")["pdu0"] == pytest.approx(1_500.0)
    assert "r0h0" not in db.values("grant")
    # Read afresh, the raise fits the smaller lease.
    db = play(tree, wants, [("delegate", 0, 0, 0.3), ("raise", 0, 0, 1.0)])
    assert db.values("grant")["r0h0"] == pytest.approx(1_500.0 - 600.0)


def outlet_tree() -> PowerTree:
    """A 4 kW site over two delegated 3 kW PDUs, each over delegated 1.5 kW outlets
    (o0a, o0b under pdu0; o1a under pdu1), one 100 W host on each outlet."""
    nodes = {"site": Node("site", 4_000.0)}
    for p in ("pdu0", "pdu1"):
        nodes[p] = Node(p, 3_000.0, "site", "pdu", delegate=True)
    for o in ("o0a", "o0b", "o1a"):
        nodes[o] = Node(o, 1_500.0, f"pdu{o[1]}", "outlet", delegate=True)
    return PowerTree(nodes, {f"h{o[1:]}": Host(f"h{o[1:]}", {o: 1.0}, 100.0) for o in ("o0a", "o0b", "o1a")})


def seated_outlets(tree: PowerTree) -> Etcd:
    db = Etcd()
    for h in tree.hosts:
        db.put("seat", h, 100.0)
    for node, w in (("pdu0", 1_000.0), ("pdu1", 1_000.0), ("o0a", 400.0), ("o0b", 400.0), ("o1a", 400.0)):
        db.put("deleg", node, w)
    return db


def test_an_outlet_lease_resizes_against_its_pdu_and_sibling_outlets_only():
    """An outlet's lease under its PDU's lease compares the PDU's lease, its sibling
    outlets' and its own host's grant: not the other PDU's outlets, nor the site's
    other leases. So outlet leases under different PDUs resize from one read without
    conflict, and every node stays within its budget."""
    tree = outlet_tree()
    db = seated_outlets(tree)
    stale = db.snapshot()
    charges = Charges(tree, active(tree, stale.values("deleg")))
    plan = lease_compares(charges, "o0a")
    assert (plan.whole, plan.hosts, plan.delegations) == (False, {"h0a"}, {"pdu0", "o0a", "o0b"})
    # A PDU's: the site's leases and its own outlets' (its bound counts them), not the other PDU's.
    assert lease_compares(charges, "pdu0").delegations == {"pdu0", "pdu1", "o0a", "o0b"}
    assert delegation_fits(tree, stale.held(), stale.values("deleg"), "o1a", 900.0)
    db.put("deleg", "o1a", 900.0)
    assert delegation_fits(tree, stale.held(), stale.values("deleg"), "o0a", 600.0)
    assert db.lease_unchanged(stale, plan)
    db.put("deleg", "o0a", 600.0)
    check(tree, db, True)


@pytest.mark.parametrize(("first", "second"), [(("o0b", 600.0), ("o0a", 600.0)), (("pdu0", 800.0), ("o0a", 600.0)),
                                               (("o0a", 600.0), ("pdu0", 800.0))],
                         ids=["sibling-outlet", "parent-shrinks-first", "outlet-grows-first"])
def test_an_outlet_or_pdu_lease_read_before_the_other_changed_fails_its_compare(first, second):
    """pdu0 leases 1000 W; its outlets 400 W each. From one read, two changes that each
    fit it: o0a and o0b growing to 600 W, or o0a growing while pdu0 shrinks to 800 W,
    in either order. The second to commit fails its compare; committed anyway, pdu0's
    charge is over its lease."""
    tree = outlet_tree()
    db = seated_outlets(tree)
    stale = db.snapshot()
    deleg = stale.values("deleg")
    for node, watts in (first, second):
        assert delegation_fits(tree, stale.held(), deleg, node, watts)
    db.put("deleg", *first)
    assert not db.lease_unchanged(stale, lease_compares(Charges(tree, active(tree, deleg)), second[0]))
    db.put("deleg", *second)  # committed anyway: what the compare prevents
    with pytest.raises(AssertionError):
        check(tree, db, True)


# -- leases sized by the siblings' priority -------------------------------------------


def test_a_higher_class_subtree_gets_its_lease_before_a_lower_class_sibling():
    """Site 4.5 kW over two delegated PDUs: pdu0's two hosts class 2 wanting 800 W each
    above a 200 W seat, pdu1's class 0 wanting 1400 W. pdu1 took 3 kW first. In the
    division pdu0's hosts are served whole (2000 W) and pdu1 gets the rest (2500 W; an
    even split would give each 2250 W); no margin is left over."""
    nodes = {"site": Node("site", 4_500)}
    hosts = {}
    for r, cls in ((0, 2), (1, 0)):
        nodes[f"pdu{r}"] = Node(f"pdu{r}", 5_000, "site", "pdu", delegate=True)
        for i in range(2):
            hosts[f"r{r}h{i}"] = Host(f"r{r}h{i}", {f"pdu{r}": 1.0}, 200.0, cls)
    tree = PowerTree(nodes, hosts)
    seats = dict.fromkeys(hosts, 200.0)
    wants = {h: 800.0 if h.startswith("r0") else 1_400.0 for h in hosts}
    fair = fair_leases_w(tree, seats, wants, {"pdu0": 100.0, "pdu1": 100.0})
    assert fair == pytest.approx({"pdu0": 2_000.0, "pdu1": 2_500.0})
    # The hosts' own division is the one the leases carry (what CircuitView.fair_w gives).
    alloc = divide_charged(tree.with_reserves(seats), {h: seats[h] + wants[h] for h in hosts})
    assert alloc["r0h0"] == pytest.approx(1_000.0) and alloc["r1h0"] == pytest.approx(1_250.0)
    # First come: pdu1 holds 3 kW (its hosts only their seats); pdu0 can have only 1500 W.
    held = dict(seats)
    first = {"pdu1": 3_000.0}
    assert proposed_w(tree, held, wants, first, "pdu0", margin_w=100.0, fair_w=fair["pdu0"]) == pytest.approx(1_500.0)
    # Without the division's cap pdu1 would grow to its hosts' wants and margin (first come).
    assert proposed_w(tree, held, wants, first, "pdu1", margin_w=100.0) == pytest.approx(3_300.0)
    # pdu1's periodic resize shrinks it to its figure...
    shrunk = proposed_w(tree, held, wants, first, "pdu1", margin_w=100.0, fair_w=fair["pdu1"])
    assert shrunk == pytest.approx(2_500.0) and delegation_fits(tree, held, first, "pdu1", shrunk)
    # ...then pdu0 grows to its hosts' seats and wants.
    after = {"pdu1": shrunk}
    assert proposed_w(tree, held, wants, after, "pdu0", margin_w=100.0, fair_w=fair["pdu0"]) == pytest.approx(2_000.0)
    # Never below what pdu1's subtree holds: its hosts granted 2 x 1200 W, more than their share.
    held_more = {**held, "r1h0": 1_400.0, "r1h1": 1_400.0}
    assert proposed_w(tree, held_more, wants, first, "pdu1", margin_w=100.0, fair_w=fair["pdu1"]) == \
        pytest.approx(2_800.0)
    # With room to spare, the margins come after every class's wants.
    roomy = PowerTree({**nodes, "site": Node("site", 5_400)}, hosts)
    assert fair_leases_w(roomy, seats, wants, {"pdu0": 100.0, "pdu1": 100.0}) == \
        pytest.approx({"pdu0": 2_100.0, "pdu1": 3_300.0})


@st.composite
def sibling_trees(draw):
    """A root over 2-4 delegated siblings (each a leaf or over 1-3 leaves, some of them
    delegated too), maybe an undelegated leaf beside them, maybe a panel between;
    hosts of classes 0-2 single-corded or dual-corded (some across two siblings), random
    seats and wants; maybe a feed lost."""
    nodes = {"root": Node("root", draw(st.floats(1_000, 12_000)))}
    top = "root"
    if draw(st.booleans()):
        nodes["panel"] = Node("panel", draw(st.floats(1_000, 12_000)), "root")
        top = "panel"
    leaves: dict[str, str] = {}  # leaf -> its delegated sibling ("" for the undelegated leaf)
    for i in range(draw(st.integers(2, 4))):
        nodes[f"s{i}"] = Node(f"s{i}", draw(st.floats(300, 8_000)), top, delegate=True)
        kids = draw(st.integers(0, 3))
        if kids == 0:
            leaves[f"s{i}"] = f"s{i}"
        for j in range(kids):
            nodes[f"s{i}l{j}"] = Node(f"s{i}l{j}", draw(st.floats(300, 6_000)), f"s{i}", delegate=draw(st.booleans()))
            leaves[f"s{i}l{j}"] = f"s{i}"
    if draw(st.booleans()):
        nodes["u"] = Node("u", draw(st.floats(300, 6_000)), top)
        leaves["u"] = ""
    names = sorted(leaves)
    hosts = {}
    for i in range(draw(st.integers(2, 9))):
        cords = {draw(st.sampled_from(names)): 1.0}
        if len(names) > 1 and draw(st.integers(0, 3)) == 0:
            a, b = draw(st.lists(st.sampled_from(names), min_size=2, max_size=2, unique=True))
            cords = {a: 0.5, b: 0.5}
        hosts[f"h{i}"] = Host(f"h{i}", cords, draw(st.floats(0, 500)), draw(st.integers(0, 2)))
    tree = PowerTree(nodes, hosts).with_mode(draw(st.sampled_from(["redundant", "oversubscribed"])), 2.0)
    wants = {h: draw(st.floats(0, 3_000)) for h in hosts}
    lost = draw(st.sampled_from([None, *tree.feeds()]))
    return tree, wants, lost, draw(st.floats(20, 300)), draw(st.randoms(use_true_random=False))


def settle(tree: PowerTree, wants: dict[str, float], lost: str | None, margin: float, rng, rounds: int = 60):
    """Joins in a random order, then rounds until nothing moves: each delegated node
    with a seated host under it resized as its first host does periodically (to
    ``proposed_w`` capped by ``fair_leases_w``, when that moves it by half the margin),
    in a random order; each seated host's grant moved towards its share of the
    division (``divide_charged``: ``CircuitView.fair_w``) as far as its room under the
    leases allows. Every write checked (:func:`check`). Returns the store and the
    lease figures of the last round."""
    db = Etcd()
    if lost is not None:
        db.rev += 1
        db.lost, db.down_mod = lost, db.rev
    hosts = sorted(tree.hosts)
    for h in rng.sample(hosts, len(hosts)):
        seat = tree.hosts[h].reserve_w
        if within_bounds(tree, {**db.held(), h: seat}, db.values("deleg"), lost):
            db.put("seat", h, seat)
            check(tree, db, True)
    seats = db.values("seat")
    wanted = {h: w for h, w in wants.items() if h in seats}
    under = {n for h in seats for leaf in tree.hosts[h].cords for n in tree.path(leaf) if tree.nodes[n].delegate}
    fair = fair_leases_w(tree, seats, wanted, dict.fromkeys(under, margin), lost)
    share = divide_charged(tree.with_reserves(seats), {h: seats[h] + w for h, w in wanted.items()}, lost)
    for _ in range(rounds):
        moved = False
        for m in rng.sample(sorted(under), len(under)):
            deleg = db.values("deleg")
            target = proposed_w(tree, db.held(), wanted, deleg, m, margin_w=margin, lost=lost, fair_w=fair[m])
            if (m not in deleg or abs(target - deleg[m]) >= margin / 2) \
                    and delegation_fits(tree, db.held(), deleg, m, target, lost):
                db.put("deleg", m, target)
                moved = True
                check(tree, db, True)
        for h in rng.sample(sorted(seats), len(seats)):
            held = db.held()
            charges = Charges(tree, active(tree, db.values("deleg")), lost)
            grant = db.values("grant").get(h, 0.0)
            new = max(0.0, min(share[h] - seats[h], charges.room_for_w(h, held) - seats[h]))
            if new < grant - EPS_W or (new > grant + 1.0):
                db.put("grant", h, min(new, grant) if new < grant else new)
                moved = True
                check(tree, db, True)
        if not moved:
            break
    return db, fair, under


def _nested_pair(root_w, s0_w, l0_w, l1_w, hosts):
    """Found by Hypothesis: s0 delegated over two delegated leaves of a redundant pair
    (s0l0, s0l1), a host corded across them, s0l2 and s1 idle. ``hosts``: name ->
    (cords, reserve W)."""
    nodes = {"root": Node("root", root_w), "s0": Node("s0", s0_w, "root", delegate=True),
             "s0l0": Node("s0l0", l0_w, "s0", delegate=True), "s0l1": Node("s0l1", l1_w, "s0", delegate=True),
             "s0l2": Node("s0l2", 300.0, "s0"), "s1": Node("s1", 300.0, "root", delegate=True)}
    return PowerTree(nodes, {h: Host(h, cords, w) for h, (cords, w) in hosts.items()}).with_mode("redundant", 2.0)


_L0, _L1, _BOTH = {"s0l0": 1.0}, {"s0l1": 1.0}, {"s0l0": 0.5, "s0l1": 0.5}
# Children's figures summed at their parent's check came an ulp above the parent's figure
# summed over its hosts: the last child's lease was refused for good.
_ULP_TREE = _nested_pair(1916.0, 1916.0, 1386.0, 531.0, {
    "h0": (_L0, 317.575564026854), "h1": (_BOTH, 434.64404140485556), "h2": (_L1, 96.0), "h3": (_L0, 133.0),
    "h4": (_L0, 499.9963989857717)})
_ULP_WANTS = {"h0": 0.0, "h1": 0.0, "h2": 1.0, "h3": 0.0, "h4": 0.0}
# A seat of EPS_W (1 uW) left out of the division: no lease figure counted it.
_TINY_SEAT_TREE = _nested_pair(1000.0, 300.0, 300.0, 300.0, {
    "h0": (_L0, 301.0), "h1": (_L0, 0.0), "h2": (_L0, 0.0), "h3": (_BOTH, 1e-6)})
_TINY_SEAT_WANTS = {"h0": 0.0, "h1": 0.0, "h2": 300.0, "h3": 0.0}


@settings(max_examples=examples(150), deadline=None)
@given(sibling_trees())
@example((_ULP_TREE, _ULP_WANTS, None, 20.0, random.Random(3)))
@example((_TINY_SEAT_TREE, _TINY_SEAT_WANTS, None, 20.0, random.Random(1)))
def test_leases_settle_on_the_priority_division_among_siblings(case):
    """After the rebalances settle, every lease is its figure in the division within a
    step (half a margin: the resize's dead band), and the leases at those figures carry
    every host's share of the division; no node over its budget at any revision on the
    way. Where the division cannot give a host even its seat (a host corded under two
    delegated siblings is counted on both leases), a lease is never above the larger
    of its figure and what its subtree holds, by more than a step."""
    tree, wants, lost, margin, rng = case
    db, fair, under = settle(tree, wants, lost, margin, rng)
    deleg, seats, held = db.values("deleg"), db.values("seat"), db.held()
    share = divide_charged(tree.with_reserves(seats), {h: seats[h] + wants[h] for h in seats}, lost)
    if all(share[h] >= seats[h] - 1e-6 for h in seats):
        for m in under:
            assert m in deleg, (m, fair, deleg, held)
            assert fair[m] - margin / 2 - 1e-5 <= deleg[m] <= fair[m] + 1e-5, (m, deleg[m], fair[m])
        at_fair = Charges(tree, {m: fair[m] for m in under}, lost)
        assert not at_fair.over_w({h: share[h] for h in seats}, 1e-5)
    else:
        for m, w in deleg.items():
            others = {n: v for n, v in deleg.items() if n != m}
            holds = Charges(tree, active(tree, others), lost).loads_w(held).get(m, 0.0)
            assert w <= max(fair[m], holds) + margin / 2 + 1e-6, (m, w, fair[m], holds)


def test_a_feed_loss_that_overfills_a_lease_is_counted_above_it():
    """Feeds A and B (500 W each) under a 2 kW site; under A a delegated PDU pa and a
    leaf a2, under B a leaf b1. h3 (100 W, oversubscribed half on pa, half on b1) and
    h4 (300 W on a2). pa's lease is 50 W (h3's committed half). B lost: h3's whole
    100 W flows through pa, over its lease; A must count those 100 W, not 50, so h4
    may hold 400 W in all, not 450 (A's true flow would be 550 W); and h3, under a
    node over its bound, may not raise."""
    nodes = {"site": Node("site", 2_000), "A": Node("A", 500, "site"), "B": Node("B", 500, "site"),
             "pa": Node("pa", 500, "A", "pdu", delegate=True), "a2": Node("a2", 500, "A"), "b1": Node("b1", 500, "B")}
    hosts = {"h3": Host("h3", {"pa": 0.5, "b1": 0.5}, 100.0), "h4": Host("h4", {"a2": 1.0}, 300.0)}
    tree = PowerTree(nodes, hosts).with_mode("oversubscribed", 2.0)
    held = {"h3": 100.0, "h4": 300.0}
    assert delegation_fits(tree, held, {}, "pa", 50.0)
    lost = Charges(tree, {"pa": 50.0}, "B")
    assert lost.room_for_w("h4", held) == pytest.approx(400.0)
    assert lost.room_for_w("h3", held) == pytest.approx(50.0)  # its lease, until resized
    assert not tree.over_w({**held, "h4": lost.room_for_w("h4", held)}, "B")
    # The lease resized to what its subtree now holds puts things right.
    assert delegation_fits(tree, held, {"pa": 50.0}, "pa", 100.0, "B")


@settings(max_examples=examples(300), deadline=None)
@given(delegated_trees(), st.randoms(use_true_random=False))
def test_a_proposed_lease_is_the_largest_figure_up_to_its_target_that_the_check_accepts(case, rnd):
    """What a resize proposes fits (``delegation_fits``, the store's own check) and no
    figure above it up to its target does: the ancestors' room is found exactly, from the
    read's charges (not re-computed with the node left out), under a feed lost too."""
    tree, wants = case
    marked = [m for m, nd in tree.nodes.items() if nd.delegate and nd.parent is not None]
    held = {h: rnd.uniform(0, 900) for h in tree.hosts if rnd.random() < 0.8}
    deleg = {m: rnd.uniform(0, tree.nodes[m].budget_w) for m in marked if rnd.random() < 0.7}
    lost = rnd.choice([None, *tree.feeds()])
    live = active(tree, deleg)
    charges = Charges(tree, live, lost)
    tables = charges.table_loads_w(held)
    for m in marked:
        fair = rnd.uniform(0, tree.nodes[m].budget_w)
        # (The tables as a read gives them: empty with no lease in force.)
        p = proposed_w(tree, held, wants, deleg, m, lost=lost, fair_w=fair, charged=tables if live else [])
        assert p == proposed_w(tree, held, wants, deleg, m, lost=lost, fair_w=fair)
        now = charges.loads_w(held).get(m, 0.0)
        target = min(max(fair, now), tree.nodes[m].budget_w)
        assert p >= now - EPS_W
        if p > now + EPS_W:
            assert delegation_fits(tree, held, deleg, m, p, lost)
        if p < target - 0.01:
            assert not delegation_fits(tree, held, deleg, m, p + 0.01, lost)


@given(delegated_trees(), st.data())
def test_a_lease_resized_in_place_is_checked_as_the_whole_circuit_would_be(case, data):
    """``delegation_fits`` with the read's charges (the check along the ancestors only)
    gives the verdict of the whole check (``within_bounds`` over every node), on random
    trees, holdings, leases, feed losses and new figures, those at a bound included."""
    tree, _ = case
    marked = sorted(n for n, nd in tree.nodes.items() if nd.delegate)
    if not marked:
        return
    held = {h: data.draw(st.floats(0, 2_000)) for h in tree.hosts}
    leases = {m: data.draw(st.floats(0, tree.nodes[m].budget_w)) for m in marked if data.draw(st.booleans())}
    if not leases:
        return
    lost = data.draw(st.sampled_from([None, *tree.feeds()]))
    charges = Charges(tree, active(tree, leases), lost)
    loads = charges.table_loads_w(held)
    node = data.draw(st.sampled_from(sorted(leases)))
    budget = tree.nodes[node].budget_w
    at_bound = {  # figures where a parent's sum meets its bound exactly, and the ends
        0.0, budget, leases[node],
        *(charges.bound_w(a) - c[a] + leases[node] for c in loads for a in tree.path(node)[1:] if a in c)}
    for watts in sorted({*at_bound, data.draw(st.floats(0, budget))}):
        if 0.0 <= watts <= budget:
            assert delegation_fits(tree, held, leases, node, watts, lost, loads) == \
                within_bounds(tree, held, {**leases, node: watts}, lost, 0.0), (node, watts)


def test_a_lease_shrunk_under_a_parent_over_its_own_lease_counts_the_parent_again():
    """p (leased 100 W) is over its lease, its lease n 80 W beside ho's 30 W (a feed lost
    can leave it so); shrinking n to 60 W brings p to 90 W, so the site (105 W) counts p's
    lease, 100 W, not its old 110 W charge: the check along the ancestors counts p again
    from n's new figure and agrees with the whole check (both: it fits)."""
    nodes = {"site": Node("site", 105.0), "p": Node("p", 1_000.0, "site", delegate=True),
             "n": Node("n", 1_000.0, "p", delegate=True), "o": Node("o", 1_000.0, "p")}
    tree = PowerTree(nodes, {"hn": Host("hn", {"n": 1.0}, 0.0), "ho": Host("ho", {"o": 1.0}, 0.0)})
    held, leases = {"hn": 50.0, "ho": 30.0}, {"p": 100.0, "n": 80.0}
    charged = Charges(tree, active(tree, leases)).table_loads_w(held)
    assert charged[0]["p"] == pytest.approx(110.0)
    assert delegation_fits(tree, held, leases, "n", 60.0, None, charged)
    assert within_bounds(tree, held, {**leases, "n": 60.0}, None, 0.0)
