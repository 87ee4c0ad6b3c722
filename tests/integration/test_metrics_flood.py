"""/metrics under a flood of idle connections, as any local user can open them: the daemon
(a subprocess on the simulated bank) keeps answering scrapes, reloading and recording;
the connections it holds are capped, an idle one is closed after ``idle_timeout_s``, and
none of them costs a thread."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from powerbudgetd.channels.metrics import RESERVED_FDS, connection_cap
from support.daemon import DaemonProcess, Launch, scrape
from support.scenarios import idle_4
from support.wait import free_port

pytestmark = pytest.mark.slow  # the daemon as a subprocess, hundreds of sockets


def write_config(tmp_path: Path, port: int, max_connections: int) -> Path:
    config = tmp_path / "powerbudgetd.toml"
    config.write_text(
        f'budget_w = 1000\n[sim]\nscenario = "{idle_4(tmp_path)}"\n'
        f"[metrics]\nport = {port}\nmax_connections = {max_connections}\nidle_timeout_s = 3\n"
        f'[recorder]\ndir = "{tmp_path / "log"}"\ninterval_s = 0.2\n'
    )
    return config


@contextlib.contextmanager
def idle_connections(port: int, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections to ``port`` that send nothing (every third sends half a request
    line and stalls); closed on leaving."""
    socks: list[socket.socket] = []
    try:
        for i in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            socks.append(s)
            if i % 3 == 0:
                time.sleep(0.001)
                with contextlib.suppress(OSError):
                    s.send(b"GET /metr")
        yield socks
    finally:
        for s in socks:
            s.close()


def records(logdir: Path) -> int:
    return sum(1 for f in logdir.glob("power-*.jsonl") for line in f.read_text().splitlines()
               if json.loads(line).get("kind") == "sample")


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def still_working(daemon: DaemonProcess, port: int, logdir: Path) -> None:
    """A scrape answers at once, a reload is done, the recorder writes on."""
    t0 = time.monotonic()
    assert "powerbudgetd_build_info" in scrape(port, timeout_s=5)
    assert time.monotonic() - t0 < 2.0
    reloads = len(daemon.events("reloaded"))
    daemon.send(signal.SIGHUP)
    daemon.wait_for(lambda: len(daemon.events("reloaded")) > reloads, "the reload", 10, step_s=0.05)
    written = records(logdir)
    daemon.wait_for(lambda: records(logdir) >= written + 3, "the recorder writing on", 10, step_s=0.1)
    assert not daemon.events("recorder_write_failed") and "Too many open files" not in daemon.output()


def test_hundreds_of_idle_connections_leave_scrapes_reloads_and_the_recorder_working(
        launch: Launch, tmp_path: Path) -> None:
    port = free_port()
    daemon = launch(write_config(tmp_path, port, max_connections=600))
    # Ready, not only listening: the per-card NVML workers (and a peak sampler) start with the
    # boot, and counted before them they would read as threads the connections made.
    daemon.wait_for(lambda: daemon.events("ready"), "ready", 15, step_s=0.1)
    daemon.wait_for(lambda: "powerbudgetd_build_info" in scrape(port), "the first scrape", 15, step_s=0.1,
                    ignore=(OSError,))
    threads_before = threads(daemon.pid)
    with idle_connections(port, 400):
        daemon.wait_for(lambda: fds(daemon.pid) >= 400, "every one accepted", 10, step_s=0.1)  # held ...
        assert threads(daemon.pid) <= threads_before + 2  # ... with no thread each
        still_working(daemon, port, tmp_path / "log")
    assert daemon.stop(20) == 0, daemon.tail()


def test_past_the_cap_descriptors_stay_bounded_and_idle_ones_are_closed(launch: Launch, tmp_path: Path) -> None:
    port = free_port()
    daemon = launch(write_config(tmp_path, port, max_connections=50))
    daemon.wait_for(lambda: "powerbudgetd_build_info" in scrape(port), "the first scrape", 15, step_s=0.1,
                    ignore=(OSError,))
    fds_before = fds(daemon.pid)
    with idle_connections(port, 300) as socks:
        time.sleep(1.0)
        assert fds(daemon.pid) <= fds_before + 50 + 2  # the cap, not one descriptor per client
        # The connections past the cap wait in the backlog; the recorder and reloads are not starved.
        reloads = len(daemon.events("reloaded"))
        daemon.send(signal.SIGHUP)
        daemon.wait_for(lambda: len(daemon.events("reloaded")) > reloads, "the reload", 10, step_s=0.05)
        written = records(tmp_path / "log")
        daemon.wait_for(lambda: records(tmp_path / "log") >= written + 3, "the recorder writing on", 10, step_s=0.1)
        # Silent past idle_timeout_s (3 s): closed by the server, the first of them at least.
        time.sleep(4.5)
        closed = 0
        for s in socks[:50]:
            s.setblocking(True)
            s.settimeout(0.05)
            with contextlib.suppress(OSError):
                closed += s.recv(1) == b""
        assert closed >= 10
    # The cap reached is said in the daemon's own log, not as a bare line on stderr.
    assert any("connection limit" in e["detail"] for e in daemon.events("metrics_server"))
    assert "connection limit" not in daemon.errors()
    daemon.wait_for(lambda: "powerbudgetd_build_info" in scrape(port, timeout_s=2), "a scrape after the flood", 15,
                    step_s=0.2, ignore=(OSError,))
    assert daemon.stop(20) == 0, daemon.tail()


def test_the_cap_fits_under_the_descriptor_limit() -> None:
    assert connection_cap(256, resource.RLIM_INFINITY) == 256
    assert connection_cap(256, 4096) == 256
    assert connection_cap(256, 300) == 300 - RESERVED_FDS
    assert connection_cap(256, 64) == 4  # never none at all
