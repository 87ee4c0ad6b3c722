"""A stand-in for ``libnvidia-ml.so`` over a :class:`~powerbudgetd_sim.physics.SimBank`.

The real bindings (``nvidia-ml-py``, module ``pynvml``) look every NVML C function up by
symbol name on the library object ``pynvml.nvmlLib`` and call it with ctypes. Here each
symbol the product uses is a ``ctypes.CFUNCTYPE`` declared with the C signature from
``nvml.h`` (in the bindings' own types: ``c_nvmlDevice_t``, ``c_nvmlFieldValue_t``...):
out-parameters are written through their pointers and an ``nvmlReturn_t`` code is
returned, so the unchanged bindings run exactly as over the driver's library, with their
argument conversion, structs, versioned names (``_v2``) and error classes.

Several simulated banks may live in one process (tests, ``simulate --policy all``), but
the bindings keep one library and one function-pointer cache per process. So one
:class:`_Dispatcher` is installed as ``pynvml.nvmlLib``; each call is routed to the
:class:`SimNvmlLibrary` the calling thread has bound (the NVML layer binds its library
around every call), and every device handle encodes the library that issued it, so a
handle used against another bank is refused (``INVALID_ARGUMENT``), never misread.

Scripted faults (:class:`Fault`) make chosen calls return chosen error codes, answer
late, or hang, on chosen cards at chosen times; cards come onto and fall off the bus and
are re-indexed as the bank's events say (:meth:`SimBank.visible`).

The library is thread-safe, as NVML is: the NVML layer holds no lock of its own (a hung
call must not stall the other cards' calls), so one lock here serialises every call's
access to the simulated bank, and the real-time sleeps of a slow NVML or a ``SLOW``
fault are taken outside it.
"""

from __future__ import annotations

import contextvars
import ctypes
import itertools
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from powerbudgetd_sim.physics import SimBank, SimCard

from powerbudgetd.hw.nvml import load_pynvml

_nv = load_pynvml()  # for the bindings' own ctypes types and constants only

# nvmlReturn_t (nvml.h)
NVML_SUCCESS = 0
ERROR_CODES = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "LIB_RM_VERSION_MISMATCH": 18,
    "UNKNOWN": 999,
}
_ERROR_STRINGS = {  # what nvmlErrorString answers (the driver's wording)
    0: "Success", 1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported",
    4: "Insufficient Permissions", 6: "Not Found", 7: "Insufficient Size",
    9: "Driver Not Loaded", 10: "Timeout", 12: "NVML Shared Library Not Found",
    13: "Function Not Found", 15: "GPU is lost", 16: "GPU requires restart",
    18: "RM has detected an NVML/RM version mismatch.", 999: "Unknown Error",
}

# Field ids (nvml.h NVML_FI_DEV_*) the simulator answers, and in which union member.
FI_POWER_AVERAGE, FI_POWER_INSTANT = 185, 186
FI_MIN_LIMIT, FI_MAX_LIMIT, FI_DEFAULT_LIMIT, FI_CURRENT_LIMIT = 187, 188, 189, 190
FI_ENERGY, FI_REQUESTED_LIMIT = 191, 192
VALUE_TYPE_UNSIGNED_INT = _nv.NVML_VALUE_TYPE_UNSIGNED_INT  # 1, value.uiVal
VALUE_TYPE_UNSIGNED_LONG_LONG = _nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG  # 3, value.ullVal

# -- the C signatures (nvml.h), in the bindings' types ---------------------------------
_ret = _nv._nvmlReturn_t
_dev = _nv.c_nvmlDevice_t
_uint, _p_uint = ctypes.c_uint, ctypes.POINTER(ctypes.c_uint)
_p_ull = ctypes.POINTER(ctypes.c_ulonglong)
_p_char = ctypes.POINTER(ctypes.c_char)  # a char buffer the library writes into
_enable = _nv._nvmlEnableState_t

SIGNATURES: dict[str, Any] = {
    # nvmlReturn_t nvmlInitWithFlags(unsigned int flags) / nvmlInit_v2(void) / nvmlShutdown(void)
    "nvmlInitWithFlags": ctypes.CFUNCTYPE(_ret, _uint),
    "nvmlInit_v2": ctypes.CFUNCTYPE(_ret),
    "nvmlShutdown": ctypes.CFUNCTYPE(_ret),
    # const char* nvmlErrorString(nvmlReturn_t): declared void* (same ABI) because a
    # Python callback cannot return char* safely; the bindings set restype = c_char_p.
    "nvmlErrorString": ctypes.CFUNCTYPE(ctypes.c_void_p, _ret),
    "nvmlSystemGetDriverVersion": ctypes.CFUNCTYPE(_ret, _p_char, _uint),
    "nvmlDeviceGetCount_v2": ctypes.CFUNCTYPE(_ret, _p_uint),
    "nvmlDeviceGetHandleByIndex_v2": ctypes.CFUNCTYPE(_ret, _uint, ctypes.POINTER(_dev)),
    "nvmlDeviceGetHandleByUUID": ctypes.CFUNCTYPE(_ret, ctypes.c_char_p, ctypes.POINTER(_dev)),
    "nvmlDeviceGetUUID": ctypes.CFUNCTYPE(_ret, _dev, _p_char, _uint),
    "nvmlDeviceGetName": ctypes.CFUNCTYPE(_ret, _dev, _p_char, _uint),
    "nvmlDeviceGetPowerManagementLimitConstraints": ctypes.CFUNCTYPE(_ret, _dev, _p_uint, _p_uint),
    "nvmlDeviceGetPowerManagementDefaultLimit": ctypes.CFUNCTYPE(_ret, _dev, _p_uint),
    "nvmlDeviceGetPowerManagementLimit": ctypes.CFUNCTYPE(_ret, _dev, _p_uint),
    "nvmlDeviceGetEnforcedPowerLimit": ctypes.CFUNCTYPE(_ret, _dev, _p_uint),
    "nvmlDeviceGetPowerUsage": ctypes.CFUNCTYPE(_ret, _dev, _p_uint),
    # nvmlFieldValue_t *values: the bindings pass byref(an array), which a typed
    # POINTER(c_nvmlFieldValue_t) parameter refuses; void* is the same ABI.
    "nvmlDeviceGetFieldValues": ctypes.CFUNCTYPE(_ret, _dev, ctypes.c_int, ctypes.c_void_p),
    "nvmlDeviceGetTotalEnergyConsumption": ctypes.CFUNCTYPE(_ret, _dev, _p_ull),
    "nvmlDeviceGetPersistenceMode": ctypes.CFUNCTYPE(_ret, _dev, ctypes.POINTER(_enable)),
    "nvmlDeviceSetPersistenceMode": ctypes.CFUNCTYPE(_ret, _dev, _enable),
    "nvmlDeviceSetPowerManagementLimit": ctypes.CFUNCTYPE(_ret, _dev, _uint),
    "nvmlDeviceGetMigMode": ctypes.CFUNCTYPE(_ret, _dev, _p_uint, _p_uint),
    "nvmlDeviceIsMigDeviceHandle": ctypes.CFUNCTYPE(_ret, _dev, _p_uint),
    "nvmlDeviceGetMaxMigDeviceCount": ctypes.CFUNCTYPE(_ret, _dev, _p_uint),
    "nvmlDeviceGetMigDeviceHandleByIndex": ctypes.CFUNCTYPE(_ret, _dev, _uint, ctypes.POINTER(_dev)),
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": ctypes.CFUNCTYPE(_ret, _dev, ctypes.POINTER(_dev)),
    "nvmlDeviceGetCurrentClocksEventReasons": ctypes.CFUNCTYPE(_ret, _dev, _p_ull),
}
"""Every C symbol the simulator serves, with its ``nvml.h`` prototype."""


def api_name(symbol: str) -> str:
    """The API name of a C symbol, as faults name calls: versions and flags dropped
    (``nvmlDeviceGetCount_v2`` -> ``nvmlDeviceGetCount``, ``nvmlInitWithFlags`` -> ``nvmlInit``)."""
    name = re.sub(r"_v\d+$", "", symbol)
    return "nvmlInit" if name == "nvmlInitWithFlags" else name


_API = {symbol: api_name(symbol) for symbol in SIGNATURES}
_DEVICE_SYMBOLS = frozenset(s for s, proto in SIGNATURES.items() if proto._argtypes_[:1] == (_dev,))
API_NAMES = frozenset(_API.values())


@dataclass(frozen=True)
class Fault:
    """Make ``call`` return NVML error ``error`` (a name from ``ERROR_CODES``); or with
    ``error = "SLOW"`` answer normally after ``delay_s`` real seconds (a hang on the wall
    clock; other cards' calls go on meanwhile); or with ``error = "HANG"`` hang
    ``delay_s`` seconds of bank time: on virtual time the caller's deadline passes at
    once (``NVML_ERROR_TIMEOUT``), every call on that card times out until the hang ends
    (as the daemon refuses calls on a card whose call it abandoned), and a limit write still lands when the
    hung call would have returned.

    ``call``: an NVML API name such as ``nvmlDeviceSetPowerManagementLimit`` (a versioned
    symbol such as ``nvmlDeviceGetCount_v2`` is accepted), or ``*`` for every call.
    ``card``: a card index, or None for every card and for calls without a card
    (``nvmlInit``). Active while ``from_s <= t < until_s`` in bank time; ``count`` limits
    it to the first N matching calls.
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
        if self.error in ("SLOW", "HANG") and not self.delay_s > 0:
            raise ValueError(f"a {self.error} fault needs delay_s > 0, got {self.delay_s!r}")
        if self.call != "*" and api_name(self.call) not in API_NAMES:
            raise ValueError(f"fault call {self.call!r} is not '*' nor one of {', '.join(sorted(API_NAMES))}")


class _Return(Exception):
    """Leave a stand-in early with an ``nvmlReturn_t`` code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Hung(_Return):
    """A HANG fault: the call missed the caller's deadline (``TIMEOUT``); it would have
    returned ``hang_s`` s of bank time after ``now``."""

    def __init__(self, card: SimCard | None, now: float, hang_s: float) -> None:
        super().__init__(ERROR_CODES["TIMEOUT"])
        self.card, self.now, self.hang_s = card, now, hang_s


# -- routing: one dispatcher per process, one library per bank -------------------------
_BOUND: contextvars.ContextVar[SimNvmlLibrary | None] = contextvars.ContextVar("powerbudgetd_sim_nvml", default=None)
_library_ids = itertools.count(1)
_HANDLE_SHIFT = 20  # handle = library id << 20 | (card index + 1) << 4 | MIG index + 1 (0: the GPU)
# Calls a MIG device handle answers; every other call on one is NOT_SUPPORTED (power
# limits belong to the parent GPU).
_MIG_CALLS = frozenset({"nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceIsMigDeviceHandle",
                        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle"})


class _Binding:
    """Route the calling context's NVML calls to ``library`` (a plain class: it runs
    around every call)."""

    __slots__ = ("library", "token")

    def __init__(self, library: SimNvmlLibrary) -> None:
        self.library = library

    def __enter__(self) -> None:
        self.token = _BOUND.set(self.library)

    def __exit__(self, *exc: object) -> None:
        _BOUND.reset(self.token)


class _Dispatcher:
    """Installed as ``pynvml.nvmlLib``: each attribute is a C function (a CFUNCTYPE with
    the symbol's prototype) that calls the library bound in the calling context.

    A symbol the simulator does not serve is missing here as it would be from an older
    driver's library: the bindings answer ``NVML_ERROR_FUNCTION_NOT_FOUND``. Calls made
    with no simulated library bound go to ``real`` (the driver's library, when the process
    had loaded it before the simulator attached), else answer ``LIBRARY_NOT_FOUND``.
    """

    def __init__(self, real: Any) -> None:
        self._real = real
        self._functions: dict[str, Any] = {}  # keeps each callback alive

    def __getattr__(self, symbol: str) -> Any:
        if symbol.startswith("_") or symbol not in SIGNATURES:
            raise AttributeError(symbol)
        fn = self._functions.get(symbol)
        if fn is None:
            fn = self._functions[symbol] = SIGNATURES[symbol](self._route(symbol))
        return fn

    def _route(self, symbol: str) -> Callable[..., int]:
        def routed(*args: Any) -> int:
            return _serve(symbol, args)

        def _serve(symbol: str, args: tuple[Any, ...]) -> int:
            lib = _BOUND.get()
            if lib is not None:
                return lib.serve(symbol, args)
            if self._real is None:
                return ERROR_CODES["LIBRARY_NOT_FOUND"]
            try:
                return int(getattr(self._real, symbol)(*args))
            except AttributeError:
                return ERROR_CODES["FUNCTION_NOT_FOUND"]

        routed.__name__ = symbol
        return routed


_attach_lock = threading.Lock()

# Ctrl-C inside a ctypes callback cannot become a KeyboardInterrupt there: ctypes prints
# "Exception ignored" and the C caller goes on (or crashes). While a callback runs, the
# SIGINT handler below only notes the interrupt; check_interrupt() raises it later from
# ordinary Python code (the simulation loop calls it every tick). "While a callback runs"
# is read from the interrupted frame's stack, not from a counter the callback keeps: a
# signal can be handled at the callback's first line, before any counter moved (a CI
# failure: "Exception ignored ... routed", then SIGSEGV).
# Every callback is a closure of one function: its code object marks a callback's frame.
_ROUTED_CODE = next(c for c in _Dispatcher._route.__code__.co_consts if getattr(c, "co_name", "") == "routed")
_interrupt_pending = False


def _in_callback(frame: Any) -> bool:
    """Whether ``frame`` or any frame below it is a simulated NVML call's callback."""
    while frame is not None:
        if frame.f_code is _ROUTED_CODE:
            return True
        frame = frame.f_back
    return False


def on_sigint(signum: int, frame: Any) -> None:
    """A SIGINT handler (install with ``signal.signal``): KeyboardInterrupt at once,
    or, inside a simulated NVML call, at the next :func:`check_interrupt`."""
    global _interrupt_pending
    if _in_callback(frame):
        _interrupt_pending = True
        return
    raise KeyboardInterrupt


def check_interrupt() -> None:
    """Raise the KeyboardInterrupt that :func:`on_sigint` deferred, if any."""
    global _interrupt_pending
    if _interrupt_pending:
        _interrupt_pending = False
        raise KeyboardInterrupt


def attach(module: Any) -> None:
    """Make the bindings ``module`` resolve NVML's C symbols through the dispatcher
    (once per process; idempotent). A driver library already loaded stays reachable for
    calls made outside any simulated library."""
    with _attach_lock, module.libLoadLock:
        if isinstance(module.nvmlLib, _Dispatcher):
            return
        module.nvmlLib = _Dispatcher(module.nvmlLib)
        module._nvmlGetFunctionPointer_cache.clear()  # pointers into the old library


class SimNvmlLibrary:
    """NVML's C functions over one simulated bank; pass it to :class:`~powerbudgetd.hw.nvml.Nvml`.

    Each method named like a C symbol receives that symbol's C arguments (pointers as
    ctypes pointers) and returns an ``nvmlReturn_t``. ``calls`` counts calls served;
    ``call_delay_s`` makes every call sleep (a slow NVML); ``internal_errors`` holds any
    exception a stand-in raised (answered as ``NVML_ERROR_UNKNOWN``; a test should find
    it empty).
    """

    def __init__(self, bank: SimBank, faults: list[Fault] | None = None, driver: str = "580.sim") -> None:
        self.bank = bank
        self.faults = list(faults or [])
        self._fault_hits: dict[int, int] = {}
        self._init_count = 0  # NVML counts nvmlInit calls; each nvmlShutdown undoes one
        self._driver = driver
        self.calls = 0
        self.call_delay_s = 0.0
        self.internal_errors: list[BaseException] = []
        self._id = next(_library_ids)
        self._error_strings = {code: ctypes.create_string_buffer(s.encode()) for code, s in _ERROR_STRINGS.items()}
        self._lock = threading.RLock()  # one call at a time on the bank (see the module docstring)
        self._hung_until: dict[int, float] = {}  # card position -> bank time its HANG ends
        self.mig_writes: list[tuple[str, int]] = []  # (MIG UUID, mW): limit writes sent to a MIG handle

    @property
    def initialized(self) -> bool:
        """Whether ``nvmlInit`` calls outnumber ``nvmlShutdown`` calls."""
        return self._init_count > 0

    # -- the NvmlLibrary protocol of powerbudgetd.hw.nvml ------------------------------
    def attach(self, module: ModuleType) -> None:
        attach(module)

    def bound(self) -> _Binding:
        return _Binding(self)

    # -- plumbing -------------------------------------------------------------------
    def serve(self, symbol: str, args: tuple[Any, ...]) -> int:
        """Answer one C call; never raises (an exception must not cross into C).

        Real-time sleeps (``call_delay_s``, ``SLOW`` faults) come first, outside the
        lock, so a call hung on one card holds up no other; the answer is then computed
        under the lock."""
        try:
            delay_s = self.call_delay_s
            if self.faults:
                delay_s += self._slow_s(symbol, args)
            if delay_s:
                time.sleep(delay_s)
            with self._lock:
                self.calls += 1
                return int(getattr(self, symbol)(*args))
        except _Return as r:
            return r.code
        except BaseException as exc:  # noqa: BLE001 - a callback must return a code
            self.internal_errors.append(exc)
            return ERROR_CODES["UNKNOWN"]

    def handle_of(self, card: SimCard, mig: int | None = None) -> int:
        """The opaque ``nvmlDevice_t`` value of ``card``, or of its MIG device ``mig`` (an
        address that is never dereferenced)."""
        return self._id << _HANDLE_SHIFT | (card.index + 1) << 4 | (0 if mig is None else mig + 1)

    @staticmethod
    def mig_uuid(card: SimCard, mig: int) -> str:
        """The UUID of MIG device ``mig`` of ``card``."""
        return f"MIG-{card.spec.uuid.removeprefix('GPU-')}-{mig}"

    def _matching(self, call: str, card: SimCard | None, now: float, slow: bool) -> list[Fault]:
        """The faults that fire on this call (their hits counted): every SLOW one, or the
        first of the others."""
        index = card.index if card is not None else None
        out = []
        for i, f in enumerate(self.faults):
            if (f.error == "SLOW") != slow or (f.call != "*" and api_name(f.call) != call):
                continue
            if not f.from_s <= now < f.until_s or (f.card is not None and f.card != index):
                continue
            hits = self._fault_hits.get(i, 0)
            if f.count is not None and hits >= f.count:
                continue
            self._fault_hits[i] = hits + 1
            out.append(f)
            if not slow:
                break  # the first error fault answers the call; later ones keep their hits
        return out

    def _slow_s(self, symbol: str, args: tuple[Any, ...]) -> float:
        """Real seconds this call sleeps for SLOW faults (a card's faults need its handle)."""
        with self._lock:
            card = self._decode(args[0])[0] if symbol in _DEVICE_SYMBOLS else None
            return sum(f.delay_s for f in self._matching(_API[symbol], card, self.bank.time(), slow=True))

    def _enter(self, symbol: str, card: SimCard | None = None) -> float:
        call = _API[symbol]
        now = self.bank.time()
        if card is not None:
            if not card.present:  # off the bus: its handle is stale
                raise _Return(ERROR_CODES["GPU_IS_LOST"])
            if now < self._hung_until.get(card.index, -math.inf):
                # The hung call still holds the card: every call on it misses its
                # deadline too (as the daemon refuses them, on the wall clock).
                raise _Return(ERROR_CODES["TIMEOUT"])
        for f in self._matching(call, card, now, slow=False):
            if f.error == "HANG":
                if card is not None:
                    self._hung_until[card.index] = now + f.delay_s
                raise _Hung(card, now, f.delay_s)
            raise _Return(ERROR_CODES[f.error])
        if call != "nvmlInit" and self._init_count == 0:
            raise _Return(ERROR_CODES["UNINITIALIZED"])
        return now

    def _decode(self, device: Any) -> tuple[SimCard | None, int | None]:
        """The card a device handle of this library names (None: NULL, foreign, bad) and
        the MIG device of it the handle names (None: the GPU itself)."""
        try:
            address = ctypes.addressof(device.contents)  # the handle's value (cheaper than cast)
        except ValueError:  # NULL
            return None, None
        index = ((address & ((1 << _HANDLE_SHIFT) - 1)) >> 4) - 1
        mig = (address & 0xF) - 1
        if address >> _HANDLE_SHIFT != self._id or not 0 <= index < len(self.bank.cards):
            return None, None
        card = self.bank.cards[index]
        if mig >= card.spec.mig_devices:
            return None, None
        return card, None if mig < 0 else mig

    def _card(self, symbol: str, device: Any) -> tuple[SimCard, float]:
        """The card behind a GPU handle (after faults), or INVALID_ARGUMENT; a MIG device
        handle answers NOT_SUPPORTED (see :meth:`_device`)."""
        card, mig, now = self._device(symbol, device)
        if mig is not None:
            raise _Return(ERROR_CODES["NOT_SUPPORTED"])
        return card, now

    def _device(self, symbol: str, device: Any) -> tuple[SimCard, int | None, float]:
        """The card and MIG index (None: the GPU) behind a handle, after faults; a MIG
        handle in a call it does not answer is NOT_SUPPORTED."""
        card, mig = self._decode(device)
        if card is None:
            self._enter(symbol)  # init state and global faults still apply
            raise _Return(ERROR_CODES["INVALID_ARGUMENT"])
        now = self._enter(symbol, card)
        if mig is not None and _API[symbol] not in _MIG_CALLS:
            raise _Return(ERROR_CODES["NOT_SUPPORTED"])
        return card, mig, now

    def _visible(self) -> list[SimCard]:
        """The NVIDIA cards on the bus in NVML's order (a mixed bank's others are the
        hwmon tree's: powerbudgetd_sim.hwmon)."""
        return [c for c in self.bank.visible() if c.spec.vendor == "nvidia"]

    @staticmethod
    def _write_string(buffer: Any, length: int, text: str) -> None:
        data = text.encode() + b"\0"
        if not buffer or len(data) > length:
            raise _Return(ERROR_CODES["INSUFFICIENT_SIZE"])
        ctypes.memmove(buffer, data, len(data))

    @staticmethod
    def _out(pointer: Any, value: int) -> int:
        if not pointer:
            return ERROR_CODES["INVALID_ARGUMENT"]
        pointer[0] = value
        return NVML_SUCCESS

    # -- lifecycle ------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: int) -> int:
        self._enter("nvmlInitWithFlags")
        self._init_count += 1
        return NVML_SUCCESS

    def nvmlInit_v2(self) -> int:
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> int:
        if self._init_count == 0:
            return ERROR_CODES["UNINITIALIZED"]
        self._init_count -= 1
        return NVML_SUCCESS

    def nvmlErrorString(self, code: int) -> int:
        buffer = self._error_strings.get(code) or self._error_strings[ERROR_CODES["UNKNOWN"]]
        return ctypes.addressof(buffer)

    def nvmlSystemGetDriverVersion(self, version: Any, length: int) -> int:
        self._enter("nvmlSystemGetDriverVersion")
        self._write_string(version, length, self._driver)
        return NVML_SUCCESS

    # -- enumeration ----------------------------------------------------------------
    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        self._enter("nvmlDeviceGetCount_v2")
        return self._out(count, len(self._visible()))  # the cards on the bus now

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, device: Any) -> int:
        self._enter("nvmlDeviceGetHandleByIndex_v2")
        visible = self._visible()  # NVML's current index order
        if not 0 <= index < len(visible) or not device:
            return ERROR_CODES["INVALID_ARGUMENT"]
        device[0] = ctypes.cast(self.handle_of(visible[index]), _dev)
        return NVML_SUCCESS

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes | None, device: Any) -> int:
        self._enter("nvmlDeviceGetHandleByUUID")
        if uuid is None or not device:
            return ERROR_CODES["INVALID_ARGUMENT"]
        for card in self._visible():
            migs = [i for i in range(card.spec.mig_devices) if self.mig_uuid(card, i).encode() == uuid]
            if card.spec.uuid.encode() == uuid or migs:
                self._enter("nvmlDeviceGetHandleByUUID", card)  # a lost card stays lost
                device[0] = ctypes.cast(self.handle_of(card, migs[0] if migs else None), _dev)
                return NVML_SUCCESS
        return ERROR_CODES["NOT_FOUND"]

    def nvmlDeviceGetUUID(self, device: Any, uuid: Any, length: int) -> int:
        card, mig, _ = self._device("nvmlDeviceGetUUID", device)
        self._write_string(uuid, length, card.spec.uuid if mig is None else self.mig_uuid(card, mig))
        return NVML_SUCCESS

    def nvmlDeviceGetName(self, device: Any, name: Any, length: int) -> int:
        card, mig, _ = self._device("nvmlDeviceGetName", device)
        self._write_string(name, length, card.spec.name if mig is None else f"{card.spec.name} MIG {mig}")
        return NVML_SUCCESS

    @staticmethod
    def _reported_mw(card: SimCard) -> tuple[int, int]:
        spec = card.spec
        lo = card.min_mw if spec.reported_min_w is None else round(spec.reported_min_w * 1000)
        hi = card.max_mw if spec.reported_max_w is None else round(spec.reported_max_w * 1000)
        return lo, hi

    def nvmlDeviceGetPowerManagementLimitConstraints(self, device: Any, min_limit: Any, max_limit: Any) -> int:
        card, _ = self._card("nvmlDeviceGetPowerManagementLimitConstraints", device)
        if not min_limit or not max_limit:
            return ERROR_CODES["INVALID_ARGUMENT"]
        min_limit[0], max_limit[0] = self._reported_mw(card)
        return NVML_SUCCESS

    def nvmlDeviceGetPowerManagementDefaultLimit(self, device: Any, limit: Any) -> int:
        card, _ = self._card("nvmlDeviceGetPowerManagementDefaultLimit", device)
        return self._out(limit, card.default_mw)

    def nvmlDeviceGetPersistenceMode(self, device: Any, mode: Any) -> int:
        card, _ = self._card("nvmlDeviceGetPersistenceMode", device)
        return self._out(mode, int(card.persistence_mode))

    def nvmlDeviceGetMigMode(self, device: Any, current: Any, pending: Any) -> int:
        card, _ = self._card("nvmlDeviceGetMigMode", device)
        if not current or not pending:
            return ERROR_CODES["INVALID_ARGUMENT"]
        on = card.spec.mig_devices > 0
        current[0] = pending[0] = _nv.NVML_DEVICE_MIG_ENABLE if on else _nv.NVML_DEVICE_MIG_DISABLE
        return NVML_SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, device: Any, is_mig: Any) -> int:
        _, mig, _ = self._device("nvmlDeviceIsMigDeviceHandle", device)
        return self._out(is_mig, int(mig is not None))

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any, count: Any) -> int:
        card, _ = self._card("nvmlDeviceGetMaxMigDeviceCount", device)
        return self._out(count, card.spec.mig_devices)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int, mig_device: Any) -> int:
        card, _ = self._card("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not 0 <= index < card.spec.mig_devices or not mig_device:
            return ERROR_CODES["INVALID_ARGUMENT"] if card.spec.mig_devices else ERROR_CODES["NOT_SUPPORTED"]
        mig_device[0] = ctypes.cast(self.handle_of(card, index), _dev)
        return NVML_SUCCESS

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig_device: Any, device: Any) -> int:
        card, mig, _ = self._device("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig_device)
        if mig is None or not device:
            return ERROR_CODES["INVALID_ARGUMENT"]
        device[0] = ctypes.cast(self.handle_of(card), _dev)
        return NVML_SUCCESS

    # -- reads ----------------------------------------------------------------------
    def nvmlDeviceGetPowerUsage(self, device: Any, power: Any) -> int:
        card, now = self._card("nvmlDeviceGetPowerUsage", device)
        return self._out(power, card.reported_avg_mw(now))

    def _field(self, card: SimCard, now: float, field_id: int) -> tuple[int, int, int]:
        """(nvmlReturn, valueType, value) of one field."""
        uint = VALUE_TYPE_UNSIGNED_INT
        if field_id in (FI_POWER_INSTANT, FI_POWER_AVERAGE):
            if not card.spec.has_instant:  # cards before these fields existed
                return ERROR_CODES["NOT_SUPPORTED"], 0, 0
            if field_id == FI_POWER_INSTANT:
                return NVML_SUCCESS, uint, card.reported_instant_mw(now)
            return NVML_SUCCESS, uint, card.reported_avg_mw(now)
        lo, hi = self._reported_mw(card)
        limits = {FI_MIN_LIMIT: lo, FI_MAX_LIMIT: hi, FI_DEFAULT_LIMIT: card.default_mw,
                  FI_CURRENT_LIMIT: card.enforced_mw(now), FI_REQUESTED_LIMIT: card.requested(now)}
        if field_id in limits:
            return NVML_SUCCESS, uint, limits[field_id]
        if field_id == FI_ENERGY:
            return NVML_SUCCESS, VALUE_TYPE_UNSIGNED_LONG_LONG, int(card.energy_mj)
        return ERROR_CODES["NOT_SUPPORTED"], 0, 0

    def nvmlDeviceGetFieldValues(self, device: Any, count: int, values: Any) -> int:
        card, now = self._card("nvmlDeviceGetFieldValues", device)
        if count < 0 or (count and not values):
            return ERROR_CODES["INVALID_ARGUMENT"]
        array = ctypes.cast(values, ctypes.POINTER(_nv.c_nvmlFieldValue_t))
        stamp_us = int(now * 1e6)
        for i in range(count):
            v = array[i]
            ret, value_type, raw = self._field(card, now, int(v.fieldId))
            v.nvmlReturn, v.valueType, v.timestamp, v.latencyUsec = ret, value_type, stamp_us, 0
            if ret == NVML_SUCCESS:
                if value_type == VALUE_TYPE_UNSIGNED_LONG_LONG:
                    v.value.ullVal = raw
                else:
                    v.value.uiVal = raw
        return NVML_SUCCESS

    def nvmlDeviceGetPowerManagementLimit(self, device: Any, limit: Any) -> int:
        card, now = self._card("nvmlDeviceGetPowerManagementLimit", device)
        return self._out(limit, card.requested(now))

    def nvmlDeviceGetEnforcedPowerLimit(self, device: Any, limit: Any) -> int:
        card, now = self._card("nvmlDeviceGetEnforcedPowerLimit", device)
        return self._out(limit, card.enforced_mw(now))

    def nvmlDeviceGetTotalEnergyConsumption(self, device: Any, energy: Any) -> int:
        card, _ = self._card("nvmlDeviceGetTotalEnergyConsumption", device)
        return self._out(energy, int(card.energy_mj))

    def nvmlDeviceGetCurrentClocksEventReasons(self, device: Any, reasons: Any) -> int:
        card, now = self._card("nvmlDeviceGetCurrentClocksEventReasons", device)
        # SW power cap (0x4) while the 1 s mean sits at the enforced limit, as measured.
        capped = card.avg_w * 1000 >= 0.97 * card.enforced_mw(now)
        return self._out(reasons, _nv.nvmlClocksEventReasonSwPowerCap if capped else 0)

    # -- writes ---------------------------------------------------------------------
    def nvmlDeviceSetPersistenceMode(self, device: Any, mode: int) -> int:
        card, _ = self._card("nvmlDeviceSetPersistenceMode", device)
        if mode not in (0, 1):
            return ERROR_CODES["INVALID_ARGUMENT"]
        card.persistence_mode = bool(mode)
        return NVML_SUCCESS

    def nvmlDeviceSetPowerManagementLimit(self, device: Any, limit_mw: int) -> int:
        target, mig = self._decode(device)
        if target is not None and mig is not None:  # recorded for the tests: this must never happen
            self.mig_writes.append((self.mig_uuid(target, mig), limit_mw))
        try:
            card, now = self._card("nvmlDeviceSetPowerManagementLimit", device)
        except _Hung as hung:  # the caller gave up; the write lands when the hung call returns
            c = hung.card
            if c is not None and c.min_mw <= limit_mw <= c.max_mw and not c.spec.ignores_writes:
                c.set_limit(hung.now, limit_mw, delay_s=hung.hang_s)
            raise
        if card.spec.ignores_writes:  # "success", and nothing changes
            card.set_limit(now, limit_mw)
            return NVML_SUCCESS
        if not card.min_mw <= limit_mw <= card.max_mw:
            return ERROR_CODES["INVALID_ARGUMENT"]
        card.set_limit(now, limit_mw)
        self.bank.save_state()
        return NVML_SUCCESS
