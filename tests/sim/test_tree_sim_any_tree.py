"""The simulator plays any tree ``check-config`` accepts: each pair in its own mode, a
policy the tree cannot be played under said on its row, a seat below its scenario's
floor refused with a line, and a scoreboard whose figures are consistent."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.cli import main
from powerbudgetd.errors import ExitStatus
from powerbudgetd_sim.tree import compare, format_compare

# Room 1: a redundant pair (not listed: the default); room 2: an oversubscribed pair whose
# seats fit only oversubscribed (4 x 450 W whole on a 1000 W side would not).
MIXED = """
[nodes.site]
budget_w = 20000
[nodes.r1]
parent = "site"
budget_w = 5000
[nodes.a1]
parent = "r1"
budget_w = 1000
[nodes.b1]
parent = "r1"
budget_w = 1000
[nodes.r2]
parent = "site"
budget_w = 5000
[nodes.a2]
parent = "r2"
budget_w = 1000
[nodes.b2]
parent = "r2"
budget_w = 1000

[[pairs]]
feeds = ["a2", "b2"]
mode = "oversubscribed"
shed_s = 2

[hosts]
x1 = {{ cords = {{ a1 = 0.5, b1 = 0.5 }}, reserve_w = {seat} }}
x2 = {{ cords = {{ a1 = 0.5, b1 = 0.5 }}, reserve_w = 450 }}
y1 = {{ cords = {{ a2 = 0.5, b2 = 0.5 }}, reserve_w = 450 }}
y2 = {{ cords = {{ a2 = 0.5, b2 = 0.5 }}, reserve_w = 450 }}
y3 = {{ cords = {{ a2 = 0.5, b2 = 0.5 }}, reserve_w = 450 }}
y4 = {{ cords = {{ a2 = 0.5, b2 = 0.5 }}, reserve_w = 450 }}

[sim]
feed_lost = "a1"
scenarios = {{ x1 = "ada-2", x2 = "ada-2", y1 = "ada-2", y2 = "ada-2", y3 = "ada-2", y4 = "ada-2" }}
"""


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    path = tmp_path / "mixed.toml"
    path.write_text(MIXED.format(seat=450))
    return path


def test_a_mixed_tree_plays_each_pair_in_its_own_mode_and_says_which_policies_it_cannot(mixed, capsys):
    result = compare(str(mixed), duration_s=10.0, lost_at_s=5.0)
    assert result["static"]["refused"].startswith("the redundant division leaves 4 host(s) below the floor")
    assert result["redundant"]["refused"] == "the seats do not fit every pair redundant: node a2 over by 800 W"
    declared, over = result["declared"], result["oversubscribed"]
    assert declared["mode"] == "oversubscribed/redundant" and over["mode"] == "oversubscribed"
    # The lost feed is the redundant pair's side: as declared, nothing had to be shed.
    assert declared["shed_s"] == 0 and result["oracle"]["shed_s"] == 0
    for r in (declared, over, result["oracle"]):
        assert r["trips"] == {} and r["records_over_w"] == 0 and r["limits_over_w"] == 0
    text = format_compare(result).splitlines()
    assert any(line.startswith("  static          not played: the redundant division") for line in text)
    assert any(line.startswith("  redundant       not played: the seats do not fit") for line in text)


def test_a_seat_below_its_scenarios_floor_is_refused_with_a_line(tmp_path, capsys):
    path = tmp_path / "low.toml"
    path.write_text(MIXED.format(seat=300))
    assert main(["simulate", "--circuit", "--tree", str(path), "--duration", "5"]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines() == [
        f"powerbudgetd: --tree: {path}: hosts.x1.reserve_w: 300 W is below the floor of its scenario ada-2 "
        "(445 W at the wall: every card at its minimum limit)"]


def scoreboard(works: dict[str, float], survivors: bool) -> dict:
    row = {"hosts": 2, "duration_s": 10.0, "feed_lost": "a", "lost_at_s": 5.0, "trips": {}, "records_over_w": 0.0,
           "limits_over_w": 0.0, "shed_s": 0.5, "draw_shed_s": 0.0, "shed_s_stated": 2.0,
           "survivors": [{"node": "b", "budget_w": 100.0, "worst_limits_w": 120.0, "worst_instant_w": 130.0,
                          "instant_of_rating": 0.9, "tolerance_s": None, "margin_s": None}] if survivors else []}
    return {p: {**row, "policy": p, "work_tgp_s": w, "work_vs_oracle": round(w / works["oracle"], 3),
                "above_oracle_share_ws": 42.0 if w > works["oracle"] else 0.0} for p, w in works.items()}


def test_no_policy_above_the_oracle_without_a_line_saying_why_and_no_header_without_rows():
    text = format_compare(scoreboard({"declared": 101.0, "oracle": 100.0}, survivors=False)).splitlines()
    why = [line for line in text if line.startswith("  declared: 1.01 of the oracle")]
    assert len(why) == 1 and "42 W-s in use above those shares" in why[0]
    assert not any(line.endswith("while it was over its budget:") for line in text)
    assert "  declared: shed in 0.5 s (stated 2 s); no surviving node with a breaker or UPS went over its budget" in text
    text = format_compare(scoreboard({"declared": 99.0, "oracle": 100.0}, survivors=True)).splitlines()
    assert not any("of the oracle:" in line for line in text)
    headers = [i for i, line in enumerate(text) if line.endswith("while it was over its budget:")]
    assert headers and all(text[i + 1].startswith("    b ") for i in headers)
