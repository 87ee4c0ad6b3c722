"""``powerbudgetd run`` with ``[pdu]`` and ``[bmc]`` as an operator configures them: the
daemon as a process wires each meter to its budget loop, serves each figure and its age on
/metrics, and logs the budget each allows, against a real snmpd and a real Redfish server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.daemon import Launch, scrape
from support.redfish import RedfishMockup
from support.scenarios import idle_4
from support.snmpd import Snmpd
from powerbudgetd.core.pdumib import APC_DEVICE
from support.wait import free_port

pytestmark = pytest.mark.slow  # the daemon as a process, snmpd and a Redfish server


def sample(text: str, name: str, source: str) -> float | None:
    m = re.search(rf'^{name}\{{source="{source}"\}} (\S+)$', text, re.M)
    return None if m is None else float(m.group(1))


def test_the_daemon_wires_pdu_and_bmc_and_serves_their_figures(tmp_path: Path, launch: Launch) -> None:
    agent = Snmpd(tmp_path / "snmpd", "1.3.6.1.4.1.318")
    agent.set({f"{APC_DEVICE}.5.1": ("integer", 60), f"{APC_DEVICE}.16.1": ("integer", 63)})  # 600 W, 630 VA
    agent.start()
    bmc = RedfishMockup(tmp_path).start()
    bmc.power(2500)  # 100 W over the BMC's limit: the lower budget is the BMC's
    try:
        port = free_port()
        config = tmp_path / "powerbudgetd.toml"
        config.write_text(f"""budget_w = 1000
[metrics]
port = {port}
[recorder]
enabled = false
[feed]
breaker_a = 15
volts = 120
host_w = 50
transient_factor = 1.0
[sim]
scenario = "{idle_4(tmp_path)}"
[pdu]
host = "127.0.0.1"
port = {agent.port}
vendor = "apc"
community = "{agent.community}"
limit_w = 3600
hosts = 2
poll_s = 0.5
[bmc]
url = "{bmc.url}"
limit_w = 2400
poll_s = 0.5
""")
        config.chmod(0o600)
        d = launch(config)
        text = d.wait_for(lambda: (t := scrape(port, 1)) and sample(t, "powerbudgetd_meter_power_watts", "bmc") == 2500
                          and sample(t, "powerbudgetd_meter_power_watts", "pdu") == 600 and t,
                          "both meters' figures on /metrics", ignore=(OSError,))
        assert sample(text, "powerbudgetd_meter_reading_age_seconds", "pdu") is not None
        d.wait_for(lambda: d.events("bmc_budget"), "the BMC's budget logged")
        assert d.events("bmc_budget")[0]["budget_w"] < 1000
        assert not d.events("pdu_budget")  # 3000 W of headroom, half of it this host's: not limiting
        assert d.stop() == 0
    finally:
        agent.close()
        bmc.stop()
