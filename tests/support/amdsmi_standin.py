"""A stand-in for AMD SMI's Python module (``amdsmi``), serving a simulated bank's AMD
cards from the same physics as the simulated NVML library and hwmon tree.

It is NOT AMD's library: it has AMD SMI's function names, dictionary keys, units and
exception classes as AMD's documentation and public issues describe them, and nothing
of it was checked against ROCm's ``libamd_smi.so`` or a card. What it serves:

- ``amdsmi_get_power_cap_info`` -> ``power_cap`` (the highest cap that may be in force:
  a raise reads back at once, a cut once it bites, as amdgpu's ``power1_cap`` under it),
  ``default_power_cap`` (``power_cap_default`` with ``legacy_keys``), ``min_power_cap``,
  ``max_power_cap``, ``dpm_cap``: µW;
- ``amdsmi_set_power_cap(handle, sensor, cap_uw)``: sensor 0 only; kept in whole W (as
  amdgpu keeps it); outside the range: AMDSMI_STATUS_INVAL;
- ``amdsmi_get_power_info`` -> ``current_socket_power`` / ``average_socket_power`` (W),
  ``"N/A"`` where the card has none (``quirk``: ``mi300`` no average, ``mi250-odd`` no
  power at all);
- ``amdsmi_get_energy_count`` -> ``energy_accumulator`` (``power`` with ``legacy_keys``),
  ``counter_resolution`` (µJ per count), ``timestamp``;
- ``quirk="sriov"``: min and max ``UINT64_MAX``, default 0 (amd/MxGPU-Virtualization#26);
- a card off the bus is not listed, and its handle answers AMDSMI_STATUS_NOT_FOUND.

Faults (:class:`SmiFault`) make a call raise a status (``AmdSmiLibraryException``) or a
class (``retry``, ``timeout``, ``parameter``) for a card, from a bank time, a number of
times. Status numbers are the stand-in's own; the backend looks them up by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from powerbudgetd_sim.physics import SimBank, SimCard

UINT64_MAX = 2**64 - 1

amdsmi_wrapper = SimpleNamespace(
    AMDSMI_STATUS_SUCCESS=0, AMDSMI_STATUS_INVAL=1, AMDSMI_STATUS_NOT_SUPPORTED=2, AMDSMI_STATUS_TIMEOUT=8,
    AMDSMI_STATUS_RETRY=9, AMDSMI_STATUS_NO_PERM=10, AMDSMI_STATUS_IO=12, AMDSMI_STATUS_INPUT_OUT_OF_BOUNDS=17,
    AMDSMI_STATUS_BUSY=30, AMDSMI_STATUS_NOT_FOUND=31, AMDSMI_STATUS_NOT_INIT=32,
)


class AmdSmiException(Exception):
    """AMD SMI's base exception."""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        names = {v: k for k, v in vars(amdsmi_wrapper).items()}
        self.err_code = err_code
        self.err_info = names.get(err_code, f"status {err_code}")
        super().__init__(f"Error code:\n\t{err_code} | {self.err_info}")

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(amdsmi_wrapper.AMDSMI_STATUS_RETRY)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(amdsmi_wrapper.AMDSMI_STATUS_TIMEOUT)


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received: object, expected: str) -> None:
        super().__init__(f"Invalid parameter: received {received!r}, expected {expected}")


@dataclass(frozen=True)
class SmiFault:
    """``error`` (a status name without its prefix: ``NO_PERM``, ``INVAL``, ``NOT_FOUND``,
    ...; or ``retry``, ``timeout``, ``parameter``) on ``call`` (a function name, or
    ``*``) for card ``card`` (scenario position; None: every card), while ``from_s <= t``,
    for the first ``count`` matching calls (None: all)."""

    call: str
    error: str
    card: int | None = None
    from_s: float = 0.0
    count: int | None = None


class Handle:
    """An opaque processor handle (one per card, kept while the stand-in lives)."""

    def __init__(self, card: SimCard) -> None:
        self.card = card

    def __repr__(self) -> str:
        return f"<amdsmi_processor_handle {self.card.index}>"


class StandInAmdSmi:
    """The stand-in module over ``bank``'s AMD cards. ``quirks``: scenario position ->
    ``mi300``, ``mi250-odd`` or ``sriov``; ``legacy_keys``: older releases' key names."""

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiRetryException = AmdSmiRetryException
    AmdSmiTimeoutException = AmdSmiTimeoutException
    AmdSmiParameterException = AmdSmiParameterException
    amdsmi_wrapper = amdsmi_wrapper

    def __init__(self, bank: SimBank, faults: list[SmiFault] | None = None, quirks: dict[int, str] | None = None,
                 legacy_keys: bool = False, no_permission: bool = False) -> None:
        self.bank = bank
        self.faults = list(faults or [])
        self.quirks = dict(quirks or {})
        self.legacy_keys = legacy_keys
        self.no_permission = no_permission
        self._hits: dict[int, int] = {}
        self._handles = {c.index: Handle(c) for c in bank.cards if c.spec.vendor == "amd"}
        self.initialised = False
        self.calls: list[tuple[str, int, tuple[Any, ...]]] = []

    # -- plumbing -------------------------------------------------------------------
    def _enter(self, call: str, handle: Any = None, *args: Any) -> SimCard | None:
        if call != "amdsmi_init" and not self.initialised:
            raise AmdSmiLibraryException(amdsmi_wrapper.AMDSMI_STATUS_NOT_INIT)
        now = self.bank.time()
        card = None
        if handle is not None:
            if not isinstance(handle, Handle):
                raise AmdSmiParameterException(handle, "amdsmi_processor_handle")
            card = handle.card
            self.calls.append((call, card.index, args))
        for i, f in enumerate(self.faults):
            if f.call not in ("*", call) or (f.card is not None and (card is None or f.card != card.index)):
                continue
            if now < f.from_s or (f.count is not None and self._hits.get(i, 0) >= f.count):
                continue
            self._hits[i] = self._hits.get(i, 0) + 1
            if f.error == "retry":
                raise AmdSmiRetryException()
            if f.error == "timeout":
                raise AmdSmiTimeoutException()
            if f.error == "parameter":
                raise AmdSmiParameterException(args, "a valid argument")
            raise AmdSmiLibraryException(getattr(amdsmi_wrapper, f"AMDSMI_STATUS_{f.error}"))
        if card is not None and not card.present:
            raise AmdSmiLibraryException(amdsmi_wrapper.AMDSMI_STATUS_NOT_FOUND)
        return card

    # -- the module's functions -----------------------------------------------------
    def amdsmi_init(self, flags: int = 0) -> None:
        self._enter("amdsmi_init")
        self.initialised = True

    def amdsmi_shut_down(self) -> None:
        self._enter("amdsmi_shut_down")
        self.initialised = False

    def amdsmi_get_processor_handles(self) -> list[Handle]:
        self._enter("amdsmi_get_processor_handles")
        return [h for h in self._handles.values() if h.card.present]

    def amdsmi_get_gpu_device_bdf(self, handle: Any) -> str:
        c = self._enter("amdsmi_get_gpu_device_bdf", handle)
        assert c is not None
        return f"0000:{0x10 + c.index:02x}:00.0"

    def amdsmi_get_gpu_asic_info(self, handle: Any) -> dict[str, Any]:
        c = self._enter("amdsmi_get_gpu_asic_info", handle)
        assert c is not None
        return {"market_name": c.spec.name, "vendor_id": 0x1002, "device_id": 0x74A1, "rev_id": 0,
                "asic_serial": f"0x{c.index:016X}", "family": 0}

    def amdsmi_get_gpu_driver_info(self, handle: Any) -> dict[str, str]:
        self._enter("amdsmi_get_gpu_driver_info", handle)
        return {"driver_name": "amdgpu", "driver_version": "6.10.5", "driver_date": "2015/01/01 00:00"}

    def amdsmi_get_power_cap_info(self, handle: Any, sensor_ind: int = 0) -> dict[str, Any]:
        c = self._enter("amdsmi_get_power_cap_info", handle, sensor_ind)
        assert c is not None
        now = self.bank.time()
        lo = c.min_mw if c.spec.reported_min_w is None else round(c.spec.reported_min_w * 1000)
        hi = c.max_mw if c.spec.reported_max_w is None else round(c.spec.reported_max_w * 1000)
        info: dict[str, Any] = {"power_cap": c.limit_bound_mw(now) * 1000, "dpm_cap": 0,
                                "min_power_cap": lo * 1000, "max_power_cap": hi * 1000}
        default = c.default_mw * 1000
        if self.quirks.get(c.index) == "sriov":
            info.update(min_power_cap=UINT64_MAX, max_power_cap=UINT64_MAX)
            default = 0
        info["power_cap_default" if self.legacy_keys else "default_power_cap"] = default
        return info

    def amdsmi_set_power_cap(self, handle: Any, sensor_ind: int, cap: int) -> None:
        c = self._enter("amdsmi_set_power_cap", handle, sensor_ind, cap)
        assert c is not None
        if not isinstance(cap, int) or isinstance(cap, bool) or sensor_ind != 0:
            raise AmdSmiParameterException((sensor_ind, cap), "sensor 0 and an int of µW")
        if self.no_permission or self.quirks.get(c.index) == "sriov":
            raise AmdSmiLibraryException(amdsmi_wrapper.AMDSMI_STATUS_NO_PERM)
        mw = cap // 1_000_000 * 1000  # amdgpu keeps whole W
        if c.spec.ignores_writes:
            c.set_limit(self.bank.now, mw)
            return
        if not c.min_mw <= mw <= c.max_mw:
            raise AmdSmiLibraryException(amdsmi_wrapper.AMDSMI_STATUS_INVAL)
        c.set_limit(self.bank.now, mw)
        self.bank.save_state()

    def amdsmi_get_power_info(self, handle: Any) -> dict[str, Any]:
        c = self._enter("amdsmi_get_power_info", handle)
        assert c is not None
        now = self.bank.time()
        quirk = self.quirks.get(c.index)
        avg: Any = int(c.reported_avg_mw(now) / 1000)
        cur: Any = int(c.reported_instant_mw(now) / 1000)
        if quirk == "mi300":
            avg = "N/A"
        if quirk == "mi250-odd":
            avg = cur = "N/A"
        return {"current_socket_power": cur, "average_socket_power": avg, "gfx_voltage": "N/A",
                "soc_voltage": "N/A", "mem_voltage": "N/A", "power_limit": c.enforced_mw(now) // 1000}

    def amdsmi_get_energy_count(self, handle: Any) -> dict[str, Any]:
        c = self._enter("amdsmi_get_energy_count", handle)
        assert c is not None
        resolution = 15.259  # µJ a count, the figure AMD's examples print
        count = math.floor(c.energy_mj * 1000 / resolution)
        return {"power" if self.legacy_keys else "energy_accumulator": count, "counter_resolution": resolution,
                "timestamp": int(self.bank.now * 1e9)}


def amdsmi_rig(specs: Any, budget_w: float, *, lag_s: float = 0.1, seed: int = 1, events: Any = (),
               faults: list[SmiFault] | None = None, quirks: dict[int, str] | None = None, **kw: Any) -> Any:
    """A started controller (a :class:`support.rig.Rig`) on a bank whose AMD cards are
    reached through the AMD SMI backend on this stand-in (and its NVIDIA cards through
    NVML on the simulated library, one MultiBackend for both). The stand-in is the rig's
    ``smi``."""
    from powerbudgetd.control.controller import Controller
    from powerbudgetd.hw.amdsmi import AmdSmi
    from powerbudgetd.hw.card import CardBackend
    from powerbudgetd.hw.multi import MultiBackend
    from powerbudgetd.hw.nvml import Nvml
    from powerbudgetd_sim.libnvml import SimNvmlLibrary
    from support.rig import FAST, Rig

    bank = SimBank(list(specs), lag_s=lag_s, seed=seed, events=list(events))
    lib = SimNvmlLibrary(bank, [])
    smi = StandInAmdSmi(bank, faults, quirks)
    backends: list[CardBackend] = []
    if any(c.spec.vendor == "nvidia" for c in bank.cards):
        backends.append(Nvml(lib))
    backends.append(AmdSmi(smi))
    backend = backends[0] if len(backends) == 1 else MultiBackend(backends)
    backend.init()
    ctl = Controller(backend, budget_w, kw.pop("timings", FAST), **kw)
    ctl.start()
    rig = Rig(bank, lib, backend, ctl)
    rig.smi = smi  # type: ignore[attr-defined]
    return rig
