"""The sensor model (core.sensor): a measured figure is a reading with an age and a reach."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerbudgetd.core.sensor import LoopParams, MeterLoop, Noise, OwnDraw, Reach, Sensor

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


def _plug_over_s(refresh_at: Callable[[float], float], rest_at: Callable[[float], float], until: float) -> float:
    """Seconds the plug (800 W limit) is over after the first reading, for one host whose
    cards draw all the budget allows of a 1000 W demand, behind a meter that refreshes
    every ``refresh_at(t)`` s and is polled every 2 s; ``rest_at(t)``: the rest of the plug (W)."""
    g = MeterLoop("ups", LoopParams(800.0, EFF, 20.0, Reach()))
    meter, refreshed, over, t, next_poll = 0.0, -1e9, 0.0, 0.0, 0.0
    while t < until:
        draw = min(1000.0, 1000.0 if g.budget_w is None else g.budget_w)
        plug = rest_at(t) + draw / EFF
        if plug > 800.0 + 1e-6 and t > 2.0:  # before the first reading nothing can be known
            over += 0.1
        g.own_draw(t, draw)
        if t - refreshed >= refresh_at(t) - 1e-9:
            meter, refreshed = float(round(plug)), t
        if t >= next_poll - 1e-9:
            g.poll(meter, t, 1000.0)
            next_poll += 2.0
        t = round(t + 0.1, 6)
    return over


def test_a_standing_value_never_shows_more_headroom_than_when_it_was_taken() -> None:
    # The meter refreshed every 2 s, then slows to 60 s (a driver restarted with a longer
    # pollfreq): its learnt refresh is still 2 s. The 60 s reading after the rest of the
    # plug fell shows 100 W more room; used again while it stands it must not be paired
    # with the draw the cards took on it since, or each reuse adds that room once more.
    over = _plug_over_s(lambda t: 2.0 if t < 60 else 60.0, lambda t: 200.0 if t < 60 else 100.0, 200.0)
    assert over <= 1.0


def test_a_reused_value_is_never_paired_with_more_than_the_draw_it_was_taken_at() -> None:
    g = loop()
    for t in range(0, 12, 2):  # a 2 s meter learnt (533 W and 532 W in turn), our draw 300 W
        g.own_draw(float(t), 300.0)
        g.poll(533.0 - (t // 2) % 2, float(t), 1000.0)
    first = g.allowed_w  # what 532 W allowed, taken at 300 W
    assert first is not None and g.sensor.refresh_s == 2.0
    for t in range(12, 60):  # the value stands; the cards take what it allowed and hold it
        g.own_draw(float(t), min(1000.0, g.budget_w or 1000.0))
        g.poll(532.0, float(t), 1000.0)
    assert g.allowed_w is not None and g.allowed_w <= first + 1e-6
    assert g.budget_w is not None and g.budget_w <= first + 1e-6


def test_a_frozen_figure_is_caught_after_ten_refreshes_at_any_poll_interval() -> None:
    # Polled every 10 s, refreshing every 20 s: frozen after 10 refreshes (20 polls),
    # not after 10 x 20 polls as if the polls came every second.
    g = loop()
    t, draw = 0.0, 300.0
    for value in (600.0, 610.0, 620.0):  # the 20 s refresh learnt
        g.own_draw(t, draw)
        g.poll(value, t, 1000.0)
        t += 10.0
        g.own_draw(t, draw)
        g.poll(value, t, 1000.0)
        t += 10.0
    assert g.sensor.refresh_s == 20.0 and g.sensor.poll_gap_s == 10.0
    frozen_at = None
    for n in range(60):  # the figure sticks at 630 W while our draw swings by 200 W
        draw = 300.0 + 200.0 * (n % 2)
        g.own_draw(t, draw)
        g.poll(630.0, t, 1000.0)
        if g.verdict is not None and g.verdict.reason == "frozen":
            frozen_at = n
            break
        t += 10.0
    assert frozen_at is not None and frozen_at <= 21


def test_own_draw_gives_the_highest_over_a_window() -> None:
    own = OwnDraw()
    for t, w in [(0.0, 500.0), (1.0, 700.0), (2.0, 600.0), (3.0, 900.0)]:
        own.add(t, w)
    assert own.highest(1.5, 2.5) == 700.0  # the sample in force at 1.5 counts
    assert own.highest(0.0, 2.9) == 700.0 and own.highest(-5.0, -1.0) is None


def _flipping_meter(amp_w: float, every: int, *, step_at: float = 300.0, until: float = 600.0,
                    noise_aware: bool = True) -> tuple[float, float]:
    """One host (1000 W configured, demanding all of it) behind a 2 s meter on an 800 W
    plug limit, polled every 2 s, whose figure reads ``amp_w`` high then low, flipping
    every ``every`` polls, around the plug's true draw; the rest of the plug steps from
    200 W to 300 W at ``step_at``. Returns (budget swings of more than 5 % of the
    configured budget a minute, counted from 30 s after the start and after the step;
    seconds the true plug was over its limit later than one refresh plus two polls after
    the start or the step)."""
    g = MeterLoop("ups", LoopParams(800.0, EFF, 20.0, Reach()))
    if not noise_aware:
        g.noise = _Deaf()
    allowance_s, settle_s = 2.0 + 2 * 2.0, 30.0
    t, next_poll, polls, swings, steady_s, over_s = 0.0, 0.0, 0, 0, 0.0, 0.0
    last: float | None = None
    while t < until:
        since_step = t if t < step_at else t - step_at
        draw = min(1000.0, 1000.0 if g.budget_w is None else g.budget_w)
        plug = (200.0 if t < step_at else 300.0) + draw / EFF
        if plug > 800.0 + 1e-6 and since_step > allowance_s:
            over_s += 0.1
        g.own_draw(t, draw)
        if t >= next_poll - 1e-9:
            high = (polls // every) % 2 == 0
            g.poll(float(round(plug)) + (amp_w if high else -amp_w), t, 1000.0)
            polls += 1
            next_poll += 2.0
        if g.budget_w is not None and (last is None or abs(g.budget_w - last) > 0.05 * 1000.0):
            swings += since_step >= settle_s
            last = g.budget_w
        steady_s += 0.1 if since_step >= settle_s else 0.0
        t = round(t + 0.1, 6)
    return swings / (steady_s / 60), over_s


class _Deaf(Noise):
    """The loop as it was: no noise learnt."""

    @property
    def band_w(self) -> float:
        return 0.0


@pytest.mark.parametrize(("amp_w", "every"), [(60.0, 1), (100.0, 2), (150.0, 3), (30.0, 1)])
def test_a_flipping_meter_does_not_make_the_budget_cycle(amp_w: float, every: int) -> None:
    swings_per_min, over_s = _flipping_meter(amp_w, every)
    assert swings_per_min <= 2.0
    assert over_s == 0.0  # drops stay immediate: the plug within its limit after the step too


def test_without_the_noise_band_the_flipping_meter_cycles() -> None:
    # the defect: each high reading drops the budget, each low one raises it half way back
    swings_per_min, over_s = _flipping_meter(60.0, 1, noise_aware=False)
    assert swings_per_min > 20.0 and over_s == 0.0


def test_noise_is_what_reverses_again_and_again() -> None:
    flip = Noise()
    for n in range(9):
        flip.add(200.0 + 60 * (-1) ** n, 200.0 + 60 * (-1) ** n)
    assert flip.band_w == pytest.approx(120.0)
    step, pulse = Noise(), Noise()
    for w in (200.0, 200.0, 600.0, 600.0, 600.0):
        step.add(w, w)
    for w in (200.0, 600.0, 200.0, 200.0):
        pulse.add(w, w)
    assert step.band_w == 0.0 and pulse.band_w == 0.0  # a load that came (and went) once is no noise
    explained = Noise()  # the rest moved only as far as our own draw's moves over each window explain
    for n in range(9):
        lo = 200.0 if n % 2 else 100.0
        explained.add(lo, lo + 100.0)
    assert explained.band_w == 0.0


@given(st.lists(st.tuples(st.floats(-2000, 2000), st.floats(0, 500)), min_size=1, max_size=12))
def test_the_noise_band_is_never_more_than_the_spread_and_a_trend_has_none(points: list[tuple[float, float]]) -> None:
    noise, trend = Noise(keep=12), Noise(keep=12)
    for w, width in points:
        noise.add(w, w + width)
    for w, width in sorted(points):
        trend.add(w, w + width)
    assert 0.0 <= noise.band_w <= max(w + d for w, d in points) - min(w for w, _ in points) + 1e-9
    assert trend.band_w == 0.0
