"""The daemon as systemd runs it: a subprocess, a real NOTIFY_SOCKET, a watchdog, signals.

``powerbudgetd run --backend sim`` runs on the wall clock against the simulated bank.
The test owns the notification socket (a unix datagram socket, as systemd's) and reads
the daemon's JSON log lines from its stdout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

LAG_S = 0.5  # the simulated bank applies a new limit this long after the write
WATCHDOG_USEC = 1_000_000

SCENARIO = """
bank = "workstation-4"
[[cards]]
[[cards]]
persistence_mode = false
"""


def config_text(budget: str, scenario: Path) -> str:
    return f'{budget}\n[sim]\nscenario = "{scenario}"\nlag_s = {LAG_S}\n'


class NotifySocket:
    """A unix datagram socket like systemd's; records (arrival time, {KEY: value})."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines())
            self.messages.append((time.time(), fields))

    def with_key(self, key: str) -> list[tuple[float, dict[str, str]]]:
        return [(t, m) for t, m in list(self.messages) if key in m]

    def close(self) -> None:
        self._closed = True
        self._thread.join()
        self.sock.close()


class Service:
    """``powerbudgetd run`` as a subprocess; its stdout parsed as JSON log events."""

    def __init__(self, config: Path, notify: NotifySocket) -> None:
        env = dict(os.environ, NOTIFY_SOCKET=notify.path, WATCHDOG_USEC=str(WATCHDOG_USEC))
        env = {k: v for k, v in env.items() if not k.startswith("POWERBUDGETD_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "powerbudgetd", "run", "--backend", "sim", "--config", str(config)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.events: list[dict] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def named(self, name: str) -> list[dict]:
        return [e for e in list(self.events) if e["event"] == name]


def wait_for(what: str, predicate, timeout_s: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def ts(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


@pytest.fixture
def notify():  # type: ignore[no-untyped-def]
    # A short directory: a unix socket path must fit in 108 bytes.
    with tempfile.TemporaryDirectory(prefix="pbd") as d:
        sock = NotifySocket(os.path.join(d, "notify"))
        yield sock
        sock.close()


def test_ready_watchdog_reload_and_stop(tmp_path: Path, notify: NotifySocket) -> None:
    scenario = tmp_path / "bank.toml"
    scenario.write_text(SCENARIO)
    config = tmp_path / "powerbudgetd.toml"
    config.write_text(config_text("budget_w = 1000", scenario))
    svc = Service(config, notify)
    try:
        # READY=1 only once every card's boot limit is read back as enforced.
        ready_at, ready = wait_for("READY=1", lambda: notify.with_key("READY")[:1])[0]
        boot = svc.named("power_limit_set")
        assert [e["reason"] for e in boot] == ["boot"] * 4
        assert [e["to_w"] for e in boot] == [250.0] * 4
        (ready_log,) = svc.named("ready")
        assert ready_log["sum_limits_w"] <= ready_log["budget_w"] == 1000.0
        assert all(ts(e) < ts(ready_log) for e in boot)
        # the simulated limits bite LAG_S after the write: READY waited for them
        # (two clocks: the log's timestamps and this socket's arrival times, hence 20 ms)
        assert ready_at >= max(ts(e) for e in boot) + LAG_S - 0.02
        assert ready["STATUS"].startswith("budget 1000 W, sum of caps 1000 W, mode ")
        # the card that booted without persistence mode had it turned on, before READY
        (pm,) = svc.named("persistence_mode_enabled")
        assert pm["index"] == 1 and ts(pm) < ts(boot[0])

        # Watchdog pings keep coming from the control loop, well inside WATCHDOG_USEC.
        pings = wait_for("3 watchdog pings", lambda: [t for t, _ in notify.with_key("WATCHDOG")][3:] and
                         [t for t, _ in notify.with_key("WATCHDOG")])
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        assert max(gaps) < WATCHDOG_USEC / 1e6

        # SIGHUP with a lower budget: RELOADING=1 (+ MONOTONIC_USEC), writes with reason
        # "reload" in the very next tick, decreases first, then READY=1 with the outcome.
        config.write_text(config_text("budget_w = 900", scenario))
        svc.proc.send_signal(signal.SIGHUP)
        sent_usec = time.monotonic_ns() // 1000
        _, reloading = wait_for("RELOADING=1", lambda: notify.with_key("RELOADING")[:1])[0]
        assert abs(int(reloading["MONOTONIC_USEC"]) - sent_usec) < 10_000_000
        ready2 = wait_for("READY=1 after reload", lambda: notify.with_key("READY")[1:2])[0][1]
        assert "reloaded: budget 1000 -> 900 W" in ready2["STATUS"]
        reload_writes = wait_for("reload writes", lambda: [e for e in svc.named("power_limit_set")
                                                            if e["reason"] == "reload"])
        assert all(e["to_w"] < e["from_w"] for e in reload_writes)
        (reloaded,) = svc.named("reloaded")
        assert reloaded["budget_w"] == 900.0 and reloaded["was_budget_w"] == 1000.0
        wait_for("caps at the new budget", lambda: any(
            m["STATUS"].startswith("budget 900 W, sum of caps 900 W") for _, m in notify.with_key("STATUS")))

        # SIGHUP with a broken file: the running config is kept, and the log says why.
        config.write_text(config_text("budget_w = -5", scenario))
        svc.proc.send_signal(signal.SIGHUP)
        ready3 = wait_for("READY=1 after a bad reload", lambda: notify.with_key("READY")[2:3])[0][1]
        assert len(notify.with_key("RELOADING")) == 2
        assert ready3["STATUS"].startswith("budget 900 W, sum of caps 900 W")
        assert "reload failed, running config kept: " in ready3["STATUS"]
        assert "budget_w: Input should be greater than 0 (got -5)" in ready3["STATUS"]
        (failed,) = svc.named("reload_failed")
        assert failed["kept_budget_w"] == 900.0
        assert failed["error"] == (
            f"{config}: invalid configuration\n  budget_w: Input should be greater than 0 (got -5)"
        )
        assert svc.proc.poll() is None

        # SIGTERM: STOPPING=1, every card back at its fair share (900 W / 4), exit 0.
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(timeout=15) == 0
        svc._thread.join(timeout=5)
        assert notify.with_key("STOPPING")
        (stopped,) = svc.named("stopped")
        assert stopped["limits_w"] == [225.0] * 4
        assert stopped["sum_limits_w"] <= 900.0
    finally:
        if svc.proc.poll() is None:
            svc.proc.kill()
            svc.proc.wait()


def test_run_refuses_a_missing_config(tmp_path: Path, notify: NotifySocket) -> None:
    missing = tmp_path / "nope.toml"
    svc = Service(missing, notify)
    assert svc.proc.wait(timeout=15) == 2
    assert svc.proc.stderr is not None
    assert svc.proc.stderr.read() == (
        f"powerbudgetd: {missing}: no such config file (see config/powerbudgetd.toml for an example)\n"
    )
    assert not notify.with_key("READY")
