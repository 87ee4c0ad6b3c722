"""check-config --backend refuses exactly what run refuses: every packaged scenario's
own config, and the example config with its [feed] block switched on."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.cli import main
from powerbudgetd_sim.scenario import list_scenarios, load_scenario
from support.daemon import DaemonProcess, Launch
from support.wait import wait_until
from support.configs import EXAMPLE, FEED_KEYS, uncomment



def scenario_config(name: str) -> str:
    """A scenario's own config: its budget, its [feed], its bank."""
    sc = load_scenario(name)
    text = f"budget_w = {sc.budget_w}\n"
    if sc.feed:
        text += "[feed]\n" + "".join(f"{k} = {v}\n" for k, v in sc.feed.items())
    return text + f'[sim]\nscenario = "{name}"\n'


def configs() -> dict[str, str]:
    out = {f"scenario {name}": scenario_config(name) for name, _ in list_scenarios()}
    feed = uncomment(EXAMPLE.read_text(), FEED_KEYS)
    ups = uncomment(EXAMPLE.read_text().replace("# # ups_", "# ups_"), FEED_KEYS + ("ups_w", "ups_margin"))
    out["example with [feed]"] = feed
    out["example with [feed] and its UPS"] = ups
    return out


def run_outcome(daemon: DaemonProcess, timeout_s: float = 60.0) -> int | str:
    """'started' once run logs that it is starting (the floors passed), else its exit status."""
    wait_until(lambda: daemon.events("starting") or daemon.returncode is not None, timeout_s, "starting, or an exit")
    if daemon.events("starting"):
        daemon.stop(30)
        return "started"
    return daemon.wait(30)


@pytest.mark.slow
def test_check_config_agrees_with_run_on_feasibility(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     launch: Launch) -> None:
    # many daemons at once: no /metrics port or recorder directory to share
    env = {"POWERBUDGETD_METRICS__ENABLED": "false", "POWERBUDGETD_RECORDER__ENABLED": "false"}
    daemons, paths = {}, {}
    for i, (what, text) in enumerate(configs().items()):
        path = tmp_path / f"c{i}.toml"
        path.write_text(text)
        paths[what] = path
        daemons[what] = launch(path, "--dry-run", env=env)
    outcomes = {what: run_outcome(daemon) for what, daemon in daemons.items()}
    seen = set()
    for what, path in paths.items():
        rc = main(["check-config", str(path), "--backend", "sim"])
        out, err = capsys.readouterr()
        ran = outcomes[what]
        assert ran in ("started", 3), (what, ran)
        if ran == "started":
            assert rc == 0, (what, err)
            assert "floors: checked on" in out
        else:
            assert rc == 3, (what, out)
            assert "budget_infeasible" in err and "floor 150 W vs share" in err  # each card named
        seen.add(ran)
    assert seen == {"started", 3}  # both outcomes are exercised
    assert outcomes["scenario incident"] == 3  # its [feed] allows 355 W against 600 W of floors
    assert outcomes["example with [feed]"] == "started"
    assert outcomes["example with [feed] and its UPS"] == 3
