"""The daemon as systemd runs it: a subprocess, a real NOTIFY_SOCKET, a watchdog, signals.

``powerbudgetd run --backend sim`` runs on the wall clock against the simulated bank.
The test owns the notification socket (a unix datagram socket, as systemd's) and reads
the daemon's JSON log lines from its stdout.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path

import pytest


from support.daemon import DaemonProcess, NotifySocket

pytestmark = pytest.mark.slow  # the daemon as a subprocess: the full run (CI) covers it

# The simulated bank applies a new limit this long after the write: half a tick off the
# 100 ms cadence, so that no read falls between the four boot writes' bite times (at a
# whole number of ticks one could, on a loaded machine: the controller, over budget,
# then lowers the others around the card still biting, and boot takes 7 writes).
LAG_S = 0.45
WATCHDOG_S = 1.0

SCENARIO = """
bank = "workstation-4"
[[cards]]
[[cards]]
persistence_mode = false
"""


def config_text(budget: str, scenario: Path) -> str:
    return f'{budget}\n[sim]\nscenario = "{scenario}"\nlag_s = {LAG_S}\n'


def ts(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def start(config: Path, notify: NotifySocket) -> DaemonProcess:
    return DaemonProcess(config, notify=notify, watchdog_s=WATCHDOG_S)


def test_ready_watchdog_reload_and_stop(tmp_path: Path, notify: NotifySocket) -> None:
    scenario = tmp_path / "bank.toml"
    scenario.write_text(SCENARIO)
    config = tmp_path / "powerbudgetd.toml"
    config.write_text(config_text("budget_w = 1000", scenario))
    with start(config, notify) as svc:
        # READY=1 only once every card's boot limit is read back as enforced.
        ready_at, ready = svc.wait_for(lambda: notify.with_key("READY")[:1], "READY=1")[0]
        boot = svc.events("power_limit_set")
        assert [e["reason"] for e in boot] == ["boot"] * 4
        assert [e["to_w"] for e in boot] == [250.0] * 4
        (ready_log,) = svc.events("ready")
        assert ready_log["sum_limits_w"] <= ready_log["budget_w"] == 1000.0
        assert all(ts(e) < ts(ready_log) for e in boot)
        # the simulated limits bite LAG_S after the write: READY waited for them
        # (two clocks: the log's timestamps and this socket's arrival times, hence 20 ms)
        assert ready_at >= max(ts(e) for e in boot) + LAG_S - 0.02
        assert ready["STATUS"].startswith("budget 1000 W, sum of caps 1000 W, mode ")
        # the card that booted without persistence mode had it turned on, before READY
        (pm,) = svc.events("persistence_mode_enabled")
        assert pm["index"] == 1 and ts(pm) < ts(boot[0])

        # Watchdog pings keep coming from the control loop, well inside WATCHDOG_USEC.
        pings = svc.wait_for(lambda: [t for t, _ in notify.with_key("WATCHDOG")][3:] and
                             [t for t, _ in notify.with_key("WATCHDOG")], "3 watchdog pings")
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        assert max(gaps) < WATCHDOG_S

        # SIGHUP with a lower budget: RELOADING=1 (+ MONOTONIC_USEC), writes with reason
        # "reload" in the very next tick, decreases first, then READY=1 with the outcome.
        config.write_text(config_text("budget_w = 900", scenario))
        svc.send(signal.SIGHUP)
        sent_usec = time.monotonic_ns() // 1000
        _, reloading = svc.wait_for(lambda: notify.with_key("RELOADING")[:1], "RELOADING=1")[0]
        assert abs(int(reloading["MONOTONIC_USEC"]) - sent_usec) < 10_000_000
        ready2 = svc.wait_for(lambda: notify.with_key("READY")[1:2], "READY=1 after reload")[0][1]
        assert "reloaded: budget 1000 -> 900 W" in ready2["STATUS"]
        reload_writes = svc.wait_for(
            lambda: [e for e in svc.events("power_limit_set") if e["reason"] == "reload"], "reload writes")
        assert all(e["to_w"] < e["from_w"] for e in reload_writes)
        (reloaded,) = svc.events("reloaded")
        assert reloaded["budget_w"] == 900.0 and reloaded["was_budget_w"] == 1000.0
        svc.wait_for(lambda: any(m["STATUS"].startswith("budget 900 W, sum of caps 900 W")
                                 for _, m in notify.with_key("STATUS")), "caps at the new budget")

        # SIGHUP with a broken file: the running config is kept, and the log says why.
        config.write_text(config_text("budget_w = -5", scenario))
        svc.send(signal.SIGHUP)
        ready3 = svc.wait_for(lambda: notify.with_key("READY")[2:3], "READY=1 after a bad reload")[0][1]
        assert len(notify.with_key("RELOADING")) == 2
        assert ready3["STATUS"].startswith("budget 900 W, sum of caps 900 W")
        assert "reload failed, running config kept: " in ready3["STATUS"]
        assert "budget_w: Input should be greater than 0 (got -5)" in ready3["STATUS"]
        (failed,) = svc.events("reload_failed")
        assert failed["kept_budget_w"] == 900.0
        assert failed["error"] == (
            f"{config}: invalid configuration\n  budget_w: Input should be greater than 0 (got -5)"
        )
        assert svc.returncode is None

        # SIGTERM: STOPPING=1, every card back at its fair share (900 W / 4), exit 0.
        svc.send(signal.SIGTERM)
        assert svc.wait(15) == 0
        assert notify.with_key("STOPPING")
        (stopped,) = svc.events("stopped")
        assert stopped["limits_w"] == [225.0] * 4
        assert stopped["sum_limits_w"] <= 900.0


def test_run_refuses_a_missing_config(tmp_path: Path, notify: NotifySocket) -> None:
    missing = tmp_path / "nope.toml"
    svc = start(missing, notify)
    assert svc.wait(15) == 2
    assert svc.errors() == (
        f"powerbudgetd: {missing}: no such config file (see config/powerbudgetd.toml for an example)\n"
    )
    assert not notify.with_key("READY")
