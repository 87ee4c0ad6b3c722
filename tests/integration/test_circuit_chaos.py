"""Chaos on one circuit: a real three-member etcd, four daemons on simulated banks under a
systemd-like supervisor (watchdog kill, ExecStopPost failsafe, restart), and a seeded
random draw of operator actions and faults between them. A checker samples every
host's truth (its cards' limits, through the feed model to the wall) every 100 ms.

Asserted: the circuit's wall sum never exceeds its budget. A duplicate (a second machine
started under a name already claimed) is refused at start and takes nothing from the
name's holder, its failsafe included; its own cards are outside the circuit (it was
never seated), so the checker counts the four seated hosts. The seed and the number of
draws come from ``CIRCUIT_CHAOS_SEED`` and ``CIRCUIT_CHAOS_DRAWS`` (defaults: 1 and 7,
each action once, about a minute and a half); a longer run is the same test with more.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from support.circuit import (
    Checker,
    EtcdCluster,
    Host,
    circuit_cli,
    etcd_edit,
    init_circuit,
    start_hosts,
    stop_hosts,
)
from support.timings import LEASE_TTL_S

pytestmark = pytest.mark.slow  # real etcd members and daemons: the full run (CI) covers it

BUDGET_W = 3400.0
RESERVE_W = 780.0  # four seats: 3120 W, a 280 W pool (a reserve below 778 W leaves less than the floors)
TTL_S = LEASE_TTL_S
SETTLE_S = 2.0
ACTIONS = ("forced_leave", "wipe_and_init", "duplicate_name", "sigstop_watchdog", "sigstop_unenforced",
           "leader_kill", "quorum_loss")


def _figures(name: str, **fields: object) -> None:
    print(f"\n[circuit figures] {name}: " + ", ".join(f"{k}={v}" for k, v in fields.items()))


def test_random_operator_actions_and_faults_never_overload_the_circuit(tmp_path: Path) -> None:
    seed = int(os.environ.get("CIRCUIT_CHAOS_SEED", "1"))
    draws = int(os.environ.get("CIRCUIT_CHAOS_DRAWS", str(len(ACTIONS))))
    rng = random.Random(seed)
    etcd = EtcdCluster(tmp_path, 3)
    etcd.start()
    # h3's watchdog is not enforced: it never shares, and frozen it holds only its reserve.
    hosts = [Host(f"h{i}", tmp_path, etcd.endpoints[i % 3:] + etcd.endpoints[:i % 3], "lab", reserve_w=RESERVE_W,
                  enforce_watchdog=i != 3) for i in range(4)]
    clones: list[Host] = []
    done: list[str] = []
    try:
        init_circuit(etcd.endpoints, "lab", BUDGET_W, TTL_S)
        with Checker(hosts, BUDGET_W) as checker:
            start_hosts(hosts)
            for n in range(draws):
                action = ACTIONS[n] if n < len(ACTIONS) and seed == 1 else rng.choice(ACTIONS)
                _act(action, rng, etcd, hosts, clones, tmp_path)
                done.append(action)
                time.sleep(SETTLE_S)
                for h in hosts:  # systemd's Restart=on-failure: a killed daemon comes back
                    if h.proc is not None and h.proc.poll() is not None:
                        h.stop()
                        h.start()
        over = [(t, w) for t, w in checker.samples if sum(w.values()) > BUDGET_W + 1e-3]
        assert not over, f"seed {seed}, actions {done}: over budget at {len(over)} samples, first {over[0]}"
        for clone in clones:
            assert not any(e.get("event") == "circuit_grant_raised" for e in clone.events())
            assert all("not this machine's to give back" in out for _, _, out in clone.failsafe_runs)
        _figures("chaos", seed=seed, actions=done, samples=len(checker.samples),
                 worst_margin_w=round(checker.worst_margin_w(), 1))
    finally:
        stop_hosts([*hosts, *clones])
        etcd.stop_all()


def _act(action: str, rng: random.Random, etcd: EtcdCluster, hosts: list[Host], clones: list[Host],
         tmp_path: Path) -> None:
    live = [h for h in hosts if h.proc is not None and h.proc.poll() is None]
    victim = rng.choice(live)
    if action == "forced_leave":
        r = circuit_cli(etcd.endpoints, "leave", "--name", "lab", "--host", victim.name, "--force")
        assert r.returncode == 0, r.stderr
    elif action == "wipe_and_init":
        etcd_edit(etcd.endpoints, "lab", wipe=True)
        time.sleep(rng.uniform(0, 2))
        init_circuit(etcd.endpoints, "lab", BUDGET_W, TTL_S)
    elif action == "duplicate_name":
        clone = Host(f"clone{len(clones)}", tmp_path, etcd.endpoints, "lab", reserve_w=RESERVE_W, seat=victim.name)
        clones.append(clone)
        clone.start()
        assert clone.proc is not None
        assert clone.proc.wait(30) == 11, clone.daemon.tail()
        clone.stop()  # and its failsafe
    elif action in ("sigstop_watchdog", "sigstop_unenforced"):
        target = hosts[3] if action == "sigstop_unenforced" else rng.choice([h for h in live if h is not hosts[3]]
                                                                              or live)
        if target.proc is None or target.proc.poll() is not None:
            return
        os.kill(target.daemon.pid, signal.SIGSTOP)
        time.sleep(rng.uniform(0.5, 1.5 * TTL_S))
        if target.proc.poll() is None:
            os.kill(target.daemon.pid, signal.SIGCONT)
    elif action == "leader_kill":
        i = etcd.leader()
        etcd.kill(i)
        time.sleep(rng.uniform(1, TTL_S))
        etcd.start(i, new=False)
    elif action == "quorum_loss":
        gone = rng.sample(range(3), 2)
        for i in gone:
            etcd.kill(i)
        time.sleep(rng.uniform(1, 1.5 * TTL_S))
        for i in gone:
            etcd.start(i, new=False)
