"""The simulated bank's physics against the H200 measurements in the brief."""

from __future__ import annotations

import statistics

import pytest

from conftest import busy, card, idle
from powerbudgetd_sim.physics import SimBank
from powerbudgetd_sim.profiles import Phase
from powerbudgetd_sim.traces import load_trace


def test_readings_refresh_every_100_ms():
    bank = SimBank([card(0, Phase(0, "trace", trace="h200-serving"))], seed=3)
    c = bank.cards[0]
    seen = []
    for k in range(400):  # poll every 25 ms, as the recorded sampler did
        bank.advance_to(k * 0.025)
        seen.append(c.instant_w)
    changes = sum(1 for a, b in zip(seen, seen[1:]) if a != b)
    assert changes <= 100  # 10 s: at most one new value per 100 ms


def test_average_is_the_trailing_one_second_mean_of_instants():
    bank = SimBank([card(0, Phase(0, "trace", trace="h200-load-steps"))], seed=2)
    c = bank.cards[0]
    instants = []
    for k in range(200):
        bank.advance_to(k * 0.1)
        instants.append(c.instant_w)
        if k >= 10:
            assert c.avg_w == pytest.approx(statistics.fmean(instants[-10:]))


def test_firmware_holds_the_average_under_the_limit_while_instants_wander():
    bank = SimBank([card(0, idle(), busy(2.0, power_w=400.0), min_w=100, max_w=400)], seed=5, lag_s=0.0)
    c = bank.cards[0]
    c.set_limit(0.0, 250_000)
    onset, pinned = None, []
    for k in range(1, 150):
        bank.advance_to(k * 0.1)
        if onset is None and c.instant_w > 200:
            onset = c.instant_w
        if k > 40:
            pinned.append(c.instant_w)
            assert c.avg_w <= 250.0 + 1e-6
    assert 1.1 * 250 <= onset <= 1.35 * 250 + 1e-6  # the onset overshoot (1.25-1.35x measured)
    # measured at 700 W: sustained instants 600-750 W (0.86-1.07x) while the average holds
    assert min(pinned) >= 0.85 * 250 and max(pinned) <= 1.08 * 250


def test_a_written_limit_takes_effect_after_the_lag():
    bank = SimBank([card(0)], lag_s=0.3)
    c = bank.cards[0]
    c.set_limit(1.0, 200_000)
    assert c.requested_mw == 200_000
    assert c.enforced_mw(1.29) == 300_000
    assert c.limit_bound_mw(1.29) == 300_000
    assert c.enforced_mw(1.3) == 200_000
    assert c.limit_bound_mw(1.3) == 200_000


def test_same_seed_same_run_other_seed_other_run():
    def run(seed):
        bank = SimBank([card(0, Phase(0, "trace", trace="h200-serving"))], seed=seed)
        out = []
        for k in range(300):
            bank.advance_to(k * 0.1)
            out.append(bank.cards[0].instant_w)
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_trace_replay_scales_to_the_cards_tgp():
    trace = load_trace("h200-load-steps")
    assert max(trace.power_w) > 700  # the recorded onset spikes above the 700 W limit
    phase = Phase(0, "trace", trace="h200-load-steps")
    demands = [phase.demand_w(k * 0.1, 30.0, 300.0) for k in range(600)]
    assert max(demands) == pytest.approx(300.0)  # clipped at TGP; overshoot is physics' job
    assert min(demands) == pytest.approx(min(trace.power_w) * 300 / 700, rel=0.05)


def test_an_hour_of_bank_time_is_fast():
    bank = SimBank([card(i, Phase(0, "trace", trace="h200-serving")) for i in range(4)])
    bank.advance_to(3600.0)  # 36 000 refreshes x 4 cards; behaviour, not a timing assert
    assert bank.cards[0].energy_mj > 0
