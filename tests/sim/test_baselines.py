"""The baseline policies and the oracle, each driven on a simulated bank."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.core.fairshare import fair_shares
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim.simulate import run_policies, run_scenario
from powerbudgetd_sim.baselines import CardDemand, RuledCausalOraclePolicy, SlurmPolicy, allocate, hull_bound
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.meters import MAX_REVERSALS, MAX_WRITES_PER_MIN
from powerbudgetd_sim.physics import SimBank
from powerbudgetd_sim.scenario import load_scenario
from powerbudgetd_sim.work import work_rate
from support.examples import examples


def _work(cards, alloc):
    return sum(work_rate(c.workload, c.demand_w, x / 1000, c.idle_w, c.tgp_w) for c, x in zip(cards, alloc))


card = st.builds(
    lambda lo, span, idle, d, wl: CardDemand(lo * 1000, (lo + span) * 1000, idle + d * (lo + span - idle), idle,
                                             lo + span, wl),
    st.sampled_from([100, 150, 200]), st.sampled_from([100, 150, 500]), st.floats(10, 90),
    st.floats(0, 1), st.sampled_from(["compute", "memory"]),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(card, min_size=1, max_size=8), st.floats(0, 1))
def test_allocate_keeps_the_budget_and_beats_fair_share(cards, frac):
    lo = sum(c.min_mw for c in cards)
    budget = int(lo + frac * (sum(c.max_mw for c in cards) - lo))
    alloc = allocate(budget, cards)
    assert sum(alloc) <= budget
    assert all(c.min_mw <= x <= c.max_mw for c, x in zip(cards, alloc))
    shares = fair_shares(budget, [c.min_mw for c in cards], [c.max_mw for c in cards])
    assert _work(cards, alloc) >= _work(cards, shares) - 1e-9
    assert _work(cards, alloc) <= hull_bound(budget, cards) * (1 + 1e-5) + 1e-9  # mW rounding


def test_allocate_gives_the_busy_card_what_idle_ones_cannot_use():
    busy = CardDemand(150_000, 300_000, 300.0, 30.0, 300.0, "compute")
    idle = CardDemand(150_000, 300_000, 30.0, 30.0, 300.0, "compute")
    alloc = allocate(1_000_000, [busy, idle, idle, idle])
    assert alloc[0] == 300_000
    assert 1_000_000 - 4 <= sum(alloc) <= 1_000_000  # what nobody can use is spread (rounded down)
    with pytest.raises(ValueError):
        allocate(500_000, [busy, idle, idle, idle])


def test_allocate_favours_compute_over_decode_when_watts_are_short():
    prefill = CardDemand(150_000, 300_000, 300.0, 30.0, 300.0, "compute")
    decode = CardDemand(150_000, 300_000, 300.0, 30.0, 300.0, "memory")
    a = allocate(450_000, [prefill, decode])
    assert a[0] > a[1]


def test_static_holds_fair_share_and_writes_once_per_card():
    sc = load_scenario("one-busy")
    r = run_scenario(sc, policy="static", duration_s=20, compare=False).report
    assert r["violation_ticks"] == 0
    assert [c["final_limit_w"] for c in r["cards"]] == [250.0] * 4
    assert r["cap_changes"] == 4


def test_slurm_moves_caps_only_at_its_balance_interval():
    sc = load_scenario("one-busy")
    early = run_scenario(sc, policy="slurm", duration_s=29, compare=False).report
    assert [c["final_limit_w"] for c in early["cards"]] == [250.0] * 4
    later = run_scenario(sc, policy="slurm", duration_s=95, compare=False).report
    assert later["violation_ticks"] == 0
    limits = [c["final_limit_w"] for c in later["cards"]]
    assert limits[0] == 300.0  # the young job got the watts the idle cards gave up
    assert limits[1:] == [150.0] * 3  # cut by half their slack, then to the floor


def _slurm(job_start=lambda i, now: None):
    bank = SimBank(list(load_scenario("one-busy").cards), seed=1)
    nvml = Nvml(SimNvmlLibrary(bank))
    nvml.init()
    pol = SlurmPolicy(nvml, 1000.0, job_start)
    pol.start()
    return pol


def test_slurm_rebalance_rules():
    pol = _slurm()
    # idle: cut by min(50 % of range = 75 W, half the slack); at 92 %: kept; over 95 %: +20 % of range
    caps = pol.rebalance(100.0, [30_000, 230_000, 249_000, 30_000])
    assert caps[0] == 175_000 and caps[3] == 175_000
    assert caps[1] == 250_000
    assert caps[2] == 280_000
    assert sum(caps) <= 1_000_000


def test_slurm_gives_a_young_job_an_even_split_up_to_max():
    pol = _slurm(lambda i, now: 90.0 if i == 0 else None)
    pol.cap_mw = [250_000, 150_000, 150_000, 150_000]
    caps = pol.rebalance(100.0, [None, 30_000, 30_000, 30_000])
    assert caps[0] == 300_000
    assert sum(caps) <= 1_000_000


def test_reactive_boots_at_max_and_violates():
    sc = load_scenario("power-event")
    r = run_scenario(sc, policy="reactive", duration_s=4, compare=False).report
    assert r["violation_ticks"] == r["ticks"]
    assert r["max_sum_limit_bound_w"] == 1200.0
    loaded = run_scenario(sc, policy="reactive", duration_s=15, compare=False).report
    assert [c["final_limit_w"] for c in loaded["cards"]] == [250.0] * 4  # cut once the draw neared the budget
    assert loaded["cap_changes"] == 8


@pytest.mark.parametrize("name", ["ada-2", "mixed-bank"])
def test_oracle_keeps_the_budget_and_bounds_every_policy(name):
    results = run_policies(load_scenario(name), duration_s=40)
    oracle = results["oracle"].report
    assert oracle["violation_ticks"] == 0
    assert oracle["work_vs_oracle"] == 1.0
    for p in ("static", "slurm", "powerbudgetd"):
        assert results[p].report["work"] <= oracle["work"] + 1e-6


@pytest.mark.parametrize("name", ["hgx-8-day", "mixed-bank", "ada-2"])
def test_oracle_meets_the_hull_bound_on_packaged_scenarios(name):
    # Where the allocation does as much work as the concave-hull bound, it is optimal.
    sc = load_scenario(name)
    budget = int(sc.budget_w * 1000)
    for t in range(0, int(sc.duration_s), 3):
        cards = [
            CardDemand(round(c.min_w * 1000), round(c.max_w * 1000), c.profile.demand_w(t, c.idle_w, c.board_tgp_w),
                       c.idle_w, c.board_tgp_w, c.profile.workload_at(t))
            for c in sc.cards
        ]
        assert _work(cards, allocate(budget, cards)) == pytest.approx(hull_bound(budget, cards), rel=1e-6)


@pytest.mark.parametrize("name", ["ada-2", "mixed-bank"])
def test_causal_oracle_keeps_the_budget_through_the_lag_and_trails_the_clairvoyant_one(name):
    results = run_policies(load_scenario(name), ["oracle", "causal", "static"], duration_s=40)
    causal = results["causal"].report
    assert causal["violation_ticks"] == 0  # decreases in force before the increases they pay for
    assert causal["work_vs_causal"] == 1.0
    assert results["static"].report["work"] < causal["work"] <= results["oracle"].report["work"]


def test_causal_oracle_cuts_one_reading_after_the_demand_and_raises_two_after():
    """ada-2: GPU 0 bursts from idle at 12.3 s while GPU 1 idles, both at 200 W. The
    causal oracle sees the burst at 12.3 s and cuts GPU 1 then (in force at 12.4 s);
    GPU 0's raise waits for that cut to be in force, is written at 12.4 s and bites at
    12.5 s: two readings after the demand. The clairvoyant one has it at 12.3 s."""
    sc = load_scenario("ada-2")
    runs = {p: run_scenario(sc, policy=p, duration_s=13, keep_series=True, compare=False).series
            for p in ("causal", "oracle")}
    causal = {round(t, 1): lim for t, lim in zip(runs["causal"].t, runs["causal"].limit_w)}
    oracle = {round(t, 1): lim for t, lim in zip(runs["oracle"].t, runs["oracle"].limit_w)}
    assert causal[12.3] == [200.0, 200.0] and causal[12.4][0] == 200.0 and causal[12.4][1] < 200.0
    assert causal[12.5][0] > 250.0
    assert oracle[12.3][0] > 250.0


def test_causal_oracle_is_a_policy_of_the_command_line():
    r = run_scenario(load_scenario("one-busy"), policy="causal", duration_s=5).report
    assert r["policy"] == "causal" and r["work_vs_causal"] == 1.0 and 0.9 < r["work_vs_oracle"] <= 1.0


@pytest.mark.parametrize("name,offset_s", [("ada-2", 0.0), ("ada-2", 2.9), ("bursty", 0.0), ("workstation-4", 1.3),
                                           ("mixed-bank", 0.0)])
def test_ruled_oracle_keeps_the_rules_it_is_compared_under(name, offset_s):
    """The like-for-like bar, measured on the enforced limits by the same meters as
    powerbudgetd: at most MAX_REVERSALS in any FLAP_WINDOW_S and at most
    MAX_WRITES_PER_MIN writes a minute on every card, within the budget; the
    unconstrained causal oracle breaks both on the same demand."""
    sc = load_scenario(name).shifted(offset_s)
    results = run_policies(sc, ["causal", "ruled"], duration_s=90)
    ruled, causal = results["ruled"].report, results["causal"].report
    assert ruled["violation_ticks"] == 0
    assert ruled["flapping"]["max_reversals"] <= MAX_REVERSALS and not ruled["flapping"]["flapping"]
    assert ruled["writes_per_card_per_min"]["max"] <= MAX_WRITES_PER_MIN
    assert causal["flapping"]["max_reversals"] > MAX_REVERSALS
    assert causal["writes_per_card_per_min"]["max"] > MAX_WRITES_PER_MIN
    assert ruled["work_vs_ruled"] == 1.0 and ruled["work"] <= causal["work"] * 1.001


def test_ruled_oracle_always_allows_the_move_back_to_fair_share():
    """A card out of moves (two reversals in the window) still returns to fair share, the
    move every move away kept in reserve; a move away then is refused."""
    bank = SimBank(list(load_scenario("ada-2").cards), lag_s=0.1, seed=1)
    oracle = RuledCausalOraclePolicy(bank, 400.0)
    for t, mw in ((1.0, 250_000), (2.0, 150_000), (3.0, 250_000)):  # up, down (1 reversal), up (2)
        oracle.write(t, 0, mw)
    assert oracle.allowed(0, 4.0, 250_000, 200_000, 200_000) == 200_000  # back to fair share: allowed
    assert oracle.allowed(0, 4.0, 250_000, 150_000, 200_000) == 200_000  # past it: only as far as fair share
    assert oracle.allowed(0, 4.0, 250_000, 280_000, 200_000) == 280_000  # further out: its return is counted
    assert oracle.allowed(0, 4.0, 200_000, 150_000, 200_000) == 200_000  # from fair share out: no room left
    assert oracle.allowed(0, 4.0, 250_000, 252_000, 200_000) == 250_000  # under min_step_w: not worth a write
    assert oracle.allowed(0, 14.0, 250_000, 150_000, 200_000) == 150_000  # the reversals have left the window
