"""The MQTT side channel against a real Mosquitto broker on a free loopback port.

Two ways in: ``powerbudgetd run --backend sim`` as a subprocess (state, discovery, the
last will on SIGKILL), and the daemon in-process (wall meter, remote budget, the broker
killed and restarted while the ticks keep their cadence), where metrics and ticks can
be looked at directly.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from structlog.testing import capture_logs

from powerbudgetd.service.logs import configure_logging
from support.daemon import Launch, scrape
from support.mqtt import Mosquitto, publish, watching
from support.wait import free_port
from support.broker_daemon import BASE, METER, REMOTE, running, tasmota, write_config

pytestmark = pytest.mark.slow  # a real Mosquitto: the full run (CI) covers it


@pytest.fixture(autouse=True)
def _every_log_level(_quiet_logs: None) -> None:
    # These tests count warnings (once per change of state): let every level through
    # to structlog's capture_logs; the rendered lines go nowhere.
    configure_logging(level="debug", stream=io.StringIO(), json=True)






# -- the daemon as a subprocess ---------------------------------------------------------
async def test_state_discovery_and_the_last_will_on_sigkill(broker: Mosquitto, tmp_path: Path, launch: Launch) -> None:
    metrics_port = free_port()
    config = write_config(tmp_path, broker.port, metrics_port=metrics_port)
    async with watching(broker.port, [f"{BASE}/#", "homeassistant/#"]) as w:
        daemon = launch(config)
        await w.wait_for(lambda: b"online" in w.payloads(f"{BASE}/availability"))
        state = await w.wait_for(lambda: (s := w.last_json(f"{BASE}/state")) and s["ready"] and s)
        assert state["budget_w"] == 1000 and state["configured_budget_w"] == 1000 and state["gpus"] == 4
        assert state["sum_limits_w"] <= 1000 and state["floor_w"] == 600
        card = await w.wait_for(lambda: (c := w.last_json(f"{BASE}/gpu/3")) and c["limit_w"] == 250 and c)
        assert card["index"] == 3 and card["uuid"].startswith("GPU-") and card["min_limit_w"] == 150
        assert 20 < card["power_avg_w"] < 40  # an idle card
        # 8 sensors of the bank (budget, configured budget, sum of limits, floor, sum of
        # draw, energy, mode, budget source), 3 a card (limit, draw, energy).
        configs = await w.wait_for(lambda: len(c := [
            m for m in w.messages if str(m.topic).startswith("homeassistant/sensor/powerbudgetd_testbox/")
        ]) >= 8 + 3 * 4 and c)
        assert len(configs) == 8 + 3 * 4 and all(m.retain is False for m in configs)  # live, not replayed
        sensors = {json.loads(m.payload)["unique_id"]: json.loads(m.payload) for m in configs}  # type: ignore[arg-type]
        assert sensors["powerbudgetd_testbox_budget"]["device"]["identifiers"] == ["powerbudgetd_testbox"]
        card_devices = {s["device"]["identifiers"][0] for s in sensors.values() if "via_device" in s["device"]}
        assert len(card_devices) == 4
        assert all(s["device_class"] == "power" and s["unit_of_measurement"] == "W"
                   for s in sensors.values() if s["unique_id"].endswith(("_power", "_limit", "_limits", "_budget")))
        assert sensors["powerbudgetd_testbox_budget"]["state_topic"] == f"{BASE}/state"
        exposition = await asyncio.to_thread(scrape, metrics_port)  # one /metrics, ours included
        assert "powerbudgetd_mqtt_connected 1.0" in exposition and "powerbudgetd_budget_watts 1000.0" in exposition

        # Everything above is retained: a late subscriber (Home Assistant after a restart)
        # gets it at once. And HA's birth message asks for discovery again.
        async with watching(broker.port, [f"{BASE}/state", f"{BASE}/availability", "homeassistant/sensor/#"]) as late:
            assert late.payloads(f"{BASE}/availability") == [b"online"]
            assert late.last_json(f"{BASE}/state")["budget_w"] == 1000  # type: ignore[index]
            replayed = len(late.messages)
            await publish(broker.port, "homeassistant/status", "online")
            await late.wait_for(lambda: sum(1 for m in late.messages[replayed:] if "/config" in str(m.topic)) >= 20)

        daemon.kill()
        await w.wait_for(lambda: w.payloads(f"{BASE}/availability")[-1:] == [b"offline"], timeout=5)
    async with watching(broker.port, [f"{BASE}/availability"]) as after:
        assert after.payloads(f"{BASE}/availability") == [b"offline"]  # the will is retained


async def test_sigterm_publishes_the_last_state_then_offline(broker: Mosquitto, tmp_path: Path, launch: Launch) -> None:
    config = write_config(tmp_path, broker.port)
    async with watching(broker.port, [f"{BASE}/#"]) as w:
        daemon = launch(config)
        await w.wait_for(lambda: (s := w.last_json(f"{BASE}/state")) and s["mode"] == "dynamic")
        assert daemon.stop(10) == 0, daemon.tail()
        await w.wait_for(lambda: w.payloads(f"{BASE}/availability")[-1:] == [b"offline"], timeout=5)
        assert w.last_json(f"{BASE}/state")["mode"] == "stopping"  # type: ignore[index]








async def test_wall_meter_lowers_the_budget_and_bad_readings_do_not(broker: Mosquitto, tmp_path: Path) -> None:
    sensor = "tele/plug/SENSOR"
    # A retained reading from long ago, waiting on the broker: 1300 W would cut hard.
    await publish(broker.port, sensor, tasmota(1300), retain=True)
    config = write_config(tmp_path, broker.port, METER)
    with capture_logs() as logs:
        async with running(config) as r, watching(broker.port, [f"{BASE}/state"]) as w:
            ignored = lambda reason: r.metric("powerbudgetd_wall_readings_ignored_total", {"reason": reason})
            await r.until(lambda: ignored("stale") == 1)
            for payload in ["{not json", '{"ENERGY": {"Power": "lots"}}', tasmota(-40), tasmota(250_000), tasmota(60)]:
                await publish(broker.port, sensor, payload)
            await r.until(lambda: ignored("implausible") == 2)
            assert (ignored("garbled"), ignored("negative")) == (2, 1)
            assert r.bridge.meter.state == "implausible"  # type: ignore[union-attr]  # 60 W < idle GPUs / 0.9
            await asyncio.sleep(0.3)
            assert r.ctl.budget_mw == 1_000_000  # none of them moved the budget
            assert r.metric("powerbudgetd_wall_meter_ok") == 0

            # 700 W at the plug with ~120 W of idle GPUs: ~567 W is the host's, and the
            # 1440 W circuit leaves (1440 - 567) x 0.9 = ~786 W of board power.
            await publish(broker.port, sensor, tasmota(700))
            await r.until(lambda: r.ctl.budget_mw < 1_000_000)
            meter = r.bridge.meter
            assert meter is not None and meter.state == "implausible"  # it may lower: trusted after 5 plausible
            board_w = (700 - meter.non_gpu_w) * 0.9  # type: ignore[operator]
            assert 100 < board_w < 140  # four idle cards
            assert meter.allowed_w == pytest.approx((1440 - meter.non_gpu_w) * 0.9)  # type: ignore[operator]
            assert r.ctl.budget_mw == int((meter.allowed_w - 20) * 1000)  # type: ignore[operator]
            lowered_mw = r.ctl.budget_mw
            await r.until(lambda: r.ctl.sum_bound_mw <= lowered_mw)  # decreases written and confirmed
            state = await w.wait_for(lambda: (s := w.last_json(f"{BASE}/state")) and s["budget_source"] == "wall_meter" and s)
            # Still distrusted after the 60 W lie: its watts are not shown as fresh until trusted.
            assert state["budget_w"] == lowered_mw / 1000 and state["wall_meter"] == "implausible"

            # A noisy meter inside the dead band leaves the budget alone.
            for watts in (706, 695, 703, 698):
                await publish(broker.port, sensor, tasmota(watts))
            await r.until(lambda: meter.wall_w == 698)
            await asyncio.sleep(0.2)
            assert r.ctl.budget_mw == lowered_mw
            assert meter.state == "ok"  # the fifth plausible reading in a row: trusted again
            await w.wait_for(lambda: (s := w.last_json(f"{BASE}/state")) and s["wall_power_w"] == 698)

            # Silence past max_age_s: stale, and the lowered budget is kept, not raised.
            await r.until(lambda: meter.state == "stale", timeout=5)
            assert r.ctl.budget_mw == lowered_mw and ignored("stale") == 2
    budget_changes = [e for e in logs if e["event"] == "budget_changed"]
    assert len(budget_changes) == 1 and budget_changes[0]["source"] == "wall_meter"
    meter_warnings = [e["state"] for e in logs if e["event"] == "wall_meter_ignored"]
    assert meter_warnings == ["stale", "garbled", "negative", "implausible", "stale"]  # once per change




async def test_remote_budget_within_bounds_only(broker: Mosquitto, tmp_path: Path) -> None:
    config = write_config(tmp_path, broker.port, REMOTE)
    async with running(config) as r, watching(broker.port, [f"{BASE}/budget/result"]) as w:
        await r.until(lambda: r.bridge.connected)

        async def command(payload: str) -> dict[str, Any]:
            seen = len(w.payloads(f"{BASE}/budget/result"))
            await publish(broker.port, f"{BASE}/budget/set", payload)
            await w.wait_for(lambda: len(w.payloads(f"{BASE}/budget/result")) > seen)
            return json.loads(w.payloads(f"{BASE}/budget/result")[-1])

        ok = await command("800")
        assert ok["ok"] and ok["budget_w"] == 800
        await r.until(lambda: r.ctl.budget_mw == 800_000)
        await r.until(lambda: r.ctl.sum_bound_mw <= 800_000 and all(c.enforced_mw == 200_000 for c in r.ctl.cards))
        for payload, says in [("1200", "above the configured budget"), ("450", "below the sum of the cards' minimum"),
                              ("eight hundred", "not a number")]:
            bad = await command(payload)
            assert not bad["ok"] and says in bad["error"], bad
        await asyncio.sleep(0.2)
        assert r.ctl.budget_mw == 800_000
        assert (await command('{"budget_w": 1000}'))["ok"]  # restore
        await r.until(lambda: r.ctl.budget_mw == 1_000_000)


async def test_broker_down_at_start_then_killed_and_restarted_mid_run(stopped_broker: Mosquitto, tmp_path: Path) -> None:
    b = stopped_broker
    config = write_config(tmp_path, b.port)
    with capture_logs() as logs:
        async with running(config) as r:  # no broker: the daemon boots and controls anyway
            connected = lambda: r.metric("powerbudgetd_mqtt_connected")
            await asyncio.sleep(1.0)
            assert connected() == 0 and r.ctl.ready
            b.start()
            await r.until(lambda: connected() == 1, timeout=5)
            async with watching(b.port, [f"{BASE}/state"]) as w:
                await w.wait_for(lambda: w.payloads(f"{BASE}/state"))

            b.kill()
            await r.until(lambda: connected() == 0, timeout=5)
            # While the broker is gone the limits keep being written on time: a lower
            # budget (as a reload would set it) is acted on at the next tick.
            t_cut = time.monotonic()
            await asyncio.sleep(0.5)
            r.set_budget_w = 800
            await r.until(lambda: r.set_budget_w is None)
            await r.until(lambda: len(r.ticks) > r.budget_set_at)
            writes = list(r.ticks[r.budget_set_at][1].writes)  # the very next tick
            assert len(writes) == 4 and all(wr.to_w == 200 for wr in writes)
            await asyncio.sleep(1.0)  # several failed reconnects

            b.start()
            await r.until(lambda: connected() == 1, timeout=5)
            t_back = time.monotonic()
            async with watching(b.port, [f"{BASE}/state", f"{BASE}/availability"]) as w:
                state = await w.wait_for(lambda: (s := w.last_json(f"{BASE}/state")) and s["budget_w"] == 800 and s)
                assert state["sum_limits_w"] == 800
                assert w.payloads(f"{BASE}/availability")[-1:] == [b"online"]
            await asyncio.sleep(0.3)

    # The ticks kept their cadence through all of it (0.1 s; a blocked event loop would
    # show gaps of seconds: a connect attempt may take up to 5 s), the machine's load
    # apart (``Running.stalls``).
    times = [t for t, _ in r.ticks]
    assert max(r.stalls()) < 0.5, max(r.stalls())
    during = [t for t in times if t_cut <= t <= t_back]
    assert len(during) >= 0.7 * (t_back - t_cut) / 0.1
    events = [e["event"] for e in logs if e["event"].startswith("mqtt_")]
    assert events == ["mqtt_unavailable", "mqtt_connected", "mqtt_disconnected", "mqtt_connected"]  # once per change


def make_tls_broker(workdir: Path) -> tuple[Mosquitto, Path]:
    """A broker that wants TLS (a throwaway CA) and a user name and password."""
    def run(*args: str) -> None:
        subprocess.run(args, cwd=workdir, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test CA")
    run("openssl", "req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (workdir / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    passwd = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    run(passwd, "-c", "-b", "passwd", "pbd", "correct horse")
    b = Mosquitto(workdir)
    b.conf.write_text(
        ("user root\n" if os.geteuid() == 0 else "")  # keep reading our files after start
        + f"listener {b.port} 127.0.0.1\ncafile {workdir / 'ca.pem'}\ncertfile {workdir / 'server.pem'}\n"
        f"keyfile {workdir / 'server.key'}\nallow_anonymous false\npassword_file {workdir / 'passwd'}\n"
        "persistence false\n"
    )
    return b, workdir / "ca.pem"


async def test_tls_and_password_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b, ca = make_tls_broker(tmp_path)
    b.start()
    try:
        extra = f'tls = true\nca_file = "{ca}"\nusername = "pbd"\n'
        config = write_config(tmp_path, b.port, extra)
        monkeypatch.setenv("POWERBUDGETD_MQTT__PASSWORD", "wrong")
        with capture_logs() as logs:
            async with running(config) as r:  # refused: the daemon controls anyway
                await r.until(lambda: r.bridge.connected is False)
                await asyncio.sleep(0.5)
                assert r.ctl.ready and r.metric("powerbudgetd_mqtt_connected") == 0
        refused = [e for e in logs if e["event"].startswith("mqtt_")]
        assert [e["event"] for e in refused] == ["mqtt_unavailable"]
        assert "wrong" not in json.dumps(logs, default=str)

        monkeypatch.setenv("POWERBUDGETD_MQTT__PASSWORD", "correct horse")
        async with running(config) as r:
            await r.until(lambda: r.bridge.connected)
            tls = aiomqtt.TLSParameters(ca_certs=str(ca))
            async with aiomqtt.Client("127.0.0.1", b.port, username="pbd", password="correct horse", tls_params=tls) as c:
                await c.subscribe(f"{BASE}/availability")
                async with asyncio.timeout(5):
                    msg = await anext(aiter(c.messages))
            assert msg.payload == b"online"
    finally:
        b.kill()


async def test_a_reload_keeps_a_lower_meter_budget_in_force(broker: Mosquitto, tmp_path: Path) -> None:
    config = write_config(tmp_path, broker.port, METER.replace("max_age_s = 1.5", "max_age_s = 60"))
    async with running(config) as r:
        await r.until(lambda: r.bridge.connected)
        await publish(broker.port, "tele/plug/SENSOR", tasmota(700))
        await r.until(lambda: r.ctl.budget_mw < 1_000_000)
        lowered_mw = r.ctl.budget_mw

        n = len(r.ticks)
        r.daemon.request_reload()  # the same file: its 1000 W must not slip in for a tick
        await r.until(lambda: "reloaded" in r.daemon._reload_note and len(r.ticks) > n + 3)
        assert all(rep.budget_w * 1000 <= lowered_mw for _, rep in r.ticks[n:])
        assert r.ctl.budget_mw == lowered_mw and r.bridge.configured_w == 1000

        config.write_text(config.read_text().replace("budget_w = 1000", "budget_w = 700"))
        r.daemon.request_reload()  # a file below the meter's budget wins
        await r.until(lambda: r.ctl.budget_mw == 700_000)
        assert r.bridge.configured_w == 700
        await r.until(lambda: r.bridge.budget_source == "config")  # the next tick's snapshot says so
