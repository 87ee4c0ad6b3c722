"""powerbudgetd's simulated GPU bank: NVML's C functions served over recorded H200 physics.

Installed as the package ``powerbudgetd_sim``. Time is virtual and every random draw
comes from one seed, so a run is reproducible and an hour of bank time takes seconds.
"""
