"""Variables an orchestrator injects under our prefix (Kubernetes service links for a
Service named ``powerbudgetd-*``, Docker links for such a container) are recognised as
not ours and ignored: no warning, no "did you mean" that would fail when followed."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.config import classify_env, load_config

# What Kubernetes injects into every pod of the namespace for a Service named
# "powerbudgetd-metrics" with a port named "http" (19400/TCP), and one named "powerbudgetd".
KUBERNETES = {
    "POWERBUDGETD_METRICS_SERVICE_HOST": "10.96.0.12",
    "POWERBUDGETD_METRICS_SERVICE_PORT": "19400",
    "POWERBUDGETD_METRICS_SERVICE_PORT_HTTP": "19400",
    "POWERBUDGETD_METRICS_PORT": "tcp://10.96.0.12:19400",
    "POWERBUDGETD_METRICS_PORT_19400_TCP": "tcp://10.96.0.12:19400",
    "POWERBUDGETD_METRICS_PORT_19400_TCP_PROTO": "tcp",
    "POWERBUDGETD_METRICS_PORT_19400_TCP_PORT": "19400",
    "POWERBUDGETD_METRICS_PORT_19400_TCP_ADDR": "10.96.0.12",
    "POWERBUDGETD_SERVICE_HOST": "10.96.0.13",
    "POWERBUDGETD_PORT": "tcp://10.96.0.13:19400",
}
# A Docker link to a container aliased "powerbudgetd-ups" (legacy --link).
DOCKER = {
    "POWERBUDGETD_UPS_PORT": "tcp://172.17.0.3:3493",
    "POWERBUDGETD_UPS_PORT_3493_TCP": "tcp://172.17.0.3:3493",
    "POWERBUDGETD_UPS_NAME": "/powerbudgetd/powerbudgetd-ups",
    "POWERBUDGETD_UPS_ENV_UPSNAME": "gpuups",
}


@pytest.mark.parametrize("env", [KUBERNETES, DOCKER], ids=["kubernetes", "docker"])
def test_service_links_are_recognised_and_ignored(env: dict[str, str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    report = classify_env(env)
    assert sorted(report.links) == sorted(env) and report.unknown == [] and report.overrides == []
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "pb.toml"
    path.write_text("budget_w = 1000\n")
    settings = load_config(path)
    assert settings.warnings == []  # no advice at all, so none that fails when followed
    assert settings.metrics.port == 19400 and settings.ups is None


def test_a_mistyped_setting_that_looks_like_a_link_by_name_only_still_gets_its_hint() -> None:
    report = classify_env({"POWERBUDGETD_METRICS_PORT": "19500", "POWERBUDGETD_METRICS_NAME": "box"})
    assert report.links == []
    assert ("POWERBUDGETD_METRICS_PORT", "POWERBUDGETD_METRICS__PORT") in report.unknown
