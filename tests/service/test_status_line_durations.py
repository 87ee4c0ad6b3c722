"""The systemd status line says how long the bank has been over budget, a duration,
whatever the monotonic clock reads (on a host up for weeks it reads millions of s)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from powerbudgetd.config import load_config
from powerbudgetd.control.controller import Controller
from powerbudgetd.service.backend import make_nvml
from powerbudgetd.service.daemon import Daemon, _duration
from powerbudgetd.service.notify import Notifier

pytestmark = pytest.mark.slow  # the daemon on the wall clock: the full run (CI) covers it

UP_S = 5_000_000.0  # the monotonic clock of a host up for 58 days
# workstation-4 (150 W floors) at 650 W; from 0.5 s an outside limiter holds card 0's
# enforced limit at 300 W or more: 300 + 3 x 150 = 750 W of caps, over budget for good.
SCENARIO = """name = "held-over"
bank = "workstation-4"
budget_w = 650
[[events]]
at_s = 0.5
card = 0
action = "floor"
limit_w = 300
"""


class Recorded(Notifier):
    """Every STATUS= line the daemon sends."""

    def __init__(self) -> None:
        super().__init__("")
        self.lines: list[str] = []

    def send(self, *fields: str) -> bool:
        self.lines += [f.removeprefix("STATUS=") for f in fields if f.startswith("STATUS=")]
        return True


def test_the_over_budget_status_is_a_duration_on_a_large_monotonic_clock(tmp_path: Path) -> None:
    scenario = tmp_path / "held-over.toml"
    scenario.write_text(SCENARIO)
    config = tmp_path / "pb.toml"
    config.write_text(f'budget_w = 650\n[sim]\nscenario = "{scenario}"\n[metrics]\nenabled = false\n'
                      "[recorder]\nenabled = false\n")
    settings = load_config(config)
    notifier = Recorded()
    daemon = Daemon(make_nvml("sim", str(scenario)),
                    lambda n: Controller(n, 650, settings.control.timings(), clock=lambda: time.monotonic() + UP_S),
                    notifier=notifier, clock=lambda: time.monotonic() + UP_S, config_path=config, settings=settings)

    async def go() -> None:
        task = asyncio.create_task(daemon.run())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any("OVER BUDGET for 2." in line for line in notifier.lines):
            await asyncio.sleep(0.1)
        daemon.request_stop()
        assert await task == 0

    asyncio.run(go())
    over = [line for line in notifier.lines if "OVER BUDGET" in line]
    assert over, notifier.lines
    for line in over:
        m = re.search(r"OVER BUDGET for ([0-9.]+) s", line)
        assert m and float(m.group(1)) < 30, line  # seconds since it began, not the clock's reading


def test_durations_read_as_people_say_them() -> None:
    assert [_duration(s) for s in (4.24, 59.95, 725, 3 * 3600 + 125, 2 * 86400 + 4 * 3600 + 59, -1)] == [
        "4.2 s", "60.0 s", "12 min 5 s", "3 h 2 min", "2 d 4 h", "0.0 s"]
