"""The tick sans I/O: it asks for its NVML calls in batches and decides from their
outcomes, so whoever drives it (the daemon's event loop, the simulator) makes the calls.
A steady tick asks for one batch: the device count and every card's read; each write
is a batch of its own, in the plan's order, decreases first."""

from __future__ import annotations

from powerbudgetd.control.cardset import BANK_KEY
from powerbudgetd.control.controller import Controller
from powerbudgetd.core.model import Mode
from powerbudgetd.hw.calls import Call, InlineCalls
from support.rig import Rig, busy, card, idle, make_rig


def drive_counting(ctl: Controller, now: float) -> list[dict[str, Call]]:
    """One tick of ``ctl`` at ``now``, its calls made inline; returns the batches it asked for."""
    steps = ctl.tick_io(now)
    inline = InlineCalls()
    batches: list[dict[str, Call]] = []
    try:
        batch = next(steps)
        while True:
            batches.append(dict(batch))
            batch = steps.send(inline.many(batch))
    except StopIteration:
        pass
    return batches


def step_counting(rig: Rig) -> list[dict[str, Call]]:
    rig.bank.advance_to(rig.t)
    batches = drive_counting(rig.ctl, rig.t)
    rig.t = round(rig.t + rig.ctl.timings.tick_s, 9)
    return batches


def written(batch: dict[str, Call]) -> tuple[str, float] | None:
    """(uuid, W) when ``batch`` is one limit write, else None."""
    if len(batch) != 1:
        return None
    ((key, (fn, args)),) = batch.items()
    return (key, args[1]) if getattr(fn, "__name__", "") == "set_power_limit" else None


def test_a_steady_tick_asks_for_one_batch_the_device_count_and_every_card() -> None:
    rig = make_rig([card(i) for i in range(4)], 1000)
    rig.run(3.0)
    assert rig.ctl.ready
    for _ in range(5):
        batches = step_counting(rig)
        assert len(batches) == 1, batches
        assert set(batches[0]) == {BANK_KEY} | {c.uuid for c in rig.ctl.cards}


def test_each_write_is_a_batch_of_its_own_decreases_first_after_the_reads() -> None:
    """Two busy cards lend to nobody; then the budget drops: the tick reads, then lowers
    each card in its own batch, every decrease before any increase."""
    rig = make_rig([card(0, busy()), card(1, busy()), card(2, idle()), card(3, idle())], 1100)
    rig.run(6.0)
    assert rig.ctl.ready and rig.ctl.mode == Mode.DYNAMIC
    rig.ctl.set_budget(800)
    batches = step_counting(rig)
    assert set(batches[0]) == {BANK_KEY} | {c.uuid for c in rig.ctl.cards}
    writes = [written(b) for b in batches[1:]]
    assert writes and all(w is not None for w in writes), batches[1:]
    before = {c.uuid: c.ledger.requested_mw for c in rig.ctl.cards}
    deltas = [w_w * 1000 - (before[uuid] or 0) for uuid, w_w in writes]  # type: ignore[misc]
    assert any(d < 0 for d in deltas)
    first_up = next((i for i, d in enumerate(deltas) if d > 0), len(deltas))
    assert all(d <= 0 for d in deltas[:first_up]) and all(d > 0 for d in deltas[first_up:])
