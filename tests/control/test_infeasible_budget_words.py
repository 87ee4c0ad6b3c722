"""The refusal of a budget below the cards' floors gives its figures as the rest of the
output does, to a tenth of a watt: a budget check-config prints as 377.8 W is not
377.777 W in the next line, nor a share 94.4442 W."""

from __future__ import annotations

import pytest

from powerbudgetd.errors import BudgetInfeasible
from support.rig import card, make_rig


def test_the_budget_and_shares_are_given_to_a_tenth_of_a_watt():
    with pytest.raises(BudgetInfeasible) as info:
        make_rig([card(i, min_w=150.0, max_w=300.0) for i in range(4)], 377.7777)
    text = str(info.value)
    assert "budget 377.8 W is below" in text and "vs share 94.4 W" in text
    assert "377.777" not in text and "94.444" not in text
