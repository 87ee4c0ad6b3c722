"""The UPS state machine (core.ups): clock-free, fed NUT variables, answering a budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.core.feed import next_wall_budget_w
from powerbudgetd.core.ups import (
    BOUNDS,
    REASONS,
    UpsGuard,
    UpsParams,
    parse_status,
    parse_vars,
)
from support.examples import examples

CONF_W = 1000.0
FLOOR_W = 600.0


def guard(**kw) -> UpsGuard:  # type: ignore[no-untyped-def]
    return UpsGuard(UpsParams(**kw))


def feed(g: UpsGuard, now: float, status: str | None, board_w: float | None = 500.0, **extra: str) -> None:
    variables = dict(extra)
    if status is not None:
        variables["ups.status"] = status
    g.observe(parse_vars(variables), now, board_w=board_w, configured_w=CONF_W)


def budget(g: UpsGuard, now: float) -> tuple[float | None, str | None]:
    c = g.evaluate(now, CONF_W, FLOOR_W)
    return c.budget_w, c.reason


def test_parse_status_known_and_unknown_flags() -> None:
    assert parse_status("OL CHRG") == (frozenset({"OL", "CHRG"}), frozenset())
    assert parse_status("ob lb WEIRD") == (frozenset({"OB", "LB"}), frozenset({"WEIRD"}))
    assert parse_status("") is None
    assert parse_status("OL\nOB") is None  # not printable
    assert parse_status("X " * 200) is None


def test_parse_vars_bounds_and_rejects() -> None:
    r = parse_vars({"ups.status": "OL", "ups.load": "42.5", "ups.realpower": "nan", "battery.charge": "101",
                    "battery.runtime": "1e99", "ups.realpower.nominal": "900"})
    assert r.flags == frozenset({"OL"})
    assert r.load_pct == 42.5 and r.realpower_w is None and r.battery_charge_pct is None
    assert r.battery_runtime_s is None and r.realpower_nominal_w == 900
    assert set(r.rejected) == {"ups.realpower", "battery.charge", "battery.runtime"}
    assert r.wall_w() == pytest.approx(382.5)  # load % x nominal when realpower is unusable
    assert parse_vars({}).flags is None


def test_online_no_constraint() -> None:
    g = guard()
    feed(g, 0.0, "OL CHRG")
    assert budget(g, 0.0) == (None, None)


def test_on_battery_drops_at_once_and_restores_after_hold() -> None:
    g = guard(on_battery_w=700.0, online_hold_s=60.0)
    feed(g, 0.0, "OB DISCHRG")
    assert budget(g, 0.0) == (700.0, "ups_on_battery")
    feed(g, 10.0, "OL CHRG")
    assert budget(g, 10.0) == (700.0, "ups_on_battery")  # the hold runs
    feed(g, 69.0, "OL CHRG")
    assert budget(g, 69.0) == (700.0, "ups_on_battery")
    feed(g, 70.0, "OL CHRG")
    assert budget(g, 70.0) == (None, None)


def test_on_battery_delay_and_flicker() -> None:
    g = guard(on_battery_fraction=0.6, on_battery_delay_s=5.0, online_hold_s=30.0)
    feed(g, 0.0, "OB")
    assert budget(g, 0.0) == (None, None)
    feed(g, 2.0, "OL")  # a flicker shorter than the delay: nothing
    feed(g, 3.0, "OB")
    feed(g, 7.0, "OB")
    assert budget(g, 7.0) == (None, None)  # the delay restarted at 3 s
    feed(g, 8.0, "OB")
    assert budget(g, 8.0) == (600.0, "ups_on_battery")
    feed(g, 10.0, "OL")
    feed(g, 20.0, "OB")  # back on battery during the hold: the hold starts over
    feed(g, 41.0, "OL")
    assert budget(g, 41.0)[0] == 600.0
    feed(g, 71.0, "OL")
    assert budget(g, 71.0) == (None, None)


@pytest.mark.parametrize(("flag", "reason"), [("LB", "ups_low_battery"), ("FSD", "ups_forced_shutdown"),
                                               ("OVER", "ups_overload")])
def test_floor_flags_take_the_bank_to_its_floor(flag: str, reason: str) -> None:
    g = guard(online_hold_s=10.0)
    feed(g, 0.0, f"OL {flag}")
    assert budget(g, 0.0) == (FLOOR_W, reason)
    assert g.evaluate(0.0, CONF_W, None).budget_w == 0.0  # floor unknown: 0 W, the arbiter holds the minimums
    feed(g, 1.0, "OL")
    assert budget(g, 5.0) == (FLOOR_W, reason)  # held until clear for the hold
    feed(g, 11.0, "OL")
    assert budget(g, 11.0) == (None, None)


def test_fsd_outranks_low_battery() -> None:
    g = guard()
    feed(g, 0.0, "OB LB")
    feed(g, 1.0, "OB LB FSD")
    assert budget(g, 1.0) == (FLOOR_W, "ups_forced_shutdown")


def test_silence_keeps_what_is_in_force_and_blocks_the_restore() -> None:
    g = guard(on_battery_w=700.0, online_hold_s=10.0)
    feed(g, 0.0, "OB")
    feed(g, 1.0, "OL")
    g.silence(5.0)
    assert budget(g, 20.0) == (700.0, "ups_stale")  # kept, and the hold did not run through the silence
    feed(g, 21.0, "OL")
    assert budget(g, 21.0) == (700.0, "ups_on_battery")  # the hold starts over with fresh data
    feed(g, 31.0, "OL")
    assert budget(g, 31.0) == (None, None)


def test_silence_without_constraint_keeps_none_unless_stale_as_on_battery() -> None:
    g = guard()
    feed(g, 0.0, "OL")
    g.silence(1.0)
    assert budget(g, 1.0) == (None, None)
    g = guard(stale_as_on_battery=True, on_battery_w=650.0, on_battery_delay_s=2.0)
    feed(g, 0.0, "OL")
    g.silence(1.0)
    assert budget(g, 1.0) == (None, None)
    g.silence(3.0)
    assert budget(g, 3.0) == (650.0, "ups_stale")


def test_missing_status_is_a_silence() -> None:
    g = guard(stale_as_on_battery=True, on_battery_w=650.0)
    feed(g, 0.0, None, **{"ups.load": "10"})
    assert g.silent and budget(g, 0.0) == (650.0, "ups_stale")


def test_unknown_words_only_move_nothing() -> None:
    """A status of words NUT does not define: the UPS's state is unknown, so no hold
    toward a restore runs (a low battery stays at the floor)."""
    g = guard(online_hold_s=1.0)
    feed(g, 0.0, "OB LB")
    for t in range(1, 10):
        feed(g, float(t), "WHATEVER 0", **{"ups.realpower": "0"})
    assert g.silent and budget(g, 9.0) == (FLOOR_W, "ups_low_battery")


def test_measured_load_is_wall_truth_like_a_meter() -> None:
    # plug-side limit 800 W, PSU efficiency 0.9, the GPUs draw 500 W of board power.
    # At 700 W on the UPS, the rest of the host draws 700 - 500 / 0.9 = 144 W: the feed
    # leaves (800 - 144) x 0.9 = 590 W of board power, under the 1000 W configured.
    g = guard(wall_limit_w=800.0, psu_efficiency=0.9, hysteresis_w=20.0)
    feed(g, 0.0, "OL", board_w=500.0, **{"ups.realpower": "700"})
    b, reason = budget(g, 0.0)
    assert reason == "ups_measured_load" and b == pytest.approx(590 - 20)
    # Above the limit (900 W): lower than the GPUs draw now, by the excess in board watts.
    g = guard(wall_limit_w=800.0, psu_efficiency=0.9, hysteresis_w=20.0)
    feed(g, 0.0, "OL", board_w=500.0, **{"ups.realpower": "900"})
    b, reason = budget(g, 0.0)
    assert reason == "ups_measured_load" and b == pytest.approx(500 - 100 * 0.9 - 20)
    # A light host: the feed allows more than the configured budget, nothing binds.
    g = guard(wall_limit_w=1500.0, psu_efficiency=0.9, hysteresis_w=20.0)
    feed(g, 0.0, "OL", board_w=500.0, **{"ups.load": "40", "ups.realpower.nominal": "1500"})
    assert budget(g, 0.0) == (None, None)


def test_next_wall_budget_w_band() -> None:
    assert next_wall_budget_w(None, 1200, 1000, 20) is None
    assert next_wall_budget_w(None, 900, 1000, 20) == 880
    assert next_wall_budget_w(880, 905, 1000, 20) == 880  # inside the band: no change
    assert next_wall_budget_w(880, 925, 1000, 20) == 905  # a full band more: rise
    assert next_wall_budget_w(880, 1025, 1000, 20) is None  # configured + band: stop limiting
    assert next_wall_budget_w(880, 1010, 1000, 20) == 990


def test_params_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="online_hold_s"):
        UpsParams(online_hold_s=-1)
    with pytest.raises(ValueError, match="on_battery"):
        UpsParams(on_battery_w=None, on_battery_fraction=None)


# -- fuzz: nothing NUT sends can raise the budget or crash the machine ----------------
NAMES = ["ups.status", *(b[0] for b in BOUNDS), "ups.mfr", "input.frequency"]
texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["OL", "OB", "LB", "FSD", "OVER", "OL OB", "OB LB", "CHRG", "", "nan", "inf", "-inf", "1e308",
                     "-5", "0", "100", "99999999999", "OL\x00", "ALARM OL", "BOGUS", "OB DISCHRG FOO"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-10**30, max_value=10**30).map(str),
)
events = st.lists(
    st.one_of(
        st.tuples(st.just("vars"), st.dictionaries(st.sampled_from(NAMES), texts, max_size=8),
                  st.one_of(st.none(), st.floats(0, 5000))),
        st.tuples(st.just("silence"), st.none(), st.none()),
    ),
    max_size=30,
)


@settings(max_examples=examples(400), deadline=None)
@given(
    events=events,
    dt=st.lists(st.floats(0, 100), min_size=30, max_size=30),
    configured_w=st.floats(100, 5000),
    floor_w=st.one_of(st.none(), st.floats(0, 5000)),
    on_battery_w=st.one_of(st.none(), st.floats(0, 10000)),
    stale_as_on_battery=st.booleans(),
    wall_limit_w=st.one_of(st.none(), st.floats(1, 20000)),
)
def test_fuzz_never_above_configured_never_raises(events, dt, configured_w, floor_w, on_battery_w,  # type: ignore[no-untyped-def]
                                                  stale_as_on_battery, wall_limit_w) -> None:
    g = UpsGuard(UpsParams(on_battery_w=on_battery_w, on_battery_fraction=None if on_battery_w is not None else 0.5,
                           stale_as_on_battery=stale_as_on_battery, wall_limit_w=wall_limit_w, online_hold_s=5.0))
    now = 0.0
    for (kind, variables, board_w), step in zip(events, dt, strict=False):
        now += step
        if kind == "vars":
            reading = parse_vars(variables)
            assert reading.flags is None or reading.flags <= {"OL", "OB", "LB", "HB", "RB", "CHRG", "DISCHRG", "BYPASS",
                                                              "CAL", "OFF", "OVER", "TRIM", "BOOST", "FSD", "ALARM",
                                                              "TEST", "ECO"}
            g.observe(reading, now, board_w=board_w, configured_w=configured_w)
        else:
            g.silence(now)
        c = g.evaluate(now, configured_w, floor_w)
        if c.budget_w is None:
            assert c.reason is None
        else:
            assert 0.0 <= c.budget_w <= configured_w
            assert c.reason in REASONS


# -- NUT's semantics --------------------------------------------------------------------
def test_ol_dischrg_is_on_battery_only_with_a_falling_charge() -> None:
    g = guard(on_battery_w=700.0)
    feed(g, 0.0, "OL DISCHRG", **{"battery.charge": "97"})
    assert budget(g, 0.0) == (None, None)  # nothing fell yet
    feed(g, 2.0, "OL DISCHRG", **{"battery.charge": "95"})
    assert budget(g, 2.0) == (700.0, "ups_on_battery") and g.evidence == "OL DISCHRG"
    feed(g, 4.0, "OL DISCHRG", **{"battery.charge": "95"})  # a 1 % step: still discharging
    assert g.evidence == "OL DISCHRG"


@pytest.mark.parametrize("flag", ["CHRG", "CAL"])
def test_ol_dischrg_with_chrg_or_cal_is_not_on_battery(flag: str) -> None:
    g = guard(on_battery_w=700.0)
    feed(g, 0.0, f"OL DISCHRG {flag}", **{"battery.charge": "97"})
    feed(g, 2.0, f"OL DISCHRG {flag}", **{"battery.charge": "95"})
    assert budget(g, 2.0) == (None, None) and g.evidence is None


def test_ol_with_no_input_voltage_is_on_battery() -> None:
    g = guard(on_battery_w=700.0)
    feed(g, 0.0, "OL CHRG", **{"input.voltage": "0"})
    assert budget(g, 0.0) == (700.0, "ups_on_battery") and g.evidence == "input.voltage"


def test_wait_is_no_status_and_no_unknown_flag() -> None:
    r = parse_vars({"ups.status": "WAIT"})
    assert r.waiting and r.flags == frozenset() and r.unknown_flags == frozenset()


@pytest.mark.parametrize("runtime", ["65535", "3932100", "4294967295", "9000000"])
def test_a_sentinel_runtime_is_rejected(runtime: str) -> None:
    r = parse_vars({"ups.status": "OL", "battery.runtime": runtime})
    assert r.battery_runtime_s is None and "battery.runtime" in r.rejected
