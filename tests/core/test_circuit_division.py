"""The circuit's pure core: the invariant at every revision, the fair division, the fence."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.core.circuit import (
    CircuitView,
    Fence,
    GrantPolicy,
    fenced_lease_ttl_s,
    HostPower,
    WakeBudget,
    raise_allowed,
)
from powerbudgetd.core.fair import max_min_fair
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.tree import Host as TreeHost, Node, PowerTree
from support.examples import examples

watts = st.floats(min_value=0, max_value=5000, allow_nan=False)


@given(st.floats(min_value=-1000, max_value=20000, allow_nan=False), st.dictionaries(st.text("abcdef", min_size=1, max_size=3), watts, max_size=8))
def test_max_min_fair_never_exceeds_the_pool_and_is_max_min(pool, wants):
    out = max_min_fair(pool, wants)
    assert set(out) == set(wants)
    assert sum(out.values()) <= max(pool, 0) + 1e-6
    for host, got in out.items():
        assert 0 <= got <= wants[host] + 1e-9
    # Max-min: a host short of its want gets at least every other host's share.
    for host, got in out.items():
        if got < wants[host] - 1e-6:
            assert all(got >= other - 1e-6 for other in out.values())
    # Nothing left on the table while someone is short.
    if any(out[h] < wants[h] - 1e-6 for h in wants):
        assert sum(out.values()) >= pool - 1e-6


def test_max_min_fair_examples():
    assert max_min_fair(1000, {"a": 100, "b": 2000, "c": 2000}) == {"a": 100, "b": 450, "c": 450}
    assert max_min_fair(-5, {"a": 10}) == {"a": 0.0}
    assert max_min_fair(1000, {"a": 0, "b": 300}) == {"a": 0.0, "b": 300}


# -- the invariant over a whole history of reads, raises and lowerings ----------------

@st.composite
def histories(draw):
    hosts = [f"h{i}" for i in range(draw(st.integers(1, 6)))]
    seats = {h: draw(st.floats(100, 1500)) for h in hosts}
    budget = draw(st.floats(sum(seats.values()), sum(seats.values()) + 8000))
    steps = draw(st.lists(st.tuples(st.sampled_from(hosts), watts, st.integers(0, 3), st.booleans()), max_size=60))
    return budget, seats, steps


@settings(max_examples=examples(300), deadline=None)
@given(histories())
def test_every_revision_keeps_seats_plus_grants_within_the_budget(h):
    """A model of the store: each host reads (possibly a stale revision), decides with
    its own policy, and raises only by a compare-and-swap on that revision's grants and
    seats; lowering is unconditional. The invariant holds at every revision."""
    budget, seats, steps = h
    grants: dict[str, float] = {}
    wants: dict[str, float] = {}
    revision = 0
    history = [(revision, dict(grants))]
    policies = {host: GrantPolicy(step_w=10, release_hold_s=2) for host in seats}
    now = 0.0
    for host, want, staleness, lower in steps:
        now += 1
        wants[host] = want
        revision += 1
        history.append((revision, dict(grants)))
        # The host read `staleness` revisions ago.
        read_rev, read_grants = history[max(0, len(history) - 1 - staleness)]
        view = CircuitView(budget, seats, read_grants, dict(wants), revision=read_rev)
        current = grants.get(host, 0.0)
        target = policies[host].target_w(view, host, read_grants.get(host, 0.0), now)
        if lower or target < current:
            grants[host] = min(current, target)  # lowering: no check
        elif target > current and raise_allowed(view, host, target):
            if read_grants == grants:  # the transaction's compare: nothing changed since the read
                grants[host] = target
        revision += 1
        history.append((revision, dict(grants)))
        assert sum(seats.values()) + sum(grants.values()) <= budget + 1e-6, (revision, grants)


def test_policy_hysteresis_and_release_hold():
    view = CircuitView(3000, {"a": 1000, "b": 1000}, {}, {"a": 800, "b": 0})
    pol = GrantPolicy(step_w=50, release_hold_s=10)
    assert pol.target_w(view, "a", 0, 0.0) == 800  # free 1000: takes its want
    # A small increase is not worth a transaction.
    assert pol.target_w(CircuitView(3000, {"a": 1000, "b": 1000}, {"a": 800}, {"a": 830}), "a", 800, 1.0) == 800
    # The want drops: the grant is held for the release hold, then lowered.
    idle = CircuitView(3000, {"a": 1000, "b": 1000}, {"a": 800}, {"a": 100})
    assert pol.target_w(idle, "a", 800, 2.0) == 800
    assert pol.target_w(idle, "a", 800, 11.9) == 800
    assert pol.target_w(idle, "a", 800, 12.0) == 100
    # b wants too: a's fair share is 500 and it gives back after the hold; b waits for free watts.
    both = CircuitView(3000, {"a": 1000, "b": 1000}, {"a": 800}, {"a": 1000, "b": 1000})
    pol_b = GrantPolicy(step_w=50, release_hold_s=10)
    assert pol_b.target_w(both, "b", 0, 0.0) == 200  # only what is free
    pol_a = GrantPolicy(step_w=50, release_hold_s=10)
    assert pol_a.target_w(both, "a", 800, 0.0) == 800
    assert pol_a.target_w(both, "a", 800, 10.0) == 500


def test_over_committed_circuit_gives_back_at_once():
    view = CircuitView(3000, {"a": 1000, "b": 1000}, {"a": 800}, {"a": 1000}, pending={"c": 1200})
    assert view.pool_w < 0
    assert GrantPolicy(step_w=50, release_hold_s=60).target_w(view, "a", 800, 0.0) == 0


def test_seat_fits():
    view = CircuitView(3000, {"a": 1000, "b": 1000}, {"a": 500})
    assert view.seat_fits(500, "c") and not view.seat_fits(501, "c")
    assert view.seat_fits(1500, "a")  # its own seat and grant are replaced


def test_the_view_leaves_room_for_live_hosts_without_a_seat():
    # "c" runs on its claimed 300 W without a seat: a seat or a raise of another host
    # leaves it that room; its own seat is not counted against itself.
    view = CircuitView(3000, {"a": 1000, "b": 1000}, {"a": 500}, unseated={"c": 300.0})
    assert view.unseated_others_w("a") == 300 and view.unseated_others_w("c") == 0
    assert view.seat_fits(200, "d") and not view.seat_fits(201, "d")
    assert view.seat_fits(500, "c") and not view.seat_fits(501, "c")
    assert raise_allowed(view, "a", 700) and not raise_allowed(view, "a", 701)
    assert view.carried_w == 2800 and view.unseated_w == 300
    # The same circuit with "c" seated admits the same: its reserve is counted once.
    seated = CircuitView(3000, {"a": 1000, "b": 1000, "c": 300}, {"a": 500})
    assert seated.seat_fits(200, "d") and not seated.seat_fits(201, "d")
    assert raise_allowed(seated, "a", 700) and not raise_allowed(seated, "a", 701)


# -- the fence ----------------------------------------------------------------------

@settings(max_examples=examples(500), deadline=None)
@given(
    ttl=st.integers(2, 120),
    lower=st.floats(0, 1.5),
    r=st.floats(0, 1e-3),
    host_rate=st.floats(1 - 1e-3, 1 + 1e-3),
    server_rate=st.floats(1 - 1e-3, 1 + 1e-3),
    uplink=st.floats(0, 5),
    send_real=st.floats(0, 1e6),
)
def test_local_validity_ends_before_the_server_can_reassign(ttl, lower, r, host_rate, server_rate, uplink, send_real):
    """Real time: the host sends a keepalive at ``send_real``; the server receives it
    ``uplink`` s later and expires the lease when its own clock has run TTL. The host's
    clock runs at ``host_rate``. The host's deadline, plus its time to lower (measured
    on its own clock), must come no later than the server's expiry."""
    fence = Fence(lower_s=lower, clock_rate_allowance=1e-3)
    if fence.usable_s(ttl) <= 0:
        return
    local_send = send_real * host_rate  # the host's monotonic clock reading at the send
    deadline_local = fence.valid_until(local_send, ttl)
    at_reserve_real = (deadline_local + lower) / host_rate
    server_expiry_real = send_real + uplink + ttl / server_rate
    assert at_reserve_real <= server_expiry_real + 1e-6


@settings(max_examples=examples(500), deadline=None)
@given(
    ttl=st.integers(2, 120),
    watchdog=st.floats(0.1, 60),
    fallback=st.floats(0, 60),
    host_rate=st.floats(1 - 1e-3, 1 + 1e-3),
    server_rate=st.floats(1 - 1e-3, 1 + 1e-3),
    uplink=st.floats(0, 5),
    hang=st.floats(0, 1),
)
def test_a_hung_host_is_at_its_reserve_before_its_lease_can_expire(ttl, watchdog, fallback, host_rate, server_rate,
                                                                   uplink, hang):
    """Real time from the last keepalive etcd acknowledged (sent at 0): the daemon hangs
    at most TTL/6 later (the next renewal was due then; ``hang`` of that), its watchdog
    kills it ``watchdog`` s after that and the failsafe ends ``fallback`` s after the kill
    (both on the host's clock). etcd, at its own rate, expires the lease no earlier than
    the fenced TTL after it received the keepalive: the cards are down first."""
    lease_ttl = fenced_lease_ttl_s(ttl, watchdog, fallback)
    at_reserve_real = (hang * ttl / 6 + watchdog + fallback) / host_rate
    server_expiry_real = uplink + lease_ttl / server_rate
    assert at_reserve_real <= server_expiry_real


def test_unreadable_records_stop_raises_but_take_no_grant_back():
    """Another host's unreadable grant counts at the whole budget: no raise fits, but
    a host's own grant is not given back for it (it was granted when the records held)."""
    view = CircuitView(3000, {"a": 1000, "b": 1000}, {"a": 400, "b": 3000}, {"a": 1000}, unknown_grants=frozenset({"b"}))
    policy = GrantPolicy(step_w=10, release_hold_s=60)
    assert view.free_w < 0 and view.free_known_w > 0
    assert policy.target_w(view, "a", 400, 0.0) == 400
    assert policy.target_w(view, "a", 400, 120.0) == 400  # past the release hold too: its fair share is known
    assert not raise_allowed(view, "a", 500)


def test_seats_over_a_lowered_budget_keep_the_earliest():
    view = CircuitView(2000, {"a": 800, "b": 800, "c": 800}, seat_order={"a": 5, "b": 9, "c": 7})
    assert view.seat_in_budget("a") and view.seat_in_budget("c") and not view.seat_in_budget("b")
    assert not view.seat_in_budget("z")


def test_fence_numbers_and_ttl_check():
    fence = Fence(lower_s=1.0)
    assert fence.valid_until(100.0, 30) == pytest.approx(100 + 30 * 0.999 / 1.001 - 1.0)
    assert fence.usable_s(1) <= 0.0
    assert fenced_lease_ttl_s(30, 10, 10) == 30 + 21  # 20 s stretched by 1000 ppm each way, whole seconds
    with pytest.raises(ValueError):
        Fence(lower_s=-1)


def test_host_power_uses_the_feed_model():
    hp = HostPower(Feed(psu_efficiency=0.9, host_w=200), reserve_w=1500)
    assert hp.board_budget_w() == pytest.approx(1500 * 0.9 - 200)
    assert hp.board_budget_w(500) == pytest.approx(2000 * 0.9 - 200)
    # Round trip with the feed's own wall conversion.
    assert hp.feed.wall_w(hp.board_budget_w(500)) == pytest.approx(2000)
    with pytest.raises(ValueError, match="host_w"):
        HostPower(Feed(), reserve_w=100)
    assert hp.grant_covering_w(hp.board_budget_w(500)) == pytest.approx(500)
    assert hp.grant_covering_w(0.0) == 0.0


@settings(max_examples=examples(300), deadline=None)
@given(held=st.floats(0, 3000), in_use=st.floats(0, 3000), cards=st.one_of(st.none(), st.floats(0, 5000)))
def test_the_store_follows_the_cards_down_step_by_step_never_below_them(held, in_use, cards):
    """While the cards come down to ``in_use``, the store's grant is lowered to the least
    grant that still covers them: never below what they may draw, never below in use,
    never raised; and all the way to in use once they are within it."""
    in_use = min(in_use, held)
    hp = HostPower(Feed(psu_efficiency=0.9, host_w=200), reserve_w=1000)
    got = hp.lowered_grant_w(held, in_use, cards)
    assert in_use <= got <= held
    if cards is None:
        assert got == held
    elif got < held:
        assert hp.board_budget_w(got) >= cards - 1e-6 or got == in_use  # covers the cards, or they are within in use
        if got == in_use:
            assert cards <= hp.board_budget_w(in_use) + 1e-5
    if cards is not None and cards <= hp.board_budget_w(in_use):
        assert got == in_use


def test_a_shed_lowered_again_each_round_reaches_the_store_each_round():
    """A fair share falling round after round (1195 -> 900 -> 740 W): the store follows
    the cards to each level they reached instead of waiting for the lowering to stop."""
    hp = HostPower(Feed(psu_efficiency=1.0, host_w=0), reserve_w=1000)
    held = 1195.0
    for in_use, cards_board in ((900.0, 2195.0), (740.0, 1900.0), (690.0, 1740.0), (690.0, 1690.0)):
        held = hp.lowered_grant_w(held, in_use, cards_board)
        assert held == pytest.approx(cards_board - 1000 if cards_board - 1000 > in_use else in_use)
    assert held == 690.0


def test_many_small_excesses_are_given_back_after_the_hold_so_no_host_starves():
    """Ten hosts each 10 W above a fair share of 100 W (half a step): after the release
    hold each gives its 10 W back, and the host that held nothing gets its share."""
    hosts = [f"h{i}" for i in range(11)]
    seats = {h: 100.0 for h in hosts}
    grants = {h: 110.0 for h in hosts[:10]}
    wants = {h: 500.0 for h in hosts}
    policies = {h: GrantPolicy(step_w=20, release_hold_s=10) for h in hosts}
    budget = sum(seats.values()) + 1100.0  # a pool of 1100 W: 100 W each
    for now in range(30):
        for h in hosts:
            view = CircuitView(budget, seats, dict(grants), wants)
            current = grants.get(h, 0.0)
            target = policies[h].target_w(view, h, current, float(now))
            if target < current or (target > current and raise_allowed(view, h, target)):
                grants[h] = target
        if now < 10:
            assert "h10" not in grants  # nothing free until the hold ends
    assert grants == {h: pytest.approx(100.0) for h in hosts}


def test_an_unreadable_record_on_a_tree_takes_no_grant_back():
    """A seat or grant that could not be read is counted at the whole budget: nothing is
    raised while it is there, but the others keep their grants through the hold and
    their fair shares are divided as if it were not there."""
    nodes = {"root": Node("root", 10_000.0), "A": Node("A", 7000.0, "root"), "B": Node("B", 7000.0, "root")}
    hosts = {h: TreeHost(h, {"A": 0.5, "B": 0.5}) for h in ("a", "b", "x")}
    seats = {"a": 1000.0, "b": 1000.0, "x": 1000.0}
    wants = {"a": 2000.0, "b": 1500.0}
    for bad in ("grant", "seat"):
        s = {**seats, "x": 10_000.0} if bad == "seat" else seats
        view = CircuitView(10_000.0, s, {"a": 2100.0, "b": 1500.0, **({"x": 10_000.0} if bad == "grant" else {})},
                           wants, **{f"unknown_{bad}s": frozenset({"x"})},  # type: ignore[arg-type]
                           tree=PowerTree(nodes, hosts).with_reserves(s))
        assert view.nodes_over_w() and not view.nodes_over_w(known_only=True), bad
        assert view.fair_w("b") == 1500.0, bad
        # 100 W above its share, within the hold: kept (the unreadable record put no readable node over).
        assert GrantPolicy(release_hold_s=60).target_w(view, "a", 2100.0, 0.0) == 2100.0, bad
        assert not raise_allowed(view, "b", 1600.0), bad


@given(st.lists(st.floats(min_value=0.0, max_value=5.0, allow_nan=False), min_size=1, max_size=60),
       st.integers(min_value=1, max_value=5), st.floats(min_value=0.1, max_value=10.0))
def test_woken_rounds_in_any_window_are_at_most_the_burst_plus_the_refill(gaps, burst, every_s):
    """A host woken at any times starts a woken round as soon as the budget allows: over
    any window of T s it starts at most burst + T / every_s of them, and a round asked
    for when the budget allows one is never refused."""
    budget, now, starts = WakeBudget(burst, every_s), 0.0, []
    for gap in gaps:
        now += gap
        wait = budget.wait_s(now)
        assert wait >= 0.0
        now += wait
        assert budget.wait_s(now) <= 1e-9
        budget.spend(now)
        starts.append(now)
    for i, a in enumerate(starts):
        for j in range(i, len(starts)):
            assert j - i + 1 <= burst + (starts[j] - a) / every_s + 1e-6


def test_a_quiet_host_has_its_whole_burst_at_once_then_one_round_per_refill():
    budget = WakeBudget(3, 2.0)
    for _ in range(3):
        assert budget.wait_s(10.0) == 0.0
        budget.spend(10.0)
    assert budget.wait_s(10.0) == pytest.approx(2.0)
    assert budget.wait_s(11.0) == pytest.approx(1.0)
    assert budget.wait_s(100.0) == 0.0  # refilled, never above the burst:
    for _ in range(3):
        budget.spend(100.0)
    assert budget.wait_s(100.0) == pytest.approx(2.0)
