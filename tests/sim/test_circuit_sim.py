"""The simulator's virtual-time circuit: the lease store model and the host comparison."""

from __future__ import annotations

import pytest

from powerbudgetd_sim.circuit import LeaseStore, compare, run_circuit


def test_lease_store_model_keeps_the_transaction_and_ttl_semantics() -> None:
    store = LeaseStore(budget_w=3000, ttl_s=5)
    store.seat("a", 1000)
    store.seat("b", 1000)
    la, lb = store.grant(0.0), store.grant(0.0)
    _, rev = store.view()
    assert store.raise_grant(rev, "a", 600, la)
    assert not store.raise_grant(rev, "b", 600, lb)  # a grant changed since the read
    store.put_want("b", 300, lb)  # a want is no seat or grant: does not fail a raise
    _, rev = store.view()
    assert store.raise_grant(rev, "b", 400, lb)
    store.keepalive(4.0, la)
    store.expire(5.0)  # b's lease ends; a's was renewed at 4 s
    view, _ = store.view()
    assert view.grants == {"a": 600} and "b" not in view.wants
    assert store.max_committed_w <= 3000
    assert LeaseStore(3000, 5, outages=[(10.0, 30.0)]).up(9.9) and not LeaseStore(3000, 5, outages=[(10.0, 30.0)]).up(39.9)


def test_hosts_share_one_circuit_within_its_budget_and_ride_out_an_outage() -> None:
    hosts = ["one-busy", "h200-1", "ada-2"]
    result = compare(hosts, duration_s=60.0, ttl_s=6.0)
    for name, r in result.items():
        if name != "oracle":  # the oracle's writes land at once; it is a bound, not a policy
            assert r["within_budget"], (name, r)
        assert r["store_max_committed_w"] <= r["budget_w"] + 1e-6
    assert result["circuit"]["seats_w"] < result["static"]["seats_w"]
    outage = result["circuit_outage_30s"]["at_reserve_after_outage_s"]
    # A 30 s outage at 30 s: back to reserve at the fence (< TTL), grants again after it.
    assert all(s is not None and 0 < s <= 30 + 10 for s in outage.values()), outage
    assert result["circuit_outage_30s"]["work_tgp_s"] < result["circuit"]["work_tgp_s"]


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="policy"):
        run_circuit(["one-busy", "h200-1"], policy="greedy", duration_s=1)
