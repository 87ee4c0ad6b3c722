"""``powerbudgetd failsafe`` (the unit's ExecStopPost=) with a card lost, failing or hung.

It must lower every card it can reach to its share, counting the bad card at its worst
case, and end well within the unit's TimeoutStopSec (read from the unit file) whatever
the bad card does; exit 10 (FAILSAFE_INCOMPLETE) names the card it could not reach,
never a traceback. The cards' limits are read from the simulated bank's state file, as
the next process (the daemon restarting) finds them. Bank: four 150-300 W cards at
300 W, budget 1000 W.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from support.daemon import cli, json_lines, no_traceback

from powerbudgetd.control.failsafe import CALL_TIMEOUT_S, DEADLINE_S, INIT_TIMEOUT_S
from powerbudgetd.errors import ExitStatus
from support.paths import REPO

UNIT = REPO / "systemd" / "powerbudgetd.service"
_stop = re.search(r"^TimeoutStopSec=(\d+)$", UNIT.read_text(), re.MULTILINE)
assert _stop, "the unit sets no TimeoutStopSec in seconds"
STOP_S = float(_stop.group(1))
# nvmlInit, the run, one call past its deadline, nvmlShutdown (2 s): the failsafe's bound.
BOUND_S = INIT_TIMEOUT_S + DEADLINE_S + CALL_TIMEOUT_S + 2.0
HANG_S = 10 * STOP_S


def fault(call: str, error: str, **keys: object) -> str:
    return f'[[faults]]\ncall = "{call}"\nerror = "{error}"\n' + "".join(f"{k} = {v}\n" for k, v in keys.items())


def failsafe(tmp_path: Path, faults: str = "", cards: str = "") -> tuple[int, float, list[int], list[dict]]:
    """(exit status, wall s, each card's requested limit mW afterwards, JSON log events)."""
    state = tmp_path / "limits.json"
    (tmp_path / "bank.toml").write_text(f'bank = "workstation-4"\nlag_s = 0.1\n{faults}')
    (tmp_path / "pb.toml").write_text(
        f"budget_w = 1000\n{cards}[sim]\nscenario = '{tmp_path / 'bank.toml'}'\nstate_file = '{state}'\n")
    t0 = time.monotonic()
    p = cli("failsafe", "--backend", "sim", "--config", str(tmp_path / "pb.toml"), timeout=3 * STOP_S)
    took = time.monotonic() - t0
    no_traceback(p)
    limits = [c["requested_mw"] for c in json.loads(state.read_text())["cards"]] if state.exists() else []
    return p.returncode, took, limits, json_lines(p.stdout)


def events(log: list[dict], name: str) -> list[dict]:
    return [e for e in log if e.get("event") == name]


def test_the_bound_fits_well_inside_the_units_stop_timeout() -> None:
    assert BOUND_S <= STOP_S * 2 / 3, (BOUND_S, STOP_S)


def test_normal_bank_every_card_to_its_fair_share(tmp_path: Path) -> None:
    rc, _, limits, log = failsafe(tmp_path)
    assert rc == ExitStatus.OK
    assert limits == [250_000] * 4
    (done,) = events(log, "failsafe_done")
    assert done["within_share"] and done["lowered"] == [0, 1, 2, 3]


@pytest.mark.parametrize("error", ["GPU_IS_LOST", "UNKNOWN"])
def test_a_card_failing_every_call_is_counted_at_its_worst_and_the_others_lowered(tmp_path: Path, error: str) -> None:
    rc, _, limits, log = failsafe(tmp_path, fault("*", error, card=1))
    assert rc == ExitStatus.FAILSAFE_INCOMPLETE
    # card 1 counted at 300 W (its limits unknown: the largest maximum here); never written
    assert limits == [233_333, 300_000, 233_333, 233_333]
    (bad,) = events(log, "failsafe_card_unreachable")
    assert bad["index"] == 1 and bad["counted_w"] == 300 and "largest maximum" in bad["error"]


def test_a_lost_card_with_a_stated_max_is_counted_there(tmp_path: Path) -> None:
    rc, _, limits, log = failsafe(tmp_path, fault("*", "GPU_IS_LOST", card=1), cards='[cards."1"]\nmax_w = 200\n')
    assert rc == ExitStatus.FAILSAFE_INCOMPLETE
    assert limits == [266_666, 300_000, 266_666, 266_666]  # (1000 - 200) / 3, rounded down
    assert events(log, "failsafe_card_unreachable")[0]["counted_w"] == 200


def test_every_card_lost_nothing_written_and_no_traceback(tmp_path: Path) -> None:
    rc, _, limits, log = failsafe(tmp_path, fault("*", "GPU_IS_LOST", card=0) + fault("*", "GPU_IS_LOST", card=1)
                                  + fault("*", "GPU_IS_LOST", card=2) + fault("*", "GPU_IS_LOST", card=3))
    assert rc == ExitStatus.FAILSAFE_INCOMPLETE
    assert limits == []  # nothing written
    assert sorted(e["index"] for e in events(log, "failsafe_card_unreachable")) == [0, 1, 2, 3]


def test_a_hung_card_costs_one_deadline_and_the_others_are_lowered(tmp_path: Path) -> None:
    rc, took, limits, log = failsafe(tmp_path, fault("*", "SLOW", card=1, delay_s=HANG_S))
    assert rc == ExitStatus.FAILSAFE_INCOMPLETE
    assert took < BOUND_S, took
    assert limits == [233_333, 300_000, 233_333, 233_333]
    assert "did not return in time" in events(log, "failsafe_card_unreachable")[0]["error"]


def test_a_write_that_hangs_leaves_the_card_reserved_and_the_others_lowered_again(tmp_path: Path) -> None:
    # Card 1 reads fine but its write hangs: reserved at what it read (300 W), the others
    # lowered from the first round's 250 W to 233.333 W.
    rc, took, limits, log = failsafe(tmp_path, fault("nvmlDeviceSetPowerManagementLimit", "SLOW", card=1, delay_s=HANG_S))
    assert rc == ExitStatus.FAILSAFE_INCOMPLETE
    assert took < BOUND_S, took
    assert [limits[i] for i in (0, 2, 3)] == [233_333] * 3
    (bad,) = events(log, "failsafe_card_not_lowered")
    assert bad["index"] == 1 and "write failed" in bad["error"]


def test_an_excluded_card_is_counted_at_its_bound_and_said_so(tmp_path: Path) -> None:
    """Card 1 excluded, its enforced limit not reported: counted at its worst case
    (300 W, its maximum), as the daemon counts it, and the others lowered to fit."""
    rc, _, limits, _ = failsafe(tmp_path, fault("nvmlDeviceGetEnforcedPowerLimit", "NOT_SUPPORTED", card=1),
                                cards='[cards."1"]\nexclude = true\n')
    assert rc == ExitStatus.OK
    assert limits == [233_333, 300_000, 233_333, 233_333]
    p = cli("failsafe", "--backend", "sim", "--config", str(tmp_path / "pb.toml"), timeout=3 * STOP_S)
    assert "GPU 1: not written (excluded or invalid constraints), counted at 300 W" in p.stdout
