"""The feed: validation, wall power, and the breaker and UPS trip models."""

import math

import pytest

from powerbudgetd_sim.feed import Breaker, Ups, feed_from_dict
from powerbudgetd_sim.scenario import ScenarioError, parse_scenario

GOOD = {"host_w": 300, "psu_efficiency": 0.9, "breaker_a": 15, "volts": 120, "ups_w": 1500}


def test_feed_from_a_scenario_table():
    feed = feed_from_dict(GOOD)
    assert feed.breaker_w == 1800
    assert feed.wall_w(1000) == pytest.approx(1300 / 0.9)
    assert feed_from_dict({"host_w": 0, "breaker_a": 20, "volts": 230}).ups_w is None


@pytest.mark.parametrize(
    "change, word",
    [
        ({"psu_efficiency": 1.2}, "psu_efficiency"),
        ({"host_w": -5}, "host_w"),
        ({"breaker_a": 0}, "breaker_a"),
        ({"ups_w": "big"}, "ups_w"),
        ({"amps": 15}, "amps"),
    ],
)
def test_bad_feed_values_name_the_key(change, word):
    with pytest.raises(ValueError, match=word):
        feed_from_dict({**GOOD, **change})


def test_missing_feed_keys_are_named():
    with pytest.raises(ValueError, match="breaker_a"):
        feed_from_dict({"host_w": 100, "volts": 120})


def test_scenario_validates_its_feed():
    base = {"bank": "ada-2", "duration_s": 5}
    assert parse_scenario({**base, "feed": GOOD}).feed == GOOD
    with pytest.raises(ScenarioError, match="psu_efficiency"):
        parse_scenario({**base, "feed": {**GOOD, "psu_efficiency": 0.2}})


def run(model, x, seconds, dt=0.1, rating=1.0):
    t = 0.0
    for _ in range(int(round(seconds / dt))):
        t = round(t + dt, 9)
        model.step(t, x * rating, dt)
    return model.tripped_at


def test_breaker_holds_its_rating_forever():
    assert run(Breaker(15), 1.0, 10 * 3600, dt=1.0, rating=15) is None


def test_breaker_trips_within_two_minutes_at_200_percent():
    at = run(Breaker(15), 2.0, 200, rating=15)
    assert at is not None and 119 <= at <= 120.1


def test_breaker_trips_within_an_hour_at_135_percent():
    at = run(Breaker(15), 1.35, 3600, dt=1.0, rating=15)
    assert at is not None and at <= 3600
    assert Breaker.trip_time_s(1.35) == pytest.approx(437.7, abs=0.5)


def test_breaker_magnetic_trip_is_instant_at_5x_and_forgives_short_spikes():
    assert run(Breaker(15), 5.0, 0.1, rating=15) == pytest.approx(0.1)
    b = Breaker(15)
    b.step(0.1, 45.0, 0.1)  # 3x for one sample
    assert b.tripped_at is None
    assert Breaker.trip_time_s(0.9) == math.inf


def test_ups_bands():
    assert run(Ups(1000), 1.05, 3600, dt=1.0, rating=1000) is None
    assert run(Ups(1000), 1.20, 29.5, rating=1000) is None
    assert run(Ups(1000), 1.20, 30.0, rating=1000) == pytest.approx(30.0)
    assert run(Ups(1000), 1.40, 3.0, rating=1000) == pytest.approx(3.0)
    assert run(Ups(1000), 1.60, 0.5, rating=1000) == pytest.approx(0.5)


def test_ups_forgets_an_overload_after_a_rest_under_its_rating():
    ups = Ups(1000)
    t = 0.0
    for load, seconds in ((1200, 20), (900, 30), (1200, 20)):
        for _ in range(seconds * 10):
            t = round(t + 0.1, 9)
            ups.step(t, load, 0.1)
    assert ups.tripped_at is None
    for _ in range(150):  # 15 s more at 120 %: 35 s in a row now
        t = round(t + 0.1, 9)
        ups.step(t, 1200, 0.1)
    assert ups.tripped_at is not None


def test_how_near_a_device_came_to_a_trip_is_whole_once_tripped_and_short_of_it_while_it_holds():
    """``closest`` (the simulator's "% of the way to a trip"): the breaker's heat or the
    UPS's overload at its most, 1 once the device tripped, by heat or magnetically."""
    b = Breaker(15)
    b.step(0.1, 6 * 15.0, 0.1)  # 6x: the magnetic trip, with next to no heat
    assert b.tripped_at == pytest.approx(0.1) and b.closest == 1.0
    ups, t = Ups(1000), 0.0
    for _ in range(299):  # 120 % for 29.9 s of its 30 s, then back under its rating
        t = round(t + 0.1, 9)
        ups.step(t, 1200, 0.1)
    ups.step(t + 0.1, 900, 0.1)
    assert ups.tripped_at is None and 0.99 < ups.closest < 1.0
    ups.step(t + 0.2, 1200, 0.2)
    assert ups.tripped_at is not None and ups.closest == 1.0
