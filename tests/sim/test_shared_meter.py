"""Hosts behind one slow, shared meter (powerbudgetd_sim.sharedmeter): the targets of
the sensor model, on the daemon's own UPS channel."""

from __future__ import annotations

import pytest

from powerbudgetd_sim import sharedmeter as m


@pytest.mark.parametrize("refresh_s", [2.0, 10.0, 30.0])
@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_the_plug_is_within_its_limit_after_one_refresh_and_two_polls_without_a_limit_cycle(
        hosts: int, refresh_s: float) -> None:
    f = m.run_meter_scenario(m.shared(hosts, refresh_s))
    assert f.over_beyond_allowance_s == 0.0, f.summary()
    assert f.swings_per_min <= m.MAX_SWINGS_PER_MIN, f.summary()


def test_the_issues_one_host_slow_meter() -> None:
    f = m.run_meter_scenario(m.one_host(30.0))
    assert f.over_beyond_allowance_s == 0.0 and f.swings_per_min <= m.MAX_SWINGS_PER_MIN, f.summary()


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_the_bounded_rise_costs_under_one_percent_at_a_fresh_meter(hosts: int) -> None:
    sc = m.fresh_meter_work(hosts)
    got, ref = m.run_meter_scenario(sc), m.run_meter_scenario(sc, reference=True)
    assert got.work >= 0.99 * ref.work


def test_hosts_left_unconfigured_still_do_not_cycle() -> None:
    # two hosts that each take the whole excess (no [ups] hosts): the drop overshoots,
    # the bounded rise does not, so no limit cycle either
    f = m.run_meter_scenario(m.shared(2, 2.0, configured=False))
    assert f.swings_per_min <= m.MAX_SWINGS_PER_MIN and f.over_beyond_allowance_s == 0.0, f.summary()
