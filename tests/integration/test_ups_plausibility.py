"""A UPS that lies, behind a real ``upsd`` and ``dummy-ups``: a measured load of 0 %, and a
real power of 0 W beside a high load, while the simulated cards draw 800 W, never raise
the budget; one warning says so, and the budget follows the UPS again only after a run
of plausible readings."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from powerbudgetd.channels.ups import UpsChannel
from powerbudgetd.core.plausible import TRUST_AFTER
from support.inprocess import running_daemon
from support.nut import Nut

pytestmark = pytest.mark.slow  # a real upsd and its driver: the full run (CI) covers it

POLL_S = 0.3
# Four workstation cards (150-300 W) at 200 W each: 800 W of board power, 889 W at the plug.
BUSY_4 = 'name = "busy-4"\nbank = "workstation-4"\nbudget_w = 1000\n' + (
    '[[cards]]\nphases = [{ at_s = 0, kind = "constant", power_w = 200 }]\n' * 4)


def write_config(tmp_path: Path, nut: Nut) -> Path:
    scenario = tmp_path / "busy-4.toml"
    scenario.write_text(BUSY_4)
    path = tmp_path / "powerbudgetd.toml"
    path.write_text(f"""budget_w = 1000
[metrics]
enabled = false
[recorder]
enabled = false
[feed]
breaker_a = 15
volts = 120
ups_w = 1500
ups_margin = 0.2  # the plug-side limit: 1200 W
psu_efficiency = 0.9
host_w = 50
transient_factor = 1.0
[sim]
scenario = "{scenario}"
[ups]
host = "127.0.0.1"
port = {nut.port}
name = "{nut.name}"
poll_s = {POLL_S}
timeout_s = 1
reconnect_max_s = 1
""")
    return path


def serve(nut: Nut, **variables: str) -> None:
    """Serve an on-line UPS of 1500 W nominal with ``variables``, and wait until upsd does
    (once it runs)."""
    nut.set("OL", **{"ups.realpower.nominal": "1500", **variables})
    for name, value in variables.items():
        nut.wait_for(name, value)


@pytest.mark.parametrize("lie", [{"ups.load": "0"}, {"ups.load": "95", "ups.realpower": "0"}],
                         ids=["load-0", "realpower-0-beside-load-95"])
async def test_a_ups_reading_below_our_own_draw_never_raises_the_budget(tmp_path: Path, lie: dict[str, str]) -> None:
    nut = Nut(tmp_path / "nut")
    serve(nut)  # no measured load until the cards draw their 800 W (a dummy UPS keeps what it once served)
    nut.start()
    try:
        await measured_lie(nut, tmp_path, lie)
    finally:
        nut.close()


async def measured_lie(nut: Nut, tmp_path: Path, lie: dict[str, str]) -> None:
    # 76 % of 1500 W = 1140 W at the plug with 800 W of board power: the 1200 W limit
    # allows 800 + 60 x 0.9 = 854 W of board power, 834 W after the dead band.
    with capture_logs() as logs:
        async with running_daemon(write_config(tmp_path, nut), ups=lambda settings, daemon, registry: UpsChannel(
                settings.ups, daemon.arbiter, settings.feed and settings.feed.feed(), registry=registry)) as r:
            await r.until(lambda: (r.ups.board_power_w() or 0) > 780, what="the cards at 800 W for 2 s")
            await asyncio.to_thread(serve, nut, **{"ups.load": "76"})
            await r.until(lambda: r.ctl.budget_mw < 1_000_000, what="the measured load's budget")
            held_mw = r.ctl.budget_mw
            assert 800_000 < held_mw < 860_000
            board_w = r.ups.board_power_w()
            assert board_w is not None and 780 < board_w < 820  # the cards draw 800 W under it

            lie_at = len(r.ticks)
            await asyncio.to_thread(serve, nut, **lie)
            polls = r.ups.polls
            await r.until(lambda: r.ups.polls >= polls + 8, what="eight polls of the lie")
            assert max(rep.budget_w for _, rep in r.ticks[lie_at:]) * 1000 <= held_mw  # never raised, not for one tick
            assert r.ctl.budget_mw == held_mw
            assert r.metric("powerbudgetd_ups_measured_load_trusted") == 0
            rejected = sum(r.metric("powerbudgetd_ups_readings_implausible_total", {"reason": reason}) or 0
                           for reason in ("sentinel", "below_own_draw"))
            assert rejected >= 8

            # Plausible again, and low: 60 % = 900 W at the plug (above our 889 W) allows
            # 800 + 300 x 0.9 = 1070 W, over the configured 1000 W: no longer limiting,
            # but only once TRUST_AFTER plausible readings in a row have come back.
            serve_at = len(r.ticks)
            await asyncio.to_thread(serve, nut, **{"ups.load": "60", "ups.realpower": "900"})
            polls = r.ups.polls
            await r.until(lambda: r.ctl.budget_mw == 1_000_000, what="the budget back at the configured 1000 W")
            assert r.ups.polls - polls >= TRUST_AFTER - 1  # not on the first plausible reading
            # not raised before trust is back (then it rises at core.sensor's bounded rate)
            first_up = next(t for t, rep in r.ticks[serve_at:] if rep.budget_w * 1000 > held_mw)
            assert first_up - r.ticks[serve_at][0] >= (TRUST_AFTER - 2) * r.ups.cfg.poll_s
            assert r.metric("powerbudgetd_ups_measured_load_trusted") == 1
    warned = [e for e in logs if e["event"] == "budget_input_implausible"]
    assert len(warned) == 1, warned  # once, not once per poll
    w = warned[0]
    assert w["source"] == "ups" and w["value_w"] == 0 and 780 < w["own_board_w"] < 820
    assert "ups reads 0 W at the plug while our cards drew" in w["detail"]
    assert [e["event"] for e in logs if e["event"] == "budget_input_trusted"] == ["budget_input_trusted"]
