"""Order the writes that move caps to their targets, so the budget holds at every step.

Pure. Every decrease comes first and is always allowed: it only lowers what may be in
force. A decrease frees nothing until it is confirmed by read-back (the controller then
lowers the card's bound), so an increase is planned only if it fits in the budget minus
the sum of *bounds*, the highest limits that may be in force now. Increases that do not
fit wait for a later tick.

A card takes one write at a time: while a write is unconfirmed, nothing more is sent to
it. Otherwise an enforced limit that has not moved yet could read equal to a newer,
lower target and "confirm" it while an older, higher write is still on its way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple


class Step(NamedTuple):
    """One card's position: its bound (highest limit that may be in force) and target, mW.
    A named tuple, not a frozen dataclass: one is built per card every tick, at a quarter
    of the cost."""

    uuid: str
    bound_mw: int
    target_mw: int
    requested_mw: int | None = None  # what the card asks for (read-back; in dry run, what we would have set)
    priority: int = 0
    busy: bool = False  # a write to this card is not confirmed yet: write nothing more
    force: bool = False  # write even at the requested limit (a new card: only our write ends it)


@dataclass(frozen=True)
class Write:
    """Set ``uuid``'s limit from ``from_mw`` (its bound) to ``to_mw``."""

    uuid: str
    from_mw: int
    to_mw: int

    @property
    def is_increase(self) -> bool:
        return self.to_mw > self.from_mw


def plan_writes(steps: Sequence[Step], budget_mw: int, allow_increases: bool = True) -> list[Write]:
    """Decreases (largest first), then the increases that fit, by priority then size.

    The sum of bounds plus every planned increase never exceeds ``budget_mw``; when the
    bounds already exceed it (at boot, or after a card reverted) no increase is planned;
    with ``allow_increases`` false (a limit is contested) none at all.

    A write below a card's bound but above its requested limit (or with the requested
    limit unknown: the card counted at its worst) lowers the bound yet may raise what is
    really in force: it is planned only while the bounds fit the budget, after the
    decreases. A new card's (``force``) is written at its requested limit meanwhile: only
    a confirmed write of ours ends its worst-case count, and with it the bounds may fit.
    """
    decreases: list[Write] = []
    uncertain: list[Write] = []
    within = budget_mw - sum(s.bound_mw for s in steps) >= 0
    for s in steps:
        # A write at the bound adds nothing counted: planned for a new card (``force``: only
        # it ends the card's worst-case count) and for a card whose bound still counts a
        # replaced request above what it asks for now (back to where it was).
        above = s.target_mw > s.bound_mw or (s.target_mw == s.bound_mw and not s.force and s.requested_mw is None)
        if above or s.busy or (s.requested_mw == s.target_mw and not s.force):
            continue
        lowers = s.requested_mw is not None and s.target_mw <= s.requested_mw
        if not lowers and not within and s.force and s.requested_mw is not None:
            # A new card over budget: written at what it asks for (a no-op on the card)
            # so that its worst-case count ends; raised later like any other.
            decreases.append(Write(s.uuid, s.bound_mw, s.requested_mw))
            continue
        (decreases if lowers else uncertain).append(Write(s.uuid, s.bound_mw, s.target_mw))
    decreases.sort(key=lambda w: w.to_mw - w.from_mw)
    headroom = budget_mw - sum(s.bound_mw for s in steps) if allow_increases else 0
    increases = uncertain if within else []
    rising = [s for s in steps if s.target_mw > s.bound_mw and not s.busy]  # sorted alone: few, most ticks
    for s in sorted(rising, key=lambda s: (-s.priority, s.target_mw - s.bound_mw)):
        delta = s.target_mw - s.bound_mw
        if delta <= headroom:
            increases.append(Write(s.uuid, s.bound_mw, s.target_mw))
            headroom -= delta
    return decreases + increases
