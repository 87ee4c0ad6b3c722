"""Property: ``plan_writes``, the pure function the safety rests on, keeps the budget at
every prefix of its plan, over random banks, bounds, budgets and writes in flight.

A write to ``to_mw`` makes that card's bound ``max(bound, to_mw)`` until it is read back
(a decrease frees nothing before then), so after each prefix of the plan the sum of
bounds is the sum of those maxima. The plan must keep it at or under the budget (when
the bank starts over the budget: never raise it), send nothing to a card with a write in
flight, at most one write per card, and every write that lowers a bound before any
write that raises one."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from powerbudgetd.core.plan import Step, Write, plan_writes
from support.examples import examples

limits = st.integers(50_000, 700_000)


@st.composite
def steps(draw: st.DrawFn) -> Step:
    bound = draw(limits)
    requested = draw(st.one_of(st.none(), st.integers(50_000, bound)))  # the bound covers what is requested
    target = draw(st.one_of(st.integers(50_000, bound), st.integers(bound, 700_000)))  # down or up as often
    busy = draw(st.sampled_from([False, False, False, True]))  # a write in flight on one card in four
    return Step("", bound, target, requested, draw(st.integers(0, 2)), busy=busy, force=draw(st.booleans()))


@st.composite
def banks(draw: st.DrawFn) -> tuple[list[Step], int, bool]:
    cards = draw(st.lists(steps(), min_size=1, max_size=8))
    cards = [Step(f"GPU-{i}", s.bound_mw, s.target_mw, s.requested_mw, s.priority, s.busy, s.force)
             for i, s in enumerate(cards)]
    total = sum(s.bound_mw for s in cards)
    budget = draw(st.integers(total * 3 // 4, total * 3 // 2))  # over budget one time in three
    return cards, budget, draw(st.booleans())


def bounds_after(cards: list[Step], writes: list[Write]) -> int:
    bound = {s.uuid: s.bound_mw for s in cards}
    for w in writes:
        bound[w.uuid] = max(bound[w.uuid], w.to_mw)
    return sum(bound.values())


LEND = ([Step("GPU-0", 300_000, 200_000, 300_000), Step("GPU-1", 200_000, 300_000, 200_000)], 600_000, True)


@settings(max_examples=examples(1000), deadline=None)
@given(banks())
@example(LEND)  # a donor lowered and a recipient raised in one plan: the order matters
def test_every_prefix_of_the_plan_keeps_the_budget(bank: tuple[list[Step], int, bool]) -> None:
    cards, budget, allow = bank
    writes = plan_writes(cards, budget, allow_increases=allow)
    by_id = {s.uuid: s for s in cards}
    start = sum(s.bound_mw for s in cards)
    assert len({w.uuid for w in writes}) == len(writes), "one write per card"
    assert not [w for w in writes if by_id[w.uuid].busy], "nothing sent to a card with a write in flight"
    assert all(w.from_mw == by_id[w.uuid].bound_mw for w in writes)
    for k in range(1, len(writes) + 1):
        assert bounds_after(cards, writes[:k]) <= max(start, budget), (k, writes)
    if start > budget or not allow:
        assert not [w for w in writes if w.is_increase], "no bound raised while over budget or held"
    raising = [k for k, w in enumerate(writes) if w.is_increase]
    lowering = [k for k, w in enumerate(writes) if not w.is_increase]
    assert not raising or not lowering or max(lowering) < min(raising), "decreases first"


@settings(max_examples=examples(1000), deadline=None)
@given(banks())
def test_a_write_that_may_raise_what_is_in_force_is_sent_only_while_the_bounds_fit(
        bank: tuple[list[Step], int, bool]) -> None:
    """A write above what the card asks for (or with its request unknown) may raise the
    limit really in force: only while the sum of bounds, with every such write counted
    at its bound, fits the budget (a new card over budget is written at its own request,
    a no-op on the card, to end its worst-case count)."""
    cards, budget, allow = bank
    writes = plan_writes(cards, budget, allow_increases=allow)
    by_id = {s.uuid: s for s in cards}
    for k, w in enumerate(writes):
        requested = by_id[w.uuid].requested_mw
        if requested is None or w.to_mw > requested:
            assert bounds_after(cards, writes[: k + 1]) <= budget, (w, writes)


@settings(max_examples=examples(300), deadline=None)
@given(banks())
def test_a_target_below_the_request_is_always_written(bank: tuple[list[Step], int, bool]) -> None:
    """Every decrease that lowers what is in force is planned, over budget or not:
    the plan never holds back what brings the bank down."""
    cards, budget, allow = bank
    written = {w.uuid: w.to_mw for w in plan_writes(cards, budget, allow_increases=allow)}
    for s in cards:
        if not s.busy and s.requested_mw is not None and s.target_mw < s.requested_mw and s.target_mw < s.bound_mw:
            assert written.get(s.uuid) == s.target_mw, s
