"""A delegated node's periodic lease resize (``channels.circuit.leases.resize``): it
skips the proposal where nothing would move, but not where an ancestor is over its
bound and the lease must shrink below its figure in the division."""

from __future__ import annotations

import asyncio

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
    asyncio.run(leases.resize(store, read, "hm", wants_w=read.view.wants, margin_w=50.0, step_w=20.0,
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
