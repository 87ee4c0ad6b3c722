"""The bank's cards as NVML enumerates them: found at start, followed at runtime by UUID.

Each card is built with its constraints, its ``[cards]`` settings and a ledger that
counts it at its worst case (the largest limit read or stated, else the operator's
``max_w``). At runtime the device set is read again every ``enumerate_s``, at once when
the device count (read every tick, microseconds) changes, and after a lookup error: a
card that appears or comes back counts at its worst case until a write of ours is
confirmed on it; a card gone is reserved at its bound until it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

import structlog

from powerbudgetd.control.audit import CardAudit
from powerbudgetd.control.card import CardState
from powerbudgetd.control.cardlimits import card_limits, override_for
from powerbudgetd.control.ledger import CardLedger
from powerbudgetd.core.model import CardOverride, Role, Timings
from powerbudgetd.core.units import opt_mw, to_mw, to_w
from powerbudgetd.core.worstcase import limit_bound_mw
from powerbudgetd.errors import BudgetInfeasible, CardLimitUnknown, NvmlError, NvmlTimeout
from powerbudgetd.hw.calls import Call, InlineCalls
from powerbudgetd.hw.card import CardBackend, GpuInfo, PowerReading

log = structlog.get_logger("powerbudgetd")

START_TIMEOUT_S = 30.0  # enumeration at start (outside the loop) may be slow while a driver wakes
BANK_KEY = "bank"  # the calls key of NVML calls on no card (the device count, enumeration)


def _arrived(event: str, c: CardState) -> None:
    """Log a card that appeared or came back at what its ledger counts it at now."""
    if event == "card_appeared":
        log.warning(event, index=c.index, uuid=c.uuid, name=c.info.name, counted_w=to_w(c.bound_mw),
                    controllable=c.controllable, action="counted at its maximum and capped before anything else is raised")
    else:
        log.warning(event, index=c.index, uuid=c.uuid, counted_w=to_w(c.bound_mw))


class CardSet:
    """Every card of the bank, in NVML's order of first sight, keyed by UUID (limits mW)."""

    def __init__(self, nvml: CardBackend, timings: Timings, calls: InlineCalls,
                 overrides: Mapping[str, CardOverride]) -> None:
        self.nvml, self.timings, self.calls = nvml, timings, calls
        self.overrides = dict(overrides)
        self.cards: list[CardState] = []
        self._next_enumerate = float("-inf")
        self._count = -1  # NVML's device count at the last enumeration
        self._reads: Mapping[str, Call] | None = None  # see read_calls ...
        self._read_fns: tuple[object, object] = (None, None)  # ... and the calls it was built with
        self._by_uuid: Mapping[str, CardState] = MappingProxyType({})

    def start(self) -> list[str]:
        """Enumerate the cards; return the ``[cards]`` settings that do nothing (each
        logged as a warning). Raises BudgetInfeasible when there is no card, and
        CardLimitUnknown naming each card with no limit read or stated."""
        found = self.calls.call(BANK_KEY, self.nvml.devices, timeout_s=START_TIMEOUT_S)
        self.cards = [self.build(info) for info in found]
        self._joined()
        if not self.cards:
            raise BudgetInfeasible("no GPUs found: nothing to keep under a budget")
        warnings = self._override_warnings()
        unknown = [c for c in self.cards if c.ledger.worst_mw <= 0]
        if unknown:
            raise CardLimitUnknown("; ".join(
                f"GPU {c.index} ({c.uuid}, {c.info.name}): NVML gives none of its limit constraints, default, "
                f"requested or enforced limit, so it cannot be counted at its worst case. Set [cards.\"{c.uuid}\"] "
                "max_w to the highest limit it may have" for c in unknown))
        return warnings

    def _joined(self) -> None:
        """The set of cards changed (only ever by a card joining it): rebuild what is kept of it."""
        self._reads = None
        self._by_uuid = MappingProxyType({c.uuid: c for c in self.cards})

    @property
    def by_uuid(self) -> Mapping[str, CardState]:
        """Every card by UUID (read-only; kept as cards join)."""
        return self._by_uuid

    def read_calls(self) -> Mapping[str, Call]:
        """A tick's batch of NVML calls: the device count (under :data:`BANK_KEY`) and
        every card's read, by UUID. The same calls every tick, so built once (read-only)
        and again only when a card joins or the backend's calls are others: a tick at
        1024 cards otherwise made 3000 objects for it (a bound method and two tuples a card)."""
        fns = (self.nvml.device_count, self.nvml.read)
        if self._reads is None or fns != self._read_fns:
            self._read_fns = fns
            self._reads = MappingProxyType({BANK_KEY: (fns[0], ()), **{c.uuid: (fns[1], (c.uuid,)) for c in self.cards}})
        return self._reads

    def read(self, uuid: str) -> PowerReading | None:
        try:
            return self.calls.call(uuid, self.nvml.read, uuid)
        except NvmlError:
            return None

    def build(self, info: GpuInfo) -> CardState:
        """A card as first seen: constraints checked, counted at its worst case."""
        ov = override_for(self.overrides, info.uuid, info.index, info.bus_id)
        lim = card_limits(info, ov, self.read(info.uuid))
        if info.min_limit_w is not None and info.max_limit_w is not None and not lim.valid:
            log.error("invalid_constraints", index=info.index, uuid=info.uuid, min_w=info.min_limit_w,
                      max_w=info.max_limit_w, action="card left alone and counted at its enforced limit")
        return CardState(info, lim.controllable, lim.min_mw, lim.max_mw, CardLedger(self.timings, lim.worst_mw or 0,
                                                                                  separate_requested=info.caps.separate_requested),
                         CardAudit(self.timings), ov.priority, role=Role.FAIR if lim.controllable else Role.FIXED,
                         excluded=ov.exclude)

    def _override_warnings(self) -> list[str]:
        """``[cards]`` settings that do not do what they say: a key naming no card (a
        typo in a UUID, an index past the last card) and a ``max_w`` below the card's
        floor (the floor wins)."""
        keys = {c.uuid for c in self.cards} | {str(c.index) for c in self.cards} | {
            c.info.bus_id for c in self.cards if c.info.bus_id}
        out = [f"[cards.\"{k}\"] matches no card (UUIDs, PCI bus ids and indices here: "
               f"{', '.join(sorted(keys))}): its settings do nothing" for k in sorted(self.overrides) if k not in keys]
        for c in self.cards:
            ov = override_for(self.overrides, c.uuid, c.index, c.info.bus_id)
            if ov.max_w is not None and c.controllable and to_mw(ov.max_w) < c.min_mw:
                out.append(f"[cards] max_w {ov.max_w:g} W for GPU {c.index} is below its minimum limit "
                           f"{to_w(c.min_mw):g} W: the card is held at {to_w(c.min_mw):g} W at most")
        for text in out:
            log.warning("card_override_ignored", detail=text)
        return out

    def check_feasible(self, budget_mw: int, *, fresh: bool = True) -> None:
        """Raise BudgetInfeasible, with each card's floor against its share, when the
        minimum limits of the cards we control plus what the others hold exceed
        ``budget_mw``. The others are read afresh (:meth:`counted_mw`), or with
        ``fresh=False`` counted at their bound as the last tick left it: no NVML call,
        for a caller that must not wait on one (a budget change on the event loop)."""
        ctl = [c for c in self.cards if c.controllable]
        fixed_mw = sum(self.counted_mw(c) if fresh else c.bound_mw for c in self.cards if not c.controllable)
        floor_mw = sum(c.min_mw for c in ctl) + fixed_mw
        if floor_mw > budget_mw:
            share = to_w((budget_mw - fixed_mw) / max(len(ctl), 1))
            detail = "; ".join(f"GPU {c.index} ({c.info.name}) floor {to_w(c.min_mw):g} W vs share {round(share, 1):g} W"
                               for c in ctl)
            raise BudgetInfeasible(
                f"budget {round(to_w(budget_mw), 1):g} W is below what the cards can be held to: "
                f"minimum limits sum to {to_w(sum(c.min_mw for c in ctl)):g} W"
                + (f" plus {to_w(fixed_mw):g} W on cards we cannot control = {to_w(floor_mw):g} W" if fixed_mw else "")
                + f". {detail}"
            )

    def counted_mw(self, c: CardState) -> int:
        """What a card we do not control counts for now (mW), read afresh: its bound with
        nothing of ours in flight, the figure ``failsafe`` counts it at too."""
        r = self.read(c.uuid)
        if r is None:
            return c.ledger.bound_mw
        return limit_bound_mw(opt_mw(r.requested_limit_w), opt_mw(r.enforced_limit_w), c.ledger.worst_mw)

    def look_again(self, now: float) -> None:
        """A lookup failed: enumerate again at the next :meth:`follow`."""
        self._next_enumerate = min(self._next_enumerate, now)

    def _lookup(self, count: int) -> tuple[list[GpuInfo], set[str]]:
        """The cards at NVML indices ``0..count-1``, each looked up under its own key (the
        card last seen at that index, else one for the index), so a hung card holds up no
        other's lookup. Returns what answered, and the known cards whose lookup timed out
        (slow or hung: not gone)."""
        at = {c.info.index: c.uuid for c in self.cards if not c.gone}
        keys = {i: at.get(i, f"index {i}") for i in range(count)}
        answers = self.calls.many({keys[i]: (self.nvml.device, (i,)) for i in range(count)})
        found = [a for a in answers.values() if isinstance(a, GpuInfo)]
        unanswered = {k for k, a in answers.items() if isinstance(a, NvmlTimeout) and not k.startswith("index ")}
        return found, unanswered

    def follow(self, now: float, count: int | NvmlError) -> set[str]:
        """Follow NVML's device set: every ``enumerate_s``, after a lookup error, and at
        once when the device count changes. ``count``: ``nvmlDeviceGetCount`` as read with
        the tick's card reads (under :data:`BANK_KEY`), or the NvmlError it raised. A card
        whose lookup times out is kept (slow or hung, not gone); a device count that
        cannot be read is logged once. Returns the UUIDs of the cards that appeared,
        returned or went: what was read of them before is not theirs to keep."""
        if isinstance(count, NvmlError):
            count = -1
        if now < self._next_enumerate and count == self._count:
            return set()
        self._next_enumerate = now + self.timings.enumerate_s
        if count < 0:
            if self._count >= 0:
                log.warning("enumeration_failed", error="nvmlDeviceGetCount gave no answer",
                            retry_in_s=self.timings.enumerate_s)
            self._count = count
            return set()
        self._count = count
        changed: set[str] = set()
        found, unanswered = self._lookup(count)
        by_id = {c.uuid: c for c in self.cards}
        for info in found:
            c = by_id.get(info.uuid)
            event = None
            if c is None:
                c = self.build(info)
                self.cards.append(c)
                event = "card_appeared"
            elif c.gone:
                event = "card_returned"
            elif c.info.index != info.index:
                log.info("card_reindexed", uuid=info.uuid, old_index=c.info.index, new_index=info.index)
            if (c.gone or c.uuid not in by_id) and c.controllable:
                c.ledger.appeared(now)
            if not c.controllable and info.min_limit_w is None:  # keep constraints once read
                info = replace(info, min_limit_w=c.info.min_limit_w, max_limit_w=c.info.max_limit_w,
                               default_limit_w=c.info.default_limit_w)
            c.info, c.gone = info, False
            if event is not None:
                changed.add(c.uuid)
                _arrived(event, c)
        if len(by_id) != len(self.cards):
            self._joined()
        present = {i.uuid for i in found} | unanswered
        for c in self.cards:
            if c.uuid not in present and not c.gone:
                c.gone = True
                c.ledger.observe_unknown(now)  # off the bus: what it reads is unknown from now
                changed.add(c.uuid)
                log.error("card_gone", index=c.index, uuid=c.uuid, reserved_w=to_w(c.bound_mw),
                          action="reserved at its bound until it returns; the others keep lending")
        return changed
