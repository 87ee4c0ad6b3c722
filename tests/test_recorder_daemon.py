"""The recorder inside the real daemon: `powerbudgetd run --backend sim` as a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from powerbudgetd.powerlog.report import Host, summarize
from powerbudgetd.powerlog.recorder import log_files
from powerbudgetd.powerlog.reader import load_samples, scan_log


def _config(tmp_path: Path, recorder_dir: Path) -> Path:
    path = tmp_path / "powerbudgetd.toml"
    path.write_text(
        "budget_w = 1000\n"
        "[feed]\nbreaker_a = 15\nvolts = 120\nhost_w = 250\nups_w = 2000\n"
        f'[recorder]\ndir = "{recorder_dir}"\ninterval_s = 0.1\nfsync_interval_s = 0.1\n'
        '[sim]\nscenario = "workstation-4"\n'
    )
    return path


def _start(config: Path, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "STATE_DIRECTORY")}
    return subprocess.Popen(
        [sys.executable, "-m", "powerbudgetd", "run", "--backend", "sim", "--config", str(config)],
        stdout=out.open("wb"), stderr=subprocess.STDOUT, env=env,
    )


def _wait(cond, proc: subprocess.Popen, out: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"the daemon exited ({proc.returncode}):\n{out.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out:\n{out.read_text()}")
        time.sleep(0.05)


def _sample_lines(directory: Path) -> int:
    return sum(p.read_bytes().count(b'"kind":"sample"') for p in log_files(directory))


def test_kill_9_mid_write_leaves_a_log_readable_to_its_last_complete_record(tmp_path: Path) -> None:
    logdir, out = tmp_path / "log", tmp_path / "out.jsonl"
    proc = _start(_config(tmp_path, logdir), out)
    _wait(lambda: _sample_lines(logdir) >= 25, proc, out)
    proc.send_signal(signal.SIGKILL)  # no chance to flush, write an end record or restore anything
    proc.wait(10)

    files = log_files(logdir)
    index = scan_log(logdir)
    assert len(index.runs) == 1 and index.runs[0].end is None
    samples, skipped = load_samples(index.files)
    assert len(samples) >= 25 and all(s.torn for s in skipped) and len(skipped) <= 1
    # The last complete line in the file is the stop.
    last_line = [ln for ln in files[-1].read_bytes().split(b"\n") if ln.strip()][-1 - len(skipped)]
    last = json.loads(last_line)
    assert last["kind"] == "sample" and samples[-1].mono_s == last["mono_s"]
    assert [s.mono_s for s in samples] == sorted(s.mono_s for s in samples)
    assert all(len(s.cards) == 4 and s.budget_w == 1000 for s in samples)

    d = summarize(index, 600.0)  # on this host: same boot, the daemon's pid is gone
    assert d["stop"]["ended"] == "killed" and d["stop"]["utc"] == last["utc"]
    assert d["window"]["samples"] == len(samples)
    assert d["wall"]["host_w"] == 250 and d["feed"]["ups"]["ups_w"] == 2000
    # Read from another machine, it is a stop without a clean exit all the same.
    elsewhere = summarize(index, 600.0, host=Host("elsewhere", None, lambda pid: False), now_s=time.time() + 60)
    assert elsewhere["stop"]["ended"] == "abrupt" and elsewhere["stop"]["utc"] == last["utc"]


def test_sigterm_writes_the_end_record(tmp_path: Path) -> None:
    logdir, out = tmp_path / "log", tmp_path / "out.jsonl"
    proc = _start(_config(tmp_path, logdir), out)
    _wait(lambda: _sample_lines(logdir) >= 5, proc, out)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    index = scan_log(logdir)
    assert index.runs[-1].end is not None and index.runs[-1].end["mode"] in ("stopping", "dynamic")
    d = summarize(index, 600.0)
    assert d["stop"]["ended"] == "clean"
    events = [json.loads(line)["event"] for line in out.read_text().splitlines() if line.startswith("{")]
    assert "recorder_enabled" in events and "recorder_closed" in events


def test_an_unwritable_log_directory_warns_and_the_daemon_controls_on(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the log directory should be")
    out = tmp_path / "out.jsonl"
    proc = _start(_config(tmp_path, blocker / "log"), out)

    def events() -> list[dict]:
        return [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]

    _wait(lambda: {"ready", "recorder_write_failed"} <= {e["event"] for e in events()}, proc, out)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    failed = [e for e in events() if e["event"] == "recorder_write_failed"]
    assert failed[0]["level"] == "error" and "not-a-dir" in failed[0]["error"]
