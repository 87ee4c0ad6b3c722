"""The whole configuration (Settings): the sections, the environment overrides
(POWERBUDGETD_)."""

from __future__ import annotations

import typing
from contextvars import ContextVar
from collections.abc import Sequence

from pydantic import (
    Field,
    PrivateAttr,
    model_validator,
)
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from powerbudgetd.core.model import CardOverride
from powerbudgetd.config.kubernetes import KubernetesConfig
from powerbudgetd.config.meters import BmcConfig, PduConfig, RaplConfig
from powerbudgetd.config.bank import CardConfig, ControlConfig, FeedConfig, SimConfig
from powerbudgetd.config.circuit import CircuitConfig
from powerbudgetd.config.metrics import MetricsConfig
from powerbudgetd.config.mqtt import MqttConfig
from powerbudgetd.config.recorder import RecorderConfig
from powerbudgetd.config.ups import UpsConfig

ENV_PREFIX = "POWERBUDGETD_"
# Environment variables (lower case, as pydantic-settings keys them) to leave out of
# the next Settings(): set by load_config for a section the file does not have.
_IGNORED_ENV: ContextVar[frozenset[str]] = ContextVar("_IGNORED_ENV", default=frozenset())


class _EnvSource(EnvSettingsSource):
    """The environment, less the variables :func:`load_config` chose to ignore."""

    def _load_env_vars(self) -> typing.Mapping[str, str | None]:
        ignored = _IGNORED_ENV.get()
        return {k: v for k, v in super()._load_env_vars().items() if k.upper() not in ignored}


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
    pdu: PduConfig | None = None  # off unless configured: a metered PDU over SNMP (config.meters)
    bmc: BmcConfig | None = None  # off unless configured: the host's BMC over Redfish (config.meters)
    rapl: RaplConfig | None = None  # off unless configured: the CPU packages' measured draw (config.meters)

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.budget_w is None and self.feed is None:
            raise ValueError("give budget_w (board watts) or a [feed] section to derive it from")
        if self.effective_budget_w() <= 0:
            raise ValueError(f"the feed leaves no board budget: {self.effective_budget_w():.0f} W")
        if self.mqtt is not None and self.mqtt.wall_meter is not None and self.feed is None:
            raise ValueError("[mqtt.wall_meter] needs a [feed] section: the plug-side limit and PSU efficiency come from it")
        for name, meter, why in (
                ("pdu", self.pdu, "the PSU efficiency (and, without limit_w, the plug-side limit) come from it"),
                ("bmc", self.bmc, "the PSU efficiency (and, without limit_w, the plug-side limit) come from it"),
                ("rapl", self.rapl, "the measured host draw replaces its host_w in the feed's budget")):
            if meter is not None and self.feed is None:
                raise ValueError(f"[{name}] needs a [feed] section: {why}")
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
