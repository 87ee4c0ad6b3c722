"""``circuit status``: a host's grant lowered by another writer is flagged, and its
figures still count (``service.circuitcmd.status_doc``)."""

from __future__ import annotations

from powerbudgetd.channels.circuit.store import HostRecord, Read, Spec
from powerbudgetd.core.circuit import CircuitView
from powerbudgetd.core.tree import Host, Node, PowerTree


def _read(a_record_grant_w: float, a_caps_w: float, a_grant_w: float = 100.0) -> Read:
    """A 1000 W circuit and PDU; host a (seat 200 W) holds ``a_grant_w``, host b (seat
    200 W) 450 W. a's record was published under ``a_record_grant_w`` with caps
    ``a_caps_w`` (draw 20 W below); b's under its grant (caps 650 W)."""
    seats, grants = {"a": 200.0, "b": 200.0}, {"a": a_grant_w, "b": 450.0}
    tree = PowerTree({"pdu": Node("pdu", 1_000.0)}, {h: Host(h, {"pdu": 1.0}, 200.0) for h in seats})
    view = CircuitView(1_000.0, seats, grants, {"a": 100.0, "b": 450.0}, revision=9, tree=tree.with_reserves(seats))
    records = {"a": HostRecord(100.0, caps_w=a_caps_w, draw_w=a_caps_w - 20, seat_w=200.0, grant_w=a_record_grant_w,
                               lease=1),
               "b": HostRecord(450.0, caps_w=650.0, draw_w=630.0, seat_w=200.0, grant_w=450.0, lease=2)}
    return Read(Spec(1_000.0, 6), view, 9, leases={"a": 1, "b": 2}, records=records)


def test_a_grant_lowered_under_a_host_by_another_writer_is_flagged_and_its_figures_still_count():
    """a's grant went from 400 W to 100 W by another writer (an operator): its record,
    caps 600 W, is still what its cards may hold. The circuit is over (1250 W of caps),
    and the status says so, with a flagged."""
    from powerbudgetd.service.circuitcmd import status_doc

    doc = status_doc("lab", _read(400.0, 600.0), {1: (5, 6), 2: (5, 6)})
    a = next(r for r in doc["hosts"] if r["host"] == "a")
    assert a["flags"] == ["lowered"] and doc["flags"]["lowered"] == ["a"]
    assert doc["caps_w"] == 1_250.0 and doc["draw_w"] == 1_210.0
    assert doc["within_budget"] is False and doc["nodes"][0]["within_budget"] is False


def test_a_host_that_lowered_its_own_grant_is_not_flagged():
    """a lowered its grant itself: its record went with it (caps 300 W under 100 W), and
    the circuit is within its budget."""
    from powerbudgetd.service.circuitcmd import status_doc

    doc = status_doc("lab", _read(100.0, 300.0), {1: (5, 6), 2: (5, 6)})
    assert doc["flags"]["lowered"] == [] and doc["caps_w"] == 950.0 and doc["within_budget"] is True
    # A grant is stored whole, a record to 0.1 W: 100.06 W published as 100.1 W is the same.
    doc = status_doc("lab", _read(round(100.06, 1), 300.0, a_grant_w=100.06), {1: (5, 6), 2: (5, 6)})
    assert doc["flags"]["lowered"] == []
