"""The recorder inside the real daemon: `powerbudgetd run --backend sim` as a process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from powerbudgetd.powerlog.report import Host, summarize
from powerbudgetd.powerlog.recorder import log_files
from powerbudgetd.powerlog.reader import load_samples, scan_log
from support.daemon import DaemonProcess
from support.configs import config_file

pytestmark = pytest.mark.slow  # the daemon as a subprocess: the full run (CI) covers it


def _config(tmp_path: Path, recorder_dir: Path) -> Path:
    return config_file(tmp_path / "powerbudgetd.toml", "[feed]\nbreaker_a = 15\nvolts = 120\nhost_w = 250\nups_w = 2000\n",
                       f'[recorder]\ndir = "{recorder_dir}"\ninterval_s = 0.1\nfsync_interval_s = 0.1\n',
                       '[sim]\nscenario = "workstation-4"\n')


def _sample_lines(directory: Path) -> int:
    return sum(p.read_bytes().count(b'"kind":"sample"') for p in log_files(directory))


def test_kill_9_mid_write_leaves_a_log_readable_to_its_last_complete_record(tmp_path: Path) -> None:
    logdir = tmp_path / "log"
    with DaemonProcess(_config(tmp_path, logdir)) as daemon:
        daemon.wait_for(lambda: _sample_lines(logdir) >= 25, "25 samples", 60)
        daemon.kill()  # no chance to flush, write an end record or restore anything

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
    logdir = tmp_path / "log"
    with DaemonProcess(_config(tmp_path, logdir)) as daemon:
        daemon.wait_for(lambda: _sample_lines(logdir) >= 5, "5 samples", 60)
        assert daemon.stop(30) == 0
    index = scan_log(logdir)
    assert index.runs[-1].end is not None and index.runs[-1].end["mode"] in ("stopping", "dynamic")
    d = summarize(index, 600.0)
    assert d["stop"]["ended"] == "clean"
    events = [e["event"] for e in daemon.events()]
    assert "recorder_enabled" in events and "recorder_closed" in events


def test_an_unwritable_log_directory_warns_and_the_daemon_controls_on(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the log directory should be")
    with DaemonProcess(_config(tmp_path, blocker / "log")) as daemon:
        daemon.wait_for(lambda: {"ready", "recorder_write_failed"} <= {e["event"] for e in daemon.events()},
                        "ready and recorder_write_failed", 60)
        assert daemon.stop(30) == 0
    failed = daemon.events("recorder_write_failed")
    assert failed[0]["level"] == "error" and "not-a-dir" in failed[0]["error"]
