"""Shared helpers: build a simulated bank, the production NVML layer on it, a controller."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from powerbudgetd.control.controller import Controller, TickReport
from powerbudgetd.service.logs import configure_logging
from powerbudgetd.core.model import Timings
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim.libnvml import Fault, SimNvmlLibrary
from powerbudgetd_sim.physics import CardSpec, SimBank
from powerbudgetd_sim.profiles import Phase, Profile


_DEVNULL = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the test session


@pytest.fixture(autouse=True)
def _quiet_logs() -> None:
    # Commands under test reconfigure logging onto captured streams; start each test
    # on the real stderr again.
    # Everything down to debug reaches structlog.testing.capture_logs(); nothing is printed.
    configure_logging(level="debug", stream=_DEVNULL, json=True)


@pytest.fixture(autouse=True)
def _state_directory(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # The flight recorder defaults to $STATE_DIRECTORY: a daemon started by a test
    # (here or as a subprocess) records into a temporary directory, never /var/lib.
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path_factory.mktemp("state")))


def card(i: int, *phases: Phase, min_w=150.0, max_w=300.0, default_w=None, idle_w=30.0, **kw) -> CardSpec:
    """A workstation-like card (150-300 W) with the given demand phases (default idle)."""
    return CardSpec(
        uuid=f"GPU-test-{i}",
        name="Test GPU",
        min_w=min_w,
        max_w=max_w,
        default_w=max_w if default_w is None else default_w,
        idle_w=idle_w,
        profile=Profile(tuple(phases) or (Phase(0.0),)),
        **kw,
    )


def busy(at_s: float = 0.0, power_w: float = 300.0) -> Phase:
    return Phase(at_s, "constant", power_w=power_w)


def idle(at_s: float = 0.0) -> Phase:
    return Phase(at_s, "idle")


FAST = Timings(donor_hold_s=1.0, recipient_hold_s=0.5, release_hold_s=2.0)


@dataclass
class Rig:
    """A bank, the simulated NVML library, the real bindings and NVML layer and a controller, on virtual time."""

    bank: SimBank
    lib: SimNvmlLibrary
    nvml: Nvml
    ctl: Controller
    t: float = 0.0
    reports: list | None = None

    def step(self) -> TickReport:
        self.bank.advance_to(self.t)
        rep = self.ctl.tick(self.t)
        self.reports.append(rep)
        self.t = round(self.t + self.ctl.timings.tick_s, 9)
        return rep

    def run(self, seconds: float, check=None) -> None:
        end = self.t + seconds
        while self.t < end - 1e-9:
            self.step()
            if check:
                check(self)

    def truth_w(self) -> float:
        return self.bank.sum_limit_bound_mw() / 1000

    def enforced_w(self, i: int) -> float:
        return self.bank.cards[i].enforced_mw(self.bank.now) / 1000


def make_rig(specs, budget_w, timings=FAST, lag_s=0.1, seed=1, faults=(), **ctl_kw) -> Rig:
    bank = SimBank(list(specs), lag_s=lag_s, seed=seed)
    lib = SimNvmlLibrary(bank, list(faults))
    nvml = Nvml(lib)
    nvml.init()
    ctl = Controller(nvml, budget_w, timings, **ctl_kw)
    ctl.start()
    return Rig(bank, lib, nvml, ctl, reports=[])


__all__ = ["card", "busy", "idle", "make_rig", "Rig", "FAST", "Fault", "Phase"]
