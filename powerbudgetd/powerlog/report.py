"""After a power event: where the log stops, what was drawn before it, what the feed needs.

``powerbudgetd log report`` picks the *event*: the most recent run that stopped without
a clean exit (its last record is when the power went, or the daemon crashed or was
killed). With none, the newest run. For the window before its stop it gives, per card
and for the bank, the mean and peak draw and the limits in force, the estimated wall
power, and a sizing line.

Sizing (figures from the brief, "Protective devices"):

- UPS: on the **peak** wall power, since a UPS trips on overload within seconds (under
  0.5 s above 150 %): ``peak wall W / (1 - ups_margin)``, in real watts (not VA).
- Circuit: on the highest **1 s average** wall power, since a breaker forgives
  sub-second spikes, not minutes over: ``W / (volts x derating)`` amperes (NEC: a
  continuous load at 80 % of the breaker). A 1 s average is above any longer average,
  so this errs on the safe side.
- Wall power = (board power + host_w) / psu_efficiency. The feed figures come from
  ``--config``'s ``[feed]``, else the one recorded in the log's header, else the
  defaults of :class:`~powerbudgetd.core.feed.Feed` (120 V, the host draw unknown:
  counted as 0 W, and said so). The arithmetic is that model's.

Peaks are the highest sums of instant readings the daemon saw, one per tick (100 ms):
shorter spikes can be higher still.
"""

from __future__ import annotations

import math

import os
import re
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from powerbudgetd.core.feed import Feed
from powerbudgetd.config import FeedConfig
from powerbudgetd.powerlog.recorder import boot_id, utc_iso
from powerbudgetd.powerlog.reader import (
    CLOCK_STEP_S,
    ClockStep,
    LogIndex,
    Run,
    Sample,
    clock_steps,
    epoch,
    load_samples,
)

_FEED_FIELDS = ("breaker_a", "volts", "derating", "ups_w", "ups_margin", "psu_efficiency", "host_w")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h``, ``1d`` to seconds. Raises ValueError."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (like 90s, 10m, 2h, 1d)")
    if float(m.group(1)) <= 0:
        raise ValueError(f"must be a positive duration, got {text!r} (like 90s, 10m, 2h, 1d)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


@dataclass(frozen=True)
class FeedChoice:
    """The feed a report sizes with (``core.feed``), and where it came from."""

    feed: Feed
    source: str

    @classmethod
    def choose(
        cls, configured: FeedConfig | None, recorded: dict[str, Any] | None, config_name: str | None
    ) -> FeedChoice:
        """``--config``'s ``[feed]``, else the one recorded in the log, else the defaults
        (120 V, host draw unknown). Raises ValueError for a recorded feed out of range."""
        if configured is not None:
            return cls(configured.feed(), f"[feed] of {config_name}")
        if recorded:
            fields = {k: float(recorded[k]) for k in _FEED_FIELDS if recorded.get(k) is not None}
            return cls(Feed(**fields), "[feed] recorded in the log")
        return cls(Feed(), "defaults (no [feed] configured or recorded)")


@dataclass(frozen=True)
class Host:
    """The machine reading the log: to tell a run still being written from a dead one."""

    hostname: str
    boot_id: str | None
    pid_alive: Callable[[int], bool]

    @classmethod
    def current(cls) -> Host:
        return cls(socket.gethostname(), boot_id(), _pid_alive)


# How a run ended, and what that says (the report's words).
ENDINGS = {
    "clean": "the daemon exited cleanly (not a power cut)",
    "host_down": "the host went down under it (power cut or reboot): this is when the power went",
    "killed": "the daemon died without a clean exit (crash or kill -9) while the host stayed up",
    "abrupt": "the daemon did not exit cleanly: power cut, crash or kill",
    "recording": "the daemon is still recording: no power event in this log",
}


def ended(run: Run, newest: bool, now_s: float, host: Host) -> str:
    """One of ENDINGS' keys. Without an ``end`` record: the header's boot id and pid say
    whether the host rebooted or the process died; else a recent last record on the
    newest run counts as still recording."""
    if run.end is not None:
        return "clean"
    h = run.header or {}
    if h.get("host") == host.hostname and h.get("boot_id") and host.boot_id:
        if h["boot_id"] != host.boot_id:
            return "host_down"
        return "recording" if newest and host.pid_alive(int(h.get("pid", 0))) else "killed"
    if newest and now_s - (run.stop_s or 0.0) <= max(10.0, 5 * run.interval_s):
        return "recording"
    return "abrupt"


def event_run(log: LogIndex, now_s: float, host: Host) -> tuple[Run, str]:
    """The run to report on, and how it ended: the most recent run on real cards that
    did not end cleanly and is not still recording; else the newest real run. Simulated
    runs (``run --backend sim``) are reported on only when the log holds nothing else."""
    runs = [r for r in log.runs if r.has_samples]
    if not runs:
        raise ValueError(f"{log.source}: no sample records in the log")
    real = [r for r in runs if not r.simulated]
    runs = real or runs
    states = [ended(r, r is runs[-1], now_s, host) for r in runs]
    for run, state in zip(reversed(runs), reversed(states)):
        if state not in ("clean", "recording"):
            return run, state
    return runs[-1], states[-1]


def summarize(log: LogIndex, last_s: float, configured: FeedConfig | None = None, config_name: str | None = None,
              now_s: float | None = None, host: Host | None = None) -> dict[str, Any]:
    """The report as one JSON-able dict (W, s, UTC ISO times). ``configured``: the
    ``[feed]`` of ``--config`` (else the recorded one, else defaults). Raises ValueError
    when the log holds no samples."""
    now_s = time.time() if now_s is None else now_s
    host = host or Host.current()
    run, state = event_run(log, now_s, host)
    stop = run.stop_s
    stop_mono = run.stop_mono_s
    assert stop is not None
    # The window is measured on the run's monotonic clock: the wall clock may have
    # stepped (an RTC in local time, a late NTP sync) and would stretch or shrink it.
    if stop_mono is not None:
        since_mono = stop_mono - last_s
        files = [f for f in run.files if f.last is None or float(f.last.get("mono_s", stop_mono)) >= since_mono]
        window, skipped = load_samples(files, since_mono_s=since_mono)
        window = [w for w in window if w.run == run.run_id or run.run_id is None]
    else:
        files = list(run.files)
        window, skipped = load_samples(files, stop - last_s)
    if not window:
        raise ValueError(f"{log.source}: no sample records in the {last_s:g} s before {utc_iso(stop)}")
    steps = clock_steps(window)
    all_steps = _steps_before(run, window) + steps
    feed = FeedChoice.choose(configured, (run.header or {}).get("feed"), config_name)
    runs = [r for r in log.runs if r.has_samples]
    # Times of the window as the monotonic clock places them before the stop.
    w_from, w_to = (stop - (stop_mono - window[0].mono_s), stop - (stop_mono - window[-1].mono_s)) \
        if stop_mono is not None else (window[0].utc_s, window[-1].utc_s)
    seen = {s.path for s in skipped if s.torn}
    for t in log.torn:
        if t.path not in seen:
            skipped.add(t)
    return {
        "source": str(log.source),
        "files": len(log.files),
        "skipped_lines": [  # the first MAX_SKIPPED_KEPT (and every torn one); skipped_total counts them all
            {"file": s.path.name, "line": s.line, "why": s.why, "torn": s.torn} for s in skipped
        ],
        "skipped_total": skipped.total,
        "runs": [
            {"run": r.run_id, "start": _iso(r.start_s), "stop": _iso(r.stop_s), "files": len(r.files),
             "ended": ended(r, r is runs[-1], now_s, host), "backend": r.backend}
            for r in runs
        ],
        "stop": {
            "utc": _iso(stop), "run": run.run_id, "ended": state, "last_mode": window[-1].mode,
            "host": (run.header or {}).get("host"), "backend": run.backend,
        },
        "window": {
            "last_s": last_s, "from": _iso(w_from), "to": _iso(w_to),
            "samples": len(window), "expected": int(round((window[-1].mono_s - window[0].mono_s) / run.interval_s)) + 1,
            "dropped": window[-1].dropped - window[0].dropped,
            "run_began_inside": _began_inside(run, stop_mono, last_s, stop),
        },
        "clock_steps": [{"at": _iso(c.at_utc_s), "step_s": round(c.step_s, 1), "in_window": c in steps}
                        for c in all_steps],  # not in the window: somewhere between the run's start and it
        "cards": _cards(window, run.card_names()),
        "bank": _bank(window),
        **_wall_and_sizing(window, feed),
        "ups": _ups(window),
    }


def _steps_before(run: Run, window: list[Sample]) -> list[ClockStep]:
    """A step between the run's start and the window, from the header's wall and
    monotonic times against the window's first record (without reading what lies between)."""
    h = run.header or {}
    if not isinstance(h.get("mono_s"), (int, float)) or not isinstance(h.get("utc"), str):
        return []
    first = window[0]
    drift = (first.utc_s - epoch(h["utc"])) - (first.mono_s - float(h["mono_s"]))
    return [ClockStep(first.utc_s, drift)] if abs(drift) > CLOCK_STEP_S else []


def _began_inside(run: Run, stop_mono: float | None, last_s: float, stop: float) -> bool:
    h = run.header or {}
    if stop_mono is not None and isinstance(h.get("mono_s"), (int, float)):
        return float(h["mono_s"]) > stop_mono - last_s
    return run.start_s is not None and run.start_s > stop - last_s


def _ups(window: list[Sample]) -> dict[str, Any] | None:
    """The UPS when the log stops (with ``[ups]`` recorded): on battery or not, since
    when, and its load, real power, runtime and charge at the last record; the status
    transitions inside the window. None when no record carries the UPS."""
    seen = [s for s in window if s.ups is not None]
    if not seen:
        return None
    last = seen[-1].ups or {}

    def words(u: dict[str, Any] | None) -> list[str]:
        status = (u or {}).get("status")
        return status.split() if isinstance(status, str) else []

    on_battery = "OB" in words(last)
    since: Sample | None = None
    if on_battery:
        since = seen[-1]
        for smp in reversed(seen):
            if "OB" not in words(smp.ups):
                break
            since = smp
    transitions = []
    prev: str | None = None
    for smp in seen:
        status = (smp.ups or {}).get("status")
        if status != prev and prev is not None:
            transitions.append({"utc": _iso(smp.utc_s), "from": prev, "to": status})
        prev = status
    return {
        "state": last.get("state"), "status": last.get("status"), "on_battery": on_battery,
        # how long: on the monotonic clock, which a wall-clock step does not move
        "on_battery_since": None if since is None else _iso(since.utc_s),
        "on_battery_s": None if since is None else round(seen[-1].mono_s - since.mono_s, 1),
        "low_battery": bool({"LB", "FSD"} & set(words(last))),
        "load_pct": _num(last.get("load_pct")), "realpower_w": _num(last.get("realpower_w")),
        "runtime_s": _num(last.get("runtime_s")), "charge_pct": _num(last.get("charge_pct")),
        "budget_w": _num(last.get("budget_w")), "reason": last.get("reason"),
        "transitions": transitions[-10:],
    }


def _num(v: Any) -> float | None:
    """A recorded number, or None for anything else (a hand-edited or foreign log)."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _ups_lines(u: dict[str, Any] | None) -> list[str]:
    if u is None:
        return []
    figures = ", ".join(part for part in (
        None if u["load_pct"] is None else f"load {u['load_pct']:g} %",
        None if u["realpower_w"] is None else f"{u['realpower_w']:g} W",
        None if u["runtime_s"] is None else f"runtime left {_dur(u['runtime_s'])}",
        None if u["charge_pct"] is None else f"charge {u['charge_pct']:g} %",
    ) if part) or "no load or runtime reported"
    if u["on_battery"]:
        head = (f"the UPS was ON BATTERY at the stop, since {_human(u['on_battery_since'])} "
                f"({_dur(u['on_battery_s'] or 0.0)})" + (", LOW BATTERY" if u["low_battery"] else ""))
    elif u["status"]:
        head = f"the UPS was on line at the stop ({u['status']})"
    else:
        head = "the UPS's status was unknown at the stop"
    lines = ["", f"{head}: {figures}"]
    if u["state"] not in (None, "ok"):
        lines.append(f"  its data was silent at the stop ({u['state']}): the figures are the last ones received")
    if u["budget_w"] is not None:
        lines.append(f"  the UPS held the budget at {_w(u['budget_w'])} W ({u['reason']})")
    for t in u["transitions"]:
        lines.append(f"  {_human(t['utc'])}: {t['from']} -> {t['to']}")
    return lines


def _cards(window: list[Sample], names: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    by_uuid: dict[str, list] = {}
    for s in window:
        for c in s.cards:
            by_uuid.setdefault(c.uuid, []).append(c)
    out = []
    for uuid, cs in sorted(by_uuid.items(), key=lambda kv: kv[1][-1].index):
        avgs = [c.avg_w for c in cs if c.avg_w is not None]
        peaks = [c.peak_w for c in cs if c.peak_w is not None]
        limits = [c.limit_w for c in cs if c.limit_w is not None]
        out.append({
            "index": cs[-1].index, "uuid": uuid, "name": names.get(uuid, {}).get("name"),
            "mean_w": _r(fmean(avgs) if avgs else None), "max_avg_w": _r(max(avgs, default=None)),
            "peak_w": _r(max(peaks, default=None)),
            "limit_w": _r(cs[-1].limit_w), "limit_min_w": _r(min(limits, default=None)),
            "limit_max_w": _r(max(limits, default=None)),
            "roles": dict(Counter(c.role for c in cs).most_common()),
            "unreadable": sum(1 for c in cs if c.avg_w is None),
        })
    return out


def _bank(window: list[Sample]) -> dict[str, Any]:
    avgs = [s.bank_avg_w for s in window if s.bank_avg_w is not None]
    peaks = [s.bank_peak_w for s in window if s.bank_peak_w is not None]
    limits = [s.bank_limit_w for s in window if s.bank_limit_w is not None]
    return {
        "mean_w": _r(fmean(avgs) if avgs else None), "max_avg_w": _r(max(avgs, default=None)),
        "peak_w": _r(max(peaks, default=None)),
        "limit_w": _r(window[-1].bank_limit_w), "limit_max_w": _r(max(limits, default=None)),
        "budget_w": window[-1].budget_w, "budget_max_w": max(s.budget_w for s in window),
        "modes": dict(Counter(s.mode for s in window).most_common()), "last_mode": window[-1].mode,
    }


def _wall_and_sizing(window: list[Sample], choice: FeedChoice) -> dict[str, Any]:
    bank = _bank(window)
    if bank["max_avg_w"] is None:
        return {"wall": None, "sizing": None, "feed": None}
    mean_w, max_avg_w = bank["mean_w"], bank["max_avg_w"]
    peak_w = bank["peak_w"] if bank["peak_w"] is not None else max_avg_w
    feed = choice.feed
    wall: dict[str, Any] = {
        "host_w": feed.host_w, "psu_efficiency": feed.psu_efficiency, "host_known": feed.host_w is not None,
        "mean_w": _r(feed.wall_w(mean_w)), "max_avg_w": _r(feed.wall_w(max_avg_w)), "peak_w": _r(feed.wall_w(peak_w)),
    }
    ups_needed = wall["peak_w"] / (1 - feed.ups_margin)
    amps_needed = wall["max_avg_w"] / (feed.volts * feed.derating)
    sizing = {
        "ups_w": _r(ups_needed), "ups_margin": feed.ups_margin,
        "circuit_a": round(amps_needed, 2), "volts": feed.volts, "derating": feed.derating,
    }
    check: dict[str, Any] = {"source": choice.source, "ups": None, "circuit": None}
    if feed.ups_w is not None:
        p = wall["peak_w"]
        verdict = ("held" if p <= feed.ups_limit_w()
                   else "held, inside the margin" if p <= feed.ups_w else "over its rating: trips")
        check["ups"] = {"ups_w": feed.ups_w, "peak_wall_w": p, "load": round(p / feed.ups_w, 3), "verdict": verdict}
    if feed.breaker_a is not None:
        a = wall["max_avg_w"]
        cont = feed.circuit_w()
        verdict = ("held" if a <= cont
                   else "over the continuous rating: trips if sustained" if a <= feed.breaker_w
                   else "over the breaker's rating: trips")
        check["circuit"] = {"breaker_a": feed.breaker_a, "continuous_w": _r(cont), "max_avg_wall_w": a,
                            "verdict": verdict}
    return {"wall": wall, "sizing": sizing, "feed": check}


def format_summary(d: dict[str, Any]) -> str:
    """The report for people: a few lines, the stop first."""
    st, win, bank, wall = d["stop"], d["window"], d["bank"], d["wall"]
    how = ENDINGS[st["ended"]]
    sims = sum(1 for r in d["runs"] if r.get("backend") == "sim")
    real = len(d["runs"]) - sims
    runs = f"{real} run(s) of the daemon on real cards" + (f", {sims} simulated (--backend sim, left out)" if sims else "")
    if sims and st.get("backend") == "sim":
        runs = f"{sims} simulated run(s) (--backend sim) and no run on real cards"
    lines = [
        f"log {d['source']}: {runs}, {d['files']} file(s)",
        f"the log stops at {_human(st['utc'])}: {how}",
    ]
    if st.get("backend") == "sim":
        lines.append("  SIMULATED: this run drove a simulated bank, not real cards; its draw is not real history")
    for c in d.get("clock_steps", []):
        direction = "backward" if c["step_s"] < 0 else "forward"
        when = f"at {_human(c['at'])} (as recorded)" if c["in_window"] else f"before {_human(c['at'])} (as recorded)"
        lines.append(
            f"  the wall clock stepped {direction} by {_dur_any(abs(c['step_s']))} {when}"
            "; times and the window here follow the monotonic clock, counted back from the stop"
        )
    later = [r for r in d["runs"] if r["start"] and r["start"] > st["utc"]]
    if later:
        lines.append(f"  (the daemon started again at {_human(later[0]['start'])})")
    torn = [s for s in d["skipped_lines"] if s["torn"]]
    if torn:
        lines.append(f"  {len(torn)} torn last line(s) skipped (cut mid-write): " + ", ".join(s["file"] for s in torn))
    other = d["skipped_total"] - len(torn)
    if other:
        lines.append(f"  {other} other unreadable line(s) skipped")
    gap = win["expected"] - win["samples"]
    lines += [
        "",
        f"the {_dur(win['last_s'])} before it: {_human(win['from'])} to {_human(win['to'])}, {win['samples']} records"
        + (f" ({gap} missing, {win['dropped']} dropped by a slow disk)" if gap > 0 or win["dropped"] else "")
        + (" (the run began inside the window)" if win["run_began_inside"] else ""),
        "  card  mean W   peak W   limit W (range)    roles",
    ]
    for c in d["cards"]:
        rng = f"{_w(c['limit_min_w'])}-{_w(c['limit_max_w'])}" if c["limit_min_w"] != c["limit_max_w"] else ""
        roles = ", ".join(f"{k} {v}" for k, v in c["roles"].items())
        lines.append(
            f"  {c['index']:>4}  {_w(c['mean_w']):>6}   {_w(c['peak_w']):>6}   {_w(c['limit_w']):>7} {rng:<10} {roles}"
        )
    lines.append(
        f"  bank  {_w(bank['mean_w']):>6}   {_w(bank['peak_w']):>6}   {_w(bank['limit_w']):>7}"
        f"            budget {_w(bank['budget_w'])} W, highest 1 s average {_w(bank['max_avg_w'])} W, "
        f"mode {bank['last_mode']}"
    )
    lines += _ups_lines(d.get("ups"))
    if wall is None:
        return "\n".join(lines)
    sz, fd = d["sizing"], d["feed"]
    host = f"host {wall['host_w']:g} W" if wall["host_known"] else "host draw UNKNOWN, counted as 0 W: set [feed] host_w"
    at_least = "at least" if wall["host_known"] else "more than (GPUs only: host draw unknown, add it)"
    lines += [
        "",
        f"wall power (estimated: {host}, PSU {wall['psu_efficiency']:.0%}; {fd['source']}): "
        f"mean {_w(wall['mean_w'])} W, highest 1 s average {_w(wall['max_avg_w'])} W, peak {_w(wall['peak_w'])} W",
        f"sizing: a UPS of {at_least} {_w(sz['ups_w'])} W real power (peak {_w(wall['peak_w'])} W with "
        f"{sz['ups_margin']:.0%} margin) and a circuit of {'at least' if wall['host_known'] else 'more than'} "
        f"{sz['circuit_a']:.1f} A at {sz['volts']:g} V ({sz['derating']:.0%} continuous)",
    ]
    if fd["ups"]:
        u = fd["ups"]
        lines.append(f"  configured UPS {u['ups_w']:g} W: {u['verdict']} (peak at {u['load']:.0%} of its rating)")
    if fd["circuit"]:
        c = fd["circuit"]
        lines.append(
            f"  configured circuit {c['breaker_a']:g} A: {c['verdict']} "
            f"({_w(c['max_avg_wall_w'])} W of {_w(c['continuous_w'])} W continuous)"
        )
    if not fd["ups"] and not fd["circuit"]:
        lines.append("  no breaker or UPS configured to check against: give --config with a [feed] section")
    return "\n".join(lines)


def _iso(t: float | None) -> str | None:
    return None if t is None else utc_iso(t)


def _human(iso: str | None) -> str:
    return "?" if iso is None else iso.replace("T", " ").replace("Z", " UTC")


def _dur(s: float) -> str:
    for unit, n in (("h", 3600), ("min", 60)):
        if s >= n and s % n == 0:
            return f"{s / n:g} {unit}"
    return f"{s:g} s"


def _dur_any(s: float) -> str:
    if s >= 86400:
        return f"{s / 86400:.1f} days"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def _w(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:  # a reused pid is not our daemon
        return b"powerbudgetd" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
