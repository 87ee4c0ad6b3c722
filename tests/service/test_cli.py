"""The command line as a user runs it: simulate, probe, run --dry-run."""

from __future__ import annotations

import json

import pytest

from powerbudgetd.cli import main
from powerbudgetd_sim.simulate import run_scenario
from powerbudgetd_sim.scenario import load_scenario


def test_simulate_json_has_the_promised_keys(capsys):
    assert main(["simulate", "--json", "--duration", "30"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("scenario", "budget_w", "cards", "duration_s", "max_sum_enforced_limit_w", "violation_ticks",
                "max_sum_power_avg_w", "max_sum_power_instant_w", "cap_changes"):
        assert key in report
    assert report["scenario"] == "workstation-4" and report["budget_w"] == 1000
    assert len(report["cards"]) == 4


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 21))
def test_default_scenario_has_no_violation_for_seeds_1_to_20(seed):
    report = run_scenario(load_scenario("workstation-4"), seed=seed).report
    assert report["violation_ticks"] == 0
    assert report["max_sum_limit_bound_w"] <= 1000
    assert report["boot_s"] is not None and report["boot_s"] <= 0.5
    # lending happened: someone went above fair share while a neighbour idled
    assert any(c["limit_writes"] > 1 for c in report["cards"])


def test_simulate_plot_writes_a_png(tmp_path, capsys):
    out = tmp_path / "bank.png"
    assert main(["simulate", "--duration", "20", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "violation ticks      0" in capsys.readouterr().out


def test_simulate_list_and_unknown_scenario(capsys):
    assert main(["simulate", "--list"]) == 0
    assert "workstation-4" in capsys.readouterr().out
    assert main(["simulate", "--scenario", "nope"]) == 2
    assert "no scenario 'nope'" in capsys.readouterr().err


def test_probe_json_on_the_simulated_bank(capsys):
    assert main(["probe", "--backend", "sim", "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    g = gpus[0]
    assert (g["min_limit_w"], g["max_limit_w"], g["default_limit_w"]) == (150.0, 300.0, 300.0)
    assert g["enforced_limit_w"] == g["requested_limit_w"] == 300.0
    assert g["persistence_mode"] is True and g["power_avg_w"] > 0


def test_probe_compare_sim_marks_not_supported_against_a_value(capsys):
    # No GPU here: the "real" side is a simulated mixed bank whose last Ada card lacks
    # the power fields; the nearest presets (by name) have them.
    assert main(["probe", "--backend", "sim", "--scenario", "mixed-bank", "--compare-sim", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [g["preset"] for g in result["gpus"]] == ["rtx-pro-6000-maxq"] * 2 + ["rtx-6000-ada"] * 2
    differ = [(g["index"], c["call"]) for g in result["gpus"] for c in g["calls"] if not c["same_shape"]]
    assert differ == [(3, "nvmlDeviceGetFieldValues[185]"), (3, "nvmlDeviceGetFieldValues[186]")]
    assert result["differences"] == 2
    field = result["gpus"][3]["calls"][-1]
    assert field["real"] == {"error": "NVML_ERROR_NOT_SUPPORTED"}
    assert field["sim"]["type"] == "int" and field["sim"]["value_type"] == "1 (uiVal)"
    calls = {c["call"] for c in result["gpus"][0]["calls"]}
    assert {"nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetPersistenceMode"} <= calls


def test_probe_compare_sim_against_another_preset(capsys):
    assert main(["probe", "--backend", "sim", "--scenario", "h200-1", "--compare-sim", "--preset", "rtx-6000-ada"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200  vs simulated preset rtx-6000-ada" in out
    assert "[200000, 700000] (list)" in out and "[100000, 300000] (list)" in out  # mW, both sides
    assert "every call has the same shape" in out
    assert main(["probe", "--backend", "sim", "--compare-sim", "--preset", "nope"]) == 2
    assert "no preset card 'nope'" in capsys.readouterr().err
    assert main(["probe", "--backend", "sim", "--preset", "h200"]) == 2


@pytest.mark.slow  # the daemon as a subprocess
def test_run_dry_run_writes_nothing(tmp_path, launch):
    cfg = tmp_path / "pb.toml"
    cfg.write_text("budget_w = 1000\n[control]\ndonor_hold_s = 1.0\nrecipient_hold_s = 0.5\n[sim]\nscenario = 'one-busy'\n")
    daemon = launch(cfg, "--dry-run")
    daemon.wait_for(lambda: len([e for e in daemon.events("power_limit_would_set") if e["reason"] == "lend"]) >= 4,
                    "the four lending decisions")
    assert daemon.stop(20) == 0
    events = [json.loads(line) for line in daemon.output().splitlines()]
    names = [e["event"] for e in events]
    assert "power_limit_set" not in names
    would = [e for e in events if e["event"] == "power_limit_would_set"]
    assert [e["to_w"] for e in would if e["reason"] == "boot"] == [250.0] * 4
    lend = {(e["index"], e["to_w"]) for e in would if e["reason"] == "lend"}
    assert lend == {(1, 150.0), (2, 150.0), (3, 150.0), (0, 300.0)}  # what lending would do
    # The stop line tells what the cards have (untouched: 300 W), not what was decided.
    stopped = next(e for e in events if e["event"] == "stopped")
    assert stopped["dry_run"] is True and stopped["limits_w"] == [300.0] * 4
    assert "no limit was written" in stopped["note"]


def test_run_missing_config_is_an_error(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path / "none.toml"), "--backend", "sim"]) == 2
    assert "no such config file" in capsys.readouterr().err


def test_compare_sim_writes_nothing_on_either_side():
    from powerbudgetd_sim.compare import preset_bank
    from powerbudgetd_sim.libnvml import SimNvmlLibrary
    from powerbudgetd_sim.physics import CardSpec, SimBank
    from powerbudgetd_sim.scenario import MODELS

    from powerbudgetd.hw.nvml import Nvml
    from powerbudgetd.hw.probe import compare_sim

    real_bank = SimBank([CardSpec(uuid="GPU-r", persistence_mode=False, **MODELS["h200"])], seed=3)
    real = Nvml(SimNvmlLibrary(real_bank))
    real.init()
    sims: list[Nvml] = []

    def sim_for(cards):
        sims.append(preset_bank(["h200"] * len(cards)))
        return ["h200"] * len(cards), sims[0]

    result = compare_sim(real, sim_for)
    assert result["gpus"][0]["preset"] == "h200"
    persistence = next(c for c in result["gpus"][0]["calls"] if c["call"] == "nvmlDeviceGetPersistenceMode")
    assert (persistence["real"]["value"], persistence["sim"]["value"]) == (0, 1)
    assert persistence["same_shape"]
    sim_bank = sims[0].library.bank  # type: ignore[union-attr]
    for card in (*real_bank.cards, *sim_bank.cards):
        assert card.writes == 0 and card.requested_mw == card.default_mw
    assert real_bank.cards[0].persistence_mode is False
