"""The work model: the brief's throughput table, and work per refresh on a simulated bank."""

import pytest

from powerbudgetd_sim.simulate import run_scenario
from powerbudgetd_sim.scenario import parse_scenario
from powerbudgetd_sim.work import CURVES, POWER_FRACTIONS, demand_weight, throughput_fraction, work_rate


@pytest.mark.parametrize("workload", ["compute", "memory"])
def test_curve_passes_through_the_table(workload):
    for x, y in zip(POWER_FRACTIONS, CURVES[workload]):
        assert throughput_fraction(workload, x) == pytest.approx(y)


@pytest.mark.parametrize("workload", ["compute", "memory"])
def test_curve_is_monotone_from_zero_to_one(workload):
    xs = [i / 200 for i in range(0, 241)]
    ys = [throughput_fraction(workload, x) for x in xs]
    assert ys[0] == 0.0 and ys[-1] == 1.0
    assert all(b >= a for a, b in zip(ys, ys[1:]))


def test_interpolates_between_points():
    # halfway between 0.57 (0.60) and 0.71 (0.85) on the compute curve
    assert throughput_fraction("compute", 0.64) == pytest.approx(0.725)


def test_unknown_workload_is_refused():
    with pytest.raises(KeyError):
        throughput_fraction("graphics", 0.5)


def test_work_rate_uncapped_is_shaped_by_demand_over_tgp():
    assert work_rate("compute", 300, 300, 30, 300) == pytest.approx(1.0)
    assert work_rate("compute", 30, 300, 30, 300) == 0.0  # idle draw buys no work
    assert work_rate("memory", 165, 300, 30, 300) == pytest.approx(0.5)
    assert demand_weight(400, 30, 300) == 1.0


def test_a_cap_above_demand_costs_nothing_and_below_follows_the_curve():
    assert work_rate("memory", 165, 250, 30, 300) == work_rate("memory", 165, 165, 30, 300)
    assert work_rate("compute", 300, 213, 30, 300) == pytest.approx(0.85)  # 71 % of TGP
    # decode drawing 40 % of TGP lends almost for free: capped to 71 % of its draw
    decode = work_rate("memory", 120, 300, 0, 300)
    assert work_rate("memory", 120, 120 * 0.71, 0, 300) == pytest.approx(0.97 * decode)


def _one_card(power_w, workload="compute", budget_w=300.0):
    return parse_scenario({
        "budget_w": budget_w, "duration_s": 10, "cards": [{
            "name": "card", "min_w": 100, "max_w": 300, "default_w": 300, "idle_w": 30,
            "phases": [{"at_s": 0, "kind": "constant", "power_w": power_w, "workload": workload}],
        }],
    })


def test_meter_integrates_work_every_refresh():
    # 101 refreshes (0.0 .. 10.0 s) of 0.1 s at full rate
    r = run_scenario(_one_card(300), policy="static", compare=False).report
    assert r["work"] == pytest.approx(10.1, abs=1e-6)
    assert r["cards"][0]["work"] == pytest.approx(10.1, abs=1e-3)


def test_meter_charges_the_cap():
    # fair share 200 W of 300 W: 67 % of TGP on the compute curve, after boot
    r = run_scenario(_one_card(300, budget_w=200.0), policy="static", compare=False).report
    expected = throughput_fraction("compute", 200 / 300)
    assert r["work"] == pytest.approx(10.1 * expected, abs=0.1)
    assert r["work"] < 10.1 * 0.8
