"""The daemon over a C NVML library loaded as the driver's is (``--backend nvml``).

The simulator stands in for the library inside the bindings; here the bindings load a
compiled C library (``powerbudgetd_sim.nulldriver``) by their own loader, so the
production path runs end to end with no GPU: ``CDLL("libnvidia-ml.so.1")``, the
versioned symbols, C structs filled by C code. Its cards draw a square wave (busy 2 s,
idle 3 s, out of phase) and take a written limit at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from powerbudgetd_sim import nulldriver

from support.daemon import DaemonProcess, clean_env

pytestmark = pytest.mark.slow  # a C compiler and the daemon as a subprocess: the full run (CI) covers it

CARDS, BUDGET_W = 8, 3200.0  # 400 W a card: 700 W cards, 200 W floors


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nulldriver.build(tmp_path_factory.mktemp("nulldriver")).parent


def test_probe_reads_what_the_c_library_answers(library: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "powerbudgetd", "probe", "--json"], capture_output=True, text=True,
                         env=clean_env(**nulldriver.environ(library, 2)), timeout=60, check=True)
    probe = json.loads(out.stdout)
    assert probe["driver"] == "0.0.null"
    gpus = probe["gpus"]
    assert [g["uuid"] for g in gpus] == ["GPU-00000000-0000-4000-8000-000000000000",
                                         "GPU-00000000-0000-4000-8000-000000000001"]
    for g in gpus:
        assert g["name"] == "null driver card" and g["persistence_mode"] is True and g["mig_mode"] is None
        assert (g["min_limit_w"], g["max_limit_w"], g["default_limit_w"]) == (200.0, 700.0, 700.0)
        assert g["requested_limit_w"] == g["enforced_limit_w"] == 700.0
        # Field 186 (in an nvmlFieldValue_t filled by C) and the 1 s average: the wave's
        # two levels, busy 650 W or idle 90 W, never a value read from the wrong offset.
        assert g["power_instant_w"] in (650.0, 90.0) and g["power_avg_w"] in (650.0, 90.0)
        assert g["energy_j"] is not None and g["energy_j"] >= 0


def test_the_daemon_boots_lends_and_stops_within_budget_over_the_c_library(library: Path, tmp_path: Path) -> None:
    config = tmp_path / "powerbudgetd.toml"
    config.write_text(f'budget_w = {BUDGET_W}\n[recorder]\ndir = "{tmp_path / "log"}"\n[metrics]\nenabled = false\n')
    daemon = DaemonProcess(config, backend="nvml", env=nulldriver.environ(library, CARDS))
    with daemon:
        ready = daemon.wait_for(lambda: daemon.events("ready"), "ready", timeout_s=30)[0]
        assert ready["sum_limits_w"] <= BUDGET_W
        boot = [e for e in daemon.events("power_limit_set") if e["reason"] == "boot"]
        assert sorted(e["index"] for e in boot) == list(range(CARDS))
        assert {e["to_w"] for e in boot} == {BUDGET_W / CARDS}
        # Idle cards lend, busy ones borrow: both directions reach the C library.
        daemon.wait_for(lambda: {"lend", "reclaim"} <= {e["reason"] for e in daemon.events("power_limit_set")},
                        "a lend and a reclaim", timeout_s=30)
        assert daemon.stop() == 0
    # A healthy driver: no write failed, no reading was refused, frozen or unknown.
    assert [e for e in daemon.events() if e.get("level") in ("warning", "error")] == []
    writes = daemon.events("power_limit_set")
    assert all(e["sum_after_w"] <= BUDGET_W for e in writes if e["reason"] != "boot"), writes
    stopped = daemon.events("stopped")[-1]
    assert stopped["sum_limits_w"] <= BUDGET_W
    assert all(w <= BUDGET_W / CARDS for w in stopped["limits_w"])
