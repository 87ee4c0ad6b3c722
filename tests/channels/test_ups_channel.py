"""The UPS channel without a server: bounded fuzzing of what a NUT server may send, and
the poll loop surviving anything a client returns or raises."""

from __future__ import annotations

import asyncio
import itertools

import aionut
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from powerbudgetd.channels.ups import UpsChannel, classify
from powerbudgetd.core.ups import BOUNDS, parse_status
from powerbudgetd.core.feed import Feed
from powerbudgetd.config import UpsConfig
from support.examples import examples

CONF_W = 1000.0
FEED = Feed(breaker_a=15, volts=120, ups_w=1000, psu_efficiency=0.9, host_w=200)


class Sink:
    """Records what the channel offers (the arbiter's interface)."""

    configured_w = CONF_W

    def __init__(self) -> None:
        self.value: float | None = None
        self.seen: list[float | None] = []

    def offer(self, source: str, budget_w: float, now: float) -> None:
        assert source == "ups"
        self.value = budget_w
        self.seen.append(budget_w)

    def withdraw(self, source: str) -> None:
        self.value = None
        self.seen.append(None)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


NAMES = ["ups.status", *(b[0] for b in BOUNDS), "ups.mfr", "driver.name", ""]
values = st.one_of(
    st.text(max_size=64),
    st.sampled_from(["OB", "LB", "OL", "OL OB", "OB DISCHRG", "", "nan", "inf", "-1", "1e400", "0x10", "  12 ",
                     "OL\nOB", "ZAP BOOM", "ALARM", "12,5", "100000000000000000000000"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
)
polls = st.lists(st.dictionaries(st.sampled_from(NAMES), values, max_size=9), max_size=25)


def says_nothing(variables: dict[str, str]) -> bool:
    """No known ups.status flag: missing, garbled or only unknown words."""
    parsed = parse_status(variables.get("ups.status", ""))
    return parsed is None or not parsed[0]


@settings(max_examples=examples(300), deadline=None)
@given(polls=polls, dts=st.lists(st.floats(0, 30), min_size=25, max_size=25),
       board=st.lists(st.one_of(st.none(), st.floats(0, 10_000)), min_size=25, max_size=25),
       stale_as_on_battery=st.booleans())
def test_fuzz_nothing_from_nut_raises_the_budget(polls, dts, board, stale_as_on_battery) -> None:  # type: ignore[no-untyped-def]
    """From on battery (700 W offered), a poll without a known status flag never raises
    the offer; any poll keeps it within [0, configured]; nothing raises."""
    cfg = UpsConfig(name="ups", on_battery_budget_w=700, online_hold_s=5, stale_as_on_battery=stale_as_on_battery)
    clock, sink = Clock(), Sink()
    ch = UpsChannel(cfg, sink, FEED, registry=CollectorRegistry(), clock=clock)
    ch.bank(0.0, 400.0, 600.0)
    ch.variables({"ups.status": "OB"})
    assert sink.value == 700.0
    for variables, dt, board_w in zip(polls, dts, board, strict=False):
        before = sink.value
        clock.t += dt
        ch.bank(clock.t, board_w, 600.0)
        ch.variables(variables)
        after = sink.value
        assert after is None or 0 <= after <= CONF_W
        if says_nothing(variables) and before is not None:
            assert after is not None
            assert after <= before + 1e-9
    for value in sink.seen:
        assert value is None or 0 <= value <= CONF_W


class FuzzClient:
    """Answers each poll from a list: a dict, or an exception to raise."""

    def __init__(self, answers: list[object]) -> None:
        self.answers = itertools.cycle(answers or [{}])
        self.closed = False
        self.calls = 0

    async def list_vars(self, ups: str) -> dict[str, str]:
        self.calls += 1
        await asyncio.sleep(0)
        answer = next(self.answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]

    def shutdown(self) -> None:
        self.closed = True


errors = st.sampled_from([
    aionut.NUTOSError("refused"), aionut.NUTTimeoutError("slow"), aionut.NUTLoginError("ERR ACCESS-DENIED"),
    aionut.NUTCommandError("ERR UNKNOWN-UPS"), aionut.NUTCommandError("ERR DATA-STALE"),
    aionut.NUTProtocolError("Unexpected response"), aionut.NUTValueError("bad"), ValueError("x"),
    RuntimeError("a bug in a client"), UnicodeDecodeError("ascii", b"\xff", 0, 1, "no"),
])


@settings(max_examples=examples(40), deadline=None)
@given(answers=st.lists(st.one_of(st.dictionaries(st.sampled_from(NAMES), values, max_size=6), errors), max_size=12))
async def test_the_poll_loop_survives_anything(answers) -> None:  # type: ignore[no-untyped-def]
    """Every answer and every exception a client may give: the task lives on, polls
    again, and never offers above the configured budget."""
    cfg = UpsConfig(name="ups", on_battery_budget_w=700)
    client = FuzzClient(answers)
    sink = Sink()

    async def no_wait(_s: float) -> None:
        await asyncio.sleep(0)

    ch = UpsChannel(cfg, sink, registry=CollectorRegistry(), client_factory=lambda _cfg: client,
                    sleep=no_wait)
    ch.bank(0.0, 400.0, 600.0)
    task = asyncio.create_task(ch.run())
    for _ in range(1000):
        if client.calls > 2 * len(answers) + 1:
            break
        await asyncio.sleep(0)
    assert not task.done(), task.exception() if task.done() else None
    assert client.calls > 2 * len(answers) + 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert client.closed
    for value in sink.seen:
        assert value is None or 0 <= value <= CONF_W


def test_classify() -> None:
    assert classify(aionut.NUTOSError("x")) == "unreachable"
    assert classify(aionut.NUTTimeoutError("x")) == "unreachable"
    assert classify(aionut.NUTConnectionClosedError("x")) == "unreachable"
    assert classify(aionut.NUTLoginError("ERR ACCESS-DENIED")) == "auth_failed"
    assert classify(aionut.NUTCommandError("Error running: LIST VAR x: ERR UNKNOWN-UPS")) == "unknown_ups"
    assert classify(aionut.NUTCommandError("ERR DATA-STALE")) == "stale"
    assert classify(aionut.NUTCommandError("ERR DRIVER-NOT-CONNECTED")) == "stale"
    assert classify(RuntimeError("x")) == "error"


@settings(max_examples=examples(200), deadline=None)
@given(polls=polls, dts=st.lists(st.floats(0, 30), min_size=25, max_size=25), stale_as_on_battery=st.booleans())
def test_the_feed_is_told_lost_exactly_while_on_battery_is_seen_and_in_force(polls, dts, stale_as_on_battery) -> None:  # type: ignore[no-untyped-def]
    """``[ups] feed``: the circuit is told the feed's state once it is known (on line for
    the hold: a mark left before a restart is lifted), then True when a fresh reading's
    on-battery budget comes in force and False when it goes (on line for the hold), once
    per change, whatever NUT sends; a silence taken as on battery (stale_as_on_battery)
    lowers this host's budget but never takes the feed out for every host."""
    cfg = UpsConfig(name="ups", on_battery_budget_w=700, online_hold_s=5, stale_as_on_battery=stale_as_on_battery)
    clock, told = Clock(), []
    ch = UpsChannel(cfg, Sink(), FEED, registry=CollectorRegistry(), clock=clock, on_feed=told.append)
    ch.bank(0.0, 400.0, 600.0)
    ch.failed("refused", "upsd not up yet")
    clock.t = 1.0
    ch.bank(clock.t, 400.0, 600.0)
    assert told == []  # nothing fresh yet (with stale_as_on_battery, this host's budget is lowered)
    ch.variables({"ups.status": "OL"})
    clock.t = 5.5
    ch.variables({"ups.status": "OL"})
    assert told == []  # on line, but not yet for the hold: a mark made before a restart stays
    clock.t = 6.0
    ch.variables({"ups.status": "OL"})
    assert told == [False]
    ch.variables({"ups.status": "OB DISCHRG"})
    assert told == [False, True]
    clock.t = 9.0
    ch.variables({"ups.status": "OL"})
    clock.t = 13.0
    ch.variables({"ups.status": "OL"})
    assert told == [False, True]  # 4 s of the 5 s hold
    clock.t = 14.5
    ch.variables({"ups.status": "OL"})
    assert told == [False, True, False]
    for variables, dt in zip(polls, dts, strict=False):
        clock.t += dt
        ch.bank(clock.t, 400.0, 600.0)
        ch.variables(variables)
        state = ch.guard.feed_lost(clock.t)
        assert state is None or told[-1] == state
    assert all(a != b for a, b in zip(told, told[1:]))  # once per change


def test_a_daemon_started_during_an_outage_neither_lifts_nor_marks_until_the_ups_says_which() -> None:
    """Started with the UPS on battery and a delay before its budget is in force: the
    circuit is told nothing (a mark this host made before the restart stays) until the
    delay has passed (lost); started just after an outage, nothing until on line for the
    hold (then lifted)."""
    cfg = UpsConfig(name="ups", on_battery_budget_w=700, on_battery_delay_s=10, online_hold_s=5)
    clock, told = Clock(), []
    ch = UpsChannel(cfg, Sink(), FEED, registry=CollectorRegistry(), clock=clock, on_feed=told.append)
    ch.variables({"ups.status": "OB DISCHRG"})
    clock.t = 9.9
    ch.variables({"ups.status": "OB DISCHRG"})
    assert told == []
    clock.t = 10.5
    ch.variables({"ups.status": "OB DISCHRG"})
    assert told == [True]
    clock, told = Clock(), []
    ch = UpsChannel(cfg, Sink(), FEED, registry=CollectorRegistry(), clock=clock, on_feed=told.append)
    for t in (0.0, 2.0, 4.9):
        clock.t = t
        ch.variables({"ups.status": "OL CHRG"})
    assert told == []
    clock.t = 5.0
    ch.variables({"ups.status": "OL CHRG"})
    assert told == [False]


def test_the_feed_comes_back_with_the_budget_whatever_other_words_come_between() -> None:
    """After an outage the feed is told back exactly when this host's budget is restored
    (on line for the hold): a reading with neither OL nor OB (BYPASS, OFF) restarts
    neither hold; a silence restarts both."""
    cfg = UpsConfig(name="ups", on_battery_budget_w=700, online_hold_s=60)
    clock, told = Clock(), []
    ch = UpsChannel(cfg, Sink(), FEED, registry=CollectorRegistry(), clock=clock, on_feed=told.append)
    ch.variables({"ups.status": "OB DISCHRG"})
    assert told == [True]
    for t in range(5, 70, 5):
        clock.t = float(t)
        ch.variables({"ups.status": "BYPASS" if t % 50 == 0 else "OL"})
    assert ch.constraint.budget_w is None and told == [True, False]  # both back at 65 s (60 s after the first OL)
    ch.variables({"ups.status": "OB"})
    assert told == [True, False, True]
    for t, status in ((70.0, "OL"), (100.0, None), (110.0, "OL"), (160.0, "OL")):
        clock.t = t
        if status is None:
            ch.failed("unreachable", "no answer")
        else:
            ch.variables({"ups.status": status})
    assert told == [True, False, True]  # the silence at 100 s restarted the hold: 50 s of 60
    clock.t = 170.0
    ch.variables({"ups.status": "OL"})
    assert told == [True, False, True, False] and ch.constraint.budget_w is None
