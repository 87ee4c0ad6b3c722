"""How faithful the simulated card is: each recorded trace replayed, real vs simulated.

Each packaged trace (``traces/``, recorded on one H200 at its 700 W limit) is replayed
as demand into one simulated H200 at the same limit, sampled at every 100 ms refresh
as the real card was. The same figures are then taken off the real samples (one per
refresh: consecutive repeats of the 25 ms sampler dropped) and off the simulated ones:

- ``sustained``: instant power p50/p95/p99/max over the sustained matmul (load steps);
- ``serving``: instant power p50/p95/p99/max while serving at the high request rate;
- ``bursts``: the peak instant sample of each 200 ms burst: mean and max;
- ``onset``: at every load onset from idle straight over the limit, that first sample (min and
  max, x limit) and how long samples stay above the pinned band (s, mean and max);
- ``rise``: the 1 s average's 10-90 % rise time at the onset of sustained work (s).

Each figure has a tolerance (5 % of the real value; rise time 0.1 s) and is met or not.
Phase windows come from the traces' marks (``h200-load-steps.meta.json``
``phase_marks_s``, ``h200-serving.marks.json``).
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

from powerbudgetd_sim.physics import PIN_NOISE, CardSpec, SimBank
from powerbudgetd_sim.profiles import Phase, Profile
from powerbudgetd_sim.traces import TRACE_LIMIT_W, TRACES

REL_TOLERANCE = 0.05  # every figure within 5 % of the real one ...
RISE_TOLERANCE_S = 0.1  # ... the rise time within 0.1 s
IDLE_FRACTION = 0.5  # a sample under this x limit is idle (idle is 80-125 W at 700 W)
LOADED_FRACTION = 0.8  # an onset: idle, then a sample at or over this x limit
BURST_FRACTION = 0.5  # a burst: consecutive samples over this x limit
RISE_SETTLE_S = (1.5, 3.0)  # the settled average: median over this window after onset
SEED = 1


@dataclass(frozen=True)
class Sample:
    """One refresh: time (s, from the trace's start), its phase, instant and 1 s average (W)."""

    t_s: float
    phase: str
    instant_w: float
    avg_w: float


@dataclass(frozen=True)
class Figure:
    """One figure, real vs simulated, with its tolerance (same unit) and verdict."""

    trace: str
    name: str
    unit: str
    real: float
    sim: float
    tolerance: float

    @property
    def met(self) -> bool:
        return abs(self.sim - self.real) <= self.tolerance + 1e-9

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "met": self.met}


def phase_marks(trace: str) -> list[tuple[float, str]]:
    """``(start_s, phase)`` of each phase of a packaged trace, ascending."""
    base = resources.files("powerbudgetd_sim") / "traces"
    if trace == "h200-load-steps":
        marks = json.loads((base / f"{trace}.meta.json").read_text())["phase_marks_s"]
    else:
        marks = json.loads((base / f"{trace}.marks.json").read_text())
    return [(0.0, "idle0")] + [(float(t), str(name)) for t, name in marks]


def _phase_at(marks: list[tuple[float, str]], t_s: float) -> str:
    name = marks[0][1]
    for start, phase in marks:
        if start <= t_s:
            name = phase
    return name


def real_samples(trace: str) -> list[Sample]:
    """The recorded refreshes of ``trace``: one sample per change of the readings."""
    if trace not in TRACES:
        raise KeyError(f"unknown trace {trace!r}; known: {', '.join(TRACES)}")
    marks = phase_marks(trace)
    path = resources.files("powerbudgetd_sim") / "traces" / f"{trace}.csv"
    out: list[Sample] = []
    last: tuple[str, str] | None = None
    with io.TextIOWrapper(path.open("rb"), encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            key = (row["power_instant_mw"], row["power_average_mw"])
            if key == last:
                continue  # the sampler polled every ~25 ms; NVML refreshes every 100 ms
            last = key
            t = float(row["t_s"])
            out.append(Sample(t, _phase_at(marks, t), int(key[0]) / 1000, int(key[1]) / 1000))
    return out


def sim_samples(trace: str, seed: int = SEED) -> list[Sample]:
    """``trace`` replayed as demand into one simulated H200 at 700 W, every refresh."""
    marks = phase_marks(trace)
    real = real_samples(trace)
    idle_w = min(s.instant_w for s in real)
    spec = CardSpec(
        uuid="GPU-fidelity", name="NVIDIA H200", min_w=200.0, max_w=TRACE_LIMIT_W, default_w=TRACE_LIMIT_W,
        idle_w=idle_w, profile=Profile((Phase(0.0, "trace", trace=trace, scale=1.0),)),
    )
    bank = SimBank([spec], seed=seed)
    card = bank.cards[0]
    out: list[Sample] = []
    bank.observers.append(lambda t: out.append(Sample(t, _phase_at(marks, t), card.instant_w, card.avg_w)))
    bank.advance_to(real[-1].t_s)
    return out


def _pct(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0-1) of ``xs``."""
    ys = sorted(xs)
    pos = (len(ys) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


def _instants(samples: Sequence[Sample], phase: str) -> list[float]:
    return [s.instant_w for s in samples if s.phase == phase]


def burst_peaks(samples: Sequence[Sample], phase: str, limit_w: float = TRACE_LIMIT_W) -> list[float]:
    """The highest instant sample (W) of each burst (consecutive samples over half the limit)."""
    peaks: list[float] = []
    run: list[float] = []
    for s in [x for x in samples if x.phase == phase] + [Sample(0, "", 0.0, 0.0)]:
        if s.instant_w > BURST_FRACTION * limit_w:
            run.append(s.instant_w)
        elif run:
            peaks.append(max(run))
            run = []
    return peaks


def onsets(samples: Sequence[Sample], limit_w: float = TRACE_LIMIT_W) -> list[tuple[float, float]]:
    """Each load onset from idle: (first loaded sample x limit, seconds above the pinned band)."""
    band = limit_w * (1.0 + PIN_NOISE)
    out: list[tuple[float, float]] = []
    for i in range(1, len(samples)):
        if samples[i - 1].instant_w < IDLE_FRACTION * limit_w and samples[i].instant_w > limit_w:
            n = 0
            while i + n < len(samples) and samples[i + n].instant_w > band:
                n += 1
            out.append((samples[i].instant_w / limit_w, round(n * 0.1, 3)))
    return out


def rise_times(samples: Sequence[Sample], phases: Sequence[str], limit_w: float = TRACE_LIMIT_W) -> list[float]:
    """The 1 s average's 10-90 % rise time (s) at the onset of each of ``phases``."""
    out: list[float] = []
    for phase in phases:
        idx = [i for i, s in enumerate(samples) if s.phase == phase]
        if not idx:
            continue
        first = next((i for i in idx if samples[i].instant_w >= LOADED_FRACTION * limit_w), None)
        if first is None or first == 0:
            continue
        t0 = samples[first].t_s
        base = samples[first - 1].avg_w
        settled = [s.avg_w for s in samples if t0 + RISE_SETTLE_S[0] <= s.t_s <= t0 + RISE_SETTLE_S[1]]
        top = statistics.median(settled)
        lo, hi = base + 0.1 * (top - base), base + 0.9 * (top - base)
        t_lo = _crossing(samples, first - 1, lo)
        t_hi = _crossing(samples, first - 1, hi)
        if t_lo is not None and t_hi is not None:
            out.append(t_hi - t_lo)
    return out


def _crossing(samples: Sequence[Sample], start: int, level: float) -> float | None:
    """When the average first reaches ``level`` after ``start`` (linear between samples)."""
    for i in range(start + 1, len(samples)):
        a, b = samples[i - 1], samples[i]
        if b.avg_w >= level:
            if b.avg_w == a.avg_w:
                return b.t_s
            return a.t_s + (b.t_s - a.t_s) * (level - a.avg_w) / (b.avg_w - a.avg_w)
    return None


def figures(real: Sequence[Sample], sim: Sequence[Sample], trace: str) -> list[Figure]:
    """Every figure the trace has data for, real vs simulated."""
    out: list[Figure] = []

    def add(name: str, unit: str, r: float, s: float, tol: float | None = None) -> None:
        out.append(Figure(trace, name, unit, round(r, 3), round(s, 3),
                          round(REL_TOLERANCE * abs(r) if tol is None else tol, 3)))

    for phase, label in (("matmul_sustained", "sustained"), ("serving_high_rate", "serving")):
        ri, si = _instants(real, phase), _instants(sim, phase)
        if ri and si:
            for q, qn in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99"), (1.0, "max")):
                add(f"{label} instant {qn}", "W", _pct(ri, q), _pct(si, q))
    rb, sb = burst_peaks(real, "bursts_200on_300off"), burst_peaks(sim, "bursts_200on_300off")
    if rb and sb:
        add("200 ms burst peak mean", "W", statistics.fmean(rb), statistics.fmean(sb))
        add("200 ms burst peak max", "W", max(rb), max(sb))
    ro, so = onsets(real), onsets(sim)
    if ro and so:
        add("onset overshoot min", "x limit", min(x for x, _ in ro), min(x for x, _ in so))
        add("onset overshoot max", "x limit", max(x for x, _ in ro), max(x for x, _ in so))
        add("onset overshoot duration mean", "s", statistics.fmean(d for _, d in ro),
            statistics.fmean(d for _, d in so), RISE_TOLERANCE_S / 2)
        add("onset overshoot duration max", "s", max(d for _, d in ro), max(d for _, d in so), RISE_TOLERANCE_S)
    sustained = ("matmul_sustained", "training_like")
    rr, sr = rise_times(real, sustained), rise_times(sim, sustained)
    if rr and sr:
        add("1 s average 10-90 % rise", "s", statistics.fmean(rr), statistics.fmean(sr), RISE_TOLERANCE_S)
    return out


def fidelity(seed: int = SEED) -> dict[str, Any]:
    """Every trace's figures, real vs simulated: ``{"traces": {name: [figure...]},
    "all_met": bool, "limit_w": 700.0, "seed": seed}``."""
    traces: dict[str, list[dict[str, Any]]] = {}
    for name in TRACES:
        traces[name] = [f.as_dict() for f in figures(real_samples(name), sim_samples(name, seed), name)]
    return {
        "limit_w": TRACE_LIMIT_W,
        "seed": seed,
        "traces": traces,
        "all_met": all(f["met"] for fs in traces.values() for f in fs),
    }


def format_fidelity(rep: dict[str, Any]) -> str:
    """The side-by-side table."""
    lines = [f"simulated H200 vs recorded, each trace replayed at its {rep['limit_w']:g} W limit (seed {rep['seed']})"]
    for trace, figs in rep["traces"].items():
        lines.append(f"  {trace}")
        lines.append(f"    {'figure':34} {'real':>9} {'simulated':>10} {'tolerance':>10}  verdict")
        for f in figs:
            u = "" if f["unit"] == "x limit" else f" {f['unit']}"
            lines.append(f"    {f['name'] + ' (' + f['unit'] + ')':34} {f['real']:>9g} {f['sim']:>10g} "
                         f"{'±' + format(f['tolerance'], 'g') + u:>10}  {'met' if f['met'] else 'NOT MET'}")
    lines.append("all met" if rep["all_met"] else "NOT ALL MET")
    return "\n".join(lines)
