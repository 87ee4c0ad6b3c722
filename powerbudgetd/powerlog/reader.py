"""Reading the flight recorder's log back, torn lines and all.

A power cut can leave the last line of a file half written (or, on some filesystems,
padded with zero bytes); any line that is not one complete JSON record is skipped and
counted, never fatal. Records are grouped into *runs* (one daemon process each, named by
the header's ``run``); a run whose last record is not an ``end`` record stopped without
a clean exit: a power cut, a crash or ``kill -9``. The format is documented in
:mod:`powerbudgetd.powerlog.recorder`.

Reading is in two steps so that a report on the last minutes of a full log (up to
``max_total_bytes``) stays quick: :func:`scan_log` reads only each file's first line and
its tail (runs, their start and stop, torn tails); :func:`load_samples` parses the
records of the files a question needs.

A log is read as untrusted input, with bounds: a line longer than
:data:`MAX_LINE_BYTES` is skipped without being held in memory, JSON nested too deep or
with wrong types is a skipped line (never a traceback), a timestamp outside
[:data:`EARLIEST_UTC_S`, :data:`LATEST_UTC_S`] (2000 to 2200) is an impossible one and its
record skipped, and a window of more than ``max_bytes`` of parsed samples is a LogError.
Skipped lines are bounded too (:class:`Skipped`): the first :data:`MAX_SKIPPED_KEPT` are
described, the rest only counted, so a file of junk costs no more memory than one of samples.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from powerbudgetd.powerlog.recorder import SCHEMA_VERSION, log_files, utc_iso

EDGE_BYTES = 64 << 10  # read this much of a file's head and tail when scanning
MAX_LINE_BYTES = 1 << 20  # a record is ~150 B + ~140 B per card: 1 MiB is thousands of cards
# What one read may hold, in bytes of parsed samples (:func:`sample_cost_b`): the
# report's peak memory stays under the README's 450 MiB whatever the width of the
# records (measured: benchmarks/log_report_memory.py). A 4-card bank: ~3 days at one
# record a second; an 8-card one: ~2 days; a 1024-card one: ~30 minutes.
MAX_WINDOW_BYTES = 384 * 2**20
SAMPLE_COST_B = 700  # a parsed sample without its cards (its fields, the UPS block, the list slot, the report's share)
CARD_COST_B = 200  # one card in it (strings shared between records)
UPS_KEYS = ("state", "status", "load_pct", "realpower_w", "runtime_s", "charge_pct", "budget_w", "reason")
EARLIEST_UTC_S = 946_684_800.0  # 2000-01-01T00:00:00Z: no recorder wrote before
# A wall clock can be stepped years ahead (the timeline runs on the monotonic clock):
# only a date no clock of this era shows is impossible.
LATEST_UTC_S = 7_258_118_400.0  # 2200-01-01T00:00:00Z
_PARSE_ERRORS = (ValueError, KeyError, TypeError, OverflowError, RecursionError)
# Skipped lines described one by one (file, line, why); past this they are only counted.
# 3 M junk lines described took 1.41 GB (benchmarks/log_report_memory.py --junk).
MAX_SKIPPED_KEPT = 100
CLOCK_STEP_S = 2.0  # wall time and monotonic time between two records disagreeing by more: a step


class LogError(ValueError):
    """No log where one was expected; the message names the path."""


@dataclass(frozen=True, slots=True)
class CardSample:
    """One card in one record (W; None = unknown)."""

    index: int
    uuid: str
    avg_w: float | None
    peak_w: float | None
    limit_w: float | None
    role: str


@dataclass(frozen=True, slots=True)
class Sample:
    """One ``sample`` record. ``utc_s``: epoch seconds; watts; None = unknown."""

    utc_s: float
    mono_s: float
    mode: str
    budget_w: float
    dropped: int
    cards: tuple[CardSample, ...]
    bank_avg_w: float | None
    bank_peak_w: float | None
    bank_limit_w: float | None
    run: str | None = None  # the run (daemon process) that wrote it: one boot, one monotonic clock
    ups: dict[str, Any] | None = None  # the UPS as last polled (recorder's ``ups`` field)


@dataclass
class SkippedLine:
    path: Path
    line: int  # 1-based; 0: the whole file
    why: str
    torn: bool  # the file's last line, without its newline: cut mid-write


class Skipped(list[SkippedLine]):
    """The lines a read skipped: the first :data:`MAX_SKIPPED_KEPT` described (a torn
    last line always: one a file at most), every one counted in ``total``; ``last``:
    the one skipped last."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.last: SkippedLine | None = None

    def add(self, line: SkippedLine) -> None:
        self.total += 1
        self.last = line
        if len(self) < MAX_SKIPPED_KEPT or line.torn:
            self.append(line)


@dataclass
class LogFile:
    """What a scan learns of one file: its run and its last complete record."""

    path: Path
    header: dict[str, Any] | None
    last: dict[str, Any] | None  # the last complete record (header, sample or end)
    torn: SkippedLine | None = None

    @property
    def run_id(self) -> str | None:
        return None if self.header is None else self.header.get("run")


@dataclass
class Run:
    """One daemon process's files, in order. ``end`` is None when it was cut."""

    run_id: str | None
    header: dict[str, Any] | None
    files: list[LogFile] = field(default_factory=list)

    @property
    def last(self) -> dict[str, Any] | None:
        return next((f.last for f in reversed(self.files) if f.last is not None), None)

    @property
    def end(self) -> dict[str, Any] | None:
        last = self.last
        return last if last is not None and last.get("kind") == "end" else None

    @property
    def has_samples(self) -> bool:
        return any(f.last is not None and f.last.get("kind") != "header" for f in self.files)

    @property
    def start_s(self) -> float | None:
        return None if self.header is None else epoch(self.header["utc"])

    @property
    def stop_s(self) -> float | None:
        """Epoch s of the last complete record: the end record, else the last sample."""
        last = self.last
        return None if last is None else epoch(last["utc"])

    @property
    def interval_s(self) -> float:
        return float(self.header.get("interval_s", 1.0)) if self.header else 1.0

    @property
    def backend(self) -> str:
        """``nvml`` (real cards; also logs from before the field) or ``sim``."""
        return str((self.header or {}).get("backend", "nvml"))

    @property
    def simulated(self) -> bool:
        return self.backend == "sim"

    @property
    def stop_mono_s(self) -> float | None:
        """CLOCK_MONOTONIC s of the last complete record (the window is measured back from it)."""
        last = self.last
        return None if last is None or not isinstance(last.get("mono_s"), (int, float)) else float(last["mono_s"])

    def card_names(self) -> dict[str, dict[str, Any]]:
        return {c["uuid"]: c for c in (self.header or {}).get("cards", [])}


@dataclass
class LogIndex:
    """A scanned log: its files and runs, oldest first."""

    source: Path
    files: list[LogFile]
    runs: list[Run]

    @property
    def torn(self) -> list[SkippedLine]:
        return [f.torn for f in self.files if f.torn is not None]


def scan_log(path: str | Path) -> LogIndex:
    """Scan a recorder directory (every ``power-*.jsonl``) or one file.

    Raises LogError when the path does not exist or holds no recorder files.
    """
    path = Path(path)
    if path.is_dir():
        paths = log_files(path)
        if not paths:
            raise LogError(f"{path}: no recorder files (power-*.jsonl) here")
    elif path.is_file():
        paths = [path]
    else:
        raise LogError(f"{path}: no such file or directory")
    files = [_scan_file(p) for p in paths]
    runs: list[Run] = []
    for f in files:
        if f.header is not None and (not runs or runs[-1].run_id != f.run_id):
            runs.append(Run(f.run_id, f.header))
        elif not runs:  # the run's header is gone (torn at creation, or pruned)
            runs.append(Run(None, None))
        runs[-1].files.append(f)
    return LogIndex(path, files, runs)


def _scan_file(path: Path) -> LogFile:
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            head = fh.read(min(size, EDGE_BYTES))
            end, zeros = _content_end(fh, size)
            tail, start_at = _tail(fh, end)
    except OSError as exc:
        return LogFile(path, None, None, SkippedLine(path, 0, f"unreadable: {exc.strerror or exc}", False))
    first = _parse(head.split(b"\n", 1)[0]) if b"\n" in head or size <= EDGE_BYTES else None
    header = first if first is not None and first.get("kind") == "header" else None
    lines = tail.split(b"\n")
    torn = None
    if lines[-1]:  # no newline at the end: a torn last line, unless it parses whole
        if _parse(lines[-1]) is None:
            n = tail.count(b"\n") + 1 if start_at == 0 else 0
            torn = SkippedLine(path, n, _torn_why(zeros), True)
            lines.pop()
    if zeros and torn is None:
        n = tail.count(b"\n") + 1 if start_at == 0 else 0
        torn = SkippedLine(path, n, _zeros_why(zeros), True)
    last = None
    start = 0 if start_at == 0 else 1  # the tail's first piece may be a partial line
    for raw in reversed(lines[start:]):
        if raw and (last := _parse(raw)) is not None:
            break
    return LogFile(path, header, last, torn)


def _content_end(fh: BinaryIO, size: int) -> tuple[int, int]:
    """Where a file's content ends before a tail of NUL bytes (a power cut on a
    filesystem that had extended the file), however long that tail; and its length."""
    end = size
    while end > 0:
        n = min(EDGE_BYTES, end)
        fh.seek(end - n)
        chunk = fh.read(n).rstrip(b"\x00")
        if chunk:
            content_end = end - n + len(chunk)
            return content_end, size - content_end
        end -= n
    return 0, size


def _tail(fh: BinaryIO, end: int) -> tuple[bytes, int]:
    """The bytes before ``end`` holding at least one whole line (growing past a torn
    line of any length), and the offset they start at."""
    n = EDGE_BYTES
    while True:
        start = max(0, end - n)
        fh.seek(start)
        data = fh.read(end - start)
        if start == 0 or data.count(b"\n") >= 2 or n > 2 * MAX_LINE_BYTES:
            return data, start  # a last line longer than MAX_LINE_BYTES is not a record anyway
        n *= 4


def load_samples(
    files: list[LogFile], since_s: float = float("-inf"), *, since_mono_s: float | None = None,
    max_bytes: int = MAX_WINDOW_BYTES, max_line_bytes: int = MAX_LINE_BYTES,
) -> tuple[list[Sample], Skipped]:
    """Parse every sample record in ``files``, in order, and the lines that were skipped
    (torn, zero-filled, too long or not records). ``since_mono_s``: only records of one
    run at or after this CLOCK_MONOTONIC time (s), the way to window a run whatever its
    wall clock did; ``since_s``: only records at or after this wall time (epoch s).

    Files are streamed line by line (a line over ``max_line_bytes`` is skipped unread);
    raises LogError when the samples would take more than ``max_bytes`` of memory
    (:func:`sample_cost_b`).
    """
    samples: list[Sample] = []
    held_b = 0
    skipped = Skipped()
    # The recorder writes "utc" as fixed-width ISO text and "mono_s" early in the line:
    # lines before the window are passed over without parsing them.
    since_iso = utc_iso(since_s).encode() if since_s > 0 and since_mono_s is None else b""
    for f in files:
        try:
            fh = open(f.path, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            skipped.add(SkippedLine(f.path, 0, f"unreadable: {exc.strerror or exc}", False))
            continue
        with fh:
            try:
                size = fh.seek(0, 2)
                end, zeros = _content_end(fh, size)
                fh.seek(0)
                n = 0
                for n, raw in _lines(fh, end, max_line_bytes):
                    if raw is None:
                        skipped.add(SkippedLine(f.path, n, f"longer than {max_line_bytes} bytes", False))
                        continue
                    torn = not raw.endswith(b"\n")  # only the last line can lack its newline
                    if since_iso and (k := raw.find(b'"utc":"', 0, 120)) >= 0 and raw[k + 7 : k + 31] < since_iso:
                        continue
                    if since_mono_s is not None and (m := _mono_of(raw)) is not None and m < since_mono_s:
                        continue
                    try:
                        if not raw.strip(b"\x00\n"):
                            raise ValueError("zero-filled line")
                        rec = json.loads(raw)
                        _check(rec)
                        if rec["kind"] != "sample":
                            continue
                        sample = _sample(rec, f.run_id)
                    except _PARSE_ERRORS as exc:  # JSONDecodeError is a ValueError
                        why = _torn_why(zeros) if torn else f"not a record: {_why(exc)}"
                        skipped.add(SkippedLine(f.path, n, why, torn))
                        continue
                    if sample.mono_s >= since_mono_s if since_mono_s is not None else sample.utc_s >= since_s:
                        held_b += sample_cost_b(len(sample.cards))
                        if held_b > max_bytes:
                            raise LogError(
                                f"{f.path}: the window holds more than {max_bytes / 2**20:g} MiB of sample records "
                                f"({len(samples)} read, {len(sample.cards)} cards each); ask for a shorter window, "
                                "or give one file instead of the directory"
                            )
                        samples.append(sample)
                if zeros and (skipped.last is None or skipped.last.path != f.path or not skipped.last.torn):
                    skipped.add(SkippedLine(f.path, n + 1, _zeros_why(zeros), True))
            except OSError as exc:
                skipped.add(SkippedLine(f.path, 0, f"unreadable: {exc.strerror or exc}", False))
    return samples, skipped


def _lines(fh: BinaryIO, end: int, max_line_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(1-based number, line with its newline) for each line of ``fh`` before byte
    ``end``; None for a line longer than ``max_line_bytes``, read past in chunks."""
    n, pos = 0, 0
    while pos < end and (raw := fh.readline(min(max_line_bytes + 1, end - pos))):
        n += 1
        pos += len(raw)
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            while pos < end and (chunk := fh.readline(min(1 << 20, end - pos))):
                pos += len(chunk)
                if chunk.endswith(b"\n"):
                    break
            yield n, None
        else:
            yield n, raw


def _why(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "JSON nested too deep"
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."


def _torn_why(zeros: int) -> str:
    return "torn last line (cut mid-write)" + (f", then {zeros} zero bytes" if zeros else "")


def _zeros_why(zeros: int) -> str:
    return f"zero-filled tail of {zeros} bytes (the cut came before the data reached the disk)"


def _mono_of(raw: bytes) -> float | None:
    k = raw.find(b'"mono_s":', 0, 200)
    if k < 0:
        return None
    end = raw.find(b",", k + 9, k + 40)
    try:
        return float(raw[k + 9 : end])
    except ValueError:
        return None


@dataclass(frozen=True)
class ClockStep:
    """The wall clock stepped between two records of one run: by ``step_s`` (negative:
    backward), seen at the record with wall time ``at_utc_s`` (epoch s, as recorded)."""

    at_utc_s: float
    step_s: float


def clock_steps(samples: list[Sample], tolerance_s: float = CLOCK_STEP_S) -> list[ClockStep]:
    """Where consecutive records of one run disagree between wall and monotonic time."""
    steps = []
    for a, b in zip(samples, samples[1:]):
        if a.run != b.run:
            continue
        drift = (b.utc_s - a.utc_s) - (b.mono_s - a.mono_s)
        if abs(drift) > tolerance_s:
            steps.append(ClockStep(b.utc_s, drift))
    return steps


def timeline_s(samples: list[Sample], interval_s: float, max_gap_s: float) -> tuple[list[float], int, int]:
    """Seconds since the first record for each sample, trusting the wall clock only
    between runs: within one run the monotonic clock measures time; between runs the
    wall-clock gap is used when it is plausible (``interval_s`` to ``max_gap_s``); a longer
    one counts as ``max_gap_s``, a shorter one (going back: runs that overlapped, a clock
    set back) as ``interval_s``. Returns the times and how many gaps were shortened to
    ``max_gap_s`` and how many were stretched to ``interval_s``."""
    times: list[float] = []
    long_gaps = short_gaps = 0
    for i, s in enumerate(samples):
        if i == 0:
            times.append(0.0)
            continue
        p = samples[i - 1]
        if s.run == p.run and s.mono_s >= p.mono_s:
            dt = s.mono_s - p.mono_s
        else:
            dt = s.utc_s - p.utc_s
            if dt > max_gap_s:
                dt = max_gap_s
                long_gaps += 1
            elif dt < interval_s:
                dt = interval_s
                short_gaps += 1
        times.append(times[-1] + dt)
    return times, long_gaps, short_gaps


def _parse(raw: bytes) -> dict[str, Any] | None:
    if len(raw) > MAX_LINE_BYTES:
        return None
    try:
        rec = json.loads(raw)
        _check(rec)
        if rec["kind"] == "sample":
            _sample(rec)  # a record the reader would skip is not the last one either
    except _PARSE_ERRORS:
        return None
    return rec


def _check(rec: Any) -> None:
    if not isinstance(rec, dict):
        raise ValueError("not a JSON object")
    if rec.get("v") != SCHEMA_VERSION:
        raise ValueError(f"schema version {rec.get('v')!r}, this reader knows {SCHEMA_VERSION}")
    if rec.get("kind") not in ("header", "sample", "end") or not isinstance(rec.get("utc"), str):
        raise ValueError(f"unknown kind {str(rec.get('kind'))[:40]!r} or no utc")
    epoch(rec["utc"])  # an impossible timestamp makes the record unusable


def sample_cost_b(cards: int) -> int:
    """Bytes of memory one parsed sample of ``cards`` cards is counted at (an upper
    bound, measured: benchmarks/log_report_memory.py)."""
    return SAMPLE_COST_B + CARD_COST_B * cards


def _text(value: Any, limit: int) -> str:
    """A short string shared by every record that holds it (UUIDs, roles, modes repeat)."""
    return sys.intern(str(value)[:limit])


def _ups_block(value: Any) -> dict[str, Any] | None:
    """The recorder's UPS fields only, each a short string, a finite number or None:
    anything else in the block (a log from elsewhere, a padded one) is left out."""
    if not isinstance(value, dict):
        return None
    out: dict[str, Any] = {}
    for key in UPS_KEYS:
        v = value.get(key)
        if isinstance(v, str):
            out[key] = _text(v, 64)
        elif isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[key] = float(v)
        else:
            out[key] = None
    return out


def _sample(rec: dict[str, Any], run: str | None = None) -> Sample:
    bank = rec["bank"]
    cards = rec["cards"]
    if not isinstance(cards, list) or len(cards) > 1024:
        raise ValueError("cards is not a list of at most 1024 cards")
    return Sample(
        epoch(rec["utc"]), _number(rec["mono_s"]), _text(rec["mode"], 40), _number(rec["budget_w"]),
        int(_number(rec.get("dropped", 0))),
        tuple(
            CardSample(
                int(_number(c["index"])), _text(c["uuid"], 100), _watts(c["avg_w"]), _watts(c["peak_w"]),
                _watts(c["limit_w"]), _text(c["role"], 40),
            )
            for c in cards
        ),
        _watts(bank["avg_w"]), _watts(bank["peak_w"]), _watts(bank["limit_w"]), run,
        _ups_block(rec.get("ups")),
    )


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {str(value)[:40]!r}")
    return float(value)


def _watts(value: Any) -> float | None:
    return None if value is None else _number(value)


def epoch(iso: str) -> float:
    """``2025-06-01T14:00:00.000Z`` to epoch seconds.

    Raises ValueError for text that is not an ISO time, or an impossible one: before
    2000 or from 2200 on.
    """
    t = datetime.fromisoformat(iso).timestamp()
    if not EARLIEST_UTC_S <= t < LATEST_UTC_S:
        raise ValueError(f"impossible timestamp {iso[:40]!r} (before 2000 or from 2200 on)")
    return t
