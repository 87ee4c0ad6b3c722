"""Scenario files for banks no packaged scenario describes (``sim/scenarios/`` holds
the standard ones: name those where they fit)."""

from __future__ import annotations

from pathlib import Path

# workstation-4's bank (four 150-300 W cards) at 1000 W, every card idle.
IDLE_4 = 'name = "idle-4"\nbank = "workstation-4"\nbudget_w = 1000\n'


def idle_4(directory: Path) -> Path:
    """``IDLE_4`` written to ``directory``/idle-4.toml; its path."""
    path = directory / "idle-4.toml"
    path.write_text(IDLE_4)
    return path
