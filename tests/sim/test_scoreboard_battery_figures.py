"""The scoreboard page's battery figures for the packaged `power-event` are the ones
`simulate` prints (virtual time: the same on every machine): the runtime static leaves and the runtime powerbudgetd leaves, in minutes to one
decimal."""

from __future__ import annotations

import json
import re
from support.paths import REPO

import pytest

from powerbudgetd.cli import main

SCOREBOARD = REPO / "docs" / "design" / "scoreboard.md"


def runtime_min(policy: str, capsys: pytest.CaptureFixture[str]) -> float:
    assert main(["simulate", "--scenario", "power-event", "--policy", policy, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["battery"]["runtime_left_s"] / 60


def test_the_scoreboard_pages_power_event_runtimes_are_what_simulate_prints(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(SCOREBOARD.read_text().split())
    m = re.search(r"Static and slurm leave (\d+\.\d) min of runtime, powerbudgetd (\d+\.\d) min", text)
    assert m, "the scoreboard page's power-event line moved: keep this test with it"
    assert f"{runtime_min('static', capsys):.1f}" == m.group(1)
    assert f"{runtime_min('powerbudgetd', capsys):.1f}" == m.group(2)
