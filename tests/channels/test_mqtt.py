"""The MQTT side channel without a broker: parsing, the wall-meter arithmetic and
hysteresis, the budget arbiter and the daemon's keeper over a real controller,
discovery, config."""

from __future__ import annotations

import dataclasses
import io
import math
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from powerbudgetd.core.feed import next_wall_budget_w
from powerbudgetd.channels.mqtt import (
    MqttMetrics,
    ReadingError,
    WallMeter,
    parse_budget_command,
    parse_power_w,
)
from powerbudgetd.channels.mqtt.session import MqttBridge
from powerbudgetd.control.controller import Controller
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.errors import ConfigError
from powerbudgetd.config import MqttConfig, Settings, WallMeterConfig, load_config
from powerbudgetd.service.logs import configure_logging
from support.bridge import FEED, Loop, TASMOTA, bridge_for, tasmota


@pytest.fixture(autouse=True)
def _every_log_level(_quiet_logs: None) -> None:
    # These tests count warnings (once per change of state): let every level through
    # to structlog's capture_logs; the rendered lines go nowhere.
    configure_logging(level="debug", stream=io.StringIO(), json=True)






# -- parsing ----------------------------------------------------------------------------
def test_presets_find_the_watts() -> None:
    assert parse_power_w(tasmota(612), TASMOTA.power_path()) == 612.0
    shelly = WallMeterConfig(preset="shelly", prefix="shellyplus1pm-a8032ab1")
    assert shelly.state_topic() == "shellyplus1pm-a8032ab1/status/switch:0"
    payload = b'{"id": 0, "source": "init", "output": true, "apower": 431.7, "voltage": 230.1}'
    assert parse_power_w(payload, shelly.power_path()) == 431.7
    generic = WallMeterConfig(preset="generic", topic="pdu/outlet4", json_path="meters.1.power")
    assert parse_power_w(b'{"meters": [{"power": 5}, {"power": 880.5}]}', generic.power_path()) == 880.5
    bare = WallMeterConfig(preset="generic", topic="pdu/watts", json_path="")
    assert parse_power_w(b"742", bare.power_path()) == 742.0


@pytest.mark.parametrize(
    ("payload", "reason", "says"),
    [
        (b"{not json", "garbled", "not JSON"),
        (b"\xff\xfe", "garbled", "not JSON"),
        (b'{"StatusSNS": {}}', "garbled", "no ENERGY"),
        (tasmota("lots"), "garbled", "not a number"),
        (tasmota(True), "garbled", "not a number"),
        (tasmota(None), "garbled", "not a number"),
        (tasmota([300, 200]), "garbled", "ENERGY.Power.0"),
        (b'{"ENERGY": {"Power": NaN}}', "garbled", "not a number"),
        (b'{"ENERGY": {"Power": Infinity}}', "garbled", "not a number"),
        (tasmota(-12), "negative", "-12 W"),
    ],
)
def test_bad_payloads_say_what_is_wrong(payload: bytes, reason: str, says: str) -> None:
    with pytest.raises(ReadingError) as exc:
        parse_power_w(payload, TASMOTA.power_path())
    assert exc.value.reason == reason
    assert says in str(exc.value)


def test_budget_commands() -> None:
    assert parse_budget_command(b"850") == 850.0
    assert parse_budget_command(b" 850.5\n") == 850.5
    assert parse_budget_command(b'{"budget_w": 700}') == 700.0
    for bad, says in [(b"lots", "not a number"), (b'{"watts": 700}', "budget_w"), (b"true", "not a number"),
                      (b"NaN", "not a number"), (b'"800"', "not a number"), (b"", "not a number")]:
        with pytest.raises(ValueError, match=says):
            parse_budget_command(bad)


# -- the arithmetic ---------------------------------------------------------------------
def test_allowed_board_budget_follows_the_brief() -> None:
    # 4 cards at 250 W of board power, 1300 W at the plug, PSU 90 %, 1440 W circuit limit:
    # 1000 / 0.9 = 1111 W of the plug power is the GPUs', 189 W is the host's.
    feed = FEED.feed()
    assert feed.wall_limit_w() == 1440
    non_gpu, allowed = feed.board_budget_from_wall_w(1300, 1000)
    assert non_gpu == pytest.approx(1300 - 1000 / 0.9)
    assert allowed == pytest.approx((1440 - non_gpu) * 0.9)
    assert allowed == pytest.approx(1126.0, abs=0.1)
    # Host draw does not change with the GPUs' caps: the answer does not depend on board_w
    # as long as the wall moves with it.
    assert feed.board_budget_from_wall_w(1300 - 500 / 0.9, 500)[1] == pytest.approx(allowed)
    # The same model gives the wall power the recorder and the simulator use.
    assert feed.wall_w(1000) == pytest.approx((1000 + 200) / 0.9)
    assert feed.non_gpu_wall_w(feed.wall_w(1000), 1000) == pytest.approx(200 / 0.9)


def test_hysteresis_drops_at_once_and_rises_only_a_band_later() -> None:
    h, cfg = 20.0, 1000.0
    assert next_wall_budget_w(None, 1100, cfg, h) is None  # the meter allows more: not limiting
    assert next_wall_budget_w(None, 995, cfg, h) == 975  # drop, with one band of margin
    assert next_wall_budget_w(975, 990, cfg, h) == 975  # noise inside the band: no rewrite
    assert next_wall_budget_w(975, 970, cfg, h) == 950  # below what is in force: drop again
    assert next_wall_budget_w(950, 980, cfg, h) == 950
    assert next_wall_budget_w(950, 991, cfg, h) == 971  # two bands above: rise
    assert next_wall_budget_w(971, 1019, cfg, h) == 999
    assert next_wall_budget_w(999, 1020, cfg, h) is None  # a band above the configured budget
    assert next_wall_budget_w(None, -50, cfg, h) == 0.0  # never negative (the floor clamps later)
    # A lower configured budget (after a reload) caps what is in force.
    assert next_wall_budget_w(975, 890, 880, h) == 975  # inside the band: 880 stays in force
    assert next_wall_budget_w(975, 900, 880, h) is None
    assert next_wall_budget_w(None, 2000, cfg, 0) is None
    budget = None
    for allowed in [1500, 990, 1005, 985, 1001, 992, 999]:  # a noisy meter around 995 W
        budget = next_wall_budget_w(budget, allowed, cfg, h)
    assert budget == 970  # one drop to 970 (985 - 20), then nothing


def test_wall_meter_warns_once_per_state_change_and_keeps_its_budget() -> None:
    reg = CollectorRegistry()
    meter = WallMeter(TASMOTA, FEED.feed(), MqttMetrics(reg))
    ignored = lambda reason: reg.get_sample_value("powerbudgetd_wall_readings_ignored_total", {"reason": reason})
    with capture_logs() as logs:
        meter.reading(tasmota(700), 0.0, 120.0, 1000.0, retained=True)
        assert meter.state == "stale" and meter.budget_w is None
        meter.reading(tasmota(700), 1.0, 120.0, 1000.0)
        assert meter.state == "ok"
        lowered = meter.budget_w
        assert lowered == pytest.approx((1440 - (700 - 120 / 0.9)) * 0.9 - 20)
        for t, payload in enumerate([b"garbage", b"garbage", tasmota(-3), tasmota(50_000), tasmota(50_000), tasmota(60)]):
            meter.reading(payload, 2.0 + t, 120.0, 1000.0)
            assert meter.budget_w == lowered  # a bad reading never moves the budget
        assert meter.state == "implausible"  # 60 W is below 120 W of board power / 0.9
        for t in (9.0, 9.25, 9.5, 9.75):  # plausible again: trusted only after five in a row
            meter.reading(tasmota(705), t, 120.0, 1000.0)
            assert meter.state == "implausible" and meter.budget_w == lowered
        meter.reading(tasmota(705), 10.0, 120.0, 1000.0)
        meter.check_age(14.0)
        assert meter.state == "ok"
        meter.check_age(15.5)
        meter.check_age(16.0)
        assert meter.state == "stale" and meter.budget_w == lowered  # silence keeps the last budget
        meter.offline()
        assert meter.state == "offline"
    warnings = [(e["event"], e.get("state")) for e in logs if e["log_level"] == "warning"]
    assert warnings == [
        ("wall_meter_ignored", "stale"), ("wall_meter_ignored", "garbled"), ("wall_meter_ignored", "negative"),
        ("wall_meter_ignored", "implausible"), ("wall_meter_ignored", "stale"), ("wall_meter_ignored", "offline"),
    ]
    assert (ignored("stale"), ignored("garbled"), ignored("negative"), ignored("implausible")) == (2, 2, 1, 3)
    assert reg.get_sample_value("powerbudgetd_wall_meter_ok") == 0
    assert reg.get_sample_value("powerbudgetd_wall_power_watts") == 705






def test_meter_budget_goes_through_the_arbiter_and_never_below_the_floor(ctl: Controller) -> None:
    cfg = MqttConfig(host="127.0.0.1", node_id="box", wall_meter=TASMOTA)
    bridge = bridge_for(cfg, feed=FEED)
    loop = Loop(ctl, bridge)
    t = loop.boot()
    assert ctl.budget_mw == 1_000_000
    bridge.arbiter.offer("wall_meter", 780.0, t)
    report = loop.tick(t + 0.1)  # applied between ticks, so this very tick acts on it
    assert ctl.budget_mw == 780_000 and report.budget_w == 780
    assert report.writes and all(w.to_w < w.from_w for w in report.writes)  # decreases first
    assert all(w.reason == "wall_meter" for w in report.writes)
    assert report.snapshot.budget_source == "wall_meter"
    assert dict(report.snapshot.sources) == {"config": 1000, "wall_meter": 780}
    with capture_logs() as logs:
        bridge.arbiter.offer("wall_meter", 100.0, t + 0.15)  # below 4 x 150 W
        loop.tick(t + 0.2)
        loop.tick(t + 0.3)
    assert ctl.budget_mw == 600_000  # the cards at their minimum limits: the best there is
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["budget_below_floor"]  # once


def test_wall_meter_reports_to_the_arbiter(ctl: Controller) -> None:
    cfg = MqttConfig(host="127.0.0.1", node_id="box", wall_meter=TASMOTA)
    now = [0.0]
    bridge = MqttBridge(cfg, BudgetArbiter(1000), FEED.feed(), registry=CollectorRegistry(), clock=lambda: now[0])
    loop = Loop(ctl, bridge)
    loop.tick(0.0)
    board_w = bridge.board_power_w()
    assert board_w is not None
    bridge.meter.reading(tasmota(700), 0.05, board_w)  # type: ignore[union-attr]
    allowed = FEED.feed().board_budget_from_wall_w(700, board_w)[1]
    offer = bridge.arbiter.offered("wall_meter")
    assert offer is not None and offer.budget_w == pytest.approx(allowed - 20)
    now[0] = 0.1
    loop.tick(0.1)
    assert ctl.budget_mw == int((allowed - 20) * 1000)
    bridge.meter.reading(tasmota(100 + board_w / 0.9), 0.15, board_w)  # type: ignore[union-attr]
    risen = bridge.arbiter.offered("wall_meter")
    # allows far more: it rises, but no faster than core.sensor's bound (10 % a second)
    assert risen is not None and allowed - 20 < risen.budget_w <= allowed - 20 + 0.1 * 1000 * 0.1 + 1e-6
    for k, wall in enumerate([101, 100, 101, 100, 101, 100], start=1):  # later readings (each a change)
        bridge.meter.reading(tasmota(wall + board_w / 0.9), 0.15 + 2.0 * k, board_w)  # type: ignore[union-attr]
    assert bridge.arbiter.offered("wall_meter") is None  # not limiting any more
    loop.tick(13.0)
    assert ctl.budget_mw == 1_000_000


def test_remote_budget_bounds(ctl: Controller) -> None:
    cfg = MqttConfig(host="127.0.0.1", node_id="box", remote_budget={"enabled": True})
    reg = CollectorRegistry()
    bridge = bridge_for(cfg, registry=reg)
    loop = Loop(ctl, bridge)
    assert "not ready" in bridge.inbox.remote_command(b"800")["error"]
    loop.tick(0.0)
    ok = bridge.inbox.remote_command(b"800")
    assert ok["ok"] and ok["budget_w"] == 800 and ok["effective_budget_w"] == 800 and ok["budget_source"] == "remote"
    loop.tick(0.1)
    assert ctl.budget_mw == 800_000
    for payload, says in [(b"599", "below the sum of the cards' minimum power limits (600 W)"),
                          (b"1000.5", "above the configured budget (1000 W)"), (b"much", "not a number")]:
        r = bridge.inbox.remote_command(payload)
        assert not r["ok"] and says in r["error"] and r["min_w"] == 600 and r["max_w"] == 1000
        loop.tick(0.2)
        assert ctl.budget_mw == 800_000  # a rejected command changes nothing
    assert bridge.inbox.remote_command(b'{"budget_w": 600}')["ok"]
    loop.tick(0.3)
    assert ctl.budget_mw == 600_000
    assert bridge.inbox.remote_command(b"1000")["ok"]  # restore the file's budget
    loop.tick(0.4)
    assert ctl.budget_mw == 1_000_000 and bridge.remote_w is None
    assert reg.get_sample_value("powerbudgetd_remote_budget_commands_total", {"result": "rejected"}) == 4
    assert reg.get_sample_value("powerbudgetd_remote_budget_commands_total", {"result": "accepted"}) == 3


def test_a_reload_sets_the_configured_budget_in_the_arbiter(ctl: Controller) -> None:
    """Remote 800, the file edited to 800 and reloaded, then remote 1000: rejected. (The
    configured budget used to be inferred from what the controller held, which did not
    change on that reload, so 1000 W slipped back in above the file's 800 W.)"""
    cfg = MqttConfig(host="127.0.0.1", node_id="box", remote_budget={"enabled": True})
    bridge = bridge_for(cfg)
    loop = Loop(ctl, bridge)
    loop.tick(0.0)
    assert bridge.inbox.remote_command(b"800")["ok"]
    loop.tick(0.1)
    bridge.arbiter.configure(800)  # what Daemon._reload does with the file's budget
    loop.keeper.apply(ctl, 0.15, reason="reload", strict=True)
    loop.tick(0.2)
    assert bridge.configured_w == 800 and ctl.budget_mw == 800_000
    r = bridge.inbox.remote_command(b"1000")
    assert not r["ok"] and "above the configured budget (800 W)" in r["error"]
    loop.tick(0.3)
    assert ctl.budget_mw == 800_000
    assert "above the configured budget (800 W)" in bridge.inbox.remote_command(b"950")["error"]


def test_state_carries_the_over_budget_state_and_publishes_on_its_change(ctl: Controller) -> None:
    from powerbudgetd.channels.mqtt.discovery import limits_key

    cfg = MqttConfig(host="127.0.0.1", node_id="box")
    bridge = bridge_for(cfg)
    Loop(ctl, bridge).tick(0.0)
    snap = bridge.state.latest
    assert snap is not None
    state = bridge.state.bank_state(snap)
    assert state["over_budget"] == snap.over_budget and state["over_budget_episodes"] == snap.over_budget_episodes
    over = dataclasses.replace(snap, over_budget=True, over_budget_cause="GPU 1 held at 300 W by an outside limit",
                               over_budget_episodes=snap.over_budget_episodes + 1, over_budget_s=1.5)
    state = bridge.state.bank_state(over)
    assert state["over_budget"] is True and state["over_budget_cause"].startswith("GPU 1 held")
    assert state["over_budget_s"] == 1.5
    assert limits_key(over) != limits_key(dataclasses.replace(over, over_budget=False))  # published at once
    cleared = bridge.state.bank_state(dataclasses.replace(over, over_budget=False))
    assert cleared["over_budget"] is False and cleared["over_budget_cause"] is None


def test_listener_never_blocks_on_a_slow_consumer(ctl: Controller) -> None:
    cfg = MqttConfig(host="127.0.0.1", node_id="box")
    now = [0.0]
    bridge = MqttBridge(cfg, BudgetArbiter(1000), registry=CollectorRegistry(), clock=lambda: now[0])
    loop = Loop(ctl, bridge)
    for i in range(500):  # nobody consumes: the slot holds the latest, memory stays flat
        now[0] = i * 0.1
        loop.tick(now[0])
    assert len(bridge._board) <= 21 and bridge.state.latest is not None
    assert bridge.board_power_w() == pytest.approx(4 * 30, rel=0.1)  # four idle cards
    state = bridge.state.bank_state(bridge.state.latest)
    assert state["budget_w"] == 1000 and state["budget_source"] == "config" and state["configured_budget_w"] == 1000


# -- config -----------------------------------------------------------------------------
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "powerbudgetd.toml"
    path.write_text(text)
    return path


def test_mqtt_is_off_unless_configured(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "budget_w = 1000\n")).mqtt is None


def test_password_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERBUDGETD_MQTT__PASSWORD", "s3cret")
    s = load_config(write(tmp_path, 'budget_w = 1000\n[mqtt]\nhost = "broker.lan"\nusername = "pbd"\n'))
    assert s.mqtt is not None and s.mqtt.password is not None
    assert s.mqtt.password.get_secret_value() == "s3cret" and "s3cret" not in repr(s.mqtt)
    assert s.mqtt.topic() == f"powerbudgetd/{s.mqtt.node_id}"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[mqtt]\nhost = "b"\n[mqtt.wall_meter]\npreset = "tasmota"\ntopic = "p"\n', "needs a [feed] section"),
        ('[mqtt]\nhost = "b"\n[mqtt.wall_meter]\npreset = "shelly"\ntopic = "p"\n', "needs prefix"),
        ('[mqtt]\nhost = "b"\n[mqtt.wall_meter]\npreset = "generic"\ntopic = "p"\n', "needs json_path"),
        ('[mqtt]\nhost = "b"\n[mqtt.wall_meter]\npreset = "zwave"\ntopic = "p"\n', "mqtt.wall_meter.preset"),
        ('[mqtt]\nhost = "b"\nbase_topic = "gpu/#"\n', "not a usable MQTT topic"),
        ('[mqtt]\nhost = "b"\nnode_id = "gpu box"\n', "mqtt.node_id"),
        ('[mqtt]\nhost = "b"\ntls = true\nca_file = "/nonexistent/ca.pem"\n', "no such file"),
        ('[mqtt]\nhost = "b"\nca_file = "/nonexistent/ca.pem"\n', "need tls = true"),
        ('[mqtt]\nhost = "b"\nport = 0\n', "mqtt.port"),
        ('[mqtt]\nport = 1883\n', "mqtt.host"),
    ],
)
def test_bad_mqtt_config_names_the_field(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(write(tmp_path, "budget_w = 1000\n" + text))


def test_default_node_id_is_topic_safe() -> None:
    node = MqttConfig(host="b").node_id
    assert node and all(ch.isalnum() or ch in "_-" for ch in node)
    assert Settings(budget_w=1000, mqtt={"host": "b"}).mqtt is not None
    assert math.isclose(FEED.wall_limit_w(), 1440)


def test_a_tick_with_a_card_unread_is_not_taken_as_a_bank_drawing_less() -> None:
    """Card 1's power cannot be read for half a second: those ticks' summed board power
    is unknown, not the other three cards' draw (nor 0 W). The board power the wall
    meter's reading is checked against (the window's lowest) stays the four cards' draw;
    it once fell to the partial sum and let a meter reading that low pass as plausible."""
    from support.rig import Fault, card, make_rig

    rig = make_rig([card(i) for i in range(4)], 1000,
                   faults=[Fault("nvmlDeviceGetPowerUsage", "UNKNOWN", card=1, from_s=3.0, until_s=3.5)])
    bridge = MqttBridge(MqttConfig(host="127.0.0.1", node_id="box"), BudgetArbiter(1000), registry=CollectorRegistry(),
                        clock=lambda: rig.t)
    rig.listen(bridge.on_tick)
    seen = []
    rig.run(6.0, lambda r: seen.append(bridge.board_power_w()))
    known = [w for w in seen if w is not None]
    assert known and min(known) == pytest.approx(4 * 30, rel=0.1), min(known)
