"""Secrets stay secret: a config file holding a password is private, the password can
live outside it (a file, a systemd credential), and no error ever quotes a secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.cli import main
from powerbudgetd.config import ConfigError, load_config

SECRET = "hunter2-Zq9"
MQTT = 'budget_w = 1000\n[mqtt]\nhost = "127.0.0.1"\nusername = "pb"\n'


def write(tmp_path: Path, text: str, mode: int = 0o600, name: str = "pb.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_as_root_a_readable_file_with_a_password_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    path = write(tmp_path, MQTT + f'password = "{SECRET}"\n', mode)
    with pytest.raises(ConfigError) as exc:
        load_config(path, euid=0)
    msg = str(exc.value)
    assert f"holds mqtt.password but is open to group or others (mode {mode:04o})" in msg
    assert f"chmod 600 {path}" in msg and SECRET not in msg
    path.chmod(0o600)
    assert load_config(path, euid=0).mqtt.password.get_secret_value() == SECRET  # type: ignore[union-attr]


def test_a_readable_file_without_secrets_is_fine(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, MQTT, 0o644), euid=0).mqtt is not None


def test_a_mistyped_password_key_is_still_a_secret(tmp_path: Path) -> None:
    path = write(tmp_path, MQTT + f'pasword = "{SECRET}"\n', 0o644)
    with pytest.raises(ConfigError) as exc:  # as root: the file is not private
        load_config(path, euid=0)
    assert "mqtt.pasword" in str(exc.value) and SECRET not in str(exc.value)
    path.chmod(0o600)
    with pytest.raises(ConfigError) as exc:  # private: the key is unknown, its value not quoted
        load_config(path, euid=0)
    assert "mqtt.pasword: unknown key in [mqtt]" in str(exc.value) and SECRET not in str(exc.value)


@pytest.mark.parametrize(
    "text",
    [
        MQTT + "password = 12345678\n",  # not a string: pydantic's error carries the input
        MQTT + f'password = ["{SECRET}"]\n',
        MQTT + f'password = {{ value = "{SECRET}" }}\n',
        MQTT + f'password = "{SECRET}"\npassword_file = "/nonexistent"\n',
        f'budget_w = 1000\nmqtt = "password={SECRET}"\n',
        f'budget_w = 1000\n[mqtt]\nhost = ""\npassword = "{SECRET}"\n',
        f'budget_w = 1000\n[mqtt]\nhost = "h"\nsecret_token = "{SECRET}"\n',
    ],
)
def test_no_error_quotes_a_secret(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path, euid=0)
    assert SECRET not in str(exc.value) and "12345678" not in str(exc.value)
    assert main(["check-config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert SECRET not in out + err and "12345678" not in out + err


def test_a_secret_from_the_environment_is_not_quoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERBUDGETD_MQTT__PASSWORD", SECRET)
    monkeypatch.setenv("POWERBUDGETD_MQTT__PASSWORD_FILE", str(tmp_path / "pw"))
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, MQTT), euid=0)
    assert "not both" in str(exc.value) and SECRET not in str(exc.value)


def test_password_file_and_systemd_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pw = write(tmp_path, SECRET + "\n", 0o600, "mqtt-password")
    cfg = load_config(write(tmp_path, MQTT + f'password_file = "{pw}"\n'), euid=0)
    assert cfg.mqtt.password.get_secret_value() == SECRET  # type: ignore[union-attr]
    assert SECRET not in repr(cfg) and SECRET not in str(cfg.model_dump())
    pw.chmod(0o644)  # this test runs as root: a secret others can read is refused
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, MQTT + f'password_file = "{pw}"\n'), euid=0)
    assert f"chmod 600 {pw}" in str(exc.value) and SECRET not in str(exc.value)
    pw.chmod(0o600)
    # systemd's LoadCredential=mqtt-password:... puts it in $CREDENTIALS_DIRECTORY
    creds = tmp_path / "creds"
    creds.mkdir()
    pw.rename(creds / "mqtt-password")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    cfg = load_config(write(tmp_path, MQTT), euid=0)
    assert cfg.mqtt.password.get_secret_value() == SECRET  # type: ignore[union-attr]
    # a password in the file (or environment) wins over the credential
    cfg = load_config(write(tmp_path, MQTT + 'password = "other"\n'), euid=0)
    assert cfg.mqtt.password.get_secret_value() == "other"  # type: ignore[union-attr]


def test_check_config_never_prints_the_password(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, MQTT + f'password = "{SECRET}"\n')
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err
