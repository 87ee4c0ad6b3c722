"""Delegated subtrees (``core.delegation``): the invariant at every ancestor, with raises
that compare only their zone, in any order of joins, raises, leaves, feed losses and
delegation changes computed from stale reads.

The store is modelled as etcd is: one revision per write, each key's mod revision, and
a transaction that commits only when its compares hold at that moment. The compares are
the ones ``core.delegation.raise_compares`` plans (the store sends the same)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.core.delegation import (Charges, RaiseCompares, active, delegation_fits, proposed_w,
                                          raise_compares, within_bounds)
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
            w = proposed_w(tree, held, wants, deleg, m, margin_w=100 * frac, lost=read.lost) if stale % 2 \
                else frac * tree.nodes[m].budget_w
            if delegation_fits(tree, held, deleg, m, w, read.lost) and db.whole_unchanged(read):
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
