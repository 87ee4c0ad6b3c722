"""Real etcd members for the circuit's integration tests (``support.circuit``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.circuit import EtcdCluster


@pytest.fixture
def etcd1(tmp_path: Path):
    """One etcd member on loopback."""
    cluster = EtcdCluster(tmp_path, 1)
    cluster.start()
    yield cluster
    cluster.stop_all()


@pytest.fixture
def etcd3(tmp_path: Path):
    """Three etcd members on loopback (one cluster)."""
    cluster = EtcdCluster(tmp_path, 3)
    cluster.start()
    yield cluster
    cluster.stop_all()
