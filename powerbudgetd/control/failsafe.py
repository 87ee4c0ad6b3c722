"""``powerbudgetd failsafe``: every card down to its share of the reserve budget, decreases only.

Run by systemd as ``ExecStopPost=`` after any exit of the daemon (stop, crash, kill by
the watchdog, restart limit reached): the cards are left at a share the circuit already
counts (the host's reserve), or at the fair share of the configured budget on a host
without a circuit. A card already at or below its share is not touched: the command
only lowers. Each write goes through the actuator and is confirmed by read-back.

Shares: the budget less what cards that cannot be controlled may have (their highest
known limit), split by :func:`powerbudgetd.core.fairshare.fair_shares` within each
card's constraints; when the minimums do not fit, every card goes to its minimum (the
lowest the bank can be held to).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from powerbudgetd.control.actuator import Actuator
from powerbudgetd.core.fairshare import fair_shares
from powerbudgetd.core.model import CardOverride
from powerbudgetd.core.plan import Write
from powerbudgetd.errors import NvmlError
from powerbudgetd.hw.nvml import Nvml, to_mw


@dataclass(frozen=True)
class Lowered:
    """One card: its limit before (W, the higher of requested and enforced), its share
    (W), and whether a decrease was written and read back in force."""

    index: int
    uuid: str
    before_w: float | None
    share_w: float
    written: bool
    confirmed: bool
    error: str | None = None


def failsafe(
    nvml: Nvml,
    budget_w: float,
    overrides: Mapping[str, CardOverride] | None = None,
    *,
    confirm_timeout_s: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Lowered]:
    """Lower every controllable card above its share of ``budget_w`` (W) to it; NVML is
    initialised by the caller. Returns one :class:`Lowered` per card. Never raises for
    a card: its error is in the result."""
    overrides = overrides or {}
    cards = nvml.devices()
    ctl, fixed_mw = [], 0
    for info in cards:
        ov = overrides.get(info.uuid) or overrides.get(str(info.index)) or CardOverride()
        lo, hi = info.min_limit_w, info.max_limit_w
        if ov.exclude or lo is None or hi is None or not 0 < lo <= hi:
            fixed_mw += to_mw(_highest(nvml, info.uuid) or max(v or 0.0 for v in (hi, info.default_limit_w)))
            continue
        max_w = hi if ov.max_w is None else max(lo, min(hi, ov.max_w))
        ctl.append((info, to_mw(lo), to_mw(max_w)))
    lows, highs = [lo for _, lo, _ in ctl], [hi for _, _, hi in ctl]
    shares = fair_shares(int(budget_w * 1000) - fixed_mw, lows, highs) or lows
    actuator = Actuator(nvml)
    out: list[Lowered] = []
    pending: list[tuple[int, int]] = []  # (position in out, share mW)
    for (info, _, _), share_mw in zip(ctl, shares):
        before = _highest(nvml, info.uuid)
        if before is not None and to_mw(before) <= share_mw:
            out.append(Lowered(info.index, info.uuid, before, share_mw / 1000, False, True))
            continue
        from_mw = to_mw(before) if before is not None else to_mw(info.max_limit_w or 0.0)
        applied = actuator.apply([Write(info.uuid, from_mw, share_mw)])[0]
        error = None if applied.error is None else str(applied.error)
        out.append(Lowered(info.index, info.uuid, before, share_mw / 1000, applied.done, False, error))
        if applied.done:
            pending.append((len(out) - 1, share_mw))
    deadline = clock() + confirm_timeout_s
    while pending:
        still = []
        for pos, share_mw in pending:
            highest = _highest(nvml, out[pos].uuid)
            if highest is not None and to_mw(highest) <= share_mw:
                out[pos] = Lowered(**{**out[pos].__dict__, "confirmed": True})
            else:
                still.append((pos, share_mw))
        pending = still
        if pending and clock() >= deadline:
            break
        if pending:
            sleep(0.05)
    return out


def _highest(nvml: Nvml, uuid: str) -> float | None:
    """The higher of the requested and enforced limits (W), None when unreadable."""
    try:
        r = nvml.read(uuid)
    except NvmlError:
        return None
    known = [v for v in (r.requested_limit_w, r.enforced_limit_w) if v is not None]
    return max(known) if known else None
