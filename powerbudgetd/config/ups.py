"""The UPS section ([ups]): NUT, and what a reload may change."""

from __future__ import annotations

import re
import socket
from pathlib import Path

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from powerbudgetd.config.base import _MeterReach, resolve_password
from powerbudgetd.config.credentials import UPS_PASSWORD_CREDENTIAL

_NUT_WORD = re.compile(r"^[A-Za-z0-9_.@:+-]+$")  # NUT's protocol is line- and space-delimited


class UpsConfig(_MeterReach):
    """A UPS watched through Network UPS Tools: ``upsd`` at ``host``:``port`` serving
    UPS ``name``. Off unless configured. The password, as for MQTT and etcd, first found
    wins: ``password``, ``POWERBUDGETD_UPS__PASSWORD``, ``password_file`` (mode 0600), or
    the systemd credential ``ups-password`` (``LoadCredential=ups-password:...``). upsd
    checks credentials only for commands that change something, never for reading, so
    they are optional.

    On battery for ``on_battery_delay_s``: the budget drops to ``on_battery_budget_w``
    or ``on_battery_fraction`` of the configured budget (default: half); back on line
    for ``online_hold_s``: restored. Low battery, forced shutdown, overload: every card
    to its floor. With ``[feed]``, the UPS's measured real power above the plug-side
    limit lowers the budget by the excess (``hysteresis_w`` dead band). Silence (upsd
    unreachable, stale data, the UPS gone) keeps the budget in force;
    ``stale_as_on_battery`` also lowers it to the on-battery budget.

    ``hosts`` / ``share``: a UPS shared with other powerbudgetd hosts (NUT's
    primary/secondary set-up): ``hosts = 2`` has each of two hosts correct half the
    measured excess, ``share = 0.3`` this one 30 % of it (see ``_MeterReach``).

    ``feed``: the feed of the shared circuit's power tree this UPS carries (needs
    ``[circuit]``). While the on-battery budget is in force the feed is marked lost in
    etcd, as ``circuit feed-down`` would (every host on the tree re-budgets as if it
    were dead: the other feed must carry the load when the battery runs out), and up
    again once the UPS is back on line for ``online_hold_s``. An operator's mark is
    never lifted by a UPS.
    """

    host: str = Field("127.0.0.1", min_length=1, max_length=253)
    port: int = Field(3493, ge=1, le=65535)
    name: str = Field(min_length=1, max_length=64)
    username: str | None = Field(None, min_length=1, max_length=64)
    password: SecretStr | None = None
    password_file: Path | None = None  # a file holding only the password (mode 0600)
    poll_s: float = Field(2.0, ge=0.2, le=60)
    timeout_s: float = Field(5.0, ge=0.2, le=60)  # one request to upsd
    reconnect_max_s: float = Field(30.0, ge=0.2, le=3600)  # backoff between failed polls, doubling from poll_s
    on_battery_delay_s: float = Field(0.0, ge=0, le=3600)
    on_battery_budget_w: float | None = Field(None, gt=0, le=100_000)
    on_battery_fraction: float | None = Field(None, gt=0, le=1)
    online_hold_s: float = Field(60.0, ge=0, le=86400)
    stale_as_on_battery: bool = False
    measured_load: bool = True  # needs [feed]
    hysteresis_w: float = Field(20.0, ge=0, le=1000)
    feed: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")  # the circuit tree's feed it carries

    @field_validator("host", "name", "username")
    @classmethod
    def _words(cls, value: str | None) -> str | None:
        if value is not None and not _NUT_WORD.match(value):
            raise ValueError(f"{value!r}: letters, digits and _ . @ : + - only (no spaces)")
        return value

    @model_validator(mode="after")
    def _check(self) -> UpsConfig:
        if self.on_battery_budget_w is not None and self.on_battery_fraction is not None:
            raise ValueError("give on_battery_budget_w or on_battery_fraction, not both")
        if self.username is not None or self.password_file is not None:
            self.password = resolve_password(self.password, self.password_file, UPS_PASSWORD_CREDENTIAL)
        if self.password is not None and not _NUT_WORD.match(self.password.get_secret_value()):
            raise ValueError("the password must be one word of printable characters (upsd reads it space-delimited)")
        if (self.username is None) != (self.password is None):
            raise ValueError("give both username and password, or neither")
        return self

    def battery_fraction(self) -> float | None:
        """The on-battery fraction in force: the one given, else 0.5 unless a budget in W is."""
        if self.on_battery_budget_w is not None:
            return None
        return 0.5 if self.on_battery_fraction is None else self.on_battery_fraction

    def source_id(self) -> str:
        """The UPS as a power-tree node's ``meter`` names it and as hosts behind it are
        matched: ``ups:NAME@HOST``; a loopback ``host`` is this machine's name (two
        machines' local upsd are two UPSes; a secondary names its primary by that name)."""
        host = socket.gethostname().split(".")[0] if self.host in ("127.0.0.1", "localhost", "::1") else self.host
        return f"ups:{self.name}@{host}"

    def connection(self) -> tuple:
        """What a reload cannot change in a running client (a restart applies it)."""
        pw = None if self.password is None else self.password.get_secret_value()
        return (self.host, self.port, self.name, self.username, pw, self.timeout_s)


UPS_CONNECTION = ("host", "port", "name", "username", "password", "timeout_s")


def ups_on_reload(old: UpsConfig | None, new: UpsConfig | None) -> tuple[UpsConfig | None, str | None]:
    """The ``[ups]`` a reload puts in force, and what of it needs a restart (None: all
    applied). The budget rules change in a running daemon; the connection (host, port,
    name, credentials, timeout), ``feed`` and adding or removing the section need a
    restart, so the running ones are kept."""
    if old is None and new is None:
        return None, None
    if old is None:
        return None, "ups (section added)"
    if new is None:
        return old, "ups (section removed)"
    if new.connection() != old.connection():
        return new.model_copy(update={k: getattr(old, k) for k in UPS_CONNECTION}), "ups connection"
    if new.feed != old.feed:  # wired to the circuit at start
        return new.model_copy(update={"feed": old.feed}), "ups feed"
    return new, None
