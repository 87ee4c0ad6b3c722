"""The production backends over a simulated bank: NVML (the real bindings on the
simulated NVML library) for its NVIDIA cards, hwmon (on the simulated hwmon tree) for its
AMD and Intel cards, one MultiBackend where the bank has both."""

from __future__ import annotations

from collections.abc import Iterable

from powerbudgetd.hw.card import CardBackend
from powerbudgetd.hw.hwmon import Hwmon
from powerbudgetd.hw.multi import MultiBackend
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim.hwmon import HwmonFault, SimHwmonTree
from powerbudgetd_sim.libnvml import Fault, SimNvmlLibrary
from powerbudgetd_sim.physics import SimBank


def sim_backend(bank: SimBank, faults: Iterable[Fault] = (), hwmon_faults: Iterable[HwmonFault] = (),
                start: bool = True) -> tuple[SimNvmlLibrary, CardBackend, SimHwmonTree | None]:
    """(the NVML library, the backend the daemon is given, the hwmon tree or None) over
    ``bank``; the backend started (``init``) when ``start``. The tree's temporary
    directory lives as long as the tree object (kept by the backend)."""
    lib = SimNvmlLibrary(bank, list(faults))
    vendors = {c.spec.vendor for c in bank.cards}
    tree = SimHwmonTree(bank, list(hwmon_faults)) if vendors - {"nvidia"} else None
    backends: list[CardBackend] = []
    if "nvidia" in vendors or tree is None:
        backends.append(Nvml(lib))
    if tree is not None:
        backends.append(Hwmon(tree.root, tree))
    backend = backends[0] if len(backends) == 1 else MultiBackend(backends)
    if start:
        backend.init()
    return lib, backend, tree
