"""The scoreboard's "idle neighbour" time counts the seconds of the run, at most its
duration: a 300 s run with a card idle beside a busy one throughout is 300 s of it, not
301 (the sample at the run's end is not a second of it)."""

from __future__ import annotations

from powerbudgetd_sim.scenario import load_scenario
from powerbudgetd_sim.scoreboard import idle_neighbour_s


def test_idle_neighbour_time_is_at_most_the_run() -> None:
    sc = load_scenario("one-busy")  # one card busy, three idle, all the way
    assert idle_neighbour_s(sc) == sc.duration_s == 300.0
    assert idle_neighbour_s(sc, 60.0) == 60.0
    assert idle_neighbour_s(sc, 40.5) == 41.0  # the second that has begun counts
