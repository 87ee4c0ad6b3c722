"""The AMD SMI backend on a stand-in module (tests/support/amdsmi_standin.py: AMD SMI's
names, units and exceptions, served from the simulated bank; not AMD's library):
identities, units and their rounding, "N/A" readings, the MI250's powerless die, SR-IOV's
sentinel range, errors by AMD SMI's status, and the budget held on a bank that mixes it
with NVML, under hidden faults."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerbudgetd.errors import (
    NvmlGpuLost,
    NvmlInvalidArgument,
    NvmlNoPermission,
    NvmlNotInitialized,
    NvmlNotSupported,
    NvmlTimeout,
)
from powerbudgetd.hw.amdsmi import AmdSmi, load_amdsmi
from powerbudgetd.service.backend import auto_backend, make_nvml
from powerbudgetd_sim.hwmon import SimHwmonTree
from powerbudgetd.hw.hwmon import Hwmon
from powerbudgetd_sim.physics import BankEvent, SimBank
from support.amdsmi_standin import UINT64_MAX, SmiFault, StandInAmdSmi, amdsmi_rig
from support.examples import examples
from support.rig import busy, card

MI300X = "AMD Instinct MI300X"


def amd(i, *phases, **kw):
    return dataclasses.replace(card(i, *phases, **kw), vendor="amd", name=MI300X)


def smi(*specs, lag_s=0.0, **kw):
    bank = SimBank(list(specs), lag_s=lag_s, seed=1)
    mod = StandInAmdSmi(bank, **kw)
    b = AmdSmi(mod)
    b.init()
    return bank, mod, b


def test_cards_listed_by_bus_id_with_limits_in_w_vendor_and_backend():
    bank, mod, b = smi(amd(1, min_w=200.0, max_w=750.0), amd(0))
    infos = b.devices()
    assert [i.uuid for i in infos] == ["amdsmi-0000:10:00.0", "amdsmi-0000:11:00.0"]
    a = infos[0]
    assert (a.min_limit_w, a.max_limit_w, a.default_limit_w) == (200.0, 750.0, 750.0)
    assert (a.vendor, a.backend, a.bus_id, a.name) == ("amd", "amdsmi", "0000:10:00.0", MI300X)
    assert not a.caps.separate_requested and a.caps.limit_step_w == 1.0 and a.caps.energy
    assert b.device(0).uuid == "amdsmi-0000:10:00.0" and b.device_count() == 2
    assert b.persistence_mode(a.uuid) is None
    with pytest.raises(NvmlNotSupported):
        b.set_persistence_mode(a.uuid, True)


def test_limits_read_round_up_ranges_inwards_and_writes_down_to_whole_watts():
    class Odd(StandInAmdSmi):
        def amdsmi_get_power_cap_info(self, handle, sensor_ind=0):
            return {"power_cap": 300_000_001, "default_power_cap": 300_000_500, "dpm_cap": 0,
                    "min_power_cap": 150_000_001, "max_power_cap": 300_000_999}

    bank = SimBank([amd(0)], lag_s=0.0, seed=1)
    b = AmdSmi(Odd(bank))
    b.init()
    info = b.devices()[0]
    # a limit that may be in force (or come back) is never counted lower
    assert (info.min_limit_w, info.max_limit_w, info.default_limit_w) == (150.001, 300.001, 300.001)
    assert b.read(info.uuid).enforced_limit_w == 300.001
    b.set_power_limit(info.uuid, 200.999)
    assert b.mod.calls[-1] == ("amdsmi_set_power_cap", 0, (0, 200_000_000))


def test_a_write_is_sensor_0_in_uw_and_reads_back_once_it_bites():
    bank, mod, b = smi(amd(0), lag_s=0.5)
    uuid = "amdsmi-0000:10:00.0"
    b.set_power_limit(uuid, 200.7)
    assert mod.calls[-1] == ("amdsmi_set_power_cap", 0, (0, 200_000_000))
    r = b.read(uuid)
    assert r.requested_limit_w == r.enforced_limit_w == 300.0  # no requested/enforced pair: the cap
    bank.advance_to(0.6)
    assert b.read(uuid).enforced_limit_w == 200.0
    b.set_power_limit(uuid, 250.0)
    assert b.read(uuid).enforced_limit_w == 250.0  # a raise at once


def test_power_in_w_and_n_a_is_unknown_never_zero():
    bank, mod, b = smi(amd(0, busy()), amd(1, busy()), amd(2, busy()), quirks={1: "mi300", 2: "mi250-odd"})
    bank.advance_to(2.0)
    full, mi300, odd = (b.read(f"amdsmi-0000:1{i}:00.0") for i in range(3))
    assert full.power_avg_w is not None and full.power_avg_w > 200 and full.power_instant_w is not None
    # MI300 reports the current socket power only: it is the reading, no separate instant
    assert mi300.power_avg_w is not None and mi300.power_avg_w > 200 and mi300.power_instant_w is None
    # An MI250's odd die reports no power: unknown, and its cap is still read
    assert (odd.power_avg_w, odd.power_instant_w, odd.enforced_limit_w) == (None, None, 300.0)


def test_energy_is_the_accumulator_times_its_resolution_in_j_with_either_key():
    for legacy in (False, True):
        bank, mod, b = smi(amd(0, busy()), legacy_keys=legacy)
        bank.advance_to(3.0)
        e = b.energy_j("amdsmi-0000:10:00.0")
        assert e is not None and e == pytest.approx(bank.cards[0].energy_mj / 1000, abs=1e-4)
        assert b.devices()[0].default_limit_w == 300.0  # default_power_cap or power_cap_default


def test_sriov_sentinel_range_is_listed_without_limits_and_refused_with_a_clear_error():
    bank, mod, b = smi(amd(0), quirks={0: "sriov"})
    info = b.devices()[0]
    assert mod.amdsmi_get_power_cap_info(mod.amdsmi_get_processor_handles()[0])["max_power_cap"] == UINT64_MAX
    assert (info.min_limit_w, info.max_limit_w, info.default_limit_w) == (None, None, None)
    assert b.read(info.uuid).enforced_limit_w == 300.0  # monitored and counted at its cap
    with pytest.raises(NvmlNotSupported, match="SR-IOV"):
        b.set_power_limit(info.uuid, 250.0)
    assert not [c for c in mod.calls if c[0] == "amdsmi_set_power_cap"]  # never sent


@pytest.mark.parametrize("fault, kind", [
    (SmiFault("amdsmi_set_power_cap", "NO_PERM"), NvmlNoPermission),
    (SmiFault("amdsmi_set_power_cap", "INVAL"), NvmlInvalidArgument),
    (SmiFault("amdsmi_set_power_cap", "parameter"), NvmlInvalidArgument),
    (SmiFault("amdsmi_set_power_cap", "retry"), NvmlTimeout),
    (SmiFault("amdsmi_set_power_cap", "timeout"), NvmlTimeout),
    (SmiFault("amdsmi_set_power_cap", "BUSY"), NvmlTimeout),
    (SmiFault("*", "NOT_FOUND"), NvmlGpuLost),
])
def test_amd_smi_exceptions_become_the_projects_kinds(fault, kind):
    bank, mod, b = smi(amd(0))
    mod.faults.append(fault)
    with pytest.raises(kind):
        b.set_power_limit("amdsmi-0000:10:00.0", 200.0)
    assert bank.cards[0].requested_mw == 300_000


def test_out_of_range_write_is_refused_and_a_card_off_the_bus_is_lost():
    bank, mod, b = smi(amd(0), amd(1))
    with pytest.raises(NvmlInvalidArgument):
        b.set_power_limit("amdsmi-0000:10:00.0", 100.0)
    bank.cards[0].present = False
    with pytest.raises(NvmlGpuLost):
        b.read("amdsmi-0000:10:00.0")
    assert [i.uuid for i in b.devices()] == ["amdsmi-0000:11:00.0"]


def test_a_missing_amd_smi_is_not_initialised_naming_rocm(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi raises ImportError
    with pytest.raises(NvmlNotInitialized, match="ROCm"):
        load_amdsmi()
    with pytest.raises(NvmlNotInitialized, match="ROCm"):
        make_nvml("amdsmi").init()


def test_auto_takes_amd_smi_and_leaves_its_cards_out_of_hwmon():
    bank = SimBank([amd(0), amd(1), dataclasses.replace(card(2), vendor="intel", name="Intel GPU")], seed=1)
    tree = SimHwmonTree(bank)
    # amdsmi lists only the first AMD card: the second stays hwmon's, as does the Intel one
    mod = StandInAmdSmi(bank)
    mod._handles.pop(1)
    b = auto_backend(amdsmi_module=mod, hwmon=Hwmon(tree.root, tree))
    b.init()
    assert [(i.uuid, i.backend) for i in b.devices()] == [
        ("amdsmi-0000:10:00.0", "amdsmi"), ("amdgpu-0000:11:00.0", "hwmon"), ("xe-0000:12:00.0", "hwmon")]


# -- the control layer on AMD SMI ---------------------------------------------------------
def test_a_mixed_bank_boots_to_fair_share_and_an_sriov_card_is_counted_not_written():
    specs = [card(0, busy()), amd(1, busy(), max_w=750.0, min_w=200.0), amd(2, busy(), max_w=750.0, min_w=200.0)]
    rig = amdsmi_rig(specs, 1200.0, quirks={2: "sriov"})
    rig.run(3.0)
    assert rig.ctl.ready
    limits = [c.requested_mw for c in rig.bank.cards]
    assert limits[2] == 750_000 and sum(limits) <= 1_200_000  # the SR-IOV card left at its cap
    assert limits[1] % 1000 == 0 and limits[0] + limits[1] >= 1_200_000 - 750_000 - 2000
    assert not [c for c in rig.smi.calls if c[0] == "amdsmi_set_power_cap" and c[1] == 2]


@st.composite
def faulty_smi_banks(draw):
    n = draw(st.integers(2, 4))
    specs, faults, events = [], [], []
    for i in range(n):
        lo = draw(st.integers(100, 200))
        hi = lo + draw(st.integers(50, 300))
        trouble = draw(st.sampled_from(["none", "lost", "refuse", "retry"]))
        if trouble == "lost":
            at = draw(st.floats(3.0, 8.0))
            events += [BankEvent(at, i, "disappear"), BankEvent(at + draw(st.floats(0.3, 2.0)), i, "appear")]
        elif trouble == "refuse":
            faults.append(SmiFault("amdsmi_set_power_cap", draw(st.sampled_from(["INVAL", "BUSY", "NOT_FOUND"])),
                                   card=i, from_s=draw(st.floats(0.0, 8.0)), count=draw(st.integers(1, 3))))
        elif trouble == "retry":
            faults.append(SmiFault(draw(st.sampled_from(["amdsmi_get_power_cap_info", "amdsmi_get_power_info"])),
                                   draw(st.sampled_from(["retry", "timeout"])), card=i,  # after start
                                   from_s=draw(st.floats(0.5, 8.0)), count=draw(st.integers(1, 5))))
        spec = card(i, busy(draw(st.floats(0.0, 6.0)), draw(st.floats(50.0, 500.0))), min_w=float(lo), max_w=float(hi))
        specs.append(dataclasses.replace(spec, vendor="amd") if i % 2 else spec)
    floor = sum(s.min_w for s in specs)
    budget = draw(st.floats(floor + 1, max(floor + 2, sum(s.max_w for s in specs))))
    return specs, budget, draw(st.sampled_from([0.0, 0.1, 0.3])), faults, events


@settings(max_examples=examples(100, quick=8), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_smi_banks())
def test_hidden_faults_keep_the_budget_on_a_bank_mixing_nvml_and_amd_smi(case):
    specs, budget, lag, faults, events = case
    rig = amdsmi_rig(specs, budget, lag_s=lag, seed=3, events=events, faults=faults)
    tick = rig.ctl.timings.tick_s
    appear = [e.at_s for e in events if e.action == "appear"]
    while rig.t < 12.0:
        rig.step()
        truth = rig.bank.sum_limit_bound_mw()
        assert rig.ctl.sum_bound_mw >= truth, f"t={rig.t}: counted {rig.ctl.sum_bound_mw} < truth {truth}"
        if rig.ctl.ready and not any(0 <= rig.t - a <= tick + lag + 1e-6 for a in appear):
            assert truth <= rig.ctl.budget_mw, f"t={rig.t}: {truth} mW > {rig.ctl.budget_mw} mW"
