"""The event loop's pulse, for tests that assert the loop is not held: a task sleeping a
fixed time and keeping each wake's gap since the last one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def beat(every_s: float, gaps: list[float], done: Callable[[], bool]) -> None:
    """Sleep ``every_s`` (s) again and again until ``done()``, appending to ``gaps`` each
    wake's time since the one before (s): ``every_s`` on a free loop, more where the loop
    was held."""
    last = time.perf_counter()
    while not done():
        await asyncio.sleep(every_s)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
