"""Benchmark: what the per-tick side work adds to each tick, for 4, 8 and 64 cards.

Counted: building the bank snapshot (``bank_snapshot``, once per tick, shared by every
side channel), the daemon's budget keeper resolving the arbiter, and the MQTT bridge's
``on_tick`` (keeps 2 s of board power for the wall meter, wakes the publisher). Here
it runs after real controller ticks over a simulated bank on virtual time (no broker:
the listener never talks to one), and only its own CPU time is counted
(``time.process_time``). A JSON encoding of the state it hands over is timed as well:
the MQTT task pays that, not the tick.

    python benchmarks/mqtt_listener.py [--ticks 3000] [--cards 4 8 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from prometheus_client import CollectorRegistry

from powerbudgetd.config import FeedConfig, MqttConfig, WallMeterConfig
from powerbudgetd.control.controller import Controller
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.control.budgetkeeper import BudgetKeeper
from powerbudgetd.service.logs import configure_logging
from powerbudgetd.core.model import Timings
from powerbudgetd.channels.mqtt.session import MqttBridge
from powerbudgetd.channels.mqtt import discovery as ha
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import CardSpec, SimBank
from powerbudgetd_sim.profiles import Phase, Profile


def bank(n: int) -> list[CardSpec]:
    def spec(i: int) -> CardSpec:
        phases = (Phase(0.0, "constant", power_w=300.0),) if i % 2 else (Phase(0.0, "square", high_w=300.0, on_s=2, off_s=3),)
        return CardSpec(f"GPU-bench-{i}", "Bench GPU", 150.0, 300.0, 300.0, 30.0, Profile(phases))

    return [spec(i) for i in range(n)]


def run(n: int, ticks: int) -> dict[str, float]:
    sim = SimBank(bank(n), lag_s=0.1, seed=1)
    nvml = Nvml(SimNvmlLibrary(sim, []))
    nvml.init()
    ctl = Controller(nvml, 250.0 * n, Timings())
    ctl.start()
    now = [0.0]
    cfg = MqttConfig(host="localhost", node_id="bench", wall_meter=WallMeterConfig(preset="tasmota", topic="plug"))
    feed = FeedConfig(breaker_a=400, volts=480, host_w=300)
    keeper = BudgetKeeper(BudgetArbiter(250.0 * n))
    bridge = MqttBridge(cfg, keeper.arbiter, feed.feed(), registry=CollectorRegistry(), clock=lambda: now[0])
    listener_s, encode_s = [], []
    for i in range(ticks):
        now[0] = i * 0.1
        sim.advance_to(now[0])
        report = ctl.tick(now[0])
        t0 = time.process_time()
        ctl.snapshot(now[0])  # what the tick itself now spends on the snapshot
        keeper.apply(ctl, now[0])
        bridge.on_tick(report)
        t1 = time.process_time()
        snap = bridge.state.latest  # what the publisher reads
        assert snap is not None
        json.dumps(bridge.state.bank_state(snap))
        for card in snap.cards:
            json.dumps(ha.card_state(card))
        encode_s.append(time.process_time() - t1)
        listener_s.append(t1 - t0)
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1] * 1e6  # noqa: E731
    return {
        "cards": n,
        "listener_median_us": round(statistics.median(listener_s) * 1e6, 1),
        "listener_p99_us": round(q(listener_s, 99), 1),
        "encode_median_us": round(statistics.median(encode_s) * 1e6, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=3000)
    ap.add_argument("--cards", type=int, nargs="+", default=[4, 8, 64])
    args = ap.parse_args()
    configure_logging(level="error", stream=sys.stderr)
    for n in args.cards:
        print(json.dumps(run(n, args.ticks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
