"""Pure control core: types, units, fair share, lending policy, write plan, budget arbiter.

Rule: imports nothing outside ``powerbudgetd.core`` and ``powerbudgetd.errors``; no I/O,
no clock, no asyncio.
"""
