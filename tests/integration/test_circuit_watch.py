"""Hosts learn of the circuit's changes by watching it, not by polling (real etcd, daemon
processes on simulated banks).

Circuit: two hosts x 800 W reserve in 2400 W (a busy host wants 644 W above its reserve),
lease TTL 60 s: a keepalive (and, before the watch, a round) every 10 s, far from the
figures asserted.
"""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.circuit import (
    Checker,
    EtcdCluster,
    Host,
    TcpProxy,
    etcd_edit,
    granted,
    init_circuit,
    start_hosts,
    stop_hosts,
)
from support.daemon import json_lines
from support.wait import wait_until

pytestmark = pytest.mark.slow  # real etcd and daemons: the full run (CI) covers it

BUDGET_W = 2400.0
RESERVE_W = 800.0
TTL_S = 60  # keepalives every 10 s


def _grant(h: Host) -> float:
    return h.metric("powerbudgetd_circuit_grant_watts") or 0.0


def _want(h: Host) -> float:
    return h.metric("powerbudgetd_circuit_want_watts") or 0.0


def _etcd_requests(cluster: EtcdCluster) -> dict[str, float]:
    """etcd's own count of the gRPC requests it handled, by method (all members)."""
    out: dict[str, float] = {}
    for m in cluster.members:
        with urllib.request.urlopen(f"http://{m.endpoint}/metrics", timeout=2) as r:
            text = r.read().decode()
        for fam in text_string_to_metric_families(text):
            if fam.name == "grpc_server_handled":
                for s in fam.samples:
                    if s.name.endswith("_total"):
                        out[s.labels["grpc_method"]] = out.get(s.labels["grpc_method"], 0.0) + s.value
    return out


def _at(h: Host, event: str, **fields: object) -> list[float]:
    """When ``h`` logged ``event`` with ``fields`` (wall clock s, as its log says)."""
    return [datetime.fromisoformat(e["timestamp"]).timestamp() for e in json_lines(h.log.read_text())
            if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())]


def test_a_budget_raised_by_the_operator_is_taken_up_on_the_watch_not_at_the_next_poll(
        etcd1: EtcdCluster, tmp_path: Path) -> None:
    init_circuit(etcd1.endpoints, "lab", BUDGET_W, TTL_S)
    poll_s = 30.0
    hosts = [Host(f"h{i}", tmp_path, etcd1.endpoints, "lab", reserve_w=RESERVE_W, poll_s=poll_s) for i in range(2)]
    try:
        with Checker(hosts, BUDGET_W + 800) as checker:
            start_hosts(hosts)
            wait_until(lambda: granted(hosts, 2), 30, "a grant on both hosts")
            # A want that rises with nothing free is read at the poll's pace, here the
            # keepalive's (10 s): h0's want published, read by h1, whose grant then
            # follows its cards down at its next round: three keepalive periods at most.
            wait_until(lambda: all(380 <= _grant(h) <= 400 and _want(h) >= 600 for h in hosts), 3 * TTL_S / 6 + 30,
                       "the pool split fairly between busy hosts")
            time.sleep(1.0)  # settled: nothing to do until a change or the keepalive
            raised_at = time.time()
            etcd_edit(etcd1.endpoints, "lab", put={"spec": json.dumps({"budget_w": BUDGET_W + 800,
                                                                        "ttl_s": TTL_S}).encode()})
            wait_until(lambda: all(_grant(h) >= 600 for h in hosts), TTL_S / 6, "the new watts taken up", step_s=0.02)
        checker.assert_within()
    finally:
        stop_hosts(hosts)
    taken = [min(t for t in _at(h, "circuit_grant_raised") if t >= raised_at) - raised_at for h in hosts]
    print(f"\n[circuit figures] watch: a raised budget taken up {max(taken):.3f} s after the operator's put "
          f"(poll_s {poll_s:g} s, keepalive every {TTL_S / 6:g} s)")
    # Told by the watch: a woken round (a polling host: 0-10 s after, uniformly).
    assert max(taken) < 0.5, taken


def test_a_settled_host_reads_nothing_between_keepalives(etcd1: EtcdCluster, tmp_path: Path) -> None:
    init_circuit(etcd1.endpoints, "lab", BUDGET_W, TTL_S)
    host = Host("h0", tmp_path, etcd1.endpoints, "lab", reserve_w=RESERVE_W, poll_s=0.5)
    try:
        start_hosts([host])
        wait_until(lambda: _grant(host) >= 600, 30, "the host's want granted")
        time.sleep(2 * TTL_S / 6)  # settled: a keepalive round or two with nothing to do
        before = _etcd_requests(etcd1)
        window_s = 10.0
        time.sleep(window_s)
        after = _etcd_requests(etcd1)
        assert _grant(host) >= 600  # still granted: the renewals went on
    finally:
        stop_hosts([host])
    reads = after.get("Range", 0) - before.get("Range", 0)
    txns = after.get("Txn", 0) - before.get("Txn", 0)
    keepalives = after.get("LeaseKeepAlive", 0) - before.get("LeaseKeepAlive", 0)
    print(f"\n[circuit figures] settled host over {window_s:g} s: {reads:g} reads, {txns:g} transactions "
          f"(poll_s 0.5 s: {window_s / 0.5:g} rounds if it polled), keepalive streams {keepalives:g}")
    # A read each keepalive round (every 10 s): one or two in 10 s; polling would have
    # read 20 times.
    assert reads <= 3, after
    assert txns <= 3, after  # the NOSPACE question, once per keepalive period


def test_a_watch_stalled_silently_is_left_and_a_lowered_budget_followed_in_seconds(
        etcd1: EtcdCluster, tmp_path: Path) -> None:
    """The watch's member stops answering with its connection left open (hung, or
    packets dropped on a partition): no error and no event. The reads move on to the
    next endpoint at the next keepalive round; the watch must too, or a settled host
    reads every change only at its keepalive (10 s here)."""
    init_circuit(etcd1.endpoints, "lab", BUDGET_W, TTL_S)
    proxy = TcpProxy(etcd1.members[0].client_port)
    eps = [proxy.endpoint, etcd1.endpoints[0]]  # the watch opens on the proxy first
    hosts = [Host(f"h{i}", tmp_path, eps, "lab", reserve_w=RESERVE_W, poll_s=0.5) for i in range(2)]
    try:
        start_hosts(hosts)
        wait_until(lambda: all(380 <= _grant(h) <= 400 for h in hosts), 30, "the pool split fairly")
        proxy.freeze()
        # The stalled stream left: its pings unanswered (every 6 s, within the request
        # timeout), or the reads moved to the member at a keepalive round that timed out
        # on the proxy (within 10 s + the request timeout) and the watch with them.
        def left(h: Host) -> bool:
            return bool(_at(h, "circuit_watch_down") or _at(h, "circuit_watch_moved"))

        wait_until(lambda: all(left(h) for h in hosts), TTL_S / 6 + 10.0, "the stalled watch left", step_s=0.2)
        lowered_at = time.time()
        etcd_edit(eps[1:], "lab", put={"spec": json.dumps({"budget_w": 2 * RESERVE_W, "ttl_s": TTL_S}).encode()})
        wait_until(lambda: all(_grant(h) == 0 for h in hosts), TTL_S / 6 + 2, "the grants given back", step_s=0.02)
        taken = time.time() - lowered_at
    finally:
        stop_hosts(hosts)
        proxy.close()
    print(f"\n[circuit figures] watch stalled silently: a lowered budget followed {taken:.2f} s after the put "
          f"(poll_s 0.5 s, keepalive every {TTL_S / 6:g} s)")
    assert taken < 2.0, taken


SWING = '[[cards]]\nphases = [{ at_s = 0, kind = "square", high_w = 300, low_w = 120, on_s = %.2f, off_s = %.2f, ' \
        'workload = "compute" }]\n'


def test_a_busy_circuit_reads_no_more_than_twice_as_often_as_polling(etcd1: EtcdCluster, tmp_path: Path) -> None:
    """Six hosts whose loads swing (their wants and draws move every second) on a pool
    they all want more of: each round publishes a record, which every other host is
    told of. Told at once, each host's round woke every other's: ten rounds a second
    each, a write in most. Polling every second read 6 times a second. By design a host
    starts a round at each poll and, beyond them, at most its wake budget's (3, then one
    every 2 s): 6 x (10 + 3 + 5) = 108 rounds in the 10 s window, about one read each,
    and each host's NOSPACE check once a keepalive period (6 more); a loaded machine
    (CI: 15.9 reads a second before the budget) tells more changes, not more rounds."""
    n, poll_s = 6, 1.0
    init_circuit(etcd1.endpoints, "lab", (RESERVE_W + 200.0) * n, TTL_S)
    hosts = [Host(f"h{i}", tmp_path, etcd1.endpoints, "lab", reserve_w=RESERVE_W, poll_s=poll_s) for i in range(n)]
    for i, h in enumerate(hosts):
        body = 'name = "circuit-test"\nbank = "workstation-4"\nbudget_w = 1200\nduration_s = 3600\nseed = 1\nlag_s = 0.1\n'
        body += "".join(SWING % (0.5 + 0.1 * i + 0.07 * c, 0.6 + 0.05 * c) for c in range(4))
        (h.dir / "scenario.toml").write_text(body)
    try:
        start_hosts(hosts)
        wait_until(lambda: all(_grant(h) > 0 for h in hosts), 30, "a grant on every host")
        time.sleep(5.0)
        before, t = _etcd_requests(etcd1), time.monotonic()
        time.sleep(10.0)
        after, window_s = _etcd_requests(etcd1), time.monotonic() - t
    finally:
        stop_hosts(hosts)
    reads, puts = ((after.get(k, 0) - before.get(k, 0)) / window_s for k in ("Range", "Put"))
    print(f"\n[circuit figures] {n} busy hosts, loads swinging, poll_s {poll_s:g} s: {reads:.1f} reads/s, "
          f"{puts:.1f} puts/s (polling: {n / poll_s:g} reads/s)")
    assert reads <= 2.5 * n / poll_s, reads
    assert puts <= 2.5 * n / poll_s, puts
