"""Control: the per-card ledger, the controller and the actuator (the only code that writes a limit).

Rule: imports ``core``, ``hw`` and ``errors`` only; never a channel, the service or the simulator.
"""
