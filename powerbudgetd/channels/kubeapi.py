"""The two Kubernetes API calls the daemon makes on its own Node: GET and PATCH.

In-cluster access as every client does it (client-go's ``rest.InClusterConfig``): the
API at ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the pod's service
account token as a bearer token (read again for every request: kubelet rotates bound
tokens in place) and the cluster's CA from the same directory. Plain HTTPS through the
standard library: the ``kubernetes`` package would bring a dozen dependencies
(requests, urllib3, google-auth, websocket-client, ...) for two calls.

Patches as the API documents them (``PATCH /api/v1/nodes/{name}``): labels by JSON
merge patch (RFC 7386, ``application/merge-patch+json``); taints by JSON patch
(RFC 6902, ``application/json-patch+json``) that first tests the list it read, because
``spec.taints`` has no merge key (a strategic merge patch replaces the whole list) and
another controller may change it meanwhile: then the test fails and the caller reads
again.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerbudgetd.config.kubernetes import KubernetesConfig

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KubeError(Exception):
    """A request failed: ``status`` the HTTP status (None: no answer), and why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def conflict(self) -> bool:
        """The object changed under the request (a JSON patch test failed, or a write
        on a stale resourceVersion): read it again and retry."""
        return self.status in (409, 422)


@dataclass(frozen=True)
class KubeApi:
    """One API server, as the pod's service account. Methods raise KubeError."""

    server: str
    token_file: Path
    ca_file: Path
    timeout_s: float = 10.0

    @classmethod
    def from_config(cls, cfg: KubernetesConfig, environ: dict[str, str] | None = None) -> KubeApi:
        """From ``[kubernetes]``, else the in-cluster variables. Raises KubeError when
        neither gives a server."""
        env = os.environ if environ is None else environ
        server = cfg.api_server
        if server is None:
            host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
            if not host or not port:
                raise KubeError("no API server: KUBERNETES_SERVICE_HOST/PORT are unset (not in a pod?) and "
                                "[kubernetes] api_server is not given")
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        sa = cfg.service_account_dir
        return cls(server, sa / "token", sa / "ca.crt", cfg.timeout_s)

    def _request(self, method: str, path: str, body: Any = None, content_type: str | None = None) -> dict[str, Any]:
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise KubeError(f"service account token {self.token_file}: {exc.strerror or exc}") from None
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type or "application/json"
        req = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        context = None
        if self.server.startswith("https:"):
            try:
                context = ssl.create_default_context(cafile=str(self.ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise KubeError(f"cluster CA {self.ca_file}: {exc}") from None
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=context) as resp:
                answer = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise KubeError(f"{method} {path}: HTTP {exc.code}: {_status_message(exc)}", exc.code) from None
        except (OSError, ValueError) as exc:  # URLError, a timeout, TLS, a body that is not JSON
            raise KubeError(f"{method} {path}: {exc}") from None
        if not isinstance(answer, dict):
            raise KubeError(f"{method} {path}: the answer is not a JSON object")
        return answer

    def get_node(self, name: str) -> dict[str, Any]:
        return self._request("GET", _node_path(name))

    def merge_patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._request("PATCH", _node_path(name), patch, MERGE_PATCH)

    def json_patch_node(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return self._request("PATCH", _node_path(name), ops, JSON_PATCH)


def _node_path(name: str) -> str:
    return f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}"


def _status_message(exc: urllib.error.HTTPError) -> str:
    """The API's Status message when the body is one, else the reason phrase."""
    try:
        status = json.loads(exc.read())
        return str(status.get("message") or exc.reason)
    except (OSError, ValueError, AttributeError):
        return str(exc.reason)
