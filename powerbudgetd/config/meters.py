"""``[pdu]``, ``[bmc]`` and ``[rapl]``: the measured sources beside the UPS and the wall
meter. Each is off unless configured.

- ``[pdu]``: a metered PDU over SNMP (APC rPDU2, Raritan PDU2): its inlet's real power,
  or the sum of the outlets the host's cords are in (``outlets``);
- ``[bmc]``: the host's BMC over Redfish: the chassis' consumed power;
- ``[rapl]``: the CPU packages' power from the kernel's powercap (RAPL) counters, used for
  the host's own draw in place of a constant ``[feed] host_w``.

The PDU and the BMC are meters: their figures go through the sensor model
(``core.sensor``) and the plausibility rule (``core.plausible``) as the UPS's do, with
``hosts`` / ``share`` for a meter other controlled hosts also draw through.

Secrets, first found wins, as for ``[ups]`` and ``[mqtt]``: the value in the file (better
kept out of a shared one), the environment (``POWERBUDGETD_PDU__COMMUNITY``,
``POWERBUDGETD_BMC__PASSWORD``), a ``*_file`` (mode 0600), or a systemd credential
(:data:`PDU_COMMUNITY_CREDENTIAL` and the others below).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from powerbudgetd.config.base import _MeterReach, _Section, resolve_password

PDU_COMMUNITY_CREDENTIAL = "pdu-snmp-community"
PDU_AUTH_KEY_CREDENTIAL = "pdu-snmp-auth-key"
PDU_PRIV_KEY_CREDENTIAL = "pdu-snmp-priv-key"
BMC_PASSWORD_CREDENTIAL = "bmc-password"
MAX_OUTLETS = 48


class _PolledMeter(_MeterReach):
    """What every polled meter has: how often it is asked (``poll_s``), how long one
    request may take (``timeout_s``), the backoff after failures (doubling from
    ``poll_s`` to ``reconnect_max_s``), the plug-side limit the meter's reading is held
    to (``limit_w``; default: ``[feed]``'s breaker or UPS limit), the dead band
    (``hysteresis_w``, board W) and ``hosts`` / ``share`` (see ``_MeterReach``)."""

    poll_s: float = Field(2.0, ge=0.2, le=60)
    timeout_s: float = Field(2.0, ge=0.2, le=60)
    reconnect_max_s: float = Field(30.0, ge=0.2, le=3600)
    limit_w: float | None = Field(None, gt=0, le=1_000_000)
    hysteresis_w: float = Field(20.0, ge=0, le=1000)

    @model_validator(mode="after")
    def _backoff(self) -> _PolledMeter:
        if self.reconnect_max_s < self.poll_s:
            raise ValueError(f"reconnect_max_s ({self.reconnect_max_s:g} s) must be >= poll_s ({self.poll_s:g} s)")
        return self


class PduConfig(_PolledMeter):
    """A metered PDU read over SNMP at ``host``:``port``.

    ``vendor``: ``apc`` (PowerNet-MIB rPDU2 tables: the device's power in hundredths of
    kW, an outlet's in W) or ``raritan`` (PDU2-MIB: each sensor's value scaled by its
    decimal digits, its units read and checked). ``pdu``: the unit's index (a daisy
    chain's member, 1 alone); ``inlet``: Raritan's inlet. ``outlets``: the outlets this
    host's cords are in: their sum is the host's own draw, this host's alone (leave
    ``hosts``/``share`` out); empty: the inlet's power, which every device on the PDU
    draws (say the controlled hosts behind it with ``hosts`` or ``share``).

    SNMP ``version`` ``2c`` with ``community``, or ``3`` with ``username`` and, for
    authentication, ``digest`` (net-snmp's -a)/``auth_key`` and, for privacy,
    ``cipher`` (-x)/``priv_key``.
    """

    host: str = Field(min_length=1, max_length=253)
    port: int = Field(161, ge=1, le=65535)
    vendor: Literal["apc", "raritan"]
    pdu: int = Field(1, ge=1, le=64)
    inlet: int = Field(1, ge=1, le=64)
    outlets: list[int] = Field(default_factory=list)
    version: Literal["2c", "3"] = "2c"
    community: SecretStr | None = None
    community_file: Path | None = None
    username: str | None = Field(None, min_length=1, max_length=32)
    digest: Literal["MD5", "SHA", "SHA224", "SHA256", "SHA384", "SHA512"] = "SHA"
    auth_key: SecretStr | None = None
    auth_key_file: Path | None = None
    cipher: Literal["DES", "AES", "AES192", "AES256"] = "AES"
    priv_key: SecretStr | None = None
    priv_key_file: Path | None = None

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if any(c.isspace() for c in value) or "/" in value:
            raise ValueError(f"{value!r}: a host name or address, no spaces or slashes")
        return value

    @field_validator("outlets")
    @classmethod
    def _outlets(cls, value: list[int]) -> list[int]:
        if len(value) > MAX_OUTLETS:
            raise ValueError(f"at most {MAX_OUTLETS} outlets, got {len(value)}")
        bad = [n for n in value if not 1 <= n <= 1000]
        if bad:
            raise ValueError(f"outlet numbers are 1 to 1000, got {bad}")
        if len(set(value)) != len(value):
            raise ValueError(f"an outlet named twice: {sorted(value)}")
        return value

    @model_validator(mode="after")
    def _check(self) -> PduConfig:
        if self.version == "2c":
            if self.username is not None or self.auth_key is not None or self.priv_key is not None:
                raise ValueError("username, auth_key and priv_key are SNMPv3's: set version = \"3\", or give community")
            self.community = resolve_password(self.community, self.community_file, PDU_COMMUNITY_CREDENTIAL,
                                              "community")
            if self.community is None:
                raise ValueError("SNMP v2c needs community (or community_file, or the systemd credential "
                                 f"{PDU_COMMUNITY_CREDENTIAL})")
        else:
            if self.community is not None or self.community_file is not None:
                raise ValueError("community is SNMP v2c's: SNMPv3 takes username, auth_key and priv_key")
            if self.username is None:
                raise ValueError("SNMPv3 needs username")
            self.auth_key = resolve_password(self.auth_key, self.auth_key_file, PDU_AUTH_KEY_CREDENTIAL, "auth_key")
            self.priv_key = resolve_password(self.priv_key, self.priv_key_file, PDU_PRIV_KEY_CREDENTIAL, "priv_key")
            if self.priv_key is not None and self.auth_key is None:
                raise ValueError("SNMPv3 privacy (priv_key) needs authentication (auth_key) too")
            for name, key in (("auth_key", self.auth_key), ("priv_key", self.priv_key)):
                if key is not None and len(key.get_secret_value()) < 8:
                    raise ValueError(f"{name}: SNMPv3 keys are at least 8 characters")
        if self.outlets and (self.hosts != 1 or self.share is not None):
            raise ValueError("outlets measure this host's own cords: leave hosts and share out (they are for an "
                             "inlet other hosts draw through)")
        return self

    def source_id(self) -> str:
        """The PDU as a power-tree node's ``meter`` names it and as hosts behind it are
        matched: ``pdu:HOST/inletN`` (or ``/outlets3+4``, ``#P`` for a chain member)."""
        what = f"outlets{'+'.join(map(str, self.outlets))}" if self.outlets else f"inlet{self.inlet}"
        return f"pdu:{self.host}{f'#{self.pdu}' if self.pdu != 1 else ''}/{what}"

    def where(self) -> str:
        """The PDU and what is read, for the logs: ``apc 10.0.0.5:161 outlets 3+4``."""
        what = f"outlets {'+'.join(map(str, self.outlets))}" if self.outlets else f"inlet {self.inlet}"
        return f"{self.vendor} PDU {self.pdu} at {self.host}:{self.port}, {what}"


class BmcConfig(_PolledMeter):
    """The host's BMC over Redfish at ``url`` (``https://bmc.example``; the service root
    ``/redfish/v1`` is found under it), read with HTTP basic authentication as
    ``username``. ``chassis``: the Redfish Chassis id to read (default: the first chassis
    that reports power). The figure: the chassis' ``EnvironmentMetrics`` ``PowerWatts``,
    else its ``Power`` resource's first ``PowerControl`` ``PowerConsumedWatts``.
    ``verify_tls``: check the BMC's certificate (against ``ca_file``, else the system's
    CAs); BMCs often ship a self-signed one: give its CA rather than turning this off.
    The BMC measures this host alone (leave ``hosts``/``share`` out)."""

    url: str = Field(min_length=8, max_length=512)
    username: str | None = Field(None, min_length=1, max_length=128)
    password: SecretStr | None = None
    password_file: Path | None = None
    chassis: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    verify_tls: bool = True
    ca_file: Path | None = None
    poll_s: float = Field(5.0, ge=0.5, le=60)  # BMCs refresh their power figure every few seconds
    timeout_s: float = Field(5.0, ge=0.5, le=60)

    def source_id(self) -> str:
        """The BMC as a power-tree node's ``meter`` names it: ``bmc:HOST`` (the URL's
        host, and ``/CHASSIS`` where one is named)."""
        return f"bmc:{urlsplit(self.url).netloc}{f'/{self.chassis}' if self.chassis else ''}"

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"{value!r}: the BMC's base URL, http(s)://host[:port]")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check(self) -> BmcConfig:
        if self.ca_file is not None and not self.ca_file.is_file():
            raise ValueError(f"ca_file: no such file: {self.ca_file}")
        if self.ca_file is not None and not self.verify_tls:
            raise ValueError("ca_file needs verify_tls = true")
        if self.username is not None or self.password_file is not None:
            self.password = resolve_password(self.password, self.password_file, BMC_PASSWORD_CREDENTIAL)
        if (self.username is None) != (self.password is None):
            raise ValueError("give both username and password (or password_file, or the systemd credential "
                             f"{BMC_PASSWORD_CREDENTIAL}), or neither")
        if self.hosts != 1 or self.share is not None:
            raise ValueError("a BMC measures its own host alone: leave hosts and share out")
        return self


class RaplConfig(_Section):
    """The CPU packages' power from the kernel's powercap RAPL counters under ``root``
    (``intel-rapl:N/energy_uj``, wrapping at ``max_energy_range_uj``; the package zones,
    not their sub-zones), over windows of ``window_s``. The host's own draw (at the PSU
    output, as ``[feed] host_w``) is then measured: packages + ``other_w`` (what RAPL
    does not see: fans, drives, NICs, memory), and the feed's board budget is worked out
    with it wherever it is above ``host_w``. ``host_w`` stays the floor of the host's
    draw (a CPU's draw steps up faster than a window shows), so a measured draw can
    lower the budget, never raise it above what ``host_w`` allows. A counter that
    cannot be read falls back to ``host_w`` alone (said once)."""

    root: Path = Path("/sys/class/powercap")
    window_s: float = Field(1.0, ge=0.1, le=60)
    other_w: float = Field(0.0, ge=0, le=100_000)
