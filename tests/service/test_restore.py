"""The limits the daemon found, recorded at its first start, and ``powerbudgetd restore``.

As processes on a simulated bank kept in a state file (the cards keep their limits
between processes, as GPUs do): four 150-300 W cards set by hand to 300, 280, 260 and
240 W before the daemon first runs; the daemon boots them to its fair share and stops;
``restore`` must then give back exactly what it found, decreases first, and refuse
(writing nothing) when those limits sum over the budget unless given ``--force``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.daemon import DaemonProcess, cli, no_traceback

from powerbudgetd.errors import ExitStatus
from powerbudgetd.service.backend import make_nvml
from powerbudgetd.service.originals import FILE_NAME
from support.configs import config_file

FOUND_W = (300.0, 280.0, 260.0, 240.0)  # sum 1080 W


def set_by_hand(state: Path, limits_w: tuple[float, ...]) -> list[str]:
    """What an operator did with ``nvidia-smi -pl`` before installing; the UUIDs."""
    nvml = make_nvml("sim", "workstation-4", state_file=str(state))
    nvml.init()
    uuids = [d.uuid for d in nvml.devices()]
    for uuid, w in zip(uuids, limits_w):
        nvml.set_power_limit(uuid, w)
    nvml.shutdown()
    return uuids


def limits_w(state: Path) -> list[float]:
    return [c["requested_mw"] / 1000 for c in json.loads(state.read_text())["cards"]]


def config(tmp_path: Path, budget_w: float, scenario: str = "workstation-4") -> Path:
    return config_file(tmp_path / f"pb-{budget_w:g}.toml", f"[recorder]\ndir = '{tmp_path / 'rec'}'\n[metrics]\nenabled = false\n",
                       f"[sim]\nscenario = '{scenario}'\nlag_s = 0.05\nstate_file = '{tmp_path / 'cards.json'}'\n",
                       budget_w=budget_w)


def boot_and_stop(cfg: Path) -> DaemonProcess:
    daemon = DaemonProcess(cfg)
    with daemon:
        daemon.wait_for(lambda: daemon.events("ready"), "ready", timeout_s=60)
        assert daemon.stop() == 0
    return daemon


@pytest.fixture
def found(tmp_path: Path) -> list[str]:
    return set_by_hand(tmp_path / "cards.json", FOUND_W)


def test_first_start_records_what_it_found_and_a_restart_keeps_it(tmp_path: Path, found: list[str]) -> None:
    cfg = config(tmp_path, 1100)
    daemon = boot_and_stop(cfg)
    record = tmp_path / "rec" / FILE_NAME  # beside the flight recorder's log
    cards = json.loads(record.read_text())["cards"]
    assert {u: c["limit_w"] for u, c in cards.items()} == dict(zip(found, FOUND_W))
    assert daemon.events("original_limits_recorded")[0]["uuids"] == found
    assert limits_w(tmp_path / "cards.json") == [275.0] * 4  # the daemon's fair share, left at stop
    before = record.read_bytes()
    again = boot_and_stop(cfg)  # the cards now hold the daemon's shares: not the operator's limits
    assert record.read_bytes() == before
    assert again.events("original_limits_recorded") == []


def test_the_limits_are_recorded_on_a_host_slower_than_a_tick_s_call_deadline(tmp_path: Path, found: list[str]) -> None:
    """A host loaded at boot: the first NVML calls take 0.3 s, six times the tick's call
    deadline (50 ms). The record is taken once, before any write, with nothing waiting on
    it: it is still taken, every card in it, and `restore` can give the limits back."""
    bank = tmp_path / "slow-boot.toml"
    bank.write_text('bank = "workstation-4"\nlag_s = 0.05\n'
                    + "".join(f'[[faults]]\ncall = "{call}"\nerror = "SLOW"\ndelay_s = 0.3\ncount = 1\n'
                              for call in ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex")))
    boot_and_stop(config(tmp_path, 1100, scenario=str(bank)))
    record = json.loads((tmp_path / "rec" / FILE_NAME).read_text())
    assert sorted(record["cards"]) == sorted(found), record


def test_restore_gives_back_exactly_what_was_found_decreases_first(tmp_path: Path, found: list[str]) -> None:
    cfg = config(tmp_path, 1100)
    boot_and_stop(cfg)
    p = cli("restore", "--backend", "sim", "--config", str(cfg))
    no_traceback(p)
    assert p.returncode == ExitStatus.OK, p.stderr
    assert limits_w(tmp_path / "cards.json") == list(FOUND_W)
    lines = [line for line in p.stdout.splitlines() if line.startswith("GPU ")]
    # 275 -> 240 and 275 -> 260 are decreases: both before either increase
    order = [line.split()[2].rstrip(":") for line in lines]
    assert set(order[:2]) == {found[2], found[3]} and set(order[2:]) == {found[0], found[1]}, p.stdout


def test_restore_refuses_originals_over_the_budget_without_force(tmp_path: Path, found: list[str]) -> None:
    boot_and_stop(config(tmp_path, 1000))  # fair share 250 W each
    cfg = config(tmp_path, 1000)
    p = cli("restore", "--backend", "sim", "--config", str(cfg))
    no_traceback(p)
    assert p.returncode == ExitStatus.ERROR
    assert "sum to 1080 W, 80 W over the budget of 1000 W" in p.stderr and "--force" in p.stderr
    assert limits_w(tmp_path / "cards.json") == [250.0] * 4  # nothing written
    forced = cli("restore", "--backend", "sim", "--config", str(cfg), "--force")
    assert forced.returncode == ExitStatus.OK, forced.stderr
    assert "80 W over" in forced.stderr
    assert limits_w(tmp_path / "cards.json") == list(FOUND_W)


def test_restore_refuses_while_the_daemon_runs(tmp_path: Path, found: list[str]) -> None:
    cfg = config(tmp_path, 1100)
    with DaemonProcess(cfg) as daemon:
        daemon.wait_for(lambda: daemon.events("ready"), "ready", timeout_s=60)
        p = cli("restore", "--backend", "sim", "--config", str(cfg))
        assert p.returncode == ExitStatus.ALREADY_RUNNING and "stop it first" in p.stderr
        assert daemon.stop() == 0


def test_restore_without_a_record_says_where_it_looked(tmp_path: Path) -> None:
    cfg = config(tmp_path, 1100)
    p = cli("restore", "--backend", "sim", "--config", str(cfg))
    no_traceback(p)
    assert p.returncode == ExitStatus.CONFIG
    assert FILE_NAME in p.stderr and "first start" in p.stderr


def test_a_decrease_not_taken_stops_restore_before_any_increase(tmp_path: Path, found: list[str]) -> None:
    # The shares are 275 W each; the record asks 300, 280 (increases) and 260, 240
    # (decreases). Card 3 refuses every write: its decrease fails, so neither increase
    # may be sent (they would spend watts that were never freed).
    cfg = config(tmp_path, 1100)
    boot_and_stop(cfg)
    (tmp_path / "bank.toml").write_text('bank = "workstation-4"\nlag_s = 0.05\n[[faults]]\n'
                                        'call = "nvmlDeviceSetPowerManagementLimit"\nerror = "UNKNOWN"\ncard = 3\n')
    faulty = tmp_path / "faulty.toml"
    faulty.write_text(cfg.read_text().replace("scenario = 'workstation-4'", f"scenario = '{tmp_path / 'bank.toml'}'"))
    p = cli("restore", "--backend", "sim", "--config", str(faulty))
    no_traceback(p)
    assert p.returncode == ExitStatus.ERROR and "not restored" in p.stderr, p.stdout + p.stderr
    assert limits_w(tmp_path / "cards.json") == [275.0, 275.0, 260.0, 275.0]
    assert f"{found[3]}: 275 W -> 240 W FAILED" in p.stdout
    assert sum(limits_w(tmp_path / "cards.json")) <= 1100
