"""The ValidatingAdmissionPolicy that narrows the DaemonSet's ``patch nodes`` to its own
Node, its ``powerbudgetd/*`` labels and the removal of its startup taint: every CEL
expression of the policy, as ``kubectl kustomize`` renders it, evaluated on the update
the daemon's own patches make (applied by the API stand-in's RFC 7386 / RFC 6902 code)
and on the updates a stolen token could attempt.

Evaluated with cel-python, an implementation of the CEL specification, on the objects as
JSON: not with the API server's cel-go and its typed Kubernetes environment, so what is
checked here is the policy's logic; whether an API server compiles it is not (no API
server runs on the test machines). As the API server does with ``failurePolicy: Fail``,
an expression that cannot be evaluated denies.
"""

from __future__ import annotations

import copy
import subprocess
from typing import Any

import celpy
import pytest
import yaml
from support.kubeapi import json_patch, merge_patch
from support.paths import REPO

from powerbudgetd.channels.node import untaint_ops
from powerbudgetd.config.kubernetes import DEFAULT_TAINT

NODE = "gpu-node-7"
OURS = {"key": DEFAULT_TAINT, "value": "true", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
LABELS = {"powerbudgetd/budget-w": "1000", "powerbudgetd/gpus": "4", "powerbudgetd/gpu-limit-min-w": "150",
          "powerbudgetd/gpu-limit-max-w": "300"}


def a_node(name: str = NODE) -> dict[str, Any]:
    """A GPU node as a cluster registers it, with our startup taint."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"},
                     "annotations": {"csi.volume.kubernetes.io/nodeid": '{"ebs.csi.aws.com":"i-0abc"}'}},
        "spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"], "providerID": "aws:///eu-west-1a/i-0abc",
                 "taints": [GPU, OURS]},
    }


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    out = subprocess.run(["kubectl", "kustomize", str(REPO / "deploy" / "kubernetes" / "overlays" / "host-driver")],
                         capture_output=True, text=True, timeout=120, check=True)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    vap = one(docs, "ValidatingAdmissionPolicy")
    sa = one(docs, "ServiceAccount")["metadata"]
    vap["serviceAccount"] = f"system:serviceaccount:{sa['namespace']}:{sa['name']}"
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    return vap


def _eval(env: celpy.Environment, expression: str, activation: dict[str, Any]) -> Any:
    return env.program(env.compile(expression)).evaluate(activation)


def admit(policy: dict[str, Any], old: dict[str, Any], new: dict[str, Any], username: str | None = None,
          node_name: str | None = NODE, operation: str = "UPDATE") -> list[str] | None:
    """The messages of the validations that deny this request; None when the policy does
    not apply to it (another operation or another user), [] when it admits it."""
    spec = policy["spec"]
    rules = spec["matchConstraints"]["resourceRules"]
    if not any(operation in r["operations"] and "nodes" in r["resources"] for r in rules):
        return None
    extra = {} if node_name is None else {"authentication.kubernetes.io/node-name": [node_name]}
    request = {"operation": operation, "userInfo": {"username": username or policy["serviceAccount"], "extra": extra}}
    env = celpy.Environment()
    act: dict[str, Any] = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
                           "request": celpy.json_to_cel(request)}
    if not all(_eval(env, c["expression"], act) for c in spec["matchConditions"]):
        return None
    variables = {}
    for v in spec["variables"]:
        variables[celpy.celtypes.StringType(v["name"])] = _eval(env, v["expression"], act)
    act["variables"] = celpy.celtypes.MapType(variables)
    denied = []
    for v in spec["validations"]:
        try:
            ok = _eval(env, v["expression"], act)
        except celpy.CELEvalError:
            ok = False  # failurePolicy: Fail
        if not (isinstance(ok, celpy.celtypes.BoolType) and bool(ok)):  # an error's value denies too
            denied.append(v["message"])
    return denied


def test_the_policy_is_bound_and_fails_closed(policy: dict[str, Any]) -> None:
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}]


def test_the_daemons_own_patches_are_admitted(policy: dict[str, Any]) -> None:
    node = a_node()
    labelled = merge_patch(node, {"metadata": {"labels": LABELS}})  # what NodeGate sends first
    assert admit(policy, node, labelled) == []
    ops = untaint_ops(labelled["spec"]["taints"], DEFAULT_TAINT)
    assert ops is not None
    untainted = json_patch(labelled, ops)
    assert untainted["spec"]["taints"] == [GPU]
    assert admit(policy, labelled, untainted) == []
    only = copy.deepcopy(node)
    only["spec"]["taints"] = [OURS]  # the last taint: the list itself removed
    ops = untaint_ops([OURS], DEFAULT_TAINT)
    assert ops is not None
    assert admit(policy, only, json_patch(only, ops)) == []
    relabelled = merge_patch(labelled, {"metadata": {"labels": {"powerbudgetd/budget-w": "900"}}})  # a new budget
    assert admit(policy, labelled, relabelled) == []


def test_another_node_or_a_token_without_a_node_is_denied(policy: dict[str, Any]) -> None:
    node = a_node("gpu-node-8")
    labelled = merge_patch(node, {"metadata": {"labels": LABELS}})
    assert admit(policy, node, labelled) == ["powerbudgetd may change only the Node its own pod runs on"]
    assert admit(policy, a_node(), merge_patch(a_node(), {"metadata": {"labels": LABELS}}), node_name=None) \
        == ["powerbudgetd may change only the Node its own pod runs on"]


@pytest.mark.parametrize(("change", "message"), [
    ({"spec": {"taints": [GPU, OURS, {"key": "x.example/evil", "effect": "NoExecute"}]}}, "startup taint"),
    ({"spec": {"taints": [OURS]}}, "startup taint"),  # the GPU taint removed
    ({"spec": {"taints": [GPU, {**OURS, "effect": "PreferNoSchedule"}]}}, "startup taint"),  # ours changed, not removed
    ({"metadata": {"labels": {"kubernetes.io/hostname": "elsewhere"}}}, "labels under powerbudgetd/"),
    ({"metadata": {"labels": {"nvidia.com/gpu.present": None}}}, "labels under powerbudgetd/"),
    ({"metadata": {"labels": {"team": "mine"}}}, "labels under powerbudgetd/"),
    ({"spec": {"unschedulable": True}}, "cordon"),
    ({"metadata": {"annotations": {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}}}, "only its labels"),
    ({"metadata": {"annotations": {"csi.volume.kubernetes.io/nodeid": "{}"}}}, "only its labels"),
    ({"metadata": {"finalizers": ["x.example/hold"]}}, "only its labels"),
    ({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]}}, "only its labels"),
    ({"spec": {"providerID": "aws:///eu-west-1a/i-0def"}}, "only its labels"),
    ({"spec": {"podCIDR": None, "podCIDRs": None}}, "only its labels"),
])
def test_any_other_change_to_its_own_node_is_denied(policy: dict[str, Any], change: dict[str, Any],
                                                    message: str) -> None:
    node = a_node()
    denied = admit(policy, node, merge_patch(node, change))
    assert denied and len(denied) == 1 and message in denied[0], denied


def test_other_users_and_operations_are_not_the_policys(policy: dict[str, Any]) -> None:
    node = a_node()
    cordoned = merge_patch(node, {"spec": {"unschedulable": True}})
    assert admit(policy, node, cordoned, username="system:node:" + NODE) is None
    assert admit(policy, node, cordoned, username="system:serviceaccount:other:powerbudgetd") is None
    assert admit(policy, node, node, operation="DELETE") is None  # RBAC grants no delete
