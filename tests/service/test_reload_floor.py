"""A reload asking for less than the cards can be held to: the cards go to their floors
(nearer the file's budget than the old one), the reload counts as failed, and no log
line claims what did not happen."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from powerbudgetd.control.controller import Controller
from powerbudgetd.service.backend import make_nvml
from powerbudgetd.config import load_config
from powerbudgetd.service.daemon import Daemon

pytestmark = pytest.mark.slow  # the daemon on the wall clock: the full run (CI) covers it

CONFIG = "budget_w = {budget}\n[metrics]\nenabled = false\n[recorder]\nenabled = false\n"


def test_reload_below_the_floors_holds_the_cards_at_their_floors(tmp_path: Path) -> None:
    path = tmp_path / "pb.toml"
    path.write_text(CONFIG.format(budget=650))
    settings = load_config(path)
    nvml = make_nvml("sim")  # workstation-4: four cards with 150 W floors, 600 W in all
    daemon = Daemon(nvml, lambda n: Controller(n, 650, settings.control.timings()), config_path=path,
                    settings=settings)

    async def go() -> list[dict]:
        task = asyncio.create_task(daemon.run())
        await asyncio.sleep(1.5)
        path.write_text(CONFIG.format(budget=500))
        with capture_logs() as logs:
            daemon.request_reload()
            await asyncio.sleep(1.5)
        ctl = daemon.controller
        assert ctl is not None
        assert ctl.budget_mw == 600_000 and ctl.sum_bound_mw <= 600_000
        assert all(c.bound_mw == c.min_mw for c in ctl.cards)
        daemon.request_stop()
        assert await task == 0
        return logs

    logs = asyncio.run(go())
    failed = [e for e in logs if e["event"] == "reload_failed"]
    assert failed and failed[0]["kept_budget_w"] == 600.0 and failed[0]["held_at_floor_w"] == 600.0
    assert "500 W" in failed[0]["error"]
    # "holding the cards at their minimum limits" is said only when it is so
    said = [e for e in logs if e["event"] == "budget_below_floor"]
    assert all(e.get("floor_w") == 600.0 for e in said)
    assert "held at their floors" in daemon.status_text(daemon.controller)  # type: ignore[arg-type]
