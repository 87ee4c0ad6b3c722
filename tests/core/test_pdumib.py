"""A PDU's integers to watts (core.pdumib) and the plausibility rule's "not watts" and raw
sentinels (core.plausible): the scaling, units and sentinels each vendor's MIB states."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerbudgetd.core.pdumib import (
    APC_DEVICE, APC_OUTLET, RARITAN_INLET_CONFIG, RARITAN_INLET_MEASURE, RARITAN_OUTLET_CONFIG, RARITAN_OUTLET_MEASURE,
    PduError, figure, oids,
)
from powerbudgetd.core.plausible import not_watts, raw_sentinel
from powerbudgetd.core.sensor import LoopParams, MeterLoop


def test_apc_device_power_is_in_hundredths_of_kw() -> None:
    fig = figure("apc", 2, 1, [], {f"{APC_DEVICE}.5.2": 131, f"{APC_DEVICE}.16.2": 140})
    assert (fig.value_w, fig.apparent_va, fig.units, fig.resolution_w, fig.sentinel) == (1310, 1400, "W", 10, False)


def test_apc_outlets_are_in_watts_and_minus_one_is_no_data() -> None:
    values = {f"{APC_OUTLET}.7.3": 410, f"{APC_OUTLET}.7.4": 395}
    fig = figure("apc", 1, 1, [3, 4], values)
    assert fig.value_w == 805 and dict(fig.parts) == {"3": 410, "4": 395}
    assert figure("apc", 1, 1, [3, 4], {**values, f"{APC_OUTLET}.7.4": -1}).sentinel


def raritan_row(measure: str, config: str, n: int, w: int, va: int, digits: int = 1, w_units: int = 3) -> dict:
    out = {}
    for sensor, raw, units in ((5, w, w_units), (6, va, 4)):
        out |= {f"{measure}.2.1.{n}.{sensor}": 1, f"{measure}.4.1.{n}.{sensor}": raw,
                f"{config}.6.1.{n}.{sensor}": units, f"{config}.7.1.{n}.{sensor}": digits}
    return out


def test_raritan_scales_by_each_sensor_s_decimal_digits_and_reads_its_units() -> None:
    fig = figure("raritan", 1, 1, [], raritan_row(RARITAN_INLET_MEASURE, RARITAN_INLET_CONFIG, 1, 12345, 13000))
    assert (fig.value_w, fig.apparent_va, fig.units) == (1234.5, 1300.0, "W")
    fig = figure("raritan", 1, 1, [], raritan_row(RARITAN_INLET_MEASURE, RARITAN_INLET_CONFIG, 1, 900, 950, w_units=4))
    assert fig.units == "VA"
    rows = raritan_row(RARITAN_OUTLET_MEASURE, RARITAN_OUTLET_CONFIG, 2, 2005, 2100) | raritan_row(
        RARITAN_OUTLET_MEASURE, RARITAN_OUTLET_CONFIG, 7, 1000, 1100, digits=0)
    fig = figure("raritan", 1, 1, [2, 7], rows)
    assert fig.value_w == 1200.5 and fig.apparent_va == 1310.0 and dict(fig.parts) == {"2": 200.5, "7": 1000.0}


def test_a_missing_object_or_bad_digits_is_an_error_naming_the_oid() -> None:
    with pytest.raises(PduError) as exc:
        figure("apc", 1, 1, [], {f"{APC_DEVICE}.5.1": 10})
    assert exc.value.cause == "absent" and f"{APC_DEVICE}.16.1" in str(exc.value)
    rows = raritan_row(RARITAN_INLET_MEASURE, RARITAN_INLET_CONFIG, 1, 100, 110, digits=9)
    with pytest.raises(PduError) as exc:
        figure("raritan", 1, 1, [], rows)
    assert exc.value.cause == "garbled"


def test_every_oid_figure_reads_is_one_oids_asks_for() -> None:
    asked = set(oids("raritan", 1, 1, [2]))
    assert set(raritan_row(RARITAN_OUTLET_MEASURE, RARITAN_OUTLET_CONFIG, 2, 1, 1)) == asked
    assert set(oids("apc", 3, 1, [])) == {f"{APC_DEVICE}.5.3", f"{APC_DEVICE}.16.3"}


@given(st.floats(1, 50_000), st.floats(0.2, 1.0))
def test_real_power_above_apparent_power_is_never_watts(va: float, pf: float) -> None:
    assert not_watts(va * pf, "W", va) is None
    assert not_watts(va + 2, "W", va) is not None  # more than a resolution step above: the two are swapped
    assert not_watts(va * pf, "VA", None) is not None


@pytest.mark.parametrize(("raw", "sentinel"), [(-1, True), (0xFFFF, True), (0x7FFFFFFF, True), (0, False),
                                               (131, False)])
def test_raw_sentinels(raw: int, sentinel: bool) -> None:
    assert raw_sentinel(raw) is sentinel


def test_a_rejected_figure_keeps_the_budget_and_the_next_good_one_counts_as_new() -> None:
    loop = MeterLoop("pdu", LoopParams(1200))
    loop.own_draw(0.0, 500)
    loop.poll(1300, 0.0, 1000)
    kept = loop.budget_w
    assert kept is not None
    verdict = loop.reject("not_watts", 1500, "the source gives it in VA, not W")
    assert verdict is not None and verdict.reason == "not_watts" and not verdict.trusted and verdict.changed
    assert "in VA, not W" in verdict.detail and loop.budget_w == kept
    loop.own_draw(1.0, 500)
    again = loop.poll(1300, 1.0, 1000)  # the same value as before the rejection: a new reading, checked again
    assert again is not None and again.plausible and not again.trusted
