"""Conformance: every pynvml function the NVML layer calls reaches a C symbol the
simulator serves, with a prototype the installed bindings' arguments fit.

The list of functions is read from the NVML layer's source, so a new call there is
covered (or fails here) without editing this file's list by hand; the C symbols are the
ones the installed ``nvidia-ml-py`` actually asks for (``nvmlDeviceGetCount_v2``...), so
an upgrade that switches to a new versioned symbol fails here, not on a customer's host.
"""

from __future__ import annotations

import ast
import ctypes
import importlib.metadata
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from support.rig import busy, card
from packaging.requirements import Requirement
from powerbudgetd_sim import libnvml
from powerbudgetd_sim.libnvml import SIGNATURES, SimNvmlLibrary
from powerbudgetd_sim.physics import SimBank

from powerbudgetd.hw import nvml as nvml_layer
from powerbudgetd.hw.nvml import Nvml, load_pynvml
from support.paths import REPO

pynvml = load_pynvml()
UUID = "GPU-test-0"


def layer_calls() -> set[str]:
    """Every ``pynvml`` function the NVML layer calls (``self._lib.nvmlX``, ``lib.nvmlX``,
    and the read-only calls of ``probe --compare-sim``)."""
    tree = ast.parse(inspect.getsource(nvml_layer))
    named = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr.startswith("nvml")
        and (getattr(node.value, "id", None) == "lib" or getattr(node.value, "attr", None) == "_lib")
    }
    return named | {call for call, _ in nvml_layer.RAW_READS}  # called by name in raw_answers


# How to call each pynvml function (handle -> arguments) and what it must answer on
# card 0 of the bank below (None: only that it succeeds).
CASES: dict[str, tuple[Callable[[Any], tuple[Any, ...]], Callable[[SimBank], Any] | None]] = {
    "nvmlInit": (lambda h: (), None),
    "nvmlShutdown": (lambda h: (), None),
    "nvmlSystemGetDriverVersion": (lambda h: (), lambda b: "580.sim"),
    "nvmlDeviceGetCount": (lambda h: (), lambda b: len(b.cards)),
    "nvmlDeviceGetHandleByIndex": (lambda h: (0,), None),
    "nvmlDeviceGetHandleByUUID": (lambda h: (UUID,), None),
    "nvmlDeviceGetUUID": (lambda h: (h,), lambda b: UUID),
    "nvmlDeviceGetName": (lambda h: (h,), lambda b: b.cards[0].spec.name),
    "nvmlDeviceGetPowerManagementLimitConstraints": (lambda h: (h,), lambda b: [150_000, 300_000]),
    "nvmlDeviceGetPowerManagementDefaultLimit": (lambda h: (h,), lambda b: 300_000),
    "nvmlDeviceGetPowerManagementLimit": (lambda h: (h,), lambda b: b.cards[0].requested_mw),
    "nvmlDeviceGetEnforcedPowerLimit": (lambda h: (h,), lambda b: b.cards[0].enforced_mw(b.now)),
    "nvmlDeviceGetPowerUsage": (lambda h: (h,), lambda b: int(b.cards[0].avg_w * 1000)),
    "nvmlDeviceGetFieldValues": (
        lambda h: (h, [186, 185, 191]),
        lambda b: [int(b.cards[0].instant_w * 1000), int(b.cards[0].avg_w * 1000), int(b.cards[0].energy_mj)],
    ),
    # Above 2**32 mJ: a 32-bit out-parameter would truncate it.
    "nvmlDeviceGetTotalEnergyConsumption": (lambda h: (h,), lambda b: int(b.cards[0].energy_mj)),
    "nvmlDeviceGetPersistenceMode": (lambda h: (h,), lambda b: 1),
    # Writes answer None; the check is that the value arrived whole (not narrowed).
    "nvmlDeviceSetPersistenceMode": (
        lambda h: (h, 0), lambda b: None if b.cards[0].persistence_mode is False else "mode not written",
    ),
    "nvmlDeviceSetPowerManagementLimit": (
        lambda h: (h, 212_500), lambda b: None if b.cards[0].requested_mw == 212_500 else b.cards[0].requested_mw,
    ),
    "nvmlDeviceGetMigMode": (lambda h: (h,), lambda b: [0, 0]),
    "nvmlDeviceIsMigDeviceHandle": (lambda h: (h,), lambda b: 0),
    "nvmlDeviceGetCurrentClocksEventReasons": (lambda h: (h,), None),
}


def _answer(result: Any) -> Any:
    if isinstance(result, ctypes.c_uint):  # nvmlDeviceIsMigDeviceHandle answers the ctypes value
        return result.value
    if isinstance(result, ctypes.Array):  # field values: each value by its valueType
        fields = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
        return [getattr(v.value, fields[v.valueType]) for v in result]
    return result


@pytest.fixture
def bound() -> Any:
    bank = SimBank([card(0, busy())], lag_s=0.1, seed=1)
    bank.advance_to(3.0)
    bank.cards[0].energy_mj = 5_000_000_123.0  # past 2**32 mJ (~50 days at 1 kW)
    lib = SimNvmlLibrary(bank)
    Nvml(lib)  # attaches the simulator under the bindings
    with lib.bound():
        pynvml.nvmlInit()
        yield bank, lib, pynvml.nvmlDeviceGetHandleByIndex(0)


def test_the_layer_calls_are_all_covered_here() -> None:
    calls = layer_calls()
    assert {"nvmlInit", "nvmlDeviceSetPowerManagementLimit", "nvmlDeviceGetFieldValues"} <= calls  # the parse works
    missing = calls - CASES.keys()
    assert not missing, f"the NVML layer calls {sorted(missing)}: add them to CASES and serve their C symbols"


@pytest.mark.parametrize("function", sorted(CASES))
def test_each_call_reaches_a_served_symbol_with_a_fitting_prototype(bound: Any, function: str, monkeypatch) -> None:
    bank, lib, handle = bound
    asked: list[str] = []
    real_lookup = pynvml._nvmlGetFunctionPointer

    def lookup(name: str) -> Any:
        asked.append(name)
        return real_lookup(name)

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lookup)
    args, expected = CASES[function]
    try:
        result = getattr(pynvml, function)(*args(handle))
    except pynvml.NVMLError_FunctionNotFound:
        pytest.fail(f"pynvml.{function} asks for C symbol(s) {asked}; the simulator serves none of "
                    f"{sorted(set(asked) - SIGNATURES.keys())} (nvidia-ml-py {pynvml_version()})")
    except ctypes.ArgumentError as exc:
        pytest.fail(f"pynvml.{function} -> {asked}: the simulator's prototype does not fit the bindings' arguments: {exc}")
    assert asked, f"pynvml.{function} called no C function"
    assert set(asked) <= SIGNATURES.keys(), f"{function}: unserved symbols {set(asked) - SIGNATURES.keys()}"
    assert lib.internal_errors == []
    if expected is not None:
        assert _answer(result) == expected(bank), f"pynvml.{function} answered {result!r}"


def test_field_values_carry_their_value_type(bound: Any) -> None:
    bank, _, handle = bound
    values = pynvml.nvmlDeviceGetFieldValues(handle, [186, 185, 191, 1])
    assert [v.fieldId for v in values] == [186, 185, 191, 1]
    assert [v.nvmlReturn for v in values] == [0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert [v.valueType for v in values[:3]] == [
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
    ]
    assert values[0].timestamp == int(bank.now * 1e6)


def test_error_codes_become_the_bindings_exception_classes(bound: Any) -> None:
    _, lib, handle = bound
    lib.faults = [libnvml.Fault("nvmlDeviceGetPowerUsage", "NOT_SUPPORTED", count=1),
                  libnvml.Fault("nvmlDeviceGetPowerUsage", "NO_PERMISSION", count=1)]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    with pytest.raises(pynvml.NVMLError_NoPermission) as info:
        pynvml.nvmlDeviceGetPowerUsage(handle)
    assert str(info.value) == "Insufficient Permissions"
    assert pynvml.nvmlErrorString(15) == "GPU is lost"  # const char* through the prototype


def test_an_unserved_symbol_is_function_not_found(bound: Any) -> None:
    _, _, handle = bound
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetTemperature(handle, 0)


def test_banks_do_not_cross_talk() -> None:
    # Two banks in one process share the bindings' globals (library, pointer cache,
    # init count); each call reaches the bank bound around it, and a handle from one
    # bank is refused by the other.
    a, b = SimBank([card(0, busy())], seed=1), SimBank([card(0), card(1)], seed=2)
    na, nb = Nvml(SimNvmlLibrary(a)), Nvml(SimNvmlLibrary(b))
    na.init()
    with pytest.raises(Exception, match="Uninitialized"):
        nb.devices()  # b was never initialised, whatever a did
    nb.init()
    a.advance_to(2.0)
    assert len(na.devices()) == 1 and len(nb.devices()) == 2
    assert na.read(UUID).power_avg_w > 250 > nb.read(UUID).power_avg_w
    handle_a = na._handles[UUID]
    assert nb.library is not None
    with nb.library.bound(), pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPowerUsage(handle_a)
    na.shutdown()
    assert nb.read(UUID).requested_limit_w == 300.0  # b still initialised


def test_production_layer_without_a_driver_is_library_not_found() -> None:
    Nvml(SimNvmlLibrary(SimBank([card(0)])))  # the simulator is attached in this process
    with pytest.raises(nvml_layer.NvmlNotInitialized) as info:
        Nvml().init()
    assert info.value.code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND


def pynvml_version() -> str:
    return importlib.metadata.version("nvidia-ml-py")


def test_installed_bindings_are_in_the_tested_range() -> None:
    (spec,) = [Requirement(r) for r in importlib.metadata.requires("powerbudgetd") or [] if r.startswith("nvidia-ml-py")]
    assert spec.specifier.contains(pynvml_version()), f"nvidia-ml-py {pynvml_version()} is outside {spec}"
    assert any(s.operator == "<" for s in spec.specifier), "the tested range needs an upper bound"


def test_pynvml_is_nvidias_module_and_nothing_shadows_it() -> None:
    from pathlib import Path

    dist = importlib.metadata.distribution("nvidia-ml-py")
    assert Path(pynvml.__file__).resolve() == Path(str(dist.locate_file("pynvml.py"))).resolve()
    root = REPO
    shadows = [p for d in ("powerbudgetd", "sim", "tests") for p in (root / d).rglob("pynvml*")]
    assert shadows == []


# -- the device set and hung calls, through the real bindings ----------------------------
def test_cards_appear_vanish_and_reindex_through_the_bindings() -> None:
    from powerbudgetd_sim.physics import BankEvent

    bank = SimBank([card(0), card(1, present=False), card(2)], seed=1, events=[
        BankEvent(1.0, 1, "appear"), BankEvent(2.0, 0, "disappear"), BankEvent(3.0, 0, "reindex", order=(2, 1, 0)),
    ])
    lib = SimNvmlLibrary(bank)
    Nvml(lib)
    with lib.bound():
        pynvml.nvmlInit()
        uuids = lambda: [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))  # noqa: E731
                         for i in range(pynvml.nvmlDeviceGetCount())]
        assert uuids() == ["GPU-test-0", "GPU-test-2"]
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID(b"GPU-test-1")
        first = pynvml.nvmlDeviceGetHandleByUUID(b"GPU-test-0")
        bank.advance_to(1.0)  # card 1 appears, at its default limit
        assert uuids() == ["GPU-test-0", "GPU-test-1", "GPU-test-2"]
        appeared = pynvml.nvmlDeviceGetHandleByUUID(b"GPU-test-1")
        assert pynvml.nvmlDeviceGetPowerManagementLimit(appeared) == 300_000
        bank.advance_to(2.0)  # card 0 falls off the bus: its handle is stale
        assert uuids() == ["GPU-test-1", "GPU-test-2"]
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetPowerUsage(first)
        bank.advance_to(3.0)  # NVML enumerates in a new order
        assert uuids() == ["GPU-test-2", "GPU-test-1"]
        assert pynvml.nvmlDeviceGetUUID(appeared) == "GPU-test-1"  # a handle names its card, not an index
    assert lib.internal_errors == []


def test_a_hang_times_out_every_call_on_its_card_and_a_hung_write_lands_late() -> None:
    bank = SimBank([card(0), card(1)], lag_s=0.0, seed=1)
    lib = SimNvmlLibrary(bank, [libnvml.Fault("nvmlDeviceSetPowerManagementLimit", "HANG", card=0, count=1,
                                              delay_s=5.0)])
    Nvml(lib)
    with lib.bound():
        pynvml.nvmlInit()
        h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlDeviceSetPowerManagementLimit(h0, 200_000)
        bank.advance_to(4.9)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlDeviceGetPowerUsage(h0)  # the hung call still holds the card
        assert pynvml.nvmlDeviceGetPowerManagementLimit(h1) == 300_000  # the other card answers
        assert bank.cards[0].limit_bound_mw(bank.now) == 300_000  # both limits may be in force
        bank.advance_to(5.0)
        assert pynvml.nvmlDeviceGetPowerManagementLimit(h0) == 200_000  # it returned: the write landed
    with pytest.raises(ValueError, match="delay_s"):
        libnvml.Fault("*", "HANG")


def test_a_slow_call_on_one_card_holds_up_no_other() -> None:
    import threading
    import time

    bank = SimBank([card(0), card(1)], seed=1)
    lib = SimNvmlLibrary(bank, [libnvml.Fault("nvmlDeviceGetPowerUsage", "SLOW", card=0, count=1, delay_s=1.0)])
    nvml = Nvml(lib)
    nvml.init()
    nvml.devices()
    slow = threading.Thread(target=nvml.read, args=("GPU-test-0",))
    slow.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    for _ in range(20):
        nvml.read("GPU-test-1")
    assert time.monotonic() - t0 < 0.5 and slow.is_alive()  # card 1 was served meanwhile
    slow.join()
    assert lib.internal_errors == []
