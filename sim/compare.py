"""The simulator's side of ``powerbudgetd probe --compare-sim``: for each real card, the
preset card (``scenario.MODELS``) nearest to it, in a simulated bank of its own."""

from __future__ import annotations

from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import CardSpec, SimBank
from powerbudgetd_sim.scenario import MODELS, ScenarioError

from powerbudgetd.hw.nvml import GpuInfo, Nvml


def nearest_model(info: GpuInfo) -> str:
    """The preset whose name is the card's, else the one with the closest limits (W)."""
    for key, model in MODELS.items():
        if model["name"] == info.name:
            return key

    def distance(key: str) -> float:
        m = MODELS[key]
        pairs = ((info.min_limit_w, m["min_w"]), (info.max_limit_w, m["max_w"]), (info.default_limit_w, m["default_w"]))
        return sum(abs(a - b) if a is not None else 1e6 for a, b in pairs)

    return min(MODELS, key=distance)


def preset_bank(models: list[str]) -> Nvml:
    """An initialised NVML layer over a bank of idle preset cards (one refresh done).

    Raises ScenarioError for an unknown preset.
    """
    specs = []
    for i, key in enumerate(models):
        if key not in MODELS:
            raise ScenarioError(f"no preset card {key!r}: one of {', '.join(MODELS)}")
        specs.append(CardSpec(uuid=f"GPU-sim-{i:04d}-{key}", **MODELS[key]))
    bank = SimBank(specs, seed=1)
    bank.advance_to(1.0)  # a full 1 s window of readings, as on a card that has been up
    nvml = Nvml(SimNvmlLibrary(bank))
    nvml.init()
    return nvml
