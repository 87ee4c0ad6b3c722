"""One code path writes power limits: only the actuator calls ``set_power_limit``."""

from __future__ import annotations

import ast
from pathlib import Path
from support.paths import REPO

ROOT = REPO / "powerbudgetd"
WRITER = ROOT / "control" / "actuator.py"


def calls_of(path: Path, name: str) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.lineno for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Load)
    ]


def test_only_the_actuator_writes_power_limits():
    found = {
        str(p.relative_to(ROOT)): lines
        for p in ROOT.rglob("*.py")
        # The backends' routing (one bank of several backends) passes the actuator's write on.
        if p not in (WRITER, ROOT / "hw" / "nvml.py", ROOT / "hw" / "multi.py") and (lines := calls_of(p, "set_power_limit"))
    }
    assert found == {}, f"set_power_limit used outside the actuator: {found}"
    assert calls_of(WRITER, "set_power_limit"), "the actuator no longer writes: update this test"


def test_only_the_nvml_layer_calls_the_nvml_setter():
    found = {
        str(p.relative_to(ROOT)): lines
        for p in ROOT.rglob("*.py")
        if p != ROOT / "hw" / "nvml.py" and (lines := calls_of(p, "nvmlDeviceSetPowerManagementLimit"))
    }
    assert found == {}, f"nvmlDeviceSetPowerManagementLimit used outside hw/nvml.py: {found}"
