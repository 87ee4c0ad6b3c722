"""AMD Instinct and Radeon cards through AMD SMI (the ``amdsmi`` Python package that
ships with ROCm and loads its ``libamd_smi.so``).

Calls used, per processor handle (``amdsmi_get_processor_handles``):

- ``amdsmi_get_gpu_device_bdf``: the PCI bus id, the card's identity (``amdsmi-<bus id>``);
  ``amdsmi_get_gpu_asic_info`` (``market_name``): its name;
- ``amdsmi_get_power_cap_info``: ``power_cap`` (the cap in force: the one that matches
  NVML's enforced limit), ``default_power_cap`` (``power_cap_default`` in older
  releases), ``min_power_cap``, ``max_power_cap``, all in µW;
- ``amdsmi_set_power_cap(handle, 0, cap_uw)``: sensor 0, µW (needs CAP_SYS_ADMIN; refused
  in a VM guest);
- ``amdsmi_get_power_info``: ``average_socket_power`` and ``current_socket_power`` in W,
  either of which may be the string ``"N/A"`` (MI300 reports only the current one; the
  odd-numbered die of an MI250 / MI250X reports neither: its even twin reports both);
- ``amdsmi_get_energy_count``: ``energy_accumulator`` (``power`` in older releases) times
  ``counter_resolution`` (µJ).

There is one cap and no separate requested limit: a write counts once read back
(:class:`~powerbudgetd.hw.card.Capabilities`), as on hwmon. Limits read (cap, range,
default) are rounded **up** to whole mW (never counted under what is or may come to be
in force), writes **down** to the whole W amdgpu keeps. A card whose range is
not a range (a host under SR-IOV reported min and max as ``UINT64_MAX`` and the default
as 0) is listed without limits, monitored and counted at its cap, never written: a write
raises NvmlNotSupported saying why. No persistence mode.

AMD SMI's exceptions become the project's: ``AmdSmiRetryException`` and
``AmdSmiTimeoutException`` -> NvmlTimeout, ``AmdSmiParameterException`` ->
NvmlInvalidArgument, ``AmdSmiLibraryException`` by its status (``get_error_code()``):
NO_PERM -> NvmlNoPermission, NOT_SUPPORTED -> NvmlNotSupported, INVAL /
INPUT_OUT_OF_BOUNDS -> NvmlInvalidArgument, NOT_FOUND -> NvmlGpuLost, TIMEOUT / BUSY /
RETRY -> NvmlTimeout, NOT_INIT -> NvmlNotInitialized; anything else -> NvmlError. It has
been tested against a stand-in module only, never against ROCm's library or a card
(docs/getting-started/amd-intel.md).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from powerbudgetd.core.units import uw_to_w_up, w_to_uw_down
from powerbudgetd.errors import (
    NvmlError,
    NvmlGpuLost,
    NvmlInvalidArgument,
    NvmlNoPermission,
    NvmlNotInitialized,
    NvmlNotSupported,
    NvmlTimeout,
)
from powerbudgetd.hw.card import Capabilities, GpuInfo, PowerReading, ScannedCards

AMDSMI_CAPS = Capabilities(separate_requested=False, instant_reading=True, energy=True, persistence=False,
                           limit_step_w=1.0)
UINT64_MAX = 2**64 - 1
MAX_PLAUSIBLE_UW = 10**10  # 10 kW: a cap above is a sentinel, not a limit
SENSOR = 0  # the power cap sensor set (the socket's): AMD SMI's examples and ROCm's tools use 0

# AMD SMI status names -> the project's kinds (looked up by name: the numbers are the library's)
_STATUS_KINDS: dict[str, type[NvmlError]] = {
    "AMDSMI_STATUS_NO_PERM": NvmlNoPermission,
    "AMDSMI_STATUS_NOT_SUPPORTED": NvmlNotSupported,
    "AMDSMI_STATUS_NOT_YET_IMPLEMENTED": NvmlNotSupported,
    "AMDSMI_STATUS_INVAL": NvmlInvalidArgument,
    "AMDSMI_STATUS_INPUT_OUT_OF_BOUNDS": NvmlInvalidArgument,
    "AMDSMI_STATUS_NOT_FOUND": NvmlGpuLost,
    "AMDSMI_STATUS_TIMEOUT": NvmlTimeout,
    "AMDSMI_STATUS_BUSY": NvmlTimeout,
    "AMDSMI_STATUS_RETRY": NvmlTimeout,
    "AMDSMI_STATUS_NOT_INIT": NvmlNotInitialized,
}

T = TypeVar("T")


def load_amdsmi() -> ModuleType:
    """``import amdsmi``. Raises NvmlNotInitialized when it cannot be imported (no ROCm:
    the PyPI upload without ``libamd_smi.so`` fails here too)."""
    try:
        return importlib.import_module("amdsmi")
    except Exception as exc:  # ImportError, or OSError / KeyError from the library's loader
        raise NvmlNotInitialized(f"amdsmi cannot be imported (ROCm's AMD SMI is not installed?): {exc}",
                                 call="import amdsmi") from None


def _watts(value: Any) -> float | None:
    """A power figure of ``amdsmi_get_power_info`` (W): None where it says ``"N/A"`` or is
    not a number; a negative or absurd one is kept, for the plausibility rule to judge."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and value in (0xFFFF, 0xFFFFFFFF, UINT64_MAX):
        return None  # the C library's "no value" sentinels, where a release passes them through
    return float(value) if math.isfinite(value) else None


class _Card:
    def __init__(self, handle: Any, bus_id: str) -> None:
        self.handle, self.bus_id = handle, bus_id.lower()
        self.uuid = f"amdsmi-{self.bus_id}"


class AmdSmi(ScannedCards[_Card]):
    """A bank of AMD cards through AMD SMI (W in, W out); a
    :class:`~powerbudgetd.hw.card.CardBackend`.

    ``module``: the ``amdsmi`` module (by default imported at :meth:`init`; the tests
    pass a stand-in). Cards are listed in PCI bus id order.
    """

    KIND = "AMD SMI"

    name = "amdsmi"

    def __init__(self, module: Any = None) -> None:
        self._mod = module
        self._cards: dict[str, _Card] = {}
        self._kinds: dict[int, type[NvmlError]] = {}

    # -- plumbing -------------------------------------------------------------------
    @property
    def mod(self) -> Any:
        if self._mod is None:
            raise NvmlNotInitialized("amdsmi: not initialised", call="init")
        return self._mod

    def _status_kinds(self) -> dict[int, type[NvmlError]]:
        if not self._kinds:
            where = [self.mod, getattr(self.mod, "amdsmi_wrapper", None)]
            for name, kind in _STATUS_KINDS.items():
                for w in where:
                    code = getattr(w, name, None)
                    if isinstance(code, int):
                        self._kinds[code] = kind
                        break
        return self._kinds

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except Exception as exc:
            raise self._error(what, exc) from None

    def _error(self, what: str, exc: Exception) -> NvmlError:
        m = self.mod
        kind: type[NvmlError] = NvmlError
        code = getattr(exc, "err_code", None)
        getter = getattr(exc, "get_error_code", None)
        if callable(getter):
            try:
                code = getter()
            except Exception:
                pass
        for cls_name, k in (("AmdSmiTimeoutException", NvmlTimeout), ("AmdSmiRetryException", NvmlTimeout),
                            ("AmdSmiParameterException", NvmlInvalidArgument)):
            cls = getattr(m, cls_name, None)
            if isinstance(cls, type) and isinstance(exc, cls):
                kind = k
                break
        else:
            base = getattr(m, "AmdSmiException", None)
            if not (isinstance(base, type) and isinstance(exc, base)):
                raise exc  # not AMD SMI's: a bug, not a card's answer
            if isinstance(code, int):
                kind = self._status_kinds().get(code, NvmlError)
        info = getattr(exc, "err_info", None) or str(exc)
        return kind(f"{what}: {info}", code=code if isinstance(code, int) else None, call=what)

    def _listed_by(self) -> str:
        return "not listed by amdsmi_get_processor_handles"

    def _scan(self) -> list[_Card]:
        found = []
        for h in self._call("amdsmi_get_processor_handles", self.mod.amdsmi_get_processor_handles):
            try:
                bdf = self._call("amdsmi_get_gpu_device_bdf", self.mod.amdsmi_get_gpu_device_bdf, h)
            except (NvmlGpuLost, NvmlNotSupported):
                continue  # gone while listed, or not a GPU
            found.append(_Card(h, str(bdf)))
        found.sort(key=lambda c: c.bus_id)
        self._cards = {c.uuid: c for c in found}
        return found

    # -- lifecycle ------------------------------------------------------------------
    def init(self) -> None:
        """Import ``amdsmi`` (unless given) and ``amdsmi_init()``. Raises NvmlNotInitialized."""
        if self._mod is None:
            self._mod = load_amdsmi()
        try:
            self._call("amdsmi_init", self.mod.amdsmi_init)
        except NvmlError as exc:
            raise NvmlNotInitialized(f"amdsmi: {exc}", call="init") from None

    def shutdown(self) -> None:
        self._cards = {}
        if self._mod is not None:
            try:
                self.mod.amdsmi_shut_down()
            except Exception:  # nothing to do about a failed goodbye
                pass

    def driver_version(self) -> str:
        """The amdgpu driver's version, as the first card reports it."""
        cards = self._scan()
        if not cards:
            return "unknown"
        info = self._call("amdsmi_get_gpu_driver_info", self.mod.amdsmi_get_gpu_driver_info, cards[0].handle)
        return str(info.get("driver_version", "unknown")) if isinstance(info, dict) else str(info)

    # -- enumeration ----------------------------------------------------------------

    def _cap_info(self, card: _Card) -> dict[str, Any]:
        info = self._call("amdsmi_get_power_cap_info", self.mod.amdsmi_get_power_cap_info, card.handle)
        if not isinstance(info, dict):
            raise NvmlError(f"{card.uuid} amdsmi_get_power_cap_info: not a dictionary: {info!r}",
                            call="amdsmi_get_power_cap_info")
        return info

    @staticmethod
    def _uw(info: dict[str, Any], *keys: str) -> int | None:
        """The first of ``keys`` that is a plausible µW figure; None where absent, "N/A",
        0 or a sentinel (UINT64_MAX)."""
        for k in keys:
            v = info.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                return v if 0 < v <= MAX_PLAUSIBLE_UW else None
        return None

    def _range_refused(self, info: dict[str, Any]) -> str | None:
        """Why the card's range cannot be used (the SR-IOV sentinels), or None."""
        lo, hi = info.get("min_power_cap"), info.get("max_power_cap")
        default = info.get("default_power_cap", info.get("power_cap_default"))
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)):
            return f"no power cap range (min {lo!r}, max {hi!r})"
        assert isinstance(lo, int) and isinstance(hi, int)
        if hi > MAX_PLAUSIBLE_UW or lo > MAX_PLAUSIBLE_UW or default == 0:
            return (f"its power cap range is not a range (min {lo} µW, max {hi} µW, default {default!r}): "
                    "AMD SMI reports that under SR-IOV; cap the card from the host, not from a guest")
        if not 0 < lo <= hi:
            return f"its power cap range is empty (min {lo} µW, max {hi} µW)"
        return None

    def _info(self, index: int, card: _Card) -> GpuInfo:
        info = self._cap_info(card)
        name = "AMD GPU"
        try:
            asic = self._call("amdsmi_get_gpu_asic_info", self.mod.amdsmi_get_gpu_asic_info, card.handle)
            if isinstance(asic, dict) and isinstance(asic.get("market_name"), str) and asic["market_name"].strip():
                name = asic["market_name"].strip()
        except (NvmlNotSupported, NvmlInvalidArgument, NvmlTimeout):
            pass
        if self._range_refused(info) is not None:
            lo = hi = default = None  # listed, monitored, counted; never written
        else:
            lo, hi = self._uw(info, "min_power_cap"), self._uw(info, "max_power_cap")
            default = self._uw(info, "default_power_cap", "power_cap_default")
        # Every limit rounded up to whole mW (as hwmon's): the maximum and the default are
        # worst cases, never counted lower; a target is rounded down to whole W when written.
        return GpuInfo(index, card.uuid, name, None if lo is None else uw_to_w_up(lo),
                       None if hi is None else uw_to_w_up(hi), None if default is None else uw_to_w_up(default),
                       None, "amd", "amdsmi", card.bus_id, AMDSMI_CAPS)

    # -- reads ----------------------------------------------------------------------
    def read(self, uuid: str) -> PowerReading:
        """``power_cap`` read back (as both limits; None when it is a sentinel: the card
        then counts at its worst case) and the draw. Raises NvmlGpuLost, NvmlError."""
        card = self._card(uuid)
        cap_uw = self._uw(self._cap_info(card), "power_cap")
        cap_w = None if cap_uw is None else uw_to_w_up(cap_uw)
        avg = inst = None
        try:
            p = self._call("amdsmi_get_power_info", self.mod.amdsmi_get_power_info, card.handle)
            if isinstance(p, dict):
                avg, inst = _watts(p.get("average_socket_power")), _watts(p.get("current_socket_power"))
        except (NvmlNotSupported, NvmlInvalidArgument):
            pass  # no power on this die (an MI250's odd one): the cap read beside it is what counts
        if avg is None:  # MI300 reports the current figure only: it is then the card's reading
            avg, inst = inst, None
        return PowerReading(avg, inst, cap_w, cap_w)

    def power_instant_w(self, uuid: str) -> float | None:
        return self.read(uuid).power_instant_w

    def energy_j(self, uuid: str) -> float | None:
        """``amdsmi_get_energy_count``: accumulator x resolution (µJ) in J; None where the
        card has none."""
        card = self._card(uuid)
        try:
            e = self._call("amdsmi_get_energy_count", self.mod.amdsmi_get_energy_count, card.handle)
        except (NvmlNotSupported, NvmlInvalidArgument):
            return None
        if not isinstance(e, dict):
            return None
        acc = e.get("energy_accumulator", e.get("power"))
        res = e.get("counter_resolution")
        if not isinstance(acc, (int, float)) or not isinstance(res, (int, float)) or isinstance(acc, bool):
            return None
        return acc * res / 1e6

    def persistence_mode(self, uuid: str) -> bool | None:
        return None  # no such mode: the driver stays loaded and keeps the cap

    # -- writes ---------------------------------------------------------------------
    def set_persistence_mode(self, uuid: str, enabled: bool) -> None:
        raise NvmlNotSupported(f"{uuid}: AMD SMI cards have no persistence mode", call="persistence")

    def set_power_limit(self, uuid: str, limit_w: float) -> None:
        """``amdsmi_set_power_cap(handle, 0, µW)``, rounded down to whole W. Raises
        NvmlNotSupported (a card whose range is a sentinel: SR-IOV), NvmlNoPermission,
        NvmlInvalidArgument (outside the range), NvmlGpuLost, NvmlTimeout, NvmlError."""
        card = self._card(uuid)
        why = self._range_refused(self._cap_info(card))
        if why is not None:
            raise NvmlNotSupported(f"{uuid}: not written: {why}", call="amdsmi_set_power_cap")
        uw = w_to_uw_down(limit_w, AMDSMI_CAPS.limit_step_w)
        if uw <= 0:
            raise NvmlInvalidArgument(f"{uuid}: a cap of {limit_w} W is not a limit", call="amdsmi_set_power_cap")
        self._call(f"{uuid} amdsmi_set_power_cap", self.mod.amdsmi_set_power_cap, card.handle, SENSOR, uw)
