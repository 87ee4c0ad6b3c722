"""config/ is one module per section or job behind a package face: every name a
section module defines is importable from ``powerbudgetd.config``, so callers never
name the module a section lives in (and a move between modules breaks no one)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import powerbudgetd.config as face

CONFIG = Path(face.__file__).parent
OWN_FACES = {"tree", "kubernetes"}  # imported by their own names (the tree file; the pod's view)


def _defined(path: Path) -> list[str]:
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def test_the_face_re_exports_every_name_of_every_section_module() -> None:
    missing = []
    for path in sorted(CONFIG.glob("*.py")):
        if path.stem in OWN_FACES | {"__init__"}:
            continue
        module = importlib.import_module(f"powerbudgetd.config.{path.stem}")
        for name in _defined(path):
            if getattr(face, name, None) is not getattr(module, name):
                missing.append(f"{path.stem}.{name}")
            elif not name.startswith("_") and name not in face.__all__:
                missing.append(f"{path.stem}.{name} (not in __all__)")
    assert not missing, missing


def test_the_face_defines_nothing_itself() -> None:
    assert _defined(CONFIG / "__init__.py") == ["__all__"]
