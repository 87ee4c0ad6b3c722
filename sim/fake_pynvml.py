"""A fake ``pynvml`` module over a :class:`~powerbudgetd_sim.physics.SimBank`.

It answers the same calls, with the same units (mW, mJ), return codes and exception
shape (``NVMLError`` with ``.value``) as nvidia-ml-py, so powerbudgetd's NVML layer runs
unchanged against it. Scripted faults (:class:`Fault`) make chosen calls fail on chosen
cards at chosen times.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from powerbudgetd_sim.physics import SimBank, SimCard

NVML_SUCCESS = 0
ERROR_CODES = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "LIB_RM_VERSION_MISMATCH": 18,
    "UNKNOWN": 999,
}
NVML_FI_DEV_POWER_INSTANT = 186
NVML_VALUE_TYPE_UNSIGNED_INT = 1


class NVMLError(Exception):
    """Same shape as nvidia-ml-py's: ``.value`` holds the ``nvmlReturn_t`` code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        names = {v: k for k, v in ERROR_CODES.items()}
        return f"NVML_ERROR_{names.get(self.value, self.value)} (simulated)"


@dataclass(frozen=True)
class Fault:
    """Make ``call`` fail with NVML error ``error`` (a name from ``ERROR_CODES``), or
    with ``error = "SLOW"`` answer normally after ``delay_s`` real seconds (a hang on the
    wall clock), or with ``error = "HANG"`` hang ``delay_s`` seconds of bank time (on
    virtual time: the caller's deadline passes at once, NVML_ERROR_TIMEOUT, and a
    limit write still lands when the hung call would have returned).

    ``call``: an NVML function name such as ``nvmlDeviceSetPowerManagementLimit``, or
    ``*`` for every call. ``card``: a card index, or None for every card and for calls
    without a card (``nvmlInit``). Active while ``from_s <= t < until_s`` in bank time;
    ``count`` limits it to the first N matching calls.
    """

    call: str
    error: str
    card: int | None = None
    from_s: float = 0.0
    until_s: float = math.inf
    count: int | None = None
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.error not in ERROR_CODES and self.error not in ("SLOW", "HANG"):
            raise ValueError(f"fault error {self.error!r} is not SLOW, HANG nor one of {', '.join(ERROR_CODES)}")


class Hung(NVMLError):
    """A HANG fault: the call did not return within the caller's deadline."""

    def __init__(self, now: float, hang_s: float) -> None:
        super().__init__(ERROR_CODES["TIMEOUT"])
        self.now, self.hang_s = now, hang_s


def _guarded(fn: Any) -> Any:
    """One call at a time on the simulated bank (the fake is thread-safe, as NVML is);
    a SLOW fault sleeps before the lock is taken, so a hung call on one card does not
    hold up calls on the others."""

    @functools.wraps(fn)
    def call(self: FakePynvml, *args: Any) -> Any:
        self._slow(fn.__name__, args[0] if args and isinstance(args[0], SimCard) else None)
        with self._lock:
            return fn(self, *args)

    return call


class FakePynvml(SimpleNamespace):
    """Module-like object exposing the ``pynvml`` calls powerbudgetd uses."""

    NVMLError = NVMLError

    def __init__(self, bank: SimBank, faults: list[Fault] | None = None, driver: str = "580.sim") -> None:
        super().__init__()
        self.bank = bank
        self.faults = list(faults or [])
        self._fault_hits: dict[int, int] = {}
        self._initialized = False
        self._driver = driver
        self.calls = 0
        self.call_delay_s = 0.0  # real seconds each call sleeps (to test a slow NVML)
        self._lock = threading.RLock()
        self._hung_until: dict[int, float] = {}  # card index -> bank time its HANG ends

    # -- plumbing: scripted per-call faults ------------------------------------------
    def _matching(self, call: str, card: SimCard | None, now: float, slow: bool) -> list[Fault]:
        """The faults that fire on this call (their hit counts taken), SLOW ones or the rest."""
        index = card.index if card is not None else None
        out = []
        for i, f in enumerate(self.faults):
            if (f.error == "SLOW") != slow or f.call not in ("*", call) or not f.from_s <= now < f.until_s:
                continue
            if f.card is not None and f.card != index:
                continue
            hits = self._fault_hits.get(i, 0)
            if f.count is not None and hits >= f.count:
                continue
            self._fault_hits[i] = hits + 1
            out.append(f)
        return out

    def _slow(self, call: str, card: SimCard | None) -> None:
        with self._lock:
            delays = [f.delay_s for f in self._matching(call, card, self.bank.time(), slow=True)]
        delay = self.call_delay_s + sum(delays)
        if delay:
            time.sleep(delay)

    def _enter(self, call: str, card: SimCard | None = None) -> float:
        self.calls += 1
        now = self.bank.time()
        if card is not None and not self.bank.present(card):
            raise NVMLError(ERROR_CODES["GPU_IS_LOST"])  # off the bus: its handle is stale
        if card is not None and now < self._hung_until.get(card.index, -math.inf):
            # The hung call still holds the card: every call on it misses its deadline
            # too (as the daemon's per-card worker does, on the wall clock).
            raise NVMLError(ERROR_CODES["TIMEOUT"])
        for f in self._matching(call, card, now, slow=False):
            if f.error == "HANG":
                if card is not None:
                    self._hung_until[card.index] = now + f.delay_s
                raise Hung(now, f.delay_s)
            raise NVMLError(ERROR_CODES[f.error])
        if call != "nvmlInit" and not self._initialized:
            raise NVMLError(ERROR_CODES["UNINITIALIZED"])
        return now

    # -- lifecycle ------------------------------------------------------------------
    @_guarded
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self._initialized = True

    @_guarded
    def nvmlShutdown(self) -> None:
        self._initialized = False

    @_guarded
    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self._driver

    # -- enumeration ----------------------------------------------------------------
    @_guarded
    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.bank.visible())

    @_guarded
    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimCard:
        self._enter("nvmlDeviceGetHandleByIndex")
        visible = self.bank.visible()
        if not 0 <= index < len(visible):
            raise NVMLError(ERROR_CODES["INVALID_ARGUMENT"])
        return visible[index]

    @_guarded
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> SimCard:
        self._enter("nvmlDeviceGetHandleByUUID")
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for card in self.bank.visible():
            if card.spec.uuid == uuid:
                self._enter("nvmlDeviceGetHandleByUUID", card)  # a lost card stays lost
                return card
        raise NVMLError(ERROR_CODES["NOT_FOUND"])

    @_guarded
    def nvmlDeviceGetUUID(self, handle: SimCard) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return handle.spec.uuid

    @_guarded
    def nvmlDeviceGetName(self, handle: SimCard) -> str:
        self._enter("nvmlDeviceGetName", handle)
        return handle.spec.name

    @_guarded
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: SimCard) -> list[int]:
        self._enter("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        spec = handle.spec
        lo = handle.min_mw if spec.reported_min_w is None else round(spec.reported_min_w * 1000)
        hi = handle.max_mw if spec.reported_max_w is None else round(spec.reported_max_w * 1000)
        return [lo, hi]

    @_guarded
    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: SimCard) -> int:
        self._enter("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        return handle.default_mw

    @_guarded
    def nvmlDeviceGetPersistenceMode(self, handle: SimCard) -> int:
        self._enter("nvmlDeviceGetPersistenceMode", handle)
        return int(handle.persistence_mode)

    # -- reads ----------------------------------------------------------------------
    @_guarded
    def nvmlDeviceGetPowerUsage(self, handle: SimCard) -> int:
        now = self._enter("nvmlDeviceGetPowerUsage", handle)
        return handle.reported_avg_mw(now)

    @_guarded
    def nvmlDeviceGetFieldValues(self, handle: SimCard, field_ids: list[int]) -> list[Any]:
        now = self._enter("nvmlDeviceGetFieldValues", handle)
        out = []
        for fid in field_ids:
            ok = fid == NVML_FI_DEV_POWER_INSTANT and handle.spec.has_instant
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    nvmlReturn=NVML_SUCCESS if ok else ERROR_CODES["NOT_SUPPORTED"],
                    valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                    value=SimpleNamespace(uiVal=handle.reported_instant_mw(now) if ok else 0),
                )
            )
        return out

    @_guarded
    def nvmlDeviceGetPowerManagementLimit(self, handle: SimCard) -> int:
        now = self._enter("nvmlDeviceGetPowerManagementLimit", handle)
        return handle.requested(now)

    @_guarded
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: SimCard) -> int:
        now = self._enter("nvmlDeviceGetEnforcedPowerLimit", handle)
        return handle.enforced_mw(now)

    @_guarded
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimCard) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        return int(handle.energy_mj)

    # -- writes ---------------------------------------------------------------------
    @_guarded
    def nvmlDeviceSetPersistenceMode(self, handle: SimCard, mode: int) -> None:
        self._enter("nvmlDeviceSetPersistenceMode", handle)
        if int(mode) not in (0, 1):
            raise NVMLError(ERROR_CODES["INVALID_ARGUMENT"])
        handle.persistence_mode = bool(mode)

    @_guarded
    def nvmlDeviceSetPowerManagementLimit(self, handle: SimCard, limit_mw: int) -> None:
        try:
            now = self._enter("nvmlDeviceSetPowerManagementLimit", handle)
        except Hung as hung:  # the write lands when the hung call returns
            if handle.min_mw <= int(limit_mw) <= handle.max_mw and not handle.spec.ignores_writes:
                handle.set_limit(hung.now, int(limit_mw), delay_s=hung.hang_s)
            raise
        if handle.spec.ignores_writes:  # "success", and nothing changes
            handle.set_limit(now, int(limit_mw))
            return
        if not handle.min_mw <= int(limit_mw) <= handle.max_mw:
            raise NVMLError(ERROR_CODES["INVALID_ARGUMENT"])
        handle.set_limit(now, int(limit_mw))
        self.bank.save_state()
