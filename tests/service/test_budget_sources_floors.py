"""Every budget a source may hold the bank to is checked against the cards' floors, and
the refusal says which budget and where its figure comes from: ``check-config
--backend`` (the on-battery budget, the circuit reserve through the feed model),
``circuit join`` and ``failsafe`` (a reserve below the floors: exit 3, with the numbers).

The simulated bank is workstation-4: four cards with 150 W floors, 600 W in all."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.daemon import cli, no_traceback
from support.wait import free_port
from support.configs import config_file

UPS = '[ups]\nname = "ups"\n{line}\n'
# 700 W at the wall x 0.9 - 150 W host = 480 W of board power, below 600 W of floors
CIRCUIT = """[circuit]
name = "lab"
endpoints = ["127.0.0.1:{port}"]
host = "h1"
reserve_w = {reserve}
psu_efficiency = 0.9
host_w = 150
"""


def config(tmp_path: Path, *sections: str) -> Path:
    return config_file(tmp_path, *sections, quiet=True)


@pytest.mark.parametrize("line, words", [
    ("on_battery_budget_w = 400", "UPS on battery 400 W ([ups] on_battery_budget_w 400 W)"),
    ("on_battery_fraction = 0.5", "UPS on battery 500 W ([ups] on_battery_fraction 0.5 x 1000 W)"),
], ids=["budget_w", "fraction"])
def test_check_config_refuses_an_on_battery_budget_below_the_floors(tmp_path: Path, line: str, words: str) -> None:
    p = cli("check-config", str(config(tmp_path, UPS.format(line=line))), "--backend", "sim")
    no_traceback(p)
    assert p.returncode == 3, p.stdout + p.stderr
    assert words in p.stderr and "minimum limits sum to 600 W" in p.stderr


def test_check_config_refuses_a_circuit_reserve_below_the_floors_and_names_it(tmp_path: Path) -> None:
    p = cli("check-config", str(config(tmp_path, CIRCUIT.format(port=free_port(), reserve=700))), "--backend", "sim")
    no_traceback(p)
    assert p.returncode == 3, p.stdout + p.stderr
    assert ("circuit reserve 480 W ([circuit] reserve_w 700 W at the wall x 0.9 PSU efficiency - 150 W host)"
            in p.stderr), p.stderr


def test_check_config_says_where_each_budget_it_checked_comes_from(tmp_path: Path) -> None:
    cfg = config(tmp_path, UPS.format(line="on_battery_budget_w = 700"),
                 CIRCUIT.format(port=free_port(), reserve=1000))
    p = cli("check-config", str(cfg), "--backend", "sim")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "within the 750 W budget and every other below" in p.stdout
    assert "  circuit reserve: 750 W, from [circuit] reserve_w 1000 W at the wall" in p.stdout
    assert "  UPS on battery: 700 W, from [ups] on_battery_budget_w 700 W" in p.stdout


def test_circuit_join_refuses_a_reserve_below_the_floors_before_seating_it(tmp_path: Path) -> None:
    # nothing listens on the endpoint: the refusal comes before etcd is asked
    p = cli("circuit", "join", "--backend", "sim", "--config",
            str(config(tmp_path, CIRCUIT.format(port=free_port(), reserve=700))))
    no_traceback(p)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "refused: circuit reserve 480 W" in p.stderr and "minimum limits sum to 600 W" in p.stderr


def test_failsafe_with_a_reserve_below_the_floors_lowers_every_card_to_its_minimum_and_exits_3(tmp_path: Path) -> None:
    p = cli("failsafe", "--backend", "sim", "--config",
            str(config(tmp_path, CIRCUIT.format(port=free_port(), reserve=700))))
    no_traceback(p)
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stdout.count("-> share 150 W, lowered, confirmed") == 4, p.stdout
    assert "circuit reserve 480 W" in p.stderr and "their minimum limits sum to 600 W" in p.stderr
    assert "every card within its share" not in p.stdout
