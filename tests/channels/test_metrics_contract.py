"""The metrics contract: every name (and label) a reader uses — ``powerbudgetd status``,
the alert rules, the Grafana dashboard — is declared once in ``channels.metricnames``,
and every ``powerbudgetd_*`` family the exporters build is declared there too.

The scrape of a running daemon with a UPS and a circuit, checking each of those names
is served, is in ``tests/integration/test_metrics_served.py``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from powerbudgetd.channels import metricnames as n
from powerbudgetd.channels.circuit.channel import CircuitMetrics
from powerbudgetd.channels.meter import MeterMetrics
from powerbudgetd.channels.metrics import Metrics
from powerbudgetd.channels.mqtt.metrics import MqttMetrics
from powerbudgetd.channels.rapl import RaplMetrics
from powerbudgetd.channels.ups import UpsMetrics
from powerbudgetd.service import status

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "config" / "prometheus-rules.yml"
DASHBOARD = ROOT / "config" / "grafana-dashboard.json"

# A series name, and the label matchers right after it: powerbudgetd_x{a="b", c=~"d"}
_USE = re.compile(r"\b(powerbudgetd_[a-z0-9_]+)(\{[^}]*\})?")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


def uses(exprs: Iterable[str]) -> set[tuple[str, tuple[str, ...]]]:
    """(series name, label names matched on it) for each use in PromQL ``exprs``."""
    out = set()
    for expr in exprs:
        for m in _USE.finditer(expr):
            labels = tuple(sorted(_MATCHER.findall(m.group(2) or "")))
            out.add((m.group(1), labels))
    return out


def undeclared(used: Iterable[tuple[str, tuple[str, ...]]]) -> list[str]:
    """Each use of a name that is not declared, or of a label its metric does not carry
    (``instance`` and ``job`` come from the scrape)."""
    series = n.declared_series()
    wrong = []
    for name, labels in sorted(used):
        spec = series.get(name)
        if spec is None:
            wrong.append(f"{name} is not declared")
            continue
        extra = set(labels) - set(spec.labels) - {"instance", "job", "le"}
        if extra:
            wrong.append(f"{name} has no label {', '.join(sorted(extra))} (declared: {spec.labels})")
    return wrong


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in panels(doc["panels"]) for t in p.get("targets", []) if "expr" in t]
    exprs += [v.get("query", {}).get("query", "") if isinstance(v.get("query"), dict) else str(v.get("query", ""))
              for v in doc.get("templating", {}).get("list", [])]
    return exprs


def test_the_alert_rules_use_only_declared_names_and_labels() -> None:
    used = uses(rule_exprs())
    assert len({name for name, _ in used}) >= 15  # the extraction found the rules' series
    assert undeclared(used) == []


def test_the_dashboard_uses_only_declared_names_and_labels() -> None:
    used = uses(dashboard_exprs())
    assert len({name for name, _ in used}) >= 10
    assert undeclared(used) == []


def test_status_reads_only_declared_names() -> None:
    series = n.declared_series()
    assert [name for name in status.READS if name not in series] == []


def test_a_reader_with_an_undeclared_name_or_label_is_caught() -> None:
    """The check itself fails on a name the exporters do not declare (the old
    ``powerbudgetd_budget_source`` status read) and on a label a metric does not carry."""
    bad = uses(['powerbudgetd_budget_source{source="ups"} == 1', 'powerbudgetd_budget_watts{gpu="0"}'])
    assert undeclared(bad) == [
        "powerbudgetd_budget_source is not declared",
        "powerbudgetd_budget_watts has no label gpu (declared: ())",
    ]


def test_every_family_the_exporters_build_is_declared_with_its_type_and_labels() -> None:
    """Bank, UPS, MQTT and circuit metrics on one registry: each ``powerbudgetd_*``
    family is declared, with the same type, help and label names."""
    registry = CollectorRegistry()
    Metrics(registry)
    UpsMetrics(registry)
    mqtt = MqttMetrics(registry)
    mqtt.wall_power(500.0, 50.0)  # the wall series exist from the first reading on
    CircuitMetrics(registry)
    MeterMetrics(registry)  # the PDU's and the BMC's, labelled by source
    RaplMetrics(registry)
    by_name = {spec.name: spec for spec in n.DECLARED}
    seen = set()
    for fam in registry.collect():
        if not fam.name.startswith("powerbudgetd_"):
            continue
        spec = by_name.get(fam.name)
        assert spec is not None, f"{fam.name} is built but not declared"
        assert (fam.type, fam.documentation) == (spec.kind, spec.doc), fam.name
        for s in fam.samples:
            assert set(s.labels) <= set(spec.labels) | {"le"}, (s.name, s.labels)
        seen.add(fam.name)
    assert seen == set(by_name)  # and every declared metric is built by some exporter


def test_a_scrape_carries_process_metrics_and_no_created_series() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    UpsMetrics(registry)
    text = generate_latest(registry).decode()
    names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert {"process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds"} <= names
    assert [name for name in names if name.endswith("_created")] == []
