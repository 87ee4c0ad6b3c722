"""A scenario file's numbers are refused, named, where they cannot be true: nan or inf
anywhere, and a phase's demand below zero watts. Before, a card asked for nan or -50 W
ran as an idle card and the report gave its draw as if the file had said so."""

from __future__ import annotations

import pytest

from powerbudgetd_sim.scenario import ScenarioError, parse_scenario


def card(phase: dict) -> dict:
    return {"bank": "workstation-4", "budget_w": 1000, "cards": [{"phases": [phase]}]}


@pytest.mark.parametrize("data, words", [
    (card({"at_s": 0, "kind": "constant", "power_w": float("nan")}), ["cards[0].phases[0].power_w", "finite number"]),
    (card({"at_s": float("inf"), "kind": "constant", "power_w": 300}), ["cards[0].phases[0].at_s", "finite number"]),
    ({"bank": "workstation-4", "budget_w": float("nan")}, ["budget_w", "finite number"]),
    (card({"at_s": 0, "kind": "constant", "power_w": -50}), ["power_w", "-50", "at or above 0 W"]),
    (card({"at_s": 0, "kind": "square", "high_w": 300, "low_w": -1}), ["low_w", "at or above 0 W"]),
    (card({"at_s": 0, "kind": "ramp", "to_w": -5}), ["to_w", "at or above 0 W"]),
])
def test_an_impossible_number_is_refused_and_named(data, words):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    for w in words:
        assert w in str(info.value)


def test_a_zero_watt_phase_is_still_a_phase():
    sc = parse_scenario(card({"at_s": 0, "kind": "constant", "power_w": 0}))
    assert len(sc.cards) == 4
