"""``powerbudgetd run`` with ``[pdu]`` and ``[bmc]`` as an operator configures them: the
daemon as a process wires each meter to its budget loop, serves each figure and its age on
/metrics, and logs the budget each allows, against a real snmpd and a real Redfish server."""

from __future__ import annotations

import re
import threading
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


def test_the_daemon_measures_the_host_s_draw_from_rapl(tmp_path: Path, launch: Launch) -> None:
    zone = tmp_path / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    (zone / "energy_uj").write_text("0\n")
    stop = threading.Event()

    def count() -> None:  # the package draws 400 W: 40 J every 0.1 s
        uj = 0
        while not stop.wait(0.1):
            uj += 40_000_000
            tmp = zone / "energy_uj.tmp"
            tmp.write_text(f"{uj}\n")
            tmp.replace(zone / "energy_uj")

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
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
[rapl]
root = "{tmp_path / 'powercap'}"
window_s = 0.5
other_w = 60
""")
        d = launch(config)
        text = d.wait_for(lambda: (t := scrape(port, 1)) and re.search(r"^powerbudgetd_host_cpu_power_watts \d", t, re.M)
                          and t, "the packages' power on /metrics", ignore=(OSError,))
        cpu = float(re.search(r"^powerbudgetd_host_cpu_power_watts (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
        assert 300 < cpu < 500  # 400 W, give or take a write landing either side of a window
        host = float(re.search(r"^powerbudgetd_host_draw_watts (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
        assert host == pytest.approx(cpu + 60)
        # the circuit: 1440 W x 0.9 = 1296 W less ~460 W of host: the budget is the measured draw's
        d.wait_for(lambda: (t := scrape(port, 1)) and 'powerbudgetd_budget_source_in_force{source="rapl"} 1.0' in t,
                   "the budget from rapl", ignore=(OSError,))
        assert d.stop() == 0
    finally:
        stop.set()
        counter.join()
