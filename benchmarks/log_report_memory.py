"""Benchmark: the peak memory of ``powerbudgetd log report`` whatever the record width.

Writes one run of sample records (a crash: no end record) of each shape below into a
directory of its own, as large as the reader's byte cap lets one window be, then runs
``powerbudgetd log report --dir DIR --last 30d`` in a fresh interpreter and reads its
peak resident set (``ru_maxrss`` of the child). The README's figure must hold for
every shape: narrow records (4 cards), wide ones (64 and 1024 cards with long UUIDs),
and records with a UPS block padded with keys the recorder never writes.

``--junk N``: one run of 100 samples with N junk lines (not JSON, or records that are
not samples) amid them instead: what the skipped lines cost (bounded: only the first
few are held, the rest counted).

    python benchmarks/log_report_memory.py [--mib 300] [--keep DIR]
    python benchmarks/log_report_memory.py --junk 3000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from powerbudgetd.powerlog.recorder import utc_iso

T0 = 1_750_000_000.0
SHAPES = {  # name: (cards, uuid length, extra UPS keys)
    "4 cards": (4, 40, 0),
    "64 cards": (64, 40, 0),
    "1024 cards, long UUIDs": (1024, 100, 0),
    "4 cards, UPS padded": (4, 40, 2000),
}


def records(cards: int, uuid_len: int, ups_keys: int) -> tuple[bytes, bytes]:
    """The header line and one sample line's template (``{n}``, ``{utc}``, ``{mono}``)."""
    header = {"v": 1, "kind": "header", "run": "r1", "utc": utc_iso(T0), "mono_s": 5.0, "host": "box",
              "boot_id": "boot-1", "pid": 1, "version": "0.1.0", "interval_s": 1.0, "budget_w": 1000.0,
              "feed": None, "cards": []}
    ups = {"state": "ok", "status": "OL", "load_pct": 41.0, **{f"k{i}": i for i in range(ups_keys)}}
    card = lambda i: {"index": i, "uuid": f"GPU-{i}-".ljust(uuid_len, "x"), "avg_w": 245.1 + i,
                      "peak_w": 301.2, "limit_w": 250.0, "role": "fair_share"}
    sample = {"v": 1, "kind": "sample", "n": 0, "utc": "UTC", "mono_s": 0.0, "mode": "dynamic", "budget_w": 1000.0,
              "dropped": 0, "cards": [card(i) for i in range(cards)],
              "bank": {"avg_w": 812.3, "peak_w": 990.5, "limit_w": 1000.0, "wall_w": None, "wall_peak_w": None},
              "ups": ups}
    return (json.dumps(header) + "\n").encode(), (json.dumps(sample) + "\n").encode()


def write_log(directory: Path, shape: tuple[int, int, int], mib: float) -> int:
    """One file of about ``mib`` MiB of samples; the count written."""
    head, line = records(*shape)
    count = max(10, int(mib * 2**20 / len(line)))
    path = directory / "power-00000001-20250615T000000Z.jsonl"
    with path.open("wb") as fh:
        fh.write(head)
        for n in range(1, count + 1):
            t = T0 + n
            fh.write(line.replace(b'"n": 0', b'"n": %d' % n).replace(b'"UTC"', b'"%s"' % utc_iso(t).encode())
                     .replace(b'"mono_s": 0.0', b'"mono_s": %.1f' % (5.0 + n)))
    return count


def write_junk(directory: Path, junk: int) -> int:
    """100 samples with ``junk`` junk lines after the 50th; the lines written."""
    head, line = records(4, 40, 0)
    path = directory / "power-00000001-20250615T000000Z.jsonl"
    with path.open("wb") as fh:
        fh.write(head)
        for n in range(1, 101):
            if n == 51:
                for k in range(junk):
                    fh.write(b"not a record %d\n" % k if k % 2 else b'{"v": 1, "kind": "sample", "n": %d}\n' % k)
            t = T0 + n
            fh.write(line.replace(b'"n": 0', b'"n": %d' % n).replace(b'"UTC"', b'"%s"' % utc_iso(t).encode())
                     .replace(b'"mono_s": 0.0', b'"mono_s": %.1f' % (5.0 + n)))
    return 101 + junk


def peak_rss_mib(directory: Path) -> tuple[float, int, float, str]:
    """(peak RSS of the report in MiB, its exit status, seconds, its last line)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "powerbudgetd", "log", "report", "--dir", str(directory),
                        "--last", "30d", "--json"], capture_output=True, text=True)
    elapsed = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if after <= before:
        raise SystemExit("cannot tell this child's peak from an earlier one: run each shape in a fresh process")
    last = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or [""])[-1][:100]
    return after / 1024, p.returncode, elapsed, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=float, default=300.0, help="MiB of samples written per shape")
    ap.add_argument("--shape", choices=list(SHAPES), help="one shape (the child's peak is per process)")
    ap.add_argument("--junk", type=int, help="junk lines amid 100 samples, instead of the shapes")
    args = ap.parse_args()
    if args.junk is not None:
        with tempfile.TemporaryDirectory(prefix="pbd-bench-") as tmp:
            count = write_junk(Path(tmp), args.junk)
            size = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 2**20
            rss, rc, secs, last = peak_rss_mib(Path(tmp))
        print(f"{args.junk} junk lines, {count:>9d} lines {size:7.1f} MiB: peak RSS {rss:7.1f} MiB, exit {rc}, "
              f"{secs:5.1f} s" + (f"  ({last})" if rc else ""), flush=True)
        return
    shapes = [args.shape] if args.shape else list(SHAPES)
    if len(shapes) > 1:  # ru_maxrss of children is the largest so far: one shape per process
        for name in shapes:
            subprocess.run([sys.executable, __file__, "--mib", str(args.mib), "--shape", name], check=True)
        return
    name = shapes[0]
    with tempfile.TemporaryDirectory(prefix="pbd-bench-") as tmp:
        count = write_log(Path(tmp), SHAPES[name], args.mib)
        size = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 2**20
        rss, rc, secs, last = peak_rss_mib(Path(tmp))
    print(f"{name:26s} {count:>9d} records {size:7.1f} MiB: peak RSS {rss:7.1f} MiB, exit {rc}, {secs:5.1f} s"
          + (f"  ({last})" if rc else ""), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
