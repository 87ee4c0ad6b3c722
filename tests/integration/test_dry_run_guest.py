"""A dry run beside the running service is a guest: whichever starts first, the service
keeps its /metrics port, its mode and its availability on a real broker, and nothing the
dry run did is left behind when it exits. And the service corrects its own availability
topic whenever it reads anything but ``online`` there while connected."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from support.broker_daemon import BASE, write_config
from support.daemon import Launch, scrape
from support.mqtt import Mosquitto, Watcher, publish, watching
from support.wait import free_port

pytestmark = pytest.mark.slow  # a real Mosquitto and two daemons: the full run (CI) covers it


def modes(w: Watcher) -> list[str]:
    """Every mode the bank's state topic carried."""
    return [json.loads(p)["mode"] for p in w.payloads(f"{BASE}/state") if p]


async def test_a_dry_run_beside_the_service_leaves_its_metrics_mode_and_availability_alone(
        broker: Mosquitto, tmp_path: Path, launch: Launch) -> None:
    port = free_port()
    config = write_config(tmp_path, broker.port, metrics_port=port)
    async with watching(broker.port, [f"{BASE}/#", "homeassistant/#"]) as w:
        # the dry run first: it must not take the service's port
        guest = launch(config, "--dry-run", log=tmp_path / "guest.log")
        guest.wait_for(lambda: guest.events("metrics_listening"), "the dry run's metrics", 30)
        listening = guest.events("metrics_listening")[0]
        assert listening["port"] != port
        assert guest.events("dry_run_guest")[0]["left_out"] == ["mqtt"]
        service = launch(config, log=tmp_path / "service.log")
        await w.wait_for(lambda: "dynamic" in modes(w), timeout=30)
        body = await asyncio.to_thread(scrape, port)
        assert 'powerbudgetd_mode{mode="dynamic"} 1.0' in body  # the service's own /metrics
        time.sleep(3)  # both running: several of the service's publish intervals
        assert guest.returncode is None and service.returncode is None
        assert guest.stop(15) == 0, guest.tail()
        time.sleep(2)  # the dry run is gone: anything it left would show now
        assert "dry-run" not in modes(w)
        assert set(w.payloads(f"{BASE}/availability")) == {b"online"}
        assert 'powerbudgetd_mode{mode="dynamic"} 1.0' in await asyncio.to_thread(scrape, port)
        assert service.returncode is None
    async with watching(broker.port, [f"{BASE}/availability", f"{BASE}/state"]) as late:
        assert late.payloads(f"{BASE}/availability") == [b"online"]  # what the broker holds
        assert late.last_json(f"{BASE}/state")["mode"] == "dynamic"  # type: ignore[index]


async def test_the_service_restores_its_availability_whatever_is_published_there(
        broker: Mosquitto, tmp_path: Path, launch: Launch) -> None:
    """A stale ``offline`` (a will or goodbye of another client with this node id, in any
    order of disconnects and reconnects) is corrected while the service is connected."""
    config = write_config(tmp_path, broker.port)
    async with watching(broker.port, [f"{BASE}/availability"]) as w:
        service = launch(config)
        await w.wait_for(lambda: b"online" in w.payloads(f"{BASE}/availability"), timeout=30)
        for retain in (True, False, True):
            seen = len(w.messages)
            await publish(broker.port, f"{BASE}/availability", "offline", retain=retain)
            await w.wait_for(lambda seen=seen: [m.payload for m in w.messages[seen:]][-1:] == [b"online"]  # type: ignore[misc]
                             and len(w.messages) >= seen + 2, timeout=5)
        assert any(e.get("found") == "offline" for e in service.events("mqtt_availability_restored"))
    async with watching(broker.port, [f"{BASE}/availability"]) as late:
        assert late.payloads(f"{BASE}/availability") == [b"online"]
