"""MIG: reported by probe and in metrics; power limits only ever set on parent GPUs.

NVML enumerates parent GPUs by index; a MIG device has its own handle and UUID
(``MIG-...``), reached through its parent or by UUID, and shares its parent's power
limit. The simulator serves MIG device handles and records any limit write sent to one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from support.rig import busy, card, make_rig
from powerbudgetd.channels.metrics import Metrics
from powerbudgetd.cli import main
from powerbudgetd.errors import NvmlInvalidArgument
from powerbudgetd.hw.nvml import load_pynvml
from powerbudgetd.hw.probe import format_probe, probe

pynvml = load_pynvml()


def mig_rig():
    specs = [card(0, busy(), mig_devices=2), card(1), card(2, mig_devices=1)]
    return make_rig(specs, 750)


def test_limits_are_set_on_the_parent_gpus_of_a_mig_bank():
    rig = mig_rig()
    rig.run(10.0)
    assert [c.uuid for c in rig.ctl.cards] == ["GPU-test-0", "GPU-test-1", "GPU-test-2"]  # parents only
    assert rig.bank.cards[0].writes > 0 and rig.enforced_w(0) > 250.0  # card 0 borrows, as any card
    assert rig.lib.mig_writes == []
    assert [c.mig_mode for c in rig.reports[-1].snapshot.cards] == [True, False, True]
    assert rig.truth_w() <= 750.0


def test_a_mig_device_uuid_is_never_written():
    rig = mig_rig()
    with rig.lib.bound():
        parent = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 2
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
        mig_uuid = pynvml.nvmlDeviceGetUUID(mig)
        assert mig_uuid.startswith("MIG-") and pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
        assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == "GPU-test-0"
        with pytest.raises(pynvml.NVMLError_NotSupported):  # what the driver answers; the simulator records it
            pynvml.nvmlDeviceSetPowerManagementLimit(mig, 200_000)
    assert rig.lib.mig_writes == [(mig_uuid, 200_000)]
    rig.lib.mig_writes.clear()
    writes = rig.bank.cards[0].writes
    with pytest.raises(NvmlInvalidArgument, match="MIG device"):
        rig.nvml.set_power_limit(mig_uuid, 200.0)
    assert rig.lib.mig_writes == [] and rig.bank.cards[0].writes == writes  # nothing was sent


def test_mig_mode_in_metrics_and_probe(tmp_path: Path, capsys):
    rig = mig_rig()
    rig.run(1.0)
    m = Metrics(CollectorRegistry())
    m.on_tick(rig.reports[-1])
    for i, on in enumerate([1.0, 0.0, 1.0]):
        labels = {"gpu": str(i), "UUID": f"GPU-test-{i}", "modelName": "Test GPU"}
        assert m.registry.get_sample_value("powerbudgetd_gpu_mig_mode", labels) == on
    result = probe(rig.nvml)
    assert [g["mig_mode"] for g in result["gpus"]] == [True, False, True]
    text = format_probe(result)
    assert text.count("MIG mode           enabled") == 2 and "MIG mode           disabled" in text
    scenario = tmp_path / "mig.toml"
    scenario.write_text('name = "mig"\nbank = "h200-1"\n[[cards]]\nmig_devices = 3\n')
    assert main(["probe", "--backend", "sim", "--scenario", str(scenario), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"][0]["mig_mode"] is True
