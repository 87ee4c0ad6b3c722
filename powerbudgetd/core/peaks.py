"""Peak-aware budget arithmetic: which protective device trips on the average, which on the peak.

A power limit caps a card's 1 s *average* board power; its instant draw reaches past it
on every load step (measured on an H200 at its 700 W limit: 873-948 W, up to 1.35x,
for 100-200 ms; from idle and from a card already at its cap alike). So:

- a **breaker** is thermal (UL 489: 135 % for up to an hour, 200 % for up to 2 min):
  sub-second spikes do not move it. The circuit is sized on averages:
  ``(sum of limits + host) / PSU efficiency <= breaker x volts x derating``;
- a **UPS** at its inverter limit trips in seconds (130-150 %: 3-10 s; over 150 %:
  under 0.5 s; some cut at once above 120 %), and a PSU's over-current protection acts
  within a cycle: both are sized on peaks, the GPU board sum times a *transient factor*:
  ``(sum of limits x transient factor + host) / PSU efficiency <= UPS x (1 - margin)``
  and ``sum of limits x transient factor + host <= PSU rated output``.

Pure arithmetic (W, fractions), no I/O: the config and check-config call it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MEASURED_TRANSIENT_FACTOR = 1.35  # H200 at 700 W: instant peaks 948 W = 1.35x (sim/traces/)


def transient_factor(card_names: Sequence[str] | None, overall: float, per_model: Mapping[str, float]) -> float:
    """The factor that bounds the bank's instant peak over its sum of limits.

    ``per_model`` maps a card model name as NVML reports it (``nvmlDeviceGetName``,
    matched case-insensitively) to its factor; other cards take ``overall``. The bank's
    factor is the highest of its cards' (cards can peak in phase). With the cards not
    known (``card_names`` None) every configured factor may apply: the highest of all.
    """
    models = {k.casefold(): v for k, v in per_model.items()}
    if card_names is None:
        return max([overall, *models.values()])
    if not card_names:
        return overall
    return max(models.get(name.casefold(), overall) for name in card_names)


@dataclass(frozen=True)
class FeedLine:
    """One path from a protective device to the board budget it allows.

    ``device``: ``circuit``, ``UPS`` or ``PSU``; ``basis``: ``average`` or ``peak``;
    ``limit_w``: the device's usable rating (at the plug for circuit and UPS, the PSU's
    output for the PSU); ``board_budget_w``: the sum of board limits it allows;
    ``arithmetic``: the sum written out.
    """

    device: str
    basis: str
    limit_w: float
    board_budget_w: float
    arithmetic: str


def _n(x: float) -> str:
    return f"{round(x, 3):g}"


def feed_lines(
    *,
    host_w: float,
    psu_efficiency: float,
    circuit_w: float | None,
    ups_limit_w: float | None,
    psu_output_w: float | None,
    factor: float,
) -> list[FeedLine]:
    """The board budget each stated device allows: the circuit on averages, the UPS and
    the PSU on peaks (board sum x ``factor``). Devices given as None are left out."""
    lines = []
    if circuit_w is not None:
        lines.append(FeedLine(
            "circuit", "average", circuit_w, circuit_w * psu_efficiency - host_w,
            f"{_n(circuit_w)} W x {_n(psu_efficiency)} efficiency - {_n(host_w)} W host",
        ))
    if ups_limit_w is not None:
        lines.append(FeedLine(
            "UPS", "peak", ups_limit_w, (ups_limit_w * psu_efficiency - host_w) / factor,
            f"({_n(ups_limit_w)} W x {_n(psu_efficiency)} efficiency - {_n(host_w)} W host) / {_n(factor)} transient",
        ))
    if psu_output_w is not None:
        lines.append(FeedLine(
            "PSU", "peak", psu_output_w, (psu_output_w - host_w) / factor,
            f"({_n(psu_output_w)} W output - {_n(host_w)} W host) / {_n(factor)} transient",
        ))
    return lines


def binding_line(lines: Sequence[FeedLine]) -> FeedLine | None:
    """The line that allows the least board power (None without any)."""
    return min(lines, key=lambda line: line.board_budget_w, default=None)


def peak_wall_w(board_w: float, host_w: float, psu_efficiency: float, factor: float) -> float:
    """Plug-side peak (W) when the cards sit at ``board_w`` of limits and spike in phase."""
    return (board_w * factor + host_w) / psu_efficiency
