"""An operator's first hour: every command tells the truth, every mistake gets a clear
answer (an exit status, no traceback, a message naming what was wrong).

In sections by what they hold (simulated runs kept apart, bad arguments, pipes and
--help, progress, hints, the environment, files as editors leave them, statements the
docs make, the main plot); every command and subcommand is run with --help and with its
output going to a reader that has already closed.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
import yaml

from powerbudgetd.cli import _parser, main
from powerbudgetd.powerlog.reader import clock_steps, load_samples, scan_log
from powerbudgetd.powerlog.report import Host, format_summary, summarize
from powerbudgetd.config import ConfigError, RecorderConfig, classify_env, load_config
from powerbudgetd.service.output import EXIT_BROKEN_PIPE, Progress

from support.daemon import cli, no_traceback
from support.powerlog import FEED, header, sample, write_run
from support.paths import REPO, manual

ELSEWHERE = Host("another-host", "another-boot", lambda pid: False)
T0 = 1_750_000_000.0


# -- simulated runs never land in the production flight recorder -------------------


def test_sim_runs_record_apart_and_the_report_tells_them_from_real_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    default = RecorderConfig()
    assert default.dir_for("nvml") == tmp_path and default.dir_for("sim") == tmp_path / "sim"
    chosen = RecorderConfig(dir=tmp_path / "mine")  # an explicit dir is the operator's choice
    assert chosen.dir_for("sim") == tmp_path / "mine"
    # Tried by a user who is not root, with the system's default: the user's own state
    # directory (/var/lib is root's); real runs keep the system's.
    monkeypatch.delenv("STATE_DIRECTORY")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    user = RecorderConfig()
    assert user.dir_for("sim") == tmp_path / "state" / "powerbudgetd" / "sim"
    assert user.dir_for("nvml") == Path("/var/lib/powerbudgetd")
    monkeypatch.setenv("XDG_STATE_HOME", "relative")  # not absolute: ignored, as XDG says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert RecorderConfig().dir_for("sim") == tmp_path / "home" / ".local" / "state" / "powerbudgetd" / "sim"
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert RecorderConfig().dir_for("sim") == Path("/var/lib/powerbudgetd/sim")
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))

    # A log with a real run that was cut and two later simulated runs that were cut too.
    write_run(tmp_path, "real", T0, 120, seq=1)
    for seq, run in ((2, "sim1"), (3, "sim2")):
        recs = [header(run, T0 + 1000 * seq, backend="sim")] + [
            sample(n, T0 + 1000 * seq + n, (290.0, 290.0), (300.0, 300.0), 600.0) for n in range(1, 60)]
        (tmp_path / f"power-{seq:08d}-20250615T000000Z.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    d = summarize(scan_log(tmp_path), 60.0, host=ELSEWHERE)
    assert d["stop"]["run"] == "real" and d["stop"]["backend"] == "nvml"
    assert [r["backend"] for r in d["runs"]] == ["nvml", "sim", "sim"]
    text = format_summary(d)
    assert "1 run(s) of the daemon on real cards, 2 simulated (--backend sim, left out)" in text

    # Only simulated runs: reported on, and said to be simulated.
    only_sim = tmp_path / "only"
    only_sim.mkdir()
    (only_sim / "power-00000001-20250615T000000Z.jsonl").write_text((tmp_path / "power-00000002-20250615T000000Z.jsonl").read_text())
    text = format_summary(summarize(scan_log(only_sim), 60.0, host=ELSEWHERE))
    assert "SIMULATED" in text and "no run on real cards" in text


@pytest.mark.slow  # the daemon on the wall clock
def test_run_backend_sim_writes_the_backend_into_the_header(tmp_path):
    import asyncio

    from powerbudgetd.control.controller import Controller
    from powerbudgetd.powerlog.recorder import from_config
    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd.service.daemon import Daemon

    cfg_path = tmp_path / "pb.toml"
    cfg_path.write_text("budget_w = 1000\n[metrics]\nenabled = false\n")
    settings = load_config(cfg_path)
    nvml = make_nvml("sim")
    daemon = Daemon(nvml, lambda n: Controller(n, 1000, settings.control.timings()), config_path=cfg_path,
                    settings=settings)
    rec_cfg = RecorderConfig(dir=tmp_path / "rec")
    daemon.register(from_config(rec_cfg, None, backend="sim"))

    async def go() -> int:
        task = asyncio.create_task(daemon.run())
        await asyncio.sleep(2.5)
        daemon.request_stop()
        return await task

    assert asyncio.run(go()) == 0
    index = scan_log(tmp_path / "rec")
    assert index.runs[0].header["backend"] == "sim" and index.runs[0].simulated


# -- bad arguments: a clear message and a non-zero exit, before any work -----------


@pytest.mark.parametrize(
    "args, status, words",
    [
        (["simulate", "--budget", "500"], 3, ["500 W", "minimum power limits", "600 W"]),
        (["simulate", "--budget", "500", "--policy", "all"], 3, ["500 W", "600 W"]),
        (["simulate", "--duration", "0"], 2, ["--duration", "positive", "'0'"]),
        (["simulate", "--duration", "-5"], 2, ["--duration", "positive", "'-5'"]),
        (["simulate", "--duration", "nan"], 2, ["--duration", "positive"]),
        (["simulate", "--budget", "abc"], 2, ["--budget", "not a number", "'abc'"]),
        (["simulate", "--plot", "/nonexistent/x.png"], 2, ["--plot", "no such directory", "/nonexistent"]),
        (["simulate", "--plot", "bank.txt"], 2, ["--plot", ".png"]),
        (["simulate", "--replay", "somewhere", "--scenario", "ada-2"], 2, ["--replay", "--scenario"]),
        (["simulate", "--replay-draw", "peak"], 2, ["--replay-draw", "needs --replay"]),
        (["simulate", "--suite", "--policy", "static"], 2, ["--suite", "--policy"]),
        (["simulate", "--list", "--json"], 2, ["--list", "--json"]),
        (["probe", "--scenario", "ada-2"], 2, ["--scenario", "--backend sim"]),
        (["log", "report", "--last", "0"], 2, ["--last", "must be a positive duration", "'0'"]),
        (["status", "--interval", "5"], 2, ["--interval", "--watch"]),
        (["status", "--watch", "--json"], 2, ["--watch", "--json"]),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(args, status, words, tmp_path):
    p = cli(*args, cwd=tmp_path, timeout=60)
    no_traceback(p)
    assert p.returncode == status, p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)
    assert p.stdout == ""


def test_an_unwritable_plot_costs_no_simulation(tmp_path):
    # Refused by argparse: main returns before any scenario is loaded or run.
    assert main(["simulate", "--duration", "3600", "--plot", str(tmp_path / "missing" / "x.png")]) == 2


# -- pipes, and --help, for every command and subcommand --------------------------


def _commands() -> list[list[str]]:
    out: list[list[str]] = [[]]

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out.append([*prefix, name])
                    walk(sub, [*prefix, name])

    walk(_parser(), [])
    return out


def test_every_command_has_help_with_descriptions_and_defaults():
    commands = _commands()
    assert {" ".join(c) for c in commands} >= {"simulate", "probe", "log", "log report", "status", "run", "check-config"}
    for cmd in commands:
        p = cli(*cmd, "--help")
        no_traceback(p)
        assert p.returncode == 0 and p.stdout.startswith("usage: powerbudgetd"), (cmd, p.stderr)
        assert "default: None" not in p.stdout and "default: False" not in p.stdout
    for name, sub in _subparsers().items():
        assert sub.description, name
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, (name, action.option_strings)
                if action.nargs != 0:  # takes a value: say what happens without it
                    assert "default" in action.help or action.default is not None, (name, action.dest)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from powerbudgetd import cli as cli_mod

    _parser()
    return dict(cli_mod._SUBPARSERS)


def test_backend_and_json_say_what_they_do():
    p = cli("probe", "--help")
    text = " ".join(p.stdout.split())
    assert "--backend {nvml,sim,hwmon,amdsmi,auto}" in text and "simulated bank, no GPU needed" in text and "(default: nvml)" in text
    assert "print one JSON object" in text


@pytest.mark.parametrize(
    "args",
    [
        ["--help"], ["simulate", "--help"], ["probe", "--help"], ["log", "--help"], ["log", "report", "--help"],
        ["status", "--help"], ["run", "--help"], ["check-config", "--help"],
        ["probe", "--json", "--backend", "sim"], ["simulate", "--list"], ["simulate", "--duration", "5"],
        ["log", "report", "--dir", "LOG"], ["check-config", "CONFIG"],
    ],
)
def test_a_reader_that_closes_early_gets_no_traceback(args, tmp_path):
    write_run(tmp_path, "r1", T0, 120)
    cfg = tmp_path / "pb.toml"
    cfg.write_text("budget_w = 1000\n")
    args = [str(tmp_path) if a == "LOG" else str(cfg) if a == "CONFIG" else a for a in args]
    p = cli(*args, closed_stdout=True, timeout=60)
    no_traceback(p)
    assert p.returncode in (0, EXIT_BROKEN_PIPE), p.stderr
    assert p.stderr == ""


def test_every_commands_help_into_a_closed_pipe_exits_quietly(tmp_path):
    # The enumeration above stays complete: a new command fails here until it is piped too.
    for cmd in _commands():
        p = cli(*cmd, "--help", closed_stdout=True)
        no_traceback(p)
        assert p.returncode in (0, EXIT_BROKEN_PIPE), (cmd, p.stderr)


# -- progress on long work, on a terminal only -----------------------------------


def test_suite_reports_each_scenario_as_it_finishes():
    from powerbudgetd_sim.scoreboard import run_suite

    seen: list[str] = []
    suite = run_suite(["ada-2", "h200-1"], duration_s=5, jobs=1, on_scenario=lambda name, s: seen.append(name))
    assert seen == ["ada-2", "h200-1"] and set(suite["scenarios"]) == set(seen)


def test_the_violation_line_says_reactive_is_excluded():
    from powerbudgetd_sim.scenario import load_scenario
    from powerbudgetd_sim.scoreboard import check_targets

    base = {"trips": {}, "work_vs_oracle": 1.0, "reclaim_latency_s": {"events": 0}, "work": 1.0}
    reports = {"static": {**base, "violation_ticks": 0}, "reactive": {**base, "violation_ticks": 2671}}
    first = check_targets(load_scenario("ada-2"), reports)[0]
    assert first.met is True and "reactive 2671: excluded" in first.detail and "everywhere" not in first.detail


def test_progress_is_silent_off_a_terminal_and_in_json(tmp_path):
    import io

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe, tty2 = Tty(), io.StringIO(), Tty()
    Progress(stream=tty).update("suite: 1 of 8")
    Progress(stream=pipe).update("suite: 1 of 8")
    Progress(enabled=False, stream=tty2).update("suite: 1 of 8")
    assert "suite: 1 of 8" in tty.getvalue() and pipe.getvalue() == "" and tty2.getvalue() == ""


def test_suite_streams_text_and_keeps_stderr_clean_in_a_pipe():
    p = cli("simulate", "--suite", "--duration", "3", timeout=300)
    no_traceback(p)
    assert p.stderr == ""  # no progress into a pipe
    assert p.returncode == (0 if "All targets met." in p.stdout else 1)  # a miss fails the command
    assert p.stdout.startswith("Targets:") and p.stdout.count("[met    ]") + p.stdout.count("[NOT MET]") > 5


# -- dead ends: a hint where there was none ---------------------------------------


def test_probe_without_nvml_points_at_the_simulator():
    try:
        from powerbudgetd.hw.nvml import load_pynvml

        load_pynvml().nvmlInit()
        pytest.fail("this test needs a host without a working NVML")  # never true on CI hosts
    except Exception:
        pass
    p = cli("probe")
    no_traceback(p)
    assert p.returncode == 4
    assert "NVML unavailable" in p.stderr and "--backend sim" in p.stderr


@pytest.mark.parametrize(
    "text, words",
    [
        ("budget_w = 1000\n[control]\ntick_ss = 0.1\n", ["control.tick_ss", "did you mean 'tick_s'"]),
        ("budgetw = 1000\n", ["budgetw", "did you mean 'budget_w'"]),
        ('budget_w = 1000\n[cards."0"]\nmax_ww = 200\n', ["cards.0.max_ww", "did you mean 'max_w'"]),
        ("budget_w = 1000\n[recorderr]\nenabled = false\n", ["recorderr", "did you mean 'recorder'"]),
    ],
)
def test_unknown_config_keys_get_a_did_you_mean(tmp_path, text, words):
    path = tmp_path / "pb.toml"
    path.write_text(text)
    p = cli("check-config", str(path))
    no_traceback(p)
    assert p.returncode == 2
    for w in words:
        assert w in p.stderr, p.stderr


# -- the environment ---------------------------------------------------------------


def test_a_secret_for_an_absent_section_does_not_stop_the_daemon(tmp_path):
    path = tmp_path / "pb.toml"
    path.write_text("budget_w = 1000\n")
    p = cli("check-config", str(path), env={"POWERBUDGETD_MQTT__PASSWORD": "s3cret"})
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert "warning: POWERBUDGETD_MQTT__PASSWORD set for [mqtt]" in p.stdout
    assert "no [mqtt] section" in p.stdout and "mqtt.host" in p.stdout and "stays off" in p.stdout
    assert "s3cret" not in p.stdout
    # What the daemon loads: MQTT off, the warning kept for its log (run logs config_warning).
    settings = _load_with_env(path, {"POWERBUDGETD_MQTT__PASSWORD": "s3cret"})
    assert settings.mqtt is None and any("POWERBUDGETD_MQTT__PASSWORD" in w for w in settings.warnings)


def test_a_complete_section_from_the_environment_still_applies(tmp_path, monkeypatch):
    path = tmp_path / "pb.toml"
    path.write_text("budget_w = 1000\n")
    settings = _load_with_env(path, {"POWERBUDGETD_MQTT__HOST": "broker.lan", "POWERBUDGETD_MQTT__PASSWORD": "x"})
    assert settings.mqtt is not None and settings.mqtt.host == "broker.lan" and not settings.warnings
    # A broken section the file does have is still an error, naming the variable.
    path.write_text('budget_w = 1000\n[mqtt]\nhost = "b"\n')
    with pytest.raises(ConfigError, match=r"mqtt.port.*POWERBUDGETD_MQTT__PORT"):
        _load_with_env(path, {"POWERBUDGETD_MQTT__PORT": "99999"})


def _load_with_env(path: Path, env: dict[str, str]):  # type: ignore[no-untyped-def]
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("POWERBUDGETD_")}
    os.environ.update(env)
    try:
        return load_config(path)
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)


def test_mistyped_and_foreign_environment_variables_are_told_apart(tmp_path):
    env = {
        "POWERBUDGETD_BUDGETW": "900", "POWERBUDGETD_PORT_9400_TCP": "tcp://10.0.0.5:9400",
        "POWERBUDGETD_PORT": "tcp://10.0.0.5:9400", "POWERBUDGETD_SERVICE_HOST": "10.0.0.5",
        "POWERBUDGETD_CONTROL__TICK_S": "0.2", "POWERBUDGETD_CARDS__0__MAX_W": "200",
    }
    report = classify_env(env)
    assert report.overrides == ["POWERBUDGETD_CARDS__0__MAX_W", "POWERBUDGETD_CONTROL__TICK_S"]
    assert report.unknown == [("POWERBUDGETD_BUDGETW", "POWERBUDGETD_BUDGET_W")]
    assert set(report.links) == {"POWERBUDGETD_PORT_9400_TCP", "POWERBUDGETD_PORT", "POWERBUDGETD_SERVICE_HOST"}
    path = tmp_path / "pb.toml"
    path.write_text("budget_w = 1000\n")
    p = cli("check-config", str(path), env=env)
    no_traceback(p)
    assert p.returncode == 0
    assert "POWERBUDGETD_BUDGETW is not a powerbudgetd setting" in p.stdout and "did you mean POWERBUDGETD_BUDGET_W" in p.stdout
    overrides = next(line for line in p.stdout.splitlines() if line.startswith("environment overrides"))
    assert "PORT" not in overrides and "SERVICE_HOST" not in overrides


# -- files as editors and machines leave them --------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"\xef\xbb\xbfbudget_w = 900\n[control]\ntick_s = 0.2\n",  # UTF-8 with a BOM (Notepad)
        b"budget_w = 900\r\n[control]\r\ntick_s = 0.2\r\n",  # CRLF
        "budget_w = 900\r\n[control]\r\ntick_s = 0.2\r\n".encode("utf-16"),  # UTF-16 with a BOM
        "budget_w = 900\n[control]\ntick_s = 0.2\n".encode("utf-16-be").join([b"\xfe\xff", b""]),
        b"budget_w = 900\r[control]\rtick_s = 0.2\r",  # classic Mac line ends
        b"budget_w\t=\t900\n[control]\n\ttick_s = 0.2\t# tabs\n",
    ],
)
def test_config_files_from_other_editors_load(tmp_path, data):
    path = tmp_path / "pb.toml"
    path.write_bytes(data)
    s = load_config(path)
    assert s.budget_w == 900 and s.control.tick_s == 0.2


@pytest.mark.parametrize(
    "data, words",
    [
        (b"budget_w = 900 # caf\xe9\n", ["not UTF-8", "0xe9", "line 1", "save the file as UTF-8"]),
        ("budget_w = 900\n".encode("utf-16-le"), ["NUL bytes", "UTF-16", "save it as UTF-8"]),
        (b"budget_w = = 900\n", ["not valid TOML", "line 1"]),
    ],
)
def test_config_files_that_cannot_load_name_the_cause(tmp_path, data, words):
    path = tmp_path / "pb.toml"
    path.write_bytes(data)
    p = cli("check-config", str(path))
    no_traceback(p)
    assert p.returncode == 2
    for w in words:
        assert w in p.stderr, p.stderr


@pytest.mark.parametrize("zeros", [0, 1, 511, 4096, 64 << 10, (64 << 10) + 1, 300_000])
@pytest.mark.parametrize("cut", ["clean", "mid_line", "mid_header_of_next"])
def test_a_power_cut_tail_of_any_size_still_shows_the_cut(tmp_path, zeros, cut):
    recs = write_run(tmp_path, "r1", T0, 300)
    path = next(tmp_path.glob("power-*.jsonl"))
    data = path.read_bytes()
    if cut == "mid_line":
        lines = data.split(b"\n")
        data = data[: len(data) - len(lines[-2]) // 2 - 1]  # half of the last record, no newline
        stop = recs[-2]
    elif cut == "mid_header_of_next":
        data += b'{"v": 1, "kind": "sam'
        stop = recs[-1]
    else:
        stop = recs[-1]
    path.write_bytes(data + b"\0" * zeros)
    index = scan_log(tmp_path)
    d = summarize(index, 60.0, host=ELSEWHERE)
    assert d["stop"]["utc"] == stop["utc"] and d["stop"]["ended"] == "abrupt"
    if zeros or cut != "clean":
        assert index.torn and any(s["torn"] for s in d["skipped_lines"])
    assert "the log stops at" in format_summary(d)


def _stepped_run(directory: Path, step_s: float, at_n: int, count: int) -> list[dict]:
    """One run, one record a second on the monotonic clock; the wall clock steps by
    ``step_s`` before record ``at_n``. Card 0 is busy (580 W peaks) until 20 min before
    the end, idle (90 W) after."""
    recs = [header("r1", T0, FEED)]
    for n in range(1, count + 1):
        utc = T0 + n + (step_s if n >= at_n else 0.0)
        busy = n < count - 1200
        avg = (500.0 if busy else 80.0, 10.0)
        peak = (580.0 if busy else 90.0, 12.0)
        recs.append(sample(n, utc, avg, peak, bank_peak=sum(peak)))
    (directory / "power-00000001-20250615T000000Z.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return recs


@pytest.mark.parametrize("step_s", [-7200.0, 3 * 365 * 86400.0])
def test_a_wall_clock_step_corrupts_neither_report_nor_replay(tmp_path, step_s):
    count = 3600
    recs = _stepped_run(tmp_path, step_s, at_n=count - 600, count=count)
    d = summarize(scan_log(tmp_path), 600.0, host=ELSEWHERE)
    assert d["window"]["samples"] == 601  # the last 10 minutes on the monotonic clock, not 1801
    assert d["bank"]["peak_w"] == pytest.approx(102.0)  # idle for the last 20 min: not the 592 W before
    assert d["stop"]["utc"] == recs[-1]["utc"]
    assert [round(c["step_s"]) for c in d["clock_steps"]] == [round(step_s)]
    text = format_summary(d)
    assert "the wall clock stepped " + ("backward" if step_s < 0 else "forward") in text
    samples, _ = load_samples(scan_log(tmp_path).files)
    assert len(clock_steps(samples)) == 1

    from powerbudgetd_sim.replay import load_replay

    sc = load_replay(tmp_path)
    assert sc.duration_s == pytest.approx(count, abs=2)  # an hour, not years and not folded
    assert "wall clock stepped" in sc.description


def test_a_wall_clock_step_between_runs_is_bounded_in_a_replay(tmp_path):
    write_run(tmp_path, "r1", T0, 60, seq=1)
    write_run(tmp_path, "r2", T0 + 20 * 365 * 86400, 60, seq=2)  # the next boot's clock is years ahead
    from powerbudgetd_sim.replay import MAX_GAP_S, load_replay

    sc = load_replay(tmp_path)
    assert sc.duration_s <= 120 + MAX_GAP_S + 5 and "gap(s) between runs" in sc.description


# -- statements that are true --------------------------------------------------------


def test_sizing_keeps_the_host_draw_caveat(tmp_path):
    write_run(tmp_path, "r1", T0, 100, feed=None)
    text = format_summary(summarize(scan_log(tmp_path), 60.0, host=ELSEWHERE))
    sizing = next(line for line in text.splitlines() if line.startswith("sizing:"))
    assert "host draw unknown" in sizing and "more than" in sizing


def test_the_docs_list_every_alert_and_metric_and_say_what_dry_run_leaves_alone():
    readme = manual()
    rules = yaml.safe_load((REPO / "config/prometheus-rules.yml").read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 7  # the seven, and every alert added since
    for a in alerts:
        assert f"| `{a}` |" in readme, a

    from prometheus_client import CollectorRegistry

    from powerbudgetd.channels.metrics import Metrics

    reg = CollectorRegistry()
    Metrics(reg)
    names = {m.name for m in reg.collect()}
    for name in names:
        assert name in readme, name
    assert "`monitor-only`" in readme
    assert not any("dry-run" in line and "writes nothing" in line for line in readme.splitlines())
    assert "--dry-run" in readme and "writes no power limit" in readme
    assert "needs root" in readme and "Prometheus" in (REPO / "CONTRIBUTING.md").read_text().split("Install and run the tests")[1][:1200]


# -- the main plot --------------------------------------------------------------------


def test_plot_marks_boot_floors_roles_and_has_one_legend():
    from powerbudgetd_sim.scenario import load_scenario
    from powerbudgetd_sim.simulate import plot_figure, run_scenario

    res = run_scenario(load_scenario("workstation-4"), duration_s=30, keep_series=True, compare=False)
    fig = plot_figure(res, 1000.0, "t")
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(lbl.startswith("boot") for lbl in labels)
    assert "floor (minimum limit)" in labels and "budget in force" in labels and "summed instant draw" in labels
    assert {"role: donor", "role: recipient"} <= set(labels)
    # Each card's floor is drawn at its minimum limit.
    for i, ax in enumerate(fig.axes[:len(res.report["cards"])]):
        assert any(list(line.get_ydata()) == [150.0, 150.0] for line in ax.get_lines()), i


def _figure_of(draw, *args):  # type: ignore[no-untyped-def]
    """The figure ``draw(*args)`` would save."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    captured = {}
    real_savefig = plt.Figure.savefig

    def keep(self, *a, **k):  # type: ignore[no-untyped-def]
        captured["fig"] = self

    plt.Figure.savefig = keep  # type: ignore[method-assign]
    try:
        draw(*args)
    finally:
        plt.Figure.savefig = real_savefig  # type: ignore[method-assign]
    return captured["fig"]


def test_the_plot_tells_the_power_story_budget_in_force_battery_and_trips():
    """power-event: a minute on battery lowers the budget in force (a step line, not the
    configured one), the window is shaded on every panel; incident: the UPS trip is
    marked, and the plug panel holds the wall power against the UPS rating."""
    from powerbudgetd_sim.scenario import load_scenario
    from powerbudgetd_sim.simulate import plot_figure, run_scenario

    res = run_scenario(load_scenario("power-event"), keep_series=True, compare=False)
    fig = plot_figure(res, 1000.0, "power-event")
    bank = fig.axes[len(res.report["cards"])]
    in_force = next(line for line in bank.get_lines() if line.get_label() == "budget in force")
    assert max(in_force.get_ydata()) == 1000.0 and min(in_force.get_ydata()) < 1000.0
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "on battery (mains lost)" in labels and "configured budget 1000 W" in labels
    for ax in fig.axes:  # the minute on battery (40-100 s), shaded on every panel
        spans = [p for p in ax.patches if p.get_label() == "on battery"]
        assert len(spans) == 1 and spans[0].get_x() == pytest.approx(40, abs=0.2), ax.get_ylabel()

    res = run_scenario(load_scenario("incident"), keep_series=True, compare=False)
    trip = res.report["trip_at_s"]["ups"]
    assert trip is not None
    fig = plot_figure(res, 1000.0, "incident")
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "ups trip" in labels and any(lbl.startswith("UPS rating") for lbl in labels)
    assert any(lbl.startswith("bank dark") for lbl in labels)
    dark = res.report["dark_at_s"]
    assert trip <= dark <= trip + 0.2  # the refresh that found it tripped
    for ax in fig.axes:
        assert any(list(line.get_xdata()) == [trip, trip] for line in ax.get_lines())
        assert any(p.get_x() == pytest.approx(dark) for p in ax.patches)  # shaded from then on
    assert fig.axes[-1].get_ylabel() == "at the plug (W)"


def test_a_long_plot_title_is_wrapped_to_the_figure():
    from powerbudgetd_sim.scenario import load_scenario
    from powerbudgetd_sim.simulate import plot_figure, run_scenario

    res = run_scenario(load_scenario("ada-2"), duration_s=5, keep_series=True, compare=False)
    title = "ada-2: " + "a description long enough to run past the edge of any figure " * 4
    fig = plot_figure(res, 400.0, title)
    lines = fig._suptitle.get_text().splitlines()
    assert len(lines) >= 2 and " ".join(lines) == " ".join(title.split())
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width


def test_policy_all_is_small_multiples_with_the_budget_in_no_policy_colour():
    from powerbudgetd_sim.scenario import load_scenario
    from powerbudgetd_sim.simulate import plot_compare, run_policies

    results = run_policies(load_scenario("ada-2"), ("static", "reactive", "powerbudgetd"), duration_s=5,
                           keep_series=True)
    fig = _figure_of(plot_compare, results, 400.0, "unused.png", "t")
    panels = [ax for ax in fig.axes if ax.get_title(loc="left")]
    assert [ax.get_title(loc="left").split(":")[0] for ax in panels] == ["static", "reactive", "powerbudgetd"]
    for ax in panels:
        budget = next(line for line in ax.get_lines() if line.get_label() == "budget in force")
        assert budget.get_color() not in {line.get_color() for line in ax.get_lines() if line is not budget}
    assert "budget in force" in [t.get_text() for t in fig.legends[0].get_texts()]
