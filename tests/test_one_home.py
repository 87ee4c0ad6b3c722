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
