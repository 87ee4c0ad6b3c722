"""`powerbudgetd status`: the running daemon's bank at a glance, read from its metrics
endpoint. In sections: where it reads (the config's [metrics], a config broken since the
daemon loaded it, --url), a server it does not trust (one deadline, a byte cap, no
redirect, escaped labels, as root only the daemon's own listener), what it shows (a dry
run's headroom), and --watch."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from powerbudgetd.channels import metricnames as n
from powerbudgetd.cli import main
from powerbudgetd.errors import ExitStatus
from powerbudgetd.service import scrape
from powerbudgetd.service.status import StatusError, fetch, format_status, parse

from support.daemon import clean_env, cli, no_traceback
from support.wait import reap


# -- where status reads: the config's [metrics], a broken config, --url ------------------


def test_status_names_the_url_and_its_origin_when_the_daemon_is_not_there(tmp_path):
    cfg = tmp_path / "pb.toml"
    cfg.write_text("budget_w = 1000\n[metrics]\nport = 1\n")
    p = cli("status", "--config", str(cfg))
    no_traceback(p)
    assert p.returncode == 1
    assert "http://127.0.0.1:1/metrics" in p.stderr and f"[metrics] listen_address and port in {cfg}" in p.stderr
    assert "systemctl status powerbudgetd" in p.stderr


def test_a_broken_config_still_gives_its_metrics_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pb.toml"
    cfg.write_text('budget_w = "not a number"\n[metrics]\nport = 1\n')  # nothing listens on port 1
    rc = main(["status", "--config", str(cfg), "--timeout", "0.5"])
    err = capsys.readouterr().err
    assert rc == 1, err  # unreachable, not a config error
    assert "does not load" in err and "reading its [metrics] alone" in err
    assert "127.0.0.1:1/metrics" in err


def test_an_unknown_key_in_metrics_does_not_hide_its_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pb.toml"
    cfg.write_text('budget_w = 1000\n[metrics]\nport = 1\nbudget_w = "lots"\n')  # nothing listens on port 1
    rc = main(["status", "--config", str(cfg), "--timeout", "0.5"])
    err = capsys.readouterr().err
    assert rc == 1, err  # unreachable, not a config error
    assert "does not load" in err and "reading its [metrics] alone" in err
    assert "127.0.0.1:1/metrics" in err


def test_a_bad_port_is_still_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pb.toml"
    cfg.write_text('budget_w = 1000\n[metrics]\nport = "x"\n')
    assert main(["status", "--config", str(cfg), "--timeout", "0.5"]) == 2
    assert "metrics.port" in capsys.readouterr().err


@pytest.mark.parametrize("url, words", [
    ("ftp://x/metrics", "only http://HOST[:PORT]/PATH URLs are read"),
    ("http://[::1", "is not a URL"),
    ("http://127.0.0.1:99999/metrics", "is not a URL"),
    ("127.0.0.1:19400", "only http://"),
])
def test_a_url_that_cannot_be_read_is_a_usage_error(url, words, capsys):
    assert main(["status", "--url", url]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert "argument --url" in err and words in err
    assert "is the daemon running" not in err


# -- a server status does not trust ------------------------------------------------------


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\r\n"
Handler = Callable[[socket.socket], None]


class Server:
    """A TCP server on a free loopback port answering each connection with ``handler``
    on a thread of its own; counts connections and bytes sent."""

    def __init__(self, handler: Handler) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handler = handler
        self.connections = 0
        self.sent = 0
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(4096)
                self.handler(conn)
            except OSError:
                pass  # the client gave up: what these servers are for

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


@contextmanager
def serving(handler: Callable[[Server, socket.socket], None]) -> Iterator[Server]:
    server = Server(lambda conn: handler(server, conn))
    try:
        yield server
    finally:
        server.close()


def streaming(server: Server, conn: socket.socket) -> None:
    server.send(conn, OK_HEAD)
    line = b"# " + b"x" * 1022 + b"\n"
    while not server.closed.is_set():
        server.send(conn, line * 64)


def slow(server: Server, conn: socket.socket) -> None:
    server.send(conn, OK_HEAD)
    while not server.closed.is_set():
        server.send(conn, b"#")
        time.sleep(0.05)


def test_a_streaming_server_is_read_up_to_the_byte_cap_and_no_further() -> None:
    cap = 1024 * 1024
    with serving(streaming) as server:
        t0 = time.monotonic()
        with pytest.raises(scrape.ScrapeError, match=f"sent more than {cap} bytes"):
            scrape.get(server.url, 10.0, max_body_bytes=cap)
        assert time.monotonic() - t0 < 10.0
        time.sleep(0.2)
        # What the client took is bounded: the cap, the head, a read and the socket buffers.
        assert server.sent < cap + scrape.MAX_HEAD_BYTES + 16 * 1024 * 1024


def test_a_server_answering_a_byte_at_a_time_ends_within_the_one_deadline() -> None:
    """Each read returns within the socket timeout; only the overall deadline ends it."""
    with serving(slow) as server:
        t0 = time.monotonic()
        with pytest.raises(scrape.ScrapeError, match="did not answer in full within 1 s"):
            scrape.get(server.url, 1.0)
        elapsed = time.monotonic() - t0
    assert 0.9 < elapsed < 1.5, elapsed


def test_a_server_that_accepts_and_says_nothing_ends_within_the_deadline() -> None:
    with serving(lambda server, conn: server.closed.wait(10)) as server:
        t0 = time.monotonic()
        with pytest.raises(scrape.ScrapeError, match="did not answer in full within 0.5 s"):
            scrape.get(server.url, 0.5)
        assert time.monotonic() - t0 < 1.0


def test_a_redirect_is_named_and_not_followed() -> None:
    with serving(lambda server, conn: server.send(conn, OK_HEAD + b"powerbudgetd_budget_watts 1\n")) as elsewhere:
        location = f"http://127.0.0.1:{elsewhere.port}/metrics".encode()
        with serving(lambda server, conn: server.send(
                conn, b"HTTP/1.1 302 Found\r\nLocation: " + location + b"\x1b]52;c;aGk=\x07\r\n\r\n")) as server:
            with pytest.raises(scrape.ScrapeError) as err:
                scrape.get(server.url, 2.0)
    assert "HTTP 302" in str(err.value) and "not followed" in str(err.value)
    assert "\\x1b]52" in str(err.value) and "\x1b" not in str(err.value)
    assert elsewhere.connections == 0


def test_the_status_command_against_hostile_servers_ends_in_its_deadline_with_bounded_memory() -> None:
    """The command as an operator runs it, against each server: exit 1, one message,
    no traceback, within the deadline (plus the interpreter's start), peak memory well
    under what the stream offered."""
    # VmHWM: this process's peak resident memory since its exec (ru_maxrss would carry
    # the forking parent's over).
    probe = ("import re, sys\nfrom powerbudgetd.cli import main\nrc = main(sys.argv[1:])\n"
             "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
             "print('maxrss_kib', hwm, file=sys.stderr)\nsys.exit(rc)\n")
    for handler in (streaming, slow):
        with serving(handler) as server:
            t0 = time.monotonic()
            p = cli("status", "--url", server.url, "--timeout", "2", python=("-c", probe))
            elapsed = time.monotonic() - t0
            sent = server.sent
        no_traceback(p)
        assert p.returncode == 1, p.stderr
        assert server.url in p.stderr
        rss_mib = int(p.stderr.split("maxrss_kib ")[1].split()[0]) / 1024
        assert rss_mib < 120, (handler.__name__, rss_mib, sent)  # the cap is 16 MiB; the interpreter ~30 MiB
        assert elapsed < 2 + 20, elapsed  # the deadline; the rest is the interpreter starting on a busy machine
    assert "\x1b" not in p.stdout


HOSTILE = (
    "# TYPE powerbudgetd_budget_watts gauge\npowerbudgetd_budget_watts 1000\n"
    "# TYPE powerbudgetd_mode gauge\npowerbudgetd_mode{mode=\"dyn\\u001b[2Jamic\"} 1\n"
    "# TYPE powerbudgetd_budget_source_in_force gauge\n"
    "powerbudgetd_budget_source_in_force{source=\"\x1b]52;c;cm0gLXJmIC8=\x07\"} 1\n"
    "# TYPE powerbudgetd_build info\npowerbudgetd_build_info{version=\"\x1b[31mred\",python_version=\"3\"} 1\n"
    "# TYPE powerbudgetd_gpu_power_limit_watts gauge\n"
    "powerbudgetd_gpu_power_limit_watts{gpu=\"zero\x1b[1A\",UUID=\"GPU-\x1b[H\",modelName=\"\x9b31m\"} 250\n"
    "powerbudgetd_gpu_power_limit_watts{gpu=\"99999999999999999999\",UUID=\"GPU-2\",modelName=\"ok\"} 250\n"
    "powerbudgetd_gpu_power_limit_watts{gpu=\"-1\",UUID=\"GPU-3\",modelName=\"\"} 250\n"
    "powerbudgetd_gpu_power_limit_watts{gpu=\"\u00b2\",UUID=\"GPU-5\",modelName=\"\"} 250\n"
    "# TYPE powerbudgetd_gpu_role gauge\n"
    "powerbudgetd_gpu_role{gpu=\"1.5\",UUID=\"GPU-4\",modelName=\"x\",role=\"\x1b[2J\"} 1\n"
)


@pytest.mark.parametrize("extra", [[], ["--json"]], ids=["text", "json"])
def test_label_values_with_escape_sequences_or_odd_indices_reach_stdout_escaped(extra: list[str]) -> None:
    with serving(lambda server, conn: server.send(conn, OK_HEAD + HOSTILE.encode())) as server:
        p = cli("status", "--url", server.url, "--timeout", "5", *extra)
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert "\x1b" not in p.stdout and "\x9b" not in p.stdout and "\x07" not in p.stdout
    assert "\\x1b]52" in p.stdout  # shown, not obeyed
    # every card is listed, those whose gpu label is not an index too
    if extra:
        assert all(f"GPU-{i}" in p.stdout for i in (2, 3, 4, 5))
    else:
        assert p.stdout.count("draw unknown") == 5


# -- as root: whose listener is it? ---------------------------------------------------------
def _listener_as_someone_else() -> tuple[socket.socket | None, int, subprocess.Popen[str] | None]:
    """A listener not owned by root: this process's when it is not root, else a child's
    run as nobody. (socket or None, port, child or None)."""
    if os.geteuid() != 0:
        s = socket.create_server(("127.0.0.1", 0))
        return s, s.getsockname()[1], None
    code = ("import socket, sys, time\ns = socket.create_server(('127.0.0.1', 0))\n"
            "print(s.getsockname()[1], flush=True)\ntime.sleep(60)\n")
    # the system's python3: nobody cannot reach this test's interpreter (a venv under a private home)
    python = shutil.which("python3", path=os.defpath)
    assert python is not None, "no python3 on the system path"
    child = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE, text=True, user=65534, group=65534,
                             cwd="/")
    assert child.stdout is not None
    return None, int(child.stdout.readline()), child


def test_as_root_a_local_listener_not_the_daemons_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path))
    lock = tmp_path / "powerbudgetd.lock"
    lock.write_text("")
    sock, port, child = _listener_as_someone_else()
    try:
        trusted, why = scrape.listener_trusted(port, lock)
        assert not trusted and "not by root" in why and "no process holds it" in why
        with pytest.raises(StatusError, match="not reading .* as root"):
            fetch(f"http://127.0.0.1:{port}/metrics", 1.0, euid=0)
        # The same listener held by the process holding the instance lock is the daemon's.
        if sock is not None:
            with open(lock) as fh:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                assert scrape.lock_holder(lock) == os.getpid()
                trusted, why = scrape.listener_trusted(port, lock)
                assert trusted and f"PID {os.getpid()}" in why
    finally:
        if sock is not None:
            sock.close()
        if child is not None:
            child.kill()
            child.wait()


def test_nothing_listening_is_said_as_such_as_root(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert scrape.listener_trusted(port, tmp_path / "none.lock") == (False, f"nothing listens on port {port}")


def test_a_non_http_url_is_refused_with_the_reason() -> None:
    for url in ("https://127.0.0.1:19400/metrics", "file:///etc/passwd", "http://"):
        with pytest.raises(scrape.ScrapeError, match="only http://"):
            scrape.get(url, 1.0)
    assert sys.platform.startswith("linux")  # /proc is read for the listener check


# -- what status shows: a dry run's headroom ---------------------------------------------


URL = "http://127.0.0.1:19400/metrics"


def exposition(mode: str, caps: list[float], would_set: float, budget: float = 1000.0) -> str:
    lines = [
        f"# TYPE {n.BUDGET.sample} gauge", f"{n.BUDGET.sample} {budget}",
        f"# TYPE {n.SUM_LIMITS.sample} gauge", f"{n.SUM_LIMITS.sample} {would_set}",
        f"# TYPE {n.HEADROOM.sample} gauge", f"{n.HEADROOM.sample} {budget - would_set}",
        f"# TYPE {n.MODE.sample} gauge", f'{n.MODE.sample}{{mode="{mode}"}} 1',
        f"# TYPE {n.GPU_ENFORCED.sample} gauge",
    ]
    lines += [f'{n.GPU_ENFORCED.sample}{{UUID="GPU-{i}",gpu="{i}",modelName="card"}} {w}' for i, w in enumerate(caps)]
    return "\n".join(lines) + "\n"


def headroom_in_text(text: str) -> str:
    return text.split("headroom ", 1)[1].split(" W", 1)[0]


def test_a_dry_runs_headroom_is_the_same_in_text_and_json() -> None:
    bank = parse(exposition("dry-run", [300.0] * 4, would_set=1000.0), URL)
    assert headroom_in_text(format_status(bank)) == "-200"
    assert json.loads(json.dumps(bank.to_dict()))["headroom_w"] == -200.0
    assert bank.to_dict()["sum_limits_w"] == 1000.0 and bank.to_dict()["caps_in_force_w"] == 1200.0


def test_a_running_daemons_headroom_is_its_own() -> None:
    bank = parse(exposition("dynamic", [250.0] * 3 + [150.0], would_set=900.0), URL)
    assert headroom_in_text(format_status(bank)) == "100"
    assert bank.to_dict()["headroom_w"] == 100.0


# -- --watch -----------------------------------------------------------------------------


def test_watch_stops_on_ctrl_c_with_one_line_and_130() -> None:
    """`status --watch` redraws until Ctrl-C, then says so in one line and exits 130, as
    every command does (a daemon that is not there is redrawn as such meanwhile)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    # Run as from a terminal's foreground: SIGINT at its default (a job started in the
    # background of a script, as CI's are, inherits it ignored, and Python then keeps
    # it so: no KeyboardInterrupt, by design, for background jobs).
    proc = subprocess.Popen(
        [sys.executable, "-m", "powerbudgetd", "status", "--watch", "--interval", "0.2", "--timeout", "0.5",
         "--url", f"http://127.0.0.1:{port}/metrics"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - no threads run here
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
