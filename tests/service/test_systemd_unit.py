"""The systemd unit: ``systemd-analyze verify`` passes, and it orders us as the brief asks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from support.paths import REPO

UNIT = REPO / "systemd" / "powerbudgetd.service"
IGNORE_HUP = "/usr/bin/env --ignore-signal=HUP"  # how ExecStart starts the daemon: SIGHUP ignored from exec


def directives(text: str) -> dict[str, list[str]]:
    """``Key=value`` lines (comments dropped), every value of a key kept in order."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this environment's
    # powerbudgetd for the check, everything else unchanged.
    exe = shutil.which("powerbudgetd", path=str(Path(sys.executable).parent))
    assert exe, "powerbudgetd is not installed next to this Python"
    text = UNIT.read_text()
    assert f"ExecStart={IGNORE_HUP} /opt/powerbudgetd/bin/powerbudgetd " in text
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(" /opt/powerbudgetd/bin/powerbudgetd run ", f" {exe} run ")
                    .replace("ExecStopPost=/opt/powerbudgetd/bin/powerbudgetd ", f"ExecStopPost={exe} "))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    # verify exits 0 on unknown keys and bad values too, but complains: demand silence
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_ordering_notify_and_hardening() -> None:
    d = directives(UNIT.read_text())
    assert d["Type"] == ["notify"]
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert d["Restart"] == ["on-failure"]
    assert d["Before"] == ["docker.service"]
    assert d["After"] == ["nvidia-persistenced.service"]
    assert d["WantedBy"] == ["docker.service multi-user.target"]
    assert "Requires" not in d and "BindsTo" not in d  # would take docker down with us
    assert int(d["WatchdogSec"][0]) > 0
    assert d["StateDirectory"] == ["powerbudgetd"]
    # keep /dev/nvidia* usable: ProtectClock= implies a DeviceAllow= rule on systemd 252
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert key not in d, key
    assert d["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN"]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelModules", "ProtectControlGroups"):
        assert d[key] == ["yes"], key
    assert d["ProtectSystem"] == ["strict"]
    assert d["ExecStart"][0].split()[3:] == ["run", "--config", "/etc/powerbudgetd/powerbudgetd.toml"]
    # Any exit leaves the cards at the reserve share: the failsafe command runs after it.
    assert d["ExecStopPost"][0].split()[1:] == ["failsafe", "--config", "/etc/powerbudgetd/powerbudgetd.toml"]


def test_restart_is_prevented_for_statuses_a_restart_cannot_fix() -> None:
    from powerbudgetd.errors import ExitStatus

    d = directives(UNIT.read_text())
    prevented = {int(v) for v in d["RestartPreventExitStatus"][0].split()}
    assert prevented == {
        ExitStatus.CONFIG, ExitStatus.INFEASIBLE, ExitStatus.NO_PERMISSION, ExitStatus.ALREADY_RUNNING,
        ExitStatus.DUPLICATE_HOST,
    }
    # NVML trouble and a boot timeout may clear on their own (a driver still loading)
    assert ExitStatus.NVML not in prevented and ExitStatus.BOOT_TIMEOUT not in prevented
    assert d["RuntimeDirectory"] == ["powerbudgetd"]  # where the instance lock lives
