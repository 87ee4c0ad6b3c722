"""deploy/kubernetes: every overlay rendered by ``kubectl kustomize`` and validated against
the API schemas of each Kubernetes version the README names (``kubernetes-validate``,
strict: an unknown field fails), and the DaemonSet checked for each thing a GPU node
needs of it. No cluster is involved: what a cluster would do with these objects (the
admission policy's CEL, the kubelet's hostPath mounts) is not tested here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from powerbudgetd.config import load_config
from powerbudgetd.config.kubernetes import DEFAULT_TAINT
from powerbudgetd.control.failsafe import CALL_TIMEOUT_S, DEADLINE_S, INIT_TIMEOUT_S
from powerbudgetd.service.pod import STOP_TIMEOUT_S
from support.paths import REPO, manual

KUBE = REPO / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBE / "overlays").iterdir())
VERSIONS = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35")  # the manual's "Kubernetes 1.30 to 1.35" (docs/getting-started/kubernetes.md)
CONTAINER_ROOTS = {"gpu-operator-driver": "/run/nvidia/driver", "host-driver": "/"}


def render(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(KUBE / "overlays" / name) for name in OVERLAYS}


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def test_the_readme_names_the_versions_validated() -> None:
    assert f"Kubernetes {VERSIONS[0]} to {VERSIONS[-1]}" in " ".join(manual().split())
    assert OVERLAYS == sorted(CONTAINER_ROOTS)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_overlay_validates_against_the_api_schemas(rendered: dict[str, list[dict[str, Any]]], version: str) -> None:
    for name, docs in rendered.items():
        kinds = sorted(d["kind"] for d in docs)
        assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Namespace", "Service",
                         "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"], name
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{name}: {doc['kind']} {doc['metadata']['name']} on {version}: {exc}") from None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_daemonset_carries_what_a_gpu_node_needs(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    docs = rendered[overlay]
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["securityContext"] == {"privileged": True}
    assert "nvidia.com/gpu" not in str(c.get("resources")), "it must not take a GPU from the workloads"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    tolerated = {(t["key"], t["effect"]) for t in pod["tolerations"] if t["operator"] == "Exists"}
    assert {("nvidia.com/gpu", "NoSchedule"), (DEFAULT_TAINT, "NoSchedule")} <= tolerated
    env = {e["name"]: e for e in c["env"]}
    assert env["POWERBUDGETD_KUBERNETES__NODE"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_DRIVER_ROOT"]["value"] == CONTAINER_ROOTS[overlay]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["driver-root"]["mountPath"] == env["CONTAINER_DRIVER_ROOT"]["value"]
    assert volumes["driver-root"]["hostPath"]["path"] == CONTAINER_ROOTS[overlay]
    # the flight recorder (and original-limits.json) on the host, the lock shared with a host's daemon
    assert volumes["state"]["hostPath"]["path"] == mounts["state"]["mountPath"] == "/var/lib/powerbudgetd"
    assert volumes["run"]["hostPath"]["path"] == mounts["run"]["mountPath"] == "/run/powerbudgetd"
    # config from the ConfigMap, secrets from a Secret read as credentials
    config_map = one(docs, "ConfigMap")
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert volumes["secrets"]["secret"]["secretName"] == "powerbudgetd-secrets"
    assert env["CREDENTIALS_DIRECTORY"]["value"] == mounts["secrets"]["mountPath"]
    # the entrypoint, its preStop, and a grace period the stop and the failsafe fit in
    command = c["command"]
    assert command[:3] == ["powerbudgetd", "pod", "run"]
    assert c["lifecycle"]["preStop"]["exec"]["command"][:3] == ["powerbudgetd", "pod", "stop"]
    stop_s = float(command[command.index("--stop-timeout") + 1]) if "--stop-timeout" in command else STOP_TIMEOUT_S
    failsafe_s = INIT_TIMEOUT_S + DEADLINE_S + CALL_TIMEOUT_S + 2.0
    assert pod["terminationGracePeriodSeconds"] >= stop_s + failsafe_s + 10, "no room for the failsafe"
    # ready (for a rolling update) from the daemon's READY=1: the file `pod run` keeps for it
    assert c["readinessProbe"]["exec"]["command"] == ["test", "-e", command[command.index("--ready-file") + 1]]
    if overlay == "gpu-operator-driver":
        assert command[command.index("--wait-for") + 1] == "/run/nvidia/validations/driver-ready"
        assert mounts["validations"]["mountPath"] == "/run/nvidia/validations"
    else:
        assert "--wait-for" not in command
    # metrics: the container's port behind the headless Service
    service = one(docs, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"] == "metrics"
    assert service["spec"]["selector"].items() <= one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"].items()


def test_rbac_allows_get_and_patch_on_nodes_and_nothing_else(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["host-driver"]
    assert one(docs, "ClusterRole")["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    sa = one(docs, "ServiceAccount")["metadata"]
    assert one(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == sa["name"]
    policy = one(docs, "ValidatingAdmissionPolicy")
    text = yaml.safe_dump(policy)
    assert f"system:serviceaccount:{sa['namespace']}:{sa['name']}" in text
    assert "authentication.kubernetes.io/node-name" in text and DEFAULT_TAINT in text
    assert one(docs, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == policy["metadata"]["name"]


def test_the_configmaps_config_loads_with_the_node_from_the_pod(rendered: dict[str, list[dict[str, Any]]],
                                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (name, text), = one(rendered["host-driver"], "ConfigMap")["data"].items()
    path = tmp_path / name
    path.write_text(text)
    monkeypatch.setenv("POWERBUDGETD_KUBERNETES__NODE", "gpu-node-1")
    settings = load_config(path, euid=1000)
    assert settings.kubernetes is not None and settings.kubernetes.node == "gpu-node-1"
    assert settings.kubernetes.taint == DEFAULT_TAINT
    assert str(settings.metrics.listen_address) == "0.0.0.0"


def test_the_servicemonitor_component_scrapes_the_service(tmp_path: Path) -> None:
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBE, tree)
    overlay = tree / "overlays" / "with-servicemonitor"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../host-driver\n"
        "components:\n  - ../../components/servicemonitor\n")
    docs = render(overlay)
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_the_image_runs_the_entrypoint_the_daemonset_names() -> None:
    dockerfile = (REPO / "deploy" / "container" / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    assert cmd and yaml.safe_load(cmd.group(1))[:3] == ["powerbudgetd", "pod", "run"]
    pod = yaml.safe_load((KUBE / "base" / "daemonset.yaml").read_text())["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"][:5] == yaml.safe_load(cmd.group(1))[:5]
    assert 'powerbudgetd = "powerbudgetd.__main__:main"' in (REPO / "pyproject.toml").read_text()


def test_the_manuals_install_and_uninstall_render_with_kubectl_alone(tmp_path: Path) -> None:
    """The manual's own overlay (its heredoc, verbatim), beside a copy of deploy/, then
    with the line its uninstall appends: the image is the one built, and the restore
    component turns the daemon's command into ``pod restore`` with the overlay's own
    arguments (the driver wait included), which the command line accepts."""
    from powerbudgetd.cli import _parser

    page = (REPO / "docs" / "getting-started" / "kubernetes.md").read_text()
    body = re.search(r"cat > my-cluster/kustomization.yaml <<'END'\n(.*?)\nEND\n", page, re.DOTALL)
    append = re.search(r"^echo '(components: .*)' >> my-cluster/kustomization.yaml", page, re.MULTILINE)
    assert body and append, "the manual's install or uninstall changed: update this test"
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    mine = tmp_path / "my-cluster"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(body.group(1).replace("REGISTRY", "registry.example") + "\n")
    installed = render(mine)
    (c,) = one(installed, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "registry.example/powerbudgetd:0.1.0"
    with (mine / "kustomization.yaml").open("a") as f:
        f.write(append.group(1) + "\n")
    restoring = render(mine)
    for doc in restoring:
        kubernetes_validate.validate(doc, VERSIONS[0], strict=True)
    (r,) = one(restoring, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert r["command"] == [*c["command"][:2], "restore", *c["command"][3:]]
    assert "--wait-for" in r["command"]  # gpu-operator-driver: the driver waited for, as by the daemon
    args = _parser().parse_args(r["command"][1:])
    assert args.action == "restore" and args.wait_for == Path("/run/nvidia/validations/driver-ready")
