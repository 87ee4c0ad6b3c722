"""Build the NVML layer over real NVML or over a simulated bank."""

from __future__ import annotations

import time

from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.service.cliargs import BACKENDS


def make_nvml(
    backend: str,
    scenario: str = "workstation-4",
    seed: int | None = None,
    lag_s: float | None = None,
    state_file: str | None = None,
) -> Nvml:
    """``nvml``: the real bindings. ``sim``: ``scenario``'s bank on the wall clock, its
    limits kept in ``state_file`` across restarts when given (as a GPU keeps them).

    Raises NvmlNotInitialized (real bindings missing) or ScenarioError.
    """
    if backend == "nvml":
        return Nvml()
    if backend != "sim":
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    # The simulator only where asked for: it serves NVML's C functions to the real
    # bindings in place of libnvidia-ml.so.
    from powerbudgetd_sim.libnvml import SimNvmlLibrary
    from powerbudgetd_sim.physics import SimBank
    from powerbudgetd_sim.scenario import load_scenario

    sc = load_scenario(scenario)
    bank = SimBank(
        list(sc.cards),
        lag_s=sc.lag_s if lag_s is None else lag_s,
        seed=sc.seed if seed is None else seed,
        clock=time.monotonic,
        events=list(sc.events),
        state_file=state_file,
    )
    return Nvml(SimNvmlLibrary(bank, list(sc.faults)))
