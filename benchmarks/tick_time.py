"""Benchmark: the controller's and the NVML layer's time per tick, 1 to 1024 simulated cards.

Each bank has a mix that keeps the policy busy: a quarter of the cards flat out, a
quarter bursty (2 s on / 3 s off), a quarter waking and sleeping every 20 s, the rest
idle; the budget is 250 W a card (300 W cards, 150 W floors). The controller runs on
virtual time through the production NVML layer over the real bindings on the simulated
NVML library, its calls made as the daemon makes them (``DeadlineCalls`` with the
default deadline; ``--inline`` makes them on the controller's thread). Each tick's CPU
time (``time.process_time``: every thread of this process, so a busy machine's
preemptions do not count) is split three ways:

- **simulator**: inside the simulated NVML library (its physics; on real hardware the
  driver's own time takes its place), timed on the calling thread's CPU clock;
- **NVML layer**: the rest of the time spent in the calls (the bindings, the
  ``powerbudgetd.hw`` layer, and the worker threads the calls run in);
- **controller**: everything else in the tick: bounds, decisions, plan, bookkeeping,
  the tick's report.

Also printed: the tick's wall time (``time.perf_counter``) and the calls that missed
their deadline (each costs its card one tick of control).

The simulated library answers through Python callbacks (ctypes calls back into the
simulator, which routes each call to its bank), and the part of that outside its
``serve`` counts in the NVML layer above, as does this benchmark's own timing of each call
there. ``--driver null`` therefore also times the NVML layer over a driver that costs
nothing (``sim/nullnvml.c``, loaded by the bindings' own loader in a child process, as in
``daemon_cost.py``): a controller over it makes a tick's calls as the daemon would, and
all of their time is the layer's (the bindings, ``powerbudgetd.hw``, the workers): what
the layer costs over a real driver, less the driver's own time. The controller's time is
still taken over the simulated bank, whose physics gives it decisions to make; the null
driver's fixed square wave gives it few.

    python benchmarks/tick_time.py [--ticks 600] [--cards 1 8 64 256 1024] [--inline] [--driver null]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

from powerbudgetd.control.controller import Controller
from powerbudgetd.core.model import Timings
from powerbudgetd.errors import NvmlTimeout
from powerbudgetd.hw.calls import DeadlineCalls, InlineCalls
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.service.logs import configure_logging
from powerbudgetd_sim import nulldriver
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import CardSpec, SimBank
from powerbudgetd_sim.profiles import Phase, Profile


class SimClock:
    """CPU seconds spent inside the simulated NVML library, summed over threads."""

    def __init__(self) -> None:
        self.spent_s = 0.0
        self._lock = threading.Lock()

    def wrap(self, lib: SimNvmlLibrary) -> SimNvmlLibrary:
        serve = lib.serve

        def timed(symbol: str, args: Any) -> Any:
            t0 = time.thread_time()
            try:
                return serve(symbol, args)
            finally:
                with self._lock:
                    self.spent_s += time.thread_time() - t0

        lib.serve = timed  # type: ignore[method-assign]
        return lib


class TimedCalls:
    """The controller's ``calls``, with the process CPU time spent in them in :attr:`spent_s`
    (the NVML layer with the simulator in it) and the calls past their deadline counted."""

    def __init__(self, inner: InlineCalls) -> None:
        self.inner = inner
        self.spent_s = 0.0
        self.timeouts = 0

    def _timed(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        t0 = time.process_time()
        try:
            return fn(*args, **kw)
        except NvmlTimeout:
            self.timeouts += 1
            raise
        finally:
            self.spent_s += time.process_time() - t0

    def call(self, key: str, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        return self._timed(self.inner.call, key, fn, *args, timeout_s=timeout_s)

    def many(self, calls: Any) -> dict[str, Any]:
        out = self._timed(self.inner.many, calls)
        self.timeouts += sum(isinstance(r, NvmlTimeout) for r in out.values())
        return out

    def overdue(self) -> dict[str, float]:
        return self.inner.overdue()


def bank_specs(n: int) -> list[CardSpec]:
    profiles = [
        Profile((Phase(0.0, "constant", power_w=300.0),)),
        Profile((Phase(0.0, "square", high_w=300.0, on_s=2.0, off_s=3.0),)),
        Profile(tuple(Phase(float(t), "constant" if t % 40 else "idle", power_w=280.0) for t in range(0, 3600, 20))),
        Profile(),
    ]
    return [
        CardSpec(f"GPU-bench-{i:04d}", "bench card", 150.0, 300.0, 300.0, 30.0, profile=profiles[i % 4])
        for i in range(n)
    ]


def _ms(values: list[float], q: float | None = None) -> float:
    if q is None:
        return round(1000 * statistics.fmean(values), 4)
    return round(1000 * sorted(values)[int(len(values) * q)], 4)


def started(nvml: Nvml, budget_w: float, inline: bool) -> tuple[Controller, TimedCalls, Timings]:
    """A started controller over ``nvml`` at ``budget_w``, its calls timed (and made
    through the deadline workers unless ``inline``), and its timings."""
    timings = Timings()
    calls = TimedCalls(InlineCalls())
    ctl = Controller(nvml, budget_w, timings, calls=calls)  # type: ignore[arg-type]
    ctl.start()  # inline: enumeration is not a tick, and on a busy machine may miss its deadline
    if not inline:
        calls.inner = DeadlineCalls(timings.call_timeout_s)
    return ctl, calls, timings


def measure(n: int, ticks: int, inline: bool = False) -> dict[str, Any]:
    """Run ``ticks`` ticks on ``n`` cards; times per tick in ms (see the module docstring)."""
    bank = SimBank(bank_specs(n), lag_s=0.1, seed=1)
    sim = SimClock()
    nvml = Nvml(sim.wrap(SimNvmlLibrary(bank)))
    nvml.init()
    ctl, calls, timings = started(nvml, 250.0 * n, inline)
    own, layer, simulator, wall = [], [], [], []
    writes = 0
    calls.timeouts = 0
    for k in range(ticks):
        t = round(k * timings.tick_s, 9)
        bank.advance_to(t)
        calls.spent_s = sim.spent_s = 0.0
        w0, t0 = time.perf_counter(), time.process_time()
        rep = ctl.tick(t)
        elapsed, wall_s = time.process_time() - t0, time.perf_counter() - w0
        writes += len(rep.writes)
        own.append(elapsed - calls.spent_s)
        layer.append(calls.spent_s - sim.spent_s)
        simulator.append(sim.spent_s)
        wall.append(wall_s)
    return {
        "cards": n,
        "ticks": ticks,
        "calls": "inline" if inline else "deadline",
        "limit_writes": writes,
        "deadline_misses": calls.timeouts,
        "controller_ms_mean": _ms(own),
        "controller_ms_p99": _ms(own, 0.99),
        "nvml_layer_ms_mean": _ms(layer),
        "nvml_layer_ms_p99": _ms(layer, 0.99),
        "controller_plus_nvml_ms_mean": _ms([a + b for a, b in zip(own, layer)]),
        "simulator_ms_mean": _ms(simulator),
        "wall_ms_mean": _ms(wall),
        "wall_ms_p99": _ms(wall, 0.99),
    }


def measure_layer(n: int, ticks: int, inline: bool = False) -> dict[str, Any]:
    """In a process started with :func:`nulldriver.environ`: a controller over the null
    driver's ``n`` cards ticked ``ticks`` times; the CPU time of its NVML calls per tick
    in ms (all of it the layer's: the driver's calls cost nothing). Raises SystemExit
    unless the null driver, with ``n`` cards, is what NVML answers from."""
    nvml = Nvml()
    nvml.init()
    if nvml.driver_version() != nulldriver.DRIVER_VERSION:
        raise SystemExit(f"not the null driver: NVML says driver {nvml.driver_version()}")
    ctl, calls, timings = started(nvml, 400.0 * n, inline)
    if len(ctl.cards) != n:
        raise SystemExit(f"the null driver has {len(ctl.cards)} cards, not {n}")
    layer = []
    writes = 0
    calls.timeouts = 0
    for k in range(ticks):
        calls.spent_s = 0.0
        writes += len(ctl.tick(round(k * timings.tick_s, 9)).writes)
        layer.append(calls.spent_s)
    return {"cards": n, "deadline_misses": calls.timeouts, "limit_writes": writes,
            "nvml_layer_c_ms_mean": _ms(layer), "nvml_layer_c_ms_p99": _ms(layer, 0.99)}


def layer_over_null_driver(built: Path, cards: list[int], ticks: int, inline: bool) -> list[dict[str, Any]]:
    """:func:`measure_layer` for each bank size, each in a child process that loads the
    null driver built in ``built``. Raises RuntimeError with the child's own error."""
    rows = []
    for n in cards:
        argv = [sys.executable, __file__, "--layer-only", "--ticks", str(ticks), "--cards", str(n)]
        child = subprocess.run(argv + (["--inline"] if inline else []), capture_output=True, text=True,
                               env={**os.environ, **nulldriver.environ(built, n)})
        lines = child.stdout.strip().splitlines()
        if child.returncode != 0 or not lines:
            raise RuntimeError(f"the null driver's run at {n} cards failed (exit {child.returncode}):\n"
                               f"{child.stderr.strip()[-2000:]}")
        rows.append(json.loads(lines[-1]))  # the last line: anything printed before it is not ours
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=600, help="ticks per bank (default 600 = 1 min at 100 ms)")
    ap.add_argument("--cards", type=int, nargs="+", default=[1, 8, 64, 256, 1024])
    ap.add_argument("--inline", action="store_true", help="make the NVML calls on the controller's thread")
    ap.add_argument("--driver", choices=("sim", "null"), default="sim",
                    help="null: also time the NVML layer over a C driver that costs nothing")
    ap.add_argument("--layer-only", action="store_true", help=argparse.SUPPRESS)  # the null driver's child
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    configure_logging(level="error", stream=sys.stderr)
    if args.layer_only:
        print(json.dumps(measure_layer(args.cards[0], args.ticks, args.inline)))
        return 0
    if args.ticks < 1 or min(args.cards) < 1:
        ap.error("--ticks and --cards must be at least 1")
    if args.driver == "null" and not all(1 <= n <= nulldriver.MAX_CARDS for n in args.cards):
        ap.error(f"--driver null takes 1 to {nulldriver.MAX_CARDS} cards")
    with tempfile.TemporaryDirectory(prefix="tick-time-") as tmp:
        built = None
        if args.driver == "null":
            try:  # before the long part: a missing compiler shows at once
                built = nulldriver.build(Path(tmp)).parent
            except (OSError, subprocess.CalledProcessError) as exc:
                ap.error(f"--driver null needs a C compiler (cc) to build the null driver: {exc}")
        rows = [measure(n, args.ticks, args.inline) for n in args.cards]
        if built is not None:
            try:
                layers = layer_over_null_driver(built, args.cards, args.ticks, args.inline)
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                return 1
            for r, c in zip(rows, layers, strict=True):
                r["nvml_layer_c_ms_mean"], r["nvml_layer_c_ms_p99"] = c["nvml_layer_c_ms_mean"], c["nvml_layer_c_ms_p99"]
                r["controller_plus_nvml_c_ms_mean"] = round(r["controller_ms_mean"] + c["nvml_layer_c_ms_mean"], 4)
                r["deadline_misses_c"], r["limit_writes_c"] = c["deadline_misses"], c["limit_writes"]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"time per tick, ms of CPU ({args.ticks} ticks each, NVML calls {rows[0]['calls']}; "
          "simulator = the simulated library's physics, not counted in the others):")
    print(f"  {'cards':>5} {'controller':>11} {'p99':>8} {'NVML layer':>11} {'p99':>8} {'ctl+NVML':>9} "
          f"{'simulator':>10} {'wall':>8} {'wall p99':>9} {'missed':>7} {'writes':>7}")
    for r in rows:
        print(
            f"  {r['cards']:>5} {r['controller_ms_mean']:>11.3f} {r['controller_ms_p99']:>8.3f} "
            f"{r['nvml_layer_ms_mean']:>11.3f} {r['nvml_layer_ms_p99']:>8.3f} {r['controller_plus_nvml_ms_mean']:>9.3f} "
            f"{r['simulator_ms_mean']:>10.3f} {r['wall_ms_mean']:>8.3f} {r['wall_ms_p99']:>9.3f} "
            f"{r['deadline_misses']:>7} {r['limit_writes']:>7}"
        )
    if args.driver == "null":
        print("over the null driver (a C library whose calls cost nothing): the NVML layer, and the "
              "controller above plus it:")
        print(f"  {'cards':>5} {'NVML layer':>11} {'p99':>8} {'ctl+NVML':>9} {'missed':>7} {'writes':>7}")
        for r in rows:
            print(f"  {r['cards']:>5} {r['nvml_layer_c_ms_mean']:>11.3f} {r['nvml_layer_c_ms_p99']:>8.3f} "
                  f"{r['controller_plus_nvml_c_ms_mean']:>9.3f} {r['deadline_misses_c']:>7} {r['limit_writes_c']:>7}")
    if len(rows) > 1:
        a, b = rows[-2], rows[-1]
        for key, what in (("controller_plus_nvml_ms_mean", "simulated library"),
                          ("controller_plus_nvml_c_ms_mean", "null driver")):
            if key in b:
                print(f"  controller + NVML layer ({what}) at {b['cards']} cards / at {a['cards']}: "
                      f"{b[key] / max(a[key], 1e-9):.2f} (cards x{b['cards'] / a['cards']:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
