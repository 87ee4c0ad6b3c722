"""One NVML scope for a command: ``nvmlInit``, then ``nvmlShutdown`` within a deadline.

Every command that opens NVML (run, check-config, probe, failsafe, restore, circuit
join, ``--version``) goes through :class:`NvmlScope`, the one place that shuts NVML
down. A call abandoned on a lost or hung card may hold the driver so that
``nvmlShutdown`` never returns; the process is leaving, the cards are already where the
command left them, so the shutdown is waited for at most :data:`SHUTDOWN_TIMEOUT_S` and
then left running in its worker thread (a daemon thread: it does not hold the exit).
"""

from __future__ import annotations

from typing import Protocol

from powerbudgetd.errors import NvmlError
from powerbudgetd.hw.calls import DeadlineCalls

# How long a command waits for nvmlShutdown (s): normally milliseconds; beyond this it
# is abandoned, so that a card that hangs every call cannot hold a stop (the unit's
# TimeoutStopSec) or a command's exit.
SHUTDOWN_TIMEOUT_S = 2.0


class _Lifecycle(Protocol):
    def init(self) -> None: ...
    def shutdown(self) -> None: ...


def shutdown_within(nvml: _Lifecycle, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> NvmlError | None:
    """``nvmlShutdown`` on ``nvml``, waited for at most ``timeout_s`` (s). Returns the
    error when it was abandoned (for the caller to log), None otherwise; never raises.
    For a caller whose ``nvmlInit`` is its own (the daemon's retries); else
    :class:`NvmlScope`."""
    try:
        DeadlineCalls(timeout_s).call("shutdown", nvml.shutdown)
    except NvmlError as exc:
        return exc
    return None


class NvmlScope:
    """``nvml`` (an :class:`~powerbudgetd.hw.nvml.Nvml`) opened by :meth:`open` and shut
    down by :meth:`close` within ``shutdown_timeout_s`` (s).

    ``init_timeout_s``: ``nvmlInit`` under that deadline (s; a wedged GPU can hold it
    for minutes); None: called inline. Usable as a context manager (open on entry,
    close on exit), or open/close apart where a command tells an init failure from a
    later one.
    """

    def __init__(self, nvml: _Lifecycle, *, init_timeout_s: float | None = None,
                 shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        self.nvml = nvml
        self.init_timeout_s = init_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._open = False

    def open(self) -> None:
        """``nvmlInit``. Raises NvmlNotInitialized with NVML's reason, NvmlTimeout when
        it does not return within ``init_timeout_s``."""
        if self.init_timeout_s is None:
            self.nvml.init()
        else:
            DeadlineCalls(self.init_timeout_s).call("init", self.nvml.init)
        self._open = True

    def close(self) -> NvmlError | None:
        """``nvmlShutdown``, waited for at most ``shutdown_timeout_s``. Returns the error
        when it was abandoned (for the caller to log), None otherwise; never raises. A
        scope that was never opened is not shut down."""
        if not self._open:
            return None
        self._open = False
        return shutdown_within(self.nvml, self.shutdown_timeout_s)

    def __enter__(self) -> NvmlScope:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
