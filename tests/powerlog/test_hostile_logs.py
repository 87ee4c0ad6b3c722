"""``log report`` and ``simulate --replay`` on hostile files (issue case 9): a 1 GB
sparse file, a 300 MB line, JSON nested 100 000 deep, timestamps running to year 9999.
Each command ends with a clear message or a report, never a traceback, in bounded
memory (peak RSS of the process) and time. Also: the recorder never follows a link."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from powerbudgetd.powerlog.recorder import LogWriter, _open_append, check_directory, utc_iso

from support.daemon import cli as run_cli
from support.powerlog import T0, header, sample

MAX_RSS_MB = 250  # the interpreter, the package and the simulator are ~100 MB of it
# The peak of this process's own memory: VmHWM starts afresh at exec, while ru_maxrss
# keeps the high-water mark of the forked parent (a large pytest process late in a run).
RUN = (
    "import sys\n"
    "from powerbudgetd.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
    "print('MAXRSS_KB', hwm, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


# The tests that run commands are marked slow: each starts fresh interpreters (~1 s).
def cli(*args: str, timeout: float = 120) -> tuple[int, str, str, float]:
    """(exit status, stdout, stderr, peak RSS in MB) of one CLI command in a fresh process."""
    p = run_cli(*args, timeout=timeout, python=("-c", RUN))
    rss = [int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("MAXRSS_KB")]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert rss, p.stderr[-3000:]
    return p.returncode, p.stdout, p.stderr, rss[0] / 1024


def line(rec: dict) -> bytes:
    return (json.dumps(rec) + "\n").encode()


def good_records(start: float, count: int) -> bytes:
    return line(header("r1", start)) + b"".join(
        line(sample(n, start + n, (120.0, 200.0), (130.0, 210.0), 340.0)) for n in range(1, count + 1)
    )


def log_path(directory: Path) -> Path:
    return directory / "power-00000001-20250615T000000Z.jsonl"


def both_commands(path: Path) -> list[tuple[int, str, str, float]]:
    return [cli("log", "report", "--dir", str(path), "--json"), cli("simulate", "--replay", str(path), "--json")]


@pytest.mark.slow
def test_a_sparse_1_gb_file(tmp_path: Path) -> None:
    path = log_path(tmp_path)
    with open(path, "wb") as fh:
        fh.write(good_records(T0, 300))
        fh.truncate(1 << 30)  # 1 GB, the rest a hole of zero bytes: one endless "line"
    for rc, _out, err, rss in both_commands(path):
        assert rss < MAX_RSS_MB, (rss, err)
        assert rc == 0, err
    d = json.loads(cli("log", "report", "--dir", str(tmp_path), "--json")[1])
    assert d["window"]["samples"] > 0
    assert any("longer than" in s["why"] or s["torn"] for s in d["skipped_lines"])


@pytest.mark.slow
def test_a_300_mb_line_between_good_records(tmp_path: Path) -> None:
    path = log_path(tmp_path)
    with open(path, "wb") as fh:
        fh.write(good_records(T0, 200))
        fh.seek(300 << 20, os.SEEK_CUR)  # 300 MB of zero bytes, then the line ends
        fh.write(b"\n")
        fh.write(b"".join(line(sample(n, T0 + n, (150.0, 200.0), (160.0, 210.0), 370.0)) for n in range(201, 400)))
    for rc, _out, err, rss in both_commands(path):
        assert rc == 0, err
        assert rss < MAX_RSS_MB, (rss, err)
    d = json.loads(cli("log", "report", "--dir", str(path), "--json", "--last", "1h")[1])
    assert d["window"]["samples"] == 399  # every good record on both sides of the long line
    assert [s["why"] for s in d["skipped_lines"]] == [f"longer than {1 << 20} bytes"]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["first", "middle", "last", "inside"])
def test_json_nested_100_000_deep(tmp_path: Path, where: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    good = good_records(T0, 100).splitlines(keepends=True)
    if where == "first":
        lines = [deep + b"\n", *good]
    elif where == "middle":
        lines = [*good[:50], deep + b"\n", *good[50:]]
    elif where == "last":
        lines = [*good, deep]
    else:  # a record whose cards are nested
        rec = line(sample(101, T0 + 101, (1.0, 1.0), (1.0, 1.0), 2.0)).replace(b'"cards": [', b'"cards": [' + deep + b", ")
        lines = [*good, rec]
    path = log_path(tmp_path)
    path.write_bytes(b"".join(lines))
    for rc, _out, err, _rss in both_commands(path):
        assert rc == 0, err
    d = json.loads(cli("log", "report", "--dir", str(path), "--json")[1])
    assert d["window"]["samples"] >= 99
    if where in ("middle", "inside"):
        assert any("nested too deep" in s["why"] for s in d["skipped_lines"]), d["skipped_lines"]


@pytest.mark.slow
def test_timestamps_running_to_year_9999(tmp_path: Path) -> None:
    path = log_path(tmp_path)
    recs = good_records(T0, 100)
    for year in (2200, 5000, 9999):  # each a record of an impossible time
        recs += line(sample(1, T0, (1.0, 1.0), (1.0, 1.0), 2.0)).replace(
            utc_iso(T0).encode(), f"{year}-12-31T23:59:59.000Z".encode()
        )
    recs += line(sample(101, T0 + 101, (120.0, 200.0), (130.0, 210.0), 340.0)).replace(
        utc_iso(T0 + 101).encode(), b"1970-01-01T00:00:00.000Z"
    )
    path.write_bytes(recs)
    for rc, _out, err, _rss in both_commands(path):
        assert rc == 0, err
    d = json.loads(cli("log", "report", "--dir", str(path), "--json")[1])
    assert d["stop"]["utc"] == utc_iso(T0 + 100)  # the last possible record
    assert sum("impossible timestamp" in s["why"] for s in d["skipped_lines"]) == 4


@pytest.mark.slow
def test_an_impossible_header_and_a_span_of_decades(tmp_path: Path) -> None:
    # every record 9999: nothing to report, said clearly
    path = log_path(tmp_path)
    path.write_bytes(good_records(T0, 5).replace(b'"utc": "2025', b'"utc": "9999'))
    rc, out, err, _ = cli("log", "report", "--dir", str(path))
    assert rc != 0 and "powerbudgetd:" in err
    rc, out, err, _ = cli("simulate", "--replay", str(path))
    assert rc == 2 and "no sample records to replay" in err
    # two runs 20 years apart: the gap replays shortened, and the replay finishes
    old = good_records(T0 - 20 * 365 * 86_400, 3).replace(b'"run": "r1"', b'"run": "r0"')
    path.write_bytes(old + good_records(T0, 3))
    # (An hour of idle cards: about 20 s alone on a 2-core machine, several times that beside
    # other jobs; the timeout only tells a replay that never ends.)
    rc, out, err, _ = cli("simulate", "--replay", str(path), timeout=600)
    assert rc == 0, err
    assert "1 gap(s) between runs over 3600 s, replayed as 3600 s" in out + err
    # one run whose monotonic clock leaps by decades: refused, not simulated for ever
    leap = line(sample(4, T0 + 4, (120.0, 200.0), (130.0, 210.0), 340.0)).replace(b'"mono_s": 9.0', b'"mono_s": 1e9')
    path.write_bytes(good_records(T0, 3) + leap)
    rc, out, err, _ = cli("simulate", "--replay", str(path), timeout=60)
    assert rc == 2 and "span" in err and "days" in err, err


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad",
    [
        {"mono_s": 1e999}, {"budget_w": "x"}, {"cards": "x"}, {"cards": [{"index": float("nan")}]},
        {"dropped": 10**400}, {"bank": None}, {"cards": [None]},
    ],
)
def test_wrong_types_in_a_record_are_skipped_lines(tmp_path: Path, bad: dict) -> None:
    path = log_path(tmp_path)
    rec = {**sample(101, T0 + 101, (1.0, 1.0), (1.0, 1.0), 2.0), **bad}
    path.write_bytes(good_records(T0, 100) + json.dumps(rec).encode() + b"\n")
    for rc, _out, err, _rss in both_commands(path):
        assert rc == 0, err


@pytest.mark.slow
def test_a_hostile_header_is_a_clear_replay_error(tmp_path: Path) -> None:
    path = log_path(tmp_path)
    path.write_bytes(good_records(T0, 20).replace(b'"interval_s": 1.0', b'"interval_s": "soon"'))
    rc, out, err, _ = cli("simulate", "--replay", str(path))
    assert rc == 2 and "not a usable power log" in err


# -- the writer side: never through a link, never into a directory others can write -----
def test_the_recorder_never_follows_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    planted = tmp_path / "power-00000001-20250615T000000Z.jsonl"
    planted.symlink_to(victim)
    with pytest.raises(OSError):
        _open_append(planted)
    assert victim.read_text() == "root's file\n"


def test_the_recorder_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    d = tmp_path / "log"
    d.mkdir(mode=0o750)
    check_directory(d)
    d.chmod(0o777)
    with pytest.raises(OSError, match=r"writable by group or others \(mode 0777\); fix: chmod 750"):
        check_directory(d)
    d.chmod(0o750)
    if os.geteuid() == 0:  # another user's directory
        os.chown(d, 4242, -1)
        with pytest.raises(OSError, match="owned by uid 4242"):
            check_directory(d)
        os.chown(d, 0, -1)
    else:  # seen by another (non-root) user
        with pytest.raises(OSError, match=f"owned by uid {os.geteuid()}"):
            check_directory(d, euid=4242)
    # the writer: a write error (counted, logged, retried later), never a write into it
    d.chmod(0o777)
    writer = LogWriter(d, fsync_interval_s=0)
    writer.submit(header("r", T0))
    writer.submit(sample(1, T0 + 1, (1.0, 1.0), (1.0, 1.0), 2.0))
    writer.close()
    assert list(d.iterdir()) == []
    assert writer.stats.write_errors == 1 and "writable by group or others" in writer.stats.last_error
