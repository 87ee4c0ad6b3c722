"""Benchmark: /metrics under a hung card, a slowloris and a scrape flood, and what the
flood costs the control loop.

The daemon runs in this process on a simulated bank (the wall clock, the way ``run``
wires it: ``cli._serve_metrics``), every tick's start recorded; the clients run in a
child process of their own (``--client``), so that their Python does not share the
daemon's GIL. Three cases, each printed as one line:

- ``hung``: every NVML call on card 1 takes ``--hang`` s from 3 s on (``--energy-only``:
  only its energy read); one client scrapes back to back for ``--duration`` s with
  Prometheus' 10 s scrape timeout: scrapes answered, their latency, and whether the
  exposition shows the failsafe.
- ``slowloris``: ``--conns`` connections each sending one byte of a request every 3 s
  (reconnecting when closed) while a client scrapes once a second with a 10 s timeout.
- ``flood``: the tick-to-tick gaps of the control loop (target 100 ms) and the daemon's
  CPU (% of a core) while quiet, then while ``--flooders`` clients scrape back to back.

    python benchmarks/metrics_scrape.py [--case hung|slowloris|flood|all] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

SCRAPE_TIMEOUT_S = 10.0  # Prometheus' default scrape_timeout


# -- the clients (a child process) ----------------------------------------------------------
def scrape_loop(url: str, duration_s: float, pause_s: float, out: list[tuple[float, float | None, str]]) -> None:
    """Scrape ``url`` for ``duration_s``: (start, latency s or None on failure, body head)."""
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as resp:
                body = resp.read().decode()
            out.append((t0, time.monotonic() - t0, body if "powerbudgetd_mode{mode=\"failsafe\"} 1.0" in body else ""))
        except OSError:
            out.append((t0, None, ""))
        if pause_s:
            time.sleep(pause_s)


def slowloris(port: int, conns: int, duration_s: float, stop: threading.Event) -> None:
    """``conns`` connections each sending a byte of a request line every 3 s; a closed one reconnects."""
    socks: list[socket.socket | None] = [None] * conns
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 4000
    sent = [0] * conns
    while not stop.is_set():
        for i in range(conns):
            s = socks[i]
            try:
                if s is None:
                    s = socks[i] = socket.create_connection(("127.0.0.1", port), timeout=1.0)
                    sent[i] = 0
                s.send(request[sent[i] % len(request): sent[i] % len(request) + 1])
                sent[i] += 1
            except OSError:
                if s is not None:
                    s.close()
                socks[i] = None
        stop.wait(3.0)
    for s in socks:
        if s is not None:
            s.close()


def client_main(args: argparse.Namespace) -> int:
    url = f"http://127.0.0.1:{args.port}/metrics"
    results: list[tuple[float, float | None, str]] = []
    if args.client == "flood":
        threads = [threading.Thread(target=scrape_loop, args=(url, args.duration, 0.0, [])) for _ in range(args.flooders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return 0
    stop = threading.Event()
    loris = None
    if args.client == "slowloris":
        loris = threading.Thread(target=slowloris, args=(args.port, args.conns, args.duration, stop))
        loris.start()
        time.sleep(4.0)  # every slot taken
    scrape_loop(url, args.duration, 1.0 if args.client == "slowloris" else 0.0, results)
    stop.set()
    if loris is not None:
        loris.join()
    lat = [r[1] for r in results if r[1] is not None]
    print(json.dumps({"scrapes": len(results), "answered": len(lat), "max_s": max(lat, default=None),
                      "median_s": statistics.median(lat) if lat else None,
                      "failsafe_shown": any(r[2] for r in results)}))
    return 0


# -- the daemon (this process) ------------------------------------------------------------------
def child(port: int, kind: str, **kw: Any) -> subprocess.Popen[str]:
    extra = [f"--{k}={v}" for k, v in kw.items()]
    return subprocess.Popen([sys.executable, __file__, "--client", kind, "--port", str(port), *extra],
                            stdout=subprocess.PIPE, text=True)


async def run_case(case: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry

    from powerbudgetd import cli
    from powerbudgetd.config import load_config
    from powerbudgetd.control.controller import Controller
    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd.service.daemon import Daemon
    from powerbudgetd.service.notify import Notifier

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fault = ""
    if case == "hung":
        call = "nvmlDeviceGetTotalEnergyConsumption" if args.energy_only else "*"
        fault = f'[[faults]]\ncall = "{call}"\nerror = "SLOW"\ncard = 1\nfrom_s = 3.0\ndelay_s = {args.hang}\n'
    (tmp / "bank.toml").write_text(f'bank = "workstation-4"\nbudget_w = 1000\n{fault}')
    config = tmp / f"{case}.toml"
    config.write_text(f'budget_w = 1000\n[sim]\nscenario = "{tmp / "bank.toml"}"\n'
                      f'[metrics]\nport = {port}\nmax_connections = {args.max_connections}\n'
                      f'[recorder]\nenabled = false\n')
    settings = load_config(config)
    nvml = make_nvml("sim", settings.sim.scenario)
    daemon = Daemon(nvml, lambda n: Controller(n, 1000, settings.control.timings()), notifier=Notifier(""),
                    config_path=config, settings=settings)
    ticks: list[float] = []

    class Ticks:
        def on_tick(self, report: Any) -> None:
            ticks.append(time.monotonic())

        def on_reload(self, ok: bool, s: Any) -> None:
            pass

        async def run(self) -> None:
            await asyncio.Event().wait()

    daemon.register(Ticks())
    server = cli._serve_metrics(settings, daemon, CollectorRegistry())
    assert server is not None
    task = asyncio.create_task(daemon.run())
    await asyncio.sleep(3.0)

    cpu: list[float] = []  # this process's CPU over each window, % of a core (the daemon: the clients are a child)

    async def gaps_over(seconds: float) -> list[float]:
        n = len(ticks)
        c0, t0 = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu.append(round(100 * (time.process_time() - c0) / (time.monotonic() - t0), 1))
        window = ticks[n:]
        return [b - a for a, b in zip(window, window[1:])]

    def summary(gaps: list[float]) -> dict[str, float]:
        gaps = sorted(gaps)
        return {"ticks": len(gaps) + 1, "median_ms": round(1000 * statistics.median(gaps), 1),
                "p99_ms": round(1000 * gaps[int(0.99 * (len(gaps) - 1))], 1), "max_ms": round(1000 * gaps[-1], 1)}

    try:
        if case == "flood":
            quiet = summary(await gaps_over(args.duration))
            proc = child(port, "flood", flooders=args.flooders, duration=args.duration + 2)
            await asyncio.sleep(1.0)
            flood = summary(await gaps_over(args.duration))
            await asyncio.to_thread(proc.wait)
            return {"case": f"flood ({args.flooders} clients)", "quiet": quiet, "flood": flood,
                    "daemon_cpu_pct": {"quiet": cpu[0], "flood": cpu[1]}}
        kw: dict[str, Any] = {"duration": args.duration}
        if case == "slowloris":
            kw["conns"] = args.conns
        proc = child(port, case, **kw)
        out, _ = await asyncio.to_thread(proc.communicate)
        name = case if case != "hung" else ("hung energy read" if args.energy_only else "hung card")
        return {"case": name, **json.loads(out)}
    finally:
        daemon.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
        server.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("hung", "slowloris", "flood", "all"), default="all")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds each case measures (default 30)")
    ap.add_argument("--hang", type=float, default=25.0, help="hung: each NVML call on card 1 takes this long, s")
    ap.add_argument("--energy-only", action="store_true", help="hung: only card 1's energy read hangs")
    ap.add_argument("--conns", type=int, default=276, help="slowloris: connections (default 276)")
    ap.add_argument("--max-connections", type=int, default=256, help="[metrics] max_connections (default 256)")
    ap.add_argument("--flooders", type=int, default=6, help="flood: clients scraping back to back (default 6)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--client", choices=("hung", "slowloris", "flood"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        return client_main(args)
    cases = ("hung", "slowloris", "flood") if args.case == "all" else (args.case,)
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            result = asyncio.run(run_case(case, args, Path(tmp)))
        print(json.dumps(result) if args.json else "  ".join(f"{k}: {v}" for k, v in result.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
