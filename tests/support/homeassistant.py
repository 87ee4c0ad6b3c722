"""A real Home Assistant core for the tests: its own virtual environment (built and
cached by ``scripts/ha-venv``), a config directory wired without the UI, and its own
APIs to ask what it made of our MQTT discovery.

Wiring, all written before the first start:

- ``configuration.yaml``: ``http`` on a free loopback port, ``api``, a metric unit
  system, logs at warning;
- ``.storage/core.config_entries``: one MQTT config entry pointing at the test's broker;
- ``.storage/auth``: one owner with a long-lived access token, whose signing key we
  chose, so the test signs the token itself (HS256 over ``{"iss": token id}``, as Home
  Assistant does).

Questions go to the REST API (``/api/states``, ``/api/services``, ``/api/template``) and,
for the device and entity registries, which only the WebSocket API serves, to a small
client run by Home Assistant's own Python (its venv has aiohttp; ours need not).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from support.wait import reap, wait_until
from support.paths import REPO

ROOT = REPO
HA_VENV_SCRIPT = ROOT / "scripts" / "ha-venv"
INSTALL_TIMEOUT_S = 900  # a cold install on a slow mirror; a warm one returns at once
START_TIMEOUT_S = 120


def ha_venv() -> Path:
    """The cached Home Assistant venv (built on first use). Raises AssertionError with
    the script's output when it cannot be built."""
    proc = subprocess.run([str(HA_VENV_SCRIPT)], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert proc.returncode == 0, f"scripts/ha-venv failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    venv = Path(proc.stdout.strip().splitlines()[-1])
    assert (venv / "bin" / "hass").exists(), venv
    return venv


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def sign_token(token_id: str, jwt_key: str, lifetime_s: int = 86400) -> str:
    """An access token for refresh token ``token_id``: a JWT, HS256 with its key."""
    now = int(time.time())
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps({"iss": token_id, "iat": now, "exp": now + lifetime_s}).encode())
    sig = hmac.new(jwt_key.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(sig)}"


_WS_CLIENT = r"""
import asyncio, json, sys
import aiohttp

async def main(url, token, commands):
    out = []
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url) as ws:
            assert (await ws.receive_json())["type"] == "auth_required"
            await ws.send_json({"type": "auth", "access_token": token})
            assert (await ws.receive_json())["type"] == "auth_ok"
            for i, command in enumerate(commands, 1):
                await ws.send_json({"id": i, "type": command})
                answer = await ws.receive_json()
                assert answer.get("success"), answer
                out.append(answer["result"])
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
"""


class HomeAssistant:
    """One Home Assistant core in ``workdir``, using the broker at ``mqtt_port``."""

    def __init__(self, venv: Path, workdir: Path, mqtt_port: int, http_port: int, extra_yaml: str = "") -> None:
        self.venv, self.config, self.port = venv, workdir / "ha-config", http_port
        self.log = workdir / "ha-output.log"
        self.proc: subprocess.Popen[bytes] | None = None
        storage = self.config / ".storage"
        storage.mkdir(parents=True)
        (self.config / "configuration.yaml").write_text(
            "homeassistant:\n  name: powerbudgetd test\n  latitude: 0\n  longitude: 0\n  elevation: 0\n"
            "  unit_system: metric\n  time_zone: UTC\n  currency: EUR\n  country: DE\n"
            f"http:\n  server_host: 127.0.0.1\n  server_port: {http_port}\n"
            "api:\nlogger:\n  default: warning\n" + extra_yaml
        )
        self._store("core.config_entries", {"entries": [{
            "entry_id": uuid.uuid4().hex, "version": 1, "minor_version": 1, "domain": "mqtt",
            "title": "test broker", "data": {"broker": "127.0.0.1", "port": mqtt_port, "discovery": True},
            "options": {}, "pref_disable_new_entities": False, "pref_disable_polling": False,
            "source": "user", "unique_id": None, "disabled_by": None,
        }]})
        user_id, token_id, jwt_key = uuid.uuid4().hex, uuid.uuid4().hex, secrets.token_hex(64)
        self._store("auth", {
            "users": [{"id": user_id, "group_ids": ["system-admin"], "is_owner": True, "is_active": True,
                       "name": "test", "system_generated": False, "local_only": False}],
            "groups": [{"id": "system-admin"}, {"id": "system-users"}, {"id": "system-read-only"}],
            "credentials": [],
            "refresh_tokens": [{
                "id": token_id, "user_id": user_id, "client_id": None, "client_name": "powerbudgetd tests",
                "client_icon": None, "token_type": "long_lived_access_token",
                "created_at": "2024-01-01T00:00:00+00:00", "access_token_expiration": 86400.0,
                "token": secrets.token_hex(64), "jwt_key": jwt_key, "last_used_at": None,
                "last_used_ip": None, "expire_at": None, "credential_id": None, "version": None,
            }],
        })
        self.token = sign_token(token_id, jwt_key)

    def _store(self, key: str, data: dict[str, Any]) -> None:
        path = self.config / ".storage" / key
        path.write_text(json.dumps({"version": 1, "minor_version": 1, "key": key, "data": data}))

    # -- the process ------------------------------------------------------------------
    def start(self) -> float:
        """Start and wait until the API answers; returns the seconds it took."""
        t0 = time.monotonic()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(self.venv / "bin" / "hass"), "-c", str(self.config), "--skip-pip"],
                stdout=out, stderr=subprocess.STDOUT,
            )
        wait_until(lambda: self.get("/api/").get("message") == "API running.", START_TIMEOUT_S,
                   "Home Assistant to start", step_s=0.3, proc=self.proc, log=self.output,
                   ignore=(OSError,))
        return time.monotonic() - t0

    def stop(self) -> None:
        reap(self.proc, 30)

    def output(self) -> str:
        """Everything it logged (its console output and its own log file)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        own = self.config / "home-assistant.log"
        return text + (own.read_text(errors="replace") if own.exists() else "")

    # -- its APIs ---------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()

    def get(self, path: str) -> Any:
        return self._request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self._request("POST", path, body)

    def states(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        """Every entity's state whose object id starts with ``prefix``, by entity id."""
        return {s["entity_id"]: s for s in self.get("/api/states") if s["entity_id"].split(".", 1)[1].startswith(prefix)}

    def state(self, entity_id: str) -> dict[str, Any] | None:
        """One entity's state; None when Home Assistant has no such entity."""
        try:
            return self.get(f"/api/states/{entity_id}")  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def call(self, domain: str, service: str, **data: Any) -> Any:
        return self.post(f"/api/services/{domain}/{service}", data)

    def template(self, text: str) -> str:
        return str(self.post("/api/template", {"template": text}))

    def registries(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(devices, entities) from the device and entity registries (WebSocket API)."""
        proc = subprocess.run(
            [str(self.venv / "bin" / "python"), "-c", _WS_CLIENT, f"ws://127.0.0.1:{self.port}/api/websocket",
             self.token, "config/device_registry/list", "config/entity_registry/list"],
            capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        devices, entities = json.loads(proc.stdout)
        return devices, entities

    def wait(self, what: str, pred: Any, timeout: float = 30.0) -> Any:
        """Poll ``pred()`` until it returns something true; fail naming ``what``."""
        t0 = time.monotonic()
        value = wait_until(pred, timeout, f"Home Assistant: {what}", step_s=0.25,
                           ignore=(urllib.error.URLError, KeyError, TypeError))
        print(f"{time.strftime('%H:%M:%S')} {what}: {time.monotonic() - t0:.1f} s")
        return value
