"""A replay's description says what it did with each gap between runs it did not trust:
one too long replays as the cap, one that goes back (runs that overlapped, a clock set
back) as one record interval, and the words say which."""

from __future__ import annotations

from pathlib import Path

from powerbudgetd_sim.replay import MAX_GAP_S, load_replay
from support.powerlog import write_run

T0 = 1_750_000_000.0


def test_a_gap_that_goes_back_is_not_said_to_replay_as_the_cap(tmp_path: Path) -> None:
    write_run(tmp_path, "r1", T0, 60, seq=1)
    write_run(tmp_path, "r2", T0 + 30, 60, seq=2)  # began while the first still ran
    sc = load_replay(tmp_path)
    assert sc.duration_s < 200  # folded onto one interval, not stretched by an hour
    assert f"replayed as {MAX_GAP_S:g} s" not in sc.description
    assert "1 gap(s) between runs under one record interval (going back in time" in sc.description
    assert "replayed as 1 s" in sc.description


def test_a_gap_over_the_cap_says_so(tmp_path: Path) -> None:
    write_run(tmp_path, "r1", T0, 60, seq=1)
    write_run(tmp_path, "r2", T0 + 60 + 3 * MAX_GAP_S, 60, seq=2)
    sc = load_replay(tmp_path)
    assert sc.duration_s <= 120 + MAX_GAP_S + 5
    assert f"1 gap(s) between runs over {MAX_GAP_S:g} s, replayed as {MAX_GAP_S:g} s" in sc.description
    assert "going back" not in sc.description
