"""One worst case: the daemon (its controller as ``run`` builds it), ``failsafe`` and
``check-config --backend`` count a card they cannot read or write alike, over every kind
of unknown card: excluded, no enforced limit, no limit at all with ``[cards] max_w``,
failing every call, lost, hung.

Three 150-300 W cards (default 300 W), each asked for 250 W before anything starts, so
a count at what a card reads (250 W) and one at its worst (300 W) differ. The kinds that
break enumeration happen once the daemon runs (from t = 2 s): ``run`` and ``check-config``
both refuse to start on such a bank alike (an NVML error), and the running daemon and
``failsafe`` count the card the same."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from powerbudgetd.config import load_config
from powerbudgetd.control.failsafe import failsafe
from powerbudgetd.errors import NvmlError
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.service.feasibility import check_feasible, floors, make_controller
from powerbudgetd_sim.libnvml import Fault, SimNvmlLibrary
from powerbudgetd_sim.physics import SimBank
from support.daemon import cli
from support.rig import card

UUID = "GPU-test-2"
LIMIT_CALLS = (
    "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceSetPowerManagementLimit",
)
FAULT_AT_S = 2.0

# kind -> (faults on card 2, its [cards] table, W it is counted at, breaks enumeration)
KINDS: dict[str, tuple[list[Fault], str, float, bool]] = {
    "excluded": ([], "exclude = true", 250.0, False),
    "excluded, no enforced limit": (
        [Fault("nvmlDeviceGetEnforcedPowerLimit", "NOT_SUPPORTED", card=2)], "exclude = true", 300.0, False),
    "no limit known, max_w set": (
        [Fault(call, "NOT_SUPPORTED", card=2) for call in LIMIT_CALLS], "max_w = 280", 280.0, False),
    "failing every call": ([Fault("*", "UNKNOWN", card=2, from_s=FAULT_AT_S)], "", 300.0, True),
    "lost": ([Fault("*", "GPU_IS_LOST", card=2, from_s=FAULT_AT_S)], "", 300.0, True),
    "hung": ([Fault("*", "HANG", card=2, from_s=FAULT_AT_S, delay_s=60.0)], "", 300.0, True),
}


def bank_nvml(faults: list[Fault]) -> tuple[SimBank, Nvml]:
    bank = SimBank([card(i) for i in range(3)], lag_s=0.1, seed=1)
    for c in bank.cards:
        c.set_limit(0.0, 250_000)
    bank.advance_to(1.0)
    nvml = Nvml(SimNvmlLibrary(bank, faults))
    nvml.init()
    return bank, nvml


@pytest.mark.parametrize("kind", KINDS)
def test_the_daemon_failsafe_and_check_config_count_an_unknown_card_alike(kind: str, tmp_path: Path) -> None:
    faults, table, counted_w, at_runtime = KINDS[kind]
    path = tmp_path / "powerbudgetd.toml"
    path.write_text(f'budget_w = 750\n[cards."{UUID}"]\n{table}\n' if table else "budget_w = 750\n")
    settings = load_config(path)

    # The daemon: its controller as run builds it, ticked past the fault (a card whose
    # reads time out is slow, kept at its bound, for confirm_timeout_s: then unreadable).
    bank, nvml = bank_nvml(faults)
    ctl = make_controller(nvml, settings)
    ctl.start()
    t = 1.0
    while t < FAULT_AT_S + settings.control.confirm_timeout_s + 0.5:
        bank.advance_to(t)
        ctl.tick(t)
        t = round(t + 0.1, 9)
    daemon_w = ctl.cards[2].bound_mw / 1000
    # failsafe, on the bank as the daemon left it.
    (lowered,) = [r for r in failsafe(nvml, 750.0, settings.overrides(), sleep=lambda s: None) if r.index == 2]
    failsafe_w = lowered.share_w if not lowered.reached else lowered.counted_w
    assert daemon_w == failsafe_w == counted_w, (daemon_w, failsafe_w)

    # check-config --backend, on a fresh bank: it counts the card as the others do, or
    # (the card breaks enumeration) refuses exactly as run's start does.
    bank, nvml = bank_nvml(faults)
    bank.advance_to(FAULT_AT_S if at_runtime else 1.0)
    if at_runtime:
        with pytest.raises(NvmlError) as by_check:
            check_feasible(nvml, settings)
        with pytest.raises(NvmlError) as by_run:
            make_controller(nvml, settings).start()
        assert type(by_check.value) is type(by_run.value)
        return
    (row,) = [f for f in floors(check_feasible(nvml, settings)) if f[0] == 2]
    assert row[2] is None and row[3] == counted_w


def test_check_config_counts_a_hung_card_within_runs_deadline(tmp_path: Path) -> None:
    """``check-config --backend sim`` on the workstation bank whose excluded card 1 hangs
    every power reading for 60 s of wall time: each call has run's deadline, so the
    command answers at once, counting the card at its worst case (300 W) as run and
    failsafe do; it waited on the hung call before."""
    (tmp_path / "bank.toml").write_text('bank = "workstation-4"\n[[faults]]\ncall = "nvmlDeviceGetPowerUsage"\n'
                                        'error = "SLOW"\ncard = 1\ndelay_s = 60\n')
    config = tmp_path / "pb.toml"
    config.write_text(f'budget_w = 1000\n[cards."1"]\nexclude = true\n[sim]\nscenario = "{tmp_path / "bank.toml"}"\n')
    t0 = time.monotonic()
    p = cli("check-config", str(config), "--backend", "sim", timeout=50)
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 20
    assert "GPU 1 (" in p.stdout and "not controlled, counted at 300 W" in p.stdout
