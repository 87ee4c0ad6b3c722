"""One to three hosts behind one real UPS: each host's own UPS channel polls a real
``upsd`` (its ``dummy-ups`` driver), on the wall clock, while the plug's draw (every
host's wall power and an unmanaged load beside them) is written to the driver every
refresh. The figures are the simulator's (:class:`powerbudgetd_sim.sharedmeter.MeterTally`):
the plug within its limit after a demand step except for one refresh plus two polls
(plus the driver's own poll, which a real server adds), and no limit cycle."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from support.nut import Nut
from powerbudgetd.channels.ups import UpsChannel
from powerbudgetd.config import UpsConfig
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.feed import Feed
from powerbudgetd_sim import sharedmeter as m

pytestmark = pytest.mark.slow  # a real upsd, about a minute on the wall clock each

REFRESH_S = 2.0  # the plug's figure is written to the driver this often
POLL_S = 0.5  # each host's [ups] poll_s
DRIVER_POLL_S = 1.0  # dummy-ups's pollinterval (support.nut): a real server's own lag
TICK_S = 0.5  # each host's controller tick: the budget in force becomes its cards' limits
DT_S = 0.1  # the plant's step
STEP_S = 12.0  # the unmanaged load steps down, then ...
STEADY_S = m.STEADY_AFTER_S + 6.0  # ... holds long enough to judge a limit cycle


def scenario(hosts: int) -> m.MeterScenario:
    """``hosts`` busy hosts (1000 W board budgets) behind one UPS, an unmanaged load that
    steps from 900 W to 500 W: the simulator's shared set-up, on a 2 s refresh."""
    sc = m.shared(hosts, REFRESH_S)
    return dataclasses.replace(sc, name=f"{hosts} hosts, real upsd", poll_s=POLL_S,
                               unmanaged=m.steps((0, 900.0), (STEP_S, 500.0)),
                               duration_s=STEP_S + STEADY_S,
                               hosts=tuple(dataclasses.replace(h, demand=m.steps((0, 1000.0))) for h in sc.hosts))


async def play(nut: Nut, sc: m.MeterScenario) -> m.MeterFigures:
    """Run ``sc`` on the wall clock against ``nut``; the figures of its tally."""
    arbiters = [BudgetArbiter(h.budget_w) for h in sc.hosts]
    channels = [
        UpsChannel(UpsConfig(host="127.0.0.1", port=nut.port, name=nut.name, poll_s=sc.poll_s, timeout_s=1.0,
                             reconnect_max_s=1.0, hosts=len(sc.hosts)),
                   a, Feed(ups_w=sc.limit_w, ups_margin=0.0, psu_efficiency=sc.psu_efficiency, host_w=h.host_w),
                   registry=CollectorRegistry())
        for a, h in zip(arbiters, sc.hosts, strict=True)
    ]
    tally = m.MeterTally(sc, allowance_s=sc.refresh_s + 2 * sc.poll_s + DRIVER_POLL_S + TICK_S)
    caps = [h.budget_w for h in sc.hosts]
    tasks = [asyncio.create_task(c.run()) for c in channels]
    t0 = time.monotonic()
    next_refresh = next_tick = 0.0
    try:
        while (t := time.monotonic() - t0) < sc.duration_s:
            draws = [min(h.demand(t), cap) for h, cap in zip(sc.hosts, caps, strict=True)]
            plug = m.plug_w(sc, t, draws)
            if t >= next_refresh:  # the UPS's figure changes
                nut.set("OL", **{"ups.realpower": f"{plug:.0f}", "battery.charge": "100"})
                next_refresh += sc.refresh_s
            if t >= next_tick:
                now = time.monotonic()
                for c, d in zip(channels, draws, strict=True):
                    c.bank(now, d, 0.0)
                caps = [a.resolve(now).budget_w for a in arbiters]
                next_tick += TICK_S
            tally.sample(t, DT_S, plug, draws, caps)
            await asyncio.sleep(DT_S)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return tally.done()


@pytest.mark.parametrize("hosts", [1, 2, 3])
async def test_hosts_behind_one_real_ups_hold_its_limit_after_a_refresh_and_two_polls(
        tmp_path: Path, hosts: int) -> None:
    nut = Nut(tmp_path / "nut").start()
    try:
        f = await play(nut, scenario(hosts))
    finally:
        nut.close()
    assert f.over_beyond_allowance_s == 0.0, f.summary()
    assert f.swings_per_min <= m.MAX_SWINGS_PER_MIN, f.summary()
    # the loop did close: the hosts were held below their budgets, and used what was left
    assert f.work < 0.99 * sum(h.budget_w for h in scenario(hosts).hosts) * scenario(hosts).duration_s
    assert f.work >= 0.85 * f.oracle_work, f.summary()
    print(hosts, f.summary())
