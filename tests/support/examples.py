"""How many examples a property test asks Hypothesis for, under the suite's profiles.

A full run (``pytest``) keeps Hypothesis's default profile (max_examples 100) and every
test's own count. The quick profile (``pytest -m "not slow"``, or
``--hypothesis-profile=quick``; registered in conftest) sets max_examples to 10: tests
without a count of their own run 10 examples, and a test's own count, written as
``examples(n)``, is scaled down the same way (to a tenth, at least 10).
"""

from __future__ import annotations

from hypothesis import settings

QUICK_EXAMPLES = 10
DEFAULT_EXAMPLES = 100  # Hypothesis's own default: the full run's


def examples(n: int) -> int:
    """``n`` scaled by the profile in force (``n`` itself in a full run)."""
    scaled = n * settings.default.max_examples // DEFAULT_EXAMPLES
    return max(min(n, QUICK_EXAMPLES), scaled)
