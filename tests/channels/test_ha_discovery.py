"""Home Assistant's side of the MQTT channel without a broker: the discovery payloads,
the truthful state (a stale meter, a lost card, the requested budget), the energy
counters, and which retained topics are cleared. The real client is in
``test_homeassistant.py``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.bridge import FEED, TASMOTA, Loop, bridge_for, tasmota

from powerbudgetd.channels import metrics as prom
from powerbudgetd.channels.mqtt import discovery as ha
from powerbudgetd.channels.mqtt import session
from powerbudgetd.control.controller import Controller
from powerbudgetd.core.model import Mode
from powerbudgetd.config import MqttConfig


def by_unique_id(entries: list[tuple[str, dict[str, Any]]]) -> dict[str, tuple[str, dict[str, Any]]]:
    return {p["unique_id"]: (t, p) for t, p in entries}


def test_discovery_bank_device_card_sub_devices_and_availability(ctl: Controller) -> None:
    cfg = MqttConfig(host="127.0.0.1", node_id="box", wall_meter=TASMOTA, remote_budget={"enabled": True})
    bridge = bridge_for(cfg, feed=FEED)
    bridge.state.energy.reading(ctl.cards[0].uuid, 7.2e6)  # GPU 0 reports energy: it gets the sensor
    Loop(ctl, bridge).tick(0.0)
    entries = by_unique_id(bridge.state.discovery(bridge.state.latest))  # type: ignore[arg-type]
    assert len(entries) == 16 + 2 * 4 + 1  # the bank's 16, limit and draw a card, GPU 0's energy
    daemon_avail = {"topic": "powerbudgetd/box/availability", "payload_available": "online",
                    "payload_not_available": "offline"}
    for uid, (topic, p) in entries.items():
        component = topic.split("/")[1]
        assert topic == f"homeassistant/{component}/powerbudgetd_box/{uid.removeprefix('powerbudgetd_box_')}/config"
        assert p["availability"][0] == daemon_avail and p["availability_mode"] == "all"
        assert p["object_id"].startswith("powerbudgetd_box_")
    bank = entries["powerbudgetd_box_budget"][1]
    assert bank["device"]["identifiers"] == ["powerbudgetd_box"] and "configuration_url" not in bank["device"]
    assert bank["entity_category"] == "diagnostic" and bank["suggested_display_precision"] == 0
    for i, card in enumerate(ctl.cards):
        limit = entries[f"powerbudgetd_box_{card.uuid}_limit"][1]
        power = entries[f"powerbudgetd_box_{card.uuid}_power"][1]
        assert limit["device"] == power["device"] and limit["device"]["via_device"] == "powerbudgetd_box"
        assert limit["device"]["model"] == card.info.name and card.info.name in limit["device"]["name"]
        assert limit["availability"][1]["topic"] == f"powerbudgetd/box/gpu/{i}/availability"
        assert limit["state_topic"] == f"powerbudgetd/box/gpu/{i}" and "limit_w" in limit["value_template"]
        assert limit["entity_category"] == "diagnostic" and "entity_category" not in power
        assert (power["object_id"], power["state_class"]) == (f"powerbudgetd_box_gpu{i}_power", "measurement")
    energy = entries[f"powerbudgetd_box_{ctl.cards[0].uuid}_energy"][1]
    assert (energy["device_class"], energy["unit_of_measurement"], energy["state_class"]) == \
        ("energy", "kWh", "total_increasing")
    number = entries["powerbudgetd_box_budget_request"]
    assert number[0].startswith("homeassistant/number/")
    assert (number[1]["min"], number[1]["max"], number[1]["command_topic"]) == (600, 1000, "powerbudgetd/box/budget/set")
    assert "entity_category" not in number[1]  # the control, not a diagnostic
    result = entries["powerbudgetd_box_budget_result"][1]
    assert result["state_topic"] == result["json_attributes_topic"] == "powerbudgetd/box/budget/result"
    mode = entries["powerbudgetd_box_mode"][1]
    assert mode["device_class"] == "enum" and mode["options"] == [str(m) for m in Mode]
    problems = {uid for uid, (_, p) in entries.items() if p.get("device_class") == "problem"}
    assert problems == {f"powerbudgetd_box_{k}" for k in ("failsafe", "gpu_lost", "over_budget")}


def test_the_budget_number_follows_a_reload_and_the_cards(ctl: Controller) -> None:
    cfg = MqttConfig(host="127.0.0.1", node_id="box", remote_budget={"enabled": True})
    bridge = bridge_for(cfg)
    loop = Loop(ctl, bridge)
    loop.tick(0.0)
    number = lambda: by_unique_id(bridge.state.discovery(bridge.state.latest))["powerbudgetd_box_budget_request"][1]  # type: ignore[arg-type]
    assert (number()["min"], number()["max"]) == (600, 1000)
    bridge.arbiter.configure(900)  # a reload
    loop.tick(0.1)
    assert number()["max"] == 900
    # Its state is the budget asked for, not the one in force.
    state = bridge.state.bank_state(bridge.state.latest)  # type: ignore[arg-type]
    assert state["requested_budget_w"] == 900 and state["remote_budget_w"] is None
    assert bridge.inbox.remote_command(b"700")["ok"]
    bridge.arbiter.offer("wall_meter", 650, 0.2)  # a meter holds it lower still
    loop.tick(0.2)
    state = bridge.state.bank_state(bridge.state.latest)  # type: ignore[arg-type]
    assert (state["requested_budget_w"], state["budget_w"], state["budget_source"]) == (700, 650, "wall_meter")


def test_a_stale_meter_reads_unknown_never_its_last_watts(ctl: Controller) -> None:
    cfg = MqttConfig(host="127.0.0.1", node_id="box", wall_meter=TASMOTA)
    now = [0.0]
    bridge = bridge_for(cfg, feed=FEED, clock=lambda: now[0])
    loop = Loop(ctl, bridge)
    loop.tick(0.0)
    bridge.meter.reading(tasmota(715), 0.1, bridge.board_power_w())  # type: ignore[union-attr]
    state = bridge.state.bank_state(bridge.state.latest)  # type: ignore[arg-type]
    assert (state["wall_meter"], state["wall_power_w"]) == ("ok", 715) and state["non_gpu_wall_w"] > 0
    now[0] = 0.2 + TASMOTA.max_age_s + 0.1
    loop.tick(now[0])
    state = bridge.state.bank_state(bridge.state.latest)  # type: ignore[arg-type]
    assert (state["wall_meter"], state["wall_power_w"], state["non_gpu_wall_w"]) == ("stale", None, None)
    bridge.meter.offline()  # type: ignore[union-attr]
    assert bridge.state.bank_state(bridge.state.latest)["wall_power_w"] is None  # type: ignore[arg-type]


def test_lost_cards_read_unavailable_and_a_vanished_card_stays_known(ctl: Controller) -> None:
    cfg = MqttConfig(host="127.0.0.1", node_id="box")
    bridge = bridge_for(cfg)
    loop = Loop(ctl, bridge)
    loop.tick(0.0)
    snap = bridge.state.latest
    assert snap is not None
    bridge.state.track_cards(snap)
    assert bridge.state.lost_cards(snap) == []
    broken = snap.cards[1]._replace(readable=False, error="GPU is lost")
    vanished = dataclasses.replace(snap, cards=(snap.cards[0], broken, snap.cards[2]))  # GPU 3 gone
    assert bridge.state.lost_cards(vanished) == [1, 3]
    state = bridge.state.bank_state(vanished)
    assert state["lost_gpus"] == [1, 3]
    entities = bridge.state.entities(vanished)
    assert [c.index for c in entities.cards] == [0, 1, 2, 3]  # GPU 3 stays, unavailable, in this run


def test_only_our_retained_topics_that_are_gone_get_cleared() -> None:
    layout = ha.Layout(node_id="box", base="powerbudgetd/box")
    assert layout.is_ours("homeassistant/sensor/powerbudgetd_box/GPU-3_power/config")
    assert layout.is_ours("homeassistant/number/powerbudgetd_box/budget_request/config")
    assert layout.is_ours("powerbudgetd/box/gpu/3") and layout.is_ours("powerbudgetd/box/gpu/3/availability")
    assert not layout.is_ours("homeassistant/sensor/powerbudgetd_other/budget/config")  # another host
    assert not layout.is_ours("homeassistant/status") and not layout.is_ours("powerbudgetd/box/state")
    assert not layout.is_ours("homeassistant/light/powerbudgetd_box/x/config")
    retained = ["powerbudgetd/box/gpu/3", "powerbudgetd/box/gpu/0", "homeassistant/sensor/powerbudgetd_box/a/config"]
    current = ["powerbudgetd/box/gpu/0", "homeassistant/sensor/powerbudgetd_box/a/config"]
    assert ha.stale_topics(retained, current) == ["powerbudgetd/box/gpu/3"]


@given(st.lists(st.one_of(
    st.floats(min_value=0, max_value=5e4, allow_nan=False),  # the counter rises (J)
    st.floats(min_value=-0.1, max_value=-0.001),              # a misread, this share below the counter
    st.just(-1.0),                                            # a reset: the driver reloaded
), min_size=1, max_size=60))
def test_energy_never_decreases_within_a_run_unless_the_counter_reset(steps: list[float]) -> None:
    counter = ha.EnergyCounter()
    raw, truth = 1e6, 0.0  # NVML's counter (J), and the energy it really counted since start
    counter.update(raw)
    for step in steps:
        before = counter.last_j
        assert before is not None
        if step == -1.0:
            raw = 0.0
            assert counter.update(raw) == 0.0  # published as is: Home Assistant starts a new cycle
        elif step < 0:
            assert counter.update(raw * (1 + step)) == before  # a dip of a misread is not published
        else:
            raw += step
            truth += step
            assert counter.update(raw) == raw >= before
    assert counter.run_j == pytest.approx(truth, abs=1e-6)  # the bank's energy: nothing lost, nothing twice


def test_bank_energy_starts_at_zero_each_run_and_skips_unsupported_cards() -> None:
    energy = ha.BankEnergy()
    assert energy.bank_kwh() is None
    energy.reading("GPU-a", 3.6e9)  # 1000 kWh since driver load
    energy.reading("GPU-b", None)   # NVML does not report it
    assert energy.card_kwh("GPU-a") == 1000 and energy.card_kwh("GPU-b") is None
    assert energy.bank_kwh() == 0 and "GPU-b" in energy.unsupported
    energy.reading("GPU-a", 3.6e9 + 3.6e6)
    assert energy.bank_kwh() == pytest.approx(1.0)
    energy.reading("GPU-a", 7.2e6)  # a driver reload, 2 kWh since
    assert energy.card_kwh("GPU-a") == pytest.approx(2.0) and energy.bank_kwh() == pytest.approx(3.0)


def test_metrics_endpoint_url() -> None:
    assert prom.endpoint_url("127.0.0.1", 19400) is None  # no other host can follow it
    assert prom.endpoint_url("192.0.2.7", 19400) == "http://192.0.2.7:19400/metrics"
    assert prom.endpoint_url("2001:db8::7", 19400) == "http://[2001:db8::7]:19400/metrics"
    assert prom.endpoint_url("0.0.0.0", 9) not in (None, "http://0.0.0.0:9/metrics")


class _Client:
    async def publish(self, *args: Any, **kwargs: Any) -> None:
        pass


async def test_the_publisher_always_ends_when_cancelled_as_it_is_woken(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop lands as a tick wakes the publisher (a limit change while stopping): the task
    must end. (It did not: Python 3.11's wait_for swallowed such a cancellation, and the
    daemon's stop waited for the MQTT task forever.)"""
    monkeypatch.setattr(session, "MIN_PUBLISH_GAP_S", 0.0)
    bridge = bridge_for(MqttConfig(host="127.0.0.1", node_id="box"))
    for delay in range(6):  # cancel 0..5 loop steps after the wake-up
        for _ in range(5):
            task = asyncio.create_task(bridge._publish_loop(_Client()))  # type: ignore[arg-type]
            for _ in range(3):
                await asyncio.sleep(0)
            bridge.state.changed.set()
            for _ in range(delay):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 1.0)
            assert task.done(), f"the publisher outlived its cancellation (delay {delay})"


def test_the_state_payloads_round_draw_and_energy(ctl: Controller) -> None:
    bridge = bridge_for(MqttConfig(host="127.0.0.1", node_id="box"))
    Loop(ctl, bridge).tick(0.0)
    snap = bridge.state.latest
    assert snap is not None
    card = ha.card_state(snap.cards[0]._replace(power_avg_w=31.23456), energy_kwh=1.234567)
    assert (card["power_avg_w"], card["energy_kwh"]) == (31.2, 1.2346)
    state = json.loads(json.dumps(bridge.state.bank_state(snap)))
    assert state["over_budget"] is snap.over_budget and state["lost_gpus"] == []


def test_a_ups_shows_its_state_and_on_battery(ctl: Controller) -> None:
    bridge = bridge_for(MqttConfig(host="127.0.0.1", node_id="box"))
    record: dict[str, Any] = {"state": "ok", "status": "OL"}
    bridge.attach_ups(lambda: record)
    Loop(ctl, bridge).tick(0.0)
    snap = bridge.state.latest
    assert snap is not None
    ids = {p["unique_id"] for _, p in bridge.state.discovery(snap)}
    assert {"powerbudgetd_box_ups", "powerbudgetd_box_on_battery"} <= ids
    assert (bridge.state.bank_state(snap)["ups"], bridge.state.bank_state(snap)["on_battery"]) == ("ok", False)
    record.update(status="DISCHRG OB")
    assert bridge.state.bank_state(snap)["on_battery"] is True
    record.update(state="stale", status=None)  # its data silent: unknown, not the last answer
    assert (bridge.state.bank_state(snap)["ups"], bridge.state.bank_state(snap)["on_battery"]) == ("stale", None)

    def broken() -> dict[str, Any]:
        raise RuntimeError("a bug in the UPS channel")

    bridge.attach_ups(broken)  # costs the UPS fields, never the state
    assert bridge.state.bank_state(snap)["on_battery"] is None and bridge.state.bank_state(snap)["budget_w"] == snap.budget_w


def test_every_value_home_assistant_reads_is_a_key_the_state_carries(ctl: Controller) -> None:
    """The Home Assistant mapping reads only what the state payloads declare: every
    ``value_json.KEY`` in every entity's templates, with every entity on (wall meter,
    remote budget, UPS, energy), is a key of the payload published on its state topic."""
    cfg = MqttConfig(host="127.0.0.1", node_id="box", wall_meter=TASMOTA, remote_budget={"enabled": True})
    bridge = bridge_for(cfg, feed=FEED)
    bridge.attach_ups(lambda: {"state": "ok", "status": "OL"})
    bridge.state.energy.reading(ctl.cards[0].uuid, 7.2e6)
    Loop(ctl, bridge).tick(0.0)
    snap = bridge.state.latest
    assert snap is not None
    published: dict[str, dict[str, Any]] = {}

    class Recorder:
        async def publish(self, topic: str, payload: str | bytes = b"", qos: int = 0, retain: bool = False) -> None:
            with contextlib.suppress(ValueError, TypeError):
                value = json.loads(payload)
                if isinstance(value, dict):
                    published[topic] = value

    asyncio.run(bridge.state.publish_state(Recorder(), snap))  # type: ignore[arg-type]
    assert bridge.layout.response_topic is not None
    published[bridge.layout.response_topic] = bridge.inbox.remote_command(b"700")  # a command's response
    checked = 0
    for _, p in bridge.state.discovery(snap):
        templates = " ".join(str(v) for k, v in p.items() if k.endswith("template"))
        keys = set(re.findall(r"value_json\.([A-Za-z_][A-Za-z0-9_]*)", templates))
        if not keys:
            continue
        topic = p.get("state_topic")
        assert topic in published, (p["unique_id"], topic)
        assert keys <= set(published[topic]), (p["unique_id"], keys - set(published[topic]))
        checked += 1
    assert checked >= 20
