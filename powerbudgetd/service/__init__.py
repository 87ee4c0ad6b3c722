"""Service: daemon loop, config, check-config, logging, systemd notify, backend choice.

Rule: may import any ``powerbudgetd`` package; the simulator only lazily, inside a function.
"""
