"""A card's power readings are judged over a short window with hysteresis: one
implausible sample changes no role and causes no write; a sustained one makes the power
unknown; a reading that flickers does not flip the card back and forth."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from support.rig import busy, card, make_rig
from powerbudgetd.core.model import Role
from powerbudgetd_sim.physics import BankEvent


def lending_rig():
    """Card 0 busy, a recipient at its max; cards 1-3 idle donors at their floors."""
    rig = make_rig([card(0, busy()), card(1), card(2), card(3)], 1000)
    rig.run(10.0)
    assert [c.role for c in rig.ctl.cards] == [Role.RECIPIENT, Role.DONOR, Role.DONOR, Role.DONOR]
    return rig


def bad_readings(rig, index: int, spans: list[tuple[float, float]], watts: float = 5000.0) -> None:
    """Card ``index`` reads ``watts`` (impossible) over each (from, to) span of bank time."""
    rig.bank._events = sorted(
        [(t0, 2 * k, BankEvent(t0, index, "bad_reading", limit_w=watts)) for k, (t0, _) in enumerate(spans)]
        + [(t1, 2 * k + 1, BankEvent(t1, index, "bad_reading")) for k, (_, t1) in enumerate(spans)],
        key=lambda e: e[:2])


def roles(rig) -> tuple[Role, ...]:
    return tuple(c.role for c in rig.ctl.cards)


@pytest.mark.parametrize("index", [0, 1], ids=["recipient", "donor"])
@pytest.mark.parametrize("watts", [5000.0, -5.0, 4e6])
def test_a_single_implausible_sample_changes_no_role_and_causes_no_write(index: int, watts: float) -> None:
    rig = lending_rig()
    before = roles(rig)
    bad_readings(rig, index, [(10.05, 10.15)], watts)  # the read at t = 10.1 s only
    seen, writes = [], []
    with capture_logs() as logs:
        for _ in range(100):
            rep = rig.step()
            writes += rep.writes
            seen.append(roles(rig))
    role_changes = sum(a != b for a, b in zip([before, *seen], seen))
    assert role_changes == 0 and writes == []
    assert dict(rig.reports[-1].snapshot.cards[index].readings_rejected)["impossible"] == 1  # counted all the same
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []


def test_a_sustained_implausible_reading_is_unknown_and_a_flickering_one_does_not_flip_the_card() -> None:
    """Card 1 (a donor) reads impossible for 1 s, then every other sample for 3 s."""
    rig = lending_rig()
    flicker = [(11.05 + 0.2 * k, 11.15 + 0.2 * k) for k in range(15)]
    bad_readings(rig, 1, [(10.05, 11.0), *flicker])
    with capture_logs() as logs:
        rig.run(1.0)
        assert rig.reports[-1].snapshot.cards[1].power_avg_w is None  # unknown once it lasted the window
        rig.run(3.0)  # plausible one sample in two: never believed again meanwhile
        assert all(r.snapshot.cards[1].power_avg_w is None for r in rig.reports[-30:])
        rig.run(1.0)
    assert rig.reports[-1].snapshot.cards[1].power_avg_w is not None  # plausible for the window: believed
    names = [e["event"] for e in logs]
    assert names.count("power_reading_impossible") == 1 and names.count("power_reading_plausible_again") == 1
    assert rig.truth_w() <= 1000.0
