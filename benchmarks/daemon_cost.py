"""Benchmark: CPU share and peak RSS of ``powerbudgetd run --backend sim``.

Starts the daemon on a simulated bank (wall clock, the scenario's cards and physics),
lets it control for ``--duration`` seconds of wall time at ``--tick`` s, reads its CPU
time and peak RSS from /proc (Linux), then stops it with SIGTERM. The simulated bank's
physics run inside the daemon's process (every simulated NVML call advances them), so the
CPU share is an upper bound for the daemon over real NVML.

    python benchmarks/daemon_cost.py --duration 600     # the README's numbers
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of ``pid`` in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="wall seconds of control (default 600)")
    ap.add_argument("--tick", type=float, default=0.1, help="control tick, s (default 0.1)")
    ap.add_argument("--scenario", default="workstation-4", help="the simulated bank (default workstation-4)")
    ap.add_argument("--budget", type=float, default=1000.0, help="budget, W (default 1000)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds left out of the steady-state share")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "powerbudgetd.toml"
        cfg.write_text(
            f'budget_w = {args.budget}\n[control]\ntick_s = {args.tick}\n[sim]\nscenario = "{args.scenario}"\n'
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "powerbudgetd", "run", "--config", str(cfg), "--backend", "sim"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        started = time.monotonic()
        time.sleep(min(args.warmup, args.duration))
        cpu_warm, wall_warm = cpu_s(proc.pid), time.monotonic()
        time.sleep(max(0.0, args.duration - (wall_warm - started)))
        if proc.poll() is not None:
            print(f"daemon exited early with status {proc.returncode}", file=sys.stderr)
            return 1
        cpu_end, wall_end = cpu_s(proc.pid), time.monotonic()
        rss = peak_rss_mb(proc.pid)
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=30)

    out = {
        "scenario": args.scenario,
        "tick_s": args.tick,
        "wall_s": round(wall_end - started, 1),
        "cpu_s": round(cpu_end, 2),
        "cpu_share_pct": round(100 * cpu_end / (wall_end - started), 3),
        "steady_cpu_share_pct": round(100 * (cpu_end - cpu_warm) / max(wall_end - wall_warm, 1e-9), 3),
        "peak_rss_mb": round(rss, 1),
        "exit_status": status,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"powerbudgetd run --backend sim ({args.scenario}, tick {args.tick:g} s) for {out['wall_s']:g} s of wall time:\n"
            f"  CPU {out['cpu_s']:g} s = {out['cpu_share_pct']:.2f} % of one core "
            f"({out['steady_cpu_share_pct']:.2f} % after the first {args.warmup:g} s)\n"
            f"  peak RSS {out['peak_rss_mb']:g} MB\n"
            f"  exit status after SIGTERM: {status}"
        )
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
