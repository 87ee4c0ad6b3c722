"""One card as the controller sees it: identity, constraints, its ledger and audit."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import structlog

from powerbudgetd.control.audit import CardAudit
from powerbudgetd.control.ledger import CardLedger
from powerbudgetd.core.model import Role
from powerbudgetd.hw.nvml import GpuInfo, PowerReading

log = structlog.get_logger("powerbudgetd")

def _via(part: str, name: str) -> Any:
    """A property reading and writing ``self.<part>.<name>`` (read many times a tick)."""
    return property(
        attrgetter(f"{part}.{name}"),
        lambda self, v: setattr(getattr(self, part), name, v),
    )


@dataclass
class CardState:
    """Everything the controller knows about one card. Limits in integer mW, times in s.

    ``ledger`` keeps the bound (what may be in force) and the writes; ``audit`` drift,
    contest, excursions and reading checks. ``info.index`` follows NVML's current
    enumeration; the card is keyed by ``uuid``.
    """

    info: GpuInfo
    controllable: bool  # by configuration and hardware; see Controller._active for right now
    min_mw: int
    max_mw: int  # config may lower it below the hardware max
    ledger: CardLedger
    audit: CardAudit
    priority: int = 0
    reading: PowerReading | None = None
    target_mw: int | None = None
    share_mw: int | None = None
    role: Role = Role.FAIR
    error: str | None = None  # why the card cannot be read now (None: readable)
    slow_since: float | None = None  # its reads have timed out since (s); None: answered
    # An outside limiter (a BMC, a node-level cap) holds enforced below what we request:
    # the cap planned around (None: none known, or offered its share again to see whether
    # it lifted), the cap of the episode (None: no episode), and when it was last seen.
    outside_cap_mw: int | None = None
    outside_cap_seen_mw: int | None = None
    outside_cap_at: float = float("-inf")
    gone: bool = False  # missing from NVML's enumeration
    excluded: bool = False  # left alone by the operator ([cards] exclude): counted, never a fault
    read_errors: dict[str, int] = field(default_factory=dict)  # failed reads by NvmlError.kind (metrics)
    would_be_mw: int | None = None  # dry run: the limit we would have set (kept out of the ledger)
    uuid: str = field(init=False)  # the key: info.uuid, which never changes for a card

    def __post_init__(self) -> None:
        self.uuid = self.info.uuid

    requested_mw = _via("ledger", "requested_mw")
    enforced_mw = _via("ledger", "enforced_mw")
    inflight = _via("ledger", "inflight")
    hold_until = _via("ledger", "hold_until")
    backoff_s = _via("ledger", "backoff_s")
    refused = _via("ledger", "refused")
    foreign_mw = _via("ledger", "foreign_mw")
    expected_mw = _via("audit", "expected_mw")
    drift_times = _via("audit", "drift_times")
    contested_until = _via("audit", "contested_until")
    contested_w = _via("audit", "contested_w")
    excursions = _via("audit", "excursions")
    peak_excursion_w = _via("audit", "peak_excursion_w")
    power_unknown = _via("audit", "power_unknown")

    @property
    def bound_mw(self) -> int:
        """What the card is counted at (mW): its ledger's bound; in dry run, once a write
        would have been sent, the limit it would have set (decided on as if in force)."""
        return self.ledger.bound_mw if self.would_be_mw is None else self.would_be_mw

    @property
    def asked_mw(self) -> int | None:
        """What the card is taken to ask for (mW): its requested limit read; in dry run,
        once a write would have been sent, the limit it would have set."""
        return self.ledger.requested_mw if self.would_be_mw is None else self.would_be_mw

    @property
    def usable_max_mw(self) -> int:
        """The most it can use: its max, or an outside cap below it (never under its min)."""
        cap = self.outside_cap_mw
        return self.max_mw if cap is None else max(self.min_mw, min(self.max_mw, cap))

    @property
    def readable(self) -> bool:
        return self.error is None

    @property
    def index(self) -> int:
        return self.info.index


    def contested(self, now: float) -> bool:
        return self.audit.contested(now)

    def last_written(self) -> tuple[int, float] | None:
        return self.ledger.inflight[-1] if self.ledger.inflight else None

    def hold(self, now: float, event: str, **fields: object) -> None:
        """Leave the card alone for a doubling backoff after a write that did not take; it
        counts at its bound. Logged as ``event`` when it stops being controllable only."""
        if self.ledger.hold(now):
            log.error(event, index=self.index, uuid=self.uuid, **fields,
                      action="card counted at its read-back limit and retried with backoff")
        self.role = Role.FIXED
