"""A controller on a simulated bank, ticked on virtual time.

:func:`make_rig` builds a bank from card specs, :func:`scenario_rig` from a packaged
scenario (or a scenario file). Both put the production NVML layer on the simulated NVML
library, start the controller, and return a :class:`Rig`, whose tick listeners (a
recorder's or the metrics' ``on_tick``, or any callable) see each :class:`TickReport`
as the daemon's side channels would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from powerbudgetd.control.controller import Controller, TickReport
from powerbudgetd.core.model import Timings
from powerbudgetd.hw.card import CardBackend
from powerbudgetd_sim.backends import sim_backend
from powerbudgetd_sim.hwmon import HwmonFault, SimHwmonTree
from powerbudgetd_sim.libnvml import Fault, SimNvmlLibrary
from powerbudgetd_sim.physics import BankEvent, CardSpec, SimBank
from powerbudgetd_sim.profiles import Phase, Profile
from powerbudgetd_sim.scenario import load_scenario
from support.timings import FAST

Listener = Callable[[TickReport], object]


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


@dataclass
class Rig:
    """A bank, the simulated NVML library, the real bindings and NVML layer and a
    controller, on virtual time: tick ``k`` runs at ``t`` = k x tick_s (s)."""

    bank: SimBank
    lib: SimNvmlLibrary
    nvml: CardBackend
    ctl: Controller
    hwmon: SimHwmonTree | None = None
    t: float = 0.0
    reports: list[TickReport] = field(default_factory=list)
    listeners: list[Listener] = field(default_factory=list)

    def listen(self, listener: Listener) -> Listener:
        """Call ``listener(report)`` after every tick from now on; returns it."""
        self.listeners.append(listener)
        return listener

    def step(self) -> TickReport:
        """One tick at ``t``: the bank advanced to it, the controller ticked, the
        listeners told; then ``t`` moves on one tick."""
        self.bank.advance_to(self.t)
        rep = self.ctl.tick(self.t)
        self.reports.append(rep)
        for listener in self.listeners:
            listener(rep)
        self.t = round(self.t + self.ctl.timings.tick_s, 9)
        return rep

    def run(self, seconds: float, check: Callable[[Rig], object] | None = None) -> None:
        """Tick for ``seconds`` (s) of virtual time, calling ``check(rig)`` after each tick."""
        self.run_until(self.t + seconds, check)

    def run_until(self, until_s: float, check: Callable[[Rig], object] | None = None) -> None:
        """Tick while ``t`` < ``until_s`` (s)."""
        while self.t < until_s - 1e-9:
            self.step()
            if check:
                check(self)

    def ticks(self, n: int) -> None:
        """Exactly ``n`` ticks."""
        for _ in range(n):
            self.step()

    def truth_w(self) -> float:
        """The bank's sum of the highest limit that may be in force per card (W)."""
        return self.bank.sum_limit_bound_mw() / 1000

    def enforced_w(self, i: int) -> float:
        return self.bank.cards[i].enforced_mw(self.bank.now) / 1000


BACKENDS = ("nvml", "hwmon", "mixed")


def vendored(specs: Iterable[CardSpec], backend: str) -> list[CardSpec]:
    """``specs`` as ``backend`` serves them: ``nvml`` as given, ``hwmon`` every card an
    AMD one, ``mixed`` every second card (odd positions) an AMD one."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    out = list(specs)
    if backend == "nvml":
        return out
    return [replace(s, vendor="amd") if backend == "hwmon" or i % 2 else s for i, s in enumerate(out)]


def make_rig(specs: Iterable[CardSpec], budget_w: float, timings: Timings | None = FAST, lag_s: float = 0.1,
             seed: int = 1, faults: Iterable[Fault] = (), events: Iterable[BankEvent] = (),
             listeners: Iterable[Listener] = (), backend: str = "nvml",
             hwmon_faults: Iterable[HwmonFault] = (), **ctl_kw) -> Rig:
    """A started controller under ``budget_w`` (W) on a bank of ``specs``; ``lag_s`` (s)
    from a write to its enforcement; ``faults`` injected into the NVML calls,
    ``hwmon_faults`` into the hwmon files; ``backend`` as :func:`vendored`."""
    bank = SimBank(vendored(specs, backend), lag_s=lag_s, seed=seed, events=list(events))
    lib, nvml, tree = sim_backend(bank, faults, hwmon_faults)
    ctl = Controller(nvml, budget_w, timings, **ctl_kw)
    ctl.start()
    return Rig(bank, lib, nvml, ctl, tree, listeners=list(listeners))


def scenario_rig(scenario: str | Path = "workstation-4", timings: Timings | None = None, *,
                 budget_w: float | None = None, seed: int | None = None, faults: Iterable[Fault] = (),
                 **kw) -> Rig:
    """:func:`make_rig` on a scenario's bank (a packaged name or a file): its cards,
    budget, lag, seed, faults and events; ``timings`` default to the scenario's tick."""
    sc = load_scenario(scenario)
    return make_rig(
        sc.cards, sc.budget_w if budget_w is None else budget_w,
        Timings(tick_s=sc.tick_s) if timings is None else timings,
        lag_s=sc.lag_s, seed=sc.seed if seed is None else seed,
        faults=[*sc.faults, *faults], events=sc.events, **kw,
    )


__all__ = ["BACKENDS", "FAST", "Fault", "HwmonFault", "Phase", "Rig", "busy", "card", "idle", "make_rig", "scenario_rig"]
