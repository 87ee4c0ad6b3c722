"""The configuration: one TOML file plus ``POWERBUDGETD_`` environment overrides.

Sources, first wins: environment (``POWERBUDGETD_BUDGET_W``, nested with ``__`` such as
``POWERBUDGETD_CONTROL__TICK_S``), then the file. A missing file is an error, never
silent defaults. Every error names the field, the file and the value.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
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


class Settings(BaseSettings):
    """The whole configuration. ``budget_w`` is the bank's board-power budget (W)."""

    model_config = SettingsConfigDict(env_prefix="POWERBUDGETD_", env_nested_delimiter="__", extra="forbid")

    budget_w: float = Field(gt=0, le=100_000)
    allow_monitor_only: bool = False  # without write permission: watch, do not enforce
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$")
    cards: dict[str, CardConfig] = Field(default_factory=dict)
    control: ControlConfig = Field(default_factory=ControlConfig)
    sim: SimConfig = Field(default_factory=SimConfig)

    @model_validator(mode="after")
    def _check(self) -> "Settings":
        Timings(**self.control.model_dump())  # cross-field rules live in Timings (ValueError)
        return self

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
