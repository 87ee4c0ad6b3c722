"""The command line at its edges: Ctrl-C, an unwritable plot, absurd durations, the
suite's exit status, log lines on stderr, the documented report keys, replay's header,
and the smaller messages. Each asserts the exit status, no traceback, and the message naming what was
wrong.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from powerbudgetd.cli import SIM_MAX_DURATION_S, SIM_MIN_DURATION_S, main
from powerbudgetd.errors import ExitStatus

from support.powerlog import header, sample
from support.daemon import clean_env, cli, no_traceback
from support.paths import REPO, manual, manual_files
from support.configs import config_file

T0 = 1_750_000_000.0


# -- Ctrl-C stops quietly, 130 ------------------------------------------------------


def interrupt(args: list[str], after_s: float, started: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``powerbudgetd ARGS`` in its own process group and send SIGINT to the whole
    group, as a terminal's Ctrl-C does (the suite's worker processes get it too):
    ``after_s`` after start, or after ``started`` appears on stdout."""
    proc = subprocess.Popen([sys.executable, "-m", "powerbudgetd", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(), start_new_session=True)
    assert proc.stdout is not None
    if started is not None:
        line = proc.stdout.readline()
        assert started in line, line
    time.sleep(after_s)
    assert proc.poll() is None, "finished before the interrupt: the test needs a longer run"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.slow  # long simulations in a subprocess
@pytest.mark.parametrize(
    "args, started",
    [
        (["simulate", "--policy", "all", "--duration", "3600"], None),
        (["simulate", "--duration", "86400"], None),
        (["simulate", "--suite"], "Targets:"),
    ],
)
def test_ctrl_c_stops_simulate_with_one_line_and_130(args, started):
    p = interrupt(args, after_s=3.0 if started is None else 1.5, started=started)
    no_traceback(p)
    assert p.returncode == ExitStatus.INTERRUPTED == 130
    assert p.stderr == "powerbudgetd: interrupted\n"  # the suite's workers say nothing


# -- an unwritable plot is refused before any work ----------------------------------


@pytest.mark.parametrize("path", ["/proc/powerbudgetd-x.png", "/sys/powerbudgetd-x.png"])
def test_a_plot_into_a_pseudo_filesystem_is_refused_up_front(path):
    t0 = time.monotonic()
    p = cli("simulate", "--plot", path)
    no_traceback(p)
    assert p.returncode == 2 and "--plot" in p.stderr and path in p.stderr and "cannot write it" in p.stderr
    assert time.monotonic() - t0 < 30  # refused before the run (which takes far longer)
    assert not Path(path).exists()


def test_the_plots_writability_check_leaves_no_file_behind(tmp_path):
    from powerbudgetd.service.cliargs import writable_plot

    target = tmp_path / "bank.png"
    assert writable_plot(str(target)) == str(target) and not target.exists()
    target.write_bytes(b"keep")
    assert writable_plot(str(target)) == str(target) and target.read_bytes() == b"keep"


def test_a_plot_that_fails_at_save_time_is_one_line_after_the_report(tmp_path, monkeypatch, capsys):
    import powerbudgetd_sim.simulate as simulate

    def full_disk(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(simulate, "plot", full_disk)
    status = main(["simulate", "--scenario", "ada-2", "--duration", "5", "--plot", str(tmp_path / "x.png")])
    out, err = capsys.readouterr()
    assert status == ExitStatus.ERROR
    assert "violation ticks" in out  # the report came first and is whole
    assert "--plot" in err and "No space left on device" in err and "Traceback" not in err


# -- durations bounded; no nonsense from a short run ----------------------------------


@pytest.mark.parametrize("value, words", [("0.01", ["--duration", "at least 1"]), ("1e9", ["--duration", "at most 604800"])])
def test_simulate_durations_out_of_range_are_refused(value, words):
    p = cli("simulate", "--duration", value)
    no_traceback(p)
    assert p.returncode == 2 and all(w in p.stderr for w in words), p.stderr


def test_the_command_lines_duration_bounds_are_the_simulators():
    from powerbudgetd_sim.scenario import MAX_DURATION_S, MIN_DURATION_S

    assert (SIM_MIN_DURATION_S, SIM_MAX_DURATION_S) == (MIN_DURATION_S, MAX_DURATION_S)


def test_a_scenario_file_with_an_absurd_duration_is_refused(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('bank = "ada-2"\nduration_s = 1e9\n')
    p = cli("simulate", "--scenario", str(f))
    no_traceback(p)
    assert p.returncode == 2 and "duration_s" in p.stderr and "7 days" in p.stderr


def test_a_short_simulation_reports_no_absurd_figures(capsys):
    assert main(["simulate", "--scenario", "ada-2", "--duration", "1"]) == 0
    out = capsys.readouterr().out
    assert "NEVER READY" not in out and "too short for a per-minute rate" in out
    from powerbudgetd_sim.scenario import load_scenario
    from powerbudgetd_sim.simulate import format_report, run_scenario

    r = run_scenario(load_scenario("ada-2"), duration_s=0.0).report  # the API allows it: guarded, not absurd
    assert all(c["mean_power_w"] is None for c in r["cards"]) and r["writes_per_card_per_min"]["mean"] is None
    text = format_report(r)
    assert "e+" not in text and "- W" in text


# -- the controller's log lines stay off stderr --------------------------------------


@pytest.mark.slow  # simulations in a subprocess
def test_simulate_keeps_the_controllers_logs_off_stderr():
    p = cli("simulate", "--scenario", "power-event", "--policy", "all", "--duration", "60")
    no_traceback(p)
    assert p.returncode == 0 and p.stderr == ""  # budget_below_floor would be logged here
    v = cli("simulate", "--scenario", "power-event", "--duration", "60", "--log-level", "warning")
    assert v.returncode == 0 and '"event": "budget_below_floor"' in v.stderr


# -- replay: the budgets and the feed recorded, simulated runs marked ----------------


def write_log(directory: Path, budgets: list[float], backend: str = "nvml") -> None:
    recs = [header("r1", T0, backend=backend)]
    for n, b in enumerate(budgets, start=1):
        rec = sample(n, T0 + n, (200.0, 180.0), (210.0, 190.0), 400.0)
        rec["budget_w"] = b
        recs.append(rec)
    (directory / "power-00000001-20250615T000000Z.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_replay_says_the_budgets_recorded_and_uses_the_recorded_feed(tmp_path, capsys):
    write_log(tmp_path, [996.0] * 20 + [800.0] * 20 + [650.0] * 20)
    assert main(["simulate", "--replay", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "recorded at budgets from 650 to 996 W (2 change(s); 650 W at the end)" in out
    assert "feed as recorded" in out and "none stated" not in out and "SIMULATED" not in out


def test_replay_marks_simulated_runs(tmp_path, capsys):
    write_log(tmp_path, [500.0] * 30, backend="sim")
    assert main(["simulate", "--replay", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED: 1 of 1 recorded run(s) came from --backend sim" in out
    assert "recorded at budget 500 W;" in out


# -- the suite's status says what its footer says ------------------------------------


def test_the_suite_exits_1_on_a_target_not_met(monkeypatch, capsys):
    import powerbudgetd_sim.scoreboard as scoreboard

    def one_miss(names, **_kw):
        check = {"target": scoreboard.TARGETS[2], "met": False, "detail": "0.9"}
        return {"targets": list(scoreboard.TARGETS), "all_met": False,
                "scenarios": {"ada-2": {"description": "", "reports": {}, "checks": [check]}}}

    monkeypatch.setattr(scoreboard, "run_suite", one_miss)
    assert main(["simulate", "--suite", "--json"]) == ExitStatus.ERROR
    assert json.loads(capsys.readouterr().out)["all_met"] is False
    assert main(["simulate", "--suite"]) == ExitStatus.ERROR
    assert "1 target(s) NOT MET" in capsys.readouterr().out


def test_the_manual_states_the_suites_exit_status():
    readme = manual()
    row = next(line for line in readme.splitlines() if line.startswith("| `powerbudgetd simulate --suite"))
    assert "exit 1 when any target is NOT MET" in row


# -- the README's keys are the report's ----------------------------------------------


def test_the_docs_document_the_over_budget_keys_and_the_table_says_which():
    from powerbudgetd_sim.scenario import load_scenario
    from powerbudgetd_sim.scoreboard import format_table
    from powerbudgetd_sim.simulate import run_scenario

    readme = manual()
    para = readme[readme.index("`simulate --json` prints one object"):]
    para = para[:para.index("\n\n")]
    report = run_scenario(load_scenario("ada-2"), duration_s=5, compare=False).report
    for key in ("over_budget_s", "draw_over_budget_s", "ready_s", "over_budget_episodes"):
        assert f"`{key}`" in para and key in report
    assert "sum of *limits*" in para and "*draw*" in para
    assert "draw>budget" in format_table({"powerbudgetd": report}).splitlines()[0]
    assert "`draw_over_budget_s`" in readme[readme.index("*draw>budget* column"):][:200]


@pytest.mark.slow  # a simulation in a subprocess
def test_the_docs_say_what_simulate_incident_does():
    readme = manual()
    inc = readme[readme.index("- `incident`: at the operator's 1000 W"):]
    inc = inc[:inc.index("\n- ")]
    assert "UPS tripped at\n  90 s" in inc and "powerbudgetd@feed" in inc
    p = cli("simulate", "--scenario", "incident", "--json")
    assert p.returncode == 0
    r = json.loads(p.stdout)
    assert r["budget_w"] == 1000 and r["trips"]["ups"] is True and r["trip_at_s"]["ups"] == 90.0


# -- smaller messages ------------------------------------------------------------------


def config(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    return config_file(tmp_path, text, budget_w=None, mode=mode)


@pytest.mark.parametrize(
    "text, words",
    [
        ("ups_w = 900\n", ["ups_w", "is a key of [feed]", "move it there"]),
        ("budget_w = 900\ntick_s = 0.1\n", ["tick_s", "[control]"]),
        ("budgetw = 1000\n", ["did you mean 'budget_w'"]),  # a typo still gets its did-you-mean
    ],
)
def test_a_config_key_of_another_section_is_pointed_there(tmp_path, text, words):
    p = cli("check-config", str(config(tmp_path, text)))
    no_traceback(p)
    assert p.returncode == 2 and all(w in p.stderr for w in words), p.stderr
    assert "did you mean 'ups'" not in p.stderr


@pytest.mark.parametrize(
    "text, name",
    [
        ('budget_w = "900"\n', "budget_w"),
        ('budget_w = 900\n[feed]\nhost_w = 250\nbreaker_a = 15\nups_w = "900"\n', "feed.ups_w"),
        ('budget_w = 900\n[cards."0"]\nmax_w = "200"\n', "cards.0.max_w"),
        ('budget_w = 900\n[control]\ntick_s = "0.1"\n', "control.tick_s"),
    ],
)
def test_a_config_number_written_as_a_string_is_refused(tmp_path, text, name):
    p = cli("check-config", str(config(tmp_path, text)))
    no_traceback(p)
    assert p.returncode == 2 and f"{name}: a number, not a string" in p.stderr and "without quotes" in p.stderr


def test_a_number_from_the_environment_is_a_string_and_accepted(tmp_path):
    p = cli("check-config", str(config(tmp_path, "budget_w = 900\n")), env={"POWERBUDGETD_BUDGET_W": "800"})
    assert p.returncode == 0 and "800" in p.stdout


def test_check_config_on_a_directory_says_so(tmp_path):
    p = cli("check-config", str(tmp_path))
    no_traceback(p)
    assert p.returncode == 2 and "is a directory" in p.stderr and "no such config file" not in p.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["--last", "10"], ["--last", "give a unit", "10s", "10m"]),
        (["--last", "-5m"], ["--last", "must be a positive duration", "'-5m'"]),
        (["--last=-5m"], ["--last", "must be a positive duration"]),
    ],
)
def test_log_report_last_needs_a_unit_and_a_positive_value(tmp_path, args, words):
    p = cli("log", "report", "--dir", str(tmp_path), *args)
    no_traceback(p)
    assert p.returncode == 2 and all(w in p.stderr for w in words), p.stderr
    assert "expected one argument" not in p.stderr


def test_a_negative_simulate_duration_names_the_value():
    p = cli("simulate", "--duration", "-5")
    no_traceback(p)
    assert p.returncode == 2 and "--duration" in p.stderr and "'-5'" in p.stderr


def test_a_missing_path_is_exit_2_for_log_report_and_replay(tmp_path):
    missing = str(tmp_path / "nonexistent")
    for args in (["log", "report", "--dir", missing], ["simulate", "--replay", missing]):
        p = cli(*args)
        no_traceback(p)
        assert p.returncode == ExitStatus.CONFIG == 2 and f"{missing}: no such file or directory" in p.stderr


def test_log_report_with_a_config_without_a_recorder_dir_does_not_suggest_config(tmp_path):
    cfg = config(tmp_path, "budget_w = 900\n")
    p = cli("log", "report", "--config", str(cfg), env={"STATE_DIRECTORY": str(tmp_path / "state")})
    no_traceback(p)
    assert p.returncode == 2 and f"{cfg} sets no [recorder] dir" in p.stderr
    assert "--config FILE" not in p.stderr and "--dir DIR" in p.stderr


def nvml_missing() -> bool:
    try:
        from powerbudgetd.hw.nvml import load_pynvml

        load_pynvml().nvmlInit()
    except Exception:
        return True
    return False


@pytest.mark.parametrize(
    "args, hint",
    [
        (["check-config", "CFG", "--backend", "nvml"], "`powerbudgetd check-config CFG --backend sim`"),
        (["probe", "--compare-sim"], "`powerbudgetd probe --compare-sim --backend sim`"),
        (["probe"], "`powerbudgetd probe --backend sim`"),
    ],
)
def test_without_nvml_every_command_gives_the_same_hint(tmp_path, args, hint):
    if not nvml_missing():
        pytest.fail("this test needs a host without a working NVML")  # never true on CI hosts
    cfg = str(config(tmp_path, "budget_w = 900\n"))
    p = cli(*[cfg if a == "CFG" else a for a in args])
    no_traceback(p)
    assert p.returncode == ExitStatus.NVML and "NVML unavailable" in p.stderr
    assert hint.replace("CFG", cfg) in p.stderr and "install the NVIDIA driver" in p.stderr


@pytest.mark.parametrize(
    "text, advice, wrong",
    [
        ('budget_w = 900\n[ups]\nname = "ups"\npassword = "s3cret"\n', "LoadCredential=ups-password", "mqtt-password"),
        ('budget_w = 900\n[mqtt]\nhost = "b"\npassword = "s3cret"\n', "LoadCredential=mqtt-password", "UPS"),
    ],
)
def test_a_secret_in_an_open_file_gets_its_own_sections_advice(tmp_path, text, advice, wrong):
    from powerbudgetd.config import _secret_advice, parse_toml, secret_keys

    path = config(tmp_path, text, mode=0o644)
    advice_lines = " ".join(_secret_advice(secret_keys(parse_toml(path))))
    assert advice in advice_lines and wrong not in advice_lines
    if os.geteuid() == 0:  # the check applies to root (the daemon's user) only
        tmp_path.chmod(0o755)
        p = cli("check-config", str(path))
        no_traceback(p)
        assert p.returncode == 2 and advice in p.stderr and wrong not in p.stderr and "s3cret" not in p.stderr


def test_help_texts_and_metavars_agree():
    from powerbudgetd.cli import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    simulate_help = sub.choices["simulate"].format_help()
    assert "an hour" not in simulate_help and "300 s" in simulate_help
    for command in ("simulate", "probe", "check-config"):
        scenario = next(a for a in sub.choices[command]._actions if "--scenario" in a.option_strings)
        assert scenario.metavar == "NAME_OR_FILE", command


def test_probe_prints_na_without_a_unit():
    from powerbudgetd.hw.probe import format_probe

    gpu = {"index": 0, "name": "Card", "uuid": "GPU-0", "min_limit_w": 150.0, "max_limit_w": 300.0,
           "default_limit_w": 300.0, "requested_limit_w": 250.0, "enforced_limit_w": 250.0,
           "power_avg_w": 100.0, "power_instant_w": None, "persistence_mode": True, "mig_mode": None}
    text = format_probe({"driver": "580", "gpus": [gpu]})
    assert "n/a (instant)" in text and "n/a W" not in text and "100.0 W (1 s average)" in text
    assert "150.0 W - 300.0 W (default 300.0 W)" in text


def test_the_metrics_endpoint_serves_metrics_and_404_elsewhere():
    import urllib.error
    import urllib.request

    from prometheus_client import CollectorRegistry

    from powerbudgetd.channels.metrics import Metrics, serve

    server = serve(Metrics(CollectorRegistry()), "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            assert resp.status == 200 and b"powerbudgetd_build_info{" in resp.read()
        with urllib.request.urlopen(f"{base}/", timeout=5) as resp:
            assert resp.status == 200 and b"/metrics" in resp.read()
        for path in ("/nope", "/metrics/x", "/favicon.ico"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{base}{path}", timeout=5)
            assert err.value.code == 404 and path.encode() in err.value.read()
    finally:
        server.close()


def test_every_source_path_the_docs_name_exists():
    import re

    docs = [*manual_files(), *sorted((REPO / "config").glob("*.toml"))]
    named = {(doc.name, m) for doc in docs
             for m in re.findall(r"\b((?:powerbudgetd|sim)/[\w/]+\.py)\b", doc.read_text())}
    assert named, "the pattern finds nothing: the test cannot fail"
    missing = [(doc, m) for doc, m in named if not (REPO / m).is_file()]
    assert not missing
