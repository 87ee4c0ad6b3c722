"""The circuit's section ([circuit]): the etcd store, this host's seat, its name."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from powerbudgetd.core.circuit import HostPower
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.model import Timings
from powerbudgetd.config.base import _Section, resolve_password
from powerbudgetd.config.bank import FeedConfig
from powerbudgetd.config.credentials import check_tls_files, CIRCUIT_PASSWORD_CREDENTIAL
from powerbudgetd.config.mqtt import default_node_id

MACHINE_ID_FILE = Path("/etc/machine-id")


def read_machine_id(path: Path = MACHINE_ID_FILE) -> str:
    """This machine's id (systemd's ``/etc/machine-id``: 32 hex digits, unique per
    install, kept across boots). Raises ValueError when it is missing or not that."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError as exc:
        raise ValueError(f"cannot read the machine id in {path}: {exc.strerror or exc}") from None
    if not re.fullmatch(r"[0-9a-f]{32}", text):
        raise ValueError(f"{path}: not a machine id (32 hex digits); systemd-machine-id-setup writes one")
    return text


def default_circuit_host(machine_id: str) -> str:
    """A circuit seat name for this host: its short name and the first 8 hex digits of
    its machine id, so that cloned hosts with one hostname do not share a seat."""
    return f"{default_node_id()[:55]}-{machine_id[:8]}"


_ENDPOINT_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


class CircuitConfig(_Section):
    """This host's place on a circuit several hosts share through etcd leases.

    ``name``: the circuit (created once with ``powerbudgetd circuit init``, which also
    stores its wall budget and lease TTL); ``endpoints``: etcd client endpoints
    ``host:port`` (several: the next is tried when one fails); ``host``: this host's
    seat name (default: the short host name and the first 8 hex digits of the machine
    id); ``machine_id_file``: where this machine's id is read (default
    ``/etc/machine-id``; the daemon claims its seat name with it); ``reserve_w``: the wall watts this host
    may always use (its seat). ``psu_efficiency``/``host_w`` convert wall to board watts
    (default: from ``[feed]``). The etcd password, as for MQTT, first found wins:
    ``password``, ``POWERBUDGETD_CIRCUIT__PASSWORD``, ``password_file`` (mode 0600), or
    the systemd credential ``etcd-password`` (``LoadCredential=etcd-password:...``).
    With ``tls``: ``ca_file`` (default: the system's CAs), ``cert_file``/``key_file``
    for a client certificate.

    Timings (s): ``poll_s`` between reads of the circuit while anything is in motion or
    its watch is down (a change is read at once; a settled host reads at its keepalive);
    ``request_timeout_s`` for one etcd call; ``lower_s`` the time to lower the cards and confirm (default: 2 ticks
    + ``settle_s`` + 1 s); ``fallback_s`` from a watchdog kill to the cards at the reserve
    share (ExecStopPost failsafe), checked with ``WatchdogSec`` against the TTL;
    ``release_hold_s`` before a grant above the fair share is given back; ``step_w``
    (W) the smallest grant change worth a transaction.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    endpoints: list[str] = Field(default_factory=lambda: ["127.0.0.1:2379"], min_length=1, max_length=16)
    host: str = Field("", pattern=r"^([A-Za-z0-9_.-]{1,64})?$")  # "": from the host name and machine id
    machine_id_file: Path = MACHINE_ID_FILE
    reserve_w: float = Field(gt=0, le=1_000_000)
    psu_efficiency: float | None = Field(None, gt=0.5, le=1)
    host_w: float | None = Field(None, ge=0, le=100_000)
    prefix: str = Field("/powerbudgetd/circuits", pattern=r"^/[A-Za-z0-9_./-]*[A-Za-z0-9_.-]$")
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None  # a file holding only the password (mode 0600)
    poll_s: float = Field(1.0, ge=0.05, le=60)  # while in motion or the watch is down; a change wakes a round
    request_timeout_s: float = Field(2.0, ge=0.1, le=60)
    lower_s: float | None = Field(None, ge=0, le=300)
    fallback_s: float = Field(10.0, ge=0, le=600)
    release_hold_s: float = Field(10.0, ge=0, le=3600)
    step_w: float = Field(20.0, ge=0, le=10_000)
    clock_rate_allowance: float = Field(1e-3, ge=0, lt=0.1)

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        for ep in value:
            m = _ENDPOINT_RE.match(ep)
            if not m or not 1 <= int(m.group(2)) <= 65535:
                raise ValueError(f"not an etcd endpoint: {ep!r} (want host:port, such as 10.0.0.5:2379)")
        return value

    @model_validator(mode="after")
    def _check(self) -> CircuitConfig:
        if self.username is not None or self.password_file is not None:
            self.password = resolve_password(self.password, self.password_file, CIRCUIT_PASSWORD_CREDENTIAL)
        if (self.username is None) != (self.password is None):
            raise ValueError("give both username and password for etcd authentication, or neither")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give both cert_file and key_file for a client certificate, or neither")
        if not self.host:
            self.host = default_circuit_host(self.machine_id())
        if not self.tls and any(v for v in (self.ca_file, self.cert_file)):
            raise ValueError("ca_file, cert_file and key_file need tls = true")
        check_tls_files({n: getattr(self, n) for n in ("ca_file", "cert_file", "key_file")})
        return self

    def machine_id(self) -> str:
        """This machine's id (see :func:`read_machine_id`); ValueError when unreadable."""
        return read_machine_id(self.machine_id_file)

    def warnings(self) -> list[str]:
        """What is allowed but unsafe: a password sent to etcd without TLS."""
        if self.username is not None and not self.tls:
            return [f"[circuit] username {self.username!r} without tls = true: etcd's password crosses the network "
                    "in clear text, and anyone who reads it can rewrite the circuit; set tls = true (and ca_file)"]
        return []

    def fence_lower_s(self, timings: Timings) -> float:
        """The time to lower the cards and confirm (s): ``lower_s``, else 2 ticks +
        settle + 1 s."""
        return self.lower_s if self.lower_s is not None else 2 * timings.tick_s + timings.settle_s + 1.0

    def host_power(self, feed: FeedConfig | None) -> HostPower:
        """Wall <-> board for this host: ``psu_efficiency``/``host_w`` here, else ``[feed]``'s."""
        eff = self.psu_efficiency if self.psu_efficiency is not None else (feed.psu_efficiency if feed else None)
        host = self.host_w if self.host_w is not None else (feed.host_w if feed else None)
        if eff is None or host is None:
            raise ValueError("[circuit] needs psu_efficiency and host_w (or a [feed] section with them): "
                             "the circuit counts wall watts")
        return HostPower(Feed(psu_efficiency=eff, host_w=host), self.reserve_w)
