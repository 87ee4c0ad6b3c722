"""The bank snapshot every side channel reads: each card's fields, by name, are what the
controller's card state says (the snapshot is built positionally, for speed)."""

from __future__ import annotations

import dataclasses

from support.rig import busy, card, idle, make_rig
from powerbudgetd.control.report import bank_snapshot
from powerbudgetd.core.model import Role
from powerbudgetd.core.units import opt_w


def test_every_card_field_is_the_card_states_value_by_name() -> None:
    rig = make_rig([card(0, busy()), card(1, idle()), card(2, busy()), card(3, idle())], 1000)
    rig.run(12.0)
    ctl, now = rig.ctl, rig.bank.now
    c0, c1, c2, c3 = ctl.cards
    # Every field given a value of its own, so a field taken from the wrong place shows.
    c0.audit.contested_until, c0.audit.contested_w = now + 60.0, 287.5
    c0.audit.excursions, c0.audit.peak_excursion_w = 3, 351.25
    c0.read_errors.update({"timeout": 2, "gpu_lost": 1})
    c0.audit.implausible_readings, c0.audit.frozen_readings = 4, 5
    c1.outside_cap_seen_mw = 180_500
    c2.error = "gpu_lost: off the bus"  # unreadable: its limits and draw are unknown
    c3.role = Role.FIXED
    c0.ledger.enforced_mw = c0.ledger.requested_mw - 7_000  # an outside limiter below the request
    c1.min_mw, c1.max_mw = 160_000, 275_000  # [cards] limits inside the hardware's constraints
    c3.info = dataclasses.replace(c3.info, min_limit_w=None, max_limit_w=None)  # constraints not reported

    snap = bank_snapshot(ctl.cards, now, ctl.mode, ctl.ready, ctl.budget_mw, ctl.over)

    for c, s in zip(ctl.cards, snap.cards, strict=True):
        readable = c.error is None
        r = c.reading if readable else None
        expected = {
            "index": c.index, "uuid": c.uuid, "name": c.info.name, "role": str(c.role),
            "controllable": c.controllable, "readable": readable,
            "requested_limit_w": opt_w(c.requested_mw) if r else None,
            "enforced_limit_w": opt_w(c.enforced_mw) if r else None,
            "limit_bound_w": c.bound_mw / 1000,
            "min_limit_w": None if c.info.min_limit_w is None else c.min_mw / 1000,
            "max_limit_w": None if c.info.max_limit_w is None else c.max_mw / 1000,
            "hw_min_limit_w": c.info.min_limit_w, "hw_max_limit_w": c.info.max_limit_w,
            "power_avg_w": r.power_avg_w if r else None, "power_instant_w": r.power_instant_w if r else None,
            "error": c.error, "contested_w": c.contested_w if c.contested(now) else None,
            "excursions": c.excursions, "peak_excursion_w": c.peak_excursion_w,
            "read_errors": tuple(sorted(c.read_errors.items())), "readings_rejected": c.audit.readings_rejected,
            "mig_mode": c.info.mig_mode, "outside_cap_w": opt_w(c.outside_cap_seen_mw),
            "vendor": c.info.vendor, "backend": c.info.backend,
        }
        assert s._asdict() == expected
    s0, s1, s2, s3 = snap.cards
    assert (s0.contested_w, s0.excursions, s0.peak_excursion_w) == (287.5, 3, 351.25)
    assert s0.read_errors == (("gpu_lost", 1), ("timeout", 2))
    assert s0.readings_rejected == (("frozen", 5), ("impossible", 4))
    assert s1.outside_cap_w == 180.5 and s1.contested_w is None
    assert (s2.readable, s2.requested_limit_w, s2.enforced_limit_w, s2.power_avg_w) == (False, None, None, None)
    assert s3.role == "fixed" and s0.power_avg_w is not None and s0.requested_limit_w is not None
    assert s0.enforced_limit_w == s0.requested_limit_w - 7.0
    assert (s1.min_limit_w, s1.max_limit_w, s1.hw_min_limit_w, s1.hw_max_limit_w) == (160.0, 275.0, 150.0, 300.0)
    assert (s3.min_limit_w, s3.max_limit_w, s3.hw_min_limit_w, s3.hw_max_limit_w) == (None, None, None, None)
    assert snap.sum_limit_bound_w == sum(c.bound_mw for c in ctl.cards) / 1000
