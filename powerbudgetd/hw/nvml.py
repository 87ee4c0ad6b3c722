"""The NVML layer: the only module that talks to ``pynvml`` (package ``nvidia-ml-py``).

Watts in, watts out: NVML speaks milliwatts, and this module is the one place that
converts. NVML errors become the project exceptions of :mod:`powerbudgetd.errors`.

The layer always calls the real bindings. In production they load the driver's
``libnvidia-ml.so.1``; in tests and ``simulate`` an :class:`NvmlLibrary` (the
simulator's ``powerbudgetd_sim.libnvml``) serves the same C functions in its place, so
the code below and NVIDIA's bindings under it are exactly the code tested.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.metadata
import threading
from contextlib import AbstractContextManager, nullcontext
from types import ModuleType
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from powerbudgetd.core.units import to_j, to_mw, to_w
# The seam's types, re-exported: the NVML callers import them from here as before.
from powerbudgetd.hw.card import NVML_CAPS, CardBackend, Capabilities, GpuInfo, PowerReading  # noqa: F401
from powerbudgetd.errors import (
    NvmlError,
    NvmlGpuLost,
    NvmlInvalidArgument,
    NvmlNoPermission,
    NvmlNotInitialized,
    NvmlNotSupported,
    NvmlTimeout,
)
from powerbudgetd.hw.nvmlscope import NvmlScope

# nvmlReturn_t codes (nvml.h); the same values in nvidia-ml-py and in the simulator.
_ERROR_KINDS: dict[int, type[NvmlError]] = {
    1: NvmlNotInitialized,  # UNINITIALIZED
    2: NvmlInvalidArgument,  # INVALID_ARGUMENT
    3: NvmlNotSupported,  # NOT_SUPPORTED
    4: NvmlNoPermission,  # NO_PERMISSION
    9: NvmlNotInitialized,  # DRIVER_NOT_LOADED
    10: NvmlTimeout,  # TIMEOUT
    12: NvmlNotInitialized,  # LIBRARY_NOT_FOUND
    15: NvmlGpuLost,  # GPU_IS_LOST
    16: NvmlGpuLost,  # RESET_REQUIRED
    18: NvmlNotInitialized,  # LIB_RM_VERSION_MISMATCH
}

_FUNCTION_NOT_FOUND = 13  # NVML_ERROR_FUNCTION_NOT_FOUND: a driver older than the call
FI_DEV_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT: instant board power, mW
_INSTANT_FIELDS = (FI_DEV_POWER_INSTANT,)  # the field ids asked every read: one tuple, not a list a call
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# The bindings' structures pass every attribute read through a Python-level
# __getattribute__ that decodes bytes; a field value's members are numbers, so the read
# of field 186 each tick takes them through the base one (ctypes' field descriptors):
# 0.44 us instead of 1.07 us for the three, measured over the null driver.
_member = ctypes.Structure.__getattribute__

T = TypeVar("T")

# The read-only calls behind ``probe --compare-sim`` (with the unit of their answer), and
# the power fields read the same way: what the daemon reads, plus MIG mode and the
# clock-event reasons an operator checks when a cap does not seem to bite.
RAW_READS = (
    ("nvmlDeviceGetName", "text"),
    ("nvmlDeviceGetUUID", "text"),
    ("nvmlDeviceGetPowerManagementLimitConstraints", "[min, max] mW"),
    ("nvmlDeviceGetPowerManagementDefaultLimit", "mW"),
    ("nvmlDeviceGetPowerManagementLimit", "mW"),
    ("nvmlDeviceGetEnforcedPowerLimit", "mW"),
    ("nvmlDeviceGetPowerUsage", "mW"),
    ("nvmlDeviceGetTotalEnergyConsumption", "mJ"),
    ("nvmlDeviceGetPersistenceMode", "0 off / 1 on"),
    ("nvmlDeviceGetMigMode", "[current, pending]"),
    ("nvmlDeviceGetCurrentClocksEventReasons", "bitmask"),
)
RAW_FIELDS = ((185, "mW"), (FI_DEV_POWER_INSTANT, "mW"))  # NVML_FI_DEV_POWER_AVERAGE, _INSTANT


# What to do about each reason NVML will not start (nvmlReturn_t code -> advice).
INIT_ADVICE = {
    18: "the NVIDIA driver was upgraded but the old kernel module is still loaded: "
    "reboot, or stop every GPU user and reload the nvidia kernel modules",
    9: "the NVIDIA kernel driver is not loaded: check `lsmod | grep nvidia` and `dmesg`, "
    "and that nvidia-persistenced started",
    12: "libnvidia-ml.so.1 was not found: install the NVIDIA driver's NVML library "
    "(e.g. the libnvidia-ml / nvidia-utils package) or fix the library path",
    4: "NVML refused access: run as root or with CAP_SYS_ADMIN and access to /dev/nvidia*",
}


def init_advice(code: int | None) -> str:
    """What an operator should do when ``nvmlInit`` fails with ``code``."""
    return INIT_ADVICE.get(code or 0, "check that the NVIDIA driver is installed and `nvidia-smi` works")


def load_pynvml() -> ModuleType:
    """Import the official NVML bindings (``nvidia-ml-py``).

    Raises NvmlNotInitialized when they are missing or when the unofficial ``pynvml``
    wrapper package (before 12.0, which re-exports nvidia-ml-py) shadows them.
    """
    try:
        module = importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlNotInitialized(
            "the NVML bindings are missing: pip install nvidia-ml-py"
        ) from exc
    try:
        wrapper = importlib.metadata.version("pynvml")
    except importlib.metadata.PackageNotFoundError:
        wrapper = None
    old_wrapper = wrapper is not None and int(wrapper.split(".")[0]) < 12
    if old_wrapper or not hasattr(module, "_nvmlGetFunctionPointer"):
        raise NvmlNotInitialized(
            f"the unofficial 'pynvml' package ({wrapper or 'unknown version'}) shadows "
            "NVIDIA's bindings: pip uninstall pynvml && pip install nvidia-ml-py"
        )
    return module


def bindings_version() -> str | None:
    """The installed ``nvidia-ml-py`` version, from package metadata (``pynvml`` is not
    imported); None when it is not installed."""
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return None


def query_driver_version(library: NvmlLibrary | None = None, timeout_s: float = 5.0) -> str:
    """The NVIDIA driver version NVML reports (``nvmlSystemGetDriverVersion``), e.g.
    ``"550.54.15"``; for ``powerbudgetd --version``, on hosts with or without a GPU.

    NVML is started and shut down in a daemon thread: a host without the driver fails
    at once, and a driver stuck in ``nvmlInit`` (a wedged GPU can hold it for minutes)
    costs at most ``timeout_s`` s. ``library`` as for :class:`Nvml`.
    Raises NvmlNotInitialized: no bindings, no NVML library or driver, or no answer
    within ``timeout_s``.
    """
    outcome: list[str | Exception] = []

    def ask() -> None:
        try:
            nvml = Nvml(library)
            with NvmlScope(nvml):
                outcome.append(nvml.driver_version())
        except Exception as exc:  # noqa: BLE001 - a broken library (OSError, ctypes) is reported, not raised
            outcome.append(exc)

    worker = threading.Thread(target=ask, name="nvml-driver-version", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive() or not outcome:
        raise NvmlNotInitialized(f"NVML did not answer within {timeout_s:g} s")
    result = outcome[0]
    if isinstance(result, NvmlNotInitialized):
        raise result
    if isinstance(result, Exception):
        raise NvmlNotInitialized(f"{type(result).__name__}: {result}") from result
    return result


def _first_field(lib: Any, handle: Any, field_id: int) -> Any:
    return lib.nvmlDeviceGetFieldValues(handle, [field_id])[0]


class NvmlLibrary(Protocol):
    """What stands in for ``libnvidia-ml.so`` under the real bindings (the simulator).

    ``attach(pynvml)``: make the bindings resolve NVML's C symbols through it (called
    once per layer; idempotent per process). ``bound()``: a context in which the calling
    thread's NVML calls reach this library (several may live in one process).
    """

    def attach(self, module: ModuleType) -> None: ...

    def bound(self) -> AbstractContextManager[Any]: ...


class Nvml:
    """Thin, typed access to the NVML calls powerbudgetd needs, through ``nvidia-ml-py``.

    ``library``: None for the driver's NVML; an :class:`NvmlLibrary` to serve the C
    functions instead (the simulator). Raises NvmlNotInitialized when the bindings are
    missing; every call raises project exceptions (:mod:`powerbudgetd.errors`), never
    ``NVMLError``.
    """

    name = "nvml"

    def __init__(self, library: NvmlLibrary | None = None) -> None:
        self._lib = load_pynvml()
        self.library = library
        self._bound: Callable[[], AbstractContextManager[Any]] = nullcontext
        if library is not None:
            library.attach(self._lib)
            self._bound = library.bound
        self._handles: dict[str, Any] = {}
        self._instant_unsupported: set[str] = set()
        self._mig_devices: dict[str, bool] = {}  # UUID -> is a MIG device (asked once)
        # No lock here: NVML is thread-safe (and so is the simulator's library), and a lock
        # held by a hung call would stall every other card's calls behind it.

    # -- plumbing -------------------------------------------------------------------
    def _call(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            if self.library is None:  # the driver's own library: nothing to bind
                return fn(*args)
            with self._bound():
                return fn(*args)
        except self._lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            kind = _ERROR_KINDS.get(code, NvmlError) if isinstance(code, int) else NvmlError
            if kind not in (NvmlNotSupported, NvmlInvalidArgument, NvmlNoPermission, NvmlTimeout):
                # A handle may not survive a reset or re-enumeration, whatever error says
                # so: look it up again by UUID next time (a slow answer says nothing of it).
                self._handles = {u: h for u, h in self._handles.items() if not (args and h is args[0])}
            raise kind(f"{name}: {exc}", code=code, call=name) from None

    def _handle(self, uuid: str) -> Any:
        handle = self._handles.get(uuid)
        if handle is None:
            try:
                handle = self._call("nvmlDeviceGetHandleByUUID", self._lib.nvmlDeviceGetHandleByUUID, uuid)
            except NvmlTimeout:
                raise  # a slow lookup is no sign the card is gone
            except NvmlError as exc:
                raise NvmlGpuLost(f"GPU {uuid} not found: {exc}", code=exc.code, call=exc.call) from None
            self._handles[uuid] = handle
        return handle

    # -- lifecycle ------------------------------------------------------------------
    def init(self) -> None:
        """``nvmlInit``. Raises NvmlNotInitialized with NVML's reason."""
        try:
            self._call("nvmlInit", self._lib.nvmlInit)
        except NvmlError as exc:
            raise NvmlNotInitialized(str(exc), code=exc.code, call="nvmlInit") from None

    def shutdown(self) -> None:
        """``nvmlShutdown``; errors are ignored (we are leaving anyway)."""
        try:
            with self._bound():
                self._lib.nvmlShutdown()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass

    def driver_version(self) -> str:
        v = self._call("nvmlSystemGetDriverVersion", self._lib.nvmlSystemGetDriverVersion)
        return v.decode() if isinstance(v, bytes) else str(v)

    # -- enumeration ----------------------------------------------------------------
    def devices(self, skip_errors: bool = False) -> list[GpuInfo]:
        """Enumerate physical GPUs in NVML's current index order. Limits unsupported on a
        card are None. ``skip_errors``: leave out a card that fails to answer (it is
        then looked for again later) instead of raising NvmlError."""
        out = []
        for index in range(self._call("nvmlDeviceGetCount", self._lib.nvmlDeviceGetCount)):
            try:
                out.append(self._device(index))
            except NvmlError:
                if not skip_errors:
                    raise
        return out

    def device(self, index: int) -> GpuInfo:
        """The GPU at NVML index ``index`` now, as :meth:`devices` enumerates it (limits in
        W). Raises NvmlError (NvmlGpuLost for a card off the bus)."""
        return self._device(index)

    def device_count(self) -> int:
        """``nvmlDeviceGetCount``: how many GPUs NVML sees now (a few microseconds)."""
        return int(self._call("nvmlDeviceGetCount", self._lib.nvmlDeviceGetCount))

    def _device(self, index: int) -> GpuInfo:
        lib = self._lib
        handle = self._call("nvmlDeviceGetHandleByIndex", lib.nvmlDeviceGetHandleByIndex, index)
        uuid = self._call("nvmlDeviceGetUUID", lib.nvmlDeviceGetUUID, handle)
        name = self._call("nvmlDeviceGetName", lib.nvmlDeviceGetName, handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        name = name.decode() if isinstance(name, bytes) else str(name)
        self._handles[uuid] = handle
        min_w: float | None
        max_w: float | None
        try:
            lo, hi = self._call(
                "nvmlDeviceGetPowerManagementLimitConstraints",
                lib.nvmlDeviceGetPowerManagementLimitConstraints,
                handle,
            )
            min_w, max_w = to_w(lo), to_w(hi)
        except NvmlNotSupported:
            min_w = max_w = None
        try:
            default_w = to_w(
                self._call(
                    "nvmlDeviceGetPowerManagementDefaultLimit",
                    lib.nvmlDeviceGetPowerManagementDefaultLimit,
                    handle,
                )
            )
        except NvmlNotSupported:
            default_w = None
        return GpuInfo(index, uuid, name, min_w, max_w, default_w, self._mig_mode(handle))

    def _mig_mode(self, handle: Any) -> bool | None:
        """MIG's current mode on a GPU; None where the card or the driver has none."""
        try:
            current, _pending = self._call("nvmlDeviceGetMigMode", self._lib.nvmlDeviceGetMigMode, handle)
        except NvmlNotSupported:
            return None
        except NvmlError as exc:
            if exc.code == _FUNCTION_NOT_FOUND:  # a driver older than MIG
                return None
            raise
        return bool(current)

    def _is_mig_device(self, uuid: str, handle: Any) -> bool:
        """Whether ``handle`` is a MIG device's (``nvmlDeviceIsMigDeviceHandle``); fixed
        per UUID, so asked once. A driver or card without MIG has none."""
        known = self._mig_devices.get(uuid)
        if known is None:
            try:
                known = bool(self._call("nvmlDeviceIsMigDeviceHandle", self._lib.nvmlDeviceIsMigDeviceHandle,
                                        handle).value)
            except NvmlNotSupported:
                known = False
            except NvmlError as exc:
                if exc.code != _FUNCTION_NOT_FOUND:
                    raise
                known = False
            self._mig_devices[uuid] = known
        return known

    # -- reads ----------------------------------------------------------------------
    def _optional(self, name: str, fn: Callable[..., int], handle: Any) -> float | None:
        try:
            return to_w(self._call(name, fn, handle))
        except NvmlNotSupported:
            return None

    def power_instant_w(self, uuid: str) -> float | None:
        """Field 186 in W; None where the card has no instant reading (known without a
        call: no handle is looked up for it)."""
        if uuid in self._instant_unsupported:
            return None
        return self._instant_w(uuid, self._handle(uuid))

    def _instant_w(self, uuid: str, handle: Any) -> float | None:
        if uuid in self._instant_unsupported:
            return None
        values = self._call(
            "nvmlDeviceGetFieldValues",
            self._lib.nvmlDeviceGetFieldValues,
            handle,
            _INSTANT_FIELDS,
        )
        value = values[0]
        ret = _member(value, "nvmlReturn")
        if ret == 3:  # NOT_SUPPORTED: remember, so we stop asking
            self._instant_unsupported.add(uuid)
            return None
        if ret != 0:
            kind = _ERROR_KINDS.get(ret, NvmlError)
            raise kind(f"field {FI_DEV_POWER_INSTANT}: NVML return {ret}", code=ret, call="field186")
        raw = getattr(_member(value, "value"), _VALUE_FIELDS.get(_member(value, "valueType"), "uiVal"))
        return to_w(raw)

    def read(self, uuid: str) -> PowerReading:
        """Read draw and limits of one card. Raises NvmlGpuLost, NvmlError on failure."""
        lib = self._lib
        handle = self._handle(uuid)
        return PowerReading(
            power_avg_w=self._optional("nvmlDeviceGetPowerUsage", lib.nvmlDeviceGetPowerUsage, handle),
            power_instant_w=self._instant_w(uuid, handle),
            requested_limit_w=self._optional(
                "nvmlDeviceGetPowerManagementLimit", lib.nvmlDeviceGetPowerManagementLimit, handle
            ),
            enforced_limit_w=self._optional(
                "nvmlDeviceGetEnforcedPowerLimit", lib.nvmlDeviceGetEnforcedPowerLimit, handle
            ),
        )

    def energy_j(self, uuid: str) -> float | None:
        """``nvmlDeviceGetTotalEnergyConsumption`` in J since driver load; None if unsupported."""
        lib = self._lib
        try:
            mj = self._call(
                "nvmlDeviceGetTotalEnergyConsumption",
                lib.nvmlDeviceGetTotalEnergyConsumption,
                self._handle(uuid),
            )
        except NvmlNotSupported:
            return None
        return to_j(mj)

    def persistence_mode(self, uuid: str) -> bool | None:
        """Whether persistence mode is on; None where unsupported (e.g. Windows)."""
        lib = self._lib
        try:
            return bool(
                self._call("nvmlDeviceGetPersistenceMode", lib.nvmlDeviceGetPersistenceMode, self._handle(uuid))
            )
        except NvmlNotSupported:
            return None

    # -- raw answers (probe --compare-sim) ---------------------------------------------
    def raw_answers(self, uuid: str) -> list[dict[str, Any]]:
        """Each read-only call the daemon relies on, answered as the bindings give it.

        Returns one dict per call: ``call``, ``unit`` and either ``type`` (the Python
        type of the answer) and ``value`` (NVML's own units: mW, mJ), or ``error`` (the
        ``NVML_ERROR_*`` name). Field values add ``value_type`` (``nvmlValueType_t``).
        Writes nothing.
        """
        lib = self._lib
        handle = self._handle(uuid)
        errors = {v: k for k, v in vars(lib).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)}
        out: list[dict[str, Any]] = []

        def answer(call: str, unit: str, fn: Callable[[], Any]) -> dict[str, Any]:
            row: dict[str, Any] = {"call": call, "unit": unit}
            try:
                with self._bound():
                    value = fn()
            except lib.NVMLError as exc:
                row["error"] = errors.get(exc.value, f"code {exc.value}")
                return row
            row.update(type=type(value).__name__, value=value)
            return row

        for call, unit in RAW_READS:
            out.append(answer(call, unit, functools.partial(getattr(lib, call), handle)))
        for field_id, unit in RAW_FIELDS:
            row = answer(f"nvmlDeviceGetFieldValues[{field_id}]", unit,
                         functools.partial(_first_field, lib, handle, field_id))
            fv = row.pop("value", None)
            if fv is not None:
                ret = int(fv.nvmlReturn)
                if ret:
                    row = {"call": row["call"], "unit": unit, "error": errors.get(ret, f"code {ret}")}
                else:
                    member = _VALUE_FIELDS.get(int(fv.valueType), "uiVal")
                    value = getattr(fv.value, member)
                    row.update(type=type(value).__name__, value=value, value_type=f"{int(fv.valueType)} ({member})")
            out.append(row)
        return out

    # -- writes ---------------------------------------------------------------------
    def set_persistence_mode(self, uuid: str, enabled: bool) -> None:
        """``nvmlDeviceSetPersistenceMode`` (root, Linux only): keeps the driver loaded,
        and with it the power limits, while no process holds the card.

        Raises NvmlNoPermission, NvmlNotSupported, NvmlGpuLost or NvmlError.
        """
        self._call(
            "nvmlDeviceSetPersistenceMode",
            self._lib.nvmlDeviceSetPersistenceMode,
            self._handle(uuid),
            1 if enabled else 0,  # NVML_FEATURE_ENABLED / NVML_FEATURE_DISABLED
        )

    def set_power_limit(self, uuid: str, limit_w: float) -> None:
        """``nvmlDeviceSetPowerManagementLimit`` (root or CAP_SYS_ADMIN).

        Only ever on a parent GPU: a MIG device's UUID raises NvmlInvalidArgument and
        nothing is sent. Raises NvmlNoPermission, NvmlInvalidArgument (outside
        constraints, a MIG device), NvmlNotSupported, NvmlGpuLost or NvmlError.
        """
        handle = self._handle(uuid)
        if self._is_mig_device(uuid, handle):
            raise NvmlInvalidArgument(f"{uuid} is a MIG device: power limits are set on its parent GPU only",
                                      call="nvmlDeviceSetPowerManagementLimit")
        self._call("nvmlDeviceSetPowerManagementLimit", self._lib.nvmlDeviceSetPowerManagementLimit, handle,
                   to_mw(limit_w))
