"""Benchmark: the daemon's CPU share (by thread) and peak RSS, on the simulated bank or the null driver.

Starts ``powerbudgetd run --backend sim`` on a simulated bank (wall clock, the scenario's cards and physics),
lets it control for ``--duration`` seconds of wall time at ``--tick`` s, reads its CPU
time and peak RSS from /proc (Linux), then stops it with SIGTERM.

The simulated NVML library runs inside the daemon's process: every NVML call the
bindings make lands in :meth:`SimNvmlLibrary.serve`, which advances the bank's physics
and answers. The daemon is started through a small bootstrap that times each of those
calls on the calling thread's CPU clock, so the report splits the process's CPU into
the simulator's share (inside ``serve``) and the daemon's own (everything else: the
control loop, the bindings' ctypes marshalling, logging, metrics, the flight recorder),
which is what the daemon costs over a real driver, less the driver's own time.

``--driver null`` runs the daemon over a driver that costs nothing instead
(``sim/nulldriver.py``: a C library compiled into the temporary directory and loaded by
the real bindings as the driver's would be; ``--backend nvml``, the production path). Its cards' draw is a square wave and a
written limit is in force at once; its calls cost a few hundred nanoseconds of C, no
Python, so the process's CPU is the daemon's own: what the target counts.

Nothing is written outside a temporary directory: the config points the flight
recorder there (a simulated run would otherwise record under the state directory,
/var/lib/powerbudgetd/sim by default).

    python benchmarks/daemon_cost.py --duration 600     # the README's numbers
    python benchmarks/daemon_cost.py --driver null --cards 8 --duration 60
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

from powerbudgetd_sim import nulldriver

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


BENCH_THREAD = "bench-sim-cpu"  # the bootstrap's own thread: its CPU is not the daemon's
# Threads by their kernel names (15 bytes) as the report shows them.
SHOWN = {"powerbudgetd-ti": "tick", "powerbudgetd-re": "recorder"}

# Run in the daemon's process before powerbudgetd starts: give each thread its Python
# name in the kernel too (/proc/PID/task/TID/comm, 15 bytes), so that its CPU can be
# told apart from outside.
NAME_THREADS = """
import ctypes, threading
_libc, _run = ctypes.CDLL(None), threading.Thread.run
def _named_run(self):
    _libc.prctl(15, self.name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    _run(self)
threading.Thread.run = _named_run
"""

# The simulator's bootstrap besides: time every simulated NVML call on the calling
# thread's CPU clock and keep the total (s) in the file named by argv[1].
BOOTSTRAP = NAME_THREADS + f"BENCH_THREAD = {BENCH_THREAD!r}\n" + """
import sys, threading, time
from powerbudgetd_sim import libnvml
out, sim_cpu = sys.argv.pop(1), [0.0]
serve = libnvml.SimNvmlLibrary.serve
def timed(self, symbol, args):
    t0 = time.thread_time()
    try:
        return serve(self, symbol, args)
    finally:
        sim_cpu[0] += time.thread_time() - t0
libnvml.SimNvmlLibrary.serve = timed
def keep():
    while True:
        with open(out + '.tmp', 'w') as fh:
            fh.write(repr(sim_cpu[0]))
        import os
        os.replace(out + '.tmp', out)
        time.sleep(0.5)
threading.Thread(target=keep, daemon=True, name=BENCH_THREAD).start()
from powerbudgetd.cli import main
sys.exit(main(sys.argv[1:]))
"""


NULL_BOOTSTRAP = NAME_THREADS + f"BENCH_THREAD = {BENCH_THREAD!r}\n" + """
import sys
from powerbudgetd.cli import main
sys.exit(main(sys.argv[1:]))
"""


def threads_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of each of ``pid``'s threads so far (``schedstat``: nanoseconds, not
    clock ticks), summed by name, the NVML workers (``nvml-worker-N``) as one; the tick
    runs on ``powerbudgetd-tick`` (``service.tickthread``)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        key = ("event loop" if task.name == str(pid) else "NVML workers" if name.startswith("nvml-worker")
               else SHOWN.get(name, name))
        out[key] = out.get(key, 0.0) + ns / 1e9
    return out


def sim_cpu_s(path: Path) -> float:
    """CPU seconds the daemon's process spent inside the simulated NVML library so far."""
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="wall seconds of control (default 600)")
    ap.add_argument("--tick", type=float, default=0.1, help="control tick, s (default 0.1)")
    ap.add_argument("--scenario", default="workstation-4", help="the simulated bank (default workstation-4)")
    ap.add_argument("--budget", type=float, default=None,
                    help="budget, W (default 1000 on the simulated bank, 400 a card on the null driver)")
    ap.add_argument("--driver", choices=("sim", "null"), default="sim",
                    help="sim: the simulated bank (--backend sim); null: a C library that answers at once")
    ap.add_argument("--cards", type=int, default=8, help="cards of the null driver, 1 to 1024 (default 8)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds left out of the steady-state share (default 5)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    null = args.driver == "null"
    if null and not 1 <= args.cards <= nulldriver.MAX_CARDS:
        ap.error(f"--cards must be 1 to {nulldriver.MAX_CARDS}, got {args.cards}")
    if args.duration <= args.warmup:
        ap.error(f"--duration must be longer than --warmup ({args.warmup:g} s)")
    if args.budget is None:
        args.budget = 400.0 * args.cards if null else 1000.0

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "powerbudgetd.toml"
        log_dir = Path(tmp) / "powerlog"
        sim_part = "" if null else f'[sim]\nscenario = "{args.scenario}"\n'
        cfg.write_text(f'budget_w = {args.budget}\n[control]\ntick_s = {args.tick}\n{sim_part}[recorder]\ndir = "{log_dir}"\n')
        sim_file = Path(tmp) / "sim_cpu_s"
        env = dict(os.environ, STATE_DIRECTORY=tmp)  # whatever else reads the state directory
        if null:
            env.update(nulldriver.environ(nulldriver.build(Path(tmp)).parent, args.cards))
            cmd = [sys.executable, "-c", NULL_BOOTSTRAP, "run", "--config", str(cfg), "--backend", "nvml"]
        else:
            cmd = [sys.executable, "-c", BOOTSTRAP, str(sim_file), "run", "--config", str(cfg), "--backend", "sim"]
        errors = Path(tmp) / "stderr"
        with errors.open("wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        started = time.monotonic()
        time.sleep(min(args.warmup, args.duration))
        cpu_warm, sim_warm, wall_warm = cpu_s(proc.pid), sim_cpu_s(sim_file), time.monotonic()
        threads_warm = threads_cpu_s(proc.pid)
        time.sleep(max(0.0, args.duration - (wall_warm - started)))
        if proc.poll() is not None:
            print(f"daemon exited early with status {proc.returncode}:\n{errors.read_text()[-2000:]}", file=sys.stderr)
            return 1
        time.sleep(0.6)  # one more write of the simulator's share
        cpu_end, sim_end, wall_end = cpu_s(proc.pid), sim_cpu_s(sim_file), time.monotonic()
        threads_end = threads_cpu_s(proc.pid)
        # The bootstrap's own thread is the benchmark's, not the daemon's.
        bench_warm, bench_end = threads_warm.pop(BENCH_THREAD, 0.0), threads_end.pop(BENCH_THREAD, 0.0)
        rss = peak_rss_mb(proc.pid)
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=30)
        recorded = sorted(p.name for p in log_dir.glob("*")) if log_dir.is_dir() else []

    wall, steady_wall = wall_end - started, max(wall_end - wall_warm, 1e-9)
    out = {
        "driver": args.driver,
        "scenario": f"null driver, {args.cards} cards" if null else args.scenario,
        "tick_s": args.tick,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu_end, 2),
        "cpu_share_pct": round(100 * cpu_end / wall, 3),
        "steady_cpu_share_pct": round(100 * (cpu_end - cpu_warm) / steady_wall, 3),
        "sim_cpu_s": round(sim_end, 2),
        "daemon_cpu_s": round(cpu_end - sim_end - bench_end, 2),
        "daemon_cpu_share_pct": round(100 * (cpu_end - sim_end - bench_end) / wall, 3),
        "steady_daemon_cpu_share_pct": round(
            100 * ((cpu_end - cpu_warm) - (sim_end - sim_warm) - (bench_end - bench_warm)) / steady_wall, 3),
        "steady_thread_cpu_share_pct": {  # the simulator's share inside its callers' (the NVML workers)
            k: round(100 * (v - threads_warm.get(k, 0.0)) / steady_wall, 3)
            for k, v in sorted(threads_end.items(), key=lambda kv: threads_warm.get(kv[0], 0.0) - kv[1])
        },
        "peak_rss_mb": round(rss, 1),
        "exit_status": status,
        "flight_log_files": recorded,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        warm = f"after the first {args.warmup:g} s"
        lines = [
            f"powerbudgetd run --backend {'nvml' if null else 'sim'} ({out['scenario']}, tick {args.tick:g} s) "
            f"for {out['wall_s']:g} s of wall time:",
            f"  CPU {out['cpu_s']:g} s = {out['cpu_share_pct']:.2f} % of one core ({out['steady_cpu_share_pct']:.2f} % {warm}),"
            " of which",
            *([] if null else [f"    the simulated NVML library and its physics {out['sim_cpu_s']:g} s"]),
            f"    the daemon itself {out['daemon_cpu_s']:g} s = {out['daemon_cpu_share_pct']:.2f} % of one core "
            f"({out['steady_daemon_cpu_share_pct']:.2f} % {warm})",
            f"  by thread (the NVML workers all together{'' if null else ', the simulator inside them'}), "
            f"% of one core {warm}: "
            + ", ".join(f"{k} {v:.2f}" for k, v in out["steady_thread_cpu_share_pct"].items() if v >= 0.005),
            f"  peak RSS {out['peak_rss_mb']:g} MB",
            f"  exit status after SIGTERM: {status}",
        ]
        print("\n".join(lines))
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
