"""The readiness gate on a Kubernetes Node: its startup taint removed, its labels published.

A pod starts after the container runtime, so on a node that workloads may use at once
they could load the cards before any cap is in force. The node is therefore registered
with a startup taint (``--register-with-taints=powerbudgetd/uncapped=true:NoSchedule``,
or the node pool's taints); this channel removes it at the first tick that reports the
controller ready (every card's fair share read back in force: the tick that sends
systemd's ``READY=1``), and never before. A boot that fails never reaches it, so the
taint stays and nothing is scheduled onto uncapped cards.

With it, and whenever the configured budget changes, it publishes ``powerbudgetd/*``
labels: the budget and the cards' power-limit range (gpu-operator#2780's ask), for
node selectors and for people. The API calls run in a worker thread, retried with
backoff on any failure; control never waits for them.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from powerbudgetd.channels.kubeapi import KubeApi, KubeError
from powerbudgetd.config.kubernetes import KubernetesConfig
from powerbudgetd.core.backoff import Backoff

if TYPE_CHECKING:
    from powerbudgetd.config import Settings
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.core.snapshot import BankSnapshot

log = structlog.get_logger("powerbudgetd")

LABEL_PREFIX = "powerbudgetd/"
CONFLICT_RETRIES = 5  # taint patches whose test found the list changed, in a row, before backing off


def _w(value: float) -> str:
    """W as a label value: digits and at most one decimal (``1100``, ``262.5``)."""
    return f"{round(value, 1):.1f}".removesuffix(".0")


def node_labels(snapshot: BankSnapshot) -> dict[str, str]:
    """The labels for a bank: ``budget-w`` (the configured budget, board W), ``gpus``,
    and the lowest minimum and highest maximum power limit the cards accept
    (``gpu-limit-min-w``, ``gpu-limit-max-w``, W, as NVML reports the constraints)."""
    budget = snapshot.configured_budget_w if snapshot.configured_budget_w is not None else snapshot.budget_w
    labels = {f"{LABEL_PREFIX}budget-w": _w(budget), f"{LABEL_PREFIX}gpus": str(len(snapshot.cards))}
    mins = [c.hw_min_limit_w for c in snapshot.cards if c.hw_min_limit_w is not None]
    maxs = [c.hw_max_limit_w for c in snapshot.cards if c.hw_max_limit_w is not None]
    if mins:
        labels[f"{LABEL_PREFIX}gpu-limit-min-w"] = _w(min(mins))
    if maxs:
        labels[f"{LABEL_PREFIX}gpu-limit-max-w"] = _w(max(maxs))
    return labels


def untaint_ops(taints: list[dict[str, Any]], key: str) -> list[dict[str, Any]] | None:
    """The JSON patch that removes every taint with ``key`` from ``taints`` as read,
    guarded by a test of that list; None when there is none to remove."""
    keep = [t for t in taints if t.get("key") != key]
    if len(keep) == len(taints):
        return None
    change = {"op": "replace", "path": "/spec/taints", "value": keep} if keep else {"op": "remove", "path": "/spec/taints"}
    return [{"op": "test", "path": "/spec/taints", "value": taints}, change]


class NodeGate:
    """The side channel (see :mod:`powerbudgetd.channels.protocol`) for ``[kubernetes]``."""

    def __init__(self, cfg: KubernetesConfig, api: KubeApi, backoff: Backoff | None = None) -> None:
        self.cfg = cfg
        self.api = api
        self.backoff = backoff or Backoff(1.0, 30.0)
        self.untainted = False
        self.published: dict[str, str] | None = None
        self._wanted: dict[str, str] | None = None  # None until ready
        self._wake = asyncio.Event()

    def on_tick(self, report: TickReport) -> None:
        if not report.ready:
            return
        wanted = node_labels(report.snapshot) if self.cfg.labels else {}
        if wanted != self._wanted:
            self._wanted = wanted
            self._wake.set()

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        pass  # [kubernetes] needs a restart (daemon.RESTART_ONLY); a new budget reaches on_tick

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while (wanted := self._wanted) is not None:
                try:
                    await asyncio.to_thread(self._sync, wanted)
                except KubeError as exc:
                    delay = self.backoff.next_s()
                    forbidden = exc.status in (401, 403)
                    (log.error if forbidden or exc.status == 404 else log.warning)(
                        "node_update_failed", node=self.cfg.node, error=str(exc), retry_in_s=delay,
                        **({"action": "check the service account's ClusterRole (get, patch nodes) and the "
                            "admission policy that limits it to its own Node"} if forbidden else {}),
                    )
                    await asyncio.sleep(delay)
                    continue
                self.backoff.reset()
                break

    def _sync(self, labels: dict[str, str]) -> None:
        """Publish ``labels`` (when changed), then remove the taint (once). Runs in a
        worker thread. Raises KubeError."""
        name = self.cfg.node
        if labels and labels != self.published:
            self.api.merge_patch_node(name, {"metadata": {"labels": labels}})
            self.published = labels
            log.info("node_labels_published", node=name, labels=labels)
        if self.untainted:
            return
        for _ in range(CONFLICT_RETRIES):
            node = self.api.get_node(name)
            taints = (node.get("spec") or {}).get("taints") or []
            ops = untaint_ops(taints, self.cfg.taint)
            if ops is None:
                self.untainted = True
                log.info("node_taint_absent", node=name, taint=self.cfg.taint)
                return
            try:
                self.api.json_patch_node(name, ops)
            except KubeError as exc:
                if exc.conflict:
                    continue  # the taints changed since the read: read them again
                raise
            self.untainted = True
            log.info("node_untainted", node=name, taint=self.cfg.taint)
            return
        raise KubeError(f"the node's taints changed under {CONFLICT_RETRIES} patches in a row", 409)
