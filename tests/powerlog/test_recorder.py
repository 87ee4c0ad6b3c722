"""The flight recorder's write side: records, peaks, rotation, fsync, slow and full disks."""

from __future__ import annotations

import errno
import json
import sys
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from powerbudgetd.config import FeedConfig
from powerbudgetd.service.logs import configure_logging
from powerbudgetd.powerlog.recorder import LogWriter, Recorder, log_files
from powerbudgetd.powerlog.reader import load_samples, scan_log
from support.rig import Rig, scenario_rig
from support.wait import wait_until

T0 = 1_750_000_000.0  # epoch s at virtual time 0


def recorded_rig(writer: LogWriter, scenario: str = "workstation-4", interval_s: float = 1.0,
                 feed: FeedConfig | None = None) -> Rig:
    """A controller on a simulated bank in virtual time, with a recorder listening."""
    rig = scenario_rig(scenario)
    recorder = Recorder(writer, interval_s=interval_s, feed=None if feed is None else feed.feed(),
                        wall_clock=lambda: T0 + rig.bank.now)
    rig.listen(recorder.on_tick)
    return rig


@pytest.fixture
def warnings_logged() -> None:
    """Let warnings through (the suite's default level drops them) for capture_logs."""
    configure_logging(level="warning", stream=sys.__stderr__, json=True)


def records(directory: Path) -> list[dict]:
    return [json.loads(line) for p in log_files(directory) for line in p.read_text().splitlines()]


def test_records_carry_peaks_limits_roles_and_wall_power(tmp_path: Path) -> None:
    feed = FeedConfig(breaker_a=15, volts=120, host_w=250, psu_efficiency=0.9)
    writer = LogWriter(tmp_path, queue_records=10_000)
    rig = recorded_rig(writer, feed=feed)
    instant: list[list[float]] = []  # per tick, each card's instant reading (W)
    rig.listen(lambda _: instant.append([c.reading.power_instant_w for c in rig.ctl.cards]))
    rig.ticks(451)  # 45 s at 0.1 s: a header at t=0, samples at 1 s .. 45 s
    writer.close()
    recs = records(tmp_path)
    assert recs[0]["kind"] == "header" and recs[0]["v"] == 1
    assert [c["uuid"] for c in recs[0]["cards"]] == [c.uuid for c in rig.ctl.cards]
    assert recs[0]["cards"][0]["min_w"] == 150.0 and recs[0]["cards"][0]["max_w"] == 300.0
    samples = [r for r in recs if r["kind"] == "sample"]
    assert len(samples) == 45
    assert [s["n"] for s in samples] == list(range(1, 46))
    for j, s in enumerate(samples):
        # The ticks since the previous record: (k-1)*10+1 .. k*10 (tick 0 sent the header).
        ticks = instant[j * 10 + 1 : (j + 1) * 10 + 1]
        for i, c in enumerate(s["cards"]):
            assert c["peak_w"] == round(max(row[i] for row in ticks), 1)
            assert c["peak_w"] >= c["avg_w"] - 0.5 or c["avg_w"] > c["limit_w"] * 0.9
        assert s["bank"]["peak_w"] == round(max(sum(row) for row in ticks), 1)
        assert s["bank"]["peak_w"] <= round(sum(c["peak_w"] for c in s["cards"]), 1) + 0.1
        assert s["bank"]["avg_w"] == pytest.approx(sum(c["avg_w"] for c in s["cards"]), abs=0.3)
        assert s["bank"]["limit_w"] == pytest.approx(sum(c["limit_w"] for c in s["cards"]), abs=0.3)
        assert s["bank"]["wall_w"] == pytest.approx((s["bank"]["avg_w"] + 250) / 0.9, abs=0.2)
        assert s["bank"]["wall_peak_w"] == pytest.approx((s["bank"]["peak_w"] + 250) / 0.9, abs=0.2)
        assert s["budget_w"] == 1000 and s["mode"] in ("dynamic", "booting")
    last = samples[-1]
    assert {c["role"] for c in last["cards"]} <= {"fair_share", "donor", "recipient"}
    # GPU 0 serves while the others idle: it borrows their watts, and the log shows it.
    assert any(s["cards"][0]["role"] == "recipient" and s["cards"][0]["limit_w"] > 250 for s in samples)
    assert any(s["cards"][1]["role"] == "donor" and s["cards"][1]["limit_w"] == 150 for s in samples)
    assert last["utc"] == "2025-06-15T15:07:25.000Z" and last["mono_s"] == 45.0


def test_no_feed_means_null_wall_power(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, queue_records=1000)
    recorded_rig(writer).ticks(21)
    writer.close()
    s = [r for r in records(tmp_path) if r["kind"] == "sample"][-1]
    assert s["bank"]["wall_w"] is None and s["bank"]["wall_peak_w"] is None


def test_rotation_keeps_the_total_under_its_bound_and_every_file_self_describing(tmp_path: Path) -> None:
    bound = 6 * 4096
    seen_totals: list[int] = []

    def opener(path: Path):
        f = open(path, "ab", buffering=0)
        real_write = f.write

        def write(data: bytes) -> int:  # check the bound at every write, before and after
            total = sum(p.stat().st_size for p in log_files(tmp_path))
            seen_totals.append(total + len(data))
            return real_write(data)

        f.write = write  # type: ignore[method-assign]
        return f

    (tmp_path / "power-00000007-20250101T000000Z.jsonl").write_bytes(b"x" * 9000)  # an old, big file
    (tmp_path / "notes.txt").write_text("not ours: left alone")
    writer = LogWriter(tmp_path, max_file_bytes=4096, max_total_bytes=bound, queue_records=10_000, opener=opener)
    writer.start()
    rig = recorded_rig(writer, interval_s=0.1)
    rig.ticks(400)
    writer.close()
    assert max(seen_totals) <= bound
    assert writer.stats.files_deleted >= 5
    files = log_files(tmp_path)
    assert not (tmp_path / "power-00000007-20250101T000000Z.jsonl").exists()
    assert (tmp_path / "notes.txt").exists()
    assert all(p.stat().st_size <= 4096 for p in files)
    assert sum(p.stat().st_size for p in files) <= bound
    index = scan_log(tmp_path)
    assert all(f.header is not None for f in index.files)
    assert len(index.runs) == 1
    samples, skipped = load_samples(index.files)
    assert not skipped
    # The newest records survive, in order and without a gap.
    ns = [json.loads(line)["n"] for p in files for line in p.read_text().splitlines() if '"sample"' in line]
    assert ns == list(range(ns[0], ns[-1] + 1)) and ns[-1] == writer.stats.records_written


@pytest.mark.parametrize(("interval_s", "fsyncs"), [(0.0, 10), (3600.0, 1)])
def test_fsync_at_the_configured_interval(tmp_path: Path, interval_s: float, fsyncs: int) -> None:
    """0: every record reaches the disk at once; an hour: only the close syncs."""
    writer = LogWriter(tmp_path, fsync_interval_s=interval_s, queue_records=1000)
    writer.start()
    for i in range(10):
        writer.submit({"v": 1, "kind": "sample", "n": i, "utc": "2025-01-01T00:00:00.000Z"})
    writer.close()
    assert writer.stats.records_written == 10
    assert writer.stats.fsyncs == fsyncs


class GatedFile:
    """A file whose writes wait for ``gate``: a stalled disk (NFS gone, dying drive)."""

    def __init__(self, path: Path, gate: threading.Event) -> None:
        self.f = open(path, "ab", buffering=0)
        self.gate = gate

    def write(self, data: bytes) -> int:
        self.gate.wait()
        return self.f.write(data)

    def fileno(self) -> int:
        return self.f.fileno()

    def close(self) -> None:
        self.f.close()


def _run_in_thread(rig: Rig, ticks: int) -> bool:
    """Run ticks on another thread; True when they all finished (a listener that blocked
    on the disk would hang here, and the join gives up)."""
    t = threading.Thread(target=rig.ticks, args=(ticks,), daemon=True)
    t.start()
    t.join(60)
    return not t.is_alive()


def test_a_stalled_disk_drops_and_counts_records_but_never_holds_a_tick(tmp_path: Path, warnings_logged) -> None:
    gate = threading.Event()
    writer = LogWriter(tmp_path, queue_records=8, opener=lambda p: GatedFile(p, gate))
    writer.start()
    rig = recorded_rig(writer, interval_s=0.1)
    with capture_logs() as logs:
        assert _run_in_thread(rig, 200), "a tick blocked on the stalled disk"
    # One warning, not one per dropped record (the next comes a minute later).
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["recorder_queue_full"]
    assert len(rig.reports) == 200  # no tick missed
    st = writer.stats
    due = 1 + 199  # the header, then one record every tick after the first
    assert st.records_submitted + 1 + st.records_dropped == due  # the header is not counted as a record
    # In: the queue's 8, the header the writer keeps, the record stuck in write().
    assert due - 10 <= st.records_dropped <= due - 8
    gate.set()
    wait_until(writer.queue.empty, 30, "the backlog to drain", step_s=0.01)  # before the next records are made
    assert _run_in_thread(rig, 20)
    writer.close()
    samples = [r for r in records(tmp_path) if r["kind"] == "sample"]
    assert len(samples) == st.records_written
    # Every record says how many were lost before it, and its n shows the gap.
    assert [s["n"] - s["dropped"] for s in samples] == list(range(1, len(samples) + 1))
    assert samples[-1]["dropped"] >= due - 10


class FullDisk:
    """An opener whose files fail with ENOSPC while ``full`` is set."""

    def __init__(self) -> None:
        self.full = True
        self.opened: list[Path] = []

    def __call__(self, path: Path):
        self.opened.append(path)
        f = open(path, "ab", buffering=0)
        real_write = f.write
        disk = self

        class _File:
            def write(self, data: bytes) -> int:
                if disk.full:
                    raise OSError(errno.ENOSPC, "No space left on device")
                return real_write(data)

            def fileno(self) -> int:
                return f.fileno()

            def close(self) -> None:
                f.close()

        return _File()


def test_a_full_disk_is_counted_and_recording_resumes_in_a_new_file(tmp_path: Path, warnings_logged) -> None:
    disk = FullDisk()
    now = [0.0]
    writer = LogWriter(tmp_path, queue_records=10_000, opener=disk, clock=lambda: now[0])
    writer.start()
    rig = recorded_rig(writer, interval_s=0.5)
    with capture_logs() as logs:
        assert _run_in_thread(rig, 50)
        st = writer.stats
        wait_until(lambda: st.records_lost == 9, 30, "9 records lost", step_s=0.01)
    warned = [e for e in logs if e["event"] == "recorder_write_failed"]
    assert len(warned) == 1 and warned[0]["log_level"] == "error" and warned[0]["errno"] == errno.ENOSPC
    assert st.write_errors >= 1 and st.records_lost == 9 and st.records_written == 0  # samples at 0.5 .. 4.5 s
    assert "No space left" in (st.last_error or "")
    # Retried after a backoff, not on every record: one file per failure, emptied ones removed.
    assert len(disk.opened) == st.write_errors
    assert log_files(tmp_path) == []

    disk.full = False
    now[0] = 100.0  # past the backoff
    rig.ticks(30)
    writer.close()
    samples = [r for r in records(tmp_path) if r["kind"] == "sample"]
    assert len(samples) == 6 and samples[0]["n"] == 10
    assert records(tmp_path)[0]["kind"] == "header"


def test_a_short_write_leaves_the_torn_line_at_the_end_of_its_file(tmp_path: Path) -> None:
    budget = [3000]  # bytes the disk still takes

    def opener(path: Path):
        f = open(path, "ab", buffering=0)

        class _File:
            def write(self, data: bytes) -> int:
                n = min(len(data), budget[0])
                budget[0] -= n
                return f.write(data[:n])

            def fileno(self) -> int:
                return f.fileno()

            def close(self) -> None:
                f.close()

        return _File()

    now = [0.0]
    writer = LogWriter(tmp_path, queue_records=1000, opener=opener, clock=lambda: now[0])
    rig = recorded_rig(writer, interval_s=0.1)
    rig.ticks(10)
    writer.close()
    budget[0] = 10**9
    now[0] = 100.0
    rig.ticks(10)
    writer.close()
    files = log_files(tmp_path)
    assert len(files) == 2
    index = scan_log(tmp_path)
    assert [t.path for t in index.torn] == [files[0]]
    samples, skipped = load_samples(index.files)
    assert [s.torn for s in skipped] == [True]
    assert len(samples) == writer.stats.records_written


def test_a_configured_directory_whose_parent_is_missing_is_not_created(tmp_path: Path) -> None:
    from powerbudgetd.powerlog.recorder import from_config
    from powerbudgetd.config import RecorderConfig

    typo = tmp_path / "no-such-parent" / "rec"
    rec = from_config(RecorderConfig(dir=typo), None)
    with capture_logs() as logs:
        rec.writer.submit({"kind": "test"})
        rec.writer.close()
    assert not (tmp_path / "no-such-parent").exists()
    assert any(e["event"] == "recorder_write_failed" and e["log_level"] == "error" for e in logs)
