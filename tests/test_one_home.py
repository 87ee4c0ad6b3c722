"""One home per rule: checks that fail when a rule is written a second time.

Each check reads the source (AST or text) and names the place that restates the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# -- the circuit's admission sums -------------------------------------------------------
# core/circuit.CircuitView counts the live hosts without a seat (``unseated``) in its
# own checks: seat_fits, raise_allowed, carried_w. The modules that read a circuit and
# act on it never add those reserves to a check by hand (a sum of them, or a padded
# argument).
CIRCUIT_USERS = (
    "powerbudgetd/channels/circuit/store.py",
    "powerbudgetd/channels/circuit/channel.py",
    "powerbudgetd/service/circuitcmd.py",
)


def _mentions_unseated(node: ast.AST) -> bool:
    for n in ast.walk(node):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
        if "unseated" in name:
            return True
    return False


def unseated_additions(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Each place in ``paths`` that adds up live hosts without a seat: a ``sum(...)`` or
    a ``+`` over something named ``*unseated*`` (the view's figures and methods, or a
    local holding them)."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            hit = False
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sum":
                hit = any(_mentions_unseated(a) for a in node.args)
            elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.Add):
                sides = [node.left, node.right] if isinstance(node, ast.BinOp) else [node.target, node.value]
                hit = any(_mentions_unseated(s) for s in sides)
            elif isinstance(node, ast.Attribute) and node.attr in ("unseated_live", "unseated_others_w"):
                hit = True  # the sums' inputs, outside the view
            if hit:
                found.append(f"{path.relative_to(root)}:{node.lineno}")  # type: ignore[attr-defined]
    return sorted(set(found))


def test_no_circuit_user_adds_unseated_hosts_to_a_check_by_hand() -> None:
    assert unseated_additions([ROOT / p for p in CIRCUIT_USERS]) == []


def test_the_unseated_check_finds_a_sum_and_a_padded_argument(tmp_path: Path) -> None:
    bad = tmp_path / "channel.py"
    bad.write_text(
        "def a(read, host, cover):\n"
        "    others = sum(w for h, w in read.view.unseated.items() if h != host)\n"
        "    return raise_allowed(read.view, host, cover + others_unseated)\n"
        "def b(read, host):\n"
        "    return read.view.unseated_others_w(host)\n"
        "def c(read, host):\n"
        "    return read.view.unseated.keys() - {host}\n"  # who waits: no sum
    )
    assert unseated_additions([bad], tmp_path) == ["channel.py:2", "channel.py:3", "channel.py:5"]


# -- units ------------------------------------------------------------------------------
# docs/design/layout.md, "Units": integer mW inside the control arithmetic, W everywhere
# else; every conversion through core/units.py.
MILLIWATT_MODULES = {
    "powerbudgetd/core/units.py", "powerbudgetd/core/worstcase.py", "powerbudgetd/core/fairshare.py", "powerbudgetd/core/plan.py",
    "powerbudgetd/core/policy.py",
    "powerbudgetd/service/daemon.py", "powerbudgetd/service/feasibility.py", "powerbudgetd/service/restore.py",
}
MILLIWATT_PACKAGES = ("powerbudgetd/control/",)
CONVERSIONS = {"to_mw", "budget_mw", "opt_mw"}  # core/units.py's, named for what they return


def _in_milliwatts(rel: str) -> bool:
    return rel in MILLIWATT_MODULES or rel.startswith(MILLIWATT_PACKAGES)


def milliwatt_names_outside(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Each ``_mw`` identifier (a name, attribute, argument, keyword, function or class)
    in a module outside the control arithmetic."""
    found = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if _in_milliwatts(rel):
            continue
        tree = ast.parse(path.read_text(), rel)
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                    else node.arg if isinstance(node, (ast.arg, ast.keyword)) and node.arg
                    else node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else "")
            if name.lower().endswith("_mw") and not (name in CONVERSIONS and id(node) in called):
                found.append(f"{rel}:{node.lineno}: {name}")  # type: ignore[attr-defined]
    return found


def thousand_factors(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Each ``x / 1000`` or ``x * 1000`` (or by 1e3, 0.001) outside core/units.py: a
    conversion written by hand."""
    found = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if rel == "powerbudgetd/core/units.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Mult)):
                if any(isinstance(side, ast.Constant) and not isinstance(side.value, bool) and side.value in (1000, 0.001)
                       for side in (node.left, node.right)):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def _product() -> list[Path]:
    return sorted((ROOT / "powerbudgetd").rglob("*.py"))


def test_milliwatts_only_inside_the_control_arithmetic() -> None:
    assert milliwatt_names_outside(_product()) == []


def test_every_unit_conversion_goes_through_core_units() -> None:
    assert thousand_factors(_product()) == []


def test_the_unit_checks_find_a_milliwatt_name_and_a_hand_conversion(tmp_path: Path) -> None:
    (tmp_path / "powerbudgetd/channels").mkdir(parents=True)
    (tmp_path / "powerbudgetd/control").mkdir(parents=True)
    channel = tmp_path / "powerbudgetd/channels/meter.py"
    channel.write_text("def f(snap, limit_w):\n    budget_mw = to_mw(limit_w)\n    return snap.sum_mw / 1000\n")
    control = tmp_path / "powerbudgetd/control/card.py"
    control.write_text("def g(c):\n    return c.bound_mw * 1e3\n")
    paths = [channel, control]
    assert milliwatt_names_outside(paths, tmp_path) == ["powerbudgetd/channels/meter.py:2: budget_mw",
                                                        "powerbudgetd/channels/meter.py:3: sum_mw"]
    assert thousand_factors(paths, tmp_path) == ["powerbudgetd/channels/meter.py:3: snap.sum_mw / 1000",
                                                 "powerbudgetd/control/card.py:2: c.bound_mw * 1000.0"]
