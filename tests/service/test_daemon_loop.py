"""The daemon's loop, step by step: each tick's work ends the run only through a step
that says so, with that step's exit status."""

from __future__ import annotations

import asyncio
from pathlib import Path

from structlog.testing import capture_logs

from powerbudgetd.config import load_config
from powerbudgetd.control.controller import Controller
from powerbudgetd.errors import ExitStatus
from powerbudgetd.service.backend import make_nvml
from powerbudgetd.service.daemon import Daemon
from powerbudgetd.service.notify import Notifier
from support.scenarios import IDLE_4
from support.wait import wait_until_async


def daemon_on(tmp_path: Path) -> Daemon:
    (tmp_path / "bank.toml").write_text(IDLE_4)
    config = tmp_path / "pb.toml"
    config.write_text(f'budget_w = 1000\n[sim]\nscenario = "{tmp_path / "bank.toml"}"\n')
    settings = load_config(config)

    def factory(nvml):  # type: ignore[no-untyped-def]
        return Controller(nvml, settings.effective_budget_w(), settings.control.timings())

    return Daemon(make_nvml("sim", settings.sim.scenario), factory, notifier=Notifier(""), config_path=config,
                  settings=settings)


async def test_a_stop_asked_with_an_exit_status_returns_the_cards_then_exits_with_it(tmp_path: Path) -> None:
    daemon = daemon_on(tmp_path)
    with capture_logs() as logs:
        task = asyncio.create_task(daemon.run())
        await wait_until_async(lambda: daemon.controller is not None and daemon.controller.ready, 15.0, "ready",
                               step_s=0.01)
        daemon.request_exit(ExitStatus.DUPLICATE_HOST)
        assert await asyncio.wait_for(task, 15) == ExitStatus.DUPLICATE_HOST
    (stopping,) = [e for e in logs if e["event"] == "stopping"]
    assert stopping["reason"] == f"exit {int(ExitStatus.DUPLICATE_HOST)}"
    (stopped,) = [e for e in logs if e["event"] == "stopped"]
    assert stopped["limits_w"] == [250.0] * 4  # fair share, confirmed, before the exit


async def test_a_signal_stop_exits_zero_once_the_cards_are_at_fair_share(tmp_path: Path) -> None:
    daemon = daemon_on(tmp_path)
    with capture_logs() as logs:
        task = asyncio.create_task(daemon.run())
        await wait_until_async(lambda: daemon.controller is not None and daemon.controller.ready, 15.0, "ready",
                               step_s=0.01)
        daemon.request_stop()
        assert await asyncio.wait_for(task, 15) == ExitStatus.OK
    assert [e["reason"] for e in logs if e["event"] == "stopping"] == ["signal"]
    assert [e["event"] for e in logs if e["event"] in ("ready", "stopped")] == ["ready", "stopped"]


async def test_ticks_keep_a_fixed_cadence_instead_of_drifting_by_each_wake_up(tmp_path: Path) -> None:
    """At 100 ms, the ticks keep a 100 ms cadence: each one due at the one before's due
    time plus tick_s, so the typical (median) interval is 100 ms. Timed from its own
    start, every tick runs late by its wake-up delay (asyncio rounds a sleep up to the
    next ms): every interval 100.5-1 ms, and the cadence drifts across NVML's 100 ms
    refresh, a reading skipped every hundred or so (tens of ms over 60 ticks). The median,
    not the end: a stall on a loaded machine restarts the cadence from then, by design."""
    from support.inprocess import running_daemon

    daemon_on(tmp_path)  # writes the bank and the config
    async with running_daemon(tmp_path / "pb.toml") as r:
        first = len(r.ticks)
        await r.until(lambda: len(r.ticks) >= first + 60, what="60 ticks")
    nows = [rep.now for _, rep in r.ticks[first:first + 60]]
    intervals_ms = sorted(1000 * (b - a) for a, b in zip(nows, nows[1:]))
    assert abs(intervals_ms[len(intervals_ms) // 2] - 100.0) < 0.3, [round(x, 2) for x in intervals_ms]
