"""A card that fails or hangs every NVML call must not hold up the stop, nor end it early.

The controller: a stop is over only once every card we can write is confirmed at its
fair share, also while a decrease a lost card set off is still settling. The daemon:
systemd sends SIGTERM, waits TimeoutStopSec (read from the unit file), then SIGKILLs.
The daemon must be gone before that, with status 0, having returned the cards it can
write to fair share and counted the one it cannot reach at its worst (300 W). Every
hang here lasts ten times TimeoutStopSec: a stop that waits for one overruns the bound.
The daemon runs as systemd runs it (``run --backend sim``) with every side channel that
reads NVML on: the recorder's peak sampler, metrics, and MQTT's energy reads (against a
Mosquitto broker of the test's own).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Fault, card, make_rig

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "powerbudgetd.service"
_stop = re.search(r"^TimeoutStopSec=(\d+)$", UNIT.read_text(), re.MULTILINE)
assert _stop, "the unit sets no TimeoutStopSec in seconds"
STOP_S = float(_stop.group(1))
HANG_S = 10 * STOP_S


def fault(call: str, error: str, **keys: object) -> str:
    return f'[[faults]]\ncall = "{call}"\nerror = "{error}"\n' + "".join(f"{k} = {v}\n" for k, v in keys.items())


# Card 1 of 4 goes bad 1 s into the run (after READY).
CASES = {
    "gpu_lost": fault("*", "GPU_IS_LOST", card=1, from_s=1),
    "unknown_error": fault("*", "UNKNOWN", card=1, from_s=1),
    # its energy counter hangs from the start (MQTT's read is in flight at the stop), then every call
    "hung": fault("nvmlDeviceGetTotalEnergyConsumption", "SLOW", card=1, delay_s=HANG_S)
    + fault("*", "SLOW", card=1, from_s=1, delay_s=HANG_S),
    # lost, and nvmlShutdown hangs behind it
    "gpu_lost_shutdown_hangs": fault("*", "GPU_IS_LOST", card=1, from_s=1) + fault("nvmlShutdown", "SLOW", delay_s=HANG_S),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[int]:
    exe = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    assert exe, "mosquitto is missing: run scripts/install-test-deps"
    port = free_port()
    (tmp_path / "mosquitto.conf").write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    proc = subprocess.Popen([exe, "-c", str(tmp_path / "mosquitto.conf")], stderr=subprocess.DEVNULL)
    try:
        wait_for("mosquitto listening", lambda: _connects(port), 10)
        yield port
    finally:
        proc.kill()
        proc.wait()


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def wait_for(what: str, predicate: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Daemon:
    """``powerbudgetd run --backend sim`` on 4 cards (150-300 W, 1000 W), every channel on."""

    def __init__(self, tmp_path: Path, faults: str, mqtt_port: int) -> None:
        (tmp_path / "bank.toml").write_text(f'bank = "workstation-4"\nlag_s = 0.1\n{faults}')
        (tmp_path / "pb.toml").write_text(
            f"budget_w = 1000\n[metrics]\nport = {free_port()}\n[recorder]\ndir = '{tmp_path / 'rec'}'\n"
            f"[mqtt]\nhost = '127.0.0.1'\nport = {mqtt_port}\npublish_interval_s = 1\n"
            f"[sim]\nscenario = '{tmp_path / 'bank.toml'}'\n")
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "powerbudgetd", "run", "--backend", "sim", "--config", str(tmp_path / "pb.toml")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line) if line.startswith("{") else {"event": "text", "line": line})

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e["event"] == name]

    def catches_sigterm(self) -> bool:
        """The daemon's own SIGTERM handler is in place (else SIGTERM kills it outright)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.MULTILINE).group(1), 16)  # type: ignore[union-attr]
        return bool(caught >> (signal.SIGTERM - 1) & 1)

    def stop(self) -> tuple[int | None, float]:
        """SIGTERM; (exit status, seconds to exit), or (None, ...) past TimeoutStopSec (then killed)."""
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc: int | None = self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - sent
        self.kill()
        self._reader.join(5)
        return rc, took

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_stopped_waits_for_the_decreases_a_lost_card_set_off() -> None:
    # Card 3 is lost at 3 s; the stop comes while the others' decreases (to make room
    # for it at 300 W) are still settling: stopped only once they are confirmed.
    rig = make_rig([card(i) for i in range(4)], 1000, lag_s=0.5, faults=[Fault("*", "GPU_IS_LOST", card=3, from_s=3.0)])
    rig.run(3.05)
    assert [w.to_w for w in rig.reports[-1].writes] == [233.333] * 3
    rig.ctl.request_stop()
    while not rig.ctl.stopped:
        rig.step()
    assert [rig.enforced_w(i) for i in range(3)] == [233.333] * 3
    assert rig.ctl.sum_bound_mw <= 1_000_000


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_card_failing_every_call_does_not_hold_up_the_stop(tmp_path: Path, broker: int, case: str) -> None:
    daemon = Daemon(tmp_path, CASES[case], broker)
    try:
        wait_for("READY", lambda: daemon.named("ready"))
        wait_for("MQTT connected", lambda: daemon.named("mqtt_connected"))
        wait_for("card 1 unreadable", lambda: [e for e in daemon.named("card_unreadable") if e["index"] == 1])
        rc, took = daemon.stop()
    finally:
        daemon.kill()
    assert (rc, took < STOP_S) == (0, True), (rc, took)
    # the cards we can write back at fair share of what card 1, counted at 300 W, leaves
    (stopped,) = daemon.named("stopped")
    assert stopped["limits_w"] == [233.333, 300.0, 233.333, 233.333]
    assert stopped["sum_limits_w"] <= 1000.0
    assert bool(daemon.named("nvml_shutdown_abandoned")) == case.endswith("shutdown_hangs")


@pytest.mark.slow
def test_a_stop_during_boot_with_a_hung_card_leaves_at_once(tmp_path: Path, broker: int) -> None:
    # Card 1 hangs every call from the start: the first enumeration waits on it.
    daemon = Daemon(tmp_path, fault("*", "SLOW", card=1, delay_s=HANG_S), broker)
    try:
        wait_for("the SIGTERM handler", daemon.catches_sigterm)
        rc, took = daemon.stop()
    finally:
        daemon.kill()
    assert (rc, took < STOP_S) == (0, True), (rc, took)
    assert daemon.named("stopped_during_boot")
    assert not daemon.named("power_limit_set")  # nothing written: the cards keep their limits
