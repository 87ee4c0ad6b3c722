"""A circuit that is a power tree, in a real etcd: ``circuit init --tree`` stores it with
the spec, ``circuit join`` seats only hosts it names and only where every node on their
cords' paths has room (failover counted), ``circuit status`` shows each node, and hosts
under different branches raising at once never overfill their shared parent.

Tree: a 10 kW root over two 7 kW branches, A and B; hosts a1, a2 under A and b1, b2
under B, 1 kW seats each. Each host alone may raise to 3 kW above its seat (A: 1 + 1 + 3
<= 7 kW; the root: 4 + 3 <= 10 kW); all four at once would put 16 kW on the root and
8 kW on each branch.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest

from powerbudgetd.channels.circuit.store import CircuitStore, HostRecord, Read
from powerbudgetd.core.nodemeter import MeterReport
from powerbudgetd.core.circuit import raise_allowed
from support.circuit import EXE, PAIR_TREE, ROUND_S, EtcdCluster, Sharer, circuit_cli, etcd_edit, rounds_until
from support.timings import TREE_TTL_S

pytestmark = pytest.mark.slow  # real etcd members: the full run (CI) covers it

TREE = """
[nodes.root]
kind = "panel"
budget_w = 10000

[nodes.A]
kind = "pdu"
parent = "root"
budget_w = 7000

[nodes.B]
kind = "pdu"
parent = "root"
budget_w = 7000

[hosts.a1]
cords = { A = 1.0 }
reserve_w = 1000

[hosts.a2]
cords = { A = 1.0 }
reserve_w = 1000

[hosts.b1]
cords = { B = 1.0 }
reserve_w = 1000

[hosts.b2]
cords = { B = 1.0 }
reserve_w = 1000
"""
HOSTS = ("a1", "a2", "b1", "b2")


def _tree_file(tmp_path: Path, text: str = TREE) -> Path:
    path = tmp_path / "tree.toml"
    path.write_text(text)
    return path


def _join(eps: list[str], tmp_path: Path, host: str, reserve_w: float) -> subprocess.CompletedProcess[str]:
    """``circuit join`` with a config seating ``host`` at ``reserve_w`` (wall W; the
    simulated bank's floors, 4 x 150 W through the feed model, fit under 1 kW)."""
    cfg = tmp_path / f"{host}.toml"
    cfg.write_text(f'budget_w = 1200\n[circuit]\nname = "row"\nendpoints = {json.dumps(eps)}\nhost = "{host}"\n'
                   f"reserve_w = {reserve_w}\npsu_efficiency = 0.9\nhost_w = 100\n")
    return subprocess.run([EXE, "circuit", "join", "--backend", "sim", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60)


def test_init_join_and_status_on_a_tree(etcd1: EtcdCluster, tmp_path: Path) -> None:
    eps = etcd1.endpoints
    r = circuit_cli(eps, "init", "--name", "row", "--tree", str(_tree_file(tmp_path)), "--ttl", str(TREE_TTL_S))
    assert r.returncode == 0, r.stderr
    assert "budget 10000 W" in r.stdout and "3 nodes, 4 hosts" in r.stdout
    for host in HOSTS[:3]:
        r = _join(eps, tmp_path, host, 1000)
        assert r.returncode == 0, r.stderr
    r = _join(eps, tmp_path, "stranger", 1000)
    assert r.returncode != 0 and "stranger is not in its power tree" in r.stderr, r.stderr
    # A feed mark the tree cannot use (this tree has no feed pair: no feed to lose) refuses
    # the join as what it is, naming the mark, not as a seat that "does not fit".
    etcd_edit(eps, "row", put={"down/A": b'{"by": "ops"}'})
    r = _join(eps, tmp_path, "b2", 1000)
    assert r.returncode != 0 and "feed marks cannot be used" in r.stderr and "down" in r.stderr, r.stderr
    assert "does not fit" not in r.stderr, r.stderr
    etcd_edit(eps, "row", delete=("down/A",))
    # b2's seat of 6.5 kW fits the root (3 + 6.5 <= 10 kW) but not branch B (1 + 6.5 > 7 kW).
    r = _join(eps, tmp_path, "b2", 6500)
    assert r.returncode != 0 and "node B over by 500 W" in r.stderr, r.stderr

    r = circuit_cli(eps, "status", "--name", "row")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.split()[:4] == ["root", "panel", "10000", "3000"] for line in lines), r.stdout
    assert any(line.split()[:4] == ["A", "pdu", "7000", "2000"] for line in lines), r.stdout
    doc = json.loads(circuit_cli(eps, "status", "--name", "row", "--json").stdout)
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert nodes["B"]["committed_w"] == 1000 and nodes["B"]["headroom_w"] == 6000 and nodes["B"]["depth"] == 1
    assert doc["within_budget"] and doc["tree_error"] is None

    # A tree whose branch A is smaller than the seats held under it (though the file's
    # own planned seats fit it) is refused, naming the node.
    smaller = _tree_file(tmp_path, TREE.replace("budget_w = 7000", "budget_w = 1500", 1).replace(
        "reserve_w = 1000", "reserve_w = 500"))
    r = circuit_cli(eps, "init", "--name", "row", "--tree", str(smaller), "--force")
    assert r.returncode != 0 and "node A over by 500 W" in r.stderr, r.stderr


async def _race(endpoints: list[str], rounds: int) -> tuple[list[int], int]:
    """Every round, the four hosts read the circuit and each raises its grant to 3 kW
    at once (each store on its own etcd member where there are several), retrying on a
    fresh read while the raise still fits; after each round every node is checked in
    the records. Returns how many raises landed each round, and how many transactions
    failed their compares (computed from a read another raise had made stale)."""
    stores = [CircuitStore(endpoints[i % len(endpoints):] + endpoints[:i % len(endpoints)], "row", timeout_s=5)
              for i in range(len(HOSTS))]
    try:
        leases = [(await s.grant_lease(30))[0] for s in stores]
        landed = []
        stale = 0
        for _ in range(rounds):
            for s, host in zip(stores, HOSTS, strict=True):
                await s.lower_grant(host, 0.0, 0)
            reads = [await s.read() for s in stores]  # all at one revision: nothing changes meanwhile

            async def raise_3kw(i: int, read: Read) -> bool:
                nonlocal stale
                s, host = stores[i], HOSTS[i]
                for _ in range(10):
                    if not raise_allowed(read.view, host, 3000.0):
                        return False
                    if await s.raise_grant(read, host, 3000.0, leases[i]):
                        return True
                    stale += 1
                    read = await s.read()
                return False

            landed.append(sum(await asyncio.gather(*(raise_3kw(i, reads[i]) for i in range(len(HOSTS))))))
            after = await stores[0].read()
            assert after.view.holds(), after.view.nodes_over_w()
            assert after.view.tree is not None and not after.view.nodes_over_w()
        return landed, stale
    finally:
        for s in stores:
            await s.close()


def test_hosts_under_different_branches_raising_at_once_never_overfill_the_shared_parent(
        etcd3: EtcdCluster, tmp_path: Path) -> None:
    eps = etcd3.endpoints
    assert circuit_cli(eps, "init", "--name", "row", "--tree", str(_tree_file(tmp_path))).returncode == 0
    for host in HOSTS:
        assert _join(eps, tmp_path, host, 1000).returncode == 0
    landed, stale = asyncio.run(_race(eps, rounds=40))
    # The root takes 6 kW above the 4 kW of seats: two raises of 3 kW, never three.
    # Branch A (or B) takes 5 kW above its seats: one of its hosts' raises, never both.
    assert set(landed) == {2}, landed
    # All four computed their raise from one revision: after the first lands, the other
    # three transactions fail their compares and read again (the guard at work).
    assert stale >= 3 * 40, stale
    print(f"\n[circuit figures] tree race: 40 rounds x 4 hosts raising at once on 3 etcd members: "
          f"raises landed per round {sorted(set(landed))}, {stale} transactions refused as stale, "
          "every node within budget after each")


async def _hosts_through_a_feed_loss(eps: list[str]) -> dict[str, float]:
    """Four in-process hosts, each a store client doing a daemon's grant round every
    ROUND_S (read, the grant policy's target, raise by transaction or lower), each
    wanting 3 kW above its 1 kW seat: normally each feed carries half of each host, so
    all get 3 kW (A and B at 8 kW). Then feed A is marked lost: B carries every host
    whole and each grant must come down to 1 kW. Returns the times (s) measured, the
    shed from when ``circuit feed-down`` returned (the loss recorded in etcd)."""
    hosts = ("h1", "h2", "h3", "h4")
    sharers = [Sharer(eps, h) for h in hosts]
    try:
        for s in sharers:
            await s.join(1000.0, 3000.0)
        out = {"settle_s": await rounds_until(sharers, lambda v: all(v.grants.get(h) == 3000.0 for h in hosts), 10.0)}
        assert circuit_cli(eps, "feed-down", "--name", "row", "A").returncode == 0
        out["shed_s"] = await rounds_until(sharers, lambda v: v.lost == "A" and v.holds(), 5.0)
        view = (await sharers[0].store.read()).view
        assert all(view.grants[h] == 1000.0 for h in hosts), view.grants
        status = circuit_cli(eps, "status", "--name", "row")
        assert "FEED LOST: A" in status.stdout and status.returncode == 0, status.stdout
        doc = json.loads(circuit_cli(eps, "status", "--name", "row", "--json").stdout)
        nodes = {n["node"]: n for n in doc["nodes"]}
        assert nodes["A"]["dead"] and nodes["B"]["flow_w"] == 8000 and doc["feed_lost"] == "A"
        r = circuit_cli(eps, "feed-down", "--name", "row", "B")
        assert r.returncode != 0 and "feed A is down already" in r.stderr, r.stderr
        assert circuit_cli(eps, "feed-up", "--name", "row", "A").returncode == 0
        r = circuit_cli(eps, "feed-up", "--name", "row", "A")
        assert r.returncode != 0 and "feed A was not marked lost" in r.stderr, r.stderr
        # Back: the grants above the loss's division are raised again (the release hold
        # is for lowering only), to 3 kW each.
        out["back_s"] = await rounds_until(
            sharers, lambda v: v.lost is None and all(v.grants.get(h) == 3000.0 for h in hosts), 10.0)
        return out
    finally:
        for s in sharers:
            await s.store.close()


def test_a_feed_marked_lost_sheds_every_grant_on_the_surviving_side_within_a_round(
        etcd3: EtcdCluster, tmp_path: Path) -> None:
    eps = etcd3.endpoints
    assert circuit_cli(eps, "init", "--name", "row", "--tree", str(_tree_file(tmp_path, PAIR_TREE))).returncode == 0
    r = circuit_cli(eps, "feed-down", "--name", "row", "root")
    assert r.returncode != 0 and "root is no side of a feed pair (feeds: A, B)" in r.stderr, r.stderr
    times = asyncio.run(_hosts_through_a_feed_loss(eps))
    assert times["shed_s"] <= 2.0, times  # the pair's stated shed_s
    print(f"\n[circuit figures] feed loss (oversubscribed A/B, 4 hosts, 3 etcd members, {ROUND_S} s rounds): "
          f"grants settled in {times['settle_s']:.2f} s; feed A marked lost: every node within budget where the "
          f"draw now flows after {times['shed_s']:.2f} s (stated shed_s 2 s); back at 3 kW {times['back_s']:.2f} s "
          "after feed-up")


CLASS_TREE = """
[nodes.pdu]
kind = "pdu"
budget_w = 6000

[hosts]
serving = { cords = { pdu = 1.0 }, reserve_w = 1000, priority = 1 }
batch-1 = { cords = { pdu = 1.0 }, reserve_w = 1000 }
batch-2 = { cords = { pdu = 1.0 }, reserve_w = 1000 }
"""


async def _classes(eps: list[str]) -> dict[str, float]:
    """Three seats of 1 kW (joined before work starts); the two batch hosts (class 0)
    take the PDU's 3 kW above the seats while the serving host (class 1) wants nothing;
    then it wants 3 kW: the batch hosts are lowered (after their 1 s release hold) and it
    takes its whole want; the node never over."""
    batch = [Sharer(eps, h, release_hold_s=1.0) for h in ("batch-1", "batch-2")]
    serving = Sharer(eps, "serving", release_hold_s=1.0)

    def within(view) -> None:
        assert view.holds(), view.nodes_over_w()

    try:
        await serving.join(1000.0, 0.0)
        for s in batch:
            await s.join(1000.0, 3000.0)
        out = {"batch_s": await rounds_until(
            [*batch, serving], lambda v: v.grants.get("batch-1") == v.grants.get("batch-2") == 1500.0, 10.0, within)}
        await serving.want(3000.0)
        out["served_s"] = await rounds_until(
            [*batch, serving], lambda v: v.grants.get("serving") == 3000.0 and not v.grants.get("batch-1")
            and not v.grants.get("batch-2"), 15.0, within)
        return out
    finally:
        for s in [*batch, serving]:
            await s.store.close()


def test_a_short_node_lowers_the_lower_class_first_and_the_higher_keeps_its_want(
        etcd1: EtcdCluster, tmp_path: Path) -> None:
    eps = etcd1.endpoints
    assert circuit_cli(eps, "init", "--name", "row", "--tree", str(_tree_file(tmp_path, CLASS_TREE))).returncode == 0
    times = asyncio.run(_classes(eps))
    print(f"\n[circuit figures] classes on a 6 kW PDU (3 kW of seats): two batch hosts at 1.5 kW grants each after "
          f"{times['batch_s']:.2f} s; the serving host (class 1) then wants 3 kW: it holds 3 kW and the batch hosts 0 "
          f"after {times['served_s']:.2f} s (1 s release hold), the PDU within budget every round")


METERED_TREE = TREE.replace('kind = "pdu"\nparent = "root"\nbudget_w = 7000\n',
                            'kind = "pdu"\nparent = "root"\nbudget_w = 7000\nmeter = "ups:pdu-a@nut1"\n', 1).replace(
                                "budget_w = 10000", "budget_w = 16000")


async def _unmanaged_load(eps: list[str]) -> dict:
    """Four hosts each wanting 3 kW above a 1 kW seat (the root at 16 kW: each branch's
    7 kW binds, 2.5 kW each), each drawing its seat plus grant (published as its
    record's draw); branch A's meter, published by a1, reads what a1 and a2 draw, then 2
    kW of storage more. The hosts under A come down by 1 kW each; b1 and b2 are not
    lowered; A's committed load plus the 2 kW stays within its 7 kW. A reading gone
    stale is ignored (said in the status) and the grants come back."""
    sharers = {h: Sharer(eps, h, release_hold_s=1.0) for h in HOSTS}
    stale_by = {"s": 0.0}  # how far in the past a1 stamps its report
    extra = {"w": 0.0}

    async def publish() -> None:
        for s in sharers.values():
            await s.store.put_record(s.host, HostRecord(want_w=3000.0, draw_w=s.draw_w()), s.lease)
        value = sharers["a1"].draw_w() + sharers["a2"].draw_w() + extra["w"]
        await sharers["a1"].store.put_meter(
            MeterReport("A", "a1", value, 0.5, 0.5, 2.0, time.time() - stale_by["s"]), sharers["a1"].lease)

    def within(view) -> None:
        assert view.holds(), view.nodes_over_w()

    try:
        for s in sharers.values():
            await s.join(1000.0, 3000.0)
        ring = list(sharers.values())

        async def rounds(done, limit_s: float) -> float:
            start = time.monotonic()
            while time.monotonic() - start < limit_s:
                await publish()
                await asyncio.gather(*(s.round() for s in ring))
                read = await ring[0].store.read()
                within(read.view)
                if done(read):
                    return time.monotonic() - start
                await asyncio.sleep(ROUND_S)
            raise AssertionError((await ring[0].store.read()).view)

        out: dict = {}
        await rounds(lambda r: all(r.view.grants.get(h) == 2500.0 for h in HOSTS), 15.0)
        extra["w"] = 2000.0
        out["lowered_s"] = await rounds(lambda r: r.view.grants.get("a1") == r.view.grants.get("a2") == 1500.0
                                        and r.view.grants.get("b1") == r.view.grants.get("b2") == 2500.0, 15.0)
        # the draws and the meter after the lowering, published again before each read: a
        # status command's start-up on a loaded machine can outlast the reading's 10 s
        await publish()
        out["status"] = json.loads(circuit_cli(eps, "status", "--name", "row", "--json").stdout)
        await publish()
        out["text"] = circuit_cli(eps, "status", "--name", "row").stdout
        stale_by["s"] = 3600.0  # published with a stamp an hour past: stale
        out["back_s"] = await rounds(lambda r: r.view.grants.get("a1") == r.view.grants.get("a2") == 2500.0, 15.0)
        out["stale"] = json.loads(circuit_cli(eps, "status", "--name", "row", "--json").stdout)
        return out
    finally:
        for s in sharers.values():
            await s.store.close()


def test_an_unmanaged_load_under_a_metered_node_lowers_the_hosts_under_it(etcd1: EtcdCluster, tmp_path: Path) -> None:
    eps = etcd1.endpoints
    assert circuit_cli(eps, "init", "--name", "row", "--tree", str(_tree_file(tmp_path, METERED_TREE))).returncode == 0
    out = asyncio.run(_unmanaged_load(eps))
    nodes = {n["node"]: n for n in out["status"]["nodes"]}
    a = nodes["A"]
    # a1, a2 at 1 + 1.5 kW each: 5 kW reported, 7 kW measured, 2 kW unmanaged: 7 kW of 7 kW
    assert (a["meter"], a["measured_w"], a["reported_w"], a["unmanaged_w"]) == ("ups:pdu-a@nut1", 7000, 5000, 2000), a
    assert a["hosts_budget_w"] == 5000 and a["budget_w"] == 7000 and a["committed_w"] == 5000
    assert a["meter_fresh"] and a["meter_host"] == "a1" and a["within_budget"] and a["meter_note"] is None
    assert nodes["root"]["unmanaged_w"] == 2000 and nodes["B"]["unmanaged_w"] == 0 and nodes["B"]["meter"] is None
    line = next(x for x in out["text"].splitlines() if x.split()[:1] == ["A"])
    assert line.split()[-4:-1] == ["7000", "5000", "2000"], out["text"]
    assert "measured W" in out["text"] and "unmanaged W" in out["text"]
    stale = {n["node"]: n for n in out["stale"]["nodes"]}["A"]
    assert stale["meter_fresh"] is False and stale["unmanaged_w"] == 0 and "stale" in stale["meter_note"]
    print(f"\n[circuit figures] unmanaged load: 2 kW beside a1, a2 under a metered 7 kW PDU: the hosts under it "
          f"lowered in {out['lowered_s']:.2f} s; a stale reading ignored, the grants back up in {out['back_s']:.2f} s")
