"""The actuator: the only code that writes power limits.

It applies a plan in order. After the first failed write it applies no more increases
in that tick (a surprise means what we believe may be wrong), but it still applies the
remaining decreases, which are always safe. In dry-run mode it writes nothing.

It is also the invariant's last guard: it refuses any increase after which the sum of
bounds would exceed the budget. The plan never asks for one
(:func:`powerbudgetd.core.plan.plan_writes`), so a refusal is a bug, logged as one.

Every write goes through ``calls`` (:mod:`powerbudgetd.hw.calls`): in the daemon with a
deadline in a worker thread. A write that does not return in time is *overdue*: it may
land whenever the call returns, so the controller counts that card at its worst case.
Each write is stamped with the time it was sent (``clock``), which starts its
confirmation deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from powerbudgetd.core.plan import Write
from powerbudgetd.errors import NvmlError, NvmlTimeout
from powerbudgetd.hw.calls import InlineCalls
from powerbudgetd.core.units import to_w
from powerbudgetd.hw.card import CardBackend

log = structlog.get_logger("powerbudgetd")


@dataclass(frozen=True)
class Applied:
    """What became of one planned write: done, failed (``error``) or skipped.
    ``sent_at``: when it was sent (the caller's clock, s; None without a clock)."""

    write: Write
    error: NvmlError | None = None
    skipped: bool = False
    sent_at: float | None = None

    @property
    def done(self) -> bool:
        return self.error is None and not self.skipped

    @property
    def overdue(self) -> bool:
        """Sent, and not returned within its deadline: it may still land."""
        return isinstance(self.error, NvmlTimeout)


class Actuator:
    """Applies writes through the NVML layer; ``dry_run`` turns every write into a no-op."""

    def __init__(
        self,
        nvml: CardBackend,
        dry_run: bool = False,
        calls: InlineCalls | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.nvml = nvml
        self.dry_run = dry_run
        self.calls = calls or InlineCalls()
        self.clock = clock

    def _write(self, uuid: str, limit_w: float) -> None:
        self.calls.call(uuid, self.nvml.set_power_limit, uuid, limit_w)

    def probe(self, uuid: str, limit_w: float) -> None:
        """Write ``limit_w``, the card's current requested limit, back to it: a no-op
        that tells whether limits can be written at all. Raises NvmlNoPermission, NvmlError."""
        self._write(uuid, limit_w)

    def lower(self, writes: list[Write]) -> list[Applied]:
        """Send the decreases among ``writes`` in order (``failsafe``: it spends no
        budget); an increase is refused (skipped, logged ``increase_refused`` as a bug)."""
        out: list[Applied] = []
        for w in writes:
            if w.is_increase:
                log.error("increase_refused", uuid=w.uuid, from_w=to_w(w.from_mw), to_w=to_w(w.to_mw), bug=True,
                          action="only decreases are written here")
                out.append(Applied(w, skipped=True))
                continue
            out.append(self._send(w))
        return out

    def _send(self, w: Write) -> Applied:
        sent_at = self.clock() if self.clock else None
        try:
            self._write(w.uuid, to_w(w.to_mw))
        except NvmlError as exc:
            return Applied(w, error=exc, sent_at=sent_at)
        return Applied(w, sent_at=sent_at)

    def apply(self, writes: list[Write], *, sum_bound_mw: int, budget_mw: int) -> list[Applied]:
        """Send ``writes`` in order; returns what became of each. ``sum_bound_mw``: the
        sum over every card of the highest limit that may be in force (mW); an increase
        (``to_mw`` above ``from_mw``, the card's bound) that would take it past
        ``budget_mw`` is refused (skipped, logged ``plan_breaks_budget``). A decrease
        frees nothing until it is read back, so it leaves the sum as it is."""
        out: list[Applied] = []
        failed = False
        for w in writes:
            after_mw = sum_bound_mw + max(0, w.to_mw - w.from_mw)
            if w.is_increase and after_mw > budget_mw:
                log.error("plan_breaks_budget", uuid=w.uuid, from_w=to_w(w.from_mw), to_w=to_w(w.to_mw),
                          sum_after_w=to_w(after_mw), budget_w=to_w(budget_mw), bug=True,
                          action="increase refused: the sum of what may be in force would pass the budget")
                out.append(Applied(w, skipped=True))
                continue
            sum_bound_mw = after_mw
            if self.dry_run or (failed and w.is_increase):
                out.append(Applied(w, skipped=True))
                continue
            applied = self._send(w)
            failed = failed or applied.error is not None
            out.append(applied)
        return out
