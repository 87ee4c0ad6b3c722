"""A card's worst case and bound: one pure function each, and no other home.

The worst case is the largest limit known for a card, else the operator's ``max_w``,
else the bank's largest maximum; the bound adds the worst case wherever a limit is
unknown. Every counter uses these (tests/service/test_unknown_card_counts.py checks the
daemon, failsafe and check-config agree); no code stores a bound of its own."""

from __future__ import annotations

import ast
from functools import cache

from support.paths import REPO
from powerbudgetd.core.worstcase import limit_bound_mw, worst_case_mw

PKG = REPO / "powerbudgetd"


def test_the_worst_case_is_the_largest_known_limit_else_the_stated_max_else_the_banks() -> None:
    assert worst_case_mw([250_000, None, 300_000], 280_000, 700_000) == 300_000
    assert worst_case_mw([None, None], 280_000, 700_000) == 280_000
    assert worst_case_mw([None, 0], None, 700_000) == 700_000  # 0 W is no limit
    assert worst_case_mw([], None, None) is None


def test_the_bound_counts_the_worst_case_wherever_a_limit_is_unknown() -> None:
    assert limit_bound_mw(250_000, 250_000, 300_000) == 250_000
    assert limit_bound_mw(250_000, 260_000, 300_000, [270_000]) == 270_000
    assert limit_bound_mw(250_000, None, 300_000) == 300_000
    assert limit_bound_mw(None, 250_000, 300_000) == 300_000
    assert limit_bound_mw(250_000, 250_000, 300_000, unknown=True) == 300_000


@cache
def _product() -> list[tuple[str, ast.AST]]:
    return [(str(p.relative_to(REPO)), ast.parse(p.read_text())) for p in sorted(PKG.rglob("*.py"))]


def test_no_code_assigns_a_bound() -> None:
    """The ledger's bound is derived from its state (a property): nothing stores one."""
    assigned = [f"{path}:{node.lineno}" for path, tree in _product() for node in ast.walk(tree)
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(target, ast.Attribute) and target.attr == "bound_mw"]
    assert assigned == []


def test_one_worst_case_computation() -> None:
    """Only core/worstcase.py computes a worst case; the others call it."""
    defined = [(path, node.name) for path, tree in _product() for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and "worst" in node.name]
    assert defined == [("powerbudgetd/core/worstcase.py", "worst_case_mw")]
    callers = {path for path, tree in _product() for node in ast.walk(tree)
               if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "worst_case_mw"}
    # The range of a card it can read (control/cardlimits.py), and failsafe's card it cannot.
    assert callers == {"powerbudgetd/control/cardlimits.py", "powerbudgetd/control/failsafe.py"}
