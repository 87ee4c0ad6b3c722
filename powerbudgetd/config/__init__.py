"""The configuration: one TOML file plus ``POWERBUDGETD_`` environment overrides.

Sources, first wins: environment (``POWERBUDGETD_BUDGET_W``, nested with ``__`` such as
``POWERBUDGETD_CONTROL__TICK_S``), then the file. A missing file is an error, never
silent defaults. Every error names the field, the file and the value.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import socket
import types
import typing
from contextvars import ContextVar
import stat
import tomllib
from pathlib import Path
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyAddress,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from powerbudgetd.core.circuit import HostPower
from powerbudgetd.core.feed import DEFAULT_DERATING, DEFAULT_PSU_EFFICIENCY, DEFAULT_UPS_MARGIN, Feed
from powerbudgetd.core.model import CardOverride
from powerbudgetd.core.meterpath import PathError, watts_at
from powerbudgetd.core.peaks import MEASURED_TRANSIENT_FACTOR, FeedLine, binding_line, transient_factor
from powerbudgetd.core.sensor import Reach
from powerbudgetd.errors import ConfigError
from powerbudgetd.core.model import Timings
from powerbudgetd.config.kubernetes import KubernetesConfig

DEFAULT_CONFIG_PATH = Path("/etc/powerbudgetd/powerbudgetd.toml")
ENV_PREFIX = "POWERBUDGETD_"
SIM_RECORDER_SUBDIR = "sim"  # run --backend sim records here, under the default recorder dir
# Variables that share our prefix without being ours: the service links Kubernetes
# injects for every Service named "powerbudgetd" or "powerbudgetd-<anything>"
# (<NAME>_SERVICE_HOST, <NAME>_SERVICE_PORT[_<port name>], <NAME>_PORT=tcp://...,
# <NAME>_PORT_<n>_<proto>[_ADDR|_PORT|_PROTO]) and Docker links for such a container
# (the same _PORT forms, <NAME>_NAME=/a/b, <NAME>_ENV_<VAR>).
_LINK_SUFFIX = r"(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)(_(ADDR|PORT|PROTO))?|ENV_[A-Z0-9_]+)"
_SERVICE_LINK_RE = re.compile(rf"^POWERBUDGETD(_[A-Z0-9_]+?)?_{_LINK_SUFFIX}$")
# A bare <NAME>_PORT or <NAME>_NAME is a link only by its value (a URL, a link path):
# POWERBUDGETD_METRICS_PORT=19400 is a mistyped setting, =tcp://10.0.0.5:19400 is not.
_LINK_VALUE_RE = {"PORT": re.compile(r"^(tcp|udp|sctp)://\S+$"), "NAME": re.compile(r"^/\S+$")}
_NOT_OVERRIDES = ("POWERBUDGETD_CONFIG",)  # the config file's path, not a setting
# Environment variables (lower case, as pydantic-settings keys them) to leave out of
# the next Settings(): set by load_config for a section the file does not have.
_IGNORED_ENV: ContextVar[frozenset[str]] = ContextVar("_IGNORED_ENV", default=frozenset())


def default_config_path() -> Path:
    """``$POWERBUDGETD_CONFIG``, else ``/etc/powerbudgetd/powerbudgetd.toml``."""
    return Path(os.environ.get("POWERBUDGETD_CONFIG") or DEFAULT_CONFIG_PATH)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class CardConfig(_Section):
    """Per card, keyed by identity (NVML UUID ``GPU-...``, hwmon ``amdgpu-0000:03:00.0``), PCI bus id
    (``"0000:03:00.0"``, any vendor) or index (``"0"``)."""

    exclude: bool = False  # leave this card alone; it counts at its current limit
    max_w: float | None = Field(None, gt=0, le=5000)  # a lower max than the card's own
    priority: int = Field(0, ge=-100, le=100)  # higher borrows first

    def override(self) -> CardOverride:
        return CardOverride(self.exclude, self.max_w, self.priority)


class FeedConfig(_Section):
    """The electrical feed; the board budget is the least that each device allows
    (arithmetic in :mod:`powerbudgetd.core.peaks`):

    - circuit, on averages (a breaker is thermal): breaker_a x volts x derating (NEC:
      continuous loads at 80 %) >= (sum of board limits + host draw) / PSU efficiency;
    - UPS, on peaks (it trips in seconds, faster than a 1 s average shows): ups_w (its
      real watt rating, not VA) x (1 - ups_margin) >= (sum of board limits x transient
      factor + host draw) / PSU efficiency;
    - PSU, on peaks, where ``psu_w`` (its rated DC output) is given: psu_w >= sum of
      board limits x transient factor + host draw.

    The transient factor is what the cards' instant peaks reach over their limits:
    ``transient_factor`` (default 1.35, measured on an H200), or per card model in
    ``[feed.transient_factors]`` (the name NVML reports, e.g. ``"NVIDIA H200" = 1.35``).

    The arithmetic is :class:`powerbudgetd.core.feed.Feed`'s (:meth:`feed`).
    """

    breaker_a: float = Field(gt=0, le=400)
    volts: float = Field(gt=0, le=480)
    derating: float = Field(DEFAULT_DERATING, gt=0, le=1)
    ups_w: float | None = Field(None, gt=0, le=100_000)
    # Headroom kept under the UPS rating at the peak, for what the arithmetic cannot
    # know (a VA rating's real watts, an aging battery); the transients themselves are
    # in transient_factor.
    ups_margin: float = Field(DEFAULT_UPS_MARGIN, ge=0, lt=1)
    psu_efficiency: float = Field(DEFAULT_PSU_EFFICIENCY, gt=0.5, le=1)
    psu_w: float | None = Field(None, gt=0, le=100_000)  # the PSU's rated output (DC W)
    host_w: float = Field(ge=0, le=100_000)  # CPU, RAM, drives, fans: measure it at the plug
    transient_factor: float = Field(MEASURED_TRANSIENT_FACTOR, ge=1.0, le=3.0)
    transient_factors: dict[str, Annotated[float, Field(ge=1.0, le=3.0)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _leaves_a_budget(self) -> FeedConfig:
        if self.board_budget_w() <= 0:
            line = self.binding_line()
            raise ValueError(
                f"leaves no board budget: the {line.device} allows {line.arithmetic} = {line.board_budget_w:.0f} W"
            )
        return self

    def feed(self) -> Feed:
        """The feed model these figures describe (per-model factors stay here: they need the cards)."""
        return Feed(**self.model_dump(exclude={"transient_factors"}))

    def circuit_w(self) -> float:
        return self.feed().circuit_w()  # type: ignore[return-value]  # breaker_a is required here

    def ups_limit_w(self) -> float | None:
        return self.feed().ups_limit_w()

    def wall_limit_w(self) -> float:
        """The tightest plug-side limit on averages (W): what a wall meter checks against."""
        return self.feed().wall_limit_w()  # type: ignore[return-value]

    @property
    def peaks_covered(self) -> bool:
        """Whether a device that trips on peaks (a UPS, a PSU rating) is in the arithmetic."""
        return self.ups_w is not None or self.psu_w is not None

    def factor(self, card_names: Sequence[str] | None = None) -> float:
        """The bank's transient factor for these card models (None: not known, the highest configured)."""
        return transient_factor(card_names, self.transient_factor, self.transient_factors)

    def lines(self, card_names: Sequence[str] | None = None) -> list[FeedLine]:
        """The board budget each device allows: circuit (average), UPS and PSU (peak)."""
        return self.feed().lines(self.factor(card_names))

    def binding_line(self, card_names: Sequence[str] | None = None) -> FeedLine:
        line = binding_line(self.lines(card_names))
        assert line is not None  # the circuit is always stated
        return line

    def board_budget_w(self, card_names: Sequence[str] | None = None) -> float:
        """Board watts the feed allows: the least of its lines."""
        return self.binding_line(card_names).board_budget_w


class ControlConfig(_Section):
    """Control timings (s) and thresholds (fractions of a limit); see ``Timings``."""

    tick_s: float = Field(0.1, ge=0.05, le=5.0)
    donor_hold_s: float = Field(5.0, ge=0.5, le=600)
    recipient_hold_s: float = Field(2.0, ge=0.2, le=600)
    release_hold_s: float = Field(10.0, ge=0.5, le=600)
    donor_enter_fraction: float = Field(0.7, gt=0, lt=1)
    wake_fraction: float = Field(0.85, gt=0, le=1)
    pinned_fraction: float = Field(0.9, gt=0, le=1)
    release_fraction: float = Field(0.6, gt=0, lt=1)
    burst_window_s: float = Field(2.0, ge=0.2, le=60)
    burst_pinned_share: float = Field(0.3, gt=0, le=1)
    burst_release_share: float = Field(0.1, ge=0, lt=1)
    min_step_w: float = Field(5.0, ge=0, le=100)
    settle_s: float = Field(1.0, ge=0.1, le=30)
    confirm_timeout_s: float = Field(3.0, ge=0.5, le=60)
    failsafe_hold_s: float = Field(30.0, ge=0, le=3600)
    boot_timeout_s: float = Field(30.0, ge=1, le=600)
    retry_backoff_s: float = Field(5.0, ge=0.5, le=600)
    retry_backoff_max_s: float = Field(300.0, ge=1, le=86400)
    contest_reverts: int = Field(3, ge=1, le=100)
    contest_window_s: float = Field(300.0, ge=1, le=86400)
    contest_hold_s: float = Field(300.0, ge=1, le=86400)
    enumerate_s: float = Field(5.0, ge=0.5, le=600)
    call_timeout_s: float = Field(0.05, ge=0.005, le=5.0)

    @model_validator(mode="after")
    def _consistent(self) -> ControlConfig:
        try:
            Timings(**self.model_dump())  # cross-field rules live in Timings
        except ValueError as exc:
            named = [f"{k}={v:g}" for k, v in self.model_dump().items() if k in str(exc)]
            raise ValueError(f"{exc} (got {', '.join(named)})") from None
        return self

    def timings(self) -> Timings:
        try:
            return Timings(**self.model_dump())
        except ValueError as exc:
            raise ConfigError(f"[control]: {exc}") from None


class SimConfig(_Section):
    """The simulated bank behind ``run --backend sim``."""

    scenario: str = "workstation-4"  # a packaged scenario name or a TOML file
    seed: int | None = None
    lag_s: float | None = Field(None, ge=0, le=5)
    state_file: str | None = None  # keep the simulated cards' limits across restarts


def _state_dir() -> Path:
    # systemd's StateDirectory=powerbudgetd sets $STATE_DIRECTORY (colon-separated).
    env = os.environ.get("STATE_DIRECTORY", "")
    return Path(env.split(":")[0]) if env else Path("/var/lib/powerbudgetd")


class RecorderConfig(_Section):
    """The flight recorder: a durable JSON-lines power log (see ``recorder.py``).

    Sizes in bytes. A record is about 140 bytes per card plus 150 (``scripts/bench-recorder``):
    at one a second the default total keeps about 17 days of a 4-card bank, 10 of 8 cards.
    """

    enabled: bool = True
    dir: Path = Field(default_factory=_state_dir)  # $STATE_DIRECTORY, else /var/lib/powerbudgetd
    interval_s: float = Field(1.0, ge=0.1, le=3600)  # one record per interval
    fsync_interval_s: float = Field(1.0, ge=0, le=3600)  # 0: fsync every record
    max_file_bytes: int = Field(16 << 20, ge=4096, le=1 << 34)
    max_total_bytes: int = Field(1 << 30, ge=8192, le=1 << 40)

    @model_validator(mode="after")
    def _check(self) -> RecorderConfig:
        if self.max_total_bytes < 2 * self.max_file_bytes:
            raise ValueError(
                f"max_total_bytes ({self.max_total_bytes}) must be at least twice max_file_bytes "
                f"({self.max_file_bytes}): the file being written counts against the total"
            )
        return self

    def dir_for(self, backend: str) -> Path:
        """Where a run on ``backend`` records: ``dir``, except that a simulated run with
        the default ``dir`` records under ``dir/sim``, apart from the real history
        (``log report`` on the default directory never sees it)."""
        if backend == "sim" and "dir" not in self.model_fields_set:
            return self.dir / SIM_RECORDER_SUBDIR
        return self.dir


class MetricsConfig(_Section):
    """The Prometheus endpoint, ``http://listen_address:port/metrics``.

    Loopback by default: the daemon runs as root, and its numbers are for this host's
    Prometheus (or a reverse proxy) unless the operator opens them up with
    ``listen_address = "0.0.0.0"`` (or the address of the scrape network). Port 19400:
    outside 9100-9999, which exporters have claimed, and clear of dcgm-exporter's 9400.
    At most ``max_connections`` are held at once (fewer where the descriptor limit is
    low); a connection silent for ``idle_timeout_s`` is closed, and one that has not
    sent a whole request ``request_timeout_s`` after its first byte (a client dribbling
    bytes to hold its slot) too.
    """

    enabled: bool = True
    listen_address: IPvAnyAddress = Field(default="127.0.0.1", validate_default=True)
    port: int = Field(19400, ge=1, le=65535)
    max_connections: int = Field(256, ge=4, le=10_000)
    idle_timeout_s: float = Field(10.0, gt=0, le=300)
    request_timeout_s: float = Field(5.0, gt=0, le=300)


_TOPIC_LEVEL_CHARS = re.compile(r"[+#\x00]")


def _check_topic(value: str | None) -> str | None:
    """An MQTT topic we publish or subscribe to: not empty, no wildcards, no NUL."""
    if value is not None and (not value or _TOPIC_LEVEL_CHARS.search(value) or value.startswith("/") or value.endswith("/")):
        raise ValueError(f"not a usable MQTT topic: {value!r} (no '+', '#', leading or trailing '/')")
    return value


def default_node_id() -> str:
    """This host's short name, reduced to the characters MQTT topics and Home Assistant
    object ids accept (``[A-Za-z0-9_-]``)."""
    short = socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9_-]", "_", short) or "powerbudgetd"


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


# What each preset's device publishes (the watts path's check): Tasmota's SENSOR
# telemetry from a single- and a two-channel device, a Shelly Gen2 switch's status.
METER_SAMPLES: dict[str, tuple[dict[str, Any], ...]] = {
    "tasmota": (
        {"Time": "2025-06-15T12:00:00", "ENERGY": {"Total": 12.3, "Power": 812, "Voltage": 230, "Current": 3.5}},
        {"Time": "2025-06-15T12:00:00", "ENERGY": {"Total": 12.3, "Power": [412, 400], "Voltage": 230,
                                                    "Current": [1.8, 1.7]}},
    ),
    "shelly": ({"id": 0, "source": "init", "output": True, "apower": 812.4, "voltage": 230.1, "current": 3.5,
                "aenergy": {"total": 1234.5, "by_minute": [13.1, 13.5, 13.2], "minute_ts": 1750000000}},),
}
_PRESET_PATHS = {"tasmota": "ENERGY.Power", "shelly": "apower"}


class _MeterReach(_Section):
    """What a meter covers besides this host (``core.sensor.Reach``): ``hosts``, the
    powerbudgetd hosts behind it (this one included; each takes 1/hosts of its excess
    and headroom), or ``share``, the fraction this host takes (hosts of unequal size).
    Left out: the meter is this host's alone."""

    hosts: int = Field(1, ge=1, le=1000)
    share: float | None = Field(None, gt=0, le=1)

    def reach(self) -> Reach:
        return Reach(self.hosts, self.share)


class WallMeterConfig(_MeterReach):
    """A smart plug or metered PDU that reports the host's wall (plug) power over MQTT.

    Presets: ``tasmota`` (``topic`` is the device topic: ``tele/<topic>/SENSOR``,
    ``ENERGY.Power``), ``shelly`` (Gen2/Plus, ``prefix``: ``<prefix>/status/switch:<switch>``,
    ``apower``) and ``generic`` (``topic`` is the full topic). ``json_path`` (required
    for ``generic``, else it replaces the preset's) is a dotted path to the watts, list
    items by number (``ENERGY.Power.1``: one channel of a multi-channel Tasmota) or
    ``*`` for their sum (``ENERGY.Power.*``); empty for a bare number
    (``core.meterpath``). Under a preset it must find watts in one of the preset's
    sample payloads (:data:`METER_SAMPLES`), or the config is refused.
    A reading older than ``max_age_s`` or outside [``min_w``, ``max_w``] is ignored.
    """

    preset: Literal["tasmota", "shelly", "generic"]
    topic: str | None = None
    prefix: str | None = None
    switch: int = Field(0, ge=0, le=63)  # shelly: the switch (output) whose meter reads the host
    json_path: str | None = None
    max_age_s: float = Field(30.0, gt=0, le=3600)
    min_w: float = Field(1.0, ge=0, le=100_000)  # a running host never draws 0 W
    max_w: float = Field(20_000.0, gt=0, le=100_000)
    hysteresis_w: float = Field(20.0, ge=0, le=1000)  # dead band against a noisy meter

    @field_validator("topic", "prefix")
    @classmethod
    def _topics(cls, value: str | None) -> str | None:
        return _check_topic(value)

    @model_validator(mode="after")
    def _check(self) -> WallMeterConfig:
        needs = {"tasmota": ("topic",), "shelly": ("prefix",), "generic": ("topic", "json_path")}[self.preset]
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"preset {self.preset!r} needs {' and '.join(missing)}")
        if self.min_w >= self.max_w:
            raise ValueError(f"min_w ({self.min_w:g} W) must be below max_w ({self.max_w:g} W)")
        if self.switch and self.preset != "shelly":
            raise ValueError("switch is the Shelly preset's: give the topic instead")
        if self.preset in METER_SAMPLES and self.json_path is not None:
            errors = []
            for sample in METER_SAMPLES[self.preset]:
                try:
                    watts_at(sample, self.power_path())
                    break
                except PathError as exc:
                    errors.append(str(exc))
            else:
                raise ValueError(f"json_path {self.json_path!r} finds no watts in a {self.preset} payload "
                                 f"({'; '.join(dict.fromkeys(errors))}); e.g. {_PRESET_PATHS[self.preset]}")
        return self

    def state_topic(self) -> str:
        if self.preset == "tasmota":
            return f"tele/{self.topic}/SENSOR"
        if self.preset == "shelly":
            return f"{self.prefix}/status/switch:{self.switch}"
        return self.topic  # type: ignore[return-value]

    def power_path(self) -> tuple[str, ...]:
        path = self.json_path if self.json_path is not None else _PRESET_PATHS.get(self.preset, "")
        return tuple(p for p in path.split(".") if p)

    def availability(self) -> tuple[str, frozenset[str]] | None:
        """The meter's own online topic and the payloads that mean offline, if it has one."""
        if self.preset == "tasmota":
            return f"tele/{self.topic}/LWT", frozenset({"Offline"})
        if self.preset == "shelly":
            return f"{self.prefix}/online", frozenset({"false"})
        return None


class RemoteBudgetConfig(_Section):
    """Budget commands over MQTT: a value in [sum of card minimums, configured budget] (W)
    is applied, anything else rejected with the reason on ``response_topic``. Topics
    default to ``<base_topic>/budget/set`` and ``<base_topic>/budget/result``."""

    enabled: bool = False
    command_topic: str | None = None
    response_topic: str | None = None
    # A raise (toward the configured budget) is taken at most this often; a lower
    # budget is always taken at once (protection first).
    raise_interval_s: float = Field(10.0, ge=0, le=3600)

    @field_validator("command_topic", "response_topic")
    @classmethod
    def _topics(cls, value: str | None) -> str | None:
        return _check_topic(value)


MQTT_PASSWORD_CREDENTIAL = "mqtt-password"
CIRCUIT_PASSWORD_CREDENTIAL = "etcd-password"
UPS_PASSWORD_CREDENTIAL = "ups-password"
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


def resolve_password(password: SecretStr | None, password_file: Path | None, credential: str) -> SecretStr | None:
    """A section's password, first found wins: ``password`` (the file or the
    environment), ``password_file``, the systemd credential ``credential``. Raises
    ValueError when both ``password`` and ``password_file`` are given, or for a file
    :func:`read_secret` refuses."""
    if password is not None and password_file is not None:
        raise ValueError("give password or password_file, not both")
    if password is not None:
        return password
    source = password_file or credential_path(credential)
    return None if source is None else SecretStr(read_secret(source))


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

    @field_validator("base_topic", "discovery_prefix")
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

    Timings (s): ``poll_s`` between reads of the circuit; ``request_timeout_s`` for one
    etcd call; ``lower_s`` the time to lower the cards and confirm (default: 2 ticks
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
    poll_s: float = Field(1.0, ge=0.05, le=60)
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


class _EnvSource(EnvSettingsSource):
    """The environment, less the variables :func:`load_config` chose to ignore."""

    def _load_env_vars(self) -> typing.Mapping[str, str | None]:
        ignored = _IGNORED_ENV.get()
        return {k: v for k, v in super()._load_env_vars().items() if k.upper() not in ignored}


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


class Settings(BaseSettings):
    """The whole configuration. ``budget_w`` is the bank's board-power budget (W).

    ``warnings``: what :func:`load_config` left out or doubts (unknown variables, an
    environment secret for a section the file does not have), for the log and check-config.
    """

    model_config = SettingsConfigDict(
        env_prefix="POWERBUDGETD_", env_nested_delimiter="__", extra="forbid", allow_inf_nan=False
    )
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        return self._warnings

    budget_w: float | None = Field(None, gt=0, le=100_000)  # board watts; or derive it from [feed]
    feed: FeedConfig | None = None
    allow_monitor_only: bool = False  # without write permission: watch, do not enforce
    nvml_init_attempts: int = Field(5, ge=1, le=100)  # nvmlInit tries at start (driver still loading)
    nvml_init_backoff_s: float = Field(1.0, ge=0.01, le=60)  # first wait between them, doubling
    # Limits are volatile without persistence mode (lost when the driver unloads):
    # turn it on at boot where it is off; false only warns.
    enable_persistence_mode: bool = True
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$")
    cards: dict[str, CardConfig] = Field(default_factory=dict)
    control: ControlConfig = Field(default_factory=ControlConfig)
    sim: SimConfig = Field(default_factory=SimConfig)
    recorder: RecorderConfig = Field(default_factory=RecorderConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    mqtt: MqttConfig | None = None  # off unless configured
    ups: UpsConfig | None = None  # off unless configured
    circuit: CircuitConfig | None = None  # off unless configured: one budget shared with other hosts
    kubernetes: KubernetesConfig | None = None  # off unless a node is named: its startup taint and labels

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.budget_w is None and self.feed is None:
            raise ValueError("give budget_w (board watts) or a [feed] section to derive it from")
        if self.effective_budget_w() <= 0:
            raise ValueError(f"the feed leaves no board budget: {self.effective_budget_w():.0f} W")
        if self.mqtt is not None and self.mqtt.wall_meter is not None and self.feed is None:
            raise ValueError("[mqtt.wall_meter] needs a [feed] section: the plug-side limit and PSU efficiency come from it")
        if self.ups is not None and self.ups.feed is not None and self.circuit is None:
            raise ValueError(f"[ups] feed {self.ups.feed!r} needs a [circuit] section: the feed is marked lost "
                             "in the shared circuit's power tree")
        if self.circuit is not None:
            hp = self.circuit.host_power(self.feed)
            if hp.board_budget_w() <= 0:
                raise ValueError(
                    f"[circuit] reserve_w {self.circuit.reserve_w:g} W leaves no board budget: x "
                    f"{hp.feed.psu_efficiency:g} - {hp.feed.host_w:g} W host_w = {hp.board_budget_w():g} W"
                )
        return self

    def effective_budget_w(self, card_names: Sequence[str] | None = None) -> float:
        """The board budget in force: the lower of ``budget_w`` and what ``[feed]`` allows
        for cards of these model names (None: not known; the highest transient factor)."""
        derived = self.feed.board_budget_w(card_names) if self.feed else None
        return min(b for b in (self.budget_w, derived) if b is not None)

    def reserve_budget_w(self, card_names: Sequence[str] | None = None) -> float:
        """The board budget this host may always use (W): the one in force, or lower
        where a ``[circuit]`` reserve allows less (what boot and failsafe hold the cards to)."""
        budget = self.effective_budget_w(card_names)
        if self.circuit is not None:
            budget = min(budget, self.circuit.host_power(self.feed).board_budget_w())
        return budget

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's contents arrive as init kwargs; the environment overrides them.
        return (_EnvSource(settings_cls), init_settings)

    def overrides(self) -> dict[str, CardOverride]:
        return {key: card.override() for key, card in self.cards.items()}



def load_config(path: str | Path, *, euid: int | None = None) -> Settings:
    """Read and validate ``path``, with environment overrides.

    Raises ConfigError naming the file, field and value; ``euid`` (default: this
    process's) 0 also refuses a file others could change (see :func:`unsafe_mode`).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a config file (give the file, e.g. {path / 'powerbudgetd.toml'})")
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file (see config/powerbudgetd.toml for an example)")
    if (os.geteuid() if euid is None else euid) == 0:
        st, dir_st = path.stat(), path.resolve().parent.stat()
        problem = unsafe_mode(st.st_mode, st.st_uid, dir_st.st_mode, dir_st.st_uid)
        if problem:
            raise ConfigError(f"{path}: {problem}; running as root, powerbudgetd refuses a config file others can change")
    data = parse_toml(path)
    secrets = secret_keys(data)
    if secrets and (os.geteuid() if euid is None else euid) == 0:
        mode = path.stat().st_mode
        if mode & 0o077:
            raise ConfigError(
                f"{path}: holds {', '.join(secrets)} but is open to group or others "
                f"(mode {stat.S_IMODE(mode):04o}); fix: chmod 600 {path}, or move the secret out of the file "
                f"({'; '.join(_secret_advice(secrets))})"
            )
    cased = key_case_problems(data, Settings)
    if cased:
        raise ConfigError(f"{path}: invalid configuration\n" + "\n".join(f"  {p}" for p in cased))
    quoted = quoted_numbers(data)
    if quoted:
        raise ConfigError(f"{path}: invalid configuration\n" + "\n".join(
            f"  {name}: a number, not a string (got {value!r}): write {name.rsplit('.', 1)[-1]} = {value.strip()} "
            "without quotes" for name, value in quoted))
    env = classify_env()
    warnings = [f"{name} is not a powerbudgetd setting and is ignored" + (f": did you mean {hint}?" if hint else "")
                for name, hint in env.unknown]
    try:
        settings = _settings(data, frozenset())
    except ValidationError as exc:
        # Sections only the environment speaks of (a secret set for MQTT while the file
        # has no [mqtt]): when they alone fail, leave them off rather than refuse to boot.
        env_only = {sec: names for sec, names in env.by_section.items()
                    if sec in _OPTIONAL_SECTIONS and sec not in data}
        failing = {str(e["loc"][0]) if e["loc"] else "" for e in exc.errors()}
        if not env_only or not failing <= set(env_only):
            raise ConfigError(format_validation_error(path, exc)) from None
        ignored: set[str] = set()
        for sec in sorted(failing):
            names = env_only[sec]
            missing = [f"{sec}.{e['loc'][1]}" for e in exc.errors()
                       if e["type"] == "missing" and len(e["loc"]) > 1 and e["loc"][0] == sec]
            warnings.append(
                f"{', '.join(names)} set for [{sec}], but {path} has no [{sec}] section"
                + (f" and {', '.join(missing)} is not given" if missing else "")
                + f": [{sec}] stays off and the variable is ignored"
            )
            ignored.update(n.upper() for n in names)
        try:
            settings = _settings(data, frozenset(ignored))
        except ValidationError as exc2:
            raise ConfigError(format_validation_error(path, exc2)) from None
    settings._warnings.extend(warnings)
    if settings.circuit is not None:
        settings._warnings.extend(settings.circuit.warnings())
    return settings


def key_case_problems(table: dict[str, Any], model: type[BaseModel], where: str = "") -> list[str]:
    """Keys TOML keeps apart but the settings would not: a setting spelled in another
    case (``budget_W``: settings are lower case), and two keys of one table that differ
    only in case (``budget_w`` beside ``Budget_w``; in a map such as ``[cards]`` or
    ``transient_factors`` too: two spellings of one key are a mistake either way). One
    line per problem, naming the keys as written."""
    out = []
    seen: dict[str, str] = {}
    for key in table:
        folded = key.casefold()
        if folded in seen:
            out.append(f"{where}{seen[folded]} and {where}{key}: the same key in two spellings; keep one")
        seen.setdefault(folded, key)
    fields = model.model_fields
    for key, value in table.items():
        name = key if key in fields else next((f for f in fields if f.casefold() == key.casefold()), None)
        if name is None:
            continue  # not a setting: the model's own check names it
        if name != key:
            out.append(f"{where}{key}: settings are lower case: write {name}")
        sub = _model_of(fields[name].annotation)
        if sub is not None and isinstance(value, dict):
            out += key_case_problems(value, sub, f"{where}{name}.")
        elif isinstance(value, dict):
            out += key_case_problems(value, _NoFields, f"{where}{name}.")
    return out


class _NoFields(BaseModel):
    """A map's table (keys are data, not settings): only same-key spellings are checked."""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds (through ``X | None``), else None."""
    candidates = typing.get_args(annotation) or (annotation,)
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def _settings(data: dict[str, Any], ignored_env: frozenset[str]) -> Settings:
    token = _IGNORED_ENV.set(ignored_env)
    try:
        return Settings(**data)
    finally:
        _IGNORED_ENV.reset(token)


def parse_toml(path: Path) -> dict[str, Any]:
    """The TOML table in ``path``, whatever editor saved it: UTF-8 with or without a
    byte-order mark, UTF-16 with one, CRLF or LF line ends, tabs. Raises ConfigError
    naming the real cause (the encoding, the line and column of a TOML error)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            text = raw.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: starts as UTF-16 but is not: {exc.reason} at byte {exc.start}") from None
    elif b"\x00" in raw[:4096]:
        raise ConfigError(
            f"{path}: contains NUL bytes: UTF-16 or UTF-32 without a byte-order mark, or not a text file; "
            "save it as UTF-8"
        )
    else:
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
            raise ConfigError(
                f"{path}: not UTF-8: byte 0x{raw[exc.start]:02x} at line {line}, column {col} "
                "(saved as Latin-1 or Windows-1252?); save the file as UTF-8"
            ) from None
    text = text.removeprefix("\ufeff")  # UTF-16 with a BOM keeps it as a character
    # TOML takes CRLF line ends but not a lone CR (classic Mac) inside the text.
    if "\r" in text.replace("\r\n", ""):
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # the parser recurses on nested arrays and inline tables
        raise ConfigError(f"{path}: nested too deep for the TOML parser (more than {MAX_TOML_DEPTH} levels "
                          "are refused)") from None
    where = too_deep(data, MAX_TOML_DEPTH)
    if where is not None:
        raise ConfigError(f"{path}: {where}: nested more than {MAX_TOML_DEPTH} levels deep") from None
    return data


# The deepest table or array any file of the project reads is a few levels (a tree's
# [hosts.NAME] cords); anything deeper is refused before a validator walks it.
MAX_TOML_DEPTH = 16


def too_deep(data: object, limit: int) -> str | None:
    """The dotted path of the first value nested more than ``limit`` tables or arrays
    deep in ``data`` (as parsed from TOML or JSON), or None. Iterative: bounded by the
    data's size, whatever its depth."""
    stack: list[tuple[object, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, dict):
            items: Iterable[tuple[object, object]] = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            continue
        if depth >= limit:
            return where or "the top level"
        for key, item in items:
            part = f"[{key}]" if isinstance(key, int) else (f".{key}" if where else str(key))
            stack.append((item, (where + part)[:200], depth + 1))
    return None


def unsafe_mode(mode: int, uid: int, dir_mode: int, dir_uid: int) -> str | None:
    """Why a config file that root reads is unsafe, or None (the rule sshd applies).

    The file must be owned by root and writable by no one else; its directory must not
    let another user swap it (group/other-writable without the sticky bit, or not
    root's). ``mode``/``uid``: the file's ``st_mode``/``st_uid``; ``dir_*``: its directory's.
    """
    if uid != 0:
        return f"owned by uid {uid}, not root"
    if mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(mode):04o})"
    if dir_uid != 0:
        return f"its directory is owned by uid {dir_uid}, not root"
    if dir_mode & 0o022 and not dir_mode & stat.S_ISVTX:
        return f"its directory is writable by group or others (mode {stat.S_IMODE(dir_mode):04o})"
    return None


def format_validation_error(path: Path, exc: ValidationError) -> str:
    """One line per error: the field (dotted), pydantic's reason, the value given, and
    the environment variable when the value came from one."""
    lines = [f"{path}: invalid configuration"]
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        field = ".".join(loc) or "(top level)"
        value = err.get("input")
        shown = f" (got {_shown_value(value)})" if _may_show(loc, err["type"], value) else ""
        env = _env_source(loc)
        if env:
            shown += f" from ${env}"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            known = _field_names_at(loc[:-1])
            close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6) if loc else []
            where = ".".join(loc[:-1])
            # A key of another section (``ups_w`` at the top: it is [feed]'s) beats a
            # name that merely looks alike (the section [ups]).
            homes = [h for h in _sections_with(loc[-1]) if h != where] if loc else []
            msg = f"unknown key{' in [' + where + ']' if where else ' at the top level'}" + (
                f": {loc[-1]!r} is a key of {' and '.join(f'[{h}]' for h in homes)}: move it there" if homes
                else f": did you mean {close[0]!r}?" if close else f" (known: {', '.join(sorted(known))})"
            )
        lines.append(f"  {field}: {msg}{shown}")
    return "\n".join(lines)


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    """The model whose keys are expected at ``loc`` (a dotted path into Settings)."""
    model: type[BaseModel] | None = Settings
    i = 0
    while i < len(loc) and model is not None:
        field = model.model_fields.get(loc[i])
        if field is None:
            return None
        model, i = _unwrap(field.annotation), i + 1
        if model is dict:  # a dict of sections ([cards."N"]): skip the key
            model, i = _dict_value_model(field.annotation), i + 1
    return model


def _unwrap(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is dict:
        return dict
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _dict_value_model(annotation: Any) -> type[BaseModel] | None:
    args = typing.get_args(annotation)
    return _unwrap(args[1]) if len(args) == 2 else None


def _sections_with(key: str, model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """Dotted names of the sections (not ``[cards."N"]``'s kind) that have ``key``."""
    found: list[str] = []
    for name, field in (model or Settings).model_fields.items():
        sub = _unwrap(field.annotation)
        if sub is None or sub is dict:
            continue
        dotted = f"{prefix}{name}"
        if key in sub.model_fields:
            found.append(dotted)
        found += _sections_with(key, sub, dotted + ".")
    return found


_SECRET_ADVICE = {
    "mqtt": f"[mqtt] password_file, or systemd LoadCredential={MQTT_PASSWORD_CREDENTIAL}:...",
    "circuit": f"[circuit] password_file, or systemd LoadCredential={CIRCUIT_PASSWORD_CREDENTIAL}:...",
    "ups": f"[ups] password_file, or systemd LoadCredential={UPS_PASSWORD_CREDENTIAL}:...",
}


def _secret_advice(secrets: list[str]) -> list[str]:
    """Where each section's secret can live instead of the config file."""
    sections = dict.fromkeys(name.split(".", 1)[0] for name in secrets)
    return [_SECRET_ADVICE.get(sec, f"[{sec}]: an environment variable POWERBUDGETD_{sec.upper()}__...")
            for sec in sections]


def quoted_numbers(data: Any, model: type[BaseModel] | None = None, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted name, value) for each number written as a TOML string (``budget_w =
    "900"``): pydantic would turn it into a number without a word; a config file says
    what it means. (Environment variables are strings by nature and are not checked.)"""
    found: list[tuple[str, str]] = []
    if not isinstance(data, dict):
        return found
    model = model or Settings
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            continue
        sub = _unwrap(field.annotation)
        if sub is dict:
            inner = _dict_value_model(field.annotation)
            if inner is not None and isinstance(value, dict):
                for k, v in value.items():
                    found += quoted_numbers(v, inner, f"{prefix}{key}.{k}.")
        elif sub is not None:
            found += quoted_numbers(value, sub, f"{prefix}{key}.")
        elif isinstance(value, str) and _numeric(field.annotation) and _parses_as_number(value):
            found.append((f"{prefix}{key}", value))  # "lots" is left to pydantic: not a number at all
    return found


def _parses_as_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _numeric(annotation: Any) -> bool:
    """A field that takes only numbers (float or int, optionally None)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return all(a in (int, float) for a in args)


def _field_names_at(loc: list[str]) -> list[str]:
    model = _model_at(loc)
    return list(model.model_fields) if model is not None else []


def _required_fields(model: type[BaseModel]) -> list[str]:
    return [name for name, f in model.model_fields.items() if f.is_required()]


# Sections a file may leave out (the feature is then off): the environment alone cannot
# turn them on by half.
_OPTIONAL_SECTIONS: dict[str, type[BaseModel]] = {
    "mqtt": MqttConfig, "feed": FeedConfig, "ups": UpsConfig, "circuit": CircuitConfig,
}


@dataclasses.dataclass
class EnvReport:
    """The ``POWERBUDGETD_*`` variables, sorted: ``overrides`` (settings, by name),
    ``by_section`` (override names per top-level key), ``unknown`` (name, closest
    setting or None), ``links`` (orchestrator service links: not ours, ignored)."""

    overrides: list[str]
    by_section: dict[str, list[str]]
    unknown: list[tuple[str, str | None]]
    links: list[str]


def env_names() -> list[str]:
    """Every environment variable name a setting answers to, nested ones with ``__``
    (``[cards]`` keys shown as ``POWERBUDGETD_CARDS__<KEY>__...``)."""
    out: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            env = f"{prefix}{name.upper()}"
            out.append(env)
            sub = _unwrap(field.annotation)
            if sub is dict:
                value = _dict_value_model(field.annotation)
                if value is not None:
                    walk(value, f"{env}__<KEY>__")
            elif sub is not None:
                walk(sub, f"{env}__")

    walk(Settings, ENV_PREFIX)
    return out


def classify_env(environ: typing.Mapping[str, str] | None = None) -> EnvReport:
    """Sort the ``POWERBUDGETD_*`` variables into overrides, unknown names (with a
    did-you-mean) and service links that only share the prefix."""
    environ = os.environ if environ is None else environ
    known = env_names()
    exact = {k for k in known if "<KEY>" not in k}
    keyed = [re.compile("^" + re.escape(k).replace(re.escape("<KEY>"), "[^_]+(?:_[^_]+)*") + "$") for k in known if "<KEY>" in k]
    report = EnvReport([], {}, [], [])
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in _NOT_OVERRIDES:
            continue
        if upper in exact or any(r.match(upper) for r in keyed) or _is_section_prefix(upper, exact):
            report.overrides.append(name)
            report.by_section.setdefault(upper[len(ENV_PREFIX):].split("__")[0].lower(), []).append(name)
        elif _is_link(upper, environ[name]):
            report.links.append(name)
        else:
            close = difflib.get_close_matches(upper, [k for k in known if "<KEY>" not in k], n=1, cutoff=0.75)
            report.unknown.append((name, close[0] if close else None))
    return report


def _is_link(name: str, value: str) -> bool:
    """Whether ``name`` (upper case) = ``value`` is an orchestrator's service link."""
    if _SERVICE_LINK_RE.match(name):
        return True
    last = name.rsplit("_", 1)[-1]
    return last in _LINK_VALUE_RE and bool(_LINK_VALUE_RE[last].match(value.strip()))


def _is_section_prefix(name: str, exact: set[str]) -> bool:
    # POWERBUDGETD_FEED='{"breaker_a": 15, ...}' sets a whole section as JSON.
    return any(k.startswith(name + "__") for k in exact)

_SECRET_KEY = re.compile(r"pass|secret|token|credential|pwd|auth", re.IGNORECASE)
MAX_SHOWN_VALUE = 80


def secret_keys(data: Any, prefix: str = "") -> list[str]:
    """Dotted names of keys in parsed TOML that look like they hold a secret (any
    ``password``, ``token``... even mistyped), with a non-empty value."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            name = f"{prefix}{key}"
            if _SECRET_KEY.search(str(key)) and not str(key).endswith("_file") and value not in (None, "", {}):
                found.append(name)
            else:
                found += secret_keys(value, name + ".")
    elif isinstance(data, list):
        for i, item in enumerate(data):
            found += secret_keys(item, f"{prefix}{i}.")
    return found


def _may_show(loc: list[str], kind: str, value: Any) -> bool:
    """Whether an error may quote the value given: never for a field that may hold a
    secret, never for text under a key that is not a field at all (a mistyped name may
    be a secret's), and never for a table (it may hold one)."""
    if isinstance(value, dict | list) or (kind == "extra_forbidden" and isinstance(value, str)):
        return False
    if isinstance(value, str) and _SECRET_KEY.search(value):  # e.g. mqtt = "password=..."
        return False
    return not any(_SECRET_KEY.search(part) and not part.endswith("_file") for part in loc)


def _shown_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_VALUE else text[: MAX_SHOWN_VALUE - 3] + "..."


def _env_source(loc: list[str]) -> str | None:
    """The environment variable that set the field at ``loc``, if one did."""
    for n in range(len(loc), 0, -1):
        name = ENV_PREFIX + "__".join(loc[:n]).upper()
        if name in os.environ:
            return name
    return None


def env_overrides() -> list[str]:
    """Names of the ``POWERBUDGETD_*`` environment variables that override the file
    (not the config path, not unknown names, not service links)."""
    return classify_env().overrides
