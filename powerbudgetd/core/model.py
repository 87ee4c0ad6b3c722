"""Shared vocabulary of the control core: roles, modes, timings. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class CardOverride:
    """Per-card settings from the config: leave it alone, a lower max (W), lending priority."""

    exclude: bool = False
    max_w: float | None = None
    priority: int = 0


class Role(StrEnum):
    """What the controller does with a card right now."""

    FAIR = "fair_share"  # at budget / N (clamped to its constraints)
    DONOR = "donor"  # lends: idle, lowered to its floor; or busy below its share, to its draw plus a margin
    RECIPIENT = "recipient"  # pinned at its cap; raised with donors' watts
    FIXED = "fixed"  # not controllable (excluded, or limit control unsupported)
    LOST = "lost"  # cannot be read; reserved at the highest limit it may come back with


class Mode(StrEnum):
    """The bank's operating mode."""

    BOOTING = "booting"  # moving every card to fair share, decreases first
    DYNAMIC = "dynamic"  # lending from idle cards to pinned ones
    FAILSAFE = "failsafe"  # after an error: every card at fair share, no lending
    STOPPING = "stopping"  # returning to fair share before exit
    DRY_RUN = "dry-run"  # reads and decides, writes nothing
    MONITOR = "monitor-only"  # no permission to write, and the config allows watching only


@dataclass(frozen=True)
class Timings:
    """Control timings and thresholds (s, and fractions of a limit).

    Defaults are chosen against the H200 measurements in the brief: readings refresh
    every 100 ms and the average needs ~1 s to follow a load step.
    """

    tick_s: float = 0.1
    donor_hold_s: float = 5.0  # quiet this long before a card lends
    recipient_hold_s: float = 2.0  # pinned this long before a card borrows
    # A recipient below release_fraction this long returns. 10 s, as the daemon's
    # [control] default: over the scoreboard suite it keeps bursty recipients raised
    # through their gaps (more work on 6 of 11 scenarios, reclaim p99 still <= 0.4 s).
    release_hold_s: float = 10.0
    donor_enter_fraction: float = 0.7  # quiet: draw <= this x the card's floor
    wake_fraction: float = 0.85  # a donor wakes at draw >= this x its floor
    pinned_fraction: float = 0.9  # pinned: 1 s average >= this x the cap
    release_fraction: float = 0.6  # busy: 1 s average >= this x fair share
    burst_window_s: float = 2.0  # a bursty card's time at its cap is averaged over this ...
    burst_pinned_share: float = 0.3  # ... pinned at this share of it or more ...
    burst_release_share: float = 0.1  # ... and no longer busy under this share
    min_step_w: float = 5.0  # smaller raises are not worth a write
    settle_s: float = 1.0  # a write not visible in read-back after this never happened
    confirm_timeout_s: float = 3.0  # an unconfirmed write after this is a fault
    failsafe_hold_s: float = 30.0  # lending resumes this long after the last fault
    boot_timeout_s: float = 30.0  # READY must come within this
    retry_backoff_s: float = 5.0  # a card whose write did not take is retried after this ...
    retry_backoff_max_s: float = 300.0  # ... doubling up to this
    contest_reverts: int = 3  # this many outside changes of a limit ...
    contest_window_s: float = 300.0  # ... within this window mark the card contested ...
    contest_hold_s: float = 300.0  # ... until this long passes without another
    enumerate_s: float = 5.0  # the device set is read again this often (and after a lookup error)
    # An NVML call (one card's read, or one write) not returned after this is abandoned
    # and the card counted at its worst case; well under tick_s, so the loop keeps its
    # period (H200: the slowest read call is 16 ms at p99).
    call_timeout_s: float = 0.05

    def __post_init__(self) -> None:
        if not self.tick_s > 0:
            raise ValueError("tick_s must be > 0")
        if not 0 < self.donor_enter_fraction < self.wake_fraction <= 1:
            raise ValueError("need 0 < donor_enter_fraction < wake_fraction <= 1")
        if not 0 < self.release_fraction < self.pinned_fraction <= 1:
            raise ValueError("need 0 < release_fraction < pinned_fraction <= 1")
        if not 0 <= self.burst_release_share < self.burst_pinned_share <= 1:
            raise ValueError("need 0 <= burst_release_share < burst_pinned_share <= 1")
        if not 0 < self.call_timeout_s <= self.tick_s:
            raise ValueError("need 0 < call_timeout_s <= tick_s")
        if self.enumerate_s <= 0:
            raise ValueError("enumerate_s must be > 0")
        if self.confirm_timeout_s < self.settle_s:
            raise ValueError("confirm_timeout_s must be >= settle_s")
