"""Every secret alike, in every section: a password in a file of its own or a systemd
credential for [mqtt], [circuit] and [ups]; a password file, a credential or a TLS
private key open to others refused (for a daemon running as root, as the unit runs it) with
the fix; no message ever quotes the secret; the unit shows every credential."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from powerbudgetd.config import (
    CIRCUIT_PASSWORD_CREDENTIAL,
    MQTT_PASSWORD_CREDENTIAL,
    UPS_PASSWORD_CREDENTIAL,
    ConfigError,
    load_config,
)
from support.paths import REPO
from support.configs import config_file

SECRET = "Zq9-hunter2"
SECTIONS = {  # section: (its text without a password, its credential)
    "mqtt": ('[mqtt]\nhost = "127.0.0.1"\nusername = "pb"\n', MQTT_PASSWORD_CREDENTIAL),
    "circuit": ('[circuit]\nname = "rack"\nreserve_w = 500\npsu_efficiency = 0.9\nhost_w = 100\nusername = "pb"\n',
                CIRCUIT_PASSWORD_CREDENTIAL),
    "ups": ('[ups]\nname = "gpuups"\nusername = "pb"\n', UPS_PASSWORD_CREDENTIAL),
}



@pytest.fixture(autouse=True)
def as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusals are the daemon's as root (as the unit runs it), whoever runs the tests."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)


def config(tmp_path: Path, text: str) -> Path:
    return config_file(tmp_path, text, mode=0o600)


def secret_file(path: Path, mode: int) -> Path:
    path.write_text(SECRET + "\n")
    path.chmod(mode)
    return path


@pytest.mark.parametrize("section", list(SECTIONS))
def test_a_password_file_and_a_credential_in_every_section(tmp_path: Path, section: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    text, credential = SECTIONS[section]
    pw = secret_file(tmp_path / "pw", 0o600)
    settings = load_config(config(tmp_path, text + f'password_file = "{pw}"\n'), euid=0)
    assert getattr(settings, section).password.get_secret_value() == SECRET
    assert SECRET not in repr(settings) and SECRET not in str(settings.model_dump())
    pw.chmod(0o644)
    with pytest.raises(ConfigError) as exc:
        load_config(config(tmp_path, text + f'password_file = "{pw}"\n'), euid=0)
    assert f"chmod 600 {pw}" in str(exc.value) and SECRET not in str(exc.value)
    creds = tmp_path / "creds"
    creds.mkdir()
    secret_file(creds / credential, 0o600)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert getattr(load_config(config(tmp_path, text), euid=0), section).password.get_secret_value() == SECRET
    (creds / credential).chmod(0o640)
    with pytest.raises(ConfigError) as exc:
        load_config(config(tmp_path, text), euid=0)
    assert "open to group or others" in str(exc.value) and SECRET not in str(exc.value)


@pytest.mark.parametrize("section", ["mqtt", "circuit"])
def test_a_private_key_readable_by_others_is_refused(tmp_path: Path, section: str) -> None:
    text = SECTIONS[section][0].replace('username = "pb"\n', "")
    cert = tmp_path / "client.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    key = tmp_path / "client.key"
    key.write_text(f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n")
    key.chmod(0o644)
    tls = f'tls = true\ncert_file = "{cert}"\nkey_file = "{key}"\n'
    with pytest.raises(ConfigError) as exc:
        load_config(config(tmp_path, text + tls), euid=0)
    msg = str(exc.value)
    assert f"{key} holds a private key but is open to group or others (mode 0644)" in msg
    assert f"chmod 600 {key}" in msg and SECRET not in msg
    key.chmod(0o600)
    assert getattr(load_config(config(tmp_path, text + tls), euid=0), section).key_file == key


def test_the_unit_shows_every_supported_credential() -> None:
    unit = (REPO / "systemd" / "powerbudgetd.service").read_text()
    for credential in (MQTT_PASSWORD_CREDENTIAL, CIRCUIT_PASSWORD_CREDENTIAL, UPS_PASSWORD_CREDENTIAL):
        assert f"#LoadCredential={credential}:/etc/powerbudgetd/{credential}" in unit
