"""The UPS channel against a real ``upsd`` with the ``dummy-ups`` driver: variables change
while the server runs, and the test asserts what the channel offers and reports."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from support.nut import Nut
from powerbudgetd.channels.ups import UpsChannel
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.feed import Feed
from powerbudgetd.config import UpsConfig

pytestmark = pytest.mark.slow  # a real upsd and its driver: the full run (CI) covers it

CONF_W = 1000.0
FLOOR_W = 600.0
POLL_S = 0.3


class Sink(BudgetArbiter):
    """The daemon's budget arbiter, with each source's current offer at hand."""

    def __init__(self) -> None:
        super().__init__(CONF_W)

    @property
    def offers(self) -> dict[str, float]:
        return {name: offer.budget_w for name in ("ups",) if (offer := self.offered(name)) is not None}


def ups_cfg(nut: Nut, **kw) -> UpsConfig:  # type: ignore[no-untyped-def]
    base = {"host": "127.0.0.1", "port": nut.port, "name": nut.name, "poll_s": POLL_S, "timeout_s": 1.0,
            "reconnect_max_s": 1.0, "online_hold_s": 1.0, "on_battery_budget_w": 700.0}
    return UpsConfig(**{**base, **kw})


class Running:
    def __init__(self, channel: UpsChannel, sink: Sink) -> None:
        self.channel, self.sink = channel, sink

    async def until(self, predicate, timeout_s: float = 8.0, what: str = "") -> float:  # type: ignore[no-untyped-def]
        """Tick every 50 ms (board power, floor) until ``predicate()``; returns when."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.channel.bank(time.monotonic(), 500.0, FLOOR_W)
            if predicate():
                return time.monotonic()
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what or predicate}: state {self.channel.state}, "
                             f"offers {self.sink.offers}, constraint {self.channel.constraint}")


@pytest.fixture
async def run_channel(nut: Nut) -> AsyncIterator:  # type: ignore[type-arg]
    tasks: list[asyncio.Task[None]] = []

    def start(cfg: UpsConfig, feed: Feed | None = None) -> Running:
        sink = Sink()
        ch = UpsChannel(cfg, sink, feed, registry=CollectorRegistry())
        tasks.append(asyncio.create_task(ch.run()))
        return Running(ch, sink)

    yield start
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def ups(sink: Sink) -> float | None:
    return sink.offers.get("ups")


async def test_on_battery_lowers_within_one_poll_and_restores_after_the_hold(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    r = run_channel(ups_cfg(nut))
    await r.until(lambda: r.channel.state == "ok" and ups(r.sink) is None, what="first poll, no constraint")
    nut.set("OB DISCHRG", **{"ups.load": "35", "battery.charge": "90", "battery.runtime": "600"})
    served = await asyncio.to_thread(nut.wait_for, "ups.status", "OB DISCHRG")
    lowered = await r.until(lambda: ups(r.sink) == 700.0, what="the on-battery budget")
    assert lowered - served <= POLL_S + 0.05 + 0.25, "one poll plus one tick (and upsc's own round trip)"
    assert r.channel.constraint.reason == "ups_on_battery"
    nut.set("OL CHRG", **{"ups.load": "20"})
    online = await asyncio.to_thread(nut.wait_for, "ups.status", "OL CHRG")
    restored = await r.until(lambda: ups(r.sink) is None, what="the restore")
    assert restored - online >= 1.0 - POLL_S, "held on line for online_hold_s before restoring"


@pytest.mark.parametrize(("flags", "reason"), [("OB LB", "ups_low_battery"), ("OB LB FSD", "ups_forced_shutdown"),
                                               ("OL OVER", "ups_overload")])
async def test_floor_flags(nut: Nut, run_channel, flags: str, reason: str) -> None:  # type: ignore[no-untyped-def]
    r = run_channel(ups_cfg(nut))
    await r.until(lambda: r.channel.state == "ok")
    nut.set(flags)
    await r.until(lambda: ups(r.sink) == FLOOR_W, what="the floor")
    assert r.channel.constraint.reason == reason


async def test_measured_load_above_the_feed_limit(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    feed = Feed(breaker_a=15, volts=120, ups_w=1000, ups_margin=0.2, psu_efficiency=0.9, host_w=200)
    r = run_channel(ups_cfg(nut), feed)  # plug-side limit: min(1440, 800) = 800 W
    await r.until(lambda: r.channel.state == "ok")
    nut.set("OL", **{"ups.realpower": "900"})  # 100 W above the limit with 500 W of board power
    await r.until(lambda: ups(r.sink) is not None, what="a measured-load budget")
    assert r.channel.constraint.reason == "ups_measured_load"
    assert ups(r.sink) == pytest.approx(500 - 100 * 0.9 - 20)
    # Far under the limit: rises again (600 W: still above what 500 W of board power draws
    # at the plug; less would be a lie the plausibility rule refuses to rise on).
    nut.set("OL", **{"ups.realpower": "600"})
    await r.until(lambda: ups(r.sink) is None or ups(r.sink) > 600, what="the rise")


async def test_upsd_stopped_keeps_the_budget_and_says_so(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    r = run_channel(ups_cfg(nut))
    nut.set("OB")
    await r.until(lambda: ups(r.sink) == 700.0)
    with capture_logs() as logs:
        nut.stop_upsd()
        await r.until(lambda: r.channel.state == "unreachable", what="unreachable")
        nut.set("OL")
        await asyncio.sleep(1.5)  # longer than the hold: without data nothing is restored
        r.channel.bank(time.monotonic(), 500.0, FLOOR_W)
    assert ups(r.sink) == 700.0 and r.channel.constraint.reason == "ups_stale"
    warn = [e for e in logs if e["event"] == "ups_unavailable"]
    assert warn and warn[0]["state"] == "unreachable" and warn[0]["ups_budget_kept_w"] == 700.0
    assert len(warn) == 1, "one warning per change, not per failed poll"
    metrics = r.channel.metrics
    assert metrics.state.labels("unreachable")._value.get() == 1
    assert metrics.polls_failed.labels("unreachable")._value.get() >= 1
    nut.start_upsd()
    await r.until(lambda: r.channel.state == "ok", what="back")
    await r.until(lambda: ups(r.sink) is None, what="the restore after the hold")


async def test_stale_as_on_battery_when_the_driver_dies(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    r = run_channel(ups_cfg(nut, stale_as_on_battery=True, on_battery_budget_w=650.0))
    # (under load a first poll can time out: stale counts as on battery until the hold)
    await r.until(lambda: r.channel.state == "ok" and ups(r.sink) is None, what="on line, no constraint")
    nut.stop_driver()
    await r.until(lambda: r.channel.state == "stale", timeout_s=15, what="stale")
    await r.until(lambda: ups(r.sink) == 650.0, what="stale treated as on battery")
    assert r.channel.constraint.reason == "ups_stale"


async def test_ups_removed(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    r = run_channel(ups_cfg(nut, stale_as_on_battery=True, on_battery_budget_w=650.0))
    await r.until(lambda: r.channel.state == "ok")
    nut.remove_ups()
    await r.until(lambda: r.channel.state == "unknown_ups", what="unknown UPS")
    await r.until(lambda: ups(r.sink) == 650.0)


async def test_empty_status_is_stale(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    r = run_channel(ups_cfg(nut))
    await r.until(lambda: r.channel.state == "ok")
    nut.set("OB")
    await r.until(lambda: ups(r.sink) == 700.0)
    # An empty ups.status (dummy-ups serves OL in place of a missing one; a driver that
    # lost its UPS can serve an empty one): the UPS's state is unknown, a silence.
    nut.set('""', **{"ups.load": "10"})
    await r.until(lambda: r.channel.state == "stale" and r.channel.guard.last is not None
                  and r.channel.guard.last.load_pct == 10, what="stale, with ups.load but no ups.status")
    await asyncio.sleep(1.2)
    assert ups(r.sink) == 700.0  # kept


async def test_credentials(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    """upsd checks credentials only for LOGIN, SET and INSTCMD, never for reading: a
    right or wrong password reads alike (the README says so)."""
    from pydantic import SecretStr

    for password in ("s3cret", "wrong"):
        r = run_channel(ups_cfg(nut, username="gpu", password=SecretStr(password)))
        await r.until(lambda r=r: r.channel.state == "ok", what=f"reading with password {password}")


async def test_a_server_refusing_the_credentials(tmp_path: Path) -> None:
    """A NUT server that refuses them (``ERR ACCESS-DENIED``): state ``auth_failed``, a
    warning and a metric; the budget in force is kept. upsd itself never refuses a read
    (test above), so a few lines of server stand in here."""
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(b"OK\n" if line.startswith(b"USERNAME") else b"ERR ACCESS-DENIED\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    from pydantic import SecretStr
    cfg = UpsConfig(host="127.0.0.1", port=port, name="ups", username="u", password=SecretStr("p"), poll_s=0.2,
                    reconnect_max_s=0.4)
    sink = Sink()
    ch = UpsChannel(cfg, sink, registry=CollectorRegistry())
    with capture_logs() as logs:
        task = asyncio.create_task(ch.run())
        try:
            for _ in range(100):
                if ch.state == "auth_failed":
                    break
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            server.close()
    assert ch.state == "auth_failed"
    assert ch.metrics.state.labels("auth_failed")._value.get() == 1
    assert any(e["event"] == "ups_unavailable" and e["state"] == "auth_failed" for e in logs)
    assert "ups" not in sink.offers


# -- NUT's semantics (issue: a flag that does not mean what it says) -------------------
async def test_ol_dischrg_with_a_falling_charge_is_on_battery(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    r = run_channel(ups_cfg(nut))
    await r.until(lambda: r.channel.state == "ok" and ups(r.sink) is None, what="first poll")
    with capture_logs() as logs:
        nut.set("OL DISCHRG", **{"battery.charge": "97", "ups.load": "40"})
        await asyncio.to_thread(nut.wait_for, "battery.charge", "97")
        await asyncio.sleep(3 * POLL_S)
        nut.set("OL DISCHRG", **{"battery.charge": "95", "ups.load": "40"})
        await r.until(lambda: ups(r.sink) == 700.0, what="the on-battery budget without OB")
    assert r.channel.constraint.reason == "ups_on_battery"
    said = [e for e in logs if e["event"] == "ups_on_battery_inferred"]
    assert said and said[0]["evidence"] == "OL DISCHRG"
    assert r.channel.metrics.on_battery.labels("OL DISCHRG")._value.get() == 1


async def test_wait_is_no_data_yet_not_an_event(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    r = run_channel(ups_cfg(nut))
    nut.set("OB DISCHRG")
    await r.until(lambda: ups(r.sink) == 700.0, what="on battery")
    with capture_logs() as logs:
        nut.set("WAIT")
        await asyncio.to_thread(nut.wait_for, "ups.status", "WAIT")
        await asyncio.sleep(4 * POLL_S)
        r.channel.bank(time.monotonic(), 500.0, FLOOR_W)
        assert ups(r.sink) == 700.0, "the budget in force is kept"
        nut.set("OB DISCHRG")
        await asyncio.to_thread(nut.wait_for, "ups.status", "OB DISCHRG")
        await asyncio.sleep(3 * POLL_S)
    events = [e["event"] for e in logs]
    assert "ups_no_data_yet" in events
    assert [e for e in logs if e["event"] == "ups_no_data_yet"][0]["log_level"] == "info"
    assert "ups_unknown_flags" not in events and "ups_unavailable" not in events
    assert "ups_status_changed" not in events, "OB before WAIT and after it: no new loss of mains"


async def test_a_sentinel_runtime_is_rejected(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    r = run_channel(ups_cfg(nut))
    await r.until(lambda: r.channel.state == "ok")
    nut.set("OL CHRG", **{"battery.runtime": "3932100", "battery.charge": "100"})  # 65535 min
    await asyncio.to_thread(nut.wait_for, "battery.runtime", "3932100")
    await r.until(lambda: r.channel.metrics.rejected.labels("battery.runtime")._value.get() >= 1,
                  what="the sentinel rejected")
    assert r.channel.guard.last is not None and r.channel.guard.last.battery_runtime_s is None
    runtime = r.channel.metrics.runtime._value.get()
    assert runtime != runtime, "NaN: not reported, never 3932100 s"


async def test_an_unchanged_realpower_is_not_applied_again(nut: Nut, run_channel) -> None:  # type: ignore[no-untyped-def]
    feed = Feed(breaker_a=15, volts=120, ups_w=1000, ups_margin=0.2, psu_efficiency=0.9, host_w=200)
    r = run_channel(ups_cfg(nut), feed)  # plug-side limit 800 W
    await r.until(lambda: r.channel.state == "ok")
    nut.set("OL", **{"ups.realpower": "900"})  # 100 W over with 500 W of board power
    await r.until(lambda: ups(r.sink) is not None, what="a measured-load budget")
    first = ups(r.sink)
    assert first == pytest.approx(500 - 100 * 0.9 - 20)
    polls = r.channel.polls
    await r.until(lambda: r.channel.polls >= polls + 8, what="eight more polls of the same figure")
    assert ups(r.sink) == first, "the same 900 W is no new information: the excess is not taken off again"
