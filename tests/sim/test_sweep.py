"""Hosts per feed (``sim/sweep.py``, ``simulate --sweep``): on a tree small enough to work
out by hand, the sweep finds the nameplate count and each policy's largest count with
zero trips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from powerbudgetd_sim.scenario import load_scenario
from powerbudgetd_sim.sweep import layout, load_template, nameplate_count, nameplate_wall_w, sweep

# Four 300 W cards (the workstation-4 bank: min 150 W) busy at 300 W for good; the host
# draws 100 W at an efficiency of 1: a nameplate of 4 x 300 + 100 = 1300 W at the wall.
SCENARIO = """
name = "four-busy"
description = "four 300 W cards at their max for good"
bank = "workstation-4"
budget_w = 1200
duration_s = 60
seed = 1

[feed]
host_w = 100
psu_efficiency = 1.0
breaker_a = 15
volts = 120
""" + "".join('\n[[cards]]\nphases = [{ at_s = 0, kind = "constant", power_w = 300, workload = "compute" }]\n'
              for _ in range(4))

# One PDU: a 72 A breaker at 100 V, 7200 W; its continuous rating 0.8 x 7200 = 5760 W.
TREE = """
[nodes.pdu]
kind = "pdu"
breaker_a = 72
volts = 100

[hosts]
h1 = {{ cords = {{ pdu = 1.0 }}, reserve_w = 700 }}

[sim.scenarios]
h1 = "{scenario}"
"""


@pytest.fixture(scope="module")
def tiny_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    (d / "four-busy.toml").write_text(SCENARIO)
    path = d / "tree.toml"
    path.write_text(TREE.format(scenario=d / "four-busy.toml"))
    return path


def test_the_nameplate_count_is_the_most_hosts_whose_nameplates_fit_the_rating(tiny_tree: Path) -> None:
    """5760 W // 1300 W = 4 hosts (5200 W; 5 would be 6500 W)."""
    t = load_template(str(tiny_tree))
    scenario_of = {n: load_scenario(n) for n in t.scenarios.values()}
    assert nameplate_wall_w(next(iter(scenario_of.values()))) == pytest.approx(1300.0)
    assert nameplate_count(t, scenario_of) == 4
    lay = layout(t, 6, scenario_of)
    assert sorted(lay.tree.hosts) == ["h1", "h1~2", "h1~3", "h1~4", "h1~5", "h1~6"]


def test_the_sweep_finds_the_hand_computed_answer(tiny_tree: Path) -> None:
    """Counts 4, 5, 6 (N x 1.0 ... 1.5, rounded). Nameplate: 5 hosts draw 6500 W, 90 % of
    the breaker (holds); 6 draw 7800 W, 108 %: the thermal element heats on net (mean
    (I/rating)^2 1.17 > 1), a trip. So nameplate's largest is 5. The best static cap at 6
    hosts: 6 x (4 x 300 f + 100) <= 7200 W for f <= 0.917: 0.90 holds (7080 W, 98 %),
    0.95 trips (7440 W). powerbudgetd and the oracle hold the rating's 5760 W: no trip at
    6. At N, nothing is capped: powerbudgetd does the unconstrained work."""
    r = sweep(str(tiny_tree), duration_s=20.0)
    assert r["nameplate_count"] == 4
    assert [row["count"] for row in r["rows"]] == [4, 5, 6]
    assert r["largest_zero_trip_count"] == {"nameplate": 5, "best-cap": 6, "powerbudgetd": 6, "oracle": 6}
    six = r["rows"][-1]["runs"]
    assert six["nameplate"]["trips"] and "pdu" in six["nameplate"]["trips"]
    assert six["best-cap"]["cap_fraction"] == pytest.approx(0.90)
    assert r["rows"][1]["runs"]["best-cap"]["cap_fraction"] == pytest.approx(1.0)
    at_n = r["rows"][0]["runs"]
    assert at_n["nameplate"]["work_per_host"] == 1.0
    assert at_n["powerbudgetd"]["work_per_host"] >= 0.98
    assert at_n["powerbudgetd"]["satisfaction_mean"] >= 0.99
    # At 6 hosts every policy that holds the rating does less work per host than at N.
    assert six["powerbudgetd"]["work_per_host"] < at_n["powerbudgetd"]["work_per_host"]
    assert six["powerbudgetd"]["satisfaction"]["pdu"]["p5"] <= six["powerbudgetd"]["satisfaction"]["pdu"]["mean"] < 1.0


def test_the_command_prints_the_table_and_writes_the_plot(tiny_tree: Path, tmp_path: Path) -> None:
    plot = tmp_path / "sweep.png"
    out = subprocess.run([sys.executable, "-m", "powerbudgetd", "simulate", "--sweep", "--tree", str(tiny_tree),
                          "--duration", "12", "--plot", str(plot)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "nameplate N = 4 hosts" in out.stdout and "largest count with zero trips" in out.stdout
    assert plot.stat().st_size > 0


def test_sweep_without_a_tree_is_refused() -> None:
    out = subprocess.run([sys.executable, "-m", "powerbudgetd", "simulate", "--sweep"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--sweep needs --tree" in out.stderr


def test_the_sweep_runs_on_inference_demand(tiny_tree: Path) -> None:
    import json

    out = subprocess.run([sys.executable, "-m", "powerbudgetd", "simulate", "--sweep", "--tree", str(tiny_tree),
                          "--duration", "8", "--demand", "inference", "--seed", "3", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["demand"] == "inference" and r["nameplate_count"] == 4
    # Inference demand sits under the cards' max most of a day: nameplate carries 1.5 N
    # (6 hosts); the command goes on past the steps until it trips (7 hosts, 1.75 N).
    assert r["largest_zero_trip_count"]["nameplate"] == 6
    assert r["rows"][-1]["count"] == 7 and r["rows"][-1]["runs"]["nameplate"]["trips"]
    assert r["largest_zero_trip_count"]["powerbudgetd"] == 7
    assert all(0 < row["runs"]["powerbudgetd"]["work_per_host"] <= 1.01 for row in r["rows"])


@pytest.mark.slow
def test_the_packaged_lab_carries_one_third_more_hosts_than_its_nameplate_under_powerbudgetd() -> None:
    """lab-2: its eight hosts' nameplates fit its two circuits (N = 8); at 1.3 N (10
    hosts) powerbudgetd trips nothing."""
    r = sweep("lab-2", duration_s=10.0, steps=(1.0, 1.3))
    assert r["nameplate_count"] == 8
    assert [row["count"] for row in r["rows"]] == [8, 10]
    assert r["largest_zero_trip_count"]["powerbudgetd"] == 10


def test_a_count_where_powerbudgetd_does_more_than_the_oracle_gets_a_line_saying_why() -> None:
    from powerbudgetd_sim.sweep import POLICIES, format_sweep

    def run(work: float) -> dict:
        return {"trips": {}, "cap_fraction": None, "work_per_host": work, "satisfaction_mean": 1.0, "satisfaction_p5": 1.0}

    works = {"nameplate": 1.0, "best-cap": 1.0, "powerbudgetd": 0.907, "oracle": 0.898}
    result = {"tree": "t", "demand": "scenario", "nameplate_count": 26, "duration_s": 30.0,
              "rows": [{"count": 39, "feed_lost": None, "runs": {p: run(works[p]) for p in POLICIES}}],
              "largest_zero_trip_count": {p: 39 for p in POLICIES}}
    text = format_sweep(result)
    assert "39 hosts: powerbudgetd 0.907 above the oracle's 0.898" in text and "bounds the division, not the work" in text
    works["powerbudgetd"] = 0.898
    result["rows"][0]["runs"] = {p: run(works[p]) for p in POLICIES}
    assert "above the oracle" not in format_sweep(result)
