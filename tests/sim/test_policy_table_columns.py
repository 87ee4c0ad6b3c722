"""The policy table (`simulate --policy all`, the suite) says which per-card write rate
it prints: the busiest card's, which is what the column holds (the mean is in the
targets' line below it and in the JSON)."""

from __future__ import annotations

from powerbudgetd_sim.scoreboard import format_table


def report(mean: float, busiest: float) -> dict:
    return {
        "work": 10.0, "work_vs_oracle": 1.0, "work_vs_causal": 1.0, "work_vs_ruled": 1.0, "violation_ticks": 0,
        "draw_over_budget_s": 0.0, "max_wall_power_w": None, "trips": {"breaker": None, "ups": None},
        "reclaim_latency_s": {"events": 0}, "cap_changes": 11,
        "writes_per_card_per_min": {"mean": mean, "max": busiest}, "flapping": {"max_reversals": 1},
    }


def test_the_write_rate_column_is_named_for_the_busiest_card() -> None:
    header, row = format_table({"powerbudgetd": report(2.75, 4.0)}).splitlines()
    assert "busiest/min" in header and "/card/min" not in header
    assert header.index("busiest/min") + len("busiest/min") == row.index("4.0") + len("4.0")
