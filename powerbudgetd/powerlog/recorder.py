"""The flight recorder: a durable power log, written beside the control loop.

A side channel (:class:`Recorder`) keeps, from each tick's bank snapshot and between records, each card's highest instant
draw and the highest summed instant draw of the bank, and every ``interval_s`` hands one
record to a writer thread (:class:`LogWriter`) through a bounded queue. The listener
never blocks: when the queue is full the record is dropped and counted, so a slow or
full disk costs records, never ticks.

Files: ``power-<seq>-<UTC start>.jsonl`` in the recorder's directory, append-only, one
JSON object per line (``jq``, ``pandas.read_json(lines=True)``). Each file starts with a
header; a new file is started when the current one would exceed ``max_file_bytes``, after
a write error and at every daemon start; the oldest files are deleted so the total stays
under ``max_total_bytes``. Writes are fsynced every ``fsync_interval_s``: a power cut
loses at most that much, plus a torn last line that readers skip.

Record kinds (schema version ``v`` = 1; watts rounded to 0.1 W; ``null`` = unknown):

``header`` (first line of every file)::

    {"v": 1, "kind": "header", "run": "3f2a9c1b7e40", "utc": "2025-06-01T14:00:00.000Z",
     "mono_s": 812.25, "host": "gpu-box", "boot_id": "...", "pid": 4242, "version": "0.1.0",
     "backend": "nvml",
     "interval_s": 1.0, "budget_w": 1000.0,
     "feed": {"breaker_a": 15, "volts": 120, "derating": 0.8, "ups_w": 1200,
              "ups_margin": 0.1, "psu_efficiency": 0.9, "host_w": 250,
              "psu_w": null, "transient_factor": 1.35} | null,
     "cards": [{"index": 0, "uuid": "GPU-...", "name": "...", "min_w": 150.0, "max_w": 300.0}]}

``sample`` (one per interval)::

    {"v": 1, "kind": "sample", "n": 17, "utc": "...", "mono_s": 829.25, "mode": "dynamic",
     "budget_w": 1000.0, "dropped": 0,
     "cards": [{"index": 0, "uuid": "GPU-...", "avg_w": 245.1, "peak_w": 301.2,
                "limit_w": 250.0, "role": "fair_share"}],
     "bank": {"avg_w": 812.3, "peak_w": 990.5, "limit_w": 1000.0, "wall_w": 1180.3,
              "wall_peak_w": 1378.3},
     "ups": {"state": "ok", "status": "DISCHRG OB", "load_pct": 41.0, "realpower_w": 369.0,
             "runtime_s": 540.0, "charge_pct": 88.0, "budget_w": 500.0, "reason": "ups_on_battery"}}

- ``avg_w``: NVML's trailing 1 s mean at the record; ``peak_w``: the highest instant
  reading (field 186) since the previous record, read on every tick and, with ticks
  slower than NVML's 100 ms refresh, sampled at the refresh between them
  (:class:`~powerbudgetd.powerlog.peaks.PeakSampler`); ``null`` for a card without the instant field (its peak is unknown: the
  1 s mean is not a peak);
  ``limit_w``: the enforced power limit; ``role``: fair_share, donor, recipient, fixed,
  lost.
- ``bank.avg_w``: sum of the cards' ``avg_w``; ``bank.peak_w``: the highest sum of
  instant draws read together (one sampler pass or one tick) since the previous record
  (not the sum of the card peaks); ``null`` when a card's instant is unknown;
  ``bank.limit_w``: sum of enforced limits; ``wall_w`` / ``wall_peak_w``: (board + the
  feed's ``host_w``) / ``psu_efficiency``, ``null`` without a ``[feed]``.
- ``circuit`` (only with a ``[circuit]``): ``circuit`` (its name), ``circuit_budget_w``,
  ``circuit_reserve_w``, ``circuit_grant_w`` (in use), ``circuit_grant_held_w`` (in
  etcd), ``circuit_lease_left_s`` (validity left without a renewal),
  ``circuit_etcd_reachable``, ``circuit_seat_fits``, ``circuit_grants_allowed``.
- ``dropped``: records lost so far in this run (queue full); ``n`` counts the run's
  samples, dropped ones included, so a gap shows.
- ``mono_s``: CLOCK_MONOTONIC (s since boot, as in the journal); ``utc``: wall clock.
  Readers order and window a run's records by ``mono_s`` (one boot, one clock that
  never steps); ``utc`` may step (an RTC in local time, a late NTP sync).
- ``backend`` (header): ``nvml`` for real cards, ``sim`` for ``run --backend sim``;
  absent in logs written before it existed (real). Reports keep the two apart.
- ``ups`` (only with ``[ups]``): the UPS as last polled: ``state`` (``ok``, or why its
  data is silent), ``status`` (its flags, sorted; a change between two records is a
  status transition), load (%), real power (W), runtime left (s), charge (%), and the
  budget it offers (W, ``null``: none) with its reason.

``end`` (the daemon exited; its absence means power cut, crash or ``kill -9``)::

    {"v": 1, "kind": "end", "run": "3f2a9c1b7e40", "utc": "...", "mono_s": 901.5, "mode": "stopping"}
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import queue
import re
import socket
import stat
import threading
import time
import uuid as uuid_mod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import structlog

from powerbudgetd.core.backoff import Backoff
from powerbudgetd import __version__

if TYPE_CHECKING:
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.core.feed import Feed
    from powerbudgetd.core.snapshot import BankSnapshot
    from powerbudgetd.config import RecorderConfig, Settings

from powerbudgetd.powerlog.peaks import REFRESH_S, InstantReader, PeakSampler

log = structlog.get_logger("powerbudgetd")

SCHEMA_VERSION = 1
FILE_RE = re.compile(r"^power-(\d{8})(?:-[0-9TZ]+)?\.jsonl$")
QUEUE_RECORDS = 256  # at one record a second: minutes of a stalled disk before drops
WARN_EVERY_S = 60.0  # repeat a drop or write-error warning at most this often
RETRY_MAX_S = 30.0  # after a write error, wait up to this before opening a new file

Opener = Callable[[Path], BinaryIO]


def utc_iso(t: float) -> str:
    """Epoch seconds as ``2025-06-01T14:00:00.000Z``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def log_files(directory: Path) -> list[Path]:
    """The recorder's files in ``directory``, oldest first (by sequence number)."""
    try:
        names = [(int(m.group(1)), p) for p in directory.iterdir() if (m := FILE_RE.match(p.name))]
    except FileNotFoundError:
        return []
    return [p for _, p in sorted(names)]


def _open_append(path: Path) -> BinaryIO:
    # Unbuffered: each record is one write(2) into the page cache, so a crash of this
    # process loses nothing written; fsync covers the power cut. Always a new file
    # (O_EXCL), never through a symlink (O_NOFOLLOW): the daemon runs as root, and a
    # link planted under the next file's name must not make it append to /etc/shadow.
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o640), "ab", buffering=0)


def check_directory(directory: Path, euid: int | None = None) -> None:
    """Refuse a log directory another user could write into (plant links, swap files).

    It must be a directory owned by this process's user (or root) and writable by no
    group or others. Raises OSError (EPERM) saying what is wrong and how to fix it.
    """
    st = os.stat(directory)
    me = os.geteuid() if euid is None else euid
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, f"{directory} is not a directory")
    if st.st_uid not in (me, 0):
        raise OSError(errno.EPERM, f"{directory} is owned by uid {st.st_uid}, not by this user (uid {me}) or root")
    if st.st_mode & 0o022:
        raise OSError(
            errno.EPERM,
            f"{directory} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); fix: chmod 750 {directory}",
        )


def _fsync_dir(directory: Path) -> None:
    # A new or deleted file's directory entry survives a power cut only once the
    # directory itself is synced.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class RecorderStats:
    """Counters for metrics and logs: records, bytes, drops, write errors."""

    records_submitted: int = 0
    records_dropped: int = 0  # queue full: the writer fell behind
    records_written: int = 0
    records_lost: int = 0  # failed to write (disk full, I/O error)
    write_errors: int = 0
    bytes_written: int = 0
    files_deleted: int = 0
    fsyncs: int = 0
    last_error: str | None = None


class LogWriter:
    """Appends records to size-rotated files in ``directory`` on its own thread.

    :meth:`submit` never blocks (False and counted when the queue is full); :meth:`close`
    drains the queue, fsyncs and joins. ``opener`` (default: unbuffered append) lets
    tests put a slow or failing file under the writer; it must return an object with
    ``write`` (returning the bytes written), ``fileno`` and ``close``.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_file_bytes: int = 16 << 20,
        max_total_bytes: int = 1 << 30,
        fsync_interval_s: float = 1.0,
        queue_records: int = QUEUE_RECORDS,
        opener: Opener = _open_append,
        clock: Callable[[], float] = time.monotonic,
        make_parents: bool = False,
    ) -> None:
        if max_total_bytes < 2 * max_file_bytes:
            raise ValueError("max_total_bytes must be at least twice max_file_bytes")
        self.directory = Path(directory)
        self.make_parents = make_parents  # only for the default directory: a typo must not grow a tree
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.fsync_interval_s = fsync_interval_s
        self.opener = opener
        self.clock = clock
        self.stats = RecorderStats()
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=queue_records)
        self._header: dict[str, Any] | None = None
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self._size = 0
        self._unsynced = False
        self._last_sync = clock()
        self._retry_at = float("-inf")
        self._backoff = Backoff(1.0, RETRY_MAX_S)
        self._warned_at = float("-inf")
        self._thread: threading.Thread | None = None

    # -- the control loop's side ------------------------------------------------------
    def submit(self, record: dict[str, Any]) -> bool:
        """Queue one record; never blocks. False (and counted) when the queue is full."""
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.stats.records_dropped += 1
            return False
        # A header is not a record of its own: it is written at the top of each file.
        self.stats.records_submitted += record.get("kind") != "header"
        return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="powerbudgetd-recorder", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, fsync, close. Blocks up to ``timeout_s`` (call off the loop)."""
        if self._thread is None or not self._thread.is_alive():  # not started, or closed before
            self._drain()
            self._close_file()
            return
        deadline = time.monotonic() + timeout_s
        while True:  # the stop marker must get in even behind a full queue
            try:
                self.queue.put(None, timeout=0.1)
                break
            except queue.Full:
                if time.monotonic() > deadline or not self._thread.is_alive():
                    break
        self._thread.join(max(0.0, deadline - time.monotonic()))

    # -- the writer thread --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            timeout = max(0.0, self._last_sync + self.fsync_interval_s - self.clock()) if self._unsynced else None
            try:
                rec = self.queue.get(timeout=timeout)
            except queue.Empty:
                self._sync()
                continue
            if rec is None:
                break
            self._handle(rec)
        self._close_file()

    def _drain(self) -> None:
        while True:
            try:
                rec = self.queue.get_nowait()
            except queue.Empty:
                return
            if rec is not None:
                self._handle(rec)

    def _handle(self, rec: dict[str, Any]) -> None:
        if rec.get("kind") == "header":
            self._header = rec
            if self._file is not None:  # a new run in the same writer: start a file for it
                self._close_file()
            return
        self._write(rec)
        if self.clock() - self._last_sync >= self.fsync_interval_s:
            self._sync()

    def _write(self, rec: dict[str, Any]) -> None:
        data = (json.dumps(rec, separators=(",", ":"), allow_nan=False) + "\n").encode()
        now = self.clock()
        if self._file is None and now < self._retry_at:
            self.stats.records_lost += 1
            return
        try:
            if self._file is not None and self._size + len(data) > self.max_file_bytes:
                self._close_file()
            if self._file is None:
                self._open_new()
            self._append(data)
        except OSError as exc:
            self._failed(exc, now)
            return
        self.stats.records_written += 1
        self._backoff.reset()

    def _append(self, data: bytes) -> None:
        assert self._file is not None
        n = self._file.write(data)
        if n is not None and n != len(data):  # a short write: the disk filled mid-record
            self._size += n
            raise OSError(errno.ENOSPC, f"short write ({n} of {len(data)} bytes)")
        self._size += len(data)
        self.stats.bytes_written += len(data)
        self._unsynced = True

    def _open_new(self) -> None:
        # A configured directory's parent must exist: a mistyped path fails here, loudly,
        # instead of growing a tree as root.
        self.directory.mkdir(parents=self.make_parents, exist_ok=True, mode=0o750)
        check_directory(self.directory)
        files = log_files(self.directory)
        seq = int(FILE_RE.match(files[-1].name).group(1)) + 1 if files else 1  # type: ignore[union-attr]
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        path = self.directory / f"power-{seq:08d}-{stamp}.jsonl"
        self._prune(files)
        self._path, self._size = path, 0
        self._file = self.opener(path)
        _fsync_dir(self.directory)
        if self._header is not None:
            self._append((json.dumps(self._header, separators=(",", ":")) + "\n").encode())

    def _prune(self, files: list[Path]) -> None:
        """Delete the oldest files until they and a full new file fit the total."""
        sizes = []
        for p in files:
            try:
                sizes.append((p, p.stat().st_size))
            except FileNotFoundError:
                continue
        total = sum(s for _, s in sizes)
        deleted = False
        for p, size in sizes:
            if total + self.max_file_bytes <= self.max_total_bytes:
                break
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            total -= size
            deleted = True
            self.stats.files_deleted += 1
        if deleted:
            _fsync_dir(self.directory)

    def _sync(self) -> None:
        if self._file is None or not self._unsynced:
            return
        try:
            os.fsync(self._file.fileno())
        except OSError as exc:
            self._failed(exc, self.clock())
            return
        self.stats.fsyncs += 1
        self._unsynced = False
        self._last_sync = self.clock()

    def _failed(self, exc: OSError, now: float) -> None:
        # Keep the torn line at the end of its file: close it, and start a new file
        # after a backoff (a full disk is not retried on every record).
        self.stats.write_errors += 1
        self.stats.records_lost += 1
        self.stats.last_error = f"{self._path or self.directory}: {exc.strerror or exc}"
        self._close_file(quiet=True)
        self._retry_at = now + self._backoff.next_s()
        if now - self._warned_at >= WARN_EVERY_S:
            # The first failure is an error: after a power event there would be no log.
            first = self._warned_at == float("-inf")
            self._warned_at = now
            (log.error if first else log.warning)(
                "recorder_write_failed", error=self.stats.last_error, errno=exc.errno,
                write_errors=self.stats.write_errors, records_lost=self.stats.records_lost,
            )

    def _close_file(self, quiet: bool = False) -> None:
        f, self._file = self._file, None
        if f is None:
            return
        try:
            if self._unsynced:  # what got in before a failure is worth keeping too
                os.fsync(f.fileno())
                self.stats.fsyncs += 1
        except OSError as exc:
            if not quiet:
                self.stats.write_errors += 1
                self.stats.last_error = f"{self._path}: {exc.strerror or exc}"
        finally:
            self._unsynced = False
            try:
                f.close()
            except OSError:
                pass
        if self._size == 0 and self._path is not None:  # never got a byte in: leave no litter
            try:
                self._path.unlink()
            except OSError:
                pass


class Recorder:
    """The side channel: tracks peaks every tick, emits a record every ``interval_s``.

    Register it with ``Daemon.register``; :meth:`on_tick` only reads the tick's bank
    snapshot and queues a dict; :meth:`run` runs the writer. ``feed`` (``core.feed``)
    gives the wall power; ``wall_clock`` epoch seconds for the ``utc`` field (virtual
    time in simulations).
    """

    def __init__(
        self,
        writer: LogWriter,
        *,
        interval_s: float = 1.0,
        feed: Feed | None = None,
        wall_clock: Callable[[], float] = time.time,
        backend: str = "nvml",
        sampler: PeakSampler | None = None,
    ) -> None:
        self.writer = writer
        self.backend = backend
        self.sampler = sampler  # reads every refresh between ticks; None: ticks only
        self.interval_s = interval_s
        self.feed = feed
        self.wall_clock = wall_clock
        self.run_id = uuid_mod.uuid4().hex[:12]
        self._card_peak: dict[str, float] = {}
        self._bank_peak: float | None = None
        self._next_due: float | None = None
        self._samples = 0
        self._header_sent = False
        self._last_mode: str | None = None
        self._last_now: float | None = None
        self._warned_at = float("-inf")
        # Extra per-record state from a side channel (the UPS): name -> () -> JSON-able.
        self.extras: dict[str, Callable[[], Any]] = {}

    @property
    def stats(self) -> RecorderStats:
        return self.writer.stats

    def on_tick(self, report: TickReport) -> None:
        snap = report.snapshot
        now = report.now
        # No instant field: the card's peak is unknown, never its average.
        seen = [c for c in snap.cards if c.power_avg_w is not None or c.power_instant_w is not None]
        for c in seen:
            w = c.power_instant_w
            if w is not None:
                prev = self._card_peak.get(c.uuid)
                self._card_peak[c.uuid] = w if prev is None else max(prev, w)
        if seen and all(c.power_instant_w is not None for c in seen):
            bank_instant = sum(c.power_instant_w or 0.0 for c in seen)
            self._bank_peak = bank_instant if self._bank_peak is None else max(self._bank_peak, bank_instant)
        self._last_mode, self._last_now = snap.mode, now
        if not self._header_sent:
            self._header_sent = True
            if self.sampler is not None:
                self.sampler.set_cards([c.uuid for c in snap.cards])
                self.sampler.take()  # nothing from before the first record's window
            self.writer.submit(self._header(report.now, snap))
            self._next_due = now + self.interval_s
            return
        assert self._next_due is not None
        if now + 1e-9 < self._next_due:
            return
        # Keep a steady cadence; after a stall, restart it rather than emit a burst.
        self._next_due = self._next_due + self.interval_s if now < self._next_due + self.interval_s else now + self.interval_s
        self._samples += 1
        if not self.writer.submit(self._sample(report.now, snap)):
            if now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                log.warning(
                    "recorder_queue_full", dropped=self.stats.records_dropped,
                    hint="the disk is slow or stalled; control is unaffected",
                )
        self._card_peak.clear()
        self._bank_peak = None

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        """``[recorder]`` changes need a restart: nothing to do."""

    def _header(self, now: float, snap: BankSnapshot) -> dict[str, Any]:
        return {
            "v": SCHEMA_VERSION, "kind": "header", "run": self.run_id,
            "utc": utc_iso(self.wall_clock()), "mono_s": round(now, 3),
            "host": socket.gethostname(), "boot_id": boot_id(), "pid": os.getpid(),
            "version": __version__, "backend": self.backend, "interval_s": self.interval_s, "budget_w": snap.budget_w,
            "feed": None if self.feed is None else asdict(self.feed),
            "cards": [
                {"index": c.index, "uuid": c.uuid, "name": c.name, "min_w": c.hw_min_limit_w, "max_w": c.hw_max_limit_w}
                for c in snap.cards
            ],
        }

    def _merge_sampler(self) -> None:
        """Fold the sampler's peaks (every refresh since the last record) into the tick's."""
        if self.sampler is None:
            return
        peaks = self.sampler.take()
        for uuid, w in peaks.card_w.items():
            prev = self._card_peak.get(uuid)
            if w is not None:
                self._card_peak[uuid] = w if prev is None else max(prev, w)
        if peaks.bank_w is not None:  # a pass that read every card
            self._bank_peak = peaks.bank_w if self._bank_peak is None else max(self._bank_peak, peaks.bank_w)

    def _sample(self, now: float, snap: BankSnapshot) -> dict[str, Any]:
        self._merge_sampler()
        cards = [
            {
                "index": c.index, "uuid": c.uuid, "avg_w": _r(c.power_avg_w),
                "peak_w": _r(self._card_peak.get(c.uuid)), "limit_w": _r(c.enforced_limit_w), "role": c.role,
            }
            for c in snap.cards
        ]
        sum_avg = snap.sum_power_avg_w
        peak = self._bank_peak
        extras = {}
        for name, source in self.extras.items():
            try:
                extras[name] = source()
            except Exception:  # noqa: BLE001 - a side channel's bug costs its field, not the record
                log.exception("recorder_extra_failed", field=name)
        return {
            "v": SCHEMA_VERSION, "kind": "sample", "n": self._samples,
            "utc": utc_iso(self.wall_clock()), "mono_s": round(now, 3),
            "mode": snap.mode, "budget_w": snap.budget_w, "dropped": self.stats.records_dropped,
            "cards": cards,
            "bank": {
                "avg_w": _r(sum_avg), "peak_w": _r(peak), "limit_w": _r(snap.sum_enforced_limit_w),
                "wall_w": _r(self._wall(sum_avg)), "wall_peak_w": _r(self._wall(peak)),
            },
            **extras,
        }

    def _wall(self, board_w: float | None) -> float | None:
        if self.feed is None or board_w is None:
            return None
        return self.feed.wall_w(board_w)

    def end_record(self) -> dict[str, Any]:
        """The clean-exit marker: a log without it after its last sample was cut."""
        return {
            "v": SCHEMA_VERSION, "kind": "end", "run": self.run_id, "utc": utc_iso(self.wall_clock()),
            "mono_s": round(self._last_now if self._last_now is not None else time.monotonic(), 3),
            "mode": self._last_mode,
        }

    async def run(self) -> None:
        """Runs the writer while the daemon runs, and on the way out writes the ``end``
        record and flushes everything (off the event loop)."""
        self.writer.start()
        if self.sampler is not None:
            self.sampler.start()
        try:
            await asyncio.Event().wait()
        finally:
            if self.sampler is not None:
                await asyncio.to_thread(self.sampler.stop)
            if self._header_sent:
                self.writer.submit(self.end_record())
            await asyncio.to_thread(self.writer.close)
            log.info("recorder_closed", **{k: v for k, v in vars(self.stats).items() if v})


def from_config(
    cfg: RecorderConfig, feed: Feed | None, backend: str = "nvml", nvml: InstantReader | None = None,
    tick_s: float = float("inf"),
) -> Recorder:
    """A recorder built from the ``[recorder]`` section (register it with the daemon).
    ``backend`` (``nvml`` or ``sim``) goes in the header; a simulated run with the default
    directory records under its ``sim/`` subdirectory (:meth:`RecorderConfig.dir_for`).
    With ``nvml`` and ticks of ``tick_s`` slower than NVML's 100 ms refresh, its peaks
    are sampled at the refresh (:class:`PeakSampler`); at the refresh or faster, the
    ticks' own instant readings see every refresh, and a second reader would only cost."""
    directory = cfg.dir_for(backend)
    writer = LogWriter(
        directory, max_file_bytes=cfg.max_file_bytes, max_total_bytes=cfg.max_total_bytes,
        fsync_interval_s=cfg.fsync_interval_s, make_parents="dir" not in cfg.model_fields_set,
    )
    log.info("recorder_enabled", dir=str(directory), backend=backend, interval_s=cfg.interval_s, max_total_bytes=cfg.max_total_bytes)
    sampler = None if nvml is None or tick_s <= REFRESH_S else PeakSampler(nvml)
    return Recorder(writer, interval_s=cfg.interval_s, feed=feed, backend=backend, sampler=sampler)


def _r(w: float | None) -> float | None:
    return None if w is None else round(w, 1)


def boot_id() -> str | None:
    """This boot's id (/proc/sys/kernel/random/boot_id), None off Linux."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
