"""A card that fails or hangs every NVML call must not hold up the stop, nor end it early.

The controller: a stop is over only once every card we can write is confirmed at its
fair share, also while a decrease a lost card set off is still settling.
"""

from __future__ import annotations

from conftest import Fault, card, make_rig


def test_stopped_waits_for_the_decreases_a_lost_card_set_off() -> None:
    # Card 3 is lost at 3 s; the stop comes while the others' decreases (to make room
    # for it at 300 W) are still settling: stopped only once they are confirmed.
    rig = make_rig([card(i) for i in range(4)], 1000, lag_s=0.5, faults=[Fault("*", "GPU_IS_LOST", card=3, from_s=3.0)])
    rig.run(3.05)
    assert [w.to_w for w in rig.reports[-1].writes] == [233.333] * 3
    rig.ctl.request_stop()
    while not rig.ctl.stopped:
        rig.step()
    assert [rig.enforced_w(i) for i in range(3)] == [233.333] * 3
    assert rig.ctl.sum_bound_mw <= 1_000_000
