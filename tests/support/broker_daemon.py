"""The daemon in process against a real broker: its config, the meter and remote sections, payloads."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from powerbudgetd.channels.mqtt.session import MqttBridge
from support.inprocess import Running, running_daemon
from support.scenarios import idle_4


def write_config(tmp_path: Path, port: int, extra: str = "", *, metrics_port: int | None = None, budget_w: float = 1000) -> Path:
    scenario = idle_4(tmp_path)  # 4 idle 150-300 W cards
    path = tmp_path / "powerbudgetd.toml"
    path.write_text(
        f"""budget_w = {budget_w}
[metrics]
enabled = {"false" if metrics_port is None else "true"}
port = {metrics_port or 19400}
[feed]
breaker_a = 15
volts = 120
psu_efficiency = 0.9
host_w = 200
[sim]
scenario = "{scenario}"
[mqtt]
host = "127.0.0.1"
port = {port}
node_id = "testbox"
publish_interval_s = 1
reconnect_min_s = 0.1
reconnect_max_s = 0.5
{extra}"""
    )
    return path


BASE = "powerbudgetd/testbox"


# -- the daemon in-process --------------------------------------------------------------
def running(config: Path) -> contextlib.AbstractAsyncContextManager[Running]:
    """The daemon in this process with the MQTT bridge (``r.bridge``)."""
    return running_daemon(config, bridge=lambda settings, daemon, registry: MqttBridge(
        settings.mqtt, daemon.arbiter, settings.feed and settings.feed.feed(), registry=registry))


METER = """[mqtt.wall_meter]
preset = "tasmota"
topic = "plug"
max_age_s = 1.5
hysteresis_w = 20
"""


def tasmota(watts: object) -> str:
    return json.dumps({"Time": "2024-05-01T12:00:00", "ENERGY": {"Total": 3.2, "Power": watts, "Voltage": 120}})


REMOTE = """[mqtt.remote_budget]
enabled = true
"""
