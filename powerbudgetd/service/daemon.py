"""The daemon: the controller on the wall clock, with signals and systemd notification.

Each tick runs on the control loop's own thread (:mod:`~powerbudgetd.service.tickthread`),
so a slow NVML call cannot freeze the event loop that serves signals and side channels.
The watchdog is fed only after a tick completes: a stuck control loop stops the pings
and systemd restarts the service.

SIGHUP reloads the config file: ``RELOADING=1``, re-read and validate, then
``READY=1``. An invalid file keeps the running config (and says why); a new budget is
acted on by the very next tick, whose writes carry the reason ``reload`` (a lower one:
decreases first, as always). Sections that shape the bank itself ([control], [cards],
[sim]) need a restart; a reload says so and keeps them.

The budget: every source (the config file, the wall meter, a remote budget) reports to
one :class:`~powerbudgetd.core.arbiter.BudgetArbiter`; before each tick the daemon's
:class:`~powerbudgetd.control.budgetkeeper.BudgetKeeper` resolves it and sets the controller's budget. The keeper is the
only caller of ``Controller.set_budget`` (a test holds it to that). A reload replaces
the configured budget in the arbiter directly.

Side channels (metrics, MQTT, recorder) implement
:class:`~powerbudgetd.channels.protocol.SideChannel` and are added with
:meth:`Daemon.register`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from powerbudgetd.core.backoff import Backoff
from powerbudgetd.core.units import opt_w, to_w
from powerbudgetd.channels.protocol import SideChannel
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.snapshot import CircuitStatus
from powerbudgetd.config import Settings, load_config, ups_on_reload
from powerbudgetd.control.budgetkeeper import BudgetKeeper
from powerbudgetd.control.controller import Controller, TickReport
from powerbudgetd.errors import BudgetInfeasible, CardLimitUnknown, ConfigError, ExitStatus, NvmlError, NvmlNoPermission
from powerbudgetd.service.logs import configure_logging
from powerbudgetd.core.model import Mode
from powerbudgetd.service.notify import Notifier, watchdog_interval_s
from powerbudgetd.hw.card import CardBackend
from powerbudgetd.hw.nvmlscope import SHUTDOWN_TIMEOUT_S, shutdown_within
from powerbudgetd.hw.nvml import init_advice
from powerbudgetd.hw.persistence import ensure_persistence_mode
from powerbudgetd.service import signals
from powerbudgetd.service.interruptible import Interrupted, until_stopped
from powerbudgetd.service.tickthread import TickThread

log = structlog.get_logger("powerbudgetd")


# How long exit waits for nvmlShutdown (s): the commands' deadline (hw/nvmlscope.py), so
# that a card that hangs every call cannot hold the stop (the unit's TimeoutStopSec)
# after the cards are already back at fair share.
NVML_SHUTDOWN_TIMEOUT_S = SHUTDOWN_TIMEOUT_S

# Settings a reload cannot change in a running daemon: they shape the bank and the loop.
RESTART_ONLY = (
    "control", "cards", "sim", "allow_monitor_only", "enable_persistence_mode", "nvml_init_attempts",
    "nvml_init_backoff_s", "metrics", "recorder", "mqtt", "circuit", "kubernetes",
)


def _duration(seconds: float) -> str:
    """``seconds`` for people: ``4.2 s``, ``12 min 5 s``, ``3 h 2 min``, ``2 d 4 h``."""
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m} min {sec} s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass
class _Run:
    """The loop's own state across ticks (times on the daemon's clock, s)."""

    started: float
    t0: float = 0.0  # when the current tick began
    due: float | None = None  # when the next tick is due (a fixed cadence from the first)
    announced: bool = False  # READY sent
    stop_deadline: float | None = None  # set once stopping began
    last_watchdog: float = float("-inf")
    watchdog_s: float | None = field(default_factory=watchdog_interval_s)


class Daemon:
    """Runs one controller until SIGTERM/SIGINT; see :meth:`run`.

    :attr:`arbiter` holds the budget sources; side channels offer theirs there (the
    configured budget comes from ``settings``, else from the controller the factory
    builds)."""

    def __init__(
        self,
        nvml: CardBackend,
        controller_factory: Callable[[CardBackend], Controller],
        *,
        notifier: Notifier | None = None,
        clock: Callable[[], float] = time.monotonic,
        config_path: Path | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.nvml = nvml
        self.controller_factory = controller_factory
        self.notifier = notifier or Notifier()
        self.clock = clock
        self.config_path = config_path
        self.settings = settings  # the config in force; replaced by a good reload
        self.arbiter: BudgetArbiter | None = None if settings is None else BudgetArbiter(settings.effective_budget_w())
        self.keeper: BudgetKeeper | None = None if self.arbiter is None else BudgetKeeper(self.arbiter)
        # Side channels (metrics, MQTT, recorder): see channels.protocol.
        self.channels: list[SideChannel] = []
        # With a [circuit]: this host's place on it (at a monotonic time), for every
        # tick's snapshot, so every channel sees the same account.
        self.circuit_status: Callable[[float], CircuitStatus] | None = None
        self.controller: Controller | None = None
        self._ticks = TickThread()  # where each tick runs, off the loop
        self._stop = asyncio.Event()
        self._exit_status: int | None = None  # request_exit's
        self._wake = asyncio.Event()  # a signal arrived: end the wait between ticks
        self._waiter: asyncio.Future[None] | None = None  # the wait between ticks a signal ends
        self._reload_requested = False
        self.reload_ignored = False
        self._reload_note = ""
        self._persistence_off: list[int] = []
        self._status = ""

    def status_line(self, ctl: Controller) -> str:
        return (
            f"budget {to_w(ctl.budget_mw):g} W, sum of caps {to_w(ctl.sum_bound_mw):g} W, "
            f"mode {ctl.mode}, {len(ctl.cards)} GPUs"
        )

    def status_text(self, ctl: Controller) -> str:
        """The one STATUS= line: :meth:`status_line`, then warnings and the last reload."""
        text = self.status_line(ctl)
        if (since := ctl.over.since) is not None:
            # a duration: ``since`` is a reading of the daemon's (monotonic) clock
            text += f"; OVER BUDGET for {_duration(self.clock() - since)}: {ctl.over.cause}"
        elif ctl.ready and (degraded := ctl.degraded()):
            text += f"; degraded: {', '.join(degraded)}"
        if self._persistence_off:
            text += f"; persistence mode OFF on GPU {','.join(map(str, self._persistence_off))}"
        if self._reload_note:
            text += f"; {self._reload_note}"
        return text

    def register(self, channel: SideChannel) -> None:
        """Add a side channel: ticks, reloads and its ``run`` task (see channels.protocol)."""
        self.channels.append(channel)

    def request_stop(self) -> None:
        self._stop.set()
        self._rouse()

    def _rouse(self) -> None:
        """A signal arrived: end the wait between ticks (see :meth:`_sleep`)."""
        self._wake.set()
        if self._waiter is not None:
            _settle(self._waiter)

    def request_exit(self, status: int) -> None:
        """Stop as on SIGTERM (back to fair share), then exit with ``status``: a side
        channel found a reason this daemon must not run (a duplicate circuit host)."""
        if self._exit_status is None:
            self._exit_status = status
        self.request_stop()

    def request_reload(self) -> None:
        """SIGHUP: reload at the next tick; during start, once ready (said once); during a
        stop, never (said once)."""
        if self._stop.is_set():
            if not self.reload_ignored:
                self.reload_ignored = True
                log.info("reload_ignored", reason="stopping")
            return
        if not self._reload_requested and (self.controller is None or not self.controller.ready):
            log.info("reload_deferred", reason="starting", detail="the config is re-read once the daemon is ready")
        self._reload_requested = True
        self._rouse()

    async def run(self) -> int:
        """Boot, control until asked to stop, return to fair share, return an exit status.

        SIGTERM/SIGINT stop; SIGHUP reloads the config (see the module docstring).
        """
        loop = asyncio.get_running_loop()
        handlers = {signal.SIGTERM: self.request_stop, signal.SIGINT: self.request_stop, signal.SIGHUP: self.request_reload}
        # signal.signal, not loop.add_signal_handler: taking the loop's handler away
        # resets the signal to its default (SIGHUP: exit 129) for a moment; putting the
        # one before it back (signals.hold's, in `run`) is one atomic swap.
        previous = {sig: signal.getsignal(sig) for sig in handlers}

        def on_signal(signum: int, _frame: object) -> None:  # between bytecodes of the main thread
            loop.call_soon_threadsafe(handlers[signal.Signals(signum)])

        for sig in handlers:
            signal.signal(sig, on_signal)
        stop, reloads = signals.take()  # asked for before these handlers: handed over now
        if stop:
            self.request_stop()
        if reloads:
            self.request_reload()
        try:
            return await self._run()
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old if old is not None else signal.SIG_DFL)

    async def _init_nvml(self) -> bool:
        """``nvmlInit`` with bounded retries and backoff (a driver may still be loading at
        boot). Each failure says what to do about its cause. Nothing is written before.
        Raises Interrupted when a stop comes while ``nvmlInit`` has not returned."""
        attempts = self.settings.nvml_init_attempts if self.settings else 5
        backoff = Backoff(self.settings.nvml_init_backoff_s if self.settings else 1.0, 30.0)
        for attempt in range(1, attempts + 1):
            try:
                await until_stopped(self._stop, self.nvml.init, name="nvml-init")
                return True
            except NvmlError as exc:
                last = attempt == attempts or self._stop.is_set()
                (log.error if last else log.warning)(
                    "nvml_unavailable" if last else "nvml_init_failed",
                    error=str(exc), attempt=attempt, attempts=attempts, action=init_advice(exc.code),
                    **({} if last else {"retry_in_s": (delay := backoff.next_s())}),
                )
                if last:
                    return False
                self._wake.clear()
                try:
                    async with asyncio.timeout(delay):  # not wait_for: it may swallow a stop's cancel (3.11)
                        await self._wake.wait()
                except TimeoutError:
                    pass
        return False

    def _start_controller(self) -> Controller:
        ctl = self.controller_factory(self.nvml)
        ctl.start()
        return ctl

    async def _run(self) -> int:
        # Boot (NVML init, the first enumeration, persistence mode) runs off the loop and
        # is given up on a stop: nothing but a no-op permission probe has been written, so
        # the cards keep the limits they had (the unit's failsafe runs after us).
        try:
            if not await self._init_nvml():
                return ExitStatus.OK if self._stop.is_set() else ExitStatus.NVML
            ctl = await until_stopped(self._stop, self._start_controller, name="start")
        except Interrupted as exc:
            return self._boot_interrupted(str(exc))
        except CardLimitUnknown as exc:
            log.error("card_limits_unknown", error=str(exc),
                      action="set max_w for the card under [cards] (the highest limit it may have), or fix its driver")
            return ExitStatus.CARD_UNKNOWN
        except BudgetInfeasible as exc:
            log.error("budget_infeasible", error=str(exc))
            return ExitStatus.INFEASIBLE
        except NvmlNoPermission as exc:
            log.error(
                "no_permission", error=str(exc),
                action="writing power limits needs root or CAP_SYS_ADMIN: the budget is NOT enforced. "
                "Run as root (the systemd unit does), or set allow_monitor_only = true to watch only",
            )
            return ExitStatus.NO_PERMISSION
        except NvmlError as exc:
            log.error("nvml_unavailable", error=str(exc), kind=exc.kind)
            return ExitStatus.NVML
        self.controller = ctl
        if self.arbiter is not None and self.settings is not None:
            # Now that the cards are known, their models pick the transient factor.
            self.arbiter.configure(self.settings.effective_budget_w([c.info.name for c in ctl.cards]))
        if self.arbiter is None:  # no settings: the factory's budget is the configured one
            self.arbiter = BudgetArbiter(to_w(ctl.budget_mw))
        if self.keeper is None:
            self.keeper = BudgetKeeper(self.arbiter)
        log.info(
            "starting", budget_w=to_w(ctl.budget_mw), gpus=len(ctl.cards), dry_run=ctl.dry_run,
            cards=[{"index": c.index, "uuid": c.uuid, "name": c.info.name, "min_w": to_w(c.min_mw),
                    "max_w": to_w(c.max_mw), "controllable": c.controllable} for c in ctl.cards],
        )
        enable = self.settings is not None and self.settings.enable_persistence_mode and not ctl.dry_run
        try:
            self._persistence_off = await until_stopped(
                self._stop, ensure_persistence_mode, self.nvml, [(c.index, c.uuid, c.controllable) for c in ctl.cards],
                enable, name="persistence-mode",
            )
        except Interrupted as exc:
            return self._boot_interrupted(str(exc))
        tasks = [asyncio.create_task(ch.run(), name=type(ch).__name__) for ch in self.channels]
        try:
            return await self._loop(ctl)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._ticks.close()
            self._shutdown_nvml()

    def _boot_interrupted(self, step: str) -> int:
        """A stop came while boot waited on NVML: leave without it (see :meth:`_run`)."""
        self.notifier.stopping()
        log.info("stopped_during_boot", step=step,
                 note="no power limit was written: the cards keep the limits they had")
        return ExitStatus.OK

    def _shutdown_nvml(self) -> None:
        """``nvmlShutdown``, waited for at most NVML_SHUTDOWN_TIMEOUT_S: with a call
        abandoned on a lost or hung card it may never return, and the process is leaving."""
        if (exc := shutdown_within(self.nvml, NVML_SHUTDOWN_TIMEOUT_S)) is not None:
            log.warning("nvml_shutdown_abandoned", error=str(exc), after_s=NVML_SHUTDOWN_TIMEOUT_S)

    async def _loop(self, ctl: Controller) -> int:
        """Tick until a step ends the run; returns the exit status."""
        run = _Run(started=self.clock())
        while (status := await self._on_tick(ctl, run)) is None:
            await self._sleep(self._next_due(run, ctl.timings.tick_s), run.stop_deadline)
        return status

    def _next_due(self, run: _Run, tick_s: float) -> float:
        """When the next tick is due: a fixed cadence from the first tick. Timed from each
        tick's own start instead, every tick would run late by the wake-up delay (up to a
        millisecond or more) and the cadence drift across NVML's 100 ms power refresh,
        skipping one reading in every hundred or so. A tick that ran past its slot (or a
        machine that stalled) starts the cadence again from now, without a burst to catch up."""
        due = run.t0 + tick_s if run.due is None else run.due + tick_s
        run.due = due if due > self.clock() else self.clock()
        return run.due

    async def _on_tick(self, ctl: Controller, run: _Run) -> int | None:
        """One tick's work, in order; the exit status when the run ends here, else None."""
        self._wake.clear()
        if self._reload_requested and run.announced and run.stop_deadline is None:
            self._reload_requested = False
            self._reload(ctl)  # the tick just below acts on a new budget at once
        run.t0 = self.clock()
        report = await self._tick(ctl, run.t0)
        self._publish(report)
        status = self._boot_step(ctl, report, run)
        if status is None:
            self._notify(ctl, run)
            status = self._stop_step(ctl, run)
        return status

    async def _tick(self, ctl: Controller, t0: float) -> TickReport:
        """The budget sources' news taken in, the controller ticked (off the loop), and
        its report completed with the budget in force and the circuit's state."""
        assert self.keeper is not None
        self.keeper.apply(ctl, t0)  # between ticks: what the sources reported since the last one
        report = await self._ticks.run(ctl.tick, t0)
        snapshot = report.snapshot.with_budget(self.keeper.in_force)
        if self.circuit_status is not None:
            snapshot = dataclasses.replace(snapshot, circuit=self.circuit_status(t0))
        self.keeper.arbiter.set_floor(snapshot.floor_w)
        return dataclasses.replace(report, snapshot=snapshot)

    def _publish(self, report: TickReport) -> None:
        for channel in self.channels:
            try:
                channel.on_tick(report)
            except Exception:  # noqa: BLE001 - a side channel must never stop control
                log.exception("listener_failed", listener=type(channel).__name__)

    def _boot_step(self, ctl: Controller, report: TickReport, run: _Run) -> int | None:
        """READY once the boot limits are confirmed; the exit status when boot cannot end."""
        if not ctl.ready and any(w.error_kind == "no_permission" for w in report.writes):
            log.error("no_permission", error="writing power limits needs root or CAP_SYS_ADMIN; the budget is NOT enforced")
            return ExitStatus.NO_PERMISSION
        if ctl.ready and not run.announced:
            run.announced = True
            self._status = self.status_text(ctl)
            self.notifier.ready(self._status)
        after_s = run.t0 - run.started
        if ctl.ready or after_s <= ctl.timings.boot_timeout_s:
            return None
        if ctl.sum_bound_mw > ctl.budget_mw:  # not only slow: the bank cannot be held within budget
            log.error("boot_over_budget", after_s=round(after_s, 1), sum_limits_w=to_w(ctl.sum_bound_mw),
                      budget_w=to_w(ctl.budget_mw), cause="; ".join(ctl.degraded()) or None,
                      action="the cards we cannot lower leave the bank over budget with every other card "
                      "at its floor: lift the outside limit, fix the card, or raise the budget")
            return ExitStatus.BOOT_OVER_BUDGET
        log.error("boot_timeout", after_s=round(after_s, 1), sum_limits_w=to_w(ctl.sum_bound_mw))
        return ExitStatus.BOOT_TIMEOUT

    def _notify(self, ctl: Controller, run: _Run) -> None:
        """systemd's status line when it changed, and the watchdog when it is due."""
        status = self.status_text(ctl)
        if status != self._status:
            self._status = status
            self.notifier.status(status)
        if run.watchdog_s is not None and run.t0 - run.last_watchdog >= run.watchdog_s:
            self.notifier.watchdog()
            run.last_watchdog = run.t0

    def _stop_step(self, ctl: Controller, run: _Run) -> int | None:
        """On a stop: the cards back to fair share (decreases first); the exit status
        once they are confirmed there, or the stop timed out."""
        t0 = run.t0
        if self._stop.is_set() and run.stop_deadline is None:
            log.info("stopping", reason="signal" if self._exit_status is None else f"exit {self._exit_status}")
            self.notifier.stopping()
            # Lease-backed budgets (a circuit grant) end here: the cards return to
            # the share this host may use without any lease, decreases first.
            assert self.keeper is not None
            self.keeper.arbiter.end_leases(t0)
            self.keeper.apply(ctl, t0, reason="stopping")
            ctl.request_stop()
            run.stop_deadline = t0 + max(5.0, 3 * ctl.timings.confirm_timeout_s)
        if run.stop_deadline is None:
            return None
        if ctl.mode == Mode.DRY_RUN:  # nothing was written: say what the cards really have
            log.info("stopped", dry_run=True, limits_w=[opt_w(c.enforced_mw) for c in ctl.cards],
                     decided_limits_w=[to_w(c.bound_mw) for c in ctl.cards],
                     note="dry run: no limit was written, the cards keep the limits they had")
            return ExitStatus.OK if self._exit_status is None else self._exit_status
        if ctl.stopped:
            log.info("stopped", sum_limits_w=to_w(ctl.sum_bound_mw), limits_w=[to_w(c.bound_mw) for c in ctl.cards])
            return ExitStatus.OK if self._exit_status is None else self._exit_status
        if t0 > run.stop_deadline:
            log.error("stop_timeout", sum_limits_w=to_w(ctl.sum_bound_mw))
            return ExitStatus.ERROR
        return None

    async def _sleep(self, until: float, stop_deadline: float | None) -> None:
        """Until the next tick is due (the daemon's clock, s), or a signal wakes the loop
        (so SIGTERM or SIGHUP is acted on within the tick), but not again once stopping
        has begun. One future and one timer: no task a tick (``wait_for`` starts one)."""
        delay = until - self.clock()
        if delay <= 0 or (stop_deadline is None and self._wake.is_set()):
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        timer = loop.call_later(delay, _settle, waiter)
        if stop_deadline is None:
            self._waiter = waiter
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _reload(self, ctl: Controller) -> None:
        """Re-read the config file; apply it, or keep the running one and say why."""
        self.notifier.reloading()
        path = None if self.config_path is None else str(self.config_path)
        old_w = to_w(ctl.budget_mw)
        log.info("reloading", config=path)
        assert self.keeper is not None
        arbiter = self.keeper.arbiter
        old_configured_w = arbiter.configured_w
        try:
            new = self._load()
            # The file's budget replaces the configured one in the arbiter (never
            # inferred from what the controller holds); a lower source stays in force.
            arbiter.configure(new.effective_budget_w([c.info.name for c in ctl.cards]))  # their transient factors
            self.keeper.apply(ctl, self.clock(), reason="reload", strict=True)
        except (ConfigError, BudgetInfeasible) as exc:
            arbiter.configure(old_configured_w)
            floor_w = arbiter.floor_w
            if isinstance(exc, BudgetInfeasible) and floor_w is not None and floor_w < old_configured_w:
                # The file asks for less than the cards can be held to. Keeping the old,
                # higher budget would be further from it than the floors: hold the cards
                # there, and count the reload as failed until the file is fixed.
                arbiter.configure(floor_w)
                self.keeper.apply(ctl, self.clock(), reason="reload")
            kept_w = to_w(ctl.budget_mw)
            log.error("reload_failed", config=path, error=str(exc), kept_budget_w=kept_w,
                      **({"held_at_floor_w": kept_w} if kept_w != old_w else {}))
            detail = "; ".join(line.strip() for line in str(exc).splitlines())
            held = f" (cards held at their floors, {kept_w:g} W)" if kept_w != old_w else ""
            self._reload_note = f"reload failed, running config kept{held}: {detail}"
            ok = False
        else:
            old = self.settings
            restart = [k for k in RESTART_ONLY if old is not None and getattr(new, k) != getattr(old, k)]
            if old is not None:
                new = new.model_copy(update={k: getattr(old, k) for k in restart})
                ups, ups_restart = ups_on_reload(old.ups, new.ups)  # its budget rules apply at once
                new = new.model_copy(update={"ups": ups})
                restart += [ups_restart] if ups_restart else []
            if old is None or new.log_level != old.log_level:
                configure_logging(level=new.log_level)
            self.settings = new
            (log.warning if restart else log.info)("reloaded", config=path, budget_w=to_w(ctl.budget_mw), was_budget_w=old_w,
                     restart_needed=restart or None)
            change = f"{old_w:g} -> {to_w(ctl.budget_mw):g} W" if to_w(ctl.budget_mw) != old_w else f"{old_w:g} W unchanged"
            self._reload_note = f"reloaded: budget {change}" + (f" ({', '.join(restart)}: restart to apply)" if restart else "")
            ok = True
        for channel in self.channels:
            try:
                channel.on_reload(ok, self.settings)
            except Exception:  # noqa: BLE001 - a side channel must never stop control
                log.exception("listener_failed", listener=type(channel).__name__)
        self._status = self.status_text(ctl)
        self.notifier.ready(self._status)

    def _load(self) -> Settings:
        if self.config_path is None:
            raise ConfigError("no config file to reload (started without --config)")
        return load_config(self.config_path)
