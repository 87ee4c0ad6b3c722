"""The daemon with a UPS behind a real ``upsd``: the budget the controller holds, through
the arbiter, as the UPS goes on battery, comes back, runs low, and as [ups] is reloaded.
A simulated bank of four 150-300 W cards at 1000 W (floor 600 W)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from support.nut import Nut
from powerbudgetd.channels.ups import UpsChannel
from support.daemon import Launch, scrape
from support.inprocess import Running, running_daemon
from support.scenarios import idle_4
from support.timings import UPS_ONLINE_HOLD_S
from support.wait import free_port

pytestmark = pytest.mark.slow  # a real upsd and its driver: the full run (CI) covers it

POLL_S = 0.3
TICK_S = 0.1


def write_config(tmp_path: Path, nut: Nut, ups_extra: str = "") -> Path:
    scenario = idle_4(tmp_path)
    path = tmp_path / "powerbudgetd.toml"
    path.write_text(f"""budget_w = 1000
[metrics]
enabled = false
[recorder]
enabled = false
[feed]
breaker_a = 15
volts = 120
ups_w = 1500
ups_margin = 0.2
psu_efficiency = 0.9
host_w = 50
transient_factor = 1.0  # these tests are about the UPS's readings: no transient reserve, budget_w binds
[sim]
scenario = "{scenario}"
[ups]
host = "127.0.0.1"
port = {nut.port}
name = "{nut.name}"
poll_s = {POLL_S}
timeout_s = 1
reconnect_max_s = 1
on_battery_budget_w = 700
online_hold_s = {UPS_ONLINE_HOLD_S}
{ups_extra}""")
    return path


@contextlib.asynccontextmanager
async def running(config: Path) -> AsyncIterator[Running]:
    """The daemon in this process with the UPS channel (``r.ups``), after its first poll."""
    async with running_daemon(config, ups=lambda settings, daemon, registry: UpsChannel(
            settings.ups, daemon.arbiter, settings.feed and settings.feed.feed(), registry=registry)) as r:
        await r.until(lambda: r.ups.state == "ok", what="the first poll")
        yield r


def served(nut: Nut, status: str) -> Callable[[], float]:
    """In a thread: poll upsd (upsc) until it serves ``status``; when it first did."""
    return lambda: nut.wait_for("ups.status", status)


async def test_on_battery_lowers_within_a_poll_and_a_tick_then_the_hold_restores(nut: Nut, tmp_path: Path) -> None:
    async with running(write_config(tmp_path, nut)) as r:
        assert r.ctl.budget_mw == 1_000_000
        nut.set("OB DISCHRG", **{"battery.runtime": "600"})
        t_served = await asyncio.to_thread(served(nut, "OB DISCHRG"))
        await r.until(lambda: any(rep.budget_w == 700 for _, rep in r.ticks[-3:]), what="700 W in a tick")
        t_low = time.monotonic()
        # upsc itself takes a few ms to see it: the margin covers that and the event loop
        assert t_low - t_served <= POLL_S + TICK_S + 0.2, t_low - t_served
        await r.until(lambda: r.ticks[-1][1].snapshot.budget_source == "ups", what="source ups")
        await r.until(lambda: r.ctl.sum_bound_mw <= 700_000, what="the caps under 700 W")

        nut.set("OL CHRG")
        t_online = await asyncio.to_thread(served(nut, "OL CHRG"))
        await r.until(lambda: r.ctl.budget_mw == 1_000_000, what="restored")
        t_back = time.monotonic()
        assert t_back - t_online >= UPS_ONLINE_HOLD_S - POLL_S, "held on line for online_hold_s first"
        assert r.ticks[-1][1].snapshot.budget_source == "config" or r.ctl.budget_mw == 1_000_000


@pytest.mark.parametrize("flags", ["OB LB", "OB LB FSD", "OL OVER"])
async def test_low_battery_fsd_overload_take_every_card_to_its_floor(nut: Nut, tmp_path: Path, flags: str) -> None:
    async with running(write_config(tmp_path, nut)) as r:
        nut.set(flags)
        await r.until(lambda: r.ctl.budget_mw == 600_000, what="the floor")
        await r.until(lambda: all(c.enforced_mw == c.min_mw for c in r.ctl.cards), what="every card at its minimum")
        assert r.ups.constraint.reason in ("ups_low_battery", "ups_forced_shutdown", "ups_overload")


async def test_measured_load_above_the_feed_limit_lowers_the_budget(nut: Nut, tmp_path: Path) -> None:
    async with running(write_config(tmp_path, nut)) as r:
        # plug-side limit: UPS 1500 W x (1 - 0.2) = 1200 W; idle cards draw ~120 W of board power
        nut.set("OL", **{"ups.realpower": "1250"})
        await r.until(lambda: r.ctl.budget_mw < 1_000_000, what="a lower budget")
        board_w = r.ups.board_power_w()
        assert board_w is not None
        # 50 W over the limit at the plug: the budget sits under what the GPUs draw, by
        # the excess in board watts and the dead band (within a tick's drift of draw).
        assert r.ctl.budget_mw / 1000 <= max(600.0, board_w - 50 * 0.9 - 20 + 5)
        assert r.ups.constraint.reason == "ups_measured_load"


async def test_a_reload_changes_the_rules_and_says_a_new_connection_needs_a_restart(nut: Nut, tmp_path: Path) -> None:
    config = write_config(tmp_path, nut)
    async with running(config) as r:
        nut.set("OB")
        await r.until(lambda: r.ctl.budget_mw == 700_000, what="on battery")
        config.write_text(config.read_text().replace("on_battery_budget_w = 700", "on_battery_budget_w = 650"))
        r.daemon.request_reload()
        await r.until(lambda: r.ctl.budget_mw == 650_000, what="the reloaded on-battery budget")
        assert "restart" not in r.daemon._reload_note

        config.write_text(config.read_text().replace(f"port = {nut.port}", "port = 1"))
        r.daemon.request_reload()
        await r.until(lambda: "ups connection" in r.daemon._reload_note, what="the restart note")
        assert "restart to apply" in r.daemon._reload_note
        await asyncio.sleep(3 * POLL_S)
        assert r.ups.state == "ok" and r.ctl.budget_mw == 650_000  # still polling the running upsd


def test_powerbudgetd_run_with_ups_serves_metrics_and_records_the_ups(nut: Nut, tmp_path: Path, launch: Launch) -> None:
    """The CLI wiring: `powerbudgetd run` registers the UPS channel, its metrics are on
    /metrics (with the budget source `ups` in force on battery), and every record of
    the flight recorder carries the UPS."""
    port = free_port()
    config = write_config(tmp_path, nut)
    logdir = tmp_path / "log"
    text = config.read_text().replace("[metrics]\nenabled = false", f"[metrics]\nenabled = true\nport = {port}")
    text = text.replace("[recorder]\nenabled = false", f'[recorder]\nenabled = true\ndir = "{logdir}"\ninterval_s = 0.5')
    config.write_text(text)
    daemon = launch(config)

    def served(needle: str, what: str) -> str:
        return daemon.wait_for(lambda: body if needle in (body := scrape(port, timeout_s=2)) else None, what, 15,
                               step_s=0.1, ignore=(OSError,))

    served('powerbudgetd_ups_status{flag="OL"} 1.0', "UPS on line in /metrics")
    nut.set("OB DISCHRG", **{"battery.runtime": "420", "ups.load": "55"})
    body = served('powerbudgetd_budget_source_in_force{source="ups"} 1.0', "source ups")
    assert "powerbudgetd_ups_battery_runtime_seconds 420.0" in body
    assert "powerbudgetd_budget_watts 700.0" in body
    time.sleep(1.2)  # a record or two on battery
    assert daemon.stop(15) == 0, daemon.tail()
    records = [json.loads(line) for f in sorted(logdir.glob("power-*.jsonl")) for line in f.read_text().splitlines()]
    samples = [r for r in records if r["kind"] == "sample"]
    assert samples and all("ups" in r for r in samples)
    last = samples[-1]["ups"]
    assert last["status"] == "DISCHRG OB" and last["runtime_s"] == 420 and last["reason"] == "ups_on_battery"
