"""The bank's sections: per-card overrides ([cards]), the electrical feed ([feed]), the
control loop ([control]), the simulated bank ([sim])."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import (
    Field,
    model_validator,
)

from powerbudgetd.core.feed import DEFAULT_DERATING, DEFAULT_PSU_EFFICIENCY, DEFAULT_UPS_MARGIN, Feed
from powerbudgetd.core.model import CardOverride
from powerbudgetd.core.peaks import MEASURED_TRANSIENT_FACTOR, FeedLine, binding_line, transient_factor
from powerbudgetd.errors import ConfigError
from powerbudgetd.core.model import Timings
from powerbudgetd.config.base import _Section

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
