"""[cards] settings that would do nothing are said, at start and by check-config."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from powerbudgetd.cli import main
from powerbudgetd.control.controller import Controller
from powerbudgetd.core.model import CardOverride
from powerbudgetd.service.backend import make_nvml


def test_unmatched_keys_and_a_max_below_the_floor_are_warned_at_start() -> None:
    nvml = make_nvml("sim")  # workstation-4: GPU 0-3, floors 150 W
    nvml.init()
    overrides = {"GPU-typo": CardOverride(max_w=160), "7": CardOverride(max_w=250), "0": CardOverride(max_w=100)}
    with capture_logs() as logs:
        ctl = Controller(nvml, 1000, overrides=overrides, dry_run=True)
        ctl.start()
    said = [e["detail"] for e in logs if e["event"] == "card_override_ignored"]
    assert len(said) == 3
    assert any('[cards."GPU-typo"] matches no card' in s for s in said)
    assert any('[cards."7"] matches no card' in s for s in said)
    assert any("max_w 100 W for GPU 0 is below its minimum limit 150 W" in s for s in said)
    assert ctl.cards[0].max_mw == 150_000  # the floor wins
    nvml.shutdown()


def test_check_config_with_a_backend_prints_the_same_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pb.toml"
    cfg.write_text('budget_w = 1000\n[cards."GPU-typo"]\nmax_w = 160\n')
    assert main(["check-config", str(cfg), "--backend", "sim"]) == 0
    out = capsys.readouterr().out
    assert 'warning: [cards."GPU-typo"] matches no card' in out


def test_an_excluded_card_is_a_choice_not_an_outside_over_budget_cause() -> None:
    from support.rig import busy, card, make_rig

    with capture_logs() as logs:
        rig = make_rig([card(0, busy()), card(1), card(2)], 700, overrides={"GPU-test-0": CardOverride(exclude=True)})
        rig.run(3.0)
    over = [e for e in logs if e["event"] == "over_budget"]
    assert over and all(e["log_level"] == "info" for e in over)  # boot's descent only
    assert rig.ctl.over.episodes == 1
    assert rig.ctl.sum_bound_mw <= 700_000  # 300 W excluded + the others at 200 W
