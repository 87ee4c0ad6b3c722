"""A delegated node's periodic lease resize (``channels.circuit.leases.resize``): it
skips the proposal where nothing would move, but not where an ancestor is over its
bound and the lease must shrink below its figure in the division."""

from __future__ import annotations

import asyncio

import pytest

from powerbudgetd.channels.circuit import leases
from powerbudgetd.channels.circuit.store import Read, Spec
from powerbudgetd.core.circuit import CircuitView
from powerbudgetd.core.delegation import delegation_fits
from powerbudgetd.core.tree import Host, Node, PowerTree


class LeaseStore:
    def __init__(self, read: Read) -> None:
        self.leases: list[tuple[str, float]] = []
        self._read = read

    async def put_delegation(self, read: Read, node: str, watts_w: float, by: str) -> bool:
        self.leases.append((node, round(watts_w, 1)))
        return True

    async def read(self) -> Read:
        return self._read


def _read(unmanaged_w: float) -> Read:
    """A 1000 W root over a delegated PDU m (leased 600 W: hm's 100 W seat and want) and
    a plain leaf q (hq: 100 W seat and a 300 W grant); ``unmanaged_w`` on the root."""
    nodes = {"root": Node("root", 1_000.0), "m": Node("m", 1_000.0, "root", "pdu", delegate=True),
             "q": Node("q", 1_000.0, "root", "pdu")}
    seats = {"hm": 100.0, "hq": 100.0}
    tree = PowerTree(nodes, {h: Host(h, {h[1]: 1.0}, 100.0) for h in seats})
    tree = tree.with_unmanaged({"root": unmanaged_w}).with_reserves(seats)
    view = CircuitView(1_000.0, seats, {"hq": 300.0}, {"hm": 450.0, "hq": 0.0}, revision=7, tree=tree)
    return Read(Spec(1_000.0, 5), view, 7, delegations={"m": 600.0}, delegation_mods={"m": 5})


def _resize(read: Read) -> list[tuple[str, float]]:
    store = LeaseStore(read)
    asyncio.run(leases.resize(store, read, "hm", wants_w=read.view.wants, margin_w=50.0,
                              periodic=True))
    return store.leases


def test_a_lease_at_its_figure_is_left_alone():
    assert _resize(_read(0.0)) == []


def test_a_lease_shrinks_below_its_figure_while_an_unmanaged_load_puts_its_parent_over():
    """200 W unmanaged on the root: it carries 600 W of lease and 400 W of hq, 1000 W on an
    800 W bound. m's figure in the division is still about its 600 W lease, but the
    resize shrinks it to what the root can spare (hm holds only its 100 W seat), and
    the root is within its bound again. (Skipped as "near its figure", the root stays
    over and every raise and lease change under it is refused.)"""
    read = _read(200.0)
    assert not delegation_fits(read.view.tree, read.held_w(), {}, "m", 600.0)
    assert _resize(read) == [("m", 400.0)]
    assert delegation_fits(read.view.tree, read.held_w(), {}, "m", 400.0)


class NestedStore:
    """Leases as etcd would keep them: a put lands where no lease changed since its read
    (a stand-in for the compares on the nodes above), and a read shows what landed."""

    def __init__(self, make, leases_w: dict[str, float]) -> None:
        self.make, self.leases_w = make, dict(leases_w)
        self.mods = dict.fromkeys(leases_w, 1)
        self.revision = 1
        self.landed: list[tuple[str, float]] = []
        self.failed = 0

    async def read(self) -> Read:
        return self.make(self.leases_w, self.mods, self.revision)

    async def put_delegation(self, read: Read, node: str, watts_w: float, by: str) -> bool:
        assert read.view.tree is not None
        assert delegation_fits(read.view.tree, read.held_w(), read.delegations, node, watts_w)  # the store's check
        if any(read.delegation_mods.get(n) != m for n, m in self.mods.items()):
            self.failed += 1
            return False
        self.revision += 1
        self.leases_w[node], self.mods[node] = watts_w, self.revision
        self.landed.append((node, round(watts_w, 1)))
        return True


def _nested(leases_w: dict[str, float], mods: dict[str, int], revision: int) -> Read:
    """A 400 W feed over a delegated PDU p, over two delegated outlets a and b; ha on a
    (100 W seat, 120 W grant, wants 300 W), hb on b (100 W seat, 50 W grant and want).
    The division: hb its 50 W, ha the other 150 W; so a's figure 250 W, b's 150 W, p's 400 W."""
    nodes = {"feed": Node("feed", 400.0), "p": Node("p", 1_000.0, "feed", "pdu", delegate=True),
             "a": Node("a", 1_000.0, "p", "outlet", delegate=True), "b": Node("b", 1_000.0, "p", "outlet", delegate=True)}
    seats = {"ha": 100.0, "hb": 100.0}
    tree = PowerTree(nodes, {h: Host(h, {h[1]: 1.0}, 100.0) for h in seats}).with_reserves(seats)
    view = CircuitView(400.0, seats, {"ha": 120.0, "hb": 50.0}, {"ha": 300.0, "hb": 50.0}, revision=revision, tree=tree)
    return Read(Spec(400.0, 5), view, revision, delegations=dict(leases_w), delegation_mods=dict(mods))


def test_an_ask_grows_each_lease_above_by_what_it_lacks_even_where_each_lack_is_under_a_step():
    """ha is held at its outlet's 220 W lease, 30 W short of the outlet's figure; the PDU
    is 7 W short of its own figure, and b keeps 16 W above its figure (a sibling's
    periodic resize leaves that: inside its dead band), so the PDU has 7 W of room for a. One ask grows the PDU to its
    figure and then a by all the PDU can spare, 14 W, on a read that shows the PDU's
    new lease (no transaction computed from the read before it). (With a step's dead
    band at each lease, neither moved: 7 W and 7 W, each under the 20 W step, held ha's
    30 W back until the wants moved; seen at 100 hosts as raises stuck 15-25 s.)"""
    store = NestedStore(_nested, {"p": 393.0, "a": 220.0, "b": 166.0})
    read = asyncio.run(store.read())
    assert leases.fair_w(read, read.view.wants, 0.0) == pytest.approx({"p": 400.0, "a": 250.0, "b": 150.0})
    asyncio.run(leases.resize(store, read, "ha", wants_w=read.view.wants, margin_w=0.0, periodic=False))
    assert store.landed == [("p", 400.0), ("a", 234.0)]
    assert store.failed == 0


def test_an_ask_stops_where_the_circuit_was_wiped_after_a_lease_it_changed():
    """The PDU's lease lands, and the read after it finds the circuit wiped (no spec, no
    tree): the ask ends there (a lease for a tree that is gone is not proposed; before,
    the division of no tree failed the round)."""
    store = NestedStore(_nested, {"p": 393.0, "a": 220.0, "b": 166.0})
    read = asyncio.run(store.read())
    store.make = lambda leases_w, mods, revision: Read(None, CircuitView(0.0, {}, {}, {}, revision=revision), revision)
    asyncio.run(leases.resize(store, read, "ha", wants_w=read.view.wants, margin_w=0.0, periodic=False))
    assert store.landed == [("p", 400.0)]


def test_a_lease_inside_its_dead_band_gives_back_what_its_siblings_wait_for():
    """b holds 16 W above its figure (150 W: hb's seat and grant), inside its 20 W dead
    band (a 40 W margin), and its parent p has nothing left beside it (a 234 W + b
    166 W = p's 400 W, the feed's whole budget): a waits for exactly those watts, so
    b's periodic resize gives them back. (Left inside the dead band, the watts stayed
    there until the wants moved: hosts under a sibling waited 20-27 s at 100 hosts.)"""
    store = NestedStore(_nested, {"p": 400.0, "a": 234.0, "b": 166.0})
    read = asyncio.run(store.read())
    asyncio.run(leases.resize(store, read, "hb", wants_w=read.view.wants, margin_w=40.0, periodic=True))
    assert store.landed == [("b", 150.0)]


def test_a_lease_inside_its_dead_band_is_left_alone_while_its_parent_has_room():
    """a at its 220 W charge and b 5 W above its figure: p has 25 W free beside them, more
    than half b's margin, so a can grow without b, and b's 5 W stay (no write for a
    few watts)."""
    store = NestedStore(_nested, {"p": 400.0, "a": 220.0, "b": 155.0})
    read = asyncio.run(store.read())
    asyncio.run(leases.resize(store, read, "hb", wants_w=read.view.wants, margin_w=40.0, periodic=True))
    assert store.landed == []


def _hb_granted(grant_w: float):
    """``_nested`` with hb's grant at ``grant_w`` (its want still 50 W)."""
    def make(leases_w: dict[str, float], mods: dict[str, int], revision: int) -> Read:
        base = _nested(leases_w, mods, revision).view
        view = CircuitView(400.0, dict(base.seats), {"ha": 120.0, "hb": grant_w}, dict(base.wants),
                           revision=revision, tree=base.tree)
        return Read(Spec(400.0, 5), view, revision, delegations=dict(leases_w), delegation_mods=dict(mods))
    return make


def test_a_lease_giving_back_keeps_what_its_subtree_holds():
    """As above, but hb holds 60 W of grant (160 W with its seat) above its 150 W figure:
    b gives back only down to the 160 W its host holds."""
    store = NestedStore(_hb_granted(60.0), {"p": 400.0, "a": 234.0, "b": 166.0})
    asyncio.run(leases.resize(store, asyncio.run(store.read()), "hb", wants_w={"ha": 300.0, "hb": 50.0},
                              margin_w=40.0, periodic=True))
    assert store.landed == [("b", 160.0)]


def test_watts_given_back_are_taken_once_and_then_nothing_moves():
    """b gives its 16 W back, its own host's asks and resizes leave it there, a's ask
    takes them, and then no host's ask or resize moves any lease (no ping-pong)."""
    store = NestedStore(_nested, {"p": 400.0, "a": 234.0, "b": 166.0})
    wants = {"ha": 300.0, "hb": 50.0}

    def resize(host: str, periodic: bool) -> None:
        asyncio.run(leases.resize(store, asyncio.run(store.read()), host, wants_w=wants, margin_w=40.0,
                                  periodic=periodic))

    resize("hb", True)
    for periodic in (False, True, False):
        resize("hb", periodic)
    assert store.landed == [("b", 150.0)]
    resize("ha", False)
    for host in ("ha", "hb", "ha", "hb"):
        for periodic in (True, False):
            resize(host, periodic)
    assert store.landed == [("b", 150.0), ("a", 250.0)]


def _pair(leases_w: dict[str, float], mods: dict[str, int], revision: int) -> Read:
    """h dual-corded on delegated PDUs pa (feed A) and pb (feed B), redundant: it counts
    whole on each. Feed A has room; feed B is full: pb's 300 W (h's 100 W seat and 200 W
    grant) beside g's 700 W on a plain leaf q. h wants 400 W more."""
    nodes = {"site": Node("site", 2_000.0), "fa": Node("fa", 1_000.0, "site", "ups"),
             "fb": Node("fb", 1_000.0, "site", "ups"),
             "pa": Node("pa", 1_000.0, "fa", "pdu", delegate=True), "pb": Node("pb", 1_000.0, "fb", "pdu", delegate=True),
             "q": Node("q", 1_000.0, "fb", "pdu")}
    seats = {"h": 100.0, "g": 100.0}
    hosts = {"h": Host("h", {"pa": 0.5, "pb": 0.5}, 100.0), "g": Host("g", {"q": 1.0}, 100.0)}
    tree = PowerTree(nodes, hosts).with_mode("redundant").with_reserves(seats)
    view = CircuitView(2_000.0, seats, {"h": 200.0, "g": 600.0}, {"h": 600.0, "g": 600.0}, revision=revision, tree=tree)
    return Read(Spec(2_000.0, 5), view, revision, delegations=dict(leases_w), delegation_mods=dict(mods))


def test_an_ask_that_cannot_grow_every_cord_grows_none():
    """pa could grow (feed A has room), pb cannot (feed B is full): grown alone, pa would
    give h no room (it counts whole on pb too) and keep those watts from pa's siblings
    until a resize; so the ask writes nothing."""
    store = NestedStore(_pair, {"pa": 300.0, "pb": 300.0})
    read = asyncio.run(store.read())
    assert read.room_for_w("h") == pytest.approx(300.0)
    asyncio.run(leases.resize(store, read, "h", wants_w=read.view.wants, margin_w=0.0, periodic=False))
    assert store.landed == []


def test_an_ask_grows_both_cords_where_both_can():
    """With feed B's other load gone (g at its seat), both PDUs grow and h gains room."""
    def roomy(leases_w: dict[str, float], mods: dict[str, int], revision: int) -> Read:
        r = _pair(leases_w, mods, revision)
        view = CircuitView(2_000.0, dict(r.view.seats), {"h": 200.0}, {"h": 600.0, "g": 0.0},
                           revision=revision, tree=r.view.tree)
        return Read(Spec(2_000.0, 5), view, revision, delegations=dict(leases_w), delegation_mods=dict(mods))
    store = NestedStore(roomy, {"pa": 300.0, "pb": 300.0})
    asyncio.run(leases.resize(store, asyncio.run(store.read()), "h", wants_w={"h": 600.0, "g": 0.0},
                              margin_w=0.0, periodic=False))
    assert [n for n, _ in store.landed] == ["pa", "pb"] and all(w > 300.0 for _, w in store.landed)


def _two_pdus(leases_w: dict[str, float], mods: dict[str, int], revision: int, want_q: float = 300.0) -> Read:
    """A 600 W feed over two delegated PDUs: p, over delegated outlets a (ha) and b (hb),
    and q (hq); each host a 100 W seat. ha and hb hold and want 50 W, hq holds 160 W and
    wants ``want_q``: the division gives hq 200 W, so the figures are q 300 W, a and b
    150 W each, p 300 W."""
    nodes = {"feed": Node("feed", 600.0), "p": Node("p", 1_000.0, "feed", "pdu", delegate=True),
             "q": Node("q", 1_000.0, "feed", "pdu", delegate=True),
             "a": Node("a", 1_000.0, "p", "outlet", delegate=True), "b": Node("b", 1_000.0, "p", "outlet", delegate=True)}
    seats = {"ha": 100.0, "hb": 100.0, "hq": 100.0}
    tree = PowerTree(nodes, {h: Host(h, {h[1]: 1.0}, 100.0) for h in seats}).with_reserves(seats)
    view = CircuitView(600.0, seats, {"ha": 50.0, "hb": 50.0, "hq": 160.0}, {"ha": 50.0, "hb": 50.0, "hq": want_q},
                       revision=revision, tree=tree)
    return Read(Spec(600.0, 5), view, revision, delegations=dict(leases_w), delegation_mods=dict(mods))


# a and b 20 W above their figures, inside their dead band (a 50 W margin: 25 W); p 40 W
# above its own, all of it held by its outlets; the feed full (p 340 + q 260 W).
_ABOVE = {"p": 340.0, "a": 170.0, "b": 170.0, "q": 260.0}
STEP_W = 20.0


def test_leases_above_their_figures_give_back_at_once_to_a_host_that_waits():
    """hq waits on q (its room 160 W, its share 200 W, a step short or more). p and its
    outlets hold 40 W above their figures, the feed full beside q: the periodic resizes
    gave them back one level per resize, 5 s apart (hosts under a sibling waited up to
    10 s at 50 hosts). Now each host runs its rounds (a give-back where ``gives_back``
    says so, an ask where a lease holds it back), no periodic resize at all: the outlets
    give back first (p can shrink only once they have), then p, then hq's ask takes the
    watts; in three rounds, and then nothing moves."""
    store = NestedStore(_two_pdus, _ABOVE)
    read = asyncio.run(store.read())
    assert leases.waiting(read, STEP_W) == {"hq"}
    assert leases.giving(read, read.view.wants, 50.0, STEP_W) == {"p", "a", "b"}
    assert [h for h in ("ha", "hb", "hq") if leases.gives_back(read, h, read.view.wants, 50.0, STEP_W)] == ["ha", "hb"]

    def rounds(n: int) -> None:
        for _ in range(n):
            for h in ("ha", "hb", "hq"):
                r = asyncio.run(store.read())
                if leases.gives_back(r, h, r.view.wants, 50.0, STEP_W):
                    asyncio.run(leases.resize(store, r, h, wants_w=r.view.wants, margin_w=50.0, periodic=True))
                elif leases.held_back(r, h, STEP_W):
                    asyncio.run(leases.resize(store, r, h, wants_w=r.view.wants, margin_w=50.0, periodic=False))

    rounds(3)
    assert store.leases_w == pytest.approx({"p": 300.0, "a": 150.0, "b": 150.0, "q": 300.0})
    assert not leases.waiting(asyncio.run(store.read()), STEP_W)
    landed = list(store.landed)
    rounds(3)
    assert store.landed == landed


def test_leases_above_their_figures_stay_while_nobody_waits():
    """As above with hq wanting only its 160 W: nobody waits, so nothing is given back
    before the periodic resizes (no write for watts nobody is short of)."""
    store = NestedStore(lambda leases_w, mods, revision: _two_pdus(leases_w, mods, revision, want_q=160.0), _ABOVE)
    read = asyncio.run(store.read())
    assert not leases.waiting(read, STEP_W) and not leases.giving(read, read.view.wants, 50.0, STEP_W)
    assert not any(leases.gives_back(read, h, read.view.wants, 50.0, STEP_W) for h in ("ha", "hb", "hq"))


def test_a_lease_above_its_figure_with_room_above_it_leaves_the_host_that_waits_to_ask():
    """p 10 W above its figure (under half its margin) while the feed still has room
    beside it: a periodic resize would not move it (not pressed), so its first host is
    not told to give back (it would reread and write nothing at every round while hq
    waits); hq's own ask grows q into the room."""
    store = NestedStore(_two_pdus, {"p": 310.0, "a": 150.0, "b": 150.0, "q": 260.0})
    read = asyncio.run(store.read())
    assert leases.waiting(read, STEP_W) == {"hq"} and "p" in leases.giving(read, read.view.wants, 50.0, STEP_W)
    assert not any(leases.gives_back(read, h, read.view.wants, 50.0, STEP_W) for h in ("ha", "hb"))
    asyncio.run(leases.resize(store, read, "hq", wants_w=read.view.wants, margin_w=50.0, periodic=False))
    assert store.landed == [("q", 290.0)]
