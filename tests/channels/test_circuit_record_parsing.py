"""Bounded parsing of the circuit's values in etcd: whatever bytes are there, a record or
BadRecord, in bounded time and memory; never another exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.channels.circuit import records
from powerbudgetd.channels.circuit.records import BadRecord
from support.examples import examples


@pytest.mark.parametrize(("value", "why"), [
    (b"[" * 100_000 + b"]" * 100_000, "200000 bytes, more than 4096"),
    (b"[" * 1000 + b"]" * 1000, "nested more than 4 deep"),
    (b'{"a": {"b": {"c": {"d": {"e": 1}}}}}', "nested more than 4 deep"),
    (b'{"want_w": Infinity}', "non-finite number Infinity"),
    (b'{"want_w": NaN}', "non-finite number NaN"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "a JSON list, not an object"),
    (b"", "not JSON"),
])
def test_values_no_daemon_could_have_written_are_refused_with_why(value: bytes, why: str) -> None:
    with pytest.raises(BadRecord, match=why):
        records.parse(value)


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    assert records.parse(b'{"host": "[[[[[[{{{{\\"]]"}') == {"host": '[[[[[[{{{{"]]'}


@pytest.mark.parametrize(("doc", "why"), [
    ({"w": "800"}, "not a number"),
    ({"w": True}, "not a number"),
    ({"w": -1}, "outside"),
    ({"w": 1e9}, "outside"),
    ({"w": 10**400}, "too large"),
    ({}, "not a number"),
])
def test_watts_are_finite_numbers_within_bounds(doc: dict, why: str) -> None:
    with pytest.raises(BadRecord, match=why):
        records.watts(doc, "w")


def test_an_absent_optional_field_is_none_and_text_is_short_and_printable() -> None:
    assert records.watts({}, "w", optional=True) is None
    assert records.watts({"w": 800}, "w") == 800.0
    assert records.text({"id": "abc"}, "id") == "abc"
    for bad in ("", "\x1b]52;c;", "x" * 129, 5):
        with pytest.raises(BadRecord):
            records.text({"id": bad}, "id")


def test_what_the_daemon_writes_it_reads_back_and_never_writes_a_non_finite_number() -> None:
    assert records.parse(records.dumps(reserve_w=800.5, ttl_s=30)) == {"reserve_w": 800.5, "ttl_s": 30}
    with pytest.raises(ValueError):
        records.dumps(grant_w=float("nan"))


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(st.binary(max_size=6000), st.text(alphabet='[]{}":,0123456789.eE-+ INafinty\\', max_size=300)
                 .map(str.encode)))
def test_any_bytes_give_a_record_or_bad_record(value: bytes) -> None:
    try:
        doc = records.parse(value)
    except BadRecord:
        return
    assert isinstance(doc, dict)
