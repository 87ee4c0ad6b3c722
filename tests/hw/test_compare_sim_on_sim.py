"""`probe --compare-sim --backend sim` (the command NVML's absence suggests) compares the
simulated bank with the simulator's presets: it says so, and never that the calls were
checked on real cards."""

from __future__ import annotations

import json

from powerbudgetd.cli import main


def test_the_simulated_bank_is_not_called_real(capsys) -> None:
    assert main(["probe", "--compare-sim", "--backend", "sim"]) == 0
    out = capsys.readouterr().out
    assert "on the real cards" not in out and " real " not in out.splitlines()[1]
    assert "the simulated bank (--backend sim)" in out.splitlines()[-1]
    assert "not real cards" in out.splitlines()[-1]


def test_the_json_says_which_backend_answered(capsys) -> None:
    assert main(["probe", "--compare-sim", "--backend", "sim", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "sim"
