"""Power log records written by hand, for the tests that read logs back (report, replay, hostile files)."""

from __future__ import annotations

import json
from pathlib import Path
from powerbudgetd.powerlog.recorder import utc_iso


T0 = 1_750_000_000.0


FEED = {"breaker_a": 15.0, "volts": 120.0, "derating": 0.8, "ups_w": 1200.0, "ups_margin": 0.2,
        "psu_efficiency": 0.9, "host_w": 250.0}


def header(run: str, t: float, feed: dict | None = FEED, **kw) -> dict:
    return {
        "v": 1, "kind": "header", "run": run, "utc": utc_iso(t), "mono_s": 5.0, "host": "gpu-box",
        "boot_id": "boot-1", "pid": 4242, "version": "0.1.0", "interval_s": 1.0, "budget_w": 1000.0,
        "feed": feed,
        "cards": [{"index": i, "uuid": f"GPU-{i}", "name": "Card", "min_w": 150.0, "max_w": 300.0} for i in range(2)],
        **kw,
    }


def sample(n: int, t: float, avg: tuple[float, float], peak: tuple[float, float], bank_peak: float,
           limit: tuple[float, float] = (250.0, 250.0), mode: str = "dynamic", dropped: int = 0) -> dict:
    return {
        "v": 1, "kind": "sample", "n": n, "utc": utc_iso(t), "mono_s": 5.0 + n, "mode": mode,
        "budget_w": 500.0, "dropped": dropped,
        "cards": [{"index": i, "uuid": f"GPU-{i}", "avg_w": avg[i], "peak_w": peak[i], "limit_w": limit[i],
                   "role": "fair_share"} for i in range(2)],
        "bank": {"avg_w": sum(avg), "peak_w": bank_peak, "limit_w": sum(limit), "wall_w": None, "wall_peak_w": None},
    }


def write_run(directory: Path, run: str, start: float, count: int, end: bool = False, seq: int = 1,
              feed: dict | None = FEED) -> list[dict]:
    """One run of the daemon, in one file: card 0 ramps, card 1 steady; one peak at n=count-5."""
    recs = [header(run, start, feed)]
    for n in range(1, count + 1):
        a0 = 100.0 + n / 10  # 100.1 .. 100 + count/10
        p0 = a0 + (150.0 if n == count - 5 else 10.0)
        recs.append(sample(n, start + n, (a0, 200.0), (p0, 210.0), bank_peak=p0 + 205.0))
    if end:
        recs.append({"v": 1, "kind": "end", "run": run, "utc": utc_iso(start + count + 0.5), "mono_s": 0.0,
                     "mode": "stopping"})
    path = directory / f"power-{seq:08d}-20250615T000000Z.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return recs
