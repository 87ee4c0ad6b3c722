"""The one backoff: doubling from the first delay, capped, reset to the first."""

from powerbudgetd.core.backoff import Backoff, doubled


def test_doubles_from_the_first_delay_up_to_the_cap_and_resets() -> None:
    b = Backoff(0.5, 3.0)
    assert [b.next_s() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    b.reset()
    assert b.next_s() == 0.5


def test_doubled_never_goes_below_the_first_or_above_the_cap() -> None:
    assert doubled(0.0, 5.0, 300.0) == 5.0
    assert doubled(5.0, 5.0, 300.0) == 10.0
    assert doubled(200.0, 5.0, 300.0) == 300.0
