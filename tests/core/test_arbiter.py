"""The budget arbiter: the lowest current constraint, never above the configured budget;
the budget keeper the only caller of ``Controller.set_budget``; and, through the real daemon
reload path, MQTT bridge and controller, no interleaving of reloads, remote commands
and wall readings ever leaves the budget above the file's."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from powerbudgetd.channels.mqtt.session import MqttBridge
from powerbudgetd.control.controller import Controller
from powerbudgetd.core.arbiter import CONFIGURED, BudgetArbiter
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.config import load_config
from powerbudgetd.service.daemon import Daemon
from powerbudgetd.service.notify import Notifier
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import SimBank
from powerbudgetd_sim.scenario import load_scenario
from support.examples import examples
from support.paths import REPO
from support.configs import config_file

ROOT = REPO


# -- the arbiter alone --------------------------------------------------------------------
def test_lowest_current_constraint_wins_and_names_its_source() -> None:
    arb = BudgetArbiter(1000)
    d = arb.resolve(0.0)
    assert (d.budget_w, d.source, d.sources) == (1000, CONFIGURED, (("config", 1000),))
    arb.offer("wall_meter", 900, 0.0)
    arb.offer("remote", 850, 0.0)
    d = arb.resolve(1.0)
    assert (d.budget_w, d.source) == (850, "remote")
    assert dict(d.sources) == {"config": 1000, "wall_meter": 900, "remote": 850}
    arb.offer("remote", 1200, 2.0)  # above the configured budget: does not constrain
    assert (arb.resolve(2.0).budget_w, arb.resolve(2.0).source) == (900, "wall_meter")
    arb.withdraw("wall_meter")
    assert (arb.resolve(3.0).budget_w, arb.resolve(3.0).source) == (1000, CONFIGURED)
    arb.configure(800)  # a reload: offers stay, the ceiling moves
    assert arb.resolve(4.0).budget_w == 800 and arb.offered("remote") is not None


def test_an_expiring_offer_falls_back_to_its_expired_value() -> None:
    arb = BudgetArbiter(1000)
    arb.offer("circuit", 700, 0.0, expires_at_s=10.0, expired_w=600)  # a lease and its safe fallback
    arb.offer("ups", 800, 0.0, expires_at_s=5.0)  # a reading that ages out
    assert (arb.resolve(4.9).budget_w, arb.resolve(4.9).source) == (700, "circuit")
    assert dict(arb.resolve(5.0).sources) == {"config": 1000, "circuit": 700}
    assert arb.resolve(10.0).budget_w == 600


def test_below_the_floor_holds_the_cards_at_their_minimums_never_above_configured() -> None:
    arb = BudgetArbiter(1000)
    arb.set_floor(600)
    arb.offer("wall_meter", 100, 0.0)
    d = arb.resolve(0.0)
    assert (d.budget_w, d.wanted_w, d.below_floor, d.source) == (600, 100, True, "wall_meter")
    arb.set_floor(1200)  # a floor above the configured budget cannot raise it
    assert arb.resolve(0.0).budget_w == 1000


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, True, "800"])
def test_bad_budgets_are_refused_with_the_source_named(bad: object) -> None:
    arb = BudgetArbiter(1000)
    with pytest.raises(ValueError, match="remote"):
        arb.offer("remote", bad, 0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="config"):
        arb.configure(0)
    with pytest.raises(ValueError, match="configure"):
        arb.offer(CONFIGURED, 500, 0.0)
    assert arb.resolve(0.0).budget_w == 1000


STEP = st.one_of(
    st.tuples(st.just("configure"), st.floats(1, 5000)),
    st.tuples(st.just("offer"), st.sampled_from(["wall_meter", "remote", "ups", "circuit"]), st.floats(0, 6000),
              st.one_of(st.none(), st.floats(0, 100))),
    st.tuples(st.just("withdraw"), st.sampled_from(["wall_meter", "remote", "ups", "circuit"])),
    st.tuples(st.just("floor"), st.one_of(st.none(), st.floats(0, 6000))),
)


@given(st.floats(1, 5000), st.lists(STEP, max_size=40), st.floats(0, 200))
def test_the_effective_budget_is_never_above_the_configured_one(configured: float, steps: list, now: float) -> None:
    arb = BudgetArbiter(configured)
    for step in steps:
        if step[0] == "configure":
            arb.configure(step[1])
        elif step[0] == "offer":
            arb.offer(step[1], step[2], 0.0, expires_at_s=step[3])
        elif step[0] == "withdraw":
            arb.withdraw(step[1])
        else:
            arb.set_floor(step[1])
        d = arb.resolve(now)
        assert d.budget_w <= arb.configured_w
        assert d.wanted_w == min(v for _, v in d.sources)
        if not d.below_floor:
            assert d.budget_w == d.wanted_w  # the lowest current constraint, exactly


# -- the budget keeper is the only caller of Controller.set_budget -------------------------------
def _set_budget_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "set_budget":
                lines.append(node.lineno)
            elif isinstance(f, ast.Name) and f.id == "getattr" and any(
                isinstance(a, ast.Constant) and a.value == "set_budget" for a in node.args
            ):
                lines.append(node.lineno)
    return lines


def test_only_the_budget_keeper_calls_set_budget() -> None:
    daemon = ROOT / "powerbudgetd" / "control" / "budgetkeeper.py"
    files = [p for d in ("powerbudgetd", "sim", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    assert daemon in files and len(files) > 30
    offenders = {str(p.relative_to(ROOT)): lines for p in files if p != daemon and (lines := _set_budget_calls(p))}
    assert offenders == {}, "only control/budgetkeeper.py may call Controller.set_budget (with the arbiter's decision)"
    assert len(_set_budget_calls(daemon)) == 1  # BudgetKeeper.apply


def test_the_check_finds_a_call(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(ctl):\n    ctl.set_budget(800, reason='x')\n    getattr(ctl, 'set_budget')(1)\n")
    assert _set_budget_calls(bad) == [2, 3]


# -- every interleaving, through the real reload path, bridge and controller --------------
FEED = "[feed]\nbreaker_a = 15\nvolts = 120\nhost_w = 200\n"  # 1440 W at the plug: 1096 W of board power
# raise_interval_s = 0: every in-range command is taken (the rate limit on raises has
# its own test in test_mqtt_hostile.py)
MQTT = ('[mqtt]\nhost = "127.0.0.1"\nnode_id = "box"\n[mqtt.remote_budget]\nenabled = true\nraise_interval_s = 0\n'
        '[mqtt.wall_meter]\npreset = "tasmota"\ntopic = "plug"\nhysteresis_w = 20\n')
FILE_BUDGETS = [500, 700, 800, 900, 1000, 1200]  # 500 W is below the floor (4 x 150 W): refused

ACTION = st.one_of(
    st.tuples(st.just("reload"), st.sampled_from(FILE_BUDGETS)),
    st.tuples(st.just("remote"), st.sampled_from([450, 600, 700, 800, 900, 1000, 1100, 1300])),
    st.tuples(st.just("meter"), st.integers(100, 2500)),
    st.tuples(st.just("tick"), st.integers(1, 5)),
)


def _config(path: Path, budget_w: int) -> Path:
    return config_file(path, FEED, MQTT, budget_w=budget_w, mode=0o600)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(FILE_BUDGETS[1:]), st.lists(ACTION, min_size=1, max_size=30))
def test_no_interleaving_leaves_the_budget_above_the_files(tmp_path: Path, first_w: int, actions: list) -> None:
    path = _config(tmp_path / "powerbudgetd.toml", first_w)
    cfg = load_config(path)
    bank = SimBank(list(load_scenario("workstation-4").cards), lag_s=0.1, seed=1)
    nvml = Nvml(SimNvmlLibrary(bank))
    nvml.init()
    ctl = Controller(nvml, cfg.effective_budget_w())
    ctl.start()
    daemon = Daemon(nvml, lambda n: ctl, notifier=Notifier(""), config_path=path, settings=cfg)
    assert daemon.arbiter is not None and daemon.keeper is not None and cfg.mqtt is not None and cfg.feed
    t = [0.0]
    bridge = MqttBridge(cfg.mqtt, daemon.arbiter, cfg.feed.feed(), registry=CollectorRegistry(), clock=lambda: t[0])
    file_w = cfg.effective_budget_w()  # what the last good file says

    def tick() -> None:  # as Daemon._loop does it
        t[0] = round(t[0] + 0.1, 9)
        bank.advance_to(t[0])
        daemon.keeper.apply(ctl, t[0])  # type: ignore[union-attr]
        report = ctl.tick(t[0])
        snap = report.snapshot.with_budget(daemon.keeper.in_force)  # type: ignore[union-attr]
        daemon.arbiter.set_floor(snap.floor_w)  # type: ignore[union-attr]
        bridge.on_tick(dataclasses.replace(report, snapshot=snap))
        assert report.budget_w <= file_w and snap.budget_w <= file_w

    tick()
    for action in actions:
        kind, value = action
        if kind == "reload":
            _config(path, value)
            daemon._reload(ctl)
            if value >= 600:  # feasible: the file's budget (capped by its [feed]) is configured now
                file_w = min(value, cfg.feed.board_budget_w())
            else:  # below the 600 W of floors: the cards are held at their floors, nearer the file
                file_w = min(file_w, 600.0)
            assert daemon.arbiter.configured_w == file_w
        elif kind == "remote":
            response = bridge.inbox.remote_command(str(value).encode())
            assert response["ok"] == (600 <= value <= file_w), response
        elif kind == "meter":
            bridge.meter.reading(json.dumps({"ENERGY": {"Power": value}}).encode(), t[0], bridge.board_power_w())  # type: ignore[union-attr]
        else:
            for _ in range(value):
                tick()
        assert ctl.budget_mw <= file_w * 1000 + 1e-6
        assert daemon.arbiter.resolve(t[0]).budget_w <= file_w
    tick()
    # And the budget in force is exactly the lowest source (or the floor below it).
    d = daemon.arbiter.resolve(t[0])
    assert ctl.budget_mw == int(d.budget_w * 1000)
