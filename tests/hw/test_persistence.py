"""Persistence mode at boot, through the production NVML layer and the real bindings over the simulated NVML library."""

from __future__ import annotations

from dataclasses import replace

import pytest
import structlog
from structlog.testing import capture_logs

from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.hw.persistence import ensure_persistence_mode
from powerbudgetd_sim.libnvml import Fault, SimNvmlLibrary
from powerbudgetd_sim.physics import SimBank
from powerbudgetd_sim.scenario import load_scenario


@pytest.fixture(autouse=True)
def _default_structlog() -> None:
    structlog.reset_defaults()  # a level filter left by another test would hide events


def bank(off: set[int], faults: list[Fault] | None = None) -> tuple[Nvml, SimBank]:
    specs = [replace(c, persistence_mode=i not in off) for i, c in enumerate(load_scenario("workstation-4").cards)]
    sim = SimBank(specs)
    nvml = Nvml(SimNvmlLibrary(sim, faults))
    nvml.init()
    return nvml, sim


def cards(nvml: Nvml, excluded: frozenset[int] = frozenset()) -> list[tuple[int, str, bool]]:
    return [(g.index, g.uuid, g.index not in excluded) for g in nvml.devices()]


def test_turned_on_where_off_and_read_back() -> None:
    nvml, sim = bank(off={1, 3})
    with capture_logs() as logs:
        assert ensure_persistence_mode(nvml, cards(nvml), enable=True) == []
    assert [c.persistence_mode for c in sim.cards] == [True] * 4
    assert [(e["event"], e["index"]) for e in logs] == [("persistence_mode_enabled", 1), ("persistence_mode_enabled", 3)]


def test_not_allowed_warns_loudly_and_changes_nothing() -> None:
    nvml, sim = bank(off={2})
    with capture_logs() as logs:
        assert ensure_persistence_mode(nvml, cards(nvml), enable=False) == [2]
    assert sim.cards[2].persistence_mode is False
    (e,) = logs
    assert (e["event"], e["log_level"], e["index"]) == ("persistence_mode_off", "error", 2)
    assert "volatile" in e["detail"]


def test_excluded_cards_are_only_checked() -> None:
    nvml, sim = bank(off={0})
    with capture_logs() as logs:
        assert ensure_persistence_mode(nvml, cards(nvml, excluded={0}), enable=True) == [0]
    assert sim.cards[0].persistence_mode is False
    assert logs[0]["error"] == "the card is excluded"


def test_a_refused_write_is_logged_not_raised() -> None:
    nvml, sim = bank({1}, [Fault("nvmlDeviceSetPersistenceMode", "NO_PERMISSION")])
    with capture_logs() as logs:
        assert ensure_persistence_mode(nvml, cards(nvml), enable=True) == [1]
    (e,) = logs
    assert e["event"] == "persistence_mode_off" and "Insufficient Permissions" in e["error"]  # the driver's wording
