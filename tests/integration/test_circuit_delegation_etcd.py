"""Delegated subtrees in a real etcd (``core.delegation``, ``store.put_delegation``): a
node's lease of watts is written by a transaction that checks the parent's sum and
compares what that depends on (not the raises under other leases); then raises under different delegated nodes compare disjoint keys and
both land from one revision, while two raises under the same node still conflict.

Tree: a 10 kW root over two 7 kW PDUs, A and B, both ``delegate = true``; hosts a1, a2
under A and b1, b2 under B, 1 kW seats each.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from powerbudgetd.channels.circuit.store import CircuitStore
from powerbudgetd.core.tree import Host, Node, PowerTree
from powerbudgetd.service.circuitcmd import status_doc
from support.circuit import EtcdCluster

pytestmark = pytest.mark.slow  # real etcd members: the full run (CI) covers it

HOSTS = ("a1", "a2", "b1", "b2")


def _tree() -> PowerTree:
    nodes = {"root": Node("root", 10_000, None, "panel"), "A": Node("A", 7_000, "root", "pdu", delegate=True),
             "B": Node("B", 7_000, "root", "pdu", delegate=True)}
    return PowerTree(nodes, {h: Host(h, {h[0].upper(): 1.0}, 1000.0) for h in HOSTS})


async def _scenario(eps: list[str]) -> None:
    stores = {h: CircuitStore(eps[i % len(eps):] + eps[:i % len(eps)], "row", timeout_s=5) for i, h in enumerate(HOSTS)}
    try:
        admin = stores["a1"]
        assert await admin.init(10_000, 30, tree=_tree())
        leases = {h: (await s.grant_lease(30))[0] for h, s in stores.items()}
        for h, s in stores.items():
            assert await s.register_seat(await s.read(), h, 1000.0)

        # A's lease: what the root can spare is 10 kW - B's 2 kW of seats = 8 kW, but A's
        # own budget is 7 kW; 7.5 kW is refused by the arithmetic, 5 kW taken.
        read = await admin.read()
        assert not await admin.put_delegation(read, "A", 7_500.0, "a1")
        assert not await admin.put_delegation(read, "root", 5_000.0, "a1")  # not marked
        assert await admin.put_delegation(read, "A", 5_000.0, "a1")
        assert not await admin.put_delegation(read, "A", 4_000.0, "a1")  # from a stale read: fails its compare
        read = await stores["b1"].read()
        assert not await stores["b1"].put_delegation(read, "B", 5_001.0, "b1")  # the root: 5000 + 5001 > 10 kW
        assert await stores["b1"].put_delegation(read, "B", 5_000.0, "b1")
        read = await admin.read()
        assert read.delegations == {"A": 5_000.0, "B": 5_000.0}

        # One revision; a1 and b1 raise at once: disjoint keys, both land. a2's raise from
        # the same revision fails its compare (a1's grant is in its zone).
        reads = {h: await stores[h].read() for h in HOSTS}
        assert len({r.revision for r in reads.values()}) == 1
        a1, b1 = await asyncio.gather(stores["a1"].raise_grant(reads["a1"], "a1", 3_000.0, leases["a1"]),
                                      stores["b1"].raise_grant(reads["b1"], "b1", 3_000.0, leases["b1"]))
        assert a1 and b1
        assert not await stores["a2"].raise_grant(reads["a2"], "a2", 1_000.0, leases["a2"])
        # Read afresh, a2 may raise only within A's lease: 5 kW - 2 kW seats - 3 kW = 0.
        fresh = await stores["a2"].read()
        assert not await stores["a2"].raise_grant(fresh, "a2", 100.0, leases["a2"])
        after = await admin.read()
        assert after.view.holds() and after.view.grants == {"a1": 3_000.0, "b1": 3_000.0}
        # circuit status shows each lease and what is left of it (A: 5 kW - 2 kW seats - 3 kW).
        rows = {n["node"]: n for n in status_doc("row", after, {})["nodes"]}
        assert (rows["A"]["lease_w"], rows["A"]["lease_free_w"], rows["B"]["lease_free_w"]) == (5_000.0, 0.0, 0.0)
        assert rows["root"]["lease_w"] is None and not rows["root"]["delegate"] and rows["A"]["within_budget"]
        # A lease below what its subtree holds is refused; one above it is not.
        assert not await admin.put_delegation(after, "A", 4_999.0, "a1")

        # A lease resize and a raise under the other lease, from one revision: both land
        # (the resize compares the grants charged outside any lease on A's path: none).
        await stores["a1"].lower_grant("a1", 2_000.0, leases["a1"])
        await stores["b1"].lower_grant("b1", 2_000.0, leases["b1"])
        read = await admin.read()
        assert await stores["b1"].raise_grant(await stores["b1"].read(), "b1", 2_500.0, leases["b1"])
        assert await admin.put_delegation(read, "A", 4_500.0, "a1")
        assert not await admin.put_delegation(read, "A", 4_400.0, "a1")  # its own record changed since
        after = await admin.read()
        assert after.delegations["A"] == 4_500.0 and after.view.grants["b1"] == 2_500.0 and after.view.holds()

        # The raise path without delegation: both computed from one revision, the second
        # fails (one key range for the whole tree).
        assert await admin.init(10_000, 30, force=True, tree=_tree())
        assert (await admin.read()).delegations == {}  # a new spec: every lease of watts removed
        for h in ("a1", "b1"):
            await stores[h].lower_grant(h, 0.0, leases[h])
        reads = {h: await stores[h].read() for h in ("a1", "b1")}
        landed = [await stores[h].raise_grant(reads[h], h, 1_000.0, leases[h]) for h in ("a1", "b1")]
        assert landed == [True, False]
    finally:
        for s in stores.values():
            await s.close()


def test_raises_under_different_delegated_nodes_do_not_conflict(etcd3: EtcdCluster, tmp_path: Path) -> None:
    asyncio.run(_scenario(etcd3.endpoints))


def test_a_host_s_role_writes_the_leases_above_it_and_no_other(etcd1: EtcdCluster, tmp_path: Path) -> None:
    """``circuit roles --tree``: a1 (under A) may write A's lease of watts, not B's."""
    import subprocess

    from powerbudgetd.channels.circuit.store import StoreRefused
    from support.circuit import EXE
    from test_circuit_least_privilege import PASSWORD, apply_roles

    tree = tmp_path / "tree.toml"
    tree.write_text("[nodes.root]\nbudget_w = 10000\n" + "".join(
        f'[nodes.{n}]\nparent = "root"\nbudget_w = 7000\ndelegate = true\n' for n in "AB") +
        '[hosts.h0]\ncords = { A = 1.0 }\nreserve_w = 1000\n[hosts.h1]\ncords = { B = 1.0 }\nreserve_w = 1000\n')
    eps = etcd1.endpoints
    roles = subprocess.run([EXE, "circuit", "roles", "--name", "lab", "--host", "h0", "--host", "h1", "--tree",
                            str(tree)], capture_output=True, text=True, timeout=30)
    assert roles.returncode == 0, roles.stderr
    assert "powerbudgetd-lab-h0 readwrite /powerbudgetd/circuits/lab/delegations/A" in roles.stdout
    assert "powerbudgetd-lab-h0 readwrite /powerbudgetd/circuits/lab/delegations/B" not in roles.stdout
    apply_roles(eps, roles.stdout)
    tree_obj = PowerTree({"root": Node("root", 10_000), "A": Node("A", 7_000, "root", delegate=True),
                          "B": Node("B", 7_000, "root", delegate=True)},
                         {"h0": Host("h0", {"A": 1.0}, 1000.0), "h1": Host("h1", {"B": 1.0}, 1000.0)})

    async def go() -> None:
        ops = CircuitStore(eps, "lab", timeout_s=5, username="ops", password=PASSWORD["ops"])
        h0 = CircuitStore(eps, "lab", timeout_s=5, username="h0", password=PASSWORD["h0"])
        try:
            assert await ops.init(10_000, 30, tree=tree_obj)
            assert await h0.put_delegation(await h0.read(), "A", 3_000.0, "h0")
            with pytest.raises(StoreRefused):
                await h0.put_delegation(await h0.read(), "B", 3_000.0, "h0")
            assert (await h0.read()).delegations == {"A": 3_000.0}
        finally:
            await ops.close()
            await h0.close()

    asyncio.run(go())


def _outlet_tree() -> PowerTree:
    """The root over A and B (delegated), each PDU over an outlet per host (delegated too):
    oa1 and oa2 under A, ob1 under B; a1, a2 and b1 on them, 1 kW seats."""
    nodes = {"root": Node("root", 10_000, None, "panel"), "A": Node("A", 7_000, "root", "pdu", delegate=True),
             "B": Node("B", 7_000, "root", "pdu", delegate=True)}
    for h in ("a1", "a2", "b1"):
        nodes[f"o{h}"] = Node(f"o{h}", 3_000, h[0].upper(), "outlet", delegate=True)
    return PowerTree(nodes, {h: Host(h, {f"o{h}": 1.0}, 1000.0) for h in ("a1", "a2", "b1")})


async def _outlets(eps: list[str]) -> None:
    hosts = ("a1", "a2", "b1")
    stores = {h: CircuitStore(eps[i % len(eps):] + eps[:i % len(eps)], "hall", timeout_s=5) for i, h in enumerate(hosts)}
    try:
        assert await stores["a1"].init(10_000, 30, tree=_outlet_tree())
        leases = {h: (await s.grant_lease(30))[0] for h, s in stores.items()}
        for h, s in stores.items():
            assert await s.register_seat(await s.read(), h, 1000.0)
        for node, watts, by in (("A", 5_000.0, "a1"), ("B", 5_000.0, "b1"), ("oa1", 2_000.0, "a1"),
                                ("oa2", 2_000.0, "a2"), ("ob1", 2_000.0, "b1")):
            assert await stores[by].put_delegation(await stores[by].read(), node, watts, by), node

        # From one revision: outlets under different PDUs grow, both land; a2's outlet
        # beside a1's fails its compare (from that read it fit: 3000 + 2000 <= A's 5000;
        # after a1's growth it would be 6000).
        reads = {h: await stores[h].read() for h in hosts}
        assert len({r.revision for r in reads.values()}) == 1
        grown = await asyncio.gather(stores["a1"].put_delegation(reads["a1"], "oa1", 3_000.0, "a1"),
                                     stores["b1"].put_delegation(reads["b1"], "ob1", 3_000.0, "b1"))
        assert grown == [True, True]
        assert not await stores["a2"].put_delegation(reads["a2"], "oa2", 3_000.0, "a2")
        # Read afresh, it no longer fits A's lease.
        assert not await stores["a2"].put_delegation(await stores["a2"].read(), "oa2", 3_000.0, "a2")

        # Raises under one PDU, each within its own outlet's lease, from one revision:
        # disjoint keys, all land (without outlets, a1 and a2 compare each other's grant).
        reads = {h: await stores[h].read() for h in hosts}
        assert len({r.revision for r in reads.values()}) == 1
        landed = await asyncio.gather(*(stores[h].raise_grant(reads[h], h, w, leases[h])
                                        for h, w in (("a1", 2_000.0), ("a2", 1_000.0), ("b1", 2_000.0))))
        assert landed == [True, True, True]
        after = await stores["a1"].read()
        assert after.view.grants == {"a1": 2_000.0, "a2": 1_000.0, "b1": 2_000.0}
        charges = after.charges()
        assert charges is not None and not charges.over_w(after.held_w()) and after.view.holds()
        # A's lease cannot shrink below what its outlets hold (3000 + 2000 W), nor grow past the root's room.
        assert not await stores["a1"].put_delegation(after, "A", 4_999.0, "a1")
        assert await stores["a1"].put_delegation(after, "A", 5_000.0, "a1")  # unchanged figure: lands
    finally:
        for s in stores.values():
            await s.close()


def test_outlet_leases_under_a_pdu_lease_grow_and_raise_without_conflict(etcd3: EtcdCluster) -> None:
    asyncio.run(_outlets(etcd3.endpoints))
