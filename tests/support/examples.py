"""How many examples a property test asks Hypothesis for, under the suite's profiles.

A full run (``pytest``) keeps Hypothesis's default profile (max_examples 100) and every
test's own count. The quick profile (``pytest -m "not slow"``, or
``--hypothesis-profile=quick``; registered in conftest) sets max_examples to 10: tests
without a count of their own run 10 examples, and a test's own count, written as
``examples(n)``, is scaled down the same way (to a tenth, at least 10), or to its own
quick count, ``examples(n, quick=k)``, where a tenth would take the quick profile past
its minute (a test that runs a whole bank for seconds of virtual time per example).
"""

from __future__ import annotations

from hypothesis import settings

QUICK_EXAMPLES = 10
DEFAULT_EXAMPLES = 100  # Hypothesis's own default: the full run's


def examples(n: int, quick: int | None = None) -> int:
    """``n`` scaled by the profile in force (``n`` itself in a full run); ``quick``, where
    given, under the quick profile."""
    scaled = n * settings.default.max_examples // DEFAULT_EXAMPLES
    if quick is not None and settings.default.max_examples <= QUICK_EXAMPLES:
        return quick
    return max(min(n, QUICK_EXAMPLES), scaled)
