"""``circuit status``: a host that gave a grant back since it last published is not
taken for a circuit over budget (``service.circuitcmd.status_doc``)."""

from __future__ import annotations

from powerbudgetd.channels.circuit.store import HostRecord, Read, Spec
from powerbudgetd.core.circuit import CircuitView
from powerbudgetd.core.tree import Host, Node, PowerTree


def _read(b_caps_w: float) -> Read:
    """A 1000 W circuit and PDU; host a (seat 200 W) gave 300 W of its 400 W grant back to
    b (seat 200 W, grant 450 W), whose raise followed. a's record was published under
    the 400 W grant (caps 600 W, draw 580 W), b's under its new one (caps ``b_caps_w``)."""
    seats, grants = {"a": 200.0, "b": 200.0}, {"a": 100.0, "b": 450.0}
    tree = PowerTree({"pdu": Node("pdu", 1_000.0)}, {h: Host(h, {"pdu": 1.0}, 200.0) for h in seats})
    view = CircuitView(1_000.0, seats, grants, {"a": 100.0, "b": 450.0}, revision=9, tree=tree.with_reserves(seats))
    records = {"a": HostRecord(400.0, caps_w=600.0, draw_w=580.0, seat_w=200.0, grant_w=400.0, lease=1),
               "b": HostRecord(450.0, caps_w=b_caps_w, draw_w=b_caps_w - 20, seat_w=200.0, grant_w=450.0, lease=2)}
    return Read(Spec(1_000.0, 6), view, 9, leases={"a": 1, "b": 2}, records=records)


def test_a_record_published_before_its_grant_was_lowered_counts_at_seat_plus_grant_until_it_publishes_again():
    from powerbudgetd.service.circuitcmd import status_doc

    doc = status_doc("lab", _read(650.0), {1: (5, 6), 2: (5, 6)})
    a = next(r for r in doc["hosts"] if r["host"] == "a")
    assert a["caps_w"] == 600.0 and a["draw_w"] == 580.0  # as published
    assert a["flags"] == ["lowered"] and doc["flags"]["lowered"] == ["a"]
    assert doc["caps_w"] == 300.0 + 650.0 and doc["draw_w"] == 300.0 + 630.0  # a at its 200 W seat + 100 W grant
    assert doc["within_budget"] is True
    (pdu,) = doc["nodes"]
    assert pdu["caps_w"] == 950.0 and pdu["draw_w"] == 930.0 and pdu["within_budget"] is True


def test_a_host_over_what_it_holds_under_its_current_grant_is_still_over():
    """b's record is of its current grant: its caps, 900 W on a 650 W seat and grant, are
    counted as published, and the circuit is over."""
    from powerbudgetd.service.circuitcmd import status_doc

    doc = status_doc("lab", _read(900.0), {1: (5, 6), 2: (5, 6)})
    assert doc["flags"]["lowered"] == ["a"] and "lowered" not in next(r for r in doc["hosts"] if r["host"] == "b")["flags"]
    assert doc["caps_w"] == 1_200.0 and doc["within_budget"] is False and doc["nodes"][0]["within_budget"] is False
