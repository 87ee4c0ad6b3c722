"""The configuration: one TOML file plus ``POWERBUDGETD_`` environment overrides.

Sources, first wins: environment (``POWERBUDGETD_BUDGET_W``, nested with ``__`` such as
``POWERBUDGETD_CONTROL__TICK_S``), then the file. A missing file is an error, never
silent defaults. Every error names the field, the file and the value.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, IPvAnyAddress, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from powerbudgetd.controller import CardOverride
from powerbudgetd.errors import ConfigError
from powerbudgetd.model import Timings

DEFAULT_CONFIG_PATH = Path("/etc/powerbudgetd/powerbudgetd.toml")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CardConfig(_Section):
    """Per card, keyed by UUID (``GPU-...``) or index (``"0"``)."""

    exclude: bool = False  # leave this card alone; it counts at its current limit
    max_w: float | None = Field(None, gt=0, le=5000)  # a lower max than the card's own
    priority: int = Field(0, ge=-100, le=100)  # higher borrows first

    def override(self) -> CardOverride:
        return CardOverride(self.exclude, self.max_w, self.priority)


class FeedConfig(_Section):
    """The electrical feed; the board budget is derived so that
    (sum of board limits + host draw) / PSU efficiency <= the tightest of circuit and UPS.

    Circuit: breaker_a x volts x derating (NEC: continuous loads at 80 %).
    UPS: ups_w (its real watt rating, not VA) x (1 - ups_margin): a UPS trips on peaks
    within seconds, faster than a 1 s average shows (brief, "Protective devices").
    """

    breaker_a: float = Field(gt=0, le=400)
    volts: float = Field(gt=0, le=480)
    derating: float = Field(0.8, gt=0, le=1)
    ups_w: float | None = Field(None, gt=0, le=100_000)
    ups_margin: float = Field(0.2, ge=0, lt=1)
    psu_efficiency: float = Field(0.9, gt=0.5, le=1)
    host_w: float = Field(ge=0, le=100_000)  # CPU, RAM, drives, fans: measure it at the plug

    def circuit_w(self) -> float:
        return self.breaker_a * self.volts * self.derating

    def ups_limit_w(self) -> float | None:
        return None if self.ups_w is None else self.ups_w * (1 - self.ups_margin)

    def wall_limit_w(self) -> float:
        """The tightest plug-side limit (W)."""
        ups = self.ups_limit_w()
        return self.circuit_w() if ups is None else min(self.circuit_w(), ups)

    def board_budget_w(self) -> float:
        """Board watts the feed allows: wall limit x efficiency - host draw."""
        return self.wall_limit_w() * self.psu_efficiency - self.host_w


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
    min_step_w: float = Field(5.0, ge=0, le=100)
    settle_s: float = Field(1.0, ge=0.1, le=30)
    confirm_timeout_s: float = Field(3.0, ge=0.5, le=60)
    failsafe_hold_s: float = Field(30.0, ge=0, le=3600)
    boot_timeout_s: float = Field(30.0, ge=1, le=600)

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


class MetricsConfig(_Section):
    """The Prometheus endpoint, ``http://listen_address:port/metrics``.

    Loopback by default: the daemon runs as root, and its numbers are for this host's
    Prometheus (or a reverse proxy) unless the operator opens them up with
    ``listen_address = "0.0.0.0"`` (or the address of the scrape network). Port 19400:
    outside 9100-9999, which exporters have claimed, and clear of dcgm-exporter's 9400.
    """

    enabled: bool = True
    listen_address: IPvAnyAddress = Field(default="127.0.0.1", validate_default=True)  # type: ignore[assignment]
    port: int = Field(19400, ge=1, le=65535)


class Settings(BaseSettings):
    """The whole configuration. ``budget_w`` is the bank's board-power budget (W)."""

    model_config = SettingsConfigDict(env_prefix="POWERBUDGETD_", env_nested_delimiter="__", extra="forbid")

    budget_w: float | None = Field(None, gt=0, le=100_000)  # board watts; or derive it from [feed]
    feed: FeedConfig | None = None
    allow_monitor_only: bool = False  # without write permission: watch, do not enforce
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$")
    cards: dict[str, CardConfig] = Field(default_factory=dict)
    control: ControlConfig = Field(default_factory=ControlConfig)
    sim: SimConfig = Field(default_factory=SimConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @model_validator(mode="after")
    def _check(self) -> "Settings":
        Timings(**self.control.model_dump())  # cross-field rules live in Timings (ValueError)
        if self.budget_w is None and self.feed is None:
            raise ValueError("give budget_w (board watts) or a [feed] section to derive it from")
        if self.effective_budget_w() <= 0:
            raise ValueError(f"the feed leaves no board budget: {self.effective_budget_w():.0f} W")
        return self

    def effective_budget_w(self) -> float:
        """The board budget in force: the lower of ``budget_w`` and what ``[feed]`` allows."""
        candidates = [b for b in (self.budget_w, self.feed.board_budget_w() if self.feed else None) if b is not None]
        return min(candidates)

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
        return (env_settings, init_settings)

    def overrides(self) -> dict[str, CardOverride]:
        return {key: card.override() for key, card in self.cards.items()}


def load_config(path: str | Path) -> Settings:
    """Read and validate ``path``. Raises ConfigError naming the file, field and value."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file (see config/powerbudgetd.toml for an example)")
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(path, exc)) from None


def format_validation_error(path: Path, exc: ValidationError) -> str:
    lines = [f"{path}: invalid configuration"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        value = err.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {field}: {err['msg']}{shown}")
    return "\n".join(lines)
