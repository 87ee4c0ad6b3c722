"""`simulate --circuit --tree` and `check-config --tree`: arguments checked before any
work, a bad tree file refused with its problems one line each, the scoreboard printed,
and a host's place in the tree checked against its config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from powerbudgetd.cli import main
from powerbudgetd.errors import ExitStatus


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--tree", "row-4"], "--tree needs --circuit without hosts (the tree names them)"),
    (["simulate", "--circuit", "h200-1,ada-2", "--tree", "row-4"], "--tree needs --circuit without hosts"),
    (["simulate", "--circuit", "--tree", "row-4", "--policy", "static"], "cannot be combined with --policy"),
])
def test_tree_options_that_cannot_go_together_are_refused_before_any_work(argv, message, capsys):
    assert main(argv) == ExitStatus.CONFIG  # 2, usage
    assert message in capsys.readouterr().err


def test_a_bad_tree_file_is_refused_with_each_problem_on_its_line(tmp_path, capsys):
    path = tmp_path / "tree.toml"
    path.write_text('[nodes.site]\nbudget_w = 100\n[nodes.a]\nparent = "site"\nkind = "rack"\nbudget_w = 50\n'
                    '[hosts.h1]\ncords = { a = 1.0 }\nreserve_w = 80\n')
    assert main(["simulate", "--circuit", "--tree", str(path)]) == ExitStatus.CONFIG
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"powerbudgetd: --tree: {path}: invalid power tree"
    assert err[1:] == ["  nodes.a: kind: 'rack' is not one of site, feed, ups, panel, pdu, circuit, outlet"]
    assert main(["simulate", "--circuit", "--tree", "row-9"]) == ExitStatus.CONFIG
    assert "no tree 'row-9'" in capsys.readouterr().err


PACKAGED = Path(__file__).resolve().parents[2] / "sim" / "trees" / "row-4.toml"
CONFIG = """budget_w = 1000
[circuit]
name = "row"
endpoints = ["10.0.0.5:2379"]
host = "{host}"
reserve_w = {reserve}
psu_efficiency = 0.9
host_w = 300
"""


def test_check_config_shows_this_hosts_place_in_the_tree(tmp_path, capsys):
    cfg = tmp_path / "pb.toml"
    cfg.write_text(CONFIG.format(host="r1-h01", reserve=1050))
    assert main(["check-config", str(cfg), "--tree", str(PACKAGED)]) == ExitStatus.OK
    out = capsys.readouterr().out.splitlines()
    assert "power tree: host r1-h01, class 1: r1-a (50%) <- feed-a <- row, r1-b (50%) <- feed-b <- row" in out
    assert "  feed pair feed-a / feed-b: oversubscribed, shed within 2 s" in out
    assert any(line.startswith("  seat 1050 W in the tree; the largest grant beside every other seat: ") for line in out)
    # A frozen daemon sheds only after the watchdog and the failsafe: 10 + 10 s, not 2 s.
    assert ("  note: a frozen daemon sheds only once its watchdog kills it and the failsafe lowers its cards: "
            "WatchdogSec (10 s in the packaged unit) + fallback_s (10 s) = 20 s, beyond the pair's 2 s: the "
            "surviving side must tolerate the overload that long, or shorten both") in out


def test_check_config_checks_the_feed_a_ups_carries_against_the_tree(tmp_path, capsys):
    cfg = tmp_path / "pb.toml"
    ups = '[ups]\nname = "gpuups"\nfeed = "{feed}"\n'
    cfg.write_text(CONFIG.format(host="r1-h01", reserve=1050) + ups.format(feed="feed-a"))
    assert main(["check-config", str(cfg), "--tree", str(PACKAGED)]) == ExitStatus.OK
    assert ("  UPS gpuups@127.0.0.1 carries feed feed-a: marked lost in the circuit while it is on battery"
            in capsys.readouterr().out.splitlines())
    cfg.write_text(CONFIG.format(host="r1-h01", reserve=1050) + ups.format(feed="r1-a"))
    assert main(["check-config", str(cfg), "--tree", str(PACKAGED)]) == ExitStatus.CONFIG
    assert f"powerbudgetd: {PACKAGED}: [ups] feed 'r1-a' is no feed of the tree (feeds: feed-a, feed-b)" in \
        capsys.readouterr().err


def test_the_packaged_watchdog_check_config_assumes_is_the_unit_s() -> None:
    from powerbudgetd.service.checkconfig import PACKAGED_WATCHDOG_S

    unit = (Path(__file__).resolve().parents[2] / "systemd" / "powerbudgetd.service").read_text()
    assert f"\nWatchdogSec={PACKAGED_WATCHDOG_S:g}\n" in unit


@pytest.mark.parametrize("host, reserve, problem", [
    ("r1-h01", 1200, "[circuit] reserve_w 1200 W is above this host's seat in the tree (1050 W)"),
    ("gpu9", 1050, "[circuit] host 'gpu9' is not in the tree (hosts: r1-h01, "),
])
def test_check_config_refuses_a_host_the_tree_does_not_count(tmp_path, capsys, host, reserve, problem):
    cfg = tmp_path / "pb.toml"
    cfg.write_text(CONFIG.format(host=host, reserve=reserve))
    assert main(["check-config", str(cfg), "--tree", str(PACKAGED)]) == ExitStatus.CONFIG
    assert f"powerbudgetd: {PACKAGED}: {problem}" in capsys.readouterr().err


@pytest.mark.slow  # five runs of 40 simulated hosts
def test_simulate_circuit_tree_prints_the_scoreboard(capsys):
    assert main(["simulate", "--circuit", "--tree", "row-4", "--duration", "4", "--json"]) == ExitStatus.OK
    result = json.loads(capsys.readouterr().out)
    assert list(result) == ["static", "redundant", "oversubscribed", "declared", "oracle"]
    for r in result.values():
        assert r["hosts"] == 40 and r["feed_lost"] == "feed-a" and r["lost_at_s"] == 2  # half-way: 60 s is past the end
        assert {"work_tgp_s", "work_vs_oracle", "trips", "shed_s", "draw_shed_s", "survivors"} <= set(r)
    assert main(["simulate", "--circuit", "--tree", "row-4", "--duration", "4"]) == ExitStatus.OK
    out = capsys.readouterr().out
    assert out.startswith("power tree: 40 hosts, 4 s, feed-a lost at 2 s\n")
    assert all(f"  {name} " in out for name in result)
