"""The peak-aware budget arithmetic: the breaker on averages, the UPS and PSU on peaks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerbudgetd.core.peaks import MEASURED_TRANSIENT_FACTOR, feed_lines, peak_wall_w, transient_factor
from powerbudgetd.config import FeedConfig


@given(
    breaker_a=st.floats(5, 100), volts=st.sampled_from([120.0, 208.0, 230.0]), host_w=st.floats(0, 800),
    eff=st.floats(0.8, 0.96), ups_w=st.one_of(st.none(), st.floats(500, 20_000)),
    margin=st.floats(0, 0.3), psu_w=st.one_of(st.none(), st.floats(500, 10_000)), factor=st.floats(1.0, 2.0),
)
def test_the_derived_budget_holds_every_device_on_what_it_trips_on(
    breaker_a, volts, host_w, eff, ups_w, margin, psu_w, factor
):
    try:
        feed = FeedConfig(breaker_a=breaker_a, volts=volts, host_w=host_w, psu_efficiency=eff, ups_w=ups_w,
                          ups_margin=margin, psu_w=psu_w, transient_factor=factor)
    except ValueError:
        return  # leaves no budget: refused, named (tested elsewhere)
    b = feed.board_budget_w()
    assert b > 0
    # breaker: the average at the plug within the circuit's continuous rating
    assert (b + host_w) / eff <= breaker_a * volts * feed.derating + 1e-6
    # UPS: the in-phase peak at the plug within its rating less the margin
    if ups_w is not None:
        assert peak_wall_w(b, host_w, eff, factor) <= ups_w * (1 - margin) + 1e-6
    # PSU: the peak out of the PSU within its rated output
    if psu_w is not None:
        assert b * factor + host_w <= psu_w + 1e-6
    # and it is the largest such budget: one device's line binds exactly
    assert min(line.board_budget_w for line in feed.lines()) == pytest.approx(b)


def test_the_measured_factor_and_the_incident_numbers():
    assert MEASURED_TRANSIENT_FACTOR == 1.35
    lines = {line.device: line for line in feed_lines(host_w=250, psu_efficiency=0.9, circuit_w=1440,
                                                      ups_limit_w=900 * 0.9, psu_output_w=None, factor=1.35)}
    assert lines["circuit"].basis == "average" and lines["circuit"].board_budget_w == pytest.approx(1046)
    assert lines["UPS"].basis == "peak" and lines["UPS"].board_budget_w == pytest.approx(354.8, abs=0.1)


def test_transient_factor_per_model():
    per = {"NVIDIA H200": 1.35, "NVIDIA A100-SXM4-80GB": 1.2}
    assert transient_factor(["NVIDIA A100-SXM4-80GB"], 1.3, per) == 1.2
    assert transient_factor(["NVIDIA A100-SXM4-80GB", "nvidia h200"], 1.3, per) == 1.35
    assert transient_factor(["RTX"], 1.3, per) == 1.3
    assert transient_factor(None, 1.3, per) == 1.35
    assert transient_factor([], 1.3, per) == 1.3
