"""Wall meters as people have them, through a real broker: a multi-channel Tasmota that
publishes ``ENERGY.Power`` as a list (one channel chosen by index, or all summed) and a
Shelly Gen2 switch's ``apower`` on its own switch's topic each drive the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.broker_daemon import running, write_config
from support.mqtt import Mosquitto, publish

pytestmark = pytest.mark.slow  # a real broker and the daemon on the wall clock

TASMOTA_2CH = {"Time": "2025-06-15T12:00:00", "ENERGY": {"Total": 3.2, "Power": [300, 400], "Voltage": 230,
                                                        "Current": [1.3, 1.7]}}
SHELLY = {"id": 1, "source": "timer", "output": True, "apower": 700.0, "voltage": 230.4, "current": 3.1,
          "aenergy": {"total": 812.3, "by_minute": [11.0, 11.2, 11.1], "minute_ts": 1750000000}}
CASES = {  # name: (meter section, topic, payload, the wall watts it means)
    "tasmota-sum": ('preset = "tasmota"\ntopic = "rackplug"\njson_path = "ENERGY.Power.*"\n',
                    "tele/rackplug/SENSOR", TASMOTA_2CH, 700.0),
    "tasmota-channel": ('preset = "tasmota"\ntopic = "rackplug"\njson_path = "ENERGY.Power.1"\n',
                        "tele/rackplug/SENSOR", {**TASMOTA_2CH, "ENERGY": {"Power": [60, 700]}}, 700.0),
    "shelly-gen2-switch-1": ('preset = "shelly"\nprefix = "shellypro2pm-box"\nswitch = 1\n',
                             "shellypro2pm-box/status/switch:1", SHELLY, 700.0),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_multi_channel_meter_drives_the_budget(broker: Mosquitto, tmp_path: Path, case: str) -> None:
    section, topic, payload, wall_w = CASES[case]
    config = write_config(tmp_path, broker.port, "[mqtt.wall_meter]\nmax_age_s = 30\n" + section)
    async with running(config) as r:
        await r.until(lambda: r.bridge.connected, what="connected")
        await publish(broker.port, topic, json.dumps(payload))
        await r.until(lambda: r.ctl.budget_mw < 1_000_000, what="the meter's budget")
        meter = r.bridge.meter
        assert meter is not None and meter.wall_w == wall_w and meter.state == "ok"
        # 700 W at the plug with ~120 W of idle cards: the 1440 W circuit leaves ~786 W.
        assert meter.allowed_w == pytest.approx((1440 - meter.non_gpu_w) * 0.9)  # type: ignore[operator]
        assert r.ctl.budget_mw == int((meter.allowed_w - 20) * 1000)  # type: ignore[operator]
        assert 700_000 < r.ctl.budget_mw < 800_000


async def test_hosts_behind_one_meter_see_each_other_through_the_broker(broker: Mosquitto, tmp_path: Path) -> None:
    """The daemon announces the wall meter it reads (retained, on powerbudgetd/meters/
    <node_id>); another host's retained announcement of the same meter, there before it
    connected, is seen, and its goodbye (an empty retained message) too."""
    from support.broker_daemon import METER
    from support.mqtt import watching

    topic = "mqtt:tele/plug/SENSOR"
    await publish(broker.port, "powerbudgetd/meters/otherbox",
                  json.dumps({"node_id": "otherbox", "host": "b", "pid": 7, "meters": [topic]}), retain=True)
    config = write_config(tmp_path, broker.port, METER)
    async with watching(broker.port, ["powerbudgetd/meters/testbox"]) as w, running(config) as r:
        await r.until(lambda: r.bridge.connected, what="connected")
        own = await w.wait_for(lambda: w.last_json("powerbudgetd/meters/testbox"))
        assert own["meters"] == [topic] and own["node_id"] == "testbox"
        await r.until(lambda: r.bridge.peers.behind(topic) == ["otherbox"], what="the other host seen")
        await publish(broker.port, "powerbudgetd/meters/otherbox", b"", retain=True)
        await r.until(lambda: r.bridge.peers.behind(topic) == [], what="the other host gone")
