"""The host's BMC over Redfish against a real service: sushy-tools' static server on a
loopback port, its mockup's power figure changed between polls. The chassis' power
drives the budget through the sensor model; a frozen figure, a sentinel and an absent
(null) one are each refused with a clear line, the last good budget kept."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from powerbudgetd.channels.bmc import RedfishBmc, bmc_channel
from powerbudgetd.channels.meter import MeterChannel
from powerbudgetd.config.meters import BmcConfig
from powerbudgetd.core.feed import Feed
from support.inprocess import run_once, running_daemon
from support.redfish import RedfishMockup
from support.configs import METERED_FEED, QUIET
from support.scenarios import idle_4

pytestmark = pytest.mark.slow  # a real HTTP server

CONF_W = 1000.0
FEED = Feed(psu_efficiency=0.9, breaker_a=15, volts=120)


class Sink:
    configured_w = CONF_W

    def __init__(self) -> None:
        self.value: float | None = None

    def offer(self, source: str, budget_w: float, now: float) -> None:
        assert source == "bmc"
        self.value = budget_w

    def withdraw(self, source: str) -> None:
        self.value = None


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[RedfishMockup]:
    server = RedfishMockup(tmp_path, chassis=("Enclosure", "1U")[::-1]).start()
    try:
        yield server
    finally:
        server.stop()


def channel(server: RedfishMockup, now: list[float], **extra: object) -> tuple[MeterChannel, RedfishBmc, Sink]:
    cfg = BmcConfig.model_validate({"url": server.url, "username": "root", "password": "calvin", "limit_w": 1200,
                                    "timeout_s": 1, **extra})
    reader = RedfishBmc(cfg)
    sink = Sink()
    ch = MeterChannel("bmc", cfg, cfg.url, reader.read, sink, FEED, registry=CollectorRegistry(), clock=lambda: now[0])
    return ch, reader, sink


async def poll(ch: MeterChannel, reader: RedfishBmc, board_w: float, now: list[float]) -> None:
    now[0] += 1.0
    ch.bank(now[0], board_w)
    ch.figure(await reader.read())


async def test_chassis_power_over_the_limit_lowers_the_budget_and_a_lower_one_lets_it_rise(
        bmc: RedfishMockup) -> None:
    now = [0.0]
    ch, reader, sink = channel(bmc, now)
    await poll(ch, reader, 300, now)  # 400 W at the plug of which our cards draw 333 W
    assert ch.value_w == 400 and ch.state == "ok" and sink.value is None
    assert reader.source == ("Power", "/redfish/v1/Chassis/1U/Power")  # the first chassis with a power link
    bmc.power(1300)  # 100 W over at the plug
    await poll(ch, reader, 500, now)
    assert ch.value_w == 1300 and sink.value is not None and sink.value <= 500 - 90 - 20 + 1e-6
    low = sink.value
    bmc.power(900)
    for _ in range(12):
        await poll(ch, reader, 420, now)
    assert sink.value is None or sink.value > low


async def test_environment_metrics_is_preferred_and_a_named_chassis_is_read(tmp_path: Path) -> None:
    server = RedfishMockup(tmp_path, chassis=("Blade7", "Other"), environment=True).start()
    try:
        now = [0.0]
        ch, reader, _ = channel(server, now, chassis="Blade7")
        server.power(700, environment_w=712.5)
        await poll(ch, reader, 300, now)
        assert reader.source == ("EnvironmentMetrics", "/redfish/v1/Chassis/Blade7/EnvironmentMetrics")
        assert ch.value_w == 712.5
        ch2, reader2, _ = channel(server, now, chassis="Nope")
        with pytest.raises(Exception) as exc:
            await reader2.read()
        assert getattr(exc.value, "cause", None) == "absent"
    finally:
        server.stop()


@pytest.mark.parametrize(("served", "state", "event", "reason"), [
    (None, "absent", "bmc_unavailable", None),          # PowerConsumedWatts null: no figure
    (0, "implausible", "budget_input_implausible", "sentinel"),
    (65535, "implausible", "budget_input_implausible", "sentinel"),
])
async def test_an_absent_or_sentinel_figure_is_refused_and_the_budget_kept(
        bmc: RedfishMockup, served: float | None, state: str, event: str, reason: str | None) -> None:
    now = [0.0]
    ch, reader, sink = channel(bmc, now)
    bmc.power(1300)
    await poll(ch, reader, 500, now)
    kept = sink.value
    assert kept is not None
    bmc.power(served)
    with capture_logs() as logs:
        for _ in range(2):
            await asyncio.wait_for(run_once(ch), 10)
    assert ch.state == state and sink.value == kept and ch.value_w == 1300
    lines = [e for e in logs if e["event"] == event]
    assert len(lines) == 1, logs  # said once
    if reason is not None:
        assert lines[0]["reason"] == reason and lines[0]["source"] == "bmc"
    else:
        assert "PowerConsumedWatts (null or missing)" in lines[0]["detail"]


async def test_a_frozen_figure_is_refused_while_our_draw_moves(bmc: RedfishMockup) -> None:
    now = [0.0]
    ch, reader, sink = channel(bmc, now)
    bmc.power(1300)
    with capture_logs() as logs:
        for i in range(14):
            await poll(ch, reader, 300 if i % 2 else 500, now)
    assert [e["reason"] for e in logs if e["event"] == "budget_input_implausible"] == ["frozen"]
    assert ch.state == "implausible"


async def test_a_bmc_that_goes_away_is_unreachable_and_the_budget_kept(bmc: RedfishMockup) -> None:
    now = [0.0]
    ch, reader, sink = channel(bmc, now)
    bmc.power(1300)
    await poll(ch, reader, 500, now)
    kept = sink.value
    bmc.stop()
    await asyncio.wait_for(run_once(ch), 10)
    assert ch.state in ("unreachable", "timeout") and sink.value == kept



async def test_the_daemon_holds_its_budget_to_the_bmc(bmc: RedfishMockup, tmp_path: Path) -> None:
    path = tmp_path / "powerbudgetd.toml"
    path.write_text(f"""budget_w = 1000
{QUIET}{METERED_FEED}[sim]
scenario = "{idle_4(tmp_path)}"
[bmc]
url = "{bmc.url}"
username = "root"
password = "calvin"
limit_w = 2400
poll_s = 0.5
timeout_s = 1
""")
    path.chmod(0o600)
    bmc.power(600)
    async with running_daemon(path, bmc=lambda settings, daemon, registry: bmc_channel(
            settings.bmc, daemon.arbiter, settings.feed.feed(), registry=registry)) as r:
        ch = r.channels["bmc"]
        await r.until(lambda: ch.state == "ok", what="the BMC's first figure")
        assert r.ctl.budget_mw == 1_000_000
        bmc.power(2500)
        await r.until(lambda: r.ticks[-1][1].snapshot.budget_source == "bmc", what="source bmc")
        assert ch.value_w == 2500 and r.ctl.budget_mw < 1_000_000
