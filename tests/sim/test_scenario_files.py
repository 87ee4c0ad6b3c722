"""Scenario files are checked like the config: every problem is one line naming the file,
the table, its index and the key; what a file gives reaches the simulator unchanged."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from powerbudgetd_sim.feed import FEED_KEYS, feed_from_dict
from powerbudgetd_sim.libnvml import Fault
from powerbudgetd_sim.mains import MAINS_KEYS
from powerbudgetd_sim.physics import BankEvent, CardSpec
from powerbudgetd_sim.profiles import Phase
from powerbudgetd_sim.scenario import ScenarioError, load_scenario, parse_scenario, scenario_dir
from powerbudgetd_sim.scenario_tables import CardTable, EventTable, FaultTable, PhaseTable, ScenarioFeedTable

BANK = 'bank = "workstation-4"\nduration_s = 5\n'
FEED = "[feed]\nhost_w = 300\nbreaker_a = 15\nvolts = 120\n"
FAULT = '[[faults]]\ncall = "*"\nerror = "NO_PERMISSION"\n'
EVENT = '[[events]]\nat_s = 1\ncard = 0\naction = "reset"\n'
CONSTANT = '[[cards]]\nphases = [{ at_s = 0, kind = "constant", power_w = 300 }]\n'


def problems_of(tmp_path: Path, text: str) -> tuple[Path, list[str]]:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    return path, str(exc.value).splitlines()


def assert_problem(tmp_path: Path, text: str, expected: str) -> None:
    path, lines = problems_of(tmp_path, text)
    assert all(line.startswith(f"{path}: ") for line in lines), lines
    assert any(line.startswith(f"{path}: {expected}") for line in lines), lines


@pytest.mark.parametrize(("text", "expected"), [
    (BANK + "seeds = 2\n", "seeds: unknown key: did you mean 'seed'?"),
    (BANK + '[[cards]]\ncolour = "red"\n', "cards[0].colour: unknown key (known: model, name, "),
    (BANK + CONSTANT + '[[cards]]\nphases = [{ at_s = 0 }, { at_s = 5, kind = "constant", power_w = 9, power = 300 }]\n',
     "cards[1].phases[1].power: unknown key: did you mean 'power_w'?"),
    (BANK + FAULT + FAULT + "cards = 1\n", "faults[1].cards: unknown key: did you mean 'card'?"),
    (BANK + EVENT + EVENT + EVENT + "limits_w = 3\n", "events[2].limits_w: unknown key"),
    (BANK + FEED + "amps = 15\n", "feed.amps: unknown key (known: host_w, breaker_a, volts, "),
], ids=["top", "card", "phase", "fault", "event", "feed"])
def test_an_unknown_key_is_named_with_its_table_and_index(tmp_path: Path, text: str, expected: str) -> None:
    assert_problem(tmp_path, text, expected)


@pytest.mark.parametrize(("text", "expected"), [
    (BANK.replace("5", '"5"'), "duration_s: Input should be a valid number, got '5'"),
    (BANK + "seed = 1.5\n", "seed: Input should be a valid integer, got 1.5"),
    (BANK + CONSTANT + "[[cards]]\nhas_instant = 1\n", "cards[1].has_instant: Input should be a valid boolean, got 1"),
    (BANK + '[[cards]]\nphases = [{ at_s = 0 }, { at_s = "10" }]\n',
     "cards[0].phases[1].at_s: Input should be a valid number, got '10'"),
    (BANK + FAULT + "count = 1.5\n", "faults[0].count: Input should be a valid integer, got 1.5"),
    (BANK + EVENT + EVENT + '[[events]]\nat_s = 1\ncard = 0\naction = "set_limit"\nlimit_w = "abc"\n',
     "events[2].limit_w: Input should be a valid number, got 'abc'"),
    (BANK + '[[events]]\nat_s = 1\ncard = 0\naction = "reindex"\norder = [1, "0"]\n',
     "events[0].order[1]: Input should be a valid integer, got '0'"),
    (BANK + FEED.replace("15", '"15"'), "feed.breaker_a: Input should be a valid number, got '15'"),
    (BANK + "feed = 3\n", "feed: must be a table, got 3"),
    (BANK + 'cards = "four"\n', "cards: Input should be a valid list, got 'four'"),
], ids=["top-number", "top-integer", "card", "phase", "fault", "event", "event-list", "feed", "feed-table", "list"])
def test_a_wrong_type_is_named_with_the_value_given(tmp_path: Path, text: str, expected: str) -> None:
    assert_problem(tmp_path, text, expected)


@pytest.mark.parametrize(("text", "expected"), [
    (BANK + '[[events]]\ncard = 0\naction = "reset"\n', "events[0].at_s: Field required"),
    (BANK + '[[faults]]\ncall = "*"\n', "faults[0].error: Field required"),
    (BANK + '[[cards]]\nphases = [{ kind = "idle" }]\n', "cards[0].phases[0].at_s: Field required"),
    (BANK + "[feed]\nhost_w = 300\nbreaker_a = 15\n", "feed.volts: Field required"),
    ('budget_w = 500\n[[cards]]\nname = "Card"\nmin_w = 100\n', "cards[0]: missing default_w, idle_w, max_w (or give a model)"),
    ("duration_s = 5\n", "give a preset 'bank' or at least one [[cards]] table"),
], ids=["event", "fault", "phase", "feed", "card", "top"])
def test_a_missing_key_is_named(tmp_path: Path, text: str, expected: str) -> None:
    assert_problem(tmp_path, text, expected)


@pytest.mark.parametrize(("table", "expected"), [
    ('action = "set_limit"', "events[1].limit_w: Field required for action 'set_limit'"),
    ('action = "reindex"', "events[1].order: Field required for action 'reindex'"),
    ('action = "reset"\nlimit_w = 300', "events[1].limit_w: not a key of action 'reset'"),
    ('action = "explode"', "events[1].action: 'explode' is not one of reset, set_limit, "),
])
def test_an_event_has_the_keys_its_action_needs(tmp_path: Path, table: str, expected: str) -> None:
    assert_problem(tmp_path, BANK + EVENT + f"[[events]]\nat_s = 1\ncard = 0\n{table}\n", expected)


@pytest.mark.parametrize(("phase", "expected"), [
    ('kind = "constant"', "cards[0].phases[1].power_w: Field required for kind 'constant'"),
    ('kind = "square", on_s = 1', "cards[0].phases[1].high_w: Field required for kind 'square'"),
    ('kind = "ramp"', "cards[0].phases[1].to_w: Field required for kind 'ramp'"),
    ("power_w = 300", "cards[0].phases[1].power_w: not a key of kind 'idle'"),
    ('kind = "trace", trace = "h100-serving"', "cards[0].phases[1].trace: 'h100-serving' is not one of h200-load-steps, "),
])
def test_a_phase_has_the_keys_its_kind_needs(tmp_path: Path, phase: str, expected: str) -> None:
    assert_problem(tmp_path, BANK + f"[[cards]]\nphases = [{{ at_s = 0 }}, {{ at_s = 5, {phase} }}]\n", expected)


@pytest.mark.parametrize(("text", "expected"), [
    (BANK + EVENT.replace("card = 0", "card = 4"), "events[0].card: card 4 is not in this 4-card bank"),
    (BANK + FAULT + FAULT + "card = -1\n", "faults[1].card: card -1 is not in this 4-card bank"),
    ('bank = "ada-2"\n' + CONSTANT * 3, "cards: bank ada-2 has 2 cards, 3 given"),
    ('bank = "workstation-8"\n', "bank: 'workstation-8' is not one of workstation-4, "),
    (BANK + CONSTANT + '[[cards]]\nmodel = "h100"\n', "cards[1].model: 'h100' is not one of rtx-pro-6000-maxq, "),
], ids=["event-card", "fault-card", "too-many-cards", "bank", "model"])
def test_what_needs_the_whole_file_names_the_table(tmp_path: Path, text: str, expected: str) -> None:
    assert_problem(tmp_path, text, expected)


@pytest.mark.parametrize(("text", "expected"), [
    (BANK + "[[cards]]\nmin_w = 400\n", "cards[0]: card GPU-51510000-0000-4000-8000-000000000000: need 0 < min_w"),
    (BANK + '[[faults]]\ncall = "*"\nerror = "SLOW"\n', "faults[0]: a SLOW fault needs delay_s > 0"),
    (BANK + EVENT + "every_s = 0\n", "events[0]: every_s must be > 0"),
    (BANK + FEED.replace("volts = 120", "volts = 1000"), "feed.volts must be a voltage in V"),
    (BANK + FEED + "mains_lost = [[10, 20]]\n", "feed.mains_lost needs feed.battery_wh"),
])
def test_the_objects_own_checks_are_named_with_their_table(tmp_path: Path, text: str, expected: str) -> None:
    assert_problem(tmp_path, text, expected)


def test_every_problem_is_its_own_line_without_pydantic_noise(tmp_path: Path) -> None:
    path, lines = problems_of(tmp_path, BANK.replace("5", '"5"') + "seeds = 2\n" + FEED + "amps = 1\n")
    assert lines == [
        f"{path}: duration_s: Input should be a valid number, got '5'",
        f"{path}: feed.amps: unknown key (known: host_w, breaker_a, volts, psu_efficiency, ups_w, battery_wh, mains_lost)",
        f"{path}: seeds: unknown key: did you mean 'seed'?",
    ]


def test_parse_scenario_names_the_key_without_a_file() -> None:
    with pytest.raises(ScenarioError, match=r"^events\[0\]\.limit_w: Field required for action 'set_limit'$"):
        parse_scenario({"bank": "ada-2", "events": [{"at_s": 1, "card": 0, "action": "set_limit"}]})
    with pytest.raises(ValueError, match=r"^feed\.volts: Field required$"):
        feed_from_dict({"host_w": 1, "breaker_a": 15})


def test_what_the_file_gives_reaches_the_simulator_as_given() -> None:
    sc = parse_scenario({
        "bank": "ada-2", "duration_s": 5,
        "cards": [{"idle_w": 20, "phases": [{"at_s": 0, "kind": "constant", "power_w": 200}]}],
        "faults": [{"call": "*", "error": "SLOW", "delay_s": 1, "card": 1}],
        "events": [{"at_s": 2, "card": 1, "action": "set_limit", "limit_w": 150, "every_s": 30},
                   {"at_s": 3, "card": 0, "action": "reindex", "order": [1, 0]}],
        "feed": {"volts": 120, "host_w": 300, "breaker_a": 15, "ups_w": 1500, "battery_wh": 100, "mains_lost": [[1, 2]]},
    })
    assert sc.cards[0].profile.phases == (Phase(at_s=0, kind="constant", power_w=200),)
    assert type(sc.cards[0].profile.phases[0].at_s) is int and type(sc.cards[0].idle_w) is int  # noqa: E721
    assert sc.cards[1].profile.phases == (Phase(0.0, "idle"),)  # a card the file leaves out idles
    assert sc.faults == (Fault(call="*", error="SLOW", delay_s=1, card=1),)
    assert sc.events == (BankEvent(at_s=2, card=1, action="set_limit", limit_w=150, every_s=30),
                         BankEvent(at_s=3, card=0, action="reindex", order=(1, 0)))
    assert list(sc.feed) == ["volts", "host_w", "breaker_a", "ups_w"]  # the file's order, mains apart
    assert sc.mains is not None and sc.mains.battery_wh == 100


def test_the_tables_take_every_key_of_the_objects_they_build() -> None:
    assert set(PhaseTable.model_fields) == {f.name for f in fields(Phase)}
    assert set(EventTable.model_fields) == {f.name for f in fields(BankEvent)}
    assert set(FaultTable.model_fields) == {f.name for f in fields(Fault)}
    assert set(CardTable.model_fields) == {f.name for f in fields(CardSpec)} - {"profile"} | {"model", "phases"}
    assert set(ScenarioFeedTable.model_fields) == FEED_KEYS | MAINS_KEYS


@pytest.mark.parametrize("path", sorted(scenario_dir().glob("*.toml")), ids=lambda p: p.stem)
def test_every_packaged_scenario_loads(path: Path) -> None:
    assert load_scenario(path).name == path.stem
