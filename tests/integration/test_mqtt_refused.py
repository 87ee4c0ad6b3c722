"""A broker whose ACL refuses the daemon's topics (a real Mosquitto with an ACL file): each
refused publish and subscription is warned once per topic, naming it and the broker's
reason (PUBACK 135, "Not authorized"), however often it is refused again (every session
publishes availability and discovery anew). Mosquitto grants any subscription and filters
what it delivers, so SUBACK refusals are checked in tests/channels."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from powerbudgetd.service.logs import configure_logging
from support.broker_daemon import BASE, running, write_config
from support.mqtt import Mosquitto, watching
from support.paths import REPO

pytestmark = pytest.mark.slow  # a real Mosquitto

# Anonymous clients may read our topics but write none, and neither read nor write
# Home Assistant's discovery topics.
ACL = "topic read powerbudgetd/#\n"


@pytest.fixture(autouse=True)
def _every_log_level(_quiet_logs: None) -> None:
    configure_logging(level="debug", stream=io.StringIO(), json=True)


async def test_refused_publishes_and_subscriptions_are_warned_once_per_topic(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path, acl=ACL)
    broker.start()
    try:
        with capture_logs() as logs:
            async with running(write_config(tmp_path, broker.port)) as r:
                def refused(topic: str) -> int:
                    return sum(e["event"] == "mqtt_refused" and e["topic"] == topic for e in logs)

                await r.until(lambda: refused(f"{BASE}/gpu/3/availability"), 15, "the refusals of a session")
                # The broker restarted: a new session publishes (and is refused) all over again.
                broker.kill()
                broker.start()
                sessions = sum(e["event"] == "mqtt_connected" for e in logs)
                await r.until(lambda: sum(e["event"] == "mqtt_connected" for e in logs) > sessions, 15, "reconnected")
                await asyncio.sleep(2.0)
    finally:
        broker.kill()
    refused = [e for e in logs if e["event"] == "mqtt_refused"]
    once = Counter((e["action"], e["topic"]) for e in refused)
    assert once and max(once.values()) == 1, once
    availability = next(e for e in refused if e["topic"] == f"{BASE}/availability")
    assert availability["action"] == "publish" and availability["code"] == 135
    assert availability["reason"] == "Not authorized" and availability["log_level"] == "warning"
    assert "Home Assistant shows the bank unavailable" in availability["detail"]
    assert ("publish", f"{BASE}/instance") in once and ("publish", f"{BASE}/gpu/0/availability") in once
    assert any(topic.startswith("homeassistant/") and topic.endswith("/config") for _, topic in once)
    assert not any(action == "subscribe" for action, _ in once)  # reading is allowed
    print(f"\n[mqtt figures] ACL refusing every publish: {len(refused)} warnings over two sessions, one per topic "
          f"({len(once)} topics), availability's naming PUBACK {availability['code']} {availability['reason']!r}")


def manual_acl(node_id: str) -> str:
    """The daemon user's lines of the ACL the MQTT manual gives, for ``node_id``, as
    anonymous lines (before any ``user``): what the test's daemon connects as."""
    text = (REPO / "docs" / "integrations" / "mqtt.md").read_text()
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    lines = [line.strip() for line in block.splitlines()]
    mine = lines[lines.index("user powerbudgetd") + 1:]
    mine = mine[:mine.index("")] if "" in mine else mine
    assert mine and all(line.startswith("topic ") for line in mine), mine
    return "\n".join(line.replace("gpu1", node_id) for line in mine) + "\n"


async def test_the_acl_the_manual_gives_refuses_the_daemon_nothing(tmp_path: Path) -> None:
    """The manual's ACL for the daemon's user (a real Mosquitto enforcing it, Home
    Assistant discovery on as by default): its availability, state and every discovery
    config are published and delivered, and no publish or subscription is refused."""
    # the daemon's lines, and a watcher that may read everything it publishes
    broker = Mosquitto(tmp_path, acl=manual_acl("testbox") + "topic read homeassistant/#\ntopic read powerbudgetd/#\n")
    broker.start()
    try:
        with capture_logs() as logs:
            async with watching(broker.port, [f"{BASE}/#", "homeassistant/#"]) as w, \
                    running(write_config(tmp_path, broker.port)) as r:
                await w.wait_for(lambda: w.payloads(f"{BASE}/availability") and w.payloads(f"{BASE}/gpu/3/availability"), 15)
                configs = await w.wait_for(lambda: [str(m.topic) for m in w.messages
                                                    if str(m.topic).startswith("homeassistant/")], 15)
                await r.until(lambda: sum(e["event"] == "mqtt_connected" for e in logs), 5, "connected")
                await asyncio.sleep(2.0)  # the session's publishes acknowledged
    finally:
        broker.kill()
    assert all(t.endswith("/config") and "/powerbudgetd_testbox/" in t for t in configs), configs
    assert not [e for e in logs if e["event"] == "mqtt_refused"], [e for e in logs if e["event"] == "mqtt_refused"]
