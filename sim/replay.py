"""Replay a flight-recorder log as demand: what would another budget or policy have done?

:func:`load_replay` turns a recorded log (a recorder directory or one ``power-*.jsonl``)
into a :class:`~powerbudgetd_sim.scenario.Scenario` whose cards are the recorded ones
(UUID, name, limit constraints from the log's header) and whose demand is each card's
recorded draw, second by second:

- ``draw="avg"`` (default): the recorded 1 s average. The average at a record covers
  the interval before it, so that value is the demand over that interval.
- ``draw="peak"``: the highest instant draw of each interval, held for the interval:
  an upper bound, for asking whether a budget would have held on the worst moments.

What a log cannot tell: how much a card *wanted* while it sat at its cap. Such seconds
replay at the cap, so a replay at a higher budget understates demand there; the
scenario's description says what share of card-seconds were at their cap. Gaps in the
log (daemon down, power off) replay as idle.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerbudgetd.powerlog.reader import LogError, clock_steps, load_samples, scan_log, timeline_s
from powerbudgetd_sim.physics import CardSpec
from powerbudgetd_sim.profiles import Profile
from powerbudgetd_sim.feed import FEED_KEYS, feed_from_dict
from powerbudgetd_sim.scenario import MIN_DURATION_S, Scenario, ScenarioError

DRAWS = ("avg", "peak")
PINNED_FRACTION = 0.95  # a 1 s average at or above this x the limit: the cap was binding
GAP_INTERVALS = 2.5  # records further apart than this x the interval leave a gap (idle)
MAX_GAP_S = 3600.0  # a gap between runs longer than this replays as this (a negative one: as one interval)
MAX_REPLAY_S = 31 * 86_400.0  # a longer span is a log to cut, not one to replay whole


@dataclass(frozen=True)
class ReplayProfile(Profile):
    """Demand (W) that steps through recorded values: ``watts[i]`` holds over
    ``(times[i-1], times[i]]`` (s); None, and any time after the last, is idle."""

    times: tuple[float, ...] = ()
    watts: tuple[float | None, ...] = ()

    def demand_w(self, t_s: float, idle_w: float, tgp_w: float) -> float:
        i = bisect.bisect_left(self.times, t_s - 1e-9)
        w = self.watts[i] if i < len(self.watts) else None
        # Never clipped at the rated power: a recorded peak above the cap is what the
        # card drew, and the physics decides what of it a (new) cap lets through.
        return idle_w if w is None else max(idle_w, w)


def load_replay(
    path: str | Path,
    *,
    draw: str = "avg",
    budget_w: float | None = None,
    tick_s: float = 0.1,
    lag_s: float = 0.1,
    seed: int = 1,
) -> Scenario:
    """A scenario replaying the log at ``path``. ``budget_w`` defaults to the last
    recorded budget. Raises ScenarioError naming the path when there is nothing to replay,
    the log is not usable (bounds: :mod:`powerbudgetd.powerlog.reader`), or it spans
    more than :data:`MAX_REPLAY_S`."""
    if draw not in DRAWS:
        raise ScenarioError(f"draw must be one of {', '.join(DRAWS)}, got {draw!r}")
    try:
        return _load_replay(path, draw, budget_w, tick_s, lag_s, seed)
    except (LogError, ScenarioError) as exc:
        raise ScenarioError(str(exc)) from None
    except (ValueError, TypeError, KeyError, OverflowError, AttributeError) as exc:  # a hostile header
        raise ScenarioError(f"{path}: not a usable power log: {str(exc)[:200]}") from None


def _load_replay(path: str | Path, draw: str, budget_w: float | None, tick_s: float, lag_s: float, seed: int) -> Scenario:
    log = scan_log(path)
    samples, _ = load_samples(log.files)
    if not samples:
        raise ScenarioError(f"{path}: no sample records to replay")
    interval = log.runs[-1].interval_s
    if not 0 < interval <= 3600:
        raise ScenarioError(f"{path}: the header's interval_s {interval!r} is not in (0, 3600] s")
    headers = {c["uuid"]: c for r in log.runs for c in (r.header or {}).get("cards", [])}

    # Time from the monotonic clock within a run, the wall clock only between runs (and
    # only when plausible): a stepped wall clock neither stretches nor folds the replay.
    offsets, long_gaps, short_gaps = timeline_s(samples, interval, MAX_GAP_S)
    if offsets[-1] > MAX_REPLAY_S:
        raise ScenarioError(
            f"{path}: the records span {offsets[-1] / 86_400:.0f} days; replay at most "
            f"{MAX_REPLAY_S / 86_400:.0f} days: give one file, or a directory of fewer"
        )
    steps = clock_steps(samples)
    uuids: dict[str, int] = {}
    for s in samples:
        for c in s.cards:
            uuids[c.uuid] = c.index
    order = sorted(uuids, key=lambda u: uuids[u])
    times: list[float] = []
    watts: dict[str, list[float | None]] = {u: [] for u in order}
    prev_t: float | None = None
    pinned = seen = 0
    for s, offset in zip(samples, offsets):
        t = max(offset + interval, prev_t or 0.0)  # the first record's average covers the interval before it
        if prev_t is not None and t - prev_t > GAP_INTERVALS * interval:
            times.append(t - interval)  # idle through the gap, up to the interval this record covers
            for u in order:
                watts[u].append(None)
        times.append(t)
        by = {c.uuid: c for c in s.cards}
        for u in order:
            card = by.get(u)
            w = None if card is None else (card.peak_w if draw == "peak" and card.peak_w is not None else card.avg_w)
            watts[u].append(w)
            if card is not None and card.avg_w is not None and card.limit_w:
                seen += 1
                pinned += card.avg_w >= PINNED_FRACTION * card.limit_w
        prev_t = t

    cards = []
    for u in order:
        recorded = [c for s in samples for c in s.cards if c.uuid == u]
        cards.append(_card_spec(u, headers.get(u, {}), recorded, ReplayProfile(times=tuple(times), watts=tuple(watts[u]))))
    if times[-1] < MIN_DURATION_S:
        raise ScenarioError(f"{path}: the records cover only {times[-1]:g} s: too short to replay "
                            f"(at least {MIN_DURATION_S:g} s)")
    budget = budget_w if budget_w is not None else samples[-1].budget_w
    share = 100.0 * pinned / seen if seen else 0.0
    simulated = [r for r in log.runs if r.simulated and r.has_samples]
    feed, feed_note = _recorded_feed(log.runs)
    return Scenario(
        name=f"replay:{Path(path).name}",
        budget_w=float(budget),
        cards=tuple(cards),
        duration_s=round(times[-1], 3),
        seed=seed,
        lag_s=lag_s,
        tick_s=tick_s,
        feed=feed,
        description=(
            (f"SIMULATED: {len(simulated)} of {sum(r.has_samples for r in log.runs)} recorded run(s) came from "
             "--backend sim, not real cards; " if simulated else "")
            + f"replay of {len(samples)} records ({draw} draw), {_budgets(samples)}; replayed at "
            f"{budget:g} W{'' if budget_w is None else ' (--budget)'}; "
            f"{share:.0f} % of card-seconds at their cap (demand above it unknown)"
            + feed_note
            + (f"; the wall clock stepped {len(steps)} time(s): timed by the monotonic clock" if steps else "")
            + (f"; {long_gaps} gap(s) between runs over {MAX_GAP_S:g} s, replayed as {MAX_GAP_S:g} s"
               if long_gaps else "")
            + (f"; {short_gaps} gap(s) between runs under one record interval (going back in time: runs that "
               f"overlapped, or a clock set back), replayed as {interval:g} s" if short_gaps else "")
        ),
    )


def _budgets(samples: list[Any]) -> str:
    """The budget(s) in force while recording: one figure, or the range and the changes."""
    changes = sum(1 for a, b in zip(samples, samples[1:]) if a.budget_w != b.budget_w)
    low, high = min(s.budget_w for s in samples), max(s.budget_w for s in samples)
    if not changes:
        return f"recorded at budget {low:g} W"
    return (f"recorded at budgets from {low:g} to {high:g} W ({changes} change(s); "
            f"{samples[-1].budget_w:g} W at the end)")


def _recorded_feed(runs: list[Any]) -> tuple[dict[str, float], str]:
    """The ``[feed]`` recorded in the newest header that has one, as a scenario's feed
    table (the host's draw counted as 0 W where it was not stated), and a note on it."""
    for run in reversed(runs):
        recorded = (run.header or {}).get("feed")
        if not isinstance(recorded, dict) or recorded.get("breaker_a") is None:
            continue
        feed = {k: float(v) for k, v in recorded.items() if k in FEED_KEYS and v is not None}
        note = "; feed as recorded in the log's header"
        if "host_w" not in feed:
            feed["host_w"] = 0.0
            note += " (host draw not stated: counted as 0 W)"
        feed_from_dict(feed)  # validate: ValueError becomes "not a usable power log"
        return feed, note
    return {}, ""


def _card_spec(uuid: str, header: dict, recorded: list, profile: ReplayProfile) -> CardSpec:
    """The card's constraints from the log's header, else from what was seen."""
    limits = [c.limit_w for c in recorded if c.limit_w is not None]
    draws = [c.avg_w for c in recorded if c.avg_w is not None]
    peaks = [c.peak_w for c in recorded if c.peak_w is not None]
    max_w = header.get("max_w") or max(limits + draws + peaks + [1.0])
    min_w = header.get("min_w") or min(limits + [max_w / 2])  # no header: the lowest cap seen
    idle_w = max(1.0, min(draws, default=0.0))
    return CardSpec(
        uuid=uuid,
        name=header.get("name") or f"recorded GPU {recorded[-1].index}",
        min_w=float(min_w),
        max_w=float(max_w),
        default_w=float(max_w),
        idle_w=min(idle_w, float(min_w)),
        profile=profile,
    )
