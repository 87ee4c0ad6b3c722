"""``[kubernetes]``: the Node this daemon caps, when it runs in a Kubernetes pod.

The section is on when it names a node; in the DaemonSet the node's name comes from the
downward API as ``POWERBUDGETD_KUBERNETES__NODE`` (the ConfigMap's file is shared by
every node, so it does not name one). See :mod:`powerbudgetd.channels.node`.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")  # where kubelet mounts the token
DEFAULT_TAINT = "powerbudgetd/uncapped"
# A qualified name (an optional DNS subdomain prefix and a name of at most 63 characters):
# the form of a taint key and a label key.
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_QUALIFIED_RE = re.compile(rf"^({_DNS_SUBDOMAIN}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$")
_NODE_RE = re.compile(rf"^{_DNS_SUBDOMAIN}$")


class KubernetesConfig(BaseModel):
    """The Node to untaint and label once every card's fair share is read back.

    ``node``: the Node's name. ``taint``: the key of the startup taint the node was
    registered with (removed whatever its value and effect). ``labels``: publish the
    node's budget and power-limit range as ``powerbudgetd/*`` labels. ``api_server``:
    the API's URL (default: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``);
    ``service_account_dir``: the pod's token and CA; ``timeout_s``: one request (s).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    node: str = Field(min_length=1, max_length=253)
    taint: str = DEFAULT_TAINT
    labels: bool = True
    api_server: str | None = Field(None, pattern=r"^https?://[^/\s]+$")
    service_account_dir: Path = SERVICE_ACCOUNT_DIR
    timeout_s: float = Field(10.0, gt=0, le=120)

    @field_validator("node")
    @classmethod
    def _node(cls, value: str) -> str:
        if not _NODE_RE.match(value):
            raise ValueError(f"not a Node name (a lower-case DNS subdomain): {value!r}")
        return value

    @field_validator("taint")
    @classmethod
    def _taint(cls, value: str) -> str:
        if len(value) > 316 or not _QUALIFIED_RE.match(value):
            raise ValueError(f"not a taint key (prefix/name, such as {DEFAULT_TAINT}): {value!r}")
        return value
