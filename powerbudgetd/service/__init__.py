"""Service: daemon loop, check-config, logging, systemd notify, backend choice, commands.

Rule: may import any ``powerbudgetd`` package; the simulator only lazily, inside a function.
"""
