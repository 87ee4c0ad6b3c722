"""What one NVML read costs in the simulator: the NVML layer and NVIDIA's bindings over
the simulated C library (``powerbudgetd_sim.libnvml``), per ``Nvml.read`` of one card
(four NVML calls) and per single call. Prints CPU time; asserts nothing.

    .venv/bin/python benchmarks/nvml_call_cost.py
"""

from __future__ import annotations

import time

from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import CardSpec, SimBank

N = 20_000


def best_us(fn, n: int = N, rounds: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, time.process_time() - t0)
    return best / n * 1e6


def main() -> None:
    bank = SimBank([CardSpec("GPU-bench-0", "bench card", 150.0, 300.0, 300.0, 30.0)], seed=1)
    nvml = Nvml(SimNvmlLibrary(bank))
    nvml.init()
    uuid = nvml.devices()[0].uuid
    print(f"Nvml.read (4 NVML calls): {best_us(lambda: nvml.read(uuid)):.1f} us")
    print(f"Nvml.energy_j (1 call):   {best_us(lambda: nvml.energy_j(uuid)):.1f} us")


if __name__ == "__main__":
    main()
