"""Build the card backend: NVML, the kernel's hwmon files, AMD SMI, every one that has a
card (``auto``), or a simulated bank (NVML and hwmon served from one physics)."""

from __future__ import annotations

import time
from collections.abc import Callable

from powerbudgetd.errors import NvmlError, NvmlNotInitialized
from powerbudgetd.hw.amdsmi import AmdSmi
from powerbudgetd.hw.card import CardBackend
from powerbudgetd.hw.hwmon import Hwmon
from powerbudgetd.hw.multi import MultiBackend
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.service.cliargs import BACKENDS


def make_nvml(
    backend: str,
    scenario: str = "workstation-4",
    seed: int | None = None,
    lag_s: float | None = None,
    state_file: str | None = None,
) -> CardBackend:
    """``nvml``: the real bindings. ``hwmon``: AMD / Intel cards through the kernel's
    hwmon files. ``amdsmi``: AMD cards through ROCm's AMD SMI (``import amdsmi``).
    ``auto``: NVML where its bindings and driver answer, AMD SMI where it imports and
    lists a card, hwmon for the AMD and Intel cards AMD SMI does not list. ``sim``: ``scenario``'s bank on the wall clock (its
    NVIDIA cards through NVML, the others through a simulated hwmon tree), its limits
    kept in ``state_file`` across restarts when given (as a GPU keeps them).

    Raises NvmlNotInitialized (real bindings missing; ``auto``: no backend has a card) or
    ScenarioError.
    """
    if backend == "nvml":
        return Nvml()
    if backend == "hwmon":
        return Hwmon()
    if backend == "amdsmi":
        return AmdSmi()
    if backend == "auto":
        return auto_backend()
    if backend != "sim":
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    # The simulator only where asked for: it serves NVML's C functions to the real
    # bindings in place of libnvidia-ml.so.
    from powerbudgetd_sim.backends import sim_backend
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
    return sim_backend(bank, sc.faults, start=False)[1]


def auto_backend(amdsmi_module: object = None, hwmon: Hwmon | None = None) -> CardBackend:
    """Every backend that has a card on this host: NVML (bindings, driver and at least
    one GPU), AMD SMI (``amdsmi`` imports and lists a card), then hwmon (an amdgpu / xe /
    i915 card), less the cards AMD SMI lists (one card, one backend: never counted or
    written twice). Raises NvmlNotInitialized naming why each was left out when none has
    a card. ``amdsmi_module`` and ``hwmon``: stand-ins for the tests."""
    found: list[CardBackend] = []
    why = []
    taken: set[str] = set()  # PCI bus ids listed by a backend before hwmon
    candidates: list[tuple[str, Callable[[], CardBackend]]] = [
        ("nvml", Nvml), ("amdsmi", lambda: AmdSmi(amdsmi_module)),
        ("hwmon", lambda: hwmon or Hwmon(skip_bus_ids=taken))]
    for name, make in candidates:
        try:
            b = make()
            if isinstance(b, Hwmon):
                b.skip_bus_ids = taken
            b.init()
            infos = b.devices(skip_errors=True) if name == "amdsmi" else None
            if infos is not None:
                taken.update(i.bus_id for i in infos if i.bus_id)
            if infos if infos is not None else b.device_count():
                found.append(b)
            else:
                why.append(f"{name}: no card")
            b.shutdown()  # the daemon starts it again
        except NvmlError as exc:
            why.append(f"{name}: {exc}")
    if not found:
        raise NvmlNotInitialized("no card found by any backend (" + "; ".join(why) + ")", call="init")
    return found[0] if len(found) == 1 else MultiBackend(found)
