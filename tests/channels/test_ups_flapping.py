"""A UPS whose data flaps (DATA-STALE after mains return, as NUT drivers do) is quiet and
truthful: a state change is logged once per change of the budget with the count of
flaps in between, a reason changing under an unchanged budget is not news, and a state
the flapping left unsaid is said once it holds."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from powerbudgetd.channels.ups import SETTLE_S, UpsChannel
from powerbudgetd.config import UpsConfig

CONF_W = 1000.0
FLOOR_W = 600.0


class Sink:
    configured_w = CONF_W

    def offer(self, source: str, budget_w: float, now: float) -> None:
        pass

    def withdraw(self, source: str) -> None:
        pass


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_stale_flapping_after_mains_return_logs_once_per_budget_change_with_the_count() -> None:
    clock = Clock()
    ch = UpsChannel(UpsConfig(name="gpuups", on_battery_budget_w=700, online_hold_s=5), Sink(),
                    registry=CollectorRegistry(), clock=clock)
    with capture_logs() as logs:
        ch.variables({"ups.status": "OL"})
        ch.bank(clock.t, 500.0, FLOOR_W)
        clock.t = 1.0
        ch.variables({"ups.status": "OB DISCHRG"})  # mains lost: 700 W
        # Mains back, and the driver's data flaps: stale, fresh OL, stale, ... for 8 s.
        for i in range(16):
            clock.t = 2.0 + 0.5 * i
            if i % 2:
                ch.variables({"ups.status": "OL CHRG"})
            else:
                ch.failed("stale", "NUTCommandError: ERR DATA-STALE")
            ch.bank(clock.t, 500.0, FLOOR_W)
        assert ch.constraint.budget_w == 700.0  # held through the flapping: the hold needs steady data
        for i in range(12):  # steady on line: restored after the hold
            clock.t = 10.0 + 0.5 * i
            ch.variables({"ups.status": "OL CHRG"})
            ch.bank(clock.t, 500.0, FLOOR_W)
        assert ch.constraint.budget_w is None
    budget = [e for e in logs if e["event"] == "ups_budget"]
    assert [e["budget_w"] for e in budget] == [700.0, None]  # one line per change of the budget, no more
    state = [e for e in logs if e["event"] in ("ups_ok", "ups_unavailable")]
    assert len(state) == 2  # start (ok) and the first stale; the 15 flaps after it are counted
    assert budget[-1]["flaps"] == 15 and budget[-1]["state"] == "ok"


def test_a_state_left_unsaid_by_flapping_is_said_once_it_holds() -> None:
    clock = Clock()
    ch = UpsChannel(UpsConfig(name="gpuups"), Sink(), registry=CollectorRegistry(), clock=clock)
    with capture_logs() as logs:
        ch.variables({"ups.status": "OL"})
        for i, t in enumerate((1.0, 2.0, 3.0)):  # ok -> unreachable -> ok -> unreachable
            clock.t = t
            if i % 2:
                ch.variables({"ups.status": "OL"})
            else:
                ch.failed("unreachable", "OSError: refused")
        clock.t = 3.0 + SETTLE_S
        ch.bank(clock.t, 500.0, FLOOR_W)
        clock.t += 1
        ch.variables({"ups.status": "OL"})  # after it was said, the next change is news again
    state = [(e["event"], e.get("flaps")) for e in logs if e["event"] in ("ups_ok", "ups_unavailable")]
    assert state == [("ups_ok", None), ("ups_unavailable", None), ("ups_unavailable", 2), ("ups_ok", None)]


def test_a_measured_load_the_ups_cannot_give_is_said_once_and_again_when_it_comes() -> None:
    """[ups] measured_load with a [feed], but the UPS gives ups.load without
    ups.realpower.nominal (or a realpower out of bounds): the plug is not held to its
    limit on it, and the operator is told so, once."""
    from powerbudgetd.core.feed import Feed

    clock = Clock()
    feed = Feed(ups_w=2000.0, ups_margin=0.0, psu_efficiency=0.9, host_w=100.0)
    ch = UpsChannel(UpsConfig(name="gpuups"), Sink(), feed, registry=CollectorRegistry(), clock=clock)
    with capture_logs() as logs:
        for i, extra in enumerate([{"ups.load": "40"}, {"ups.load": "41"}, {"ups.realpower": "-5", "ups.load": "42"},
                                   {"ups.load": "42", "ups.realpower.nominal": "2000"}, {"ups.load": "43"}]):
            clock.t = 2.0 * i
            ch.bank(clock.t, 500.0, FLOOR_W)
            ch.variables({"ups.status": "OL", **extra})
    said = [e["event"] for e in logs if e["event"].startswith("ups_measured_load")]
    assert said == ["ups_measured_load_unavailable", "ups_measured_load_available", "ups_measured_load_unavailable"]
    warned = next(e for e in logs if e["event"] == "ups_measured_load_unavailable")
    assert warned["log_level"] == "warning" and "ups.realpower.nominal" in warned["detail"]
    quiet = UpsChannel(UpsConfig(name="gpuups"), Sink(), registry=CollectorRegistry(), clock=clock)  # no [feed]
    with capture_logs() as logs:
        quiet.variables({"ups.status": "OL", "ups.load": "40"})
    assert not [e for e in logs if e["event"].startswith("ups_measured_load")]
