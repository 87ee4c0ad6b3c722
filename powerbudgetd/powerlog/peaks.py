"""Every peak, whatever the tick: each card's instant draw sampled at NVML's refresh rate.

NVML refreshes its power readings every 100 ms (measured on an H200); a UPS trips on
what happens inside one of those refreshes. The control loop reads the instant field
once a tick, so at ``tick_s = 1`` it sees one refresh in ten and misses most
single-refresh spikes. :class:`PeakSampler` reads field 186 of every card on its own
thread every ``refresh_s`` and keeps, per card and for the bank, the highest reading
since the recorder last took them.

Off the control path: the thread never touches the controller or the event loop, and
the recorder takes the peaks with one short lock. ``GetFieldValues`` costs ~3 ms
(16 ms p99) per card on real hardware (the brief); that time is spent on this thread.
A card without the instant field has no peak (None: unknown), never its average.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from powerbudgetd.errors import NvmlError

log = structlog.get_logger("powerbudgetd")

REFRESH_S = 0.1  # NVML's power readings refresh every 100 ms (the brief)


class InstantReader(Protocol):
    """What the sampler reads through: the NVML layer (``powerbudgetd.hw.nvml.Nvml``)."""

    def power_instant_w(self, uuid: str) -> float | None: ...


@dataclass
class SamplerStats:
    """Passes over the bank, failed reads, and what a pass costs (s, this thread's CPU)."""

    passes: int = 0
    read_errors: int = 0
    late_passes: int = 0  # a pass that started more than a refresh late
    pass_cpu_s: list[float] = field(default_factory=list)  # the last passes' CPU time, for benchmarks


@dataclass(frozen=True)
class Peaks:
    """Highest readings since the last take: per card UUID (None: no instant field, or
    not read), and the highest summed instant of one pass (None if any card was unknown)."""

    card_w: dict[str, float | None]
    bank_w: float | None


class PeakSampler:
    """Reads every card's instant power each ``refresh_s`` on a thread of its own.

    ``set_cards`` names the cards (the controller's, once it has started); ``take``
    returns the peaks since the previous take and starts a new window. Thread-safe.
    """

    def __init__(self, nvml: InstantReader, *, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic, keep_costs: int = 0) -> None:
        self.nvml = nvml
        self.refresh_s = refresh_s
        self.clock = clock
        self.stats = SamplerStats()
        self._keep_costs = keep_costs
        self._lock = threading.Lock()
        self._uuids: tuple[str, ...] = ()
        self._card_peak: dict[str, float | None] = {}
        self._bank_peak: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()

    def set_cards(self, uuids: Sequence[str]) -> None:
        with self._lock:
            self._uuids = tuple(uuids)

    def sample_once(self) -> None:
        """One pass over the cards: read each instant, fold it into the window's peaks."""
        with self._lock:
            uuids = self._uuids
        if not uuids:
            return
        cpu0 = time.thread_time()
        readings: dict[str, float | None] = {}
        for uuid in uuids:
            try:
                readings[uuid] = self.nvml.power_instant_w(uuid)
            except NvmlError as exc:
                readings[uuid] = None  # not read this pass; the tick's own reading still counts
                self.stats.read_errors += 1
                if uuid not in self._warned:
                    self._warned.add(uuid)
                    log.warning("peak_sample_failed", uuid=uuid, error=str(exc))
        known = [w for w in readings.values() if w is not None]
        with self._lock:
            for uuid, w in readings.items():
                self._fold(uuid, w)
            if len(known) == len(readings):  # a bank sum only where every card was read
                total = sum(known)
                self._bank_peak = total if self._bank_peak is None else max(self._bank_peak, total)
        self.stats.passes += 1
        if self._keep_costs:
            self.stats.pass_cpu_s.append(time.thread_time() - cpu0)
            del self.stats.pass_cpu_s[:-self._keep_costs]

    def _fold(self, uuid: str, w: float | None) -> None:
        if w is None:
            self._card_peak.setdefault(uuid, None)
            return
        prev = self._card_peak.get(uuid)
        self._card_peak[uuid] = w if prev is None else max(prev, w)

    def offer(self, card_w: dict[str, float | None], bank_w: float | None) -> None:
        """Fold in readings taken elsewhere (the tick's own instant readings)."""
        with self._lock:
            for uuid, w in card_w.items():
                self._fold(uuid, w)
            if bank_w is not None:
                self._bank_peak = bank_w if self._bank_peak is None else max(self._bank_peak, bank_w)

    def take(self) -> Peaks:
        """The peaks since the previous take; starts a new window."""
        with self._lock:
            peaks = Peaks(dict(self._card_peak), self._bank_peak)
            self._card_peak.clear()
            self._bank_peak = None
        return peaks

    # -- the thread -----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="powerbudgetd-peaks", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        due = self.clock()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # noqa: BLE001 - a sampler fault must never end recording
                self.stats.read_errors += 1
                log.warning("peak_sampler_error", error=repr(exc))
            due += self.refresh_s
            now = self.clock()
            if now > due + self.refresh_s:  # fell behind (a slow driver call): restart the cadence
                self.stats.late_passes += 1
                due = now
            self._stop.wait(max(0.0, due - now))
