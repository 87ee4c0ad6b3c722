"""A hung NVML call on one card (every call on it takes seconds of wall time) does not
block re-enumeration of the others, and is reported once, with how long it has hung."""

from __future__ import annotations

from structlog.testing import capture_logs

from support.rig import FAST, Fault, card, make_rig
from powerbudgetd.hw.calls import DeadlineCalls
from powerbudgetd_sim.physics import BankEvent


def test_a_hung_card_does_not_block_enumeration_and_is_reported_once_with_how_long() -> None:
    """Every call on card 0 sleeps 8 s (wall clock) from t = 2 s; card 3 comes onto the
    bus at t = 3 s. The controller's calls have a 1 s deadline (ample for an answering
    card on a loaded machine), on the pool of NVML workers."""
    calls = DeadlineCalls(1.0)
    rig = make_rig([card(0), card(1), card(2), card(3, present=False)], 1000,
                   faults=[Fault("*", "SLOW", card=0, from_s=2.0, delay_s=8.0)], calls=calls,
                   events=[BankEvent(3.0, 3, "appear")])
    rig.run(2.0)
    with capture_logs() as logs:
        rig.run(1.0)
        rig.step()  # t = 3.0: the device count changes; card 3 is looked up beside hung card 0
        assert [c.uuid for c in rig.ctl.cards][-1] == "GPU-test-3"
        assert rig.ctl.cards[0].uuid in calls.overdue()
        rig.run(5.0)  # t = 8 s: hung for 6 s, unreadable from 5 s
    c0 = rig.ctl.cards[0]
    assert not c0.gone and not c0.readable and c0.bound_mw == 300_000  # counted at its worst case
    said = [e["event"] for e in logs if e["log_level"] in ("warning", "error")]
    assert said.count("card_unreadable") == 1 and "card_gone" not in said and "enumeration_failed" not in said
    assert len(said) == len(set(said))  # every line once: no warning per tick
    unreadable = next(e for e in logs if e["event"] == "card_unreadable")
    assert unreadable["index"] == 0 and unreadable["unanswered_s"] == FAST.confirm_timeout_s
    assert rig.truth_w() <= 1000.0

