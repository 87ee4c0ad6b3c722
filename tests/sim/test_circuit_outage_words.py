"""`simulate --circuit` with a --duration too short for its 30 s etcd outage says the
run ended inside the outage, and how far into it, rather than giving the hosts' time at
reserve as if the outage had ended."""

from __future__ import annotations

from powerbudgetd_sim.circuit import compare, format_compare


def test_a_run_that_ends_inside_the_outage_says_so() -> None:
    text = format_compare(compare(["h200-1", "ada-2"], duration_s=20.0))
    assert "after a 30 s etcd outage" not in text
    assert "the run ended 10 s into a 30 s etcd outage (a --duration of 60 s or more sees it end)" in text


def test_a_run_that_sees_the_outage_end_says_after() -> None:
    text = format_compare(compare(["h200-1", "ada-2"], duration_s=80.0))
    assert "after a 30 s etcd outage, s at reserve per host: " in text
