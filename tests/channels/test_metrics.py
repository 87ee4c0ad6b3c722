"""Metrics: the exposition against the simulated bank's truth, and promtool on it."""

from __future__ import annotations

import platform
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from powerbudgetd import __version__
from powerbudgetd.config import Settings
from powerbudgetd.channels.metricnames import PEAK_WINDOW_S
from powerbudgetd.channels.metrics import ERROR_KINDS, Metrics, PeakWindow
from powerbudgetd.core.model import Mode, Role, Timings
from powerbudgetd_sim.libnvml import Fault
from powerbudgetd_sim.physics import BankEvent
from support.rig import Rig, scenario_rig
from support.paths import REPO

CONFIG = REPO / "config"
WALL0 = 1_700_000_000.0
TICK_COST_S = 0.003  # what the injected clock says each tick took


class Exposition:
    """The metrics a rig's ticks leave in a registry of their own, read back by name and
    labels. The injected clocks: each tick takes TICK_COST_S; wall time is WALL0 + t."""

    def __init__(self, rig: Rig) -> None:
        self.metrics = Metrics(CollectorRegistry(), nvml=rig.nvml, clock=lambda: rig.t + TICK_COST_S,
                               wall_clock=lambda: WALL0 + rig.t)
        self.ctl = rig.ctl
        rig.listen(self.metrics.on_tick)

    def value(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    def card(self, i: int) -> dict[str, str]:
        c = self.ctl.cards[i]
        return {"gpu": str(i), "UUID": c.uuid, "modelName": c.info.name}


def make_rig(faults: list[Fault] | None = None, dry_run: bool = False) -> tuple[Rig, Exposition]:
    """one-busy (card 0 pinned from the start, the rest idle: lending starts ~5 s after
    boot) at the default timings, its metrics exposed."""
    rig = scenario_rig("one-busy", Timings(), faults=faults or (), dry_run=dry_run)
    return rig, Exposition(rig)


def test_card_and_bank_metrics_match_the_simulated_bank_while_lending() -> None:
    rig, ex = make_rig()
    rig.run_until(10.0)
    ex.metrics.read_energy()  # as Metrics.run does every few seconds
    now = rig.bank.now
    for i, sim in enumerate(rig.bank.cards):
        lab = ex.card(i)
        assert ex.value("powerbudgetd_gpu_power_limit_watts", **lab) == sim.requested_mw / 1000
        assert ex.value("powerbudgetd_gpu_enforced_power_limit_watts", **lab) == sim.enforced_mw(now) / 1000
        assert ex.value("powerbudgetd_gpu_power_limit_min_watts", **lab) == 150.0
        assert ex.value("powerbudgetd_gpu_power_limit_max_watts", **lab) == 300.0
        assert ex.value("powerbudgetd_gpu_power_draw_watts", **lab) == pytest.approx(sim.avg_w, abs=0.001)
        assert ex.value("powerbudgetd_gpu_power_draw_instant_watts", **lab) == pytest.approx(sim.instant_w, abs=0.001)
        assert ex.value("powerbudgetd_gpu_energy_joules_total", **lab) == pytest.approx(sim.energy_mj / 1000, abs=0.001)
    # Card 0 borrows from the three idle ones.
    assert [rig.bank.cards[i].requested_mw for i in range(4)] == [300_000, 150_000, 150_000, 150_000]
    for i, role in enumerate([Role.RECIPIENT, Role.DONOR, Role.DONOR, Role.DONOR]):
        for r in Role:
            assert ex.value("powerbudgetd_gpu_role", **ex.card(i), role=str(r)) == (1.0 if r == role else 0.0)
    for m in Mode:
        assert ex.value("powerbudgetd_mode", mode=str(m)) == (1.0 if m == Mode.DYNAMIC else 0.0)
    assert ex.value("powerbudgetd_budget_watts") == 1000.0
    assert ex.value("powerbudgetd_sum_power_limits_watts") == 750.0
    assert ex.value("powerbudgetd_headroom_watts") == 250.0
    assert ex.value("powerbudgetd_sum_power_draw_watts") == pytest.approx(sum(c.avg_w for c in rig.bank.cards), abs=0.01)
    for i in range(4):
        assert ex.value("powerbudgetd_gpu_limit_changes_total", **ex.card(i), reason="boot") == 1.0
        assert ex.value("powerbudgetd_gpu_limit_changes_total", **ex.card(i), reason="lend") == 1.0
        for kind in ERROR_KINDS:  # present from the start, so increase() sees the first error
            assert ex.value("powerbudgetd_nvml_errors_total", **ex.card(i), kind=kind) == 0.0
    ticks = len(rig.reports)
    assert ex.value("powerbudgetd_tick_duration_seconds_count") == ticks
    assert ex.value("powerbudgetd_tick_duration_seconds_sum") == pytest.approx(ticks * TICK_COST_S)
    assert ex.value("powerbudgetd_last_tick_timestamp_seconds") == pytest.approx(WALL0 + rig.reports[-1].now)


def test_read_errors_are_counted_by_kind_and_stale_values_dropped() -> None:
    lost = Fault("nvmlDeviceGetPowerUsage", "GPU_IS_LOST", card=2, from_s=3.0, until_s=4.0)
    rig, ex = make_rig([lost])
    rig.run_until(3.5)
    lab = ex.card(2)
    assert ex.value("powerbudgetd_gpu_role", **lab, role="lost") == 1.0
    assert ex.value("powerbudgetd_mode", mode="failsafe") == 1.0
    # Unknown is absent, never 0 W: the lost card's limits and draw, and the bank's draw.
    assert ex.value("powerbudgetd_gpu_power_limit_watts", **lab) is None
    assert ex.value("powerbudgetd_gpu_power_draw_watts", **lab) is None
    assert ex.value("powerbudgetd_sum_power_draw_watts") is None
    assert ex.value("powerbudgetd_gpu_power_limit_min_watts", **lab) == 150.0
    assert ex.value("powerbudgetd_gpu_power_limit_watts", **ex.card(1)) is not None
    rig.run_until(6.0)
    failed_ticks = sum(1 for r in rig.reports if 3.0 <= r.now < 4.0)
    assert ex.value("powerbudgetd_nvml_errors_total", **lab, kind="gpu_lost") == failed_ticks == 10
    assert ex.value("powerbudgetd_nvml_errors_total", **lab, kind="other") == 0.0
    assert ex.value("powerbudgetd_nvml_errors_total", **ex.card(1), kind="gpu_lost") == 0.0
    assert ex.value("powerbudgetd_gpu_role", **lab, role="fair_share") == 1.0
    assert ex.value("powerbudgetd_gpu_power_limit_watts", **lab) == 250.0


def test_failed_writes_count_as_errors_not_changes() -> None:
    refused = Fault("nvmlDeviceSetPowerManagementLimit", "INVALID_ARGUMENT", card=1, count=1)
    rig, ex = make_rig([refused])
    rig.run_until(2.0)
    lab = ex.card(1)
    failed = [w for r in rig.reports for w in r.writes if w.error_kind is not None]
    assert [(w.index, w.error_kind) for w in failed] == [(1, "invalid_argument")]
    assert ex.value("powerbudgetd_nvml_errors_total", **lab, kind="invalid_argument") == 1.0
    # A refused value is never resent unchanged: no change is counted for that card.
    accepted = [w for r in rig.reports for w in r.writes if w.index == 1 and w.error is None]
    assert accepted == [] and not ex.value("powerbudgetd_gpu_limit_changes_total", **lab, reason="boot")


def test_dry_run_changes_nothing() -> None:
    rig, ex = make_rig(dry_run=True)
    rig.run_until(1.0)
    assert any(w.dry_run for r in rig.reports for w in r.writes)
    text = generate_latest(ex.metrics.registry).decode()
    assert not [line for line in text.splitlines() if line.startswith("powerbudgetd_gpu_limit_changes_total")]
    assert ex.value("powerbudgetd_mode", mode="dry-run") == 1.0


def test_energy_where_supported_and_never_read_at_scrape_time() -> None:
    unsupported = Fault("nvmlDeviceGetTotalEnergyConsumption", "NOT_SUPPORTED", card=3)
    rig, ex = make_rig([unsupported])
    rig.run_until(1.0)
    assert ex.value("powerbudgetd_gpu_energy_joules_total", **ex.card(0)) is None  # not read yet
    for _ in range(2):
        ex.metrics.read_energy()
        assert ex.value("powerbudgetd_gpu_energy_joules_total", **ex.card(3)) is None
        assert ex.value("powerbudgetd_gpu_energy_joules_total", **ex.card(0)) is not None
    assert ex.value("powerbudgetd_nvml_errors_total", **ex.card(3), kind="not_supported") == 0.0
    reads = []
    real = rig.nvml.energy_j
    rig.nvml.energy_j = lambda uuid: reads.append(uuid) or real(uuid)  # type: ignore[method-assign]
    for _ in range(3):
        ex.metrics.exposition()
        ex.value("powerbudgetd_gpu_energy_joules_total", **ex.card(0))
    assert reads == []  # a scrape calls no NVML ...
    ex.metrics.read_energy()
    assert sorted(reads) == sorted(c.uuid for c in ex.ctl.cards[:3])  # ... the energy round does


def test_a_card_whose_energy_read_fails_has_no_energy_series_until_it_reads_again() -> None:
    rig, ex = make_rig([Fault("nvmlDeviceGetTotalEnergyConsumption", "UNKNOWN", card=1, from_s=2.0, until_s=3.0)])
    rig.run_until(1.0)
    ex.metrics.read_energy()
    assert ex.value("powerbudgetd_gpu_energy_joules_total", **ex.card(1)) is not None
    rig.run_until(2.5)
    ex.metrics.read_energy()
    assert ex.value("powerbudgetd_gpu_energy_joules_total", **ex.card(1)) is None  # left out: Prometheus marks it stale
    assert ex.value("powerbudgetd_gpu_energy_joules_total", **ex.card(0)) is not None
    assert ex.value("powerbudgetd_nvml_errors_total", **ex.card(1), kind="other") == 1.0
    rig.run_until(3.5)
    ex.metrics.read_energy()
    assert ex.value("powerbudgetd_gpu_energy_joules_total", **ex.card(1)) is not None


def test_a_scrape_is_rendered_once_per_change() -> None:
    rig, ex = make_rig()
    rig.run_until(1.0)
    first = ex.metrics.exposition()
    assert ex.metrics.exposition() is first  # nothing changed: the same bytes, not rendered again
    rig.run_until(1.2)  # a tick
    again = ex.metrics.exposition()
    assert again is not first and b"powerbudgetd_budget_watts" in again


def test_before_the_first_tick_only_process_metrics_are_exposed() -> None:
    m = Metrics(CollectorRegistry(), wall_clock=lambda: WALL0)
    m.reload_result(True)
    assert m.registry.get_sample_value("powerbudgetd_budget_watts") is None
    assert m.registry.get_sample_value("powerbudgetd_mode", {"mode": "booting"}) is None
    build = {"version": __version__, "python_version": platform.python_version()}
    assert m.registry.get_sample_value("powerbudgetd_build_info", build) == 1.0
    assert m.registry.get_sample_value("powerbudgetd_config_last_reload_success") == 1.0
    assert m.registry.get_sample_value("powerbudgetd_config_last_reload_timestamp_seconds") == WALL0


def test_reload_result_records_failure_and_time() -> None:
    now = [WALL0]
    m = Metrics(CollectorRegistry(), wall_clock=lambda: now[0])
    m.reload_result(True)
    now[0] += 60
    m.reload_result(False)
    assert m.registry.get_sample_value("powerbudgetd_config_last_reload_success") == 0.0
    assert m.registry.get_sample_value("powerbudgetd_config_last_reload_timestamp_seconds") == WALL0 + 60


def test_the_simulated_bank_is_entered_by_one_call_at_a_time() -> None:
    # A scrape reads energy on its own thread while a tick reads (and, in the daemon, each
    # card is read in a worker thread of its own): the NVML layer holds no lock, so that a
    # hung call cannot stall the others; the simulated NVML library is thread-safe itself.
    rig, ex = make_rig()
    active = peak = 0
    guard = threading.Lock()
    real = rig.lib.bank.time

    def slow_time():  # type: ignore[no-untyped-def]
        nonlocal active, peak
        with guard:
            active += 1
            peak = max(peak, active)
        time.sleep(0.002)
        with guard:
            active -= 1
        return real()

    rig.lib.bank.time = slow_time  # type: ignore[method-assign]
    uuid = rig.ctl.cards[0].uuid
    threads = [threading.Thread(target=lambda: [rig.nvml.read(uuid) for _ in range(15)]) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert peak == 1


def test_over_budget_state_is_exported_while_an_outside_floor_holds_a_card() -> None:
    """Outside limiters hold two donors at 300 W from t = 8 s: the bank goes over budget
    and is brought back within a tick plus the lag; the gauge, counters and the snapshot
    (which MQTT publishes) say so."""
    rig, ex = make_rig()
    rig.run_until(8.0)
    boot_episodes = ex.value("powerbudgetd_over_budget_episodes_total")
    assert ex.value("powerbudgetd_over_budget") == 0.0 and boot_episodes is not None
    # 300 + 3 x 150 W under a 1000 W budget: floors of 300 W on two donors make 1050 W.
    rig.bank._events = [(8.05, i, BankEvent(8.05, i, "floor", limit_w=300.0)) for i in (1, 2)]
    seen = []
    while rig.t < 12.0:
        rig.run_until(rig.t + 0.1)
        seen.append((ex.value("powerbudgetd_over_budget"), rig.reports[-1].snapshot))
    over = [snap for v, snap in seen if v == 1.0]
    assert over, "the floor never put the bank over budget"
    assert all(snap.over_budget for snap in over) and "outside limit" in (over[0].over_budget_cause or "")
    assert seen[-1][0] == 0.0 and not seen[-1][1].over_budget  # corrected: the others came down
    assert ex.value("powerbudgetd_over_budget_episodes_total") == boot_episodes + 1
    seconds = ex.value("powerbudgetd_over_budget_seconds_total")
    assert seconds is not None and 0 < seconds - (rig.reports[79].snapshot.over_budget_s) <= 0.2 + 1e-9


# -- promtool ---------------------------------------------------------------------------
def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], input=stdin, capture_output=True, text=True, cwd=cwd, timeout=60)


CAMEL_LINT = "label names should be written in 'snake_case' not 'camelCase'"


def test_exposition_passes_promtool_check_metrics() -> None:
    lost = Fault("nvmlDeviceGetPowerUsage", "GPU_IS_LOST", card=2, from_s=6.0, until_s=6.5)
    rig, ex = make_rig([lost])
    rig.run_until(10.0)
    ex.metrics.reload_result(True)
    ex.metrics.read_energy()
    text = ex.metrics.exposition().decode()
    # modelName is dcgm-exporter's spelling, kept so dashboards can join on it; promtool
    # lints its camelCase and nothing else: the same exposition with the label renamed
    # is clean.
    out = promtool("check", "metrics", stdin=text)
    problems = {line.split(" ", 1)[1] for line in (out.stdout + out.stderr).splitlines() if line.strip()}
    assert out.returncode in (0, 3) and problems <= {CAMEL_LINT}, out.stdout + out.stderr
    clean = promtool("check", "metrics", stdin=text.replace("modelName", "model_name"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    broken = promtool("check", "metrics", stdin=text.replace("# TYPE powerbudgetd_budget_watts gauge", "# TYPE powerbudgetd_budget_watts counter"))
    assert broken.returncode != 0


ISSUE_METRICS = {
    "powerbudgetd_gpu_power_limit_watts", "powerbudgetd_gpu_enforced_power_limit_watts",
    "powerbudgetd_gpu_power_limit_min_watts", "powerbudgetd_gpu_power_limit_max_watts",
    "powerbudgetd_gpu_power_draw_watts", "powerbudgetd_gpu_power_draw_instant_watts",
    "powerbudgetd_gpu_energy_joules_total", "powerbudgetd_gpu_role", "powerbudgetd_gpu_limit_changes_total",
    "powerbudgetd_nvml_errors_total", "powerbudgetd_budget_watts", "powerbudgetd_sum_power_limits_watts",
    "powerbudgetd_sum_power_draw_watts", "powerbudgetd_headroom_watts", "powerbudgetd_mode",
    "powerbudgetd_tick_duration_seconds_bucket", "powerbudgetd_last_tick_timestamp_seconds",
    "powerbudgetd_config_last_reload_success", "powerbudgetd_config_last_reload_timestamp_seconds",
    "powerbudgetd_build_info", "powerbudgetd_over_budget", "powerbudgetd_over_budget_episodes_total",
    "powerbudgetd_over_budget_seconds_total", "powerbudgetd_gpu_power_readings_rejected_total",
}


def exposed_names() -> set[str]:
    rig, ex = make_rig()
    rig.run_until(1.0)
    ex.metrics.reload_result(True)
    ex.metrics.read_energy()
    text = ex.metrics.exposition().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_every_metric_the_issue_names_is_exposed() -> None:
    names = exposed_names()
    assert ISSUE_METRICS <= names, ISSUE_METRICS - names
    assert all(n.startswith(("powerbudgetd_", "process_")) for n in names)


def test_rules_pass_promtool_check_and_unit_tests() -> None:
    checked = promtool("check", "rules", "prometheus-rules.yml", cwd=CONFIG)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 23 rules found" in checked.stdout
    tested = promtool("test", "rules", "prometheus-rules.test.yml", cwd=CONFIG)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_for_severity_description_and_a_test() -> None:
    import yaml  # noqa: PLC0415 - only here

    rules = yaml.safe_load((CONFIG / "prometheus-rules.yml").read_text())["groups"][0]["rules"]
    names = [r["alert"] for r in rules]
    assert names == [
        "PowerBudgetdDown", "PowerBudgetSumAboveBudget", "PowerBudgetOverBudgetRecurring", "PowerBudgetBankNearBudget",
        "PowerBudgetLimitDrift", "PowerBudgetLimitContested", "PowerBudgetFailsafe", "PowerBudgetConfigReloadFailed",
        "PowerBudgetNvmlErrors",
        "PowerBudgetUpsOnBattery", "PowerBudgetUpsLowBattery", "PowerBudgetUpsOverload", "PowerBudgetUpsDataStale",
        "PowerBudgetCircuitGrantLost", "PowerBudgetCircuitEtcdUnreachable", "PowerBudgetCircuitSeatsExceed",
        "PowerBudgetCircuitDrawOverBudget", "PowerBudgetCircuitNodeDrawOverBudget",
        "PowerBudgetCircuitNodeMeterDisagrees", "PowerBudgetCircuitNodeRecordsOverBudget", "PowerBudgetCircuitFeedLost", "PowerBudgetCircuitRecordsDrift",
        "PowerBudgetCircuitRecordsUnreadable",
    ]
    for r in rules:
        assert r["for"] and r["labels"]["severity"] in ("critical", "warning", "info") and r["annotations"]["description"]
    tests = yaml.safe_load((CONFIG / "prometheus-rules.test.yml").read_text())["tests"]
    fired, quiet = set(), set()
    for t in tests:
        for case in t["alert_rule_test"]:
            (fired if case["exp_alerts"] else quiet).add(case["alertname"])
    assert fired == quiet == set(names)


def test_contested_limit_is_exposed_only_while_contested() -> None:
    rig, ex = make_rig()
    rig.bank._events = [(3.0, 0, BankEvent(3.0, 1, "set_limit", limit_w=300.0, every_s=2.0))]
    rig.run_until(2.5)
    lab = ex.card(1)
    assert ex.value("powerbudgetd_gpu_contested_power_limit_watts", **lab) is None
    rig.run_until(8.0)  # three outside writes within the window
    assert ex.value("powerbudgetd_gpu_contested_power_limit_watts", **lab) == 300.0


def test_an_outside_cap_is_exposed_only_while_it_holds_the_card() -> None:
    rig, ex = make_rig()
    rig.bank._events = [(3.0, 0, BankEvent(3.0, 0, "ceiling", limit_w=180.0))]  # card 0 busy
    rig.run_until(2.5)
    lab = ex.card(0)
    assert ex.value("powerbudgetd_gpu_outside_power_cap_watts", **lab) is None
    rig.run_until(6.0)
    assert ex.value("powerbudgetd_gpu_outside_power_cap_watts", **lab) == 180.0


def test_dashboard_is_import_ready() -> None:
    import json

    dash = json.loads((CONFIG / "grafana-dashboard.json").read_text())
    assert dash["uid"] == "powerbudgetd" and isinstance(dash["schemaVersion"], int) and dash["id"] is None
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "instance" in variables["gpu"]["definition"] and variables["instance"]["includeAll"]
    titles = [p["title"] for p in dash["panels"]]
    for needed in ("GPU $gpu: draw against its cap", "Bank: draw and caps against the budget", "Roles over time",
                   "Limit changes by reason"):
        assert needed in titles
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}" and '$instance"' in t["expr"], t["expr"]


def test_the_mode_panels_name_every_mode_and_the_sources_ups_and_circuit_have_panels() -> None:
    """Each mode gets its own number in the Mode panels' expression and its own name in
    their value mapping (monitor-only read as booting: 0)."""
    import json

    dash = json.loads((CONFIG / "grafana-dashboard.json").read_text())
    panels = {p["title"]: p for p in dash["panels"]}
    for title in ("Mode", "Mode over time"):
        expr = panels[title]["targets"][0]["expr"]
        numbered = dict(re.findall(r'mode="([a-z-]+)"\}\) \* (\d+)', expr))
        assert set(numbered) == {str(m) for m in Mode}, title
        assert len(set(numbered.values())) == len(numbered), title
        mapping = panels[title]["fieldConfig"]["defaults"]["mappings"][0]["options"]
        assert {numbered[m]: m for m in numbered} == {k: v["text"] for k, v in mapping.items()}, title
    for needed in ("Budget source in force", "Each budget source's value", "UPS: load and battery",
                   "UPS: runtime left", "Circuit: this host's reserve and grant (wall W)"):
        assert needed in panels


# -- config -----------------------------------------------------------------------------
def test_metrics_config_defaults_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings(budget_w=1000)
    assert (s.metrics.enabled, str(s.metrics.listen_address), s.metrics.port) == (True, "127.0.0.1", 19400)
    monkeypatch.setenv("POWERBUDGETD_METRICS__PORT", "19555")
    assert Settings(budget_w=1000).metrics.port == 19555
    monkeypatch.delenv("POWERBUDGETD_METRICS__PORT")
    assert str(Settings(budget_w=1000, metrics={"listen_address": "::"}).metrics.listen_address) == "::"
    with pytest.raises(ValueError, match="metrics.listen_address"):
        Settings(budget_w=1000, metrics={"listen_address": "localhost:19400"})
    with pytest.raises(ValueError, match="metrics.port"):
        Settings(budget_w=1000, metrics={"port": 0})


def test_each_budget_source_and_the_one_in_force() -> None:
    from dataclasses import replace

    from powerbudgetd.core.arbiter import BudgetArbiter

    rig, ex = make_rig()
    rig.run_until(0.5)
    assert ex.value("powerbudgetd_budget_source_watts", source="config") == 1000.0  # no arbiter: the budget
    assert ex.value("powerbudgetd_budget_source_in_force", source="config") == 1.0
    arb = BudgetArbiter(1000)
    arb.offer("wall_meter", 900, rig.t)
    arb.offer("remote", 950, rig.t)
    report = rig.reports[-1]
    ex.metrics.on_tick(replace(report, snapshot=report.snapshot.with_budget(arb.resolve(rig.t))))
    for source, watts, in_force in (("config", 1000.0, 0.0), ("wall_meter", 900.0, 1.0), ("remote", 950.0, 0.0)):
        assert ex.value("powerbudgetd_budget_source_watts", source=source) == watts
        assert ex.value("powerbudgetd_budget_source_in_force", source=source) == in_force
    assert ex.value("powerbudgetd_budget_watts") == 1000.0  # the controller's, until the daemon applies it


def test_each_cards_peak_is_the_highest_instant_reading_over_the_window() -> None:
    """The peak is every card's highest 100 ms reading over the last PEAK_WINDOW_S of
    ticks: never below the instant reading, and a reading older than the window drops."""
    rig, ex = make_rig()
    seen: dict[str, list[tuple[float, float]]] = {}

    def record(report) -> None:  # type: ignore[no-untyped-def]
        for c in report.snapshot.cards:
            if c.power_instant_w is not None:
                seen.setdefault(c.uuid, []).append((report.now, c.power_instant_w))

    rig.listen(record)
    rig.run_until(10.0)
    for i, c in enumerate(rig.ctl.cards):
        readings = seen[c.uuid]
        now = readings[-1][0]
        expected = max(w for t, w in readings if t >= now - PEAK_WINDOW_S)
        assert ex.value("powerbudgetd_gpu_power_draw_peak_watts", **ex.card(i)) == pytest.approx(expected)
    window = PeakWindow(1.0)
    for t, w in ((0.0, 300.0), (0.5, 100.0), (0.9, 200.0)):
        window.add(t, w)
    assert window.max_w == 300.0
    window.add(1.2, 50.0)  # 300 W at 0 s is older than 1 s now; 200 W at 0.9 s is the highest left
    assert window.max_w == 200.0
    window.expire(5.0)
    assert window.max_w is None
