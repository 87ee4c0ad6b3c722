"""A UPS on battery takes its feed out of the power tree: a daemon whose ``[ups]`` carries
feed A (a real upsd serving a dummy UPS, a real etcd) marks A lost while the UPS is on
battery, as ``circuit feed-down`` would, so that every host re-budgets for feed B alone
before the battery runs out; it lifts the mark once the UPS is back on line for the hold.
A mark left by a daemon stopped during the outage is lifted when it starts again and
finds the UPS on line. An operator's mark is never lifted by a UPS, and with another
feed down already nothing is marked (one feed of the tree at a time) until it comes back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from powerbudgetd.channels.circuit.store import CircuitStore, Read
from support.circuit import PAIR_TREE, EtcdCluster, Host, circuit_cli, start_hosts, stop_hosts
from support.nut import Nut
from support.timings import LEASE_TTL_S, UPS_ONLINE_HOLD_S

pytestmark = pytest.mark.slow  # real etcd, upsd and a daemon: the full run (CI) covers it

HOLD_S = UPS_ONLINE_HOLD_S


def _read(eps: list[str]) -> Read:
    async def read() -> Read:
        store = CircuitStore(eps, "row", timeout_s=5)
        try:
            return await store.read()
        finally:
            await store.close()
    return asyncio.run(read())


def _until(eps: list[str], ok: Callable[[Read], bool], timeout_s: float, what: str) -> float:
    """Seconds until a read of the circuit satisfies ``ok``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if ok(_read(eps)):
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}; down: {_read(eps).down}")


def test_a_ups_on_battery_marks_its_feed_lost_and_lifts_only_its_own_mark(
        etcd1: EtcdCluster, nut: Nut, tmp_path: Path) -> None:
    eps = etcd1.endpoints
    tree = tmp_path / "tree.toml"
    tree.write_text(PAIR_TREE)  # h1 of its four hosts joins
    assert circuit_cli(eps, "init", "--name", "row", "--tree", str(tree), "--ttl", str(LEASE_TTL_S)).returncode == 0
    mark = f"ups {nut.name}@127.0.0.1 seen by h1"  # only the host that made a mark lifts it
    host = Host("h1", tmp_path, eps, "row", reserve_w=1000, extra=f"""[ups]
host = "127.0.0.1"
port = {nut.port}
name = "{nut.name}"
poll_s = 0.3
timeout_s = 1
online_hold_s = {HOLD_S}
feed = "A"
""")
    nut.set("OL")
    start_hosts([host])
    try:
        nut.set("OB DISCHRG", **{"battery.runtime": "600"})
        marked_s = _until(eps, lambda r: r.down == {"A": mark} and r.view.lost == "A", 10.0, "A marked lost")
        nut.set("OL CHRG")
        lifted_s = _until(eps, lambda r: not r.down, 10.0, "A's mark lifted")
        assert lifted_s >= HOLD_S  # back on line for the hold first

        # Stopped during an outage, the mark stays (the safe side); started again with the
        # UPS on line, the daemon lifts its own mark.
        nut.set("OB DISCHRG")
        _until(eps, lambda r: r.down == {"A": mark}, 10.0, "A marked again")
        stop_hosts([host])
        nut.set("OL")
        time.sleep(1.0)
        assert _read(eps).down == {"A": mark}
        host.start()
        host.wait_ready()
        _until(eps, lambda r: not r.down, 10.0, "the mark left before the restart lifted")

        # An operator's mark stays through a UPS outage and its return.
        assert circuit_cli(eps, "feed-down", "--name", "row", "A").returncode == 0
        nut.set("OB DISCHRG")
        time.sleep(1.0)
        nut.set("OL")
        time.sleep(HOLD_S + 1.5)
        down = _read(eps).down
        assert list(down) == ["A"] and down["A"] != mark, down
        assert circuit_cli(eps, "feed-up", "--name", "row", "A").returncode == 0

        # Feed B down already: A is not marked (one feed at a time) until B is back.
        assert circuit_cli(eps, "feed-down", "--name", "row", "B").returncode == 0
        nut.set("OB DISCHRG")
        time.sleep(1.5)
        assert list(_read(eps).down) == ["B"]
        assert circuit_cli(eps, "feed-up", "--name", "row", "B").returncode == 0
        _until(eps, lambda r: r.down == {"A": mark}, 5.0, "A marked once B is back")
        assert len(host.daemon.events("circuit_ups_feed_not_marked")) == 1
        # The next outage with B down is said again (what was said ends with the outage).
        nut.set("OL")
        _until(eps, lambda r: not r.down, 10.0, "A's mark lifted")
        assert circuit_cli(eps, "feed-down", "--name", "row", "B").returncode == 0
        nut.set("OB DISCHRG")
        time.sleep(1.5)
        assert list(_read(eps).down) == ["B"]
        assert len(host.daemon.events("circuit_ups_feed_not_marked")) == 2
        nut.set("OL")
        assert circuit_cli(eps, "feed-up", "--name", "row", "B").returncode == 0

        # A mark whose writer never comes back ends with that writer's lease: stopped
        # during an outage and not started again, its mark is gone once the lease expires.
        _until(eps, lambda r: not r.down, 10.0, "A's mark lifted")
        nut.set("OB DISCHRG")
        _until(eps, lambda r: r.down == {"A": mark}, 10.0, "A marked again")
        lease_ttl_s = host.daemon.events("circuit_lease")[-1]["ttl_s"]
        stop_hosts([host])
        orphan_s = _until(eps, lambda r: not r.down, lease_ttl_s + 5.0, "the stopped writer's mark gone with its lease")
        assert _read(eps).view.lost is None
    finally:
        stop_hosts([host])
    print(f"\n[circuit figures] UPS on battery: feed A marked lost in etcd {marked_s:.2f} s after upsd served OB "
          f"(poll 0.3 s, circuit round 0.2 s); lifted {lifted_s:.2f} s after OL (hold {HOLD_S} s); a stopped writer's "
          f"mark gone {orphan_s:.1f} s after its stop (lease TTL {lease_ttl_s} s)")
