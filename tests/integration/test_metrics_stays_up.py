"""/metrics stays up when a card hangs, under a slowloris and under a scrape flood.

Prometheus gives a scrape 10 s (its default scrape_timeout); past it the target is
``up == 0`` and ``PowerBudgetdDown`` pages ("nothing keeps the bank under its budget").
So a hung NVML call must not reach the scrape path (the failsafe is what shows), a client
dribbling bytes must not hold the server's connection slots, and clients scraping back
to back must not slow the control loop. The deadlines here are much shorter than
Prometheus' (and the server's timeouts shorter than their defaults) to keep the tests quick.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from powerbudgetd.cli import _serve_metrics
from support.daemon import Launch, scrape
from support.inprocess import OnTick, running_daemon
from support.wait import free_port

pytestmark = pytest.mark.slow  # daemons on the wall clock, hung calls of many seconds

SCRAPE_DEADLINE_S = 2.0  # what a scrape may take here (Prometheus allows 10 s)
HANG_S = 60.0  # each hung call takes this long: far past every deadline in play


def bank_config(tmp_path: Path, port: int, faults: str = "", metrics: str = "") -> Path:
    (tmp_path / "bank.toml").write_text(f'bank = "workstation-4"\nbudget_w = 1000\n{faults}')
    config = tmp_path / "powerbudgetd.toml"
    config.write_text(f'budget_w = 1000\n[sim]\nscenario = "{tmp_path / "bank.toml"}"\n'
                      f'[metrics]\nport = {port}\n{metrics}[recorder]\ndir = "{tmp_path / "log"}"\n')
    return config


def timed_scrape(port: int) -> tuple[float, str]:
    t0 = time.monotonic()
    text = scrape(port, timeout_s=SCRAPE_DEADLINE_S)
    return time.monotonic() - t0, text


@pytest.mark.parametrize("call", ["*", "nvmlDeviceGetTotalEnergyConsumption"], ids=["every-call", "energy-read"])
def test_every_scrape_is_answered_while_a_card_hangs(launch: Launch, tmp_path: Path, call: str) -> None:
    """From 3 s on, every NVML call on card 1 (or only its energy read) takes 60 s. A
    client scraping back to back for 12 s gets every answer within the deadline; with
    every call hung the exposition shows the failsafe (the alert that should fire),
    and card 1 has no energy series while the others keep theirs."""
    port = free_port()
    fault = f'[[faults]]\ncall = "{call}"\nerror = "SLOW"\ncard = 1\nfrom_s = 3.0\ndelay_s = {HANG_S}\n'
    daemon = launch(bank_config(tmp_path, port, fault))
    daemon.wait_for(lambda: daemon.events("ready"), "ready", 20, step_s=0.1)
    daemon.wait_for(lambda: "powerbudgetd_gpu_energy_joules_total{" in scrape(port), "the first energy round", 20,
                    step_s=0.2, ignore=(OSError,))
    time.sleep(3.5)  # past the fault's start
    took: list[float] = []
    last = ""
    end = time.monotonic() + 12.0
    while time.monotonic() < end:
        t, last = timed_scrape(port)  # raises (fails the test) past the deadline
        took.append(t)
    assert max(took) < SCRAPE_DEADLINE_S and len(took) >= 12, took
    card1 = 'gpu="1"'
    energy = [line for line in last.splitlines() if line.startswith("powerbudgetd_gpu_energy_joules_total{")]
    assert energy and not any(card1 in line for line in energy), energy  # left out (stale), the others read
    if call == "*":
        daemon.wait_for(lambda: 'powerbudgetd_mode{mode="failsafe"} 1.0' in timed_scrape(port)[1], "the failsafe shown",
                        20, step_s=0.2)
    assert daemon.returncode is None, daemon.tail()


def dribble(port: int, conns: int, every_s: float, stop: threading.Event) -> None:
    """``conns`` connections each sending one byte of a request every ``every_s`` s
    (slowloris); a connection the server closed is opened again."""
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 1000
    socks: list[socket.socket | None] = [None] * conns
    sent = [0] * conns
    while not stop.is_set():
        for i in range(conns):
            s = socks[i]
            try:
                if s is None:
                    s = socks[i] = socket.create_connection(("127.0.0.1", port), timeout=1.0)
                    sent[i] = 0
                s.send(request[sent[i] % len(request):][:1])
                sent[i] += 1
            except OSError:
                if s is not None:
                    s.close()
                socks[i] = None
        stop.wait(every_s)
    for s in socks:
        if s is not None:
            s.close()


def test_a_slowloris_does_not_stop_scrapes(launch: Launch, tmp_path: Path) -> None:
    """Connections past the cap, each sending a byte of a request every 0.3 s (under the
    3 s idle timeout: never idle): each is closed a second after its request began, so
    every scrape is still answered within the deadline."""
    port = free_port()
    daemon = launch(bank_config(tmp_path, port, metrics="max_connections = 8\nidle_timeout_s = 3\nrequest_timeout_s = 1\n"))
    daemon.wait_for(lambda: "powerbudgetd_build_info" in scrape(port), "the first scrape", 20, step_s=0.1,
                    ignore=(OSError,))
    stop = threading.Event()
    loris = threading.Thread(target=dribble, args=(port, 16, 0.3, stop))
    loris.start()
    try:
        time.sleep(1.0)  # every slot taken
        took = []
        for _ in range(8):
            took.append(timed_scrape(port)[0])  # raises (fails the test) past the deadline
            time.sleep(0.5)
    finally:
        stop.set()
        loris.join()
    assert max(took) < SCRAPE_DEADLINE_S, took
    assert daemon.returncode is None, daemon.tail()


FLOOD_CLIENT = """
import sys, threading, time, urllib.request
url, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + seconds
answered = [0]
def scrape():
    while time.monotonic() < end:
        with urllib.request.urlopen(url, timeout=10) as r:
            r.read()
        answered[0] += 1
threads = [threading.Thread(target=scrape) for _ in range(n)]
[t.start() for t in threads]
[t.join() for t in threads]
print(answered[0])
"""


def flood_clients(port: int) -> subprocess.Popen[str]:
    """Six clients in another process scraping ``port``'s /metrics back to back for 9.5 s;
    the process prints how many scrapes were answered."""
    return subprocess.Popen([sys.executable, "-c", FLOOD_CLIENT, f"http://127.0.0.1:{port}/metrics", "6", "9.5"],
                            stdout=subprocess.PIPE, text=True)


# The same clients' load on the machine with nothing of the daemon's in it: a server in
# another process answering a body of the exposition's size (the control window).
ELSEWHERE_SERVER = """
import http.server, sys
port, size = int(sys.argv[1]), int(sys.argv[2])
body = b"#" * size
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Answer).serve_forever()
"""


def gaps(ticks: list[float]) -> list[float]:
    return sorted(b - a for a, b in zip(ticks, ticks[1:]))


async def test_a_scrape_flood_costs_the_control_loop_nothing(tmp_path: Path) -> None:
    """The daemon in this process, its metrics served as ``run`` serves them; six clients in
    another process scrape it back to back for 8 s. The control loop keeps its cadence
    (ticks and tick-to-tick gaps) and its ticks take no longer (the median from a tick's
    start to its report, GIL waits included) than in the 8 s before, when the same clients
    scraped a server in a third process: the machine as busy, nothing of it in the daemon
    (against a quiet window, a loaded CI machine's two cores counted the clients' own CPU
    as the daemon's: 1.2 -> 2.4 ms)."""
    port = free_port()
    config = bank_config(tmp_path, port)
    servers = []

    def metrics(settings, daemon, registry):  # type: ignore[no-untyped-def]
        servers.append(_serve_metrics(settings, daemon, registry))  # as `run` serves them
        return OnTick(lambda report: None)

    async with running_daemon(config, metrics=metrics) as r:
        try:
            def window_ticks(since: int) -> list[tuple[float, float]]:
                """(when each tick ended, how long it took from its start), from tick ``since`` on."""
                return [(t, t - report.now) for t, report in r.ticks[since:]]

            size = len((await asyncio.to_thread(scrape, port)).encode())
            other = free_port()
            elsewhere = subprocess.Popen([sys.executable, "-c", ELSEWHERE_SERVER, str(other), str(size)])
            try:
                await asyncio.sleep(1.0)
                control = flood_clients(other)
                await asyncio.sleep(1.0)
                n0 = len(r.ticks)
                await asyncio.sleep(8.0)
                quiet = window_ticks(n0)
                out0, _ = await asyncio.to_thread(control.communicate)
            finally:
                elsewhere.kill()
                elsewhere.wait()
            flood = flood_clients(port)
            await asyncio.sleep(1.0)
            n1 = len(r.ticks)
            await asyncio.sleep(8.0)
            flooded = window_ticks(n1)
            out, _ = await asyncio.to_thread(flood.communicate)
        finally:
            for s in servers:
                s.close()
    assert control.returncode == 0 and int(out0) >= 50  # the control window's load was there
    assert flood.returncode == 0 and int(out) >= 50  # the flood was answered, not refused
    p90 = [g[int(0.9 * (len(g) - 1))] for g in (gaps([t for t, _ in quiet]), gaps([t for t, _ in flooded]))]
    took = [statistics.median(d for _, d in w) for w in (quiet, flooded)]
    # Its cadence: about as many ticks, the slow gaps no slower (generous: the machine is shared).
    assert len(flooded) >= 0.9 * len(quiet), (len(quiet), len(flooded))
    assert p90[1] <= p90[0] + 0.020, p90
    # Each tick (its NVML reads on worker threads, handed back to the loop) waits on no
    # scrape for the GIL: measured 0.8 ms quiet, 3.2 ms under this flood when every
    # scrape was rendered afresh; 0.8 ms under it now (0.9-1.1 ms against the control
    # window's 1.2-1.6 beside two busy processes).
    assert took[1] <= 1.5 * took[0] + 0.0005, took

