"""A metered PDU over SNMP against a real agent: Debian's ``snmpd`` on a free loopback port
serving the APC (PowerNet-MIB rPDU2) or Raritan (PDU2-MIB) subtree from a pass_persist
script whose readings the test changes between polls. The figure drives the budget
through the sensor model; a figure in VA, a sentinel and a frozen figure are refused by
the plausibility rule with a clear line, the last good budget kept."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from powerbudgetd.channels.meter import MeterChannel, MeterError
from powerbudgetd.channels.pdu import SnmpPdu, pdu_channel
from powerbudgetd.config.meters import PduConfig
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.pdumib import APC_DEVICE, APC_OUTLET, RARITAN, RARITAN_INLET_CONFIG, RARITAN_INLET_MEASURE
from support.inprocess import run_once, running_daemon
from support.configs import METERED_FEED, QUIET
from support.scenarios import idle_4
from support.snmpd import AUTH_KEY, PRIV_KEY, V3_USER, Snmpd

pytestmark = pytest.mark.slow  # a real snmpd

CONF_W = 1000.0
FEED = Feed(psu_efficiency=0.9, breaker_a=15, volts=120)
ACTIVE, APPARENT = 5, 6


def apc(inlet_w: float, va: float | None = None, *, outlets: dict[int, int] | None = None,
        raw: int | None = None) -> dict[str, tuple[str, int]]:
    """The APC agent's objects: device 1's power (hundredths of kW) and apparent power."""
    values = {f"{APC_DEVICE}.5.1": ("integer", raw if raw is not None else round(inlet_w / 10)),
              f"{APC_DEVICE}.16.1": ("integer", round((va if va is not None else inlet_w * 1.05) / 10))}
    for n, w in (outlets or {}).items():
        values[f"{APC_OUTLET}.7.{n}"] = ("integer", w)
    return values


def raritan(w: float, va: float, *, w_units: int = 3, va_units: int = 4, digits: int = 1,
            available: int = 1, raw: int | None = None) -> dict[str, tuple[str, int]]:
    """The Raritan agent's inlet 1 of PDU 1: active and apparent power, their units
    (watt 3, voltamp 4) and decimal digits."""
    values: dict[str, tuple[str, int]] = {}
    for sensor, value, units in ((ACTIVE, w, w_units), (APPARENT, va, va_units)):
        index = f"1.1.{sensor}"
        values[f"{RARITAN_INLET_MEASURE}.2.{index}"] = ("integer", available)
        values[f"{RARITAN_INLET_MEASURE}.4.{index}"] = (
            "gauge", raw if raw is not None and sensor == ACTIVE else round(value * 10 ** digits))
        values[f"{RARITAN_INLET_CONFIG}.6.{index}"] = ("integer", units)
        values[f"{RARITAN_INLET_CONFIG}.7.{index}"] = ("gauge", digits)
    return values


class Sink:
    configured_w = CONF_W

    def __init__(self) -> None:
        self.value: float | None = None

    def offer(self, source: str, budget_w: float, now: float) -> None:
        assert source == "pdu"
        self.value = budget_w

    def withdraw(self, source: str) -> None:
        self.value = None


@pytest.fixture
def apc_agent(tmp_path: Path) -> Iterator[Snmpd]:
    agent = Snmpd(tmp_path / "snmpd", "1.3.6.1.4.1.318")
    agent.set(apc(600))
    agent.start()
    try:
        yield agent
    finally:
        agent.close()


@pytest.fixture
def raritan_agent(tmp_path: Path) -> Iterator[Snmpd]:
    agent = Snmpd(tmp_path / "snmpd", RARITAN)
    agent.set(raritan(600, 640))
    agent.start()
    try:
        yield agent
    finally:
        agent.close()


def cfg(agent: Snmpd, vendor: str, **extra: object) -> PduConfig:
    return PduConfig.model_validate({"host": "127.0.0.1", "port": agent.port, "vendor": vendor,
                                     "community": agent.community, "limit_w": 1200, "timeout_s": 1, **extra})


async def poll(ch: MeterChannel, agent: SnmpPdu, board_w: float, now: list[float]) -> None:
    """One tick and one poll, ``now`` advanced a second."""
    now[0] += 1.0
    ch.bank(now[0], board_w)
    ch.figure(await agent.read())


def channel(c: PduConfig, sink: Sink, now: list[float]) -> tuple[MeterChannel, SnmpPdu]:
    agent = SnmpPdu(c)
    ch = MeterChannel("pdu", c, c.where(), agent.read, sink, FEED, registry=CollectorRegistry(), clock=lambda: now[0])
    return ch, agent


async def test_apc_inlet_over_the_limit_lowers_the_budget_and_a_lower_reading_lets_it_rise(apc_agent: Snmpd) -> None:
    sink, now = Sink(), [0.0]
    ch, agent = channel(cfg(apc_agent, "apc"), sink, now)
    await poll(ch, agent, 500, now)
    assert ch.state == "ok" and ch.value_w == 600 and sink.value is None  # 600 W under 1200 W: not limiting
    apc_agent.set(apc(1300))  # 100 W over at the plug: 90 W of board power less than our 500 W, and the dead band
    await poll(ch, agent, 500, now)
    assert ch.value_w == 1300
    assert sink.value is not None and sink.value <= 500 - 90 - 20 + 1e-6
    low = sink.value
    apc_agent.set(apc(900))
    for _ in range(12):
        await poll(ch, agent, 420, now)
    assert sink.value is None or sink.value > low  # rose again, no faster than the bound


async def test_apc_outlets_sum_to_the_host_s_draw_with_each_outlet_s_metric(apc_agent: Snmpd) -> None:
    sink, now = Sink(), [0.0]
    ch, agent = channel(cfg(apc_agent, "apc", outlets=[3, 4]), sink, now)
    apc_agent.set(apc(3000, outlets={3: 410, 4: 395, 5: 2000}))  # outlet 5 is another host's
    await poll(ch, agent, 500, now)
    assert ch.value_w == 805
    assert ch.metrics.part.labels("pdu", "3")._value.get() == 410  # type: ignore[attr-defined]
    assert ch.metrics.part.labels("pdu", "4")._value.get() == 395  # type: ignore[attr-defined]


async def test_raritan_scales_by_decimal_digits(raritan_agent: Snmpd) -> None:
    sink, now = Sink(), [0.0]
    ch, agent = channel(cfg(raritan_agent, "raritan"), sink, now)
    raritan_agent.set(raritan(1250.5, 1301.2, digits=1))
    await poll(ch, agent, 500, now)
    assert ch.value_w == 1250.5 and ch.state == "ok"
    raritan_agent.set(raritan(1187.25, 1250, digits=2))
    await poll(ch, agent, 500, now)
    assert ch.value_w == 1187.25


@pytest.mark.parametrize("case", ["units say VA", "W above VA (swapped)"])
async def test_a_figure_in_va_is_refused_and_the_budget_kept(raritan_agent: Snmpd, case: str) -> None:
    sink, now = Sink(), [0.0]
    ch, agent = channel(cfg(raritan_agent, "raritan"), sink, now)
    raritan_agent.set(raritan(1300, 1350))
    await poll(ch, agent, 500, now)
    kept = sink.value
    assert kept is not None and ch.state == "ok"
    if case == "units say VA":
        raritan_agent.set(raritan(1500, 1550, w_units=4))
    else:  # snmp-ups' PX2 mapping: what is read as W is the VA, and the VA column the W
        raritan_agent.set(raritan(1500, 1400))
    with capture_logs() as logs:
        await poll(ch, agent, 500, now)
        await poll(ch, agent, 500, now)
    assert ch.state == "implausible" and sink.value == kept and ch.value_w == 1300
    lines = [e for e in logs if e["event"] == "budget_input_implausible"]
    assert len(lines) == 1 and lines[0]["reason"] == "not_watts" and lines[0]["source"] == "pdu"
    assert ("in VA, not W" if case == "units say VA" else "swapped") in lines[0]["detail"]
    assert ch.metrics.implausible.labels("pdu", "not_watts")._value.get() == 2  # type: ignore[attr-defined]
    raritan_agent.set(raritan(1250, 1300))  # watts again: plausible, may lower, trusted after five
    await poll(ch, agent, 500, now)
    assert ch.state == "ok" and ch.value_w == 1250


@pytest.mark.parametrize("vendor", ["apc", "raritan"])
async def test_a_sentinel_is_refused_and_the_budget_kept(tmp_path: Path, vendor: str) -> None:
    agent_ = Snmpd(tmp_path / "snmpd", "1.3.6.1.4.1.318" if vendor == "apc" else RARITAN)
    agent_.set(apc(1300) if vendor == "apc" else raritan(1300, 1350))
    agent_.start()
    try:
        sink, now = Sink(), [0.0]
        ch, agent = channel(cfg(agent_, vendor), sink, now)
        await poll(ch, agent, 500, now)
        kept = sink.value
        assert kept is not None
        agent_.set(apc(0, raw=-1) if vendor == "apc" else raritan(0, 0, available=2))
        with capture_logs() as logs:
            await poll(ch, agent, 300, now)
        assert ch.state == "implausible" and sink.value == kept
        assert [e["reason"] for e in logs if e["event"] == "budget_input_implausible"] == ["sentinel"]
    finally:
        agent_.close()


async def test_a_frozen_figure_is_refused_while_our_draw_moves(apc_agent: Snmpd) -> None:
    sink, now = Sink(), [0.0]
    ch, agent = channel(cfg(apc_agent, "apc"), sink, now)
    apc_agent.set(apc(1300))
    with capture_logs() as logs:
        for i in range(14):  # the PDU's figure stands while our cards swing 200 W
            await poll(ch, agent, 300 if i % 2 else 500, now)
    assert [e["reason"] for e in logs if e["event"] == "budget_input_implausible"] == ["frozen"]
    assert ch.state == "implausible"
    assert ch.metrics.trusted.labels("pdu")._value.get() == 0  # type: ignore[attr-defined]


async def test_snmpv3_auth_priv_reads_and_a_wrong_key_is_a_silence(apc_agent: Snmpd) -> None:
    v3 = {"version": "3", "community": None, "username": V3_USER, "digest": "SHA", "cipher": "AES"}
    sink, now = Sink(), [0.0]
    good = PduConfig.model_validate({"host": "127.0.0.1", "port": apc_agent.port, "vendor": "apc", "limit_w": 1200,
                                     "timeout_s": 1, **v3, "auth_key": AUTH_KEY, "priv_key": PRIV_KEY})
    ch, agent = channel(good, sink, now)
    apc_agent.set(apc(1300))
    await poll(ch, agent, 500, now)
    assert ch.value_w == 1300 and sink.value is not None
    kept = sink.value
    bad = good.model_copy(update={"auth_key": type(good.auth_key)("not-the-key-1")})  # type: ignore[misc]
    ch.read = SnmpPdu(bad).read
    with capture_logs() as logs:
        await asyncio.wait_for(run_once(ch), 10)
    assert ch.state == "auth_failed" and sink.value == kept
    assert [e["state"] for e in logs if e["event"] == "pdu_unavailable"] == ["auth_failed"]


async def test_an_agent_that_stops_answering_is_a_timeout_and_the_budget_kept(apc_agent: Snmpd) -> None:
    sink, now = Sink(), [0.0]
    ch, agent = channel(cfg(apc_agent, "apc"), sink, now)
    apc_agent.set(apc(1300))
    await poll(ch, agent, 500, now)
    kept = sink.value
    apc_agent.stop()
    await asyncio.wait_for(run_once(ch), 10)
    assert ch.state == "timeout" and sink.value == kept



async def test_the_daemon_holds_its_budget_to_the_pdu(apc_agent: Snmpd, tmp_path: Path) -> None:
    path = tmp_path / "powerbudgetd.toml"
    path.write_text(f"""budget_w = 1000
{QUIET}{METERED_FEED}[sim]
scenario = "{idle_4(tmp_path)}"
[pdu]
host = "127.0.0.1"
port = {apc_agent.port}
vendor = "apc"
community = "{apc_agent.community}"
limit_w = 2400
poll_s = 0.3
timeout_s = 1
""")
    path.chmod(0o600)
    apc_agent.set(apc(600))
    async with running_daemon(path, pdu=lambda settings, daemon, registry: pdu_channel(
            settings.pdu, daemon.arbiter, settings.feed.feed(), registry=registry)) as r:
        ch = r.channels["pdu"]
        await r.until(lambda: ch.state == "ok", what="the PDU's first figure")
        assert r.ctl.budget_mw == 1_000_000
        assert r.ticks[-1][1].snapshot.budget_source == "config"  # 1800 W of headroom: not limiting
        apc_agent.set(apc(2500))  # 100 W over the PDU's limit
        await r.until(lambda: r.ctl.budget_mw < 1_000_000, what="a lower budget")
        await r.until(lambda: r.ticks[-1][1].snapshot.budget_source == "pdu", what="source pdu")
        assert ch.value_w == 2500
        board_w = ch.loop.paired_w
        assert board_w is not None and r.ctl.budget_mw / 1000 <= max(600.0, board_w - 90 - 20 + 5)
        age = ch.metrics.age.labels("pdu")._value.get()
        assert 0 <= age < 5


@pytest.mark.parametrize("kind, value", [("string", "1300"), ("counter", 4294967295), ("timeticks", 130),
                                         ("counter64", 2 ** 40)])
async def test_a_figure_of_another_snmp_type_is_garbled_and_the_budget_kept(apc_agent: Snmpd, kind: str,
                                                                           value: object) -> None:
    """The inlet's power is an INTEGER in PowerNet-MIB: the same digits as a string, a
    counter (at 2^32 - 1 or 2^40) or TimeTicks are not the object asked for, never watts."""
    sink, now = Sink(), [0.0]
    ch, agent = channel(cfg(apc_agent, "apc"), sink, now)
    apc_agent.set(apc(1300))
    await poll(ch, agent, 500, now)
    kept = sink.value
    assert kept is not None
    apc_agent.set({**apc(1300), f"{APC_DEVICE}.5.1": (kind, value)})  # type: ignore[dict-item]
    with pytest.raises(MeterError) as err:
        await agent.read()
    assert err.value.cause == "garbled" and f"{APC_DEVICE}.5.1" in str(err.value)
    ch.failed(err.value.cause, str(err.value))
    assert ch.state == "garbled" and sink.value == kept
