"""The readiness gate on a Kubernetes Node, as processes: ``powerbudgetd run --backend sim``
with ``[kubernetes]`` against a local stand-in for the API's Node endpoint
(:mod:`support.kubeapi`, HTTPS with the pod's token and CA; not an API server).

The startup taint must go only once every card's fair share is read back (READY=1), and
never when boot fails; the labels must give the budget and the cards' limit range; other
taints must stay, through a taint list that changes under the patch and API errors.
"""

from __future__ import annotations

from pathlib import Path

from support.daemon import DaemonProcess, NotifySocket
from support.kubeapi import FakeNodeApi

from powerbudgetd.channels.node import node_labels, untaint_ops
from powerbudgetd.errors import ExitStatus

NODE = "gpu-node-7"
OURS = {"key": "powerbudgetd/uncapped", "value": "true", "effect": "NoSchedule"}
OTHER = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}


def config(tmp_path: Path, api: FakeNodeApi, budget_w: float = 1000, scenario: str = "workstation-4",
           extra: str = "") -> Path:
    path = tmp_path / "pb.toml"
    path.write_text(
        f"budget_w = {budget_w}\n{extra}[recorder]\nenabled = false\ndir = '{tmp_path / 'rec'}'\n[metrics]\nenabled = false\n"
        f"[sim]\nscenario = '{scenario}'\nlag_s = 0.3\n"
        f"[kubernetes]\napi_server = '{api.url}'\nservice_account_dir = '{api.service_account_dir}'\n")
    return path


def launch(cfg: Path, **kw: object) -> DaemonProcess:
    # The node's name as the DaemonSet gives it: the downward API, into the settings' variable.
    return DaemonProcess(cfg, env={"POWERBUDGETD_KUBERNETES__NODE": NODE}, **kw)  # type: ignore[arg-type]


def test_the_taint_goes_only_after_ready_and_the_labels_are_published(tmp_path: Path) -> None:
    with FakeNodeApi(tmp_path, NODE, taints=[OTHER, OURS]) as api, NotifySocket() as notify:
        with launch(config(tmp_path, api), notify=notify) as daemon:
            daemon.wait_for(lambda: daemon.events("node_untainted"), "the taint removed", timeout_s=60)
            assert notify.with_key("READY"), "untainted without READY=1"
            names = [e["event"] for e in daemon.events()]
            assert names.index("ready") < names.index("node_labels_published") < names.index("node_untainted")
            assert daemon.stop() == 0
        assert api.taints == [OTHER]  # only ours removed
        labels = api.labels
        assert labels["kubernetes.io/hostname"] == NODE  # the node's own labels kept
        # workstation-4: four 150-300 W cards under 1000 W
        assert {k: v for k, v in labels.items() if k.startswith("powerbudgetd/")} == {
            "powerbudgetd/budget-w": "1000", "powerbudgetd/gpus": "4",
            "powerbudgetd/gpu-limit-min-w": "150", "powerbudgetd/gpu-limit-max-w": "300"}
        patches = api.patches()
        assert [p.content_type for p in patches] == ["application/merge-patch+json", "application/json-patch+json"]
        assert patches[1].body[0] == {"op": "test", "path": "/spec/taints", "value": [OTHER, OURS]}


def test_the_taint_stays_when_boot_fails(tmp_path: Path) -> None:
    # Card 1 refuses every write at 300 W: with the others at their 150 W floors the bank
    # needs 750 W, over the 700 W budget, and boot gives up (exit 9) without READY.
    (tmp_path / "bank.toml").write_text('bank = "workstation-4"\nlag_s = 0.1\n[[faults]]\n'
                                        'call = "nvmlDeviceSetPowerManagementLimit"\nerror = "UNKNOWN"\ncard = 1\n')
    with FakeNodeApi(tmp_path, NODE, taints=[OURS]) as api, NotifySocket() as notify:
        cfg = config(tmp_path, api, budget_w=700, scenario=str(tmp_path / "bank.toml"),
                     extra="")
        cfg.write_text(cfg.read_text() + "[control]\nboot_timeout_s = 2\n")
        with launch(cfg, notify=notify) as daemon:
            assert daemon.wait(timeout_s=60) == ExitStatus.BOOT_OVER_BUDGET, daemon.tail()
        assert not notify.with_key("READY")
        assert api.taints == [OURS] and api.requests == []


def test_a_taint_list_changed_under_the_patch_is_read_again(tmp_path: Path) -> None:
    with FakeNodeApi(tmp_path, NODE, taints=[OURS, OTHER]) as api:
        api.race_next_taint_patches = 2  # another controller adds a taint just before each of two patches
        with launch(config(tmp_path, api)) as daemon:
            daemon.wait_for(lambda: daemon.events("node_untainted"), "the taint removed", timeout_s=60)
            assert daemon.stop() == 0
        assert [t["key"] for t in api.taints] == ["nvidia.com/gpu", "other.example/racer-2", "other.example/racer-3"]
        assert [p.status for p in api.patches()] == [200, 422, 422, 200]


def test_api_errors_are_retried_and_a_refusal_names_the_rbac(tmp_path: Path) -> None:
    with FakeNodeApi(tmp_path, NODE, taints=[OURS]) as api:
        api.fail_next = [503, 403]
        with launch(config(tmp_path, api)) as daemon:
            daemon.wait_for(lambda: daemon.events("node_untainted"), "the taint removed", timeout_s=60)
            assert daemon.stop() == 0
        failed = daemon.events("node_update_failed")
        assert [e["level"] for e in failed] == ["warning", "error"]
        assert "ClusterRole" in failed[1]["action"]
        assert api.taints == []


def test_untaint_ops_leave_other_taints_and_guard_the_list() -> None:
    assert untaint_ops([OTHER], OURS["key"]) is None
    assert untaint_ops([OURS], OURS["key"]) == [{"op": "test", "path": "/spec/taints", "value": [OURS]},
                                                {"op": "remove", "path": "/spec/taints"}]
    dup = {**OURS, "effect": "NoExecute"}
    assert untaint_ops([OURS, OTHER, dup], OURS["key"])[1] == {"op": "replace", "path": "/spec/taints", "value": [OTHER]}


def test_label_values_are_valid_label_values() -> None:
    from powerbudgetd.core.snapshot import BankSnapshot

    snap = BankSnapshot(now=0, mode="normal", ready=True, budget_w=99999.96, sum_limit_bound_w=0, floor_w=0, cards=())
    assert node_labels(snap) == {"powerbudgetd/budget-w": "100000", "powerbudgetd/gpus": "0"}
    snap = BankSnapshot(now=0, mode="normal", ready=True, budget_w=262.45, sum_limit_bound_w=0, floor_w=0, cards=(),
                        configured_budget_w=1262.5)
    assert node_labels(snap)["powerbudgetd/budget-w"] == "1262.5"
