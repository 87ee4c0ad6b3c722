"""A slow read (an answer that takes seconds, every few calls) is not a lost card: the
card is counted at what may be in force on it, and the others see no churn."""

from __future__ import annotations

from structlog.testing import capture_logs

from support.rig import Fault, scenario_rig

END_S = 130.0
MINUTES = (END_S - 10.0) / 60  # from t = 10 s (boot and first lending done) to the end


def writes_per_card_per_min(faults: list[Fault]) -> tuple[float, list, int]:
    """workstation-4 for ``END_S``: mean writes per card per minute after 10 s, the
    error-level log lines, and the ticks the truth spent over the budget after boot."""
    rig = scenario_rig("workstation-4", faults=faults)
    writes = over = 0
    with capture_logs() as logs:
        while rig.t < END_S:
            rep = rig.step()
            if rep.now >= 10.0:
                writes += len(rep.writes)
                over += rig.truth_w() > rep.budget_w
    return writes / len(rig.ctl.cards) / MINUTES, [e for e in logs if e["log_level"] == "error"], over


def test_slow_reads_cost_no_extra_writes_and_no_over_budget_alarm() -> None:
    """Card 1's power read takes 1.5 s once every 4 s (the call is held meanwhile:
    every call on it times out)."""
    slow = [Fault("nvmlDeviceGetPowerUsage", "HANG", card=1, from_s=t, count=1, delay_s=1.5) for t in range(10, int(END_S), 4)]
    normal_rate, _, _ = writes_per_card_per_min([])
    slow_rate, errors, over = writes_per_card_per_min(slow)
    assert slow_rate <= 1.1 * normal_rate, (slow_rate, normal_rate)  # was 4-5x
    assert errors == [] and over == 0  # no over_budget alarm, and the truth never over


def test_a_card_slow_past_the_confirmation_deadline_is_unreadable_and_said_once_with_how_long() -> None:
    """Card 1 answers nothing from t = 10 s for 8 s: within confirm_timeout_s (3 s) it is
    slow (counted where it was, no fault), past it unreadable, counted at its worst."""
    rig = scenario_rig("workstation-4", faults=[Fault("*", "HANG", card=1, from_s=10.0, count=1, delay_s=8.0)])
    rig.run(10.0)
    bound_before = rig.ctl.cards[1].bound_mw
    with capture_logs() as logs:
        rig.run(2.9)
        assert rig.ctl.cards[1].bound_mw == bound_before and rig.ctl.cards[1].readable
        assert not [r for r in rig.reports[-29:] if r.faults]
        rig.run(5.0)
    c1 = rig.ctl.cards[1]
    assert not c1.readable and c1.bound_mw == c1.ledger.worst_mw == 300_000
    said = [e["event"] for e in logs if e["log_level"] in ("warning", "error")]
    assert len(said) == len(set(said)) <= 2  # once each: no line per tick
    assert set(said) <= {"card_unreadable", "over_budget"}  # its worst case counted does not fit
    unreadable = [e for e in logs if e["event"] == "card_unreadable"]
    assert unreadable[0]["index"] == 1 and unreadable[0]["unanswered_s"] == 3.0
