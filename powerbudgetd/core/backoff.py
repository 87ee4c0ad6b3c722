"""One doubling backoff for every retry in the daemon: a card held after a write that did
not take, NVML's start, the recorder after a failed write, the MQTT and NUT reconnects.
Pure: callers own the clock and add jitter where many clients may retry at once."""

from __future__ import annotations

from dataclasses import dataclass


def doubled(previous_s: float, first_s: float, max_s: float) -> float:
    """The delay after ``previous_s`` (0: none yet): ``first_s``, then twice the last,
    never above ``max_s``. Seconds."""
    return min(max(first_s, 2 * previous_s), max_s)


@dataclass
class Backoff:
    """A delay that doubles from ``first_s`` up to ``max_s`` (s) with each :meth:`next_s`,
    until :meth:`reset`."""

    first_s: float
    max_s: float
    current_s: float = 0.0  # the last delay handed out; 0 after a reset

    def next_s(self) -> float:
        """The delay to wait now; the following one is twice it (up to ``max_s``)."""
        self.current_s = doubled(self.current_s, self.first_s, self.max_s)
        return self.current_s

    def reset(self) -> None:
        self.current_s = 0.0
