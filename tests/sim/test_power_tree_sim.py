"""The simulator's power tree: 40 hosts on a row of four racks through a feed loss,
static reserves vs tree sharing (redundant, oversubscribed) vs an oracle."""

from __future__ import annotations

import pytest

from powerbudgetd_sim.feed import Breaker, Ups
from powerbudgetd_sim.tree import NodeMeter, compare, format_compare, run_tree


def test_a_surviving_nodes_tolerance_is_the_trip_models_breaker_on_averages_ups_on_peaks() -> None:
    """The figures the README's shed-time argument rests on (the packaged row's devices)."""
    pdu = NodeMeter(budget_w=63 * 230 * 0.8, breaker=Breaker(63), volts=230, ups=None, transient_factor=1.35)
    # A rack's two PDUs' worth (2 x 11592 W) on one: 160 % of the breaker: UL 489 model, 231 s.
    assert pdu.tolerance_s(2 * 11592) == pytest.approx(120 * 3 / (1.6**2 - 1), rel=1e-3)
    assert pdu.tolerance_s(11592) == float("inf")  # its continuous budget: 80 %, holds
    ups = NodeMeter(budget_w=40_000, breaker=None, volts=1.0, ups=Ups(60_000), transient_factor=1.35)
    assert ups.tolerance_s(50_000) == 30  # the row's 50 kW on peaks: 112.5 %, the over-110 % band
    assert ups.tolerance_s(60_000) == 3  # 135 %: the over-130 % band
    assert ups.tolerance_s(70_000) == 0.5  # 157.5 %: no round-based shed is that fast
    assert ups.tolerance_s(44_000) == float("inf")  # 99 %: holds


@pytest.mark.slow
def test_the_row_holds_every_node_through_a_feed_loss_and_sheds_within_the_stated_time() -> None:
    result = compare("row-4", duration_s=12.0, lost_at_s=6.0)
    static, redundant, over, declared, oracle = (
        result[p] for p in ("static", "redundant", "oversubscribed", "declared", "oracle"))
    assert declared["work_tgp_s"] == over["work_tgp_s"]  # the row declares its pair oversubscribed
    assert all(r["hosts"] == 40 and r["feed_lost"] == "feed-a" for r in result.values())
    for r in result.values():
        assert r["trips"] == {}, r  # no breaker or UPS tripped anywhere
        assert r["records_over_w"] == 0 and r["limits_over_w"] == 0, r  # outside the shed, every node within
    # Redundant (and static, sized redundant): the loss overloads nothing, nothing to shed.
    assert static["shed_s"] == 0 and redundant["shed_s"] == 0
    # Oversubscribed: the surviving side was over and is back within the stated shed time,
    # inside what its breaker and UPS tolerate at the worst load seen.
    assert 0 < over["shed_s"] <= over["shed_s_stated"] == 2.0
    assert over["survivors"], over
    for s in over["survivors"]:
        assert s["worst_limits_w"] > s["budget_w"]  # it was over: a shed was needed
        assert s["tolerance_s"] is None or s["margin_s"] == pytest.approx(s["tolerance_s"] - over["shed_s"], abs=0.1)
        assert s["margin_s"] is None or s["margin_s"] > 0, s
    assert over["work_tgp_s"] > static["work_tgp_s"]
    assert oracle["work_vs_oracle"] == 1.0
    text = format_compare(result)
    assert "oversubscribed: shed in" in text and "feed-a lost at 6 s" in text


@pytest.mark.slow
def test_the_records_follow_the_cards_down_within_the_stated_shed_time() -> None:
    """Lost at 20 s, the hosts hold grants well above their seats: each record is lowered
    by a round woken once its cards are down (as the daemon's channel wakes one then),
    not at its next poll, so the records too are back within budget inside the stated
    shed time (a record lagging its cards by a poll was 181 W over feed B after 2 s)."""
    r = run_tree("row-4", policy="oversubscribed", duration_s=24.0, lost_at_s=20.0)
    assert 0 < r["shed_s"] <= r["shed_s_stated"] == 2.0
    assert r["trips"] == {} and r["records_over_w"] == 0 and r["limits_over_w"] == 0, r
