"""A broker's refusals of our publishes and subscriptions, warned once per topic.

A broker whose ACL does not let the daemon's user write (or read) a topic keeps the
connection and answers each QoS 1 publish with PUBACK reason 135 "Not authorized" (each
subscription with SUBACK 135): nothing fails, the log says ``mqtt_connected``, and Home
Assistant shows the bank unavailable for ever. So each refusal is warned
(``mqtt_refused``), once per topic and direction for the process's life, naming the topic
and the broker's reason. aiomqtt drops a PUBACK's reason code: :meth:`Refusals.watch`
hooks the paho client under it (the topic of each message id, the reason of each
acknowledgement). MQTT 5 only: 3.1.1 has no PUBACK reason.
"""

from __future__ import annotations

from typing import Any

import structlog

log = structlog.get_logger("powerbudgetd")


class Refusals:
    """Warns of refused publishes and subscriptions. ``broker``: ``host:port`` as logged;
    ``availability``: our availability topic (its refusal is what Home Assistant shows)."""

    def __init__(self, broker: str, availability: str) -> None:
        self.broker = broker
        self.availability = availability
        self.warned: set[tuple[str, str]] = set()  # (publish | subscribe, topic) warned of

    def watch(self, paho: Any) -> None:
        """Hook ``paho`` (an aiomqtt client's paho client, one per connection): each QoS
        1-2 publish's topic is kept by message id until its acknowledgement, whose
        reason is checked. Call before the first publish."""
        topics: dict[int, str] = {}  # this connection's unacknowledged publishes
        publish, on_publish = paho.publish, paho.on_publish

        def publish_hooked(topic: str, payload: Any = None, qos: int = 0, *args: Any, **kw: Any) -> Any:
            info = publish(topic, payload, qos, *args, **kw)
            # QoS 0 is never acknowledged; a failed send (rc) is aiomqtt's to raise, and
            # is_published() raises on one
            if qos > 0 and info.rc == 0 and not info.is_published():
                topics[info.mid] = topic
            return info

        def on_publish_hooked(client: Any, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
            topic = topics.pop(mid, None)
            if topic is not None:
                self.check("publish", topic, reason)
            on_publish(client, userdata, mid, reason, properties)

        paho.publish = publish_hooked
        paho.on_publish = on_publish_hooked

    def check_suback(self, topics: list[str], reasons: Any) -> None:
        """A SUBACK's reasons, one per topic subscribed (in order)."""
        if isinstance(reasons, list | tuple):
            for topic, reason in zip(topics, reasons, strict=False):
                self.check("subscribe", topic, reason)

    def check(self, action: str, topic: str, reason: Any) -> None:
        """Warn (once per ``action`` and ``topic``) when ``reason`` (a paho ReasonCode)
        is a failure (code 128 or more)."""
        code = getattr(reason, "value", reason)
        if not isinstance(code, int) or code < 0x80 or (action, topic) in self.warned:
            return
        self.warned.add((action, topic))
        verb = "publish to" if action == "publish" else "subscribe to"
        detail = (f"the broker refuses to let this client {verb} {topic}: allow the daemon's MQTT user to "
                  f"{'write' if action == 'publish' else 'read'} it (mosquitto: a `topic "
                  f"{'write' if action == 'publish' else 'read'}` line in its ACL file)")
        if action == "publish" and topic == self.availability:
            detail += "; Home Assistant shows the bank unavailable until it may"
        log.warning("mqtt_refused", action=action, topic=topic, reason=str(reason), code=code, broker=self.broker,
                    detail=detail)
