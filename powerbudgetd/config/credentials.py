"""The credentials' names of the MQTT, circuit and UPS sections, and their TLS files' check
(the secrets rule itself: config.base)."""

from __future__ import annotations

import typing
from pathlib import Path


from powerbudgetd.config.base import check_private

MQTT_PASSWORD_CREDENTIAL = "mqtt-password"
CIRCUIT_PASSWORD_CREDENTIAL = "etcd-password"
UPS_PASSWORD_CREDENTIAL = "ups-password"
def check_tls_files(section: typing.Mapping[str, Path | None]) -> None:
    """``ca_file``, ``cert_file`` and ``key_file`` exist; the private key is private
    (:func:`check_private`). Raises ValueError naming the field."""
    for name in ("ca_file", "cert_file", "key_file"):
        path = section.get(name)
        if path is not None and not path.is_file():
            raise ValueError(f"{name}: no such file: {path}")
    key = section.get("key_file")
    if key is not None:
        try:
            check_private(key, "holds a private key")
        except OSError as exc:
            raise ValueError(f"key_file: cannot read {key}: {exc.strerror or exc}") from None
