"""A real Prometheus scraping ``powerbudgetd run --backend sim`` on loopback.

It loads the project's alert rules, reads the caps back through its HTTP API, sees the
lending roles, and answers every query of the Grafana dashboard.
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.daemon import DaemonProcess, Launch, NotifySocket
from support.wait import free_port, reap, wait_until
from support.paths import REPO

pytestmark = pytest.mark.slow  # a real Prometheus and the daemon as a subprocess: the full run (CI) covers it

CONFIG = REPO / "config"
# Every rule in the shipped file must load and evaluate in a real Prometheus.
RULE_NAMES = [r["alert"] for g in yaml.safe_load((CONFIG / "prometheus-rules.yml").read_text())["groups"] for r in g["rules"]]

# Errors a poll of Prometheus or of the daemon's log may meet before it is there.
NOT_YET = (OSError, AssertionError, KeyError, ValueError)


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read()


class Prom:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{url}: {exc.code} {exc.read().decode()}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def by_gpu(self, expr: str) -> dict[str, float]:
        return {r["metric"]["gpu"]: float(r["value"][1]) for r in self.query(expr)}


def start_daemon(launch: Launch, tmp_path: Path, port: int, notify: NotifySocket) -> DaemonProcess:
    """one-busy (card 0 pinned from the start, the rest idle); short holds so lending
    starts ~1.5 s after boot instead of ~5 s."""
    config = tmp_path / "powerbudgetd.toml"
    config.write_text(
        "budget_w = 1000\n"
        "[control]\ndonor_hold_s = 1.5\nrecipient_hold_s = 0.5\n"
        '[sim]\nscenario = "one-busy"\n'
        f"[metrics]\nport = {port}\n"
    )
    return launch(config, notify=notify)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        reap(p)


def start_prometheus(tmp_path: Path, procs: list[subprocess.Popen[bytes]], target_port: int) -> Prom:
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {CONFIG / 'prometheus-rules.yml'}\n"
        "scrape_configs:\n  - job_name: powerbudgetd\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
    )
    with (tmp_path / "prometheus.log").open("wb") as out:
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT,
        ))
    prom = Prom(port)
    wait_until(lambda: http_get(f"{prom.base}/-/ready"), 30, "Prometheus to be ready", step_s=0.2, ignore=NOT_YET)
    return prom


def test_prometheus_reads_caps_roles_rules_and_dashboard_queries(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], notify: NotifySocket, launch: Launch
) -> None:
    metrics_port = free_port()
    daemon = start_daemon(launch, tmp_path, metrics_port, notify)
    prom = start_prometheus(tmp_path, procs, metrics_port)

    daemon.wait_for(lambda: notify.with_key("READY"), "READY=1", 20)
    # /metrics was serving before READY=1 (it starts before the daemon boots).
    assert b"powerbudgetd_build_info" in http_get(f"http://127.0.0.1:{metrics_port}/metrics")

    # A scrape during lending: card 0 borrows from the three idle cards.
    def lending() -> dict[str, str] | None:
        roles = {r["metric"]["gpu"]: r["metric"]["role"] for r in prom.query('powerbudgetd_gpu_role == 1')}
        return roles if roles == {"0": "recipient", "1": "donor", "2": "donor", "3": "donor"} else None

    wait_until(lending, 30, "donor and recipient roles in Prometheus", step_s=0.2, ignore=NOT_YET)

    # Each card's cap as Prometheus stored it equals the limit the daemon wrote and the
    # simulated card enforces (the last power_limit_set per card in the daemon's log).
    def caps_agree() -> dict[str, float] | None:
        written = {str(e["index"]): e["to_w"] for e in daemon.events("power_limit_set")}
        caps = prom.by_gpu("powerbudgetd_gpu_power_limit_watts")
        enforced = prom.by_gpu("powerbudgetd_gpu_enforced_power_limit_watts")
        return caps if caps == enforced == written else None

    caps = wait_until(caps_agree, 15, "caps in Prometheus equal to the limits written", step_s=0.2, ignore=NOT_YET)
    assert caps == {"0": 300.0, "1": 150.0, "2": 150.0, "3": 150.0}
    assert float(prom.query("powerbudgetd_sum_power_limits_watts")[0]["value"][1]) <= 1000.0
    assert prom.query('up{job="powerbudgetd"}')[0]["value"][1] == "1"

    # The rules load and evaluate; the invariant alert is not even pending.
    def rules_evaluated() -> list[dict[str, Any]] | None:
        rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        return rules if len(rules) == len(RULE_NAMES) and all(r["health"] == "ok" and r["lastEvaluation"][:4] != "0001" for r in rules) else None

    rules = wait_until(rules_evaluated, 15, "every alert rule evaluated", step_s=0.2, ignore=NOT_YET)
    assert {r["name"]: r["state"] for r in rules}["PowerBudgetSumAboveBudget"] == "inactive"

    # Every dashboard query runs (as Grafana would send it, with "All" selected).
    dash = json.loads((CONFIG / "grafana-dashboard.json").read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$instance", ".*").replace("$gpu", ".*").replace("$__rate_interval", "5s")
            prom.query(expr)
            if panel["title"] == "Roles over time":  # role codes: 1 donor, 2 recipient
                assert prom.by_gpu(expr) == {"0": 2.0, "1": 1.0, "2": 1.0, "3": 1.0}

    assert daemon.stop(15) == 0, daemon.tail()


def test_a_taken_metrics_port_is_logged_and_the_daemon_keeps_the_budget(
    tmp_path: Path, notify: NotifySocket, launch: Launch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = start_daemon(launch, tmp_path, port, notify)
        daemon.wait_for(lambda: notify.with_key("READY"), "READY=1", 20)
        assert daemon.stop(15) == 0, daemon.tail()
    [err] = daemon.events("metrics_unavailable")
    assert (err["level"], err["port"]) == ("error", port)
    assert daemon.events("power_limit_set")
