"""The simulated bank's physics against the H200 measurements in the brief."""

from __future__ import annotations

import statistics

import pytest

from support.rig import busy, card, idle
from powerbudgetd_sim.physics import TRANSIENT_MAX, SimBank
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


@pytest.mark.parametrize("trace", ["h200-load-steps", "h200-serving"])
def test_average_is_the_trailing_one_second_mean_of_the_power_and_instants_show_spikes(trace):
    bank = SimBank([card(0, Phase(0, "trace", trace=trace))], seed=2)
    c = bank.cards[0]
    levels = []
    spikes = 0
    for k in range(600):
        bank.advance_to(k * 0.1)
        levels.append(c.level_w)
        if k >= 10:
            assert c.avg_w == pytest.approx(statistics.fmean(levels[-10:]))
        # An instant sample is the power over the refresh, or a spike above it that the
        # firmware had not throttled yet (it shows in the instant field, not the average).
        assert c.instant_w >= c.level_w - 1e-9
        spikes += c.instant_w > c.level_w + 1e-9
    if trace == "h200-serving":
        assert spikes > 0  # serving spikes from a card at its cap


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
    assert 1.1 * 250 <= onset <= TRANSIENT_MAX * 250 + 1e-6  # the onset overshoot (1.09-1.355x measured)
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


def test_trace_replay_scales_to_the_cards_tgp_and_never_clips():
    trace = load_trace("h200-load-steps")
    assert max(trace.power_w) > 700  # the recorded onset spikes above the 700 W limit
    phase = Phase(0, "trace", trace="h200-load-steps")
    demands = [phase.demand_w(k * 0.025, 30.0, 300.0) for k in range(2400)]
    # never clipped at TGP: the recorded spikes are demand, the cap is physics' job
    assert max(demands) == pytest.approx(max(trace.power_w) * 300 / 700)
    assert max(demands) > 1.3 * 300
    assert min(demands) == pytest.approx(min(trace.power_w) * 300 / 700, rel=0.05)


@pytest.mark.parametrize("demand_w,from_w,to_w", [(300, 300, 250), (300, 300, 200), (400, 300, 150), (290, 300, 280)])
def test_a_limit_cut_goes_to_the_new_limit_not_to_idle(demand_w, from_w, to_w):
    # Seen before: 300 W demand, cut 300 -> 250 W read 30, 78, then 289 W.
    spec = card(0, busy(0.0, power_w=demand_w), min_w=100, max_w=400, default_w=from_w)
    bank = SimBank([spec], seed=4, lag_s=0.0)
    c = bank.cards[0]
    bank.advance_to(5.0)
    c.set_limit(5.0, to_w * 1000)
    readings, avgs = [], []
    for k in range(1, 40):
        bank.advance_to(5.0 + k * 0.1)
        readings.append(c.instant_w)
        avgs.append(c.avg_w)
    assert min(readings) >= 0.9 * to_w, readings[:5]
    assert max(readings) <= (1.0 + 0.08) * to_w  # no false overshoot either
    assert avgs[0] > to_w + 0.5 * (min(demand_w, from_w) - to_w) * 0.8  # the average drains over a second
    assert max(avgs[12:]) <= to_w + 1e-6


def test_a_card_at_its_cap_spikes_as_the_real_one_does():
    # Real: 16 of 17 spikes above 770 W came from a card at 0.94-1.0x its 700 W cap.
    spec = card(0, Phase(0, "trace", trace="h200-serving", scale=1.0), min_w=200, max_w=700, idle_w=80)
    bank = SimBank([spec], seed=1)
    c = bank.cards[0]
    from_cap = 0
    prev = c.instant_w
    for k in range(1, 600):
        bank.advance_to(k * 0.1)
        if c.instant_w > 770 and 0.94 * 700 <= prev <= 700:
            from_cap += 1
        prev = c.instant_w
    assert from_cap >= 10


@pytest.mark.parametrize("limit_w", [350.0, 500.0])
def test_transients_reach_past_every_cap(limit_w):
    # The cap holds the average; at a lower cap the same workload still spikes above it.
    spec = card(0, Phase(0, "trace", trace="h200-serving", scale=1.0), min_w=200, max_w=700, idle_w=80)
    bank = SimBank([spec], seed=1, lag_s=0.0)
    c = bank.cards[0]
    c.set_limit(0.0, int(limit_w * 1000))
    instants, avgs = [], []
    for k in range(1, 600):
        bank.advance_to(k * 0.1)
        instants.append(c.instant_w)
        avgs.append(c.avg_w)
    assert max(avgs[20:]) <= limit_w + 1e-6
    assert max(instants) > 1.2 * limit_w
    assert max(instants) <= TRANSIENT_MAX * limit_w + 1e-6


def test_an_hour_of_bank_time_is_fast():
    bank = SimBank([card(i, Phase(0, "trace", trace="h200-serving")) for i in range(4)])
    bank.advance_to(3600.0)  # 36 000 refreshes x 4 cards; behaviour, not a timing assert
    assert bank.cards[0].energy_mj > 0
