"""Records that cannot outlive their writer, on a real etcd with running daemons.

A claim, grant, record, pending seat or host feed mark lives under its writer's lease; one
found with no lease has no live writer (put by hand, or over a daemon's key): it is left
out (``circuit_record_unleased``, once per key) and holds no host at its floors, nor stops
one for good. Before: a made-up ``claims/NAME`` with a large reserve plus one deleted seat
held that host at its floors until the key was removed; an overwritten claim made its host
exit 11 at every restart (the unit does not restart on 11: the host stayed down); one
``down/`` mark on a flat circuit made ``circuit join`` fail with "does not fit".
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from support.circuit import EtcdCluster, Host, circuit_status, etcd_edit, granted, init_circuit, start_hosts, stop_hosts
from support.timings import LEASE_TTL_S

pytestmark = pytest.mark.slow  # real etcd and daemons: the full run (CI) covers them

BUDGET_W = 4000.0  # room for a third seat beside two busy hosts' grants
RESERVE_W = 800.0
TTL_S = LEASE_TTL_S

GHOST_CLAIM = {"machine_id": "e" * 32, "boot_id": "b", "pid": 7, "watchdog_s": 1, "fallback_s": 1, "reserve_w": 2000}
UNLEASED = {
    "claims/ghost": json.dumps(GHOST_CLAIM).encode(),
    "grants/ghost": b'{"grant_w": 1000}',
    "pending/ghost": b'{"reserve_w": 900}',
    "wants/ghost": b'{"want_w": 3000}',
    "marks/ghost": b'{"feed": "A", "by": "ghost"}',
}


def _seat_w(eps: list[str], host: str) -> float | None:
    return {r["host"]: r for r in circuit_status(eps, "lab")["hosts"]}.get(host, {}).get("seat_w")


def test_keys_without_a_lease_hold_no_host_down(etcd1: EtcdCluster, tmp_path: Path) -> None:
    eps = etcd1.endpoints
    init_circuit(eps, "lab", BUDGET_W, TTL_S)
    hosts = [Host(f"h{i}", tmp_path, eps, "lab", reserve_w=RESERVE_W) for i in range(2)]
    try:
        start_hosts(hosts)
        hosts[0].daemon.wait_for(lambda: granted(hosts, 2), "grants on both hosts", 30)

        # 1. A made-up claim (2000 W reserve, no seat, no lease) and h1's seat deleted in
        #    one write: h1 seats itself again; nobody is held at the floors.
        edited = time.monotonic()
        etcd_edit(eps, "lab", delete=("seats/h1",), put=UNLEASED)
        hosts[1].daemon.wait_for(lambda: _seat_w(eps, "h1") == RESERVE_W, "h1 seated again", 15)
        reseated_s = time.monotonic() - edited
        time.sleep(2.0)  # many rounds over the unleased keys
        for h in hosts:
            assert h.metric("powerbudgetd_circuit_at_floors") == 0
            said = [e["key"].split("/lab/", 1)[1] for e in h.daemon.events("circuit_record_unleased")]
            assert sorted(said) == sorted(UNLEASED), said  # once per key, whatever the rounds
        status = circuit_status(eps, "lab")
        assert "ghost" not in {r["host"] for r in status["hosts"]}  # its made-up grant and claim not counted
        hosts[0].daemon.wait_for(lambda: granted(hosts, 2), "both granted beside the unleased keys", 15)

        # 2. A feed mark on a flat circuit (no tree: no feed to lose): ignored, and a new
        #    host's join is not refused as "does not fit".
        etcd_edit(eps, "lab", put={"down/A": b'{"by": "someone"}'})
        newcomer = Host("h2", tmp_path, eps, "lab", reserve_w=RESERVE_W)
        newcomer.join()
        assert _seat_w(eps, "h2") == RESERVE_W
        hosts[0].daemon.wait_for(lambda: granted(hosts, 2), "still granted with the stray mark", 15)

        # 3. h0 stopped; its claim overwritten without a lease by another machine's
        #    identity. Started again, it takes its name back (no exit 11) and shares.
        hosts[0].stop()
        claim = {**GHOST_CLAIM, "machine_id": "f" * 32, "reserve_w": RESERVE_W}
        etcd_edit(eps, "lab", put={"claims/h0": json.dumps(claim).encode()})
        hosts[0].start()
        hosts[0].wait_ready()
        hosts[0].daemon.wait_for(lambda: hosts[0].metric("powerbudgetd_circuit_claim_held") == 1, "h0's claim again", 15)
        hosts[0].daemon.wait_for(lambda: granted(hosts[:1], 1), "h0 granted again", 20)
        assert hosts[0].proc is not None and hosts[0].proc.poll() is None
        assert not hosts[0].daemon.events("circuit_duplicate_host")
        ident = {r["host"]: r for r in circuit_status(eps, "lab")["hosts"]}["h0"]["identity"]
        assert hosts[0].machine_id in ident
    finally:
        stop_hosts(hosts)
    print(f"\n[circuit figures] unleased keys: h1 seated again {reseated_s:.2f} s after its seat was deleted beside "
          "a made-up 2000 W claim (before: at its floors until the key was removed); h0 restarted over an "
          "overwritten claim: claimed and granted (before: exit 11)")
