"""The device count is read in the same batch as the cards at the start of a tick: a
card the enumeration then finds gone is taken as gone that tick (not at what it read a
moment before), and a device count that hangs costs one deadline, said once."""

from __future__ import annotations

import time

from structlog.testing import capture_logs

from support.rig import Fault, busy, card, idle, make_rig
from powerbudgetd.errors import NvmlGpuLost
from powerbudgetd.hw.calls import DeadlineCalls
from powerbudgetd_sim.physics import BankEvent


def test_a_card_gone_between_its_read_and_the_enumeration_counts_as_gone_that_tick() -> None:
    rig = make_rig([card(0, busy()), card(1, idle())], 450)
    rig.run(30.0)  # card 1 lends: its limit is below its worst case
    c1 = rig.ctl.cards[1]
    assert c1.bound_mw < c1.ledger.worst_mw
    nvml, gone = rig.nvml, {"now": False, "after_read": False}
    read, device, device_count = nvml.read, nvml.device, nvml.device_count

    def reading(uuid: str):  # type: ignore[no-untyped-def]
        if uuid == c1.uuid and gone["now"]:
            raise NvmlGpuLost("off the bus")
        r = read(uuid)
        gone["now"] = gone["now"] or (uuid == c1.uuid and gone["after_read"])  # off the bus right after
        return r

    def looking_up(index: int):  # type: ignore[no-untyped-def]
        if index == 1 and gone["now"]:
            raise NvmlGpuLost("off the bus")
        return device(index)

    nvml.read, nvml.device = reading, looking_up  # type: ignore[method-assign]
    nvml.device_count = lambda: device_count() - gone["now"]  # type: ignore[method-assign]
    gone["after_read"] = True
    rig.ctl.bank.look_again(rig.t)  # the enumeration is due this tick (as every enumerate_s)
    with capture_logs() as logs:
        report = rig.step()
    said = next(e for e in logs if e["event"] == "card_gone")
    assert c1.gone and not c1.readable and report.faults  # its read before the lookup is not kept
    assert c1.bound_mw == c1.ledger.worst_mw == said["reserved_w"] * 1000
    assert rig.truth_w() <= 450.0


def test_a_hung_device_count_costs_one_deadline_said_once_and_every_card_is_still_read() -> None:
    """nvmlDeviceGetCount sleeps 1 s (wall clock) once at t = 2 s, against a 0.2 s
    deadline; card 3 comes onto the bus at t = 3 s, once the count answers again."""
    calls = DeadlineCalls(0.2)
    rig = make_rig([card(0, busy()), card(1), card(2), card(3, present=False)], 1000,
                   faults=[Fault("nvmlDeviceGetCount", "SLOW", from_s=2.0, until_s=2.05, delay_s=1.0)],
                   calls=calls, events=[BankEvent(3.0, 3, "appear")])
    rig.run(2.0)
    with capture_logs() as logs:
        while rig.t < 8.0:
            rig.step()
            assert all(c.readable and c.reading is not None for c in rig.ctl.cards), rig.t
            if rig.t >= 3.0:  # virtual time runs ahead: let the hung call return on the wall clock
                for _ in range(300):
                    if not calls.overdue():
                        break
                    time.sleep(0.01)
    said = [e["event"] for e in logs if e["log_level"] in ("warning", "error")]
    assert said.count("enumeration_failed") == 1 and "card_unreadable" not in said
    assert [c.uuid for c in rig.ctl.cards][-1] == "GPU-test-3" and not any(c.gone for c in rig.ctl.cards)
    assert rig.truth_w() <= 1000.0
