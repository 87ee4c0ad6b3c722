"""The daemon: the controller on the wall clock, with signals and systemd notification.

Each tick runs in a worker thread, so a slow NVML call cannot freeze the event loop that
serves signals and side channels. The watchdog is fed only after a tick completes: a
stuck control loop stops the pings and systemd restarts the service.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from powerbudgetd.controller import Controller, TickReport
from powerbudgetd.errors import BudgetInfeasible, NvmlError
from powerbudgetd.model import Mode
from powerbudgetd.notify import Notifier, watchdog_interval_s
from powerbudgetd.nvml import Nvml

log = structlog.get_logger("powerbudgetd")

# Exit statuses (documented in the README's Troubleshooting section).
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_INFEASIBLE = 3
EXIT_NVML = 4
EXIT_NO_PERMISSION = 5
EXIT_BOOT_TIMEOUT = 6

TickListener = Callable[[TickReport, Controller], None]
Service = Callable[["Daemon"], Awaitable[None]]


class Daemon:
    """Runs one controller until SIGTERM/SIGINT; see :meth:`run`."""

    def __init__(
        self,
        nvml: Nvml,
        controller_factory: Callable[[Nvml], Controller],
        *,
        notifier: Notifier | None = None,
        clock: Callable[[], float] = time.monotonic,
        config_path: Path | None = None,
    ) -> None:
        self.nvml = nvml
        self.controller_factory = controller_factory
        self.notifier = notifier or Notifier()
        self.clock = clock
        self.config_path = config_path
        # Side channels (metrics, MQTT, recorder): listeners are called after every tick
        # and must not block; services are long-running tasks started before boot.
        self.listeners: list[TickListener] = []
        self.services: list[Service] = []
        self.controller: Controller | None = None
        self._stop = asyncio.Event()
        self._status = ""

    def status_line(self, ctl: Controller) -> str:
        return (
            f"budget {ctl.budget_mw / 1000:g} W, sum of caps {ctl.sum_bound_mw / 1000:g} W, "
            f"mode {ctl.mode}, {len(ctl.cards)} GPUs"
        )

    async def run(self) -> int:
        """Boot, control until asked to stop, return to fair share, return an exit status."""
        try:
            self.nvml.init()
            ctl = self.controller_factory(self.nvml)
            ctl.start()
        except BudgetInfeasible as exc:
            log.error("budget_infeasible", error=str(exc))
            return EXIT_INFEASIBLE
        except NvmlError as exc:
            log.error("nvml_unavailable", error=str(exc), kind=exc.kind)
            return EXIT_NVML
        self.controller = ctl
        log.info(
            "starting", budget_w=ctl.budget_mw / 1000, gpus=len(ctl.cards), dry_run=ctl.dry_run,
            cards=[{"index": c.index, "uuid": c.uuid, "name": c.info.name, "min_w": c.min_mw / 1000,
                    "max_w": c.max_mw / 1000, "controllable": c.controllable} for c in ctl.cards],
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        tasks = [asyncio.create_task(svc(self)) for svc in self.services]
        try:
            return await self._loop(ctl)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            self.nvml.shutdown()

    async def _loop(self, ctl: Controller) -> int:
        tick_s = ctl.timings.tick_s
        wd_interval = watchdog_interval_s()
        last_wd = float("-inf")
        started = self.clock()
        stop_deadline: float | None = None
        announced = False
        while True:
            t0 = self.clock()
            report = await asyncio.to_thread(ctl.tick, t0)
            for listener in self.listeners:
                try:
                    listener(report, ctl)
                except Exception:  # noqa: BLE001 - a side channel must never stop control
                    log.exception("listener_failed", listener=getattr(listener, "__name__", repr(listener)))
            if not ctl.ready and any(w.error_kind == "no_permission" for w in report.writes):
                log.error(
                    "no_permission",
                    error="writing power limits needs root or CAP_SYS_ADMIN; the budget is NOT enforced",
                )
                return EXIT_NO_PERMISSION
            if ctl.ready and not announced:
                announced = True
                self.notifier.ready(self.status_line(ctl))
            if not ctl.ready and t0 - started > ctl.timings.boot_timeout_s:
                log.error("boot_timeout", after_s=round(t0 - started, 1), sum_limits_w=ctl.sum_bound_mw / 1000)
                return EXIT_BOOT_TIMEOUT
            status = self.status_line(ctl)
            if status != self._status:
                self._status = status
                self.notifier.status(status)
            if wd_interval is not None and t0 - last_wd >= wd_interval:
                self.notifier.watchdog()
                last_wd = t0
            if self._stop.is_set() and stop_deadline is None:
                log.info("stopping", reason="signal")
                self.notifier.stopping()
                ctl.request_stop()
                stop_deadline = t0 + max(5.0, 3 * ctl.timings.confirm_timeout_s)
            if stop_deadline is not None and (ctl.stopped or ctl.mode == Mode.DRY_RUN):
                log.info("stopped", sum_limits_w=ctl.sum_bound_mw / 1000)
                return EXIT_OK
            if stop_deadline is not None and t0 > stop_deadline:
                log.error("stop_timeout", sum_limits_w=ctl.sum_bound_mw / 1000)
                return EXIT_ERROR
            delay = t0 + tick_s - self.clock()
            if delay > 0:
                try:
                    await asyncio.wait_for(self._stop_wait(stop_deadline), timeout=delay)
                except TimeoutError:
                    pass

    async def _stop_wait(self, stop_deadline: float | None) -> None:
        # Wake early on a stop signal (so SIGTERM is acted on within the tick), but not
        # again once stopping has begun.
        if stop_deadline is None:
            await self._stop.wait()
        else:
            await asyncio.Event().wait()
