"""Replaying a recorded log through the simulator: `simulate --replay`."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean

import pytest

from powerbudgetd.cli import main
from powerbudgetd.core.model import Timings
from powerbudgetd.powerlog.recorder import LogWriter, Recorder
from powerbudgetd.powerlog.reader import load_samples, scan_log
from powerbudgetd_sim.simulate import run_scenario
from powerbudgetd_sim.replay import ReplayProfile, load_replay
from powerbudgetd_sim.scenario import ScenarioError
from support.daemon import cli
from support.rig import scenario_rig

T0 = 1_750_000_000.0
# Lending off: every card stays at fair share, the caps a static split would set.
STATIC = Timings(tick_s=0.1, donor_hold_s=1e9, recipient_hold_s=1e9)


def record(directory: Path, scenario: str, duration_s: float, timings: Timings = STATIC) -> None:
    """Run ``scenario`` under the controller on virtual time with the recorder on."""
    rig = scenario_rig(scenario, timings)
    writer = LogWriter(directory, queue_records=100_000)
    rec = Recorder(writer, interval_s=1.0, wall_clock=lambda: T0 + rig.bank.now)
    rig.listen(rec.on_tick)
    rig.ticks(round(duration_s / timings.tick_s) + 1)  # t = 0 .. duration_s
    writer.submit(rec.end_record())
    writer.close()


# The tests on this log are marked slow: 300 s of bank time with the recorder on.
@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("log")
    record(d, "workstation-4", 300.0)
    return d


@pytest.mark.slow
def test_a_replay_at_the_recorded_caps_reproduces_the_recorded_sums(recorded: Path) -> None:
    """Tolerance: the bank's mean draw within 0.5 %, its highest 1 s average within 1 %,
    and second by second within 0.5 % of the budget on average. Measured: 0.03 %, 0.04 %
    and 0.04 % (0.4 W); the replay is fed 1 s means, the physics adds +-1 % noise."""
    samples, _ = load_samples(scan_log(recorded).files)
    sc = load_replay(recorded)
    assert sc.budget_w == 1000 and len(sc.cards) == 4 and sc.duration_s == pytest.approx(300.0)
    assert [c.min_w for c in sc.cards] == [150.0] * 4 and [c.max_w for c in sc.cards] == [300.0] * 4
    assert [c.uuid for c in sc.cards] == [c.uuid for c in samples[-1].cards]
    result = run_scenario(sc, timings=STATIC, keep_series=True)
    r = result.report
    assert r["violation_ticks"] == 0
    assert [c["final_limit_w"] for c in r["cards"]] == [c.limit_w for c in samples[-1].cards] == [250.0] * 4

    recorded_mean = fmean(s.bank_avg_w for s in samples)
    replayed_mean = sum(c["mean_power_w"] for c in r["cards"])
    assert replayed_mean == pytest.approx(recorded_mean, rel=0.005)
    recorded_max = max(s.bank_avg_w for s in samples)
    assert r["max_sum_power_avg_w"] == pytest.approx(recorded_max, rel=0.01)
    # Second by second: the replayed bank's 1 s average at each record's time.
    series = result.series
    at = {round(t, 1): sum(row) for t, row in zip(series.t, series.avg_w)}
    errors = [abs(at[round(s.mono_s, 1)] - s.bank_avg_w) for s in samples if s.mono_s >= 2]
    assert fmean(errors) < 0.005 * sc.budget_w


@pytest.mark.slow
def test_a_lower_budget_replayed_caps_lower_and_stays_within_it(recorded: Path) -> None:
    sc = load_replay(recorded, budget_w=800)
    r = run_scenario(sc, timings=STATIC, duration_s=60).report
    assert r["violation_ticks"] == 0 and r["max_sum_limit_bound_w"] <= 800
    assert [c["final_limit_w"] for c in r["cards"]] == [200.0] * 4


@pytest.mark.slow
def test_peak_draw_replays_the_worst_moments(recorded: Path) -> None:
    avg = run_scenario(load_replay(recorded), timings=STATIC, duration_s=150).report
    peak = run_scenario(load_replay(recorded, draw="peak"), timings=STATIC, duration_s=150).report
    assert sum(c["mean_power_w"] for c in peak["cards"]) > sum(c["mean_power_w"] for c in avg["cards"])


def test_the_replay_profile_steps_through_records_and_idles_in_gaps() -> None:
    p = ReplayProfile(times=(1.0, 2.0, 9.0, 10.0), watts=(100.0, 200.0, None, 300.0))
    got = [p.demand_w(t, idle_w=20.0, tgp_w=250.0) for t in (0.0, 0.5, 1.0, 1.5, 2.0, 5.0, 9.5, 10.0, 11.0)]
    # never clipped at the rated power: a recorded peak above it is what the card drew
    assert got == [100.0, 100.0, 100.0, 200.0, 200.0, 20.0, 300.0, 300.0, 20.0]


@pytest.mark.slow
def test_gaps_between_runs_replay_as_idle(tmp_path: Path, recorded: Path) -> None:
    """Two runs an hour apart: the hour between replays at idle, not at the last draw."""
    for p in sorted(recorded.glob("power-*.jsonl")):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    later = tmp_path / "power-00000099-20250615T020000Z.jsonl"
    lines = [json.loads(x) for x in next(iter(sorted(recorded.glob("power-*.jsonl")))).read_text().splitlines()]
    from powerbudgetd.powerlog.recorder import utc_iso
    from powerbudgetd.powerlog.reader import epoch

    shifted = [dict(rec, utc=utc_iso(epoch(rec["utc"]) + 3600), run="later") for rec in lines[:11]]
    later.write_text("".join(json.dumps(r) + "\n" for r in shifted))
    sc = load_replay(tmp_path)
    prof = sc.cards[0].profile
    assert sc.duration_s == pytest.approx(3600 + 10.0)
    assert prof.demand_w(1800.0, idle_w=30.0, tgp_w=300.0) == 30.0  # the gap
    assert prof.demand_w(300.0, idle_w=30.0, tgp_w=300.0) > 100.0  # GPU 0 serving, before it


@pytest.mark.slow
def test_simulate_replay_cli(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--replay", str(recorded), "--budget", "900", "--duration", "60", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["scenario"] == f"replay:{recorded.name}" and r["budget_w"] == 900 and r["duration_s"] == 60
    assert r["violation_ticks"] == 0 and r["max_sum_limit_bound_w"] <= 900
    assert main(["simulate", "--replay", str(recorded / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["simulate", "--budget", "-5"]) == 2


def test_nothing_to_replay(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no recorder files"):
        load_replay(tmp_path)
    with pytest.raises(ScenarioError, match="draw must be"):
        load_replay(tmp_path, draw="median")


def test_simulate_replay_with_a_budget_says_the_budget_it_ran_at(recorded: Path) -> None:
    """`simulate --replay DIR --budget 700`: the report's description names 700 W (given
    with --budget), never the recorded budget."""
    p = cli("simulate", "--replay", str(recorded), "--budget", "700", "--duration", "5", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["budget_w"] == 700
    text = cli("simulate", "--replay", str(recorded), "--budget", "700", "--duration", "5").stdout
    assert "replayed at 700 W (--budget)" in text and "replayed at 800 W" not in text, text
