"""The metrics contract on a running daemon, and `status` telling what is true.

One daemon (``run --backend sim``) with a UPS behind a real ``upsd`` and a circuit in a
real etcd: every name each reader uses (``status``, the alert rules, the dashboard) is
served, every ``powerbudgetd_*`` family served is declared; `status` names the UPS as
the source while it holds the budget, shows the UPS and the circuit seat, and a card's
peak (the highest 100 ms reading over the window) apart from its instant reading."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from powerbudgetd.channels import metricnames as n
from powerbudgetd.service import status
from support.circuit import EXE, EtcdCluster, init_circuit
from support.daemon import Launch, cli, no_traceback, scrape
from support.nut import Nut
from support.wait import free_port

pytestmark = pytest.mark.slow  # real upsd, etcd and a daemon: the full run (CI) covers it

# workstation-4 (4 x 150-300 W): card 0 at 300 W for its first 3 s, then idle.
SCENARIO = """name = "busy-then-idle"
bank = "workstation-4"
budget_w = 1000
[[cards]]
phases = [{ at_s = 0, kind = "constant", power_w = 300, workload = "compute" }, { at_s = 3, kind = "idle" }]
[[cards]]
phases = [{ at_s = 0, kind = "idle" }]
[[cards]]
phases = [{ at_s = 0, kind = "idle" }]
[[cards]]
phases = [{ at_s = 0, kind = "idle" }]
"""


def write_config(tmp_path: Path, nut: Nut, etcd1: EtcdCluster, port: int) -> Path:
    scenario = tmp_path / "busy-then-idle.toml"
    scenario.write_text(SCENARIO)
    eps = ", ".join(f'"{e}"' for e in etcd1.endpoints)
    config = tmp_path / "powerbudgetd.toml"
    config.write_text(f"""budget_w = 1000
[control]
tick_s = 0.1
[sim]
scenario = "{scenario}"
[metrics]
port = {port}
[recorder]
enabled = false
[ups]
host = "127.0.0.1"
port = {nut.port}
name = "{nut.name}"
poll_s = 0.3
timeout_s = 1
reconnect_max_s = 1
on_battery_budget_w = 700
[circuit]
name = "lab"
endpoints = [{eps}]
host = "h1"
reserve_w = 1300
psu_efficiency = 0.9
host_w = 50
poll_s = 0.2
request_timeout_s = 0.5
""")
    return config


def served_series(text: str) -> set[str]:
    """Every sample name the scrape announces (a family with its TYPE but no sample yet,
    such as a contested limit, counts as served: its name and type are)."""
    out = set()
    for fam in text_string_to_metric_families(text):
        spec = n.MetricSpec(fam.name, fam.type if fam.type in ("gauge", "counter", "histogram", "info") else "gauge", "")
        out.update(spec.series)
        out.update(s.name for s in fam.samples)
    return out


def test_every_name_a_reader_uses_is_served_and_status_tells_the_truth(
        nut: Nut, etcd1: EtcdCluster, tmp_path: Path, launch: Launch) -> None:
    init_circuit(etcd1.endpoints, "lab", 4000, 10)
    port = free_port()
    config = write_config(tmp_path, nut, etcd1, port)
    joined = subprocess.run([EXE, "circuit", "join", "--backend", "sim", "--config", str(config)],
                            capture_output=True, text=True,
                            timeout=30)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    daemon = launch(config)

    def body_with(needle: str, what: str) -> str:
        return daemon.wait_for(lambda: b if needle in (b := scrape(port, timeout_s=2)) else None, what, 30,
                               step_s=0.1, ignore=(OSError,))

    body_with('powerbudgetd_ups_status{flag="OL"} 1.0', "the UPS on line")
    text = body_with("powerbudgetd_circuit_seat_fits 1.0", "the circuit seat")

    # -- the contract: what each reader uses is served; what is served is declared ------
    served = served_series(text)
    from_rules = _names(Path(__file__).resolve().parents[2] / "config" / "prometheus-rules.yml")
    from_dashboard = _names(Path(__file__).resolve().parents[2] / "config" / "grafana-dashboard.json")
    for reader, used in (("status", set(status.READS)), ("rules", from_rules), ("dashboard", from_dashboard)):
        assert used, reader
        assert sorted(used - served) == [], f"{reader} uses names the daemon does not serve"
    declared = n.declared_series()
    ours = {s for s in served if s.startswith("powerbudgetd_")}
    assert sorted(s for s in ours if s not in declared and not s.endswith("_created")) == []

    # -- status: on battery the UPS holds the budget, and status says so --------------------
    nut.set("OB DISCHRG", **{"battery.runtime": "420", "ups.load": "55", "battery.charge": "80"})
    body_with('powerbudgetd_budget_source_in_force{source="ups"} 1.0', "the UPS in force")

    def status_json() -> dict:
        p = cli("status", "--url", f"http://127.0.0.1:{port}/metrics", "--json")
        no_traceback(p)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    # Card 0's busy 3 s are over (a fast start reaches this point before): it idles now.
    s = daemon.wait_for(lambda: d if ((d := status_json())["cards"][0]["instant_w"] or 1e9) < 150 else None, "card 0 idle",
                        30, step_s=0.2)
    assert (s["budget_w"], s["budget_source"], s["configured_w"]) == (700.0, "ups", 1000.0)
    assert "OB" in s["ups"]["flags"] and s["ups"]["runtime_s"] == 420 and s["ups"]["load_ratio"] == 0.55
    assert s["circuit"]["reserve_w"] == 1300 and s["circuit"]["seat_fits"] and s["circuit"]["etcd_reachable"]
    card0 = s["cards"][0]
    # card 0 drew 300 W for its first 3 s and idles now: the window still holds that peak
    assert card0["peak_w"] is not None and card0["instant_w"] is not None, s["cards"]
    assert card0["peak_w"] > 250 and card0["peak_w"] > card0["instant_w"] + 50, card0
    assert all(c["peak_w"] >= c["instant_w"] for c in s["cards"])
    text_out = cli("status", "--url", f"http://127.0.0.1:{port}/metrics")
    assert "budget 700 W (source: ups, configured 1000 W)" in text_out.stdout, text_out.stdout
    assert "ups on battery" in text_out.stdout and "runtime 420 s" in text_out.stdout
    assert "circuit budget 4000 W, seat (reserve) 1300 W" in text_out.stdout
    assert daemon.stop(15) == 0, daemon.tail()


def _names(path: Path) -> set[str]:
    """The ``powerbudgetd_*`` names in a reader's file."""
    return set(re.findall(r"\bpowerbudgetd_[a-z0-9_]+\b", path.read_text()))
