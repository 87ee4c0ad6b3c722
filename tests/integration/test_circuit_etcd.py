"""Several daemons (``run --backend sim``) share one circuit through a real etcd.

Each test starts its own etcd (one member, or three on loopback), its own daemons under
a systemd-like supervisor (watchdog, ExecStopPost failsafe), and a checker that samples
every host's truth every 100 ms: the circuit's wall sum must never exceed its budget.
Figures per fault (worst margin, time at reserve) are printed for the README.

Circuit: 3 hosts x 800 W reserve = 2400 W of seats in a 3000 W circuit, lease TTL 5 s,
WatchdogSec 1.5 s. A busy host (4 cards at 300 W) wants 1444 - 800 = 644 W above its
reserve, so grants are always contested: the pool (600 W) is split max-min fair.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from support.circuit import (
    Checker,
    EtcdCluster,
    Host,
    TcpProxy,
    circuit_status,
    granted,
    init_circuit,
    start_hosts,
    stop_hosts,
)
from powerbudgetd.core.circuit import DEFAULT_CLOCK_RATE_ALLOWANCE, fenced_lease_ttl_s
from support.timings import FALLBACK_S, FEW_ROUNDS_S, LEASE_TTL_S, WATCHDOG_S
from support.wait import wait_until

pytestmark = pytest.mark.slow  # real etcd members and daemons: the full run (CI) covers it

BUDGET_W = 3000.0
RESERVE_W = 800.0
TTL_S = LEASE_TTL_S
ROUND_S = FEW_ROUNDS_S


def _figures(name: str, **fields: object) -> None:
    print(f"\n[circuit figures] {name}: " + ", ".join(f"{k}={v}" for k, v in fields.items()))


def _hosts(tmp_path: Path, endpoints: list[str] | dict[str, list[str]], n: int = 3, **kw) -> list[Host]:
    hosts = []
    for i in range(n):
        eps = endpoints[f"h{i}"] if isinstance(endpoints, dict) else endpoints
        hosts.append(Host(f"h{i}", tmp_path, eps, "lab", reserve_w=RESERVE_W, **kw))
    return hosts


def test_hosts_share_the_pool_and_stay_within_the_circuit(etcd1: EtcdCluster, tmp_path: Path) -> None:
    init_circuit(etcd1.endpoints, "lab", BUDGET_W, TTL_S)
    hosts = _hosts(tmp_path, etcd1.endpoints)
    try:
        with Checker(hosts, BUDGET_W) as checker:
            start_hosts(hosts)
            wait_until(lambda: granted(hosts, 3), 20, "a grant on every host")
            # Settled: every host's grant at its fair share (within a step), as it reads it.
            wait_until(lambda: all(190 <= (h.metric("powerbudgetd_circuit_grant_watts") or 0) <= 200 for h in hosts),
                       20, "the pool split max-min fair")
            status = circuit_status(etcd1.endpoints, "lab")
            assert status["committed_w"] <= BUDGET_W and status["seats_w"] == 3 * RESERVE_W
            assert not status["flags"]["no_seat"] and not status["flags"]["duplicate"], status["flags"]
            # The records' measured draw (1 s averages, each published at its host's
            # round) agree within a keepalive period: one published before its host's
            # cards came down, beside the others' after their raises, sums over the
            # budget until then.
            wait_until(lambda: circuit_status(etcd1.endpoints, "lab")["within_budget"], 2 * TTL_S,
                       "the records' draw within the circuit")
        margin = checker.assert_within()
        grants = [r["grant_w"] for r in status["hosts"]]
        # Three equal wants over a 600 W pool: max-min fair, 200 W each (within a step).
        assert all(190 <= g <= 200 for g in grants), grants
        assert sum(grants) <= BUDGET_W - 3 * RESERVE_W
        walls = [h.wall_w() for h in hosts]
        assert all(w is not None and w > RESERVE_W + 150 for w in walls), walls  # the grants are in use
        _figures("sharing", worst_margin_w=round(margin, 1), grants_w=grants)
    finally:
        stop_hosts(hosts)
    # A clean stop gives the grant back only with the cards at the reserve share.
    for h in hosts:
        assert h.wall_w() is not None and h.wall_w() <= RESERVE_W + 1e-3


def test_all_of_etcd_stopped_every_host_back_to_reserve_before_any_lease_could_expire(
    etcd1: EtcdCluster, tmp_path: Path,
) -> None:
    init_circuit(etcd1.endpoints, "lab", BUDGET_W, TTL_S)
    hosts = _hosts(tmp_path, etcd1.endpoints)
    try:
        with Checker(hosts, BUDGET_W) as checker:
            start_hosts(hosts)
            wait_until(lambda: granted(hosts, 3), 20, "a grant on every host")
            last_ack = time.monotonic()
            etcd1.stop_all()
            stopped = time.monotonic()
            # Every host must be at its reserve (confirmed) before the earliest moment etcd
            # could have expired a lease: the last keepalive any host sent + TTL. That is
            # after `last_ack - TTL/6`; hold them to `stopped + TTL - TTL/6 - 0.2`.
            bound = stopped + TTL_S - TTL_S / 6 - 0.2
            wait_until(lambda: all((h.wall_w() or 1e9) <= RESERVE_W + 1e-3 for h in hosts), TTL_S, "every host at reserve")
            back = time.monotonic()
            assert back <= bound, (back - stopped, bound - stopped)
            time.sleep(1.0)
            etcd1.start(new=False)
            wait_until(lambda: granted(hosts, 3), 30, "grants again after etcd is back")
            regranted = time.monotonic()
        margin = checker.assert_within()
        # The metric follows each round (poll_s 0.2 s, request timeout 0.5 s): on a loaded
        # machine one round may time out after the regrant, and the next one answers.
        wait_until(lambda: all(h.metric("powerbudgetd_circuit_etcd_reachable") == 1 for h in hosts), ROUND_S,
                   "every host reading etcd reachable")
        _figures("etcd stopped", worst_margin_w=round(margin, 1), at_reserve_after_s=round(back - stopped, 2),
                 fence_bound_s=round(bound - stopped, 2), at_reserve_total_s=round(regranted - back, 2),
                 last_ack_before_stop_s=round(stopped - last_ack, 2))
    finally:
        stop_hosts(hosts)


def test_leader_killed_in_a_three_member_cluster(etcd3: EtcdCluster, tmp_path: Path) -> None:
    init_circuit(etcd3.endpoints, "lab", BUDGET_W, TTL_S)
    # Each host lists the members in a different order: the leader's loss hits some first.
    eps = {f"h{i}": etcd3.endpoints[i:] + etcd3.endpoints[:i] for i in range(3)}
    hosts = _hosts(tmp_path, eps)
    try:
        with Checker(hosts, BUDGET_W) as checker:
            start_hosts(hosts)
            wait_until(lambda: granted(hosts, 3), 20, "a grant on every host")
            leader = etcd3.leader()
            killed = time.monotonic()
            etcd3.kill(leader)
            time.sleep(TTL_S + 1)  # past a whole TTL: the grants must have survived (renewed elsewhere)
            wait_until(lambda: granted(hosts, 3), 15, "every host granted after the election")
            lost = sum(h.metric("powerbudgetd_circuit_grant_lost_total") or 0 for h in hosts)
        margin = checker.assert_within()
        reserve_s = {h.name: round(checker.at_reserve_s(h.name, RESERVE_W, killed), 2) for h in hosts}
        _figures("leader killed", worst_margin_w=round(margin, 1), grants_lost=lost, at_reserve_s=reserve_s)
    finally:
        stop_hosts(hosts)


def test_one_host_cut_off_while_the_others_keep_going(etcd1: EtcdCluster, tmp_path: Path) -> None:
    init_circuit(etcd1.endpoints, "lab", BUDGET_W, TTL_S)
    proxy = TcpProxy(int(etcd1.endpoints[0].rsplit(":", 1)[1]))
    eps = {"h0": [proxy.endpoint], "h1": etcd1.endpoints, "h2": etcd1.endpoints}
    hosts = _hosts(tmp_path, eps)
    try:
        with Checker(hosts, BUDGET_W) as checker:
            start_hosts(hosts)
            wait_until(lambda: granted(hosts, 3), 20, "a grant on every host")
            cut = time.monotonic()
            proxy.cut()
            # h0 falls back to its reserve on its own, before its lease can expire ...
            wait_until(lambda: (hosts[0].wall_w() or 1e9) <= RESERVE_W + 1e-3, TTL_S, "h0 at its reserve")
            h0_back = time.monotonic() - cut
            assert h0_back < TTL_S - TTL_S / 6
            # ... and once etcd expires it, the others share the whole pool (300 W each).
            wait_until(lambda: all((h.metric("powerbudgetd_circuit_grant_watts") or 0) >= 290 for h in hosts[1:]),
                     TTL_S + 15, "h1 and h2 take h0's share")
            others = time.monotonic() - cut
            wait_until(lambda: hosts[0].metric("powerbudgetd_circuit_etcd_reachable") == 0, ROUND_S,
                       "h0 reading etcd unreachable")
            proxy.heal()
            wait_until(lambda: granted(hosts[:1], 1), 30, "h0 granted again after the cut heals")
        margin = checker.assert_within()
        _figures("host cut off", worst_margin_w=round(margin, 1), cut_host_at_reserve_after_s=round(h0_back, 2),
                 others_regranted_after_s=round(others, 2))
    finally:
        stop_hosts(hosts)
        proxy.close()


def test_sigstopped_daemon_is_killed_by_the_watchdog_and_the_failsafe_lowers_it(etcd1: EtcdCluster, tmp_path: Path) -> None:
    init_circuit(etcd1.endpoints, "lab", BUDGET_W, TTL_S)
    hosts = _hosts(tmp_path, etcd1.endpoints)
    try:
        with Checker(hosts, BUDGET_W) as checker:
            start_hosts(hosts)
            wait_until(lambda: granted(hosts, 3), 20, "a grant on every host")
            assert hosts[0].proc is not None
            frozen = time.monotonic()
            os.kill(hosts[0].proc.pid, signal.SIGSTOP)
            # Stopped past its TTL: the supervisor's watchdog kills it, ExecStopPost lowers
            # its cards; only then may etcd hand its grant to the others.
            wait_until(lambda: hosts[0].failsafe_runs, TTL_S + 10, "the failsafe after the watchdog kill")
            assert hosts[0].killed_by_watchdog
            at, rc, out = hosts[0].failsafe_runs[0]
            assert rc == 0, out
            # The host's lease is the circuit's TTL plus the grace for its watchdog and
            # failsafe; etcd may expire it from (that TTL) x (1 - r) / (1 + r) after the
            # last keepalive acknowledged, which was up to TTL/6 before the freeze.
            r = DEFAULT_CLOCK_RATE_ALLOWANCE
            expiry_s = fenced_lease_ttl_s(TTL_S, WATCHDOG_S, FALLBACK_S, r) * (1 - r) / (1 + r) - TTL_S / 6
            assert at - frozen < expiry_s, "the failsafe must finish before the host's lease can expire"
            assert (hosts[0].wall_w() or 1e9) <= RESERVE_W + 1e-3
            wait_until(lambda: all((h.metric("powerbudgetd_circuit_grant_watts") or 0) >= 290 for h in hosts[1:]),
                     TTL_S + 15, "the others take the dead host's share")
        margin = checker.assert_within()
        _figures("SIGSTOP + watchdog", worst_margin_w=round(margin, 1), failsafe_done_after_s=round(at - frozen, 2))
    finally:
        stop_hosts(hosts)


def test_kill_9_mid_grant_then_failsafe_as_systemd_runs_it(etcd1: EtcdCluster, tmp_path: Path) -> None:
    init_circuit(etcd1.endpoints, "lab", BUDGET_W, TTL_S)
    hosts = _hosts(tmp_path, etcd1.endpoints)
    try:
        with Checker(hosts, BUDGET_W) as checker:
            start_hosts(hosts)
            wait_until(lambda: granted(hosts, 3), 20, "a grant on every host")
            assert hosts[0].proc is not None
            # Mid-grant: its cards use it.
            wait_until(lambda: (hosts[0].wall_w() or 0) > RESERVE_W + 150, 5, "h0's cards raised with its grant")
            killed = time.monotonic()
            hosts[0].proc.kill()
            wait_until(lambda: hosts[0].failsafe_runs, 20, "ExecStopPost's failsafe")
            at, rc, out = hosts[0].failsafe_runs[0]
            assert rc == 0, out
            assert "given back" in out
            assert (hosts[0].wall_w() or 1e9) <= RESERVE_W + 1e-3
            # The grant went back with the failsafe: the others take it without waiting for the TTL.
            wait_until(lambda: all((h.metric("powerbudgetd_circuit_grant_watts") or 0) >= 290 for h in hosts[1:]),
                     TTL_S + 10, "the others take the killed host's share")
            regrant = time.monotonic() - killed
        margin = checker.assert_within()
        _figures("kill -9 + failsafe", worst_margin_w=round(margin, 1), failsafe_done_after_s=round(at - killed, 2),
                 others_regranted_after_s=round(regrant, 2))
    finally:
        stop_hosts(hosts)


def test_a_host_whose_seat_does_not_fit_takes_no_grant_and_says_so(etcd1: EtcdCluster, tmp_path: Path) -> None:
    init_circuit(etcd1.endpoints, "lab", BUDGET_W, TTL_S)
    hosts = _hosts(tmp_path, etcd1.endpoints, n=2)
    late = Host("late", tmp_path, etcd1.endpoints, "lab", reserve_w=1500.0)
    try:
        start_hosts(hosts)
        wait_until(lambda: granted(hosts, 2), 20, "grants on the seated hosts")
        with pytest.raises(AssertionError, match="does not fit"):
            late.join()  # the set-up step says so first
        late.start()  # started anyway: the daemon says so too, and takes nothing
        late.wait_ready()
        wait_until(lambda: late.metric("powerbudgetd_circuit_pending_watts") == 1500, 10, "the late host's pending seat")
        assert late.metric("powerbudgetd_circuit_seat_fits") == 0
        assert late.metric("powerbudgetd_circuit_grants_allowed") == 0
        assert any(e.get("event") == "circuit_seat_does_not_fit" for e in late.events())
        # The seated hosts give their grants back at once: the circuit is over-committed.
        wait_until(lambda: all(h.metric("powerbudgetd_circuit_grant_watts") == 0 for h in hosts), 10,
                 "grants given back")
        status = circuit_status(etcd1.endpoints, "lab")
        assert status["pending_w"] == 1500 and "late" not in [r["host"] for r in status["hosts"] if r["seat_w"]]
        assert late.metric("powerbudgetd_circuit_grant_watts") == 0
        assert (late.wall_w() or 1e9) <= 1500 + 1e-3
    finally:
        stop_hosts([*hosts, late])
