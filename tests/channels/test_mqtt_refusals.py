"""SUBACK and PUBACK refusals (MQTT 5 reason codes of 128 and up) are warned once per topic,
naming it and the reason; granted ones say nothing."""

from __future__ import annotations

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode
from structlog.testing import capture_logs

from powerbudgetd.channels.mqtt.refusals import Refusals


def suback(code: int) -> ReasonCode:
    return ReasonCode(PacketTypes.SUBACK, identifier=code)


def test_a_refused_subscription_is_warned_once_naming_topic_and_reason() -> None:
    r = Refusals("broker:1883", "pb/box/availability")
    topics = ["pb/box/budget/set", "homeassistant/+/pb/#"]
    with capture_logs() as logs:
        for _ in range(3):  # three sessions, refused each time
            r.check_suback(topics, [suback(1), suback(135)])
    (warned,) = [e for e in logs if e["event"] == "mqtt_refused"]
    assert warned["action"] == "subscribe" and warned["topic"] == "homeassistant/+/pb/#"
    assert warned["code"] == 135 and warned["reason"] == "Not authorized" and warned["log_level"] == "warning"
    assert "read" in warned["detail"]


def test_a_refused_publish_of_availability_says_what_home_assistant_shows() -> None:
    r = Refusals("broker:1883", "pb/box/availability")
    with capture_logs() as logs:
        r.check("publish", "pb/box/availability", ReasonCode(PacketTypes.PUBACK, identifier=135))
        r.check("publish", "pb/box/instance", ReasonCode(PacketTypes.PUBACK, identifier=0))
        r.check("publish", "pb/box/instance", ReasonCode(PacketTypes.PUBACK, identifier=16))  # no matching subscribers
    (warned,) = logs
    assert warned["topic"] == "pb/box/availability" and "Home Assistant shows the bank unavailable" in warned["detail"]
