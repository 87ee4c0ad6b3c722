"""The MQTT bridge without a broker: a bridge built from a config, a loop that ticks it, meter payloads."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from prometheus_client import CollectorRegistry
from powerbudgetd.channels.mqtt.session import MqttBridge
from powerbudgetd.control.controller import Controller, TickReport
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.config import FeedConfig, MqttConfig, WallMeterConfig
from powerbudgetd.control.budgetkeeper import BudgetKeeper


FEED = FeedConfig(breaker_a=15, volts=120, psu_efficiency=0.9, host_w=200)  # 1440 W at the plug


TASMOTA = WallMeterConfig(preset="tasmota", topic="plug", max_age_s=5, hysteresis_w=20)


def tasmota(watts: object) -> bytes:
    return json.dumps({"Time": "2024-05-01T12:00:00", "ENERGY": {"Total": 1.9, "Power": watts, "Voltage": 120}}).encode()


# -- the bridge, the arbiter and the daemon's keeper over a real controller (ctl: conftest)
class Loop:
    """What the daemon's loop does around a tick, without the asyncio: apply the
    arbiter's budget, tick, stamp the snapshot, report the floor, feed the bridge."""

    def __init__(self, ctl: Controller, bridge: MqttBridge) -> None:
        self.ctl, self.bridge = ctl, bridge
        self.keeper = BudgetKeeper(bridge.arbiter)

    def tick(self, now: float) -> TickReport:
        self.keeper.apply(self.ctl, now)
        report = self.ctl.tick(now)
        snap = report.snapshot.with_budget(self.keeper.in_force)
        report = dataclasses.replace(report, snapshot=snap)
        self.keeper.arbiter.set_floor(snap.floor_w)
        self.bridge.on_tick(report)
        return report

    def boot(self) -> float:
        """Tick until every boot limit is confirmed (the simulated bank runs on the wall
        clock); returns the time of the last tick."""
        t0 = time.monotonic()
        while not self.ctl.ready:
            assert time.monotonic() - t0 < 10, "boot did not finish"
            self.tick(time.monotonic())
            time.sleep(0.02)
        return time.monotonic()


def bridge_for(cfg: MqttConfig, configured_w: float = 1000, feed: FeedConfig | None = None,
               registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.monotonic) -> MqttBridge:
    return MqttBridge(cfg, BudgetArbiter(configured_w), None if feed is None else feed.feed(),
                      registry=registry or CollectorRegistry(), clock=clock)
