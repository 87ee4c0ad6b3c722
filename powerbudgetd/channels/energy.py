"""NVML's energy counters, read off the event loop with a deadline per card: the one home
for how they are read (``/metrics`` and MQTT both publish them).

``nvmlDeviceGetTotalEnergyConsumption`` costs ~3 ms a card (16 ms p99 on an H200, the
brief): too much for the 100 ms control loop, and a hung card's call may never return.
So neither the tick nor a scrape reads it: each channel reads every card's counter in a
worker thread at most every :data:`MIN_ENERGY_INTERVAL_S`, each card's call abandoned
after :data:`ENERGY_READ_TIMEOUT_S` (a hung card then ties up one worker, the others are
read on).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

from powerbudgetd.errors import NvmlError
from powerbudgetd.hw.calls import DeadlineCalls

MIN_ENERGY_INTERVAL_S = 5.0  # counters read no more often than this (s)
# Each card's read is abandoned after this (s; 60 x the p99): a card that hangs every
# call then holds neither the reading thread (which the loop joins at exit) nor the stop.
ENERGY_READ_TIMEOUT_S = 1.0
ENERGY_READ_GRACE_S = 1.0  # on stop: how long a read in flight may finish before NVML shuts down

Reading = float | None | NvmlError  # J since driver load; None: not supported; or why it failed


class EnergyCounters:
    """Reads ``energy_j(uuid)`` (J, or None where unsupported) for many cards at once,
    each within :data:`ENERGY_READ_TIMEOUT_S`; one key per card, so a hung one is skipped
    (NvmlTimeout) and the others are read."""

    def __init__(self, energy_j: Callable[[str], float | None], timeout_s: float = ENERGY_READ_TIMEOUT_S) -> None:
        self._energy_j = energy_j
        self._calls = DeadlineCalls(timeout_s)

    def read(self, uuids: Iterable[str]) -> dict[str, Reading]:
        """Each card's reading or the NvmlError it raised, by UUID (blocks up to the deadline)."""
        return self._calls.many({uuid: (self._energy_j, (uuid,)) for uuid in uuids})

    async def read_off_loop(self, uuids: Iterable[str]) -> dict[str, Reading]:
        """:meth:`read` in a worker thread. A read in flight when the task is cancelled is
        waited for (up to :data:`ENERGY_READ_GRACE_S`): the daemon shuts NVML down once
        its channels are done."""
        read = asyncio.ensure_future(asyncio.to_thread(self.read, list(uuids)))
        try:
            return await asyncio.shield(read)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(read, ENERGY_READ_GRACE_S)
            raise
