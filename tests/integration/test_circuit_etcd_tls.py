"""The circuit over TLS with client certificates, against a real etcd that requires them
(``--client-cert-auth``), certificates made with openssl in the test."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from powerbudgetd.channels.circuit.store import CircuitStore, StoreUnavailable, Tls
from support.circuit import EXE, EtcdCluster, make_certs
from support.timings import LEASE_TTL_S

pytestmark = pytest.mark.slow  # a real etcd: the full run (CI) covers it


@pytest.fixture
def tls_etcd(tmp_path: Path):
    cluster = EtcdCluster(tmp_path, 1, certs=make_certs(tmp_path))
    cluster.start()
    yield cluster
    cluster.stop_all()


def _config(tmp_path: Path, etcd: EtcdCluster, *, client_cert: bool = True) -> Path:
    c = etcd.certs
    assert c is not None
    (tmp_path / "machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    cfg = tmp_path / ("pb.toml" if client_cert else "pb-nocert.toml")
    cert = f'cert_file = "{c.client_cert}"\nkey_file = "{c.client_key}"\n' if client_cert else ""
    cfg.write_text(f"""budget_w = 1200
[circuit]
name = "lab"
endpoints = ["{etcd.endpoints[0]}"]
host = "gpu1"
machine_id_file = "{tmp_path / 'machine-id'}"
reserve_w = 800
psu_efficiency = 0.9
host_w = 100
tls = true
ca_file = "{c.ca}"
{cert}""")
    cfg.chmod(0o600)
    return cfg


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "circuit", *args], capture_output=True, text=True, timeout=60)


def test_the_commands_and_the_store_speak_tls_with_a_client_certificate(tls_etcd: EtcdCluster, tmp_path: Path) -> None:
    cfg = _config(tmp_path, tls_etcd)
    r = _cli("init", "--config", str(cfg), "--budget-w", "3000", "--ttl", str(LEASE_TTL_S))
    assert r.returncode == 0, r.stderr
    r = _cli("join", "--backend", "sim", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    r = _cli("status", "--json", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["budget_w"] == 3000 and [h["host"] for h in doc["hosts"]] == ["gpu1"]

    # Without a client certificate etcd refuses the connection: an error, no traceback.
    r = _cli("status", "--config", str(_config(tmp_path, tls_etcd, client_cert=False)))
    assert r.returncode == 1 and "etcd unavailable" in r.stderr and "Traceback" not in r.stderr, r.stderr

    # Plain text to a TLS endpoint: refused too.
    async def plain() -> None:
        store = CircuitStore(tls_etcd.endpoints, "lab", timeout_s=3)
        try:
            await store.read()
        finally:
            await store.close()

    with pytest.raises(StoreUnavailable):
        asyncio.run(plain())

    c = tls_etcd.certs
    assert c is not None

    async def secure() -> float | None:
        store = CircuitStore(tls_etcd.endpoints, "lab", timeout_s=5, tls=Tls(c.ca, c.client_cert, c.client_key))
        try:
            return (await store.read()).view.seats.get("gpu1")
        finally:
            await store.close()

    assert asyncio.run(secure()) == 800
