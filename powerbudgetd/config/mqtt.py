"""The MQTT section ([mqtt]): broker, Home Assistant discovery, and what it carries in."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from powerbudgetd.config.base import _Section, resolve_password
from powerbudgetd.config.credentials import check_tls_files, MQTT_PASSWORD_CREDENTIAL
from powerbudgetd.config.mqtt_inputs import _check_topic, RemoteBudgetConfig, WallMeterConfig

def default_node_id() -> str:
    """This host's short name, reduced to the characters MQTT topics and Home Assistant
    object ids accept (``[A-Za-z0-9_-]``)."""
    short = socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9_-]", "_", short) or "powerbudgetd"


class MqttConfig(_Section):
    """The MQTT side channel: state, Home Assistant discovery, wall meter, remote budget.

    The password, first found wins: ``password`` (better kept out of a shared file),
    ``POWERBUDGETD_MQTT__PASSWORD`` in the environment, ``password_file``, or the systemd
    credential ``mqtt-password`` (``LoadCredential=mqtt-password:...``, read from
    ``$CREDENTIALS_DIRECTORY``). A file holding a password must be readable by its owner
    only (see :func:`load_config`). With
    ``tls`` on, ``ca_file`` (default: the system's CAs), ``cert_file``/``key_file`` for a
    client certificate; ``tls_insecure`` skips the broker's host name check.
    """

    host: str = Field(min_length=1)
    port: int = Field(1883, ge=1, le=65535)
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    tls_insecure: bool = False
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None  # a file holding only the password (mode 0600)
    node_id: str = Field(default_factory=default_node_id, pattern=r"^[A-Za-z0-9_-]+$")
    base_topic: str | None = None  # default powerbudgetd/<node_id>
    publish_interval_s: float = Field(10.0, ge=0.5, le=3600)
    discovery: bool = True
    discovery_prefix: str = "homeassistant"
    keepalive_s: int = Field(30, ge=5, le=3600)
    reconnect_min_s: float = Field(1.0, gt=0, le=60)
    reconnect_max_s: float = Field(30.0, gt=0, le=3600)
    # Retained state, discovery and last will: "auto" uses them unless the broker says
    # it has none (MQTT 5 CONNACK "Retain not supported"), then goes on without.
    retain: Literal["auto"] | bool = "auto"
    wall_meter: WallMeterConfig | None = None
    remote_budget: RemoteBudgetConfig = Field(default_factory=RemoteBudgetConfig)
    # Where each daemon announces the meters it reads (retained, <meters_topic>/<node_id>):
    # more hosts behind one meter than its [ups]/[mqtt.wall_meter] hosts says are warned of
    meters_topic: str = "powerbudgetd/meters"

    @field_validator("base_topic", "discovery_prefix", "meters_topic")
    @classmethod
    def _topics(cls, value: str | None) -> str | None:
        return _check_topic(value)

    @model_validator(mode="after")
    def _check(self) -> MqttConfig:
        if self.reconnect_min_s > self.reconnect_max_s:
            raise ValueError("reconnect_min_s must be <= reconnect_max_s")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give both cert_file and key_file for a client certificate, or neither")
        if not self.tls and any(v for v in (self.ca_file, self.cert_file, self.tls_insecure)):
            raise ValueError("ca_file, cert_file, key_file and tls_insecure need tls = true")
        check_tls_files({n: getattr(self, n) for n in ("ca_file", "cert_file", "key_file")})
        self.password = resolve_password(self.password, self.password_file, MQTT_PASSWORD_CREDENTIAL)
        return self

    def topic(self) -> str:
        """The base topic every state topic hangs under."""
        return self.base_topic or f"powerbudgetd/{self.node_id}"
