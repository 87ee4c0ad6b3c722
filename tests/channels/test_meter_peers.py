"""More powerbudgetd hosts behind one meter than its ``hosts`` says, without a circuit:
each daemon announces the meters it reads over MQTT, and a host whose loop assumes
fewer hosts is warned, naming the others and the setting; check-config says which rule
applies (the configured hosts / share, or a power-tree node's meter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog

from powerbudgetd.channels.mqtt.peers import MeterPeers
from powerbudgetd.config import load_config
from powerbudgetd.core.sensor import Reach
from powerbudgetd.core.tree import Host, Node, PowerTree
from powerbudgetd.service.checkconfig import meter_reach_lines, tree_place

UPS = "ups:rack@nut1"


def announce(peers: MeterPeers, node: str, meters: list[str] | None) -> None:
    peers.on_announcement(f"powerbudgetd/meters/{node}", b"" if meters is None else json.dumps(
        {"node_id": node, "host": node, "pid": 1, "meters": meters}).encode())


def test_a_second_host_behind_a_meter_configured_for_one_is_warned_of_once_by_name():
    peers = MeterPeers("gpu1", "powerbudgetd/meters")
    with structlog.testing.capture_logs() as logs:
        peers.read({UPS: (Reach(), "[ups]")})
        announce(peers, "gpu1", [UPS])  # our own, echoed: not another host
        announce(peers, "nas", ["mqtt:tele/nas/SENSOR"])  # another meter
        assert not [e for e in logs if e["event"].startswith("meter_shared")]
        announce(peers, "gpu2", [UPS])
        announce(peers, "gpu2", [UPS])  # again (a reconnect): said once
        warned = [e for e in logs if e["event"] == "meter_shared_unconfigured"]
        assert len(warned) == 1 and warned[0]["log_level"] == "warning"
        assert warned[0]["others"] == ["gpu2"] and warned[0]["hosts_seen"] == 2 and "[ups] hosts = 2" in warned[0]["detail"]
        announce(peers, "gpu3", [UPS, "mqtt:x"])  # a third: said again, with the new count
        assert [e["hosts_seen"] for e in logs if e["event"] == "meter_shared_unconfigured"] == [2, 3]
        announce(peers, "gpu2", None)  # gone (its goodbye cleared the retained announcement)
        announce(peers, "gpu3", None)
        assert [e["event"] for e in logs][-1] == "meter_shared_resolved"


def test_hosts_or_a_share_that_accounts_for_them_is_not_warned_of():
    for reach in (Reach(hosts=3), Reach(share=0.5)):
        peers = MeterPeers("gpu1", "powerbudgetd/meters")
        with structlog.testing.capture_logs() as logs:
            peers.read({UPS: (reach, "[ups]")})
            announce(peers, "gpu2", [UPS])
            announce(peers, "gpu3", [UPS])
        assert not [e for e in logs if e["event"] == "meter_shared_unconfigured"], reach
    peers = MeterPeers("gpu1", "powerbudgetd/meters")
    with structlog.testing.capture_logs() as logs:
        peers.read({UPS: (Reach(hosts=2), "[ups]")})
        announce(peers, "gpu2", [UPS])
        announce(peers, "gpu3", [UPS])  # three behind a meter set for two
    assert [e["hosts_seen"] for e in logs if e["event"] == "meter_shared_unconfigured"] == [3]


@pytest.mark.parametrize("payload", [b"[]", b'{"meters": "ups:x@y"}', b'{"meters": [1]}', b"not json",
                                     json.dumps({"meters": ["a:b"] * 17}).encode()])
def test_a_malformed_announcement_is_refused(payload: bytes):
    peers = MeterPeers("gpu1", "powerbudgetd/meters")
    with pytest.raises(ValueError):
        peers.on_announcement("powerbudgetd/meters/gpu2", payload)
    assert peers.peers == {}
    assert peers.is_peer_topic("powerbudgetd/meters/gpu2") and not peers.is_peer_topic("powerbudgetd/meters/a/b")
    assert not peers.is_peer_topic("powerbudgetd/meters") and not peers.is_peer_topic("powerbudgetd/gpu2/state")


CONFIG = """budget_w = 1000
[feed]
breaker_a = 15
volts = 120
psu_efficiency = 0.9
host_w = 200
[ups]
host = "nut1"
name = "rack"
"""


def _settings(tmp_path: Path, text: str):
    (tmp_path / "machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    text = text.replace("[circuit]\n", f'[circuit]\nmachine_id_file = "{tmp_path / "machine-id"}"\n', 1)
    p = tmp_path / "pb.toml"
    p.write_text(text)
    return load_config(p, euid=1000)


def test_check_config_says_which_rule_applies_to_each_meter(tmp_path: Path):
    lines = meter_reach_lines(_settings(tmp_path, CONFIG))
    assert lines[0].startswith("UPS measured load (ups:rack@nut1): the meter is this host's alone")
    assert "without [mqtt] no other host behind it is seen" in lines[1]
    mqtt = CONFIG + '[mqtt]\nhost = "127.0.0.1"\nnode_id = "gpu1"\n'
    lines = meter_reach_lines(_settings(tmp_path, mqtt))
    assert "seen on powerbudgetd/meters/+: more than 1 without a share, or loop gains summing above 1" in lines[1]
    circuit = mqtt + ('[circuit]\nname = "row"\nendpoints = ["127.0.0.1:2379"]\nhost = "gpu1"\nreserve_w = 800\n'
                      'psu_efficiency = 0.9\nhost_w = 100\n')
    s = _settings(tmp_path, circuit.replace("[ups]\n", "[ups]\nhosts = 2\n"))
    lines = meter_reach_lines(s)
    assert "shared by 2 controlled hosts" in lines[0] and "meter = 'ups:rack@nut1'" in lines[2]
    # --tree: the node that names it
    nodes = {"root": Node("root", 5000.0), "A": Node("A", 2000.0, "root", meter=UPS), "B": Node("B", 2000.0, "root")}
    tree = PowerTree(nodes, {"gpu1": Host("gpu1", {"A": 1.0}, 800.0), "gpu2": Host("gpu2", {"B": 1.0}, 800.0)})
    out, problems = tree_place(s, tree)
    assert not problems and any("ups:rack@nut1 is the meter of node A: this host publishes" in x for x in out), out
    moved = PowerTree(nodes, {"gpu1": Host("gpu1", {"B": 1.0}, 800.0), "gpu2": Host("gpu2", {"A": 1.0}, 800.0)})
    out, problems = tree_place(s, moved)
    assert problems == ["UPS measured load ups:rack@nut1 is the meter of node A, which is not on this host's cords' "
                        "paths: its reading would count another branch's hosts"]
    bare = PowerTree({**nodes, "A": Node("A", 2000.0, "root")}, tree.hosts)
    out, _ = tree_place(s, bare)
    assert any("no node of the tree names it" in x for x in out)


def test_a_loopback_upsd_is_named_by_this_machine(tmp_path: Path):
    import socket

    s = _settings(tmp_path, CONFIG.replace('host = "nut1"', 'host = "127.0.0.1"'))
    assert s.ups is not None and s.ups.source_id() == f"ups:rack@{socket.gethostname().split('.')[0]}"


def announce_gains(peers: MeterPeers, node: str, gains: dict[str, float]) -> None:
    peers.on_announcement(f"powerbudgetd/meters/{node}", json.dumps(
        {"node_id": node, "host": node, "pid": 1, "meters": sorted(gains), "gains": gains}).encode())


@pytest.mark.parametrize("mine, theirs", [
    (Reach(hosts=2, share=1.0), [0.5]),  # a share of 1 beside another host
    (Reach(share=0.5), [0.5, 0.5]),  # half each, on three hosts
    (Reach(share=0.6), [1.0]),  # the other left at the default: the whole excess
])
def test_hosts_whose_loop_gains_sum_above_one_are_warned_of(mine: Reach, theirs: list[float]):
    peers = MeterPeers("gpu1", "powerbudgetd/meters")
    with structlog.testing.capture_logs() as logs:
        peers.read({UPS: (mine, "[ups]")})
        for i, gain in enumerate(theirs):
            announce_gains(peers, f"gpu{i + 2}", {UPS: gain})
        warned = [e for e in logs if e["event"] == "meter_shared_unconfigured"]
        assert warned and warned[-1]["gains_sum"] == pytest.approx(mine.fraction + sum(theirs), abs=1e-3)
        assert "share" in warned[-1]["detail"]
        for i in range(len(theirs)):
            announce(peers, f"gpu{i + 2}", None)
        assert [e["event"] for e in logs][-1] == "meter_shared_resolved"


def test_shares_that_sum_to_one_are_not_warned_of_and_each_host_announces_its_gain():
    peers = MeterPeers("gpu1", "powerbudgetd/meters")
    with structlog.testing.capture_logs() as logs:
        peers.read({UPS: (Reach(share=0.5), "[ups]")})
        announce_gains(peers, "gpu2", {UPS: 0.3})
        announce_gains(peers, "gpu3", {UPS: 0.2})
    assert not [e for e in logs if e["event"] == "meter_shared_unconfigured"]
    assert peers.announcement()["gains"] == {UPS: 0.5}
    with pytest.raises(ValueError, match="gains"):
        peers.on_announcement("powerbudgetd/meters/gpu4", json.dumps({"meters": [UPS], "gains": {UPS: 2}}).encode())
