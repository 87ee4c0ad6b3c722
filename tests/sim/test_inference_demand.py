"""Demand shaped like inference (``sim/inference.py``): the request-rate curves have the
stated shape (the diurnal min/max ratio, the burst frequency, the mix of models), the
seed moves the phase and the mix, and the cards' demand follows the rate."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from powerbudgetd_sim.inference import (
    BURST_RATE,
    BURSTS_PER_DAY,
    DIURNAL_MIN_MAX,
    MODELS,
    InferenceProfile,
    inference_scenario,
    pick_model,
    rate_curve,
)
from powerbudgetd_sim.scenario import load_scenario

DAY_S = 120.0


def _samples(day_s: float, n: int = 2400) -> list[float]:
    return [day_s * k / n for k in range(n)]


def test_the_diurnal_curve_spans_the_stated_min_max_ratio_once_a_day() -> None:
    curve = dataclasses.replace(rate_curve(DAY_S, seed=7), bursts=())
    rates = [curve.rate(t) for t in _samples(DAY_S)]
    assert max(rates) == pytest.approx(1.0, abs=1e-3)
    assert min(rates) / max(rates) == pytest.approx(DIURNAL_MIN_MAX, abs=1e-3)
    # One trough and one peak a day: the rate crosses its midpoint exactly twice.
    mid = (1 + DIURNAL_MIN_MAX) / 2
    crossings = sum((a - mid) * (b - mid) < 0 for a, b in zip(rates, rates[1:] + rates[:1]))
    assert crossings == 2
    assert curve.rate(10.0) == pytest.approx(curve.rate(10.0 + DAY_S))  # the day repeats


def test_bursts_come_at_the_stated_frequency_and_lift_the_rate() -> None:
    """Over 400 host-days the bursts average BURSTS_PER_DAY a day (Poisson: within 5 %),
    and during a burst the rate is BURST_RATE over the diurnal curve (at most 1)."""
    counts = [len(rate_curve(DAY_S, seed=s, host=h).bursts) for s in range(20) for h in range(20)]
    assert sum(counts) / len(counts) == pytest.approx(BURSTS_PER_DAY, rel=0.05)
    assert 0 in counts or min(counts) < BURSTS_PER_DAY < max(counts)  # a process, not a fixed count
    curve = next(c for c in (rate_curve(DAY_S, seed=s) for s in range(50)) if c.bursts)
    b = curve.bursts[0] + curve.burst_s / 2
    assert curve.in_burst(b)
    assert curve.rate(b) == pytest.approx(min(1.0, curve.diurnal(b) + BURST_RATE))


def test_the_mix_of_models_follows_their_weights_and_the_seed() -> None:
    picks = Counter(pick_model(seed, host).name for seed in range(40) for host in range(50))
    total = sum(picks.values())
    for m in MODELS:
        assert picks[m.name] / total == pytest.approx(m.weight, abs=0.03)
    mixes = {tuple(pick_model(seed, h).name for h in range(10)) for seed in range(5)}
    assert len(mixes) > 1  # seeds vary the mix


def test_seeds_vary_the_phase_and_hosts_stay_close_to_their_seeds() -> None:
    phases = [rate_curve(DAY_S, seed=s).phase for s in range(10)]
    assert len({round(p, 3) for p in phases}) == 10
    same_seed = [rate_curve(DAY_S, seed=3, host=h).phase for h in range(10)]
    spread = max(_circular_distance(p, same_seed[0]) for p in same_seed)
    assert spread <= 0.1 + 1e-9  # within the jitter either side


def _circular_distance(a: float, b: float) -> float:
    d = abs(a - b) % 1.0
    return min(d, 1.0 - d)


def test_the_cards_demand_follows_the_rate_through_the_serving_trace() -> None:
    """A host's cards draw more, on average, in the busiest tenth of its day than in the
    quietest tenth; the demand replays the trace's bursts (not a flat level)."""
    sc = inference_scenario(load_scenario("hgx-8"), seed=2, host=0, day_s=DAY_S, bursts_per_day=0)
    card = sc.cards[0]
    prof = card.profile
    assert isinstance(prof, InferenceProfile)
    ts = _samples(DAY_S)
    by_rate = sorted(ts, key=prof.curve.rate)
    tenth = len(ts) // 10
    tgp = card.tgp_w or card.max_w
    low = [prof.demand_w(t, card.idle_w, tgp) for t in by_rate[:tenth]]
    high = [prof.demand_w(t, card.idle_w, tgp) for t in by_rate[-tenth:]]
    assert sum(high) / len(high) > 1.5 * sum(low) / len(low)
    assert max(high) - min(high) > 100  # bursts, from the trace
    assert all(d >= card.idle_w for d in low + high)
    # The scenario keeps the bank, its budget and its feed.
    base = load_scenario("hgx-8")
    assert sc.budget_w == base.budget_w and sc.feed == base.feed and len(sc.cards) == len(base.cards)


def test_a_day_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="day_s"):
        rate_curve(0.0, seed=1)
