"""One source of each default: the metrics port lives in config (DEFAULT_METRICS_PORT).

What can import it derives from it; what cannot (the command line's help, which must
not load pydantic at every start; the example config; the Kubernetes manifests; the
docs) is checked against it here, so a changed default fails until every copy follows.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from powerbudgetd import cli
from powerbudgetd.config import DEFAULT_METRICS_PORT, MetricsConfig
from powerbudgetd.service.status import default_url

ROOT = Path(__file__).resolve().parents[1]
PORT = DEFAULT_METRICS_PORT


def test_the_config_model_and_the_command_line_take_the_one_default() -> None:
    assert MetricsConfig().port == PORT
    assert cli.DEFAULT_METRICS_PORT == PORT


def test_status_falls_back_to_the_configs_default_address_and_port(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERBUDGETD_CONFIG", str(tmp_path / "absent.toml"))
    url, source = default_url(None)
    assert url == f"http://127.0.0.1:{PORT}/metrics" and "the default" in source


def test_the_example_config_states_the_default_port() -> None:
    doc = tomllib.loads((ROOT / "config/powerbudgetd.toml").read_text())
    assert doc["metrics"]["port"] == PORT


def test_the_kubernetes_manifests_expose_the_default_port() -> None:
    base = ROOT / "deploy/kubernetes/base"
    (ds,) = [d for d in yaml.safe_load_all((base / "daemonset.yaml").read_text()) if d and d["kind"] == "DaemonSet"]
    ports = [p for c in ds["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
    assert [p["containerPort"] for p in ports if p["name"] == "metrics"] == [PORT]
    (svc,) = [d for d in yaml.safe_load_all((base / "service.yaml").read_text()) if d and d["kind"] == "Service"]
    assert [p["port"] for p in svc["spec"]["ports"] if p["name"] == "metrics"] == [PORT]


# Every way the docs write the metrics port: a URL on this host, a scrape target, the
# [metrics] key, the prose.
DOC_PORT = re.compile(r"127\.0\.0\.1:(\d+)/metrics|gpu-host:(\d+)|^port = (\d+)|Port \*\*(\d+)\*\*", re.M)


@pytest.mark.parametrize("page", ["docs/integrations/prometheus.md", "docs/guides/commands.md",
                                  "docs/reference/commands.md", "docs/reference/configuration.md", "README.md"])
def test_the_docs_state_the_default_port(page: str) -> None:
    text = (ROOT / page).read_text()
    found = [int(next(g for g in m.groups() if g)) for m in DOC_PORT.finditer(text)]
    assert all(p == PORT for p in found), (page, found)
    if page == "docs/integrations/prometheus.md":
        assert len(found) >= 4  # the page that explains the port states it in each form


def test_the_port_is_written_once_in_the_product_besides_the_checked_help_mirror() -> None:
    places = []
    for path in sorted((ROOT / "powerbudgetd").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == PORT:
                places.append(path.relative_to(ROOT).as_posix())
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and str(PORT) in node.value:
                places.append(path.relative_to(ROOT).as_posix())
    assert sorted(places) == ["powerbudgetd/cli.py", "powerbudgetd/config/metrics.py"], places
