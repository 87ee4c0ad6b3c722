"""Roles that fit the circuit's writers, on a real etcd with authentication on.

``powerbudgetd circuit roles`` prints the etcdctl commands; the test runs them with
etcdctl (the users' passwords given on the line where an operator would type them), turns
auth on, and then: the daemons, each with its host's credential, still seat, claim and
raise; a host's credential is refused the spec (the budget), the tree, the operator's
feed marks and every key of another host. (With the role the README gave before, one
prefix readwrite for every host, host gpu1's user put the spec at 10 kW and the other
hosts raised to 2889 W on a 2400 W circuit.)
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from powerbudgetd.channels.circuit.store import CircuitStore, StoreRefused
from support.circuit import EXE, EtcdCluster, Host, granted, start_hosts, stop_hosts

pytestmark = pytest.mark.slow  # a real etcd and daemons: the full run (CI) covers it

# Never skipped: scripts/install-test-deps installs it (Debian: etcd-client).
ETCDCTL = shutil.which("etcdctl") or "etcdctl"
PASSWORD = {"root": "root-pw", "ops": "ops-pw", "h0": "h0-pw", "h1": "h1-pw"}


def etcdctl(endpoints: list[str], *args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [ETCDCTL, f"--endpoints={','.join(endpoints)}", *args]
    if user is not None:
        cmd.insert(1, f"--user={user}:{PASSWORD[user]}")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, env={"ETCDCTL_API": "3"})


def apply_roles(endpoints: list[str], script: str) -> list[str]:
    """Run each etcdctl line of ``script``; ``user add NAME`` gets NAME's password on the
    line (etcdctl would ask for it). Returns the commands run."""
    ran = []
    for line in script.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        words = shlex.split(line)
        assert words[0] == "etcdctl", line
        args = words[1:]
        if args[:2] == ["user", "add"]:
            args.append(f"--new-user-password={PASSWORD[args[2]]}")
        r = etcdctl(endpoints, *args)
        assert r.returncode == 0, f"{line}: {r.stderr}"
        ran.append(line)
    r = etcdctl(endpoints, "auth", "enable")
    assert r.returncode == 0, r.stderr
    return ran


def _store(endpoints: list[str], user: str) -> CircuitStore:
    return CircuitStore(endpoints, "lab", timeout_s=5, username=user, password=PASSWORD[user])


def test_a_host_s_credential_writes_its_own_keys_only_and_the_daemons_still_share(
        etcd1: EtcdCluster, tmp_path: Path) -> None:
    eps = etcd1.endpoints
    roles = subprocess.run([EXE, "circuit", "roles", "--name", "lab", "--host", "h0", "--host", "h1"],
                           capture_output=True, text=True, timeout=30)
    assert roles.returncode == 0, roles.stderr
    ran = apply_roles(eps, roles.stdout)
    assert any("readwrite --prefix=true /powerbudgetd/circuits/lab/" in c for c in ran)  # the operator's
    # Every grant to a host's role: read on the prefix, or readwrite on one key named after it.
    for c in ran:
        if "grant-permission powerbudgetd-lab-h" in c:
            host = c.split()[3].removeprefix("powerbudgetd-lab-")
            assert c.endswith("read --prefix=true /powerbudgetd/circuits/lab/") or (
                "--prefix" not in c and c.endswith("/" + host)) or c.endswith(
                f"readwrite --prefix=true /powerbudgetd/circuits/lab/meters/{host}/"), c

    # The operator (its role) creates the circuit.
    async def init() -> bool:
        store = _store(eps, "ops")
        try:
            return await store.init(2400, 5)
        finally:
            await store.close()

    assert asyncio.run(init())

    hosts = [Host(f"h{i}", tmp_path, eps, "lab", reserve_w=800,
                  extra=f'username = "h{i}"\npassword = "{PASSWORD[f"h{i}"]}"') for i in range(2)]
    for h in hosts:
        h.config.chmod(0o600)
    try:
        start_hosts(hosts)  # circuit join with the host's credential, then the daemons
        hosts[0].daemon.wait_for(lambda: granted(hosts, 2), "a grant on both hosts", 30)
        for h in hosts:
            assert h.metric("powerbudgetd_circuit_claim_held") == 1 and h.metric("powerbudgetd_circuit_seat_fits") == 1
            # Their credentials reach no further than their own keys: nothing to warn of.
            assert not h.daemon.events("circuit_credential_too_broad"), h.daemon.events("circuit_credential_too_broad")
            assert not h.daemon.events("circuit_etcd_refused")

        async def tries() -> dict[str, str]:
            store = _store(eps, "h0")
            refused: dict[str, str] = {}
            attempts = {
                "spec": json.dumps({"budget_w": 10000, "ttl_s": 5}).encode(),
                "tree": b'{"nodes": {}, "hosts": {}, "pairs": []}',
                "down/A": b'{"by": "h0"}',
                **{f"{kind}/h1": b'{"reserve_w": 100, "grant_w": 5000}' for kind in
                   ("seats", "claims", "grants", "wants", "pending", "marks")},
                # another host's meter reports, and one outside its own meters/<host>/ prefix
                "meters/h1/A": b'{"value_w": 100}', "meters/h0x/A": b'{"value_w": 100}',
                "meters/h0": b'{"value_w": 100}',
            }
            try:
                for key, value in attempts.items():
                    try:
                        await store._call(lambda c, k=key, v=value: c.put(store.base + k.encode(), v))
                    except StoreRefused as exc:
                        refused[key] = str(exc)
                # and a delete of another host's seat
                try:
                    await store._call(lambda c: c.delete(store.base + b"seats/h1"))
                except StoreRefused as exc:
                    refused["delete seats/h1"] = str(exc)
                # its own keys it may write
                await store._call(lambda c: c.put(store.base + b"wants/h0", b'{"want_w": 0}'))
                await store._call(lambda c: c.put(store.meter_key("h0", "A"), b'{"value_w": 0}'))
                assert await store.can_write(store.spec_key) is False
                assert await store.can_write(store.key(store.seats, "h0")) is True
                # what the daemon's start-up check asks: nothing only the operator may write
                assert [k for k, _ in store.operator_keys() if await store.can_write(k)] == []
                return refused
            finally:
                await store.close()

        refused = asyncio.run(tries())
        assert sorted(refused) == sorted(["spec", "tree", "down/A", "seats/h1", "claims/h1", "grants/h1", "wants/h1",
                                          "pending/h1", "marks/h1", "delete seats/h1", "meters/h1/A",
                                          "meters/h0x/A", "meters/h0"]), refused
        assert all("permission denied" in why for why in refused.values()), refused

        async def spec_and_seats() -> tuple[float | None, dict[str, float]]:
            store = _store(eps, "ops")
            try:
                read = await store.read()
                return (read.spec.budget_w if read.spec else None), read.view.seats
            finally:
                await store.close()

        budget, seats = asyncio.run(spec_and_seats())
        assert budget == 2400 and seats == {"h0": 800, "h1": 800}

        # A role one grant wider (every host's grants) is named by that check.
        r = etcdctl(eps, "role", "grant-permission", "powerbudgetd-lab-h1", "readwrite", "--prefix=true",
                    "/powerbudgetd/circuits/lab/grants/", user="root")
        assert r.returncode == 0, r.stderr

        async def too_broad() -> list[bytes]:
            store = _store(eps, "h1")
            try:
                return [k for k, _ in store.operator_keys() if await store.can_write(k)]
            finally:
                await store.close()

        assert asyncio.run(too_broad()) == [b"/powerbudgetd/circuits/lab/grants/"]
        hosts[0].daemon.wait_for(lambda: granted(hosts, 2), "both still granted", 15)
    finally:
        stop_hosts(hosts)
    # Each gave its grant back and revoked its lease with its own credential.
    for h in hosts:
        assert h.daemon.events("circuit_left"), h.daemon.tail()
    print(f"\n[circuit figures] least privilege: {len(refused)} writes by h0 outside its own keys refused "
          "(spec, tree, feed mark, h1's seat/claim/grant/record/pending/mark, a delete); both hosts seated and granted")
