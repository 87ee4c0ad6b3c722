"""The sensor model (core.sensor): a measured figure is a reading with an age and a reach."""

from __future__ import annotations

import pytest

from powerbudgetd.core.sensor import LoopParams, MeterLoop, OwnDraw, Reach, Sensor

EFF = 0.9


def test_a_reading_is_a_change_and_an_unchanged_value_is_no_new_information() -> None:
    s = Sensor()
    first = s.poll(900.0, 0.0)
    assert first is not None and first.changed_at == 0.0 and first.previous_at is None
    assert s.poll(900.0, 2.0) is None and s.poll(900.0, 4.0) is None
    second = s.poll(950.0, 30.0)
    assert second is not None and second.previous_at == 4.0 and second.changed_at == 30.0
    s.poll(950.0, 32.0)
    s.poll(990.0, 60.0)
    assert s.refresh_s == pytest.approx(30.0)


def test_reach_is_the_loop_gain() -> None:
    assert Reach().fraction == 1.0 and not Reach().shared
    assert Reach(hosts=3).fraction == pytest.approx(1 / 3)
    assert Reach(hosts=2, share=0.3).fraction == 0.3
    with pytest.raises(ValueError, match="share"):
        Reach(share=1.5)
    with pytest.raises(ValueError, match="hosts"):
        Reach(hosts=0)


def test_own_draw_is_paired_at_the_time_the_reading_was_taken() -> None:
    own = OwnDraw()
    for t, w in [(0.0, 500.0), (1.0, 500.0), (2.0, 800.0), (3.0, 800.0)]:
        own.add(t, w)
    assert own.lowest(2.5, 3.0) == 800.0
    assert own.lowest(1.5, 3.0) == 500.0  # the sample in force at 1.5 counts
    assert own.steady(10.0) == (2.0, 800.0)


def loop(**reach: float) -> MeterLoop:
    return MeterLoop("ups", LoopParams(800.0, EFF, 20.0, Reach(**reach)))  # type: ignore[arg-type]


def test_a_stale_reading_is_not_applied_again() -> None:
    g = loop()
    for t in range(31):
        g.own_draw(float(t), 500.0)
        g.poll(900.0, float(t), 1000.0)  # 100 W over, refreshed once, polled 31 times
    assert g.budget_w == pytest.approx(500 - 100 * EFF - 20)


def test_a_shared_meter_corrects_its_share_of_the_excess() -> None:
    g = loop(hosts=2)
    g.own_draw(0.0, 500.0)
    g.poll(900.0, 0.0, 1000.0)
    assert g.budget_w == pytest.approx(500 - 100 * EFF / 2 - 20)


def test_a_budget_raised_on_a_reading_rises_part_of_the_way_and_at_a_bounded_rate() -> None:
    g = loop()
    g.own_draw(0.0, 500.0)
    g.poll(900.0, 0.0, 1000.0)
    low = g.budget_w
    assert low is not None
    g.own_draw(0.5, low)
    g.poll(500.0, 1.0, 1000.0)  # 300 W of headroom at the plug: 270 W of board power
    assert g.budget_w is not None and low < g.budget_w <= low + 0.1 * 1000 * 1.0 + 1e-9
