"""Every NVML failure kind keeps the budget, and the daemon says what is wrong.

Cases 1-11 of the fault list, each scripted with the simulated NVML library's faults and bank events
(what a scenario file can say too), run on virtual time; the start-up cases run the
real daemon as a subprocess.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from support.rig import Fault, Phase, busy, card, idle, make_rig
from support.timings import FAST
from powerbudgetd.errors import BudgetInfeasible, NvmlNoPermission
from powerbudgetd.core.model import Mode, Role, Timings
from powerbudgetd_sim.physics import BankEvent
from support.daemon import DaemonProcess, NotifySocket

T = replace(FAST, failsafe_hold_s=5.0)


def card350(i, *phases, **kw):
    return card(i, *phases, min_w=100.0, max_w=350.0, **kw)


def watch(rig, allow_outside=()):
    """Check after every tick: our view of each card never under the truth, and the
    truth within the budget once ready (except right after an outside change)."""
    budget = rig.ctl.budget_mw

    def check(r):
        truth = r.bank.sum_limit_bound_mw()
        assert r.ctl.sum_bound_mw >= truth - 1, f"t={r.t}: counted {r.ctl.sum_bound_mw} < truth {truth}"
        if r.ctl.ready and not any(0 <= r.t - a <= 0.3 for a in allow_outside):
            assert truth <= budget, f"t={r.t}: {truth} mW > {budget} mW"

    return check


def events(logs, name):
    return [e for e in logs if e["event"] == name]


# 1 -------------------------------------------------------------------------------------
def test_limits_reverted_behind_our_back_are_found_and_reapplied():
    resets = [BankEvent(5.0, i, "reset") for i in (1, 2, 3)]
    rig = make_rig([card350(i) for i in range(4)], 1000, timings=T)
    rig.bank._events = sorted(((e.at_s, i, e) for i, e in enumerate(resets)), key=lambda x: x[:2])
    with capture_logs() as logs:
        rig.run(5.0, watch(rig))
        assert [rig.enforced_w(i) for i in range(4)] == [250.0] * 4
        rep = rig.step()  # the first tick after the reset
        fixes = [(w.index, w.to_w, w.reason) for w in rep.writes]
        assert fixes == [(1, 250.0, "drift"), (2, 250.0, "drift"), (3, 250.0, "drift")]
        rig.run(2.0, watch(rig, allow_outside=[5.0]))
    drift = events(logs, "limit_drift")
    assert [(e["index"], e["expected_w"], e["found_w"]) for e in drift] == [(i, 250.0, 350.0) for i in (1, 2, 3)]
    assert [rig.enforced_w(i) for i in range(4)] == [250.0] * 4


# 2 -------------------------------------------------------------------------------------
def test_writes_refused_stop_the_start_with_a_clear_error():
    faults = [Fault("nvmlDeviceSetPowerManagementLimit", "NO_PERMISSION")]
    with pytest.raises(NvmlNoPermission):
        make_rig([card350(0), card350(1)], 500, faults=faults)


def test_writes_refused_with_monitor_only_allowed_watch_and_say_so():
    faults = [Fault("nvmlDeviceSetPowerManagementLimit", "NO_PERMISSION")]
    with capture_logs() as logs:
        rig = make_rig([card350(0), card350(1)], 500, faults=faults, allow_monitor_only=True)
        rig.run(3.0)
    assert rig.ctl.mode == Mode.MONITOR and rig.ctl.ready
    assert [rig.enforced_w(i) for i in range(2)] == [350.0, 350.0]  # NOT enforced, and said
    assert "NOT enforced" in events(logs, "monitor_only")[0]["action"]


@pytest.mark.slow  # the daemon as a subprocess
def test_writes_refused_daemon_exits_5_naming_the_capability(tmp_path):
    faults = '[[faults]]\ncall = "nvmlDeviceSetPowerManagementLimit"\nerror = "NO_PERMISSION"\n'
    rc, logs, err = run_daemon(tmp_path, faults, budget=500)
    assert rc == 5 and "Traceback" not in err
    msg = events(logs, "no_permission")[0]["action"]
    assert "CAP_SYS_ADMIN" in msg and "NOT enforced" in msg
    assert not events(logs, "power_limit_set")


# 3 -------------------------------------------------------------------------------------
UNSUPPORTED = [
    Fault(call, "NOT_SUPPORTED", card=0)
    for call in (
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceSetPowerManagementLimit",
    )
]


def test_a_card_without_limit_control_counts_fixed_at_its_enforced_limit():
    fixed = card(0, min_w=115.0, max_w=115.0)
    rig = make_rig([fixed, card(1, busy(0, 400.0), min_w=150.0, max_w=400.0)], 400, timings=T, faults=UNSUPPORTED)
    rig.run(5.0, watch(rig))
    assert rig.ctl.cards[0].role == Role.FIXED and not rig.ctl.cards[0].controllable
    assert rig.enforced_w(1) == 285.0  # 400 - 115
    assert rig.bank.cards[0].writes == 0


def test_fixed_cards_above_the_budget_are_an_error_at_start():
    with pytest.raises(BudgetInfeasible, match="115 W on cards we cannot control"):
        make_rig([card(0, min_w=115.0, max_w=115.0), card(1, min_w=150.0, max_w=400.0)], 200, faults=UNSUPPORTED)


# 4 -------------------------------------------------------------------------------------
def test_constraints_that_lie_mark_the_card_not_controllable_with_backoff():
    liar = card(0, min_w=35.0, max_w=35.0, idle_w=20.0, reported_min_w=5.0, reported_max_w=95.0, ignores_writes=True)
    rig = make_rig([liar, card(1, busy(0, 400.0), min_w=150.0, max_w=400.0)], 400, timings=T)
    with capture_logs() as logs:
        rig.run(120.0, watch(rig))
    assert rig.ctl.cards[0].backoff_s >= 40  # held, and retried ever more rarely
    assert rig.ctl.cards[0].bound_mw == 35_000  # counted at what it reads
    assert rig.enforced_w(1) == 365.0
    assert len(events(logs, "write_unconfirmed")) == 1  # one line per state change
    # retries back off (5, 10, 20, 40 s ...): a handful of writes in two minutes, not 1200
    # (the first write not read back is resent once: it may have met a reset)
    assert 2 <= rig.bank.cards[0].writes <= 8


def test_constraints_with_min_above_max_are_rejected_not_used():
    liar = card(0, min_w=35.0, max_w=35.0, reported_min_w=95.0, reported_max_w=5.0)
    with capture_logs() as logs:
        rig = make_rig([liar, card(1, min_w=150.0, max_w=400.0)], 400, timings=T)
        rig.run(3.0, watch(rig))
    assert events(logs, "invalid_constraints")[0]["min_w"] == 95.0
    assert not rig.ctl.cards[0].controllable and rig.bank.cards[0].writes == 0
    assert rig.enforced_w(1) == 365.0


# 5 -------------------------------------------------------------------------------------
def test_a_share_below_the_floor_is_reported_at_start():
    with pytest.raises(BudgetInfeasible, match=r"floor 200 W vs share 175 W"):
        make_rig([card(i, min_w=200.0, max_w=700.0) for i in range(4)], 700)
    # 83 % of a 180 W default is 149.4 W, under the 150 W floor
    with pytest.raises(BudgetInfeasible, match=r"floor 150 W vs share 149.4 W"):
        make_rig([card(0, min_w=150.0, max_w=180.0)], 0.83 * 180)


def test_targets_are_integer_milliwatts_rounded_down_and_clamped():
    rig = make_rig([card(i, min_w=150.0, max_w=180.0) for i in range(3)] + [card(3, min_w=100.0)], 1000.0009)
    rig.run(1.0, watch(rig))
    shares = [c.requested_mw for c in rig.bank.cards]
    assert shares == [180_000, 180_000, 180_000, 300_000]  # clamped at 180, the rest to the 4th
    rig = make_rig([card(i, min_w=150.0, max_w=180.0) for i in range(3)] + [card(3, min_w=100.0)], 700.0009)
    rig.run(1.0, watch(rig))
    assert [c.requested_mw for c in rig.bank.cards] == [175_000] * 4  # not 175 000.225 mW
    rig = make_rig([card350(i) for i in range(3)], 999.9999)
    rig.run(1.0, watch(rig))
    assert [c.requested_mw for c in rig.bank.cards] == [333_333] * 3
    assert sum(c.requested_mw for c in rig.bank.cards) <= 999_999


def test_invalid_argument_never_crashes_and_is_never_resent_unchanged():
    faults = [Fault("nvmlDeviceSetPowerManagementLimit", "INVALID_ARGUMENT", card=0)]
    rig = make_rig([card(i) for i in range(4)], 1000, timings=T, faults=faults)
    with capture_logs() as logs:
        rig.run(60.0, watch(rig))
    refused = [(w.index, w.to_w) for rep in rig.reports for w in rep.writes if w.error_kind == "invalid_argument"]
    # Each value tried once, then the next watt down, after a doubling backoff (5, 10, 20 s).
    assert refused[:3] == [(0, 250.0), (0, 249.0), (0, 248.0)]
    assert len(refused) == len(set(refused)) <= 5
    assert rig.ctl.cards[0].bound_mw == 300_000  # still counted at what it reads
    assert [rig.enforced_w(i) for i in (1, 2, 3)] == [233.333] * 3  # (1000 - 300) / 3
    assert len(events(logs, "write_refused")) == 1  # one line per state change


# 6 -------------------------------------------------------------------------------------
def test_an_unsupported_power_reading_is_unknown_never_zero():
    faults = [Fault("nvmlDeviceGetPowerUsage", "NOT_SUPPORTED", card=1)]
    specs = [card(0, busy()), card(1, has_instant=False), card(2), card(3)]
    with capture_logs() as logs:
        rig = make_rig(specs, 1000, timings=T, faults=faults)
        rig.run(10.0, watch(rig))
    c1 = rig.ctl.cards[1]
    assert c1.reading.power_avg_w is None and c1.reading.power_instant_w is None
    assert c1.role == Role.FAIR and rig.enforced_w(1) == 250.0  # neither donor nor recipient
    assert [rig.ctl.cards[i].role for i in (0, 2, 3)] == [Role.RECIPIENT, Role.DONOR, Role.DONOR]
    assert len(events(logs, "power_reading_unknown")) == 1
    assert not any(rep.faults for rep in rig.reports)


# 7 -------------------------------------------------------------------------------------
def test_square_wave_and_repeated_averages_do_not_oscillate():
    square = Phase(0.0, "square", high_w=400.0, low_w=100.0, on_s=0.1, off_s=0.1)
    specs = [card(0, square, min_w=100.0, max_w=400.0, has_instant=False), card(1, min_w=100.0, max_w=400.0),
             card(2, square, min_w=100.0, max_w=400.0), card(3, busy(0, 400.0), min_w=100.0, max_w=400.0)]
    rig = make_rig(specs, 1000, timings=Timings())
    rig.run(120.0, watch(rig))
    after_boot = [w for rep in rig.reports if rep.now >= 10 for w in rep.writes]
    assert len(after_boot) / (110 / 60) <= 6, after_boot  # bounded changes per minute
    assert not any(rep.faults for rep in rig.reports)


# 8 -------------------------------------------------------------------------------------
def test_instant_spikes_above_the_cap_are_counted_not_acted_on():
    rig = make_rig([card(0, idle(), busy(3.0, 300.0)), card(1, busy(0, 300.0))], 500, timings=Timings())
    rig.run(20.0, watch(rig))
    c0 = rig.ctl.cards[0]
    # the onset overshoot, kept: the card wakes at 3 s while lending at its 150 W floor
    assert c0.excursions >= 1 and c0.peak_excursion_w > 1.1 * 150
    assert not any(rep.faults for rep in rig.reports)
    assert rig.ctl.mode == Mode.DYNAMIC
    # Card 0 lends while idle and is reclaimed when it wakes at 3 s; from then on both
    # are busy at fair share and the spikes above the cap move nothing.
    assert [w for rep in rig.reports if rep.now > 4 for w in rep.writes] == []


# 9 -------------------------------------------------------------------------------------
def test_a_card_off_the_bus_is_reserved_and_capped_first_on_return():
    faults = [Fault("*", "GPU_IS_LOST", card=2, from_s=0.3, until_s=1.0)]
    specs = [card350(0, busy(0, 350.0)), card350(1, busy(0, 350.0)), card350(2), card350(3, busy(0, 350.0))]
    rig = make_rig(specs, 1000, timings=T, faults=faults)
    rig.bank._events = [(1.0, 0, BankEvent(1.0, 2, "reset"))]  # it comes back at its default, 350 W
    order = []
    check = watch(rig)

    def track(r):
        check(r)
        for w in r.reports[-1].writes:
            order.append((round(r.reports[-1].now, 1), w.index, w.to_w))

    rig.run(0.8, track)
    assert rig.ctl.cards[2].role == Role.LOST and rig.ctl.cards[2].bound_mw == 350_000
    assert [rig.enforced_w(i) for i in (0, 1, 3)] == [216.666] * 3  # (1000 - 350) / 3
    rig.run(2.0, track)
    back = [(t, i, to) for t, i, to in order if t >= 1.0]
    assert back[0][1] == 2 and back[0][2] == 250.0  # the returning card is capped first
    assert [rig.enforced_w(i) for i in range(4)] == [250.0] * 4


# 10 ------------------------------------------------------------------------------------
@pytest.mark.slow  # the daemon as a subprocess
def test_nvml_init_retries_then_starts(tmp_path):
    faults = '[[faults]]\ncall = "nvmlInit"\nerror = "LIB_RM_VERSION_MISMATCH"\ncount = 2\n'
    # 500 W: the boot writes (2 x 250 W) come after the failed inits. (At 1000 W both
    # cards sit at their 300 W max: nothing to write, and nothing worth lending.)
    rc, logs, err = run_daemon(tmp_path, faults, budget=500, stop_after="ready")
    assert rc == 0 and "Traceback" not in err
    failed = events(logs, "nvml_init_failed")
    assert len(failed) == 2 and "reboot" in failed[0]["action"]
    assert events(logs, "ready")
    first_write = min(i for i, e in enumerate(logs) if e["event"] == "power_limit_set")
    assert first_write > max(i for i, e in enumerate(logs) if e["event"] == "nvml_init_failed")


@pytest.mark.slow  # the daemon as a subprocess
@pytest.mark.parametrize(
    ("error", "advice"),
    [("DRIVER_NOT_LOADED", "lsmod"), ("LIBRARY_NOT_FOUND", "libnvidia-ml.so.1"), ("LIB_RM_VERSION_MISMATCH", "reboot")],
)
def test_nvml_that_never_starts_exits_4_with_advice(tmp_path, error, advice):
    faults = f'[[faults]]\ncall = "nvmlInit"\nerror = "{error}"\n'
    rc, logs, err = run_daemon(tmp_path, faults)
    assert rc == 4 and "Traceback" not in err
    assert len(events(logs, "nvml_init_failed")) == 2  # bounded: 3 attempts in the test config
    assert advice in events(logs, "nvml_unavailable")[0]["action"]
    assert not events(logs, "power_limit_set")


# 11 ------------------------------------------------------------------------------------
def test_another_tool_fighting_over_a_limit_is_marked_contested():
    specs = [card350(0), card350(1, busy(0, 350.0)), card350(2), card350(3)]
    rig = make_rig(specs, 1000, timings=T)
    rig.bank._events = [(10.0, 0, BankEvent(10.0, 0, "set_limit", limit_w=350.0, every_s=30.0))]
    with capture_logs() as logs:
        rig.run(9.9, watch(rig))
        assert rig.ctl.cards[0].role == Role.DONOR and rig.ctl.cards[1].role == Role.RECIPIENT
        rig.run(80.0, watch(rig, allow_outside=[10.0, 40.0, 70.0]))
    drift = events(logs, "limit_drift")
    assert [round(e["found_w"]) for e in drift] == [350, 350, 350]
    for t in (10.0, 40.0, 70.0):  # each found on the next tick and brought back at once
        fix = [w for rep in rig.reports if t <= rep.now < t + 0.15 for w in rep.writes if w.index == 0]
        assert fix and fix[0].to_w < 350.0
    c0 = rig.ctl.cards[0]
    assert c0.contested(rig.t) and c0.contested_w == 350.0
    assert events(logs, "limit_contested")[0]["competing_w"] == 350.0
    raises = [w for rep in rig.reports if rep.now > 70.05 for w in rep.writes if w.to_w > w.from_w]
    assert raises == []  # nothing raised while contested
    assert rig.ctl.mode == Mode.FAILSAFE


# Also ----------------------------------------------------------------------------------
def run_daemon(tmp_path, scenario_extra, budget=1000, stop_after=None, extra_config="", timeout=30, **daemon_kw):
    """Run ``powerbudgetd run --backend sim`` on a 2-card bank with ``scenario_extra``
    (TOML: faults, events), stopped (SIGTERM) once "ready" is logged, or ``stop_after``
    s after (timed from READY: a start-up slowed by a loaded machine does not eat into
    it), if given; return (exit status, JSON log events, stderr)."""
    scenario = tmp_path / "bank.toml"
    scenario.write_text(
        'bank = "ada-2"\n[[cards]]\nphases = [{ at_s = 0, kind = "constant", power_w = 300 }]\n' + scenario_extra
    )
    cfg = tmp_path / "pb.toml"
    cfg.write_text(
        f"budget_w = {budget}\nnvml_init_attempts = 3\nnvml_init_backoff_s = 0.05\n{extra_config}\n"
        f"[control]\ndonor_hold_s = 1.0\nrecipient_hold_s = 0.5\n[sim]\nscenario = '{scenario}'\n"
    )
    cfg.chmod(0o600)
    with DaemonProcess(cfg, **daemon_kw) as daemon:
        if stop_after is not None:
            daemon.wait_for(lambda: daemon.events("ready"), "ready", timeout_s=timeout)
        if isinstance(stop_after, float):
            time.sleep(stop_after)
        if stop_after is not None:
            daemon.send(signal.SIGTERM)
        rc = daemon.wait(timeout)
    return rc, daemon.events(), daemon.errors()


@pytest.mark.slow
def test_slow_nvml_does_not_freeze_the_watchdog(tmp_path):
    faults = '[[faults]]\ncall = "nvmlDeviceGetPowerUsage"\nerror = "SLOW"\ndelay_s = 2.5\nfrom_s = 2.0\ncount = 1\n'
    with NotifySocket() as notify:
        # 8 s past READY: the slow call (2 s into the bank's run, 2.5 s long) and a ping either side
        rc, logs, _ = run_daemon(tmp_path, faults, stop_after=8.0, notify=notify, watchdog_s=6.0)
    assert rc == 0
    pings = [t for t, m in notify.messages if m.get("WATCHDOG") == "1"]
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    assert len(pings) >= 3 and max(gaps) < 6.0  # never as long as WatchdogSec: no restart
    assert any(m.get("STOPPING") == "1" for _, m in notify.messages)


@pytest.mark.slow
def test_kill_9_mid_lend_restarts_into_a_safe_state(tmp_path):
    """Kill the daemon at random points while it lends and reclaims; the bank's limits
    outlive it (a state file, as a GPU keeps its limits). Each restart reaches fair
    share, decreases first, before READY=1."""
    import random

    rng = random.Random(7)
    state = tmp_path / "limits.json"
    extra = (
        '[[cards]]\nphases = [{ at_s = 0, kind = "idle" }, { at_s = 2.5, kind = "constant", power_w = 300 },'
        ' { at_s = 3.5, kind = "idle" }]\n'
    )
    scenario = tmp_path / "bank.toml"
    scenario.write_text(
        'bank = "workstation-4"\n[[cards]]\nphases = [{ at_s = 0, kind = "constant", power_w = 300 }]\n' + extra
    )
    cfg = tmp_path / "pb.toml"
    cfg.write_text(
        "budget_w = 1000\n[control]\ndonor_hold_s = 0.5\nrecipient_hold_s = 0.3\n"
        f"[sim]\nscenario = '{scenario}'\nlag_s = 0.3\nstate_file = '{state}'\n"
    )
    cfg.chmod(0o600)
    for attempt in range(4):
        with DaemonProcess(cfg) as daemon:
            # Timed from its first write (the bank's clock starts just before): a start-up
            # slowed by a loaded machine would otherwise move the kills out of the lending.
            daemon.wait_for(lambda: daemon.events("power_limit_set"), "a first write")
            time.sleep(rng.uniform(0.3, 3.5))
            daemon.kill()
        assert_safe_boot(daemon.events(), budget=1000.0)
        saved = json.loads(state.read_text())
        if saved["start_bound_mw"] <= 1_000_000:  # (the first run starts from the 4 x 300 W defaults)
            assert saved["peak_bound_mw"] <= 1_000_000, (attempt, saved)
    with DaemonProcess(cfg) as daemon:
        # Booted first: a stop during boot leaves at once with the cards where boot had
        # them (safe, but not at fair share: a CI failure on a slow start).
        daemon.wait_for(lambda: daemon.events("ready"), "READY")
        time.sleep(1.5)
        assert daemon.stop(10) == 0
    saved = json.loads(state.read_text())
    # Stopped once every card is confirmed at or below its fair share: a donor whose raise
    # back to its share had not landed when the last decrease was confirmed stays below.
    assert all(c["requested_mw"] <= 250_000 for c in saved["cards"]), saved["cards"]
    assert saved["peak_bound_mw"] <= 1_000_000


def assert_safe_boot(logs, budget):
    """Before ``ready``, no write raised the sum of limits above the budget."""
    for e in logs:
        if e["event"] == "ready":
            assert e["sum_limits_w"] <= budget
            return
        if e["event"] == "power_limit_set" and e["to_w"] > e["from_w"]:
            assert e["sum_after_w"] <= budget + 1e-6, e
