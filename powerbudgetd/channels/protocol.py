"""The one interface every side channel implements, and the daemon drives.

A side channel (Prometheus metrics, MQTT, the flight recorder; later a UPS or a
circuit lease) is registered with ``Daemon.register`` and then:

- :meth:`SideChannel.on_tick` is called on the event loop after every tick with the
  tick's report (its ``snapshot`` is the bank in W). It must be cheap and never block:
  it runs between ticks, and a slow channel would delay the next one. An exception is
  logged and control goes on.
- :meth:`SideChannel.on_reload` is called after every configuration load attempt:
  ``ok`` and the settings now in force (the old ones when the load failed).
- :meth:`SideChannel.run` is a coroutine the daemon runs as a task from just after
  NVML init until shutdown (cancelled then); it must never raise out for a broker or
  disk problem, only retry.

A channel that offers a budget does so through the ``BudgetArbiter`` it was given,
never through the controller. This module imports no daemon: channels never do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.config import Settings


@runtime_checkable
class SideChannel(Protocol):
    """See the module docstring."""

    def on_tick(self, report: TickReport) -> None: ...

    def on_reload(self, ok: bool, settings: Settings | None) -> None: ...

    async def run(self) -> None: ...
