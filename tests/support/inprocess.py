"""The daemon in the test's own process and event loop, on its config's simulated bank
(wall clock), with the side channels a test adds; every tick recorded."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from powerbudgetd.control.controller import Controller, TickReport
from powerbudgetd.service.backend import make_nvml
from powerbudgetd.config import Settings, load_config
from powerbudgetd.service.daemon import Daemon
from powerbudgetd.service.notify import Notifier
from support.wait import wait_until_async

# Builds a side channel: (settings, daemon, registry) -> channel.
ChannelFactory = Callable[[Settings, Daemon, CollectorRegistry], Any]


class OnTick:
    """A side channel that only listens: ``listener(report)`` after every tick."""

    def __init__(self, listener: Callable[[TickReport], object]) -> None:
        self.on_tick = listener

    def on_reload(self, ok: bool, settings: Any) -> None:
        pass

    async def run(self) -> None:
        pass


def cpu_waited_s() -> float:
    """Seconds this process's threads have spent runnable but waiting for a CPU (the
    kernel's run-queue wait, ``/proc/self/task/*/schedstat``'s second field, ns): the
    machine's load, not anything the process did. 0 where the kernel does not keep it."""
    total = 0
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, IndexError, ValueError):  # a thread gone meanwhile
            total += int(stat.read_text().split()[1])
    return total / 1e9


class Running:
    """A running daemon: its ``ticks`` as (time.monotonic, TickReport), its side channels
    by the names they were given (``r.bridge``), their metrics in ``registry``.
    ``set_budget_w``: configured at the next tick, as a reload would (between ticks);
    ``budget_set_at`` is then the index in ``ticks`` of the first tick under it."""

    def __init__(self, daemon: Daemon, registry: CollectorRegistry) -> None:
        self.daemon, self.registry = daemon, registry
        self.channels: dict[str, Any] = {}
        self.ticks: list[tuple[float, TickReport]] = []
        self.waited: list[float] = []  # cpu_waited_s() at each tick
        self.set_budget_w: float | None = None
        self.budget_set_at = 0

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["channels"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def ctl(self) -> Controller:
        assert self.daemon.controller is not None
        return self.daemon.controller

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.registry.get_sample_value(name, labels or {})

    async def until(self, pred: Callable[[], Any], timeout: float = 10.0, what: str = "a condition") -> Any:
        """``pred()``'s first true answer, polled every 10 ms while the daemon runs."""
        return await wait_until_async(pred, timeout, what, step_s=0.01, log=self._state)

    def _state(self) -> str:
        ctl = self.daemon.controller
        return "no controller yet" if ctl is None else f"budget {ctl.budget_mw / 1000} W, {len(self.ticks)} ticks"

    def stalls(self) -> list[float]:
        """Each tick-to-tick gap (s) less the time the process's threads waited for a CPU
        within it (:func:`cpu_waited_s`): what the daemon's own work and waits took, on a
        loaded machine as on an idle one (a thread gone between two ticks takes its wait
        with it: less is then taken off that gap, never more)."""
        return [(b - a) - max(0.0, wb - wa) for (a, _), (b, _), wa, wb in
                zip(self.ticks, self.ticks[1:], self.waited, self.waited[1:], strict=False)]

    def _record(self, report: TickReport) -> None:
        self.ticks.append((time.monotonic(), report))
        self.waited.append(cpu_waited_s())
        if self.set_budget_w is not None:
            self.daemon.arbiter.configure(self.set_budget_w)  # type: ignore[union-attr]
            self.set_budget_w, self.budget_set_at = None, len(self.ticks)


@contextlib.asynccontextmanager
async def running_daemon(config: Path, **channels: ChannelFactory) -> AsyncIterator[Running]:
    """``powerbudgetd run --backend sim --config CONFIG`` as a task of the running loop,
    with ``channels`` registered after the tick recorder; yields once the controller is
    ready, and on leaving asks it to stop and expects exit status 0."""
    settings = load_config(config)
    nvml = make_nvml("sim", settings.sim.scenario)

    def factory(n):  # type: ignore[no-untyped-def]
        return Controller(n, settings.effective_budget_w(), settings.control.timings())

    daemon = Daemon(nvml, factory, notifier=Notifier(""), config_path=config, settings=settings)
    assert daemon.arbiter is not None
    r = Running(daemon, CollectorRegistry())
    daemon.register(OnTick(r._record))
    for name, make in channels.items():
        r.channels[name] = make(settings, daemon, r.registry)
        daemon.register(r.channels[name])
    task = asyncio.create_task(daemon.run())
    try:
        await r.until(lambda: task.done() or (daemon.controller is not None and daemon.controller.ready), what="ready")
        assert not task.done(), f"daemon exited: {task.result()}"
        yield r
    finally:
        daemon.request_stop()
        assert await asyncio.wait_for(task, 10) == 0


async def run_once(channel: Any) -> None:
    """A polled meter channel's own loop (``channels.meter.MeterChannel.run``) until its
    first poll is done: its sleep between polls is where it stops."""
    done = asyncio.Event()

    async def sleep(_s: float) -> None:
        done.set()
        await asyncio.sleep(3600)

    channel._sleep = sleep
    task = asyncio.create_task(channel.run())
    await done.wait()
    task.cancel()
