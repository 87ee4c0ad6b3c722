"""Work model: the useful throughput a card delivers at the power its cap lets it draw.

Source of the curves: fraction of uncapped throughput against power limit / TGP from
one public sweep, llama.cpp on an RTX 3090 (the brief, "Throughput under a cap") — a
single benchmark: the shape, not the truth. Prefill is compute-bound, decode
memory-bound; training-like sustained work is taken as prefill-shaped.

    power / TGP     0.29  0.43  0.57  0.71  0.86  1.00
    compute         0.14  0.26  0.60  0.85  0.94  1.00
    memory          0.17  0.86  0.94  0.97  0.99  1.00

Between points the curves are interpolated linearly; below 0.29 they fall linearly to
0 at 0; above 1.00 they stay at 1.00.

How a card's work rate follows (units: *TGP-seconds*, one second of a card's whole
uncapped throughput; per second of time, a rate in [0, 1]):

- the workload would draw ``demand`` W if nothing capped it; the cap lets it draw
  ``allowed = min(demand, enforced limit)`` (the firmware holds the draw at the limit);
  demand above TGP (a recorded transient) counts as TGP: a spike is not throughput;
- uncapped, the work rate is shaped by demand / TGP: ``(demand - idle) / (TGP - idle)``
  — a card at full TGP does 1, an idle card 0 (idle draw buys no work);
- capped, that rate is scaled by ``curve(allowed / demand)``: the table's shape applied
  to the workload's own uncapped draw. A compute card at TGP capped to 71 % keeps 0.85
  of its throughput; a decode card drawing 40 % of TGP loses almost nothing when capped
  a little below that draw, as the brief says ("a decode-bound neighbour lends watts
  almost for free").
"""

from __future__ import annotations

import bisect

POWER_FRACTIONS = (0.29, 0.43, 0.57, 0.71, 0.86, 1.00)
CURVES: dict[str, tuple[float, ...]] = {
    "compute": (0.14, 0.26, 0.60, 0.85, 0.94, 1.00),
    "memory": (0.17, 0.86, 0.94, 0.97, 0.99, 1.00),
}
_XS = (0.0, *POWER_FRACTIONS)


def throughput_fraction(workload: str, power_fraction: float) -> float:
    """Fraction of uncapped throughput (0-1) at ``power_fraction`` of the uncapped draw.

    ``workload`` is ``compute`` or ``memory``; raises KeyError for anything else.
    """
    ys = (0.0, *CURVES[workload])
    if power_fraction >= 1.0:
        return 1.0
    if power_fraction <= 0.0:
        return 0.0
    i = bisect.bisect_right(_XS, power_fraction) - 1
    x0, x1, y0, y1 = _XS[i], _XS[i + 1], ys[i], ys[i + 1]
    return y0 + (y1 - y0) * (power_fraction - x0) / (x1 - x0)


def demand_weight(demand_w: float, idle_w: float, tgp_w: float) -> float:
    """Uncapped work rate of a card whose workload would draw ``demand_w`` (0-1)."""
    if tgp_w <= idle_w:
        return 0.0
    return min(max((demand_w - idle_w) / (tgp_w - idle_w), 0.0), 1.0)


def work_rate(workload: str, demand_w: float, limit_w: float, idle_w: float, tgp_w: float) -> float:
    """Work per second (TGP-seconds per s) of a card under an enforced ``limit_w`` (W)."""
    weight = demand_weight(demand_w, idle_w, tgp_w)
    if weight == 0.0:
        return 0.0
    # Demand above TGP is a transient (a recorded spike), not throughput a cap withholds.
    wanted = min(demand_w, tgp_w)
    allowed = min(wanted, limit_w)
    return weight * throughput_fraction(workload, allowed / wanted)
