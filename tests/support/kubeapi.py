"""A local stand-in for the Kubernetes API's Node endpoint, over HTTPS: not an API server.

No API server can run on the test machines, so this serves exactly the two calls the
daemon makes, as the API reference documents them: ``GET /api/v1/nodes/{name}`` and
``PATCH /api/v1/nodes/{name}`` with ``application/merge-patch+json`` (RFC 7386),
``application/json-patch+json`` (RFC 6902: add, remove, replace, test; a failed test or
a bad path answers 422, as the API server's patch handler does) or
``application/strategic-merge-patch+json`` (taken as a merge patch: a Node's labels are
a map and its taints have no merge key, so both replace as RFC 7386 does). Any other
content type answers 415; a request without the bearer token 401; another node 404.
Every answer that is not 2xx is a ``Status`` object. Each request is recorded with the
time it arrived and the node as it left it.

What it does not do: authorisation (RBAC, the admission policy), resourceVersion
conflicts of concurrent writers, watches, server-side apply, field validation.
"""

from __future__ import annotations

import copy
import json
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKEN = "test-service-account-token"


@dataclass(frozen=True)
class Request:
    at: float  # time.time() on arrival
    method: str
    path: str
    content_type: str | None
    body: Any
    status: int
    node_after: dict[str, Any]


class PatchError(Exception):
    pass


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise PatchError(f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add, remove, replace and test; atomic (a copy is patched)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = _pointer(op["path"])
        parent = doc
        for part in parents:
            try:
                parent = parent[int(part)] if isinstance(parent, list) else parent[part]
            except (KeyError, IndexError, ValueError) as exc:
                raise PatchError(f"{op['path']}: missing ({exc})") from None
        kind = op["op"]
        if isinstance(parent, list):
            raise PatchError("list elements are not used by this stand-in")
        if kind == "test":
            if last not in parent or parent[last] != op["value"]:
                raise PatchError(f"testing value {op['path']} failed")
        elif kind == "remove":
            if last not in parent:
                raise PatchError(f"{op['path']}: remove of a missing member")
            del parent[last]
        elif kind == "replace":
            if last not in parent:
                raise PatchError(f"{op['path']}: replace of a missing member")
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "add":
            parent[last] = copy.deepcopy(op["value"])
        else:
            raise PatchError(f"op {kind!r} is not used by this stand-in")
    return doc


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (openssl): the server's and the CA."""
    crt, key = directory / "ca.crt", directory / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return crt, key


class FakeNodeApi:
    """Serves one Node named ``name`` with ``taints`` and ``labels`` on 127.0.0.1 over
    HTTPS. ``service_account_dir`` holds ``token`` and ``ca.crt`` as kubelet mounts
    them. ``race_next_taint_patches``: that many JSON patches find the taints changed
    just before they apply (another controller adds one), so their test fails."""

    def __init__(self, directory: Path, name: str, taints: list[dict[str, Any]] | None = None,
                 labels: dict[str, str] | None = None) -> None:
        self.service_account_dir = directory / "serviceaccount"
        self.service_account_dir.mkdir(parents=True)
        crt, key = self_signed(self.service_account_dir)
        (self.service_account_dir / "token").write_text(TOKEN + "\n")
        self.name = name
        self.node: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "1",
                         "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints} if taints else {},
        }
        self.requests: list[Request] = []
        self.race_next_taint_patches = 0
        self.fail_next: list[int] = []  # statuses to answer the next requests with, in order
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                api._handle(self, "GET", None)

            def do_PATCH(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                api._handle(self, "PATCH", self.rfile.read(length))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(crt, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _handle(self, handler: BaseHTTPRequestHandler, method: str, raw: bytes | None) -> None:
        ctype = handler.headers.get("Content-Type")
        body = None
        with self._lock:
            status, answer = self._answer(handler, method, ctype, raw)
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
            self.requests.append(Request(time.time(), method, handler.path, ctype, body, status, copy.deepcopy(self.node)))
        data = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _answer(self, handler: BaseHTTPRequestHandler, method: str, ctype: str | None,
                raw: bytes | None) -> tuple[int, dict[str, Any]]:
        if handler.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _status(401, "Unauthorized", "Unauthorized")
        if self.fail_next:
            code = self.fail_next.pop(0)
            return _status(code, "InternalError" if code >= 500 else "Forbidden", f"injected {code}")
        if handler.path != f"/api/v1/nodes/{self.name}":
            return _status(404, "NotFound", f'nodes "{handler.path.rsplit("/", 1)[-1]}" not found')
        if method == "GET":
            return 200, copy.deepcopy(self.node)
        try:
            patch = json.loads(raw or b"")
        except ValueError as exc:
            return _status(400, "BadRequest", f"error decoding patch: {exc}")
        try:
            if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                new = merge_patch(self.node, patch)
            elif ctype == "application/json-patch+json":
                if not isinstance(patch, list):
                    return _status(400, "BadRequest", "a JSON patch is a list of operations")
                if self.race_next_taint_patches and any(op.get("path") == "/spec/taints" for op in patch):
                    self.race_next_taint_patches -= 1
                    taints = self.node["spec"].setdefault("taints", [])
                    taints.append({"key": f"other.example/racer-{len(taints)}", "effect": "NoSchedule"})
                    self._bump()
                new = json_patch(self.node, patch)
            else:
                return _status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}")
        except PatchError as exc:
            return _status(422, "Invalid", str(exc))
        self.node = new
        self._bump()
        return 200, copy.deepcopy(self.node)

    def _bump(self) -> None:
        meta = self.node["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    @property
    def taints(self) -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(self.node.get("spec", {}).get("taints", []))

    @property
    def labels(self) -> dict[str, str]:
        with self._lock:
            return dict(self.node["metadata"].get("labels", {}))

    def patches(self) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == "PATCH"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeNodeApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _status(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": message, "reason": reason, "code": code}
