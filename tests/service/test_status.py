"""`status` with a config file broken since the daemon loaded it still finds the daemon:
it reads that file's [metrics] alone and says so; `--watch` ends on Ctrl-C like every
command."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from powerbudgetd.cli import main
from support.daemon import clean_env
from support.wait import reap


def test_a_broken_config_still_gives_its_metrics_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pb.toml"
    cfg.write_text('budget_w = "not a number"\n[metrics]\nport = 1\n')  # nothing listens on port 1
    rc = main(["status", "--config", str(cfg), "--timeout", "0.5"])
    err = capsys.readouterr().err
    assert rc == 1, err  # unreachable, not a config error
    assert "does not load" in err and "reading its [metrics] alone" in err
    assert "127.0.0.1:1/metrics" in err


def test_watch_stops_on_ctrl_c_with_one_line_and_130() -> None:
    """`status --watch` redraws until Ctrl-C, then says so in one line and exits 130, as
    every command does (a daemon that is not there is redrawn as such meanwhile)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "powerbudgetd", "status", "--watch", "--interval", "0.2", "--timeout", "0.5",
         "--url", f"http://127.0.0.1:{port}/metrics"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first redraw is out: it is watching
        assert first
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        reap(proc)
    assert proc.returncode == 130, err
    assert err == "powerbudgetd: interrupted\n"
