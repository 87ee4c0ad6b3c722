"""Demand where the cards line up (``sim/training.py``): jobs start together, every card
of a job's hosts steps in lockstep at TGP and dips together on the all-reduce, idles
outside its job; the seed sets the mix and moves the spans a little; and on the tiny
tree nameplate trips where powerbudgetd does not."""

from __future__ import annotations

from collections import Counter

import pytest

from powerbudgetd_sim.scenario import load_scenario
from powerbudgetd_sim.training import (
    COMPUTE_LEVEL,
    JITTER,
    JOBS,
    RIPPLE,
    STEP_S,
    SYNC_FRACTION,
    SYNC_LEVEL,
    job_span,
    pick_job,
    training_scenario,
)

RUN_S = 60.0


def _hosts(seed: int, count: int) -> list:
    sc = load_scenario("workstation-4")
    return [training_scenario(sc, seed, i, RUN_S) for i in range(count)]


def _fractions(sc, t: float) -> list[float]:
    return [c.profile.demand_w(t, c.idle_w, c.board_tgp_w) / c.board_tgp_w for c in sc.cards]


def test_every_card_of_a_job_steps_in_lockstep_at_tgp_and_dips_together_on_the_all_reduce() -> None:
    hosts = [h for h in _hosts(1, 24) if h.name.endswith("@pretrain")]
    assert len(hosts) >= 8
    span = hosts[0].cards[0].profile.span
    computing = sync = 0
    for k in range(int((span.end_s - span.start_s) / 0.1)):
        t = span.start_s + 0.05 + 0.1 * k
        levels = [f for h in hosts for f in _fractions(h, t)]
        if span.computing(t):
            computing += 1
            assert min(levels) >= COMPUTE_LEVEL * (1 - RIPPLE) - 1e-9, t  # every card busy at once
        else:
            sync += 1
            assert max(levels) <= SYNC_LEVEL + 1e-9 and min(levels) >= SYNC_LEVEL * (1 - RIPPLE) - 1e-9, t
    assert sync / (computing + sync) == pytest.approx(SYNC_FRACTION, abs=0.02)
    # Before its job starts a card idles.
    card = hosts[0].cards[0]
    assert card.profile.demand_w(span.start_s - 0.2, card.idle_w, card.board_tgp_w) == card.idle_w


def test_the_jobs_start_together_and_hold_their_hosts_for_the_stated_span() -> None:
    pretrain, finetune, between = (job_span(j, RUN_S, seed=5) for j in JOBS)
    assert abs(pretrain.start_s - finetune.start_s) <= (0.01 + 2 * JITTER) * RUN_S  # together
    assert pretrain.end_s == RUN_S  # the big run holds to the end
    for span in (pretrain, finetune, between):
        assert abs(span.start_s - span.job.start * RUN_S) <= JITTER * RUN_S + 1e-9
    assert finetune.end_s == pytest.approx(finetune.job.end * RUN_S, abs=JITTER * RUN_S)
    assert (pretrain.end_s - pretrain.start_s) > 10 * STEP_S
    with pytest.raises(ValueError):
        job_span(JOBS[0], 0.0, 1)


def test_the_seed_sets_the_mix_by_the_jobs_weights() -> None:
    counts = Counter(pick_job(3, i).name for i in range(3000))
    for job in JOBS:
        assert counts[job.name] / 3000 == pytest.approx(job.weight, abs=0.03)
    assert [pick_job(3, i) for i in range(20)] == [pick_job(3, i) for i in range(20)]
    assert [pick_job(3, i) for i in range(20)] != [pick_job(4, i) for i in range(20)]


def test_on_the_tiny_tree_nameplate_trips_where_powerbudgetd_carries_the_hosts(tmp_path) -> None:
    """The sweep's tiny tree (``test_sweep``: N = 4 on a 72 A PDU, 1300 W nameplates)
    under training demand, a seed whose hosts are all in the two big jobs: at 1.75 N
    (7 hosts, 126 % of the breaker while they compute) nameplate heats the breaker on
    net; powerbudgetd holds the PDU's continuous rating and trips nothing, at every count
    (at 1.5 N, 108 % while computing, the all-reduce dips keep nameplate's mean (I /
    rating)^2 about 1: not asserted either way)."""
    from test_sweep import SCENARIO, TREE

    from powerbudgetd_sim.sweep import sweep, training_source

    (tmp_path / "four-busy.toml").write_text(SCENARIO)
    tree = tmp_path / "tree.toml"
    tree.write_text(TREE.format(scenario=tmp_path / "four-busy.toml"))
    assert {pick_job(7, i).name for i in range(7)} == {"pretrain", "finetune"}
    r = sweep(str(tree), duration_s=12.0, steps=(1.0, 1.75), seed=7, scenario_source=training_source(7, 12.0))
    assert [row["count"] for row in r["rows"]] == [4, 7]
    assert r["rows"][-1]["runs"]["nameplate"]["trips"]
    assert r["largest_zero_trip_count"]["powerbudgetd"] == 7
    assert r["rows"][0]["runs"]["powerbudgetd"]["work_per_host"] >= 0.98
