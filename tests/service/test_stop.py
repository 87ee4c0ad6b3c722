"""A card that fails or hangs every NVML call must not hold up the stop, nor end it early.

The controller: a stop is over only once every card we can write is confirmed at its
fair share, also while a decrease a lost card set off is still settling. The daemon:
systemd sends SIGTERM, waits TimeoutStopSec (read from the unit file), then SIGKILLs.
The daemon must be gone before that, with status 0, having returned the cards it can
write to fair share and counted the one it cannot reach at its worst (300 W). Every
hang here lasts ten times TimeoutStopSec: a stop that waits for one overruns the bound.
The daemon runs as systemd runs it (``run --backend sim``) with every side channel that
reads NVML on: the recorder's peak sampler, metrics, and MQTT's energy reads.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.daemon import DaemonProcess, Launch
from support.mqtt import Mosquitto
from support.rig import Fault, card, make_rig
from support.timings import AFTER_READY_S
from support.wait import free_port
from support.paths import REPO

UNIT = REPO / "systemd" / "powerbudgetd.service"
_stop = re.search(r"^TimeoutStopSec=(\d+)$", UNIT.read_text(), re.MULTILINE)
assert _stop, "the unit sets no TimeoutStopSec in seconds"
STOP_S = float(_stop.group(1))
HANG_S = 10 * STOP_S


def fault(call: str, error: str, **keys: object) -> str:
    return f'[[faults]]\ncall = "{call}"\nerror = "{error}"\n' + "".join(f"{k} = {v}\n" for k, v in keys.items())


# Card 1 of 4 goes bad once the daemon is READY (a card lost before then stops the boot).
BAD_S = AFTER_READY_S
CASES = {
    "gpu_lost": fault("*", "GPU_IS_LOST", card=1, from_s=BAD_S),
    "unknown_error": fault("*", "UNKNOWN", card=1, from_s=BAD_S),
    # its energy counter hangs from the start (MQTT's read is in flight at the stop), then every call
    "hung": fault("nvmlDeviceGetTotalEnergyConsumption", "SLOW", card=1, delay_s=HANG_S)
    + fault("*", "SLOW", card=1, from_s=BAD_S, delay_s=HANG_S),
    # lost, and nvmlShutdown hangs behind it
    "gpu_lost_shutdown_hangs": fault("*", "GPU_IS_LOST", card=1, from_s=BAD_S)
    + fault("nvmlShutdown", "SLOW", delay_s=HANG_S),
}


def start(launch: Launch, tmp_path: Path, faults: str, broker: Mosquitto) -> DaemonProcess:
    """4 cards (150-300 W) at 1000 W with ``faults``; every side channel on."""
    (tmp_path / "bank.toml").write_text(f'bank = "workstation-4"\nlag_s = 0.1\n{faults}')
    (tmp_path / "pb.toml").write_text(
        f"budget_w = 1000\n[control]\ntick_s = 0.2\n"  # slower than the refresh: the peak sampler runs
        f"[metrics]\nport = {free_port()}\n[recorder]\ndir = '{tmp_path / 'rec'}'\n"
        f"[mqtt]\nhost = '127.0.0.1'\nport = {broker.port}\npublish_interval_s = 1\n"
        f"[sim]\nscenario = '{tmp_path / 'bank.toml'}'\n")
    return launch(tmp_path / "pb.toml")


def sigterm(daemon: DaemonProcess) -> tuple[int | None, float]:
    """(exit status, s from SIGTERM to exit); None past TimeoutStopSec, when systemd kills."""
    sent = time.monotonic()
    daemon.send(signal.SIGTERM)
    try:
        rc: int | None = daemon.wait(STOP_S)
    except subprocess.TimeoutExpired:
        rc = None
    return rc, time.monotonic() - sent


def catches_sigterm(daemon: DaemonProcess) -> bool:
    """The daemon's own SIGTERM handler is in place (before it, SIGTERM kills outright)."""
    status = Path(f"/proc/{daemon.pid}/status").read_text()
    caught = re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.MULTILINE)
    return caught is not None and bool(int(caught.group(1), 16) >> (signal.SIGTERM - 1) & 1)


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
def test_a_card_failing_every_call_does_not_hold_up_the_stop(
        launch: Launch, tmp_path: Path, broker: Mosquitto, case: str) -> None:
    daemon = start(launch, tmp_path, CASES[case], broker)
    daemon.wait_for(lambda: daemon.events("ready"), "READY")
    daemon.wait_for(lambda: daemon.events("mqtt_connected"), "MQTT connected")
    daemon.wait_for(lambda: [e for e in daemon.events("card_unreadable") if e["index"] == 1], "card 1 unreadable")
    rc, took = sigterm(daemon)
    assert (rc, took < STOP_S) == (0, True), (rc, took, daemon.tail())
    # the cards we can write back at fair share of what card 1, counted at 300 W, leaves
    (stopped,) = daemon.events("stopped")
    assert stopped["limits_w"] == [233.333, 300.0, 233.333, 233.333]
    assert stopped["sum_limits_w"] <= 1000.0
    assert bool(daemon.events("nvml_shutdown_abandoned")) == case.endswith("shutdown_hangs")


@pytest.mark.slow
def test_a_stop_during_boot_with_a_hung_card_leaves_at_once(launch: Launch, tmp_path: Path, broker: Mosquitto) -> None:
    # Card 1 hangs every call from the start: the first enumeration waits on it.
    daemon = start(launch, tmp_path, fault("*", "SLOW", card=1, delay_s=HANG_S), broker)
    daemon.wait_for(lambda: catches_sigterm(daemon), "the SIGTERM handler")
    rc, took = sigterm(daemon)
    assert (rc, took < STOP_S) == (0, True), (rc, took, daemon.tail())
    assert daemon.events("stopped_during_boot")
    assert not daemon.events("power_limit_set")  # nothing written: the cards keep their limits
