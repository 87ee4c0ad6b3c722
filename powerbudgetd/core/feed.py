"""The electrical feed of one box, and the arithmetic between board power and the plug.

One model for every user: the config's ``[feed]`` (the budget it derives), the wall
meter (what the rest of the host draws, and what that leaves for the GPUs), the flight
recorder and its report (estimated wall power, sizing), and the simulator's scenarios
(breaker and UPS trip models). Powers in W, currents in A, fractions in (0, 1].

    wall power        = (board power + host draw) / PSU efficiency
    non-GPU wall draw = wall power - board power / PSU efficiency
    circuit limit     = breaker_a x volts x derating   (NEC: continuous loads at 80 %)
    UPS limit         = ups_w x (1 - ups_margin)        (a UPS trips on peaks, in seconds)
    plug-side limit   = the tighter of circuit and UPS  (on averages: what a meter checks)
    board budget      = the least of (``powerbudgetd.core.peaks``):
                        circuit x PSU efficiency - host draw                  (averages)
                        (UPS limit x PSU efficiency - host draw) / transient  (peaks)
                        (psu_w - host draw) / transient                       (peaks)

A limit caps a card's 1 s average; its instant draw reaches ``transient_factor`` times
it (1.35 measured on an H200). A breaker trips on the average, a UPS and a PSU on peaks.

Pure: no I/O, no clock. Figures from the brief ("Protective devices").
"""

from __future__ import annotations

from dataclasses import dataclass

from powerbudgetd.core.peaks import MEASURED_TRANSIENT_FACTOR, FeedLine, binding_line, feed_lines

DEFAULT_DERATING = 0.8  # NEC: a continuous load (3 h or more) at 80 % of the breaker
# Kept spare under the UPS rating at the peak for what the arithmetic cannot know (a VA
# rating's real watts, an aging battery): the transients are in the transient factor.
DEFAULT_UPS_MARGIN = 0.1
DEFAULT_PSU_EFFICIENCY = 0.9  # 80 PLUS Gold at 115 V, ~50 % load


@dataclass(frozen=True)
class Feed:
    """What a box hangs off: breaker (A) at ``volts``, an optional UPS (real W, not VA),
    the PSU's efficiency and the host's own draw at the PSU output (W; None: unknown,
    counted as 0 W where a figure is still wanted).

    Raises ValueError naming the field when a value is out of range.
    """

    breaker_a: float | None = None
    volts: float = 120.0
    derating: float = DEFAULT_DERATING
    ups_w: float | None = None
    ups_margin: float = DEFAULT_UPS_MARGIN
    psu_efficiency: float = DEFAULT_PSU_EFFICIENCY
    host_w: float | None = None
    psu_w: float | None = None  # the PSU's rated DC output (W): sized on peaks
    transient_factor: float = MEASURED_TRANSIENT_FACTOR  # instant peak over the sum of limits

    def __post_init__(self) -> None:
        checks = [
            ("breaker_a", self.breaker_a, self.breaker_a is None or 0 < self.breaker_a <= 400, "a rating in A, in (0, 400]"),
            ("volts", self.volts, 0 < self.volts <= 480, "a voltage in V, in (0, 480]"),
            ("derating", self.derating, 0 < self.derating <= 1, "a fraction in (0, 1]"),
            ("ups_w", self.ups_w, self.ups_w is None or 0 < self.ups_w <= 100_000, "a rating in W, in (0, 100000]"),
            ("ups_margin", self.ups_margin, 0 <= self.ups_margin < 1, "a fraction in [0, 1)"),
            ("psu_efficiency", self.psu_efficiency, 0.5 < self.psu_efficiency <= 1, "a fraction in (0.5, 1]"),
            ("host_w", self.host_w, self.host_w is None or 0 <= self.host_w <= 100_000, "a draw in W, in [0, 100000]"),
            ("psu_w", self.psu_w, self.psu_w is None or 0 < self.psu_w <= 100_000, "a rating in W, in (0, 100000]"),
            ("transient_factor", self.transient_factor, 1 <= self.transient_factor <= 3, "a factor in [1, 3]"),
        ]
        for key, value, ok, what in checks:
            if isinstance(value, bool) or not ok:
                raise ValueError(f"feed.{key} must be {what}, got {value!r}")

    # -- limits at the plug (W) -------------------------------------------------------
    @property
    def breaker_w(self) -> float | None:
        """The breaker's rating at the plug, W (no derating): what its trip model loads."""
        return None if self.breaker_a is None else self.breaker_a * self.volts

    def circuit_w(self) -> float | None:
        """The circuit's continuous limit at the plug: breaker_a x volts x derating (W)."""
        return None if self.breaker_a is None else self.breaker_a * self.volts * self.derating

    def ups_limit_w(self) -> float | None:
        """The UPS's usable real power: ups_w x (1 - ups_margin) (W); None without a UPS."""
        return None if self.ups_w is None else self.ups_w * (1 - self.ups_margin)

    def wall_limit_w(self) -> float | None:
        """The tightest plug-side limit (W): circuit or UPS; None when neither is known."""
        known = [w for w in (self.circuit_w(), self.ups_limit_w()) if w is not None]
        return min(known) if known else None

    def lines(self, factor: float | None = None) -> list[FeedLine]:
        """The board budget each stated device allows: the circuit on averages, the UPS
        and the PSU on peaks at ``factor`` (default: ``transient_factor``). Empty when
        the host draw is unknown."""
        if self.host_w is None:
            return []
        return feed_lines(
            host_w=self.host_w, psu_efficiency=self.psu_efficiency, circuit_w=self.circuit_w(),
            ups_limit_w=self.ups_limit_w(), psu_output_w=self.psu_w,
            factor=self.transient_factor if factor is None else factor,
        )

    def board_budget_w(self, factor: float | None = None) -> float | None:
        """Board watts the feed allows: the least of :meth:`lines` (W). None when the
        host draw is unknown or no device is stated."""
        line = binding_line(self.lines(factor))
        return None if line is None else line.board_budget_w

    # -- board power <-> wall power ---------------------------------------------------
    def wall_w(self, board_w: float) -> float:
        """Power at the plug for ``board_w`` of summed board power (W): (board + host)
        / efficiency, an unknown host draw counted as 0 W."""
        return (board_w + (self.host_w or 0.0)) / self.psu_efficiency

    def non_gpu_wall_w(self, wall_w: float, board_w: float) -> float:
        """What a wall reading leaves for the rest of the host (W): wall - board / efficiency."""
        return wall_w - board_w / self.psu_efficiency

    def board_budget_from_wall_w(self, wall_w: float, board_w: float) -> tuple[float, float]:
        """From a wall reading and the board power paired with it: (non-GPU wall draw,
        board budget the plug-side limit allows), both W. The board budget is what is
        left of the plug-side limit, back in board watts: (limit - non-GPU) x efficiency.

        Raises ValueError when the feed has no plug-side limit.
        """
        limit = self.wall_limit_w()
        if limit is None:
            raise ValueError("the feed has neither a breaker nor a UPS: no plug-side limit")
        non_gpu_w = self.non_gpu_wall_w(wall_w, board_w)
        return non_gpu_w, (limit - non_gpu_w) * self.psu_efficiency


def next_wall_budget_w(current_w: float | None, allowed_w: float, configured_w: float, hysteresis_w: float) -> float | None:
    """The budget a wall-power reading allows, after one reading (board W); None when it
    does not limit. One rule for every plug-side truth: a wall meter, a UPS's measured load.

    Below what is in force: drop to ``allowed - hysteresis`` at once (protection
    first, and one dead band of margin so noise does not trigger the next drop). Rise
    only once the meter allows a full band more; give up limiting once it allows the
    configured budget plus a band. Never above ``configured_w``.
    """
    in_force = configured_w if current_w is None else min(current_w, configured_w)
    if allowed_w < in_force:
        return max(0.0, allowed_w - hysteresis_w)
    if current_w is None or allowed_w >= configured_w + hysteresis_w:
        return None
    if allowed_w >= current_w + 2 * hysteresis_w:
        return allowed_w - hysteresis_w
    return current_w
