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


# -- the power tree's key ----------------------------------------------------------------

TREE_DOC = {
    "nodes": {"root": {"budget_w": 10000, "parent": None, "kind": "panel"},
              "A": {"budget_w": 7000, "parent": "root", "kind": "pdu"},
              "B": {"budget_w": 7000, "parent": "root", "kind": "pdu"}},
    "hosts": {"h1": {"cords": {"A": 0.5, "B": 0.5}, "priority": 1}, "h2": {"cords": {"A": 1.0}, "priority": 0}},
    "pairs": [{"feeds": ["A", "B"], "mode": "oversubscribed", "shed_s": 2.0}],
}


def test_a_tree_written_is_read_back_with_the_seats_as_reserves() -> None:
    import json

    from powerbudgetd.channels.circuit.store import tree_doc, tree_from_doc

    tree = tree_from_doc(TREE_DOC, {"h1": 900.0})
    assert tree.hosts["h1"].reserve_w == 900.0 and tree.hosts["h2"].reserve_w == 0.0
    assert tree.mode_of("h1") == "oversubscribed" and tree.hosts["h1"].priority == 1
    again = tree_from_doc(records.parse(json.dumps(tree_doc(tree)).encode(), records.MAX_TREE_BYTES), {"h1": 900.0})
    assert again == tree


@pytest.mark.parametrize(("change", "why"), [
    (lambda d: d.update(nodes=[]), "nodes and hosts must be objects"),
    (lambda d: d["nodes"]["A"].update(kind="fuse"), "nodes.A: parent must be a node's name, kind one of"),
    (lambda d: d["nodes"]["A"].update(budget_w=-5), "budget_w: -5 W outside"),
    (lambda d: d["hosts"]["h2"].update(cords={"C": 1.0}), "hosts.h2.cords: no node 'C'"),
    (lambda d: d["hosts"]["h2"].update(cords={"A": 1.5}), "A: 1.5  outside"),
    (lambda d: d["hosts"]["h2"].update(priority=True), "hosts.h2: cords must be an object, priority a whole number"),
    (lambda d: d["pairs"][0].update(mode="both"), r"pairs\[0\]: two feeds and a mode"),
    (lambda d: d["nodes"]["root"].update(parent="A"), "exactly one root"),
])
def test_a_tree_no_init_could_have_written_is_refused_naming_what(change, why: str) -> None:
    import copy

    from powerbudgetd.channels.circuit.store import tree_from_doc

    doc = copy.deepcopy(TREE_DOC)
    change(doc)
    with pytest.raises(BadRecord, match=why):
        tree_from_doc(doc, {})


_junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                     max_leaves=10)
_names = st.sampled_from(["r", "A", "B", "x"])
_nodes = st.dictionaries(_names, st.fixed_dictionaries(
    {"budget_w": _junk | st.floats(0, 1e4)}, optional={"parent": st.none() | _names | _junk, "kind": st.sampled_from(
        ["pdu", "site", "fuse"]) | _junk}) | _junk, max_size=4)
_hosts = st.dictionaries(st.text(max_size=3), st.fixed_dictionaries(
    {"cords": st.dictionaries(_names, st.floats(0, 1) | _junk, max_size=2) | _junk},
    optional={"priority": st.integers(-200, 200) | _junk}) | _junk, max_size=3)
_pairs = st.lists(st.fixed_dictionaries({"feeds": st.lists(_names, max_size=3) | _junk,
                                         "mode": st.sampled_from(["redundant", "oversubscribed"]) | _junk},
                                        optional={"shed_s": st.floats(0, 10) | _junk}) | _junk, max_size=2)


@settings(max_examples=examples(300), deadline=None)
@given(st.fixed_dictionaries({"nodes": _nodes | _junk, "hosts": _hosts | _junk}, optional={"pairs": _pairs | _junk}))
def test_any_tree_value_gives_a_tree_or_bad_record(doc) -> None:
    """Whatever ``tree`` holds (as parsed JSON), a power tree or BadRecord; never
    another exception (a TypeError would stop the daemon's round)."""
    from powerbudgetd.channels.circuit.store import tree_from_doc

    try:
        tree_from_doc(doc, {})
    except BadRecord:
        pass
