"""Demand shaped like inference: each host's cards driven by a request-rate curve through
the recorded H200 serving trace.

A host serves one *model* of :data:`MODELS` (drawn per host from the seed, by the
models' weights: the *mix*). Its request rate, a fraction of its peak (0-1), is

- a *diurnal* day compressed into ``day_s``: ``lo + (1 - lo) (1 - cos 2 pi (t / day_s
  + phase)) / 2`` with ``lo`` the day's min/max ratio (:data:`DIURNAL_MIN_MAX`: a
  serving fleet's trough is about a third of its peak); the phase is the seed's (a
  region's time of day) plus a little per host;
- plus *bursts*: arrivals at ``bursts_per_day`` a day (a Poisson process from the seed),
  each adding :data:`BURST_RATE` of the peak (clipped at 1) for :data:`BURST_S` of the day.

Each card turns the rate into demand through the serving trace's marked segments
(``traces/h200-serving.marks.json``): at rate 0 the ``idle_loaded`` segment (a loaded
model waiting), at :data:`LOW_RATE` the ``serving_low_rate`` one, at 1 the
``serving_high_rate`` one, each looped on its own clock (each card from its own offset)
and mixed linearly between; scaled by the card's TGP / 700 W (the limit the trace was
recorded at) and the model's ``power_scale``, with its ``workload`` class (a memory-bound
decode draws less for the same work lost to a cap). The trace's bursts stay in the
demand: the curve sets their level and how often the card idles.

This model is the simulator's, never the product's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass
from importlib import resources

from powerbudgetd_sim.physics import CardSpec
from powerbudgetd_sim.profiles import Profile
from powerbudgetd_sim.scenario import Scenario
from powerbudgetd_sim.traces import TRACE_LIMIT_W, Trace, load_trace

DIURNAL_MIN_MAX = 0.35  # the day's lowest request rate / its highest
BURSTS_PER_DAY = 6.0
BURST_RATE = 0.4  # a burst adds this fraction of the peak rate ...
BURST_S = 0.03  # ... for this fraction of the day
LOW_RATE = 0.35  # the rate the serving_low_rate segment stands for
PHASE_JITTER = 0.05  # each host's phase within this fraction of a day of the seed's
TRACE = "h200-serving"
SEGMENTS = ("idle_loaded", "serving_low_rate", "serving_high_rate")


@dataclass(frozen=True)
class Model:
    """One served model: its share of the hosts, power scale and workload class."""

    name: str
    weight: float
    power_scale: float
    workload: str


MODELS = (
    Model("chat-70b", 0.5, 1.0, "compute"),  # prefill-heavy: the full serving trace
    Model("code-8b", 0.3, 0.8, "memory"),  # decode-bound: lower power, memory-bound
    Model("embed", 0.2, 0.6, "compute"),  # short batches: well under TGP
)


@dataclass(frozen=True)
class RateCurve:
    """A host's request rate (fraction of its peak, 0-1) over its compressed day."""

    day_s: float
    phase: float  # fraction of a day
    bursts: tuple[float, ...]  # burst starts (s, within the first day; the day repeats)
    min_max: float = DIURNAL_MIN_MAX
    burst_rate: float = BURST_RATE
    burst_s: float = 0.0

    def diurnal(self, t_s: float) -> float:
        x = (1 - math.cos(2 * math.pi * (t_s / self.day_s + self.phase))) / 2
        return self.min_max + (1 - self.min_max) * x

    def in_burst(self, t_s: float) -> bool:
        local = t_s % self.day_s
        return any(b <= local < b + self.burst_s for b in self.bursts)

    def rate(self, t_s: float) -> float:
        return min(1.0, self.diurnal(t_s) + (self.burst_rate if self.in_burst(t_s) else 0.0))


def rate_curve(day_s: float, seed: int, host: int = 0, bursts_per_day: float = BURSTS_PER_DAY) -> RateCurve:
    """Host ``host``'s curve under ``seed``: the seed's phase plus a little of the host's,
    and its own bursts (Poisson at ``bursts_per_day``). Raises ValueError for a day <= 0."""
    if not day_s > 0:
        raise ValueError("day_s must be > 0")
    if bursts_per_day < 0:
        raise ValueError("bursts_per_day must be >= 0")
    base = random.Random(f"inference-phase:{seed}").random()
    rng = random.Random(f"inference:{seed}:{host}")
    phase = (base + rng.uniform(-PHASE_JITTER, PHASE_JITTER)) % 1.0
    bursts, t = [], 0.0
    while bursts_per_day > 0:
        t += rng.expovariate(bursts_per_day / day_s)
        if t >= day_s:
            break
        bursts.append(t)
    return RateCurve(day_s, phase, tuple(bursts), burst_s=BURST_S * day_s)


def pick_model(seed: int, host: int) -> Model:
    """The model host ``host`` serves under ``seed``, drawn by the models' weights."""
    rng = random.Random(f"inference-model:{seed}:{host}")
    return rng.choices(MODELS, weights=[m.weight for m in MODELS])[0]


def _segments() -> dict[str, tuple[float, float]]:
    path = resources.files("powerbudgetd_sim") / "traces" / f"{TRACE}.marks.json"
    marks = json.loads(path.read_text(encoding="utf-8"))
    bounds = {}
    for (start, name), (end, _) in zip(marks, marks[1:]):
        bounds[name] = (float(start), float(end))
    return {name: bounds[name] for name in SEGMENTS}


@dataclass(frozen=True)
class InferenceProfile(Profile):
    """A card's demand: its host's rate curve through the serving trace's segments
    (module docstring). ``offset_s`` staggers the card on the segments' clocks."""

    curve: RateCurve = dataclasses.field(default_factory=lambda: RateCurve(60.0, 0.0, ()))
    power_scale: float = 1.0
    workload: str = "compute"
    offset_s: float = 0.0

    def demand_w(self, t_s: float, idle_w: float, tgp_w: float) -> float:
        t = t_s + self.shift_s
        r = self.curve.rate(t)
        trace = load_trace(TRACE)
        lo_name, hi_name, frac = ((SEGMENTS[0], SEGMENTS[1], r / LOW_RATE) if r < LOW_RATE
                                  else (SEGMENTS[1], SEGMENTS[2], (r - LOW_RATE) / (1 - LOW_RATE)))
        lo, hi = _segment_w(trace, lo_name, t + self.offset_s), _segment_w(trace, hi_name, t + self.offset_s)
        w = (lo + (hi - lo) * frac) * tgp_w / TRACE_LIMIT_W * self.power_scale
        return max(idle_w, w)

    def workload_at(self, t_s: float) -> str:
        return self.workload


_BOUNDS: dict[str, tuple[float, float]] = {}


def _segment_w(trace: Trace, name: str, t_s: float) -> float:
    if not _BOUNDS:
        _BOUNDS.update(_segments())
    start, end = _BOUNDS[name]
    return trace.at(start + t_s % (end - start), loop=False)


def inference_scenario(sc: Scenario, seed: int, host: int = 0, day_s: float | None = None,
                       bursts_per_day: float = BURSTS_PER_DAY) -> Scenario:
    """``sc``'s bank, budget and feed with every card serving host ``host``'s model on its
    rate curve under ``seed`` (module docstring); ``day_s`` default: the scenario's duration."""
    day = sc.duration_s if day_s is None else day_s
    curve = rate_curve(day, seed, host, bursts_per_day)
    model = pick_model(seed, host)
    rng = random.Random(f"inference-offset:{seed}:{host}")
    cards: list[CardSpec] = [
        dataclasses.replace(c, profile=InferenceProfile(curve=curve, power_scale=model.power_scale,
                                                        workload=model.workload, offset_s=rng.uniform(0, 30)))
        for c in sc.cards]
    return dataclasses.replace(sc, name=f"{sc.name}@{model.name}", cards=tuple(cards),
                               description=f"{sc.description}; serving {model.name} on a {day:g} s day")
