"""What every section's model shares, in a module of its own so that the section modules
(``config.meters``) and ``config/__init__`` both build on it without an import cycle: the
section base (unknown keys and non-finite numbers refused), a meter's reach
(``hosts``/``share``) and the one rule for secrets (a value, a ``*_file``, a systemd
credential; a file readable by its owner only).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from powerbudgetd.core.sensor import Reach


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _MeterReach(_Section):
    """What a meter covers besides this host (``core.sensor.Reach``): ``hosts``, the
    powerbudgetd hosts behind it (this one included; each takes 1/hosts of its excess
    and headroom), or ``share``, the fraction this host takes (hosts of unequal size).
    Left out: the meter is this host's alone."""

    hosts: int = Field(1, ge=1, le=1000)
    share: float | None = Field(None, gt=0, le=1)

    def reach(self) -> Reach:
        return Reach(self.hosts, self.share)


MAX_SECRET_BYTES = 4096


def credential_path(name: str) -> Path | None:
    """``$CREDENTIALS_DIRECTORY/name`` when systemd passed that credential, else None."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / name
    return path if path.is_file() else None


def check_private(path: Path, what: str) -> None:
    """The one rule for every file holding a secret (a password file, a credential, a
    TLS private key): when this process is root, readable by its owner only.

    Raises ValueError naming the file and the fix (never its contents); OSError when it
    cannot be read at all.
    """
    st = path.stat()
    if os.geteuid() == 0 and st.st_mode & 0o077:
        raise ValueError(
            f"{path} {what} but is open to group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"fix: chmod 600 {path}"
        )


def resolve_password(password: SecretStr | None, password_file: Path | None, credential: str,
                     name: str = "password") -> SecretStr | None:
    """A section's secret ``name`` (a password, an SNMP community or key), first found
    wins: ``password`` (the file or the environment), ``password_file``, the systemd
    credential ``credential``. Raises ValueError when both ``password`` and
    ``password_file`` are given, or for a file :func:`read_secret` refuses."""
    if password is not None and password_file is not None:
        raise ValueError(f"give {name} or {name}_file, not both")
    if password is not None:
        return password
    source = password_file or credential_path(credential)
    return None if source is None else SecretStr(read_secret(source))


def read_secret(path: Path) -> str:
    """A secret file's contents, without the trailing newline.

    Raises ValueError naming the file (never its contents): unreadable, empty, too long,
    or, when this process is root, readable by group or others.
    """
    try:
        check_private(path, "holds a secret")
        with open(path, "rb") as fh:
            data = fh.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the secret in {path}: {exc.strerror or exc}") from None
    text = data.decode("utf-8", "replace").rstrip("\r\n")
    if not text or len(data) > MAX_SECRET_BYTES:
        raise ValueError(f"{path}: expected one line holding the secret, got {'nothing' if not text else 'too much'}")
    return text
