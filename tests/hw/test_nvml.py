"""The NVML layer and the real bindings, run against the simulated NVML library: units, enumeration, error mapping."""

from __future__ import annotations

import sys
import types

import pytest

from support.rig import Fault, busy, card, make_rig
from powerbudgetd import errors
from powerbudgetd.hw.nvml import Nvml, load_pynvml
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import SimBank


def layer(*specs, faults=()):
    bank = SimBank(list(specs), lag_s=0.1, seed=1)
    nvml = Nvml(SimNvmlLibrary(bank, list(faults)))
    nvml.init()
    return bank, nvml


def test_enumerates_by_uuid_with_limits_in_watts():
    _, nvml = layer(card(0), card(1, min_w=100.0, max_w=350.0, default_w=320.0))
    gpus = nvml.devices()
    assert [g.uuid for g in gpus] == ["GPU-test-0", "GPU-test-1"]
    assert [g.index for g in gpus] == [0, 1]
    assert (gpus[1].min_limit_w, gpus[1].max_limit_w, gpus[1].default_limit_w) == (100.0, 350.0, 320.0)


def test_reads_in_watts_and_sets_in_milliwatts():
    bank, nvml = layer(card(0, busy()))
    nvml.devices()
    bank.advance_to(2.0)
    r = nvml.read("GPU-test-0")
    assert r.requested_limit_w == r.enforced_limit_w == 300.0
    assert 250.0 < r.power_avg_w <= 300.0
    assert r.power_instant_w is not None
    nvml.set_power_limit("GPU-test-0", 212.5)
    assert bank.cards[0].requested_mw == 212_500
    assert nvml.read("GPU-test-0").requested_limit_w == 212.5


def test_instant_power_is_none_on_cards_without_field_186():
    bank, nvml = layer(card(0, has_instant=False))
    nvml.devices()
    assert nvml.read("GPU-test-0").power_instant_w is None
    assert nvml.read("GPU-test-0").power_avg_w == pytest.approx(30.0, abs=1)


def test_a_card_known_without_field_186_is_not_asked_again_even_once_lost():
    """The peak sampler's ``power_instant_w`` on such a card answers None without a
    call: no handle lookup on a lost card every pass, no error counted for it."""
    bank, nvml = layer(card(0, has_instant=False), faults=[
        Fault("nvmlDeviceGetPowerUsage", "GPU_IS_LOST", from_s=1.0),
        Fault("nvmlDeviceGetHandleByUUID", "GPU_IS_LOST", from_s=1.0),
    ])
    nvml.devices()
    assert nvml.read("GPU-test-0").power_instant_w is None  # learnt: no field 186
    bank.advance_to(1.5)
    with pytest.raises(errors.NvmlGpuLost):
        nvml.read("GPU-test-0")  # the handle is dropped
    assert nvml.power_instant_w("GPU-test-0") is None


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("NOT_SUPPORTED", errors.NvmlNotSupported),
        ("NO_PERMISSION", errors.NvmlNoPermission),
        ("GPU_IS_LOST", errors.NvmlGpuLost),
        ("INVALID_ARGUMENT", errors.NvmlInvalidArgument),
        ("UNKNOWN", errors.NvmlError),
    ],
)
def test_errors_become_project_exceptions(error, kind):
    _, nvml = layer(card(0), faults=[Fault("nvmlDeviceSetPowerManagementLimit", error)])
    nvml.devices()
    with pytest.raises(kind) as info:
        nvml.set_power_limit("GPU-test-0", 200.0)
    assert type(info.value) is kind
    assert info.value.call == "nvmlDeviceSetPowerManagementLimit"


def test_unsupported_reading_is_none_never_zero():
    _, nvml = layer(card(0), faults=[Fault("nvmlDeviceGetPowerUsage", "NOT_SUPPORTED")])
    nvml.devices()
    assert nvml.read("GPU-test-0").power_avg_w is None


def test_out_of_range_limit_is_invalid_argument():
    _, nvml = layer(card(0))
    nvml.devices()
    with pytest.raises(errors.NvmlInvalidArgument):
        nvml.set_power_limit("GPU-test-0", 100.0)


@pytest.mark.parametrize("error", ["DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH", "LIBRARY_NOT_FOUND"])
def test_init_failures_are_not_initialized(error):
    bank = SimBank([card(0)])
    nvml = Nvml(SimNvmlLibrary(bank, [Fault("nvmlInit", error)]))
    with pytest.raises(errors.NvmlNotInitialized):
        nvml.init()


def test_calls_before_init_are_not_initialized():
    nvml = Nvml(SimNvmlLibrary(SimBank([card(0)])))
    with pytest.raises(errors.NvmlNotInitialized):
        nvml.devices()


def test_refuses_the_unofficial_pynvml_wrapper(monkeypatch):
    fake = types.ModuleType("pynvml")  # lacks nvidia-ml-py's _nvmlGetFunctionPointer
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(errors.NvmlNotInitialized, match="pip uninstall pynvml"):
        load_pynvml()


def test_accepts_nvidia_ml_py():
    module = load_pynvml()  # the real bindings are a dependency; no GPU needed to import
    assert hasattr(module, "nvmlDeviceSetPowerManagementLimit")


def test_rig_layer_is_the_production_class():
    rig = make_rig([card(0)], 300)
    assert type(rig.ctl.nvml) is Nvml
