"""One budget over two vendors: the mixed-vendor scenario (four 300 W NVIDIA cards on
NVML, two 750 W AMD Instinct cards on hwmon) boots to fair share across vendors and lends
between them; `run --backend sim` on it does the same as a process; `simulate` scores it."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.core.fairshare import fair_shares
from powerbudgetd_sim.scenario import load_scenario
from powerbudgetd_sim.simulate import run_scenario
from support.daemon import DaemonProcess
from support.rig import scenario_rig


def test_mixed_vendor_boots_to_fair_share_across_vendors_and_lends_between_them():
    rig = scenario_rig("mixed-vendor")
    infos = {c.info.vendor: c.info.backend for c in rig.ctl.cards}
    assert infos == {"nvidia": "nvml", "amd": "hwmon"}
    sc = load_scenario("mixed-vendor")
    want = fair_shares(int(sc.budget_w * 1000), [c.min_mw for c in rig.bank.cards], [c.max_mw for c in rig.bank.cards])
    rig.run_until(3.0)
    assert rig.ctl.ready
    # NVML's cards at the level to the mW, amdgpu's rounded down to whole W.
    got = [c.requested_mw for c in rig.bank.cards]
    assert all(g == w if c.spec.vendor == "nvidia" else w - 1000 < g <= w
               for g, w, c in zip(got, want, rig.bank.cards)), (got, want)
    budget_mw = rig.ctl.budget_mw
    rig.run_until(100.0, lambda r: r.bank.sum_limit_bound_mw() <= budget_mw or pytest.fail(f"t={r.t}: over"))
    # At 100 s the first AMD card runs flat out (750 W asked) while two NVIDIA cards idle: lent to it.
    amd0 = rig.bank.cards[4]
    assert amd0.requested_mw >= want[4] + 50_000, (amd0.requested_mw, want[4])
    assert [c.requested_mw < want[i] for i, c in enumerate(rig.bank.cards[:4])] == [False, False, True, True]


def test_simulate_scores_the_mixed_vendor_scenario():
    rep = run_scenario(load_scenario("mixed-vendor"), duration_s=120.0).report
    assert rep["violation_ticks"] == 0 and rep["work_vs_oracle"] > 0.9, rep


@pytest.mark.slow  # the daemon as a subprocess
def test_run_backend_sim_on_the_mixed_vendor_scenario_lends_between_vendors(tmp_path: Path):
    cfg = tmp_path / "powerbudgetd.toml"
    cfg.write_text('budget_w = 2000\n[sim]\nscenario = "mixed-vendor"\n')
    with DaemonProcess(cfg) as daemon:
        daemon.wait_for(lambda: daemon.events("ready"), "ready", 60)
        # Both vendors' cards under control, the bank at its budget once ready: a card
        # whose start-up limit is already within its share (the NVIDIA cards' 300 W
        # here) is left as it is, the others written down at boot.
        (starting,) = daemon.events("starting")
        assert {c["uuid"].split("-")[0] for c in starting["cards"] if c["controllable"]} == {"GPU", "amdgpu"}
        (ready,) = daemon.events("ready")
        assert ready["sum_limits_w"] <= 2000
        boot = [e for e in daemon.events("power_limit_set") if e["reason"] == "boot"]
        assert {e["uuid"].split("-")[0] for e in boot} >= {"amdgpu"}
        daemon.wait_for(lambda: [e for e in daemon.events("power_limit_set")
                                 if e["uuid"].startswith("amdgpu") and e["to_w"] > 400], "a loan to an AMD card", 150)
        assert daemon.stop(30) == 0
