"""Demand where the cards line up: a mix of training jobs that start together.

Each host joins one *job* of :data:`JOBS` (drawn per host from the seed by the jobs'
weights: the *mix*). A job holds every card of every host in it busy from its start to
its end (fractions of the run, ``run_s``: a job of minutes compressed with the run),
and its hosts step in lockstep, as data-parallel training does: each step of
:data:`STEP_S` computes at :data:`COMPUTE_LEVEL` of the card's TGP, then waits on the
all-reduce for :data:`SYNC_FRACTION` of the step at :data:`SYNC_LEVEL` of it, every
card of the job at once (the dips line up as the peaks do). Before its job starts and
after it ends a card idles (a host between jobs, its model unloaded). The seed moves
each job's start and end by up to :data:`JITTER` of the run and gives each card a
ripple of up to :data:`RIPPLE` below its level (cards of one part are not identical).

The point: a row provisioned by nameplate never sees every card at its maximum limit
on inference or mixed demand; here most of its cards are at TGP at once for most of the
run, with a load step of the whole job at its start, which is what oversubscription
has to survive.

This model is the simulator's, never the product's.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from powerbudgetd_sim.physics import CardSpec
from powerbudgetd_sim.profiles import Profile
from powerbudgetd_sim.scenario import Scenario

STEP_S = 2.0  # one training step (s): compute, then the all-reduce
SYNC_FRACTION = 0.10  # of each step spent waiting on the all-reduce
COMPUTE_LEVEL = 1.0  # of the card's TGP while it computes
SYNC_LEVEL = 0.5  # of the card's TGP while it waits on the all-reduce
RIPPLE = 0.03  # each card's level is up to this fraction below the job's
JITTER = 0.02  # each job's start and end move by up to this fraction of the run


@dataclass(frozen=True)
class Job:
    """One training job: its share of the hosts and its span (fractions of the run)."""

    name: str
    weight: float
    start: float
    end: float


JOBS = (
    Job("pretrain", 0.6, 0.05, 1.00),  # the big run: most of the row, to the end
    Job("finetune", 0.3, 0.06, 0.85),  # starts with it, ends before
    Job("between", 0.1, 0.40, 0.70),  # hosts between jobs most of the run: a short eval
)


@dataclass(frozen=True)
class JobSpan:
    """A job as played: its start and end (s) under the seed."""

    job: Job
    start_s: float
    end_s: float

    def busy(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    def computing(self, t_s: float) -> bool:
        """Within a step's compute (not its all-reduce): the same for every card of the job."""
        return (t_s - self.start_s) % STEP_S < (1.0 - SYNC_FRACTION) * STEP_S


def job_span(job: Job, run_s: float, seed: int) -> JobSpan:
    """``job``'s start and end (s) in a run of ``run_s`` under ``seed``. Raises
    ValueError for a run <= 0."""
    if not run_s > 0:
        raise ValueError("run_s must be > 0")
    rng = random.Random(f"training-span:{seed}:{job.name}")
    start = max(0.0, job.start + rng.uniform(-JITTER, JITTER)) * run_s
    end = min(1.0, job.end + rng.uniform(-JITTER, JITTER)) * run_s if job.end < 1.0 else run_s
    return JobSpan(job, start, max(start, end))


def pick_job(seed: int, host: int) -> Job:
    """The job host ``host`` runs under ``seed``, drawn by the jobs' weights."""
    rng = random.Random(f"training-job:{seed}:{host}")
    return rng.choices(JOBS, weights=[j.weight for j in JOBS])[0]


@dataclass(frozen=True)
class TrainingProfile(Profile):
    """A card's demand: its job's lockstep (module docstring), ``level`` the card's
    fraction of the job's levels (its ripple)."""

    span: JobSpan = dataclasses.field(default_factory=lambda: JobSpan(JOBS[0], 0.0, 0.0))
    level: float = 1.0

    def demand_w(self, t_s: float, idle_w: float, tgp_w: float) -> float:
        t = t_s + self.shift_s
        if not self.span.busy(t):
            return idle_w
        frac = COMPUTE_LEVEL if self.span.computing(t) else SYNC_LEVEL
        return max(idle_w, frac * self.level * tgp_w)

    def workload_at(self, t_s: float) -> str:
        return "compute"


def training_scenario(sc: Scenario, seed: int, host: int = 0, run_s: float | None = None) -> Scenario:
    """``sc``'s bank, budget and feed with every card in host ``host``'s job under
    ``seed`` (module docstring); ``run_s`` default: the scenario's duration."""
    run = sc.duration_s if run_s is None else run_s
    job = pick_job(seed, host)
    span = job_span(job, run, seed)
    rng = random.Random(f"training-ripple:{seed}:{host}")
    cards: list[CardSpec] = [dataclasses.replace(c, profile=TrainingProfile(span=span, level=1.0 - rng.uniform(0, RIPPLE)))
                             for c in sc.cards]
    return dataclasses.replace(sc, name=f"{sc.name}@{job.name}", cards=tuple(cards),
                               description=f"{sc.description}; training job {job.name} on a {run:g} s run")
