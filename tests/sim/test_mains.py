"""A UPS battery in a scenario's [feed]: outages, the energy drawn, the runtime left."""

from __future__ import annotations

import math

import pytest

from powerbudgetd_sim.mains import Battery, Mains
from powerbudgetd_sim.scenario import ScenarioError, load_scenario, parse_scenario

FEED = {"host_w": 300, "psu_efficiency": 0.9, "breaker_a": 15, "volts": 120, "ups_w": 1500}


def test_outages_and_battery_arithmetic() -> None:
    mains = Mains.from_feed({**FEED, "battery_wh": 100, "mains_lost": [[10, 20], [30]]})
    assert mains is not None and mains.outages == ((10.0, 20.0), (30.0, math.inf))
    assert not mains.lost(9.9) and mains.lost(10) and not mains.lost(20) and mains.lost(1e9)
    b = Battery(mains)
    for k in range(400):  # 40 s at 900 W, 0.1 s steps: 10 s + 10 s on battery
        b.step(k * 0.1, 900.0, 0.1)
    s = b.summary()
    assert s["on_battery_s"] == pytest.approx(20.0, abs=0.11)
    assert s["energy_left_wh"] == pytest.approx(100 - 900 * 20 / 3600, abs=0.1)
    assert s["runtime_left_s"] == pytest.approx(s["energy_left_wh"] * 3600 / 900, rel=1e-2)
    assert s["empty_at_s"] is None


def test_an_empty_battery_is_the_end() -> None:
    b = Battery(Mains(1.0, ((0.0, math.inf),)))  # 1 Wh at 1800 W: 2 s
    for k in range(50):
        b.step(k * 0.1, 1800.0, 0.1)
    assert b.summary()["empty_at_s"] == pytest.approx(1.9, abs=0.11)


@pytest.mark.parametrize(("feed", "match"), [
    ({**FEED, "mains_lost": [[10, 20]]}, "needs feed.battery_wh"),
    ({k: v for k, v in FEED.items() if k != "ups_w"} | {"battery_wh": 100}, "needs feed.ups_w"),
    ({**FEED, "battery_wh": 100, "mains_lost": [[20, 10]]}, "in order"),
    ({**FEED, "battery_wh": 100, "mains_lost": [[10, 20], [15, 30]]}, "in order"),
    ({**FEED, "battery_wh": 100, "mains_lost": [["x"]]}, "lost_s"),
    ({**FEED, "battery_wh": -1}, "battery_wh"),
])
def test_bad_mains_name_the_key(feed: dict, match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        parse_scenario({"bank": "workstation-4", "feed": feed})


def test_the_packaged_power_event_loses_the_mains() -> None:
    sc = load_scenario("power-event")
    assert sc.mains is not None and sc.mains.outages and sc.mains.battery_wh > 0
    assert "battery_wh" not in sc.feed and "mains_lost" not in sc.feed


def test_powerbudgetd_hears_the_mains_loss_and_leaves_more_runtime() -> None:
    """power-event: the mains go at 40 s. powerbudgetd's UPS source (the same state
    machine, through the same arbiter and keeper as the daemon) halves the budget;
    static does not listen. Same scenario and seed: powerbudgetd leaves more runtime."""
    from powerbudgetd_sim.simulate import run_scenario  # noqa: PLC0415

    sc = load_scenario("power-event")
    pbd = run_scenario(sc, policy="powerbudgetd", compare=False, keep_series=True)
    static = run_scenario(sc, policy="static", compare=False).report
    r = pbd.report
    assert r["violation_ticks"] == 0
    assert r["battery"]["runtime_left_s"] > 1.3 * static["battery"]["runtime_left_s"]
    assert r["battery"]["empty_at_s"] is None
    # on battery (from 40 s, the first poll after it, plus a few ticks to confirm), the
    # caps sum to half the budget (500 W), held at the bank's floor (4 x 150 W) where
    # that is below it
    t = pbd.series.t
    after = [sum(lim) for ti, lim in zip(t, pbd.series.limit_w, strict=True) if 45.0 <= ti <= 100.0]
    assert after and max(after) <= max(500.0, 600.0) + 1e-6
    before = [sum(lim) for ti, lim in zip(t, pbd.series.limit_w, strict=True) if 30.0 <= ti < 40.0]
    assert max(before) > 900.0
