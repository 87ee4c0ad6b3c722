"""Reading the log back after a power cut, and `powerbudgetd log report`."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from powerbudgetd.cli import main
from powerbudgetd.config import FeedConfig
from powerbudgetd.powerlog.report import Host, parse_duration, summarize
from powerbudgetd.powerlog.recorder import LogWriter, boot_id, log_files, utc_iso
from powerbudgetd.powerlog.reader import LogError, load_samples, scan_log
from support.powerlog import FEED, T0, header, sample, write_run

ELSEWHERE = Host("another-host", "another-boot", lambda pid: False)








def test_parse_duration() -> None:
    assert [parse_duration(s) for s in ("90", "90s", "10m", "2h", "1d", "0.5m")] == [90, 90, 600, 7200, 86400, 30]
    for bad in ("", "10x", "-5m", "m"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
    with pytest.raises(ValueError, match="must be a positive duration"):
        parse_duration("0")


def test_the_report_gives_peaks_means_limits_wall_power_and_sizing(tmp_path: Path) -> None:
    write_run(tmp_path, "r1", T0, 1200)
    d = summarize(scan_log(tmp_path), 600.0, host=ELSEWHERE)
    assert d["stop"]["utc"] == utc_iso(T0 + 1200) and d["stop"]["ended"] == "abrupt"
    win = d["window"]
    assert win["from"] == utc_iso(T0 + 600) and win["samples"] == 601 and win["expected"] == 601
    c0, c1 = d["cards"]
    assert c0["mean_w"] == pytest.approx(190.0, abs=0.05)  # n = 600 .. 1200
    assert c0["peak_w"] == pytest.approx(219.5 + 150) and c0["max_avg_w"] == 220
    assert c1["mean_w"] == 200 and c1["peak_w"] == 210 and c1["limit_w"] == 250 and c1["name"] == "Card"
    bank = d["bank"]
    assert bank["peak_w"] == pytest.approx(369.5 + 205) and bank["max_avg_w"] == 420 and bank["limit_w"] == 500
    assert bank["budget_w"] == 500 and bank["modes"] == {"dynamic": 601}
    wall = d["wall"]
    assert wall["host_w"] == 250 and wall["peak_w"] == pytest.approx((574.5 + 250) / 0.9, abs=0.1)
    assert wall["max_avg_w"] == pytest.approx((420 + 250) / 0.9, abs=0.1)
    sz = d["sizing"]
    assert sz["ups_w"] == pytest.approx((574.5 + 250) / 0.9 / 0.8, abs=0.1)
    assert sz["circuit_a"] == pytest.approx((420 + 250) / 0.9 / (120 * 0.8), abs=0.01)
    assert d["feed"]["source"] == "[feed] recorded in the log"
    assert d["feed"]["ups"]["verdict"] == "held" and d["feed"]["circuit"]["verdict"] == "held"


@pytest.mark.parametrize(
    ("host_w", "ups", "circuit"),
    [
        (400, "held, inside the margin", "held"),  # peak 1083 W of a 1200 W UPS (960 W with margin)
        (1000, "over its rating: trips", "over the continuous rating: trips if sustained"),  # 1578 W of 1440
        (1300, "over its rating: trips", "over the breaker's rating: trips"),  # 1911 W on a 1800 W breaker
    ],
)
def test_would_the_feed_have_held(tmp_path: Path, host_w: float, ups: str, circuit: str) -> None:
    write_run(tmp_path, "r1", T0, 1200)
    # A host this heavy leaves no board budget (a config error); the report must still judge it.
    feed = FeedConfig.model_construct(**{**FEED, "host_w": host_w})
    d = summarize(scan_log(tmp_path), 600.0, feed, "x.toml", host=ELSEWHERE)
    assert (d["feed"]["ups"]["verdict"], d["feed"]["circuit"]["verdict"]) == (ups, circuit)


def test_a_configured_feed_wins_and_without_any_the_host_is_unknown(tmp_path: Path) -> None:
    write_run(tmp_path, "r1", T0, 100, feed=None)
    d = summarize(scan_log(tmp_path), 60.0, host=ELSEWHERE)
    assert d["wall"]["host_known"] is False and d["feed"]["source"].startswith("defaults")
    assert d["sizing"]["volts"] == 120 and d["sizing"]["ups_margin"] == 0.1 and d["sizing"]["derating"] == 0.8
    assert d["feed"]["ups"] is None and d["feed"]["circuit"] is None
    big = FeedConfig(breaker_a=30, volts=230, ups_w=3000, host_w=300, psu_efficiency=0.92)
    d = summarize(scan_log(tmp_path), 60.0, big, "site.toml", host=ELSEWHERE)
    assert d["feed"]["source"] == "[feed] of site.toml"
    peak_wall = (100 + 9.5 + 150 + 205 + 300) / 0.92  # card 0's burst at n = 95
    assert d["wall"]["peak_w"] == pytest.approx(peak_wall, abs=0.1)
    assert d["feed"]["ups"]["verdict"] == "held" and d["feed"]["circuit"]["verdict"] == "held"


def test_a_power_cut_mid_line_stops_the_log_at_the_last_complete_record(tmp_path: Path) -> None:
    recs = write_run(tmp_path, "r1", T0, 300)
    path = log_files(tmp_path)[0]
    data = path.read_bytes()
    lines = data.split(b"\n")
    cut = len(data) - len(lines[-2]) - 1 - len(lines[-3]) // 2  # halfway through the second-to-last record
    for tail in (b"", b"\0" * 512):  # cut clean, or with the zero-filled block some filesystems leave
        path.write_bytes(data[:cut] + tail)
        index = scan_log(tmp_path)
        assert [t.path for t in index.torn] == [path]
        d = summarize(index, 60.0, host=ELSEWHERE)
        assert d["stop"]["utc"] == recs[-3]["utc"] == utc_iso(T0 + 298)
        assert d["window"]["to"] == utc_iso(T0 + 298) and d["window"]["samples"] == 61
        assert [s["torn"] for s in d["skipped_lines"]] == [True]
        samples, skipped = load_samples(index.files)
        assert len(samples) == 298 and len(skipped) == 1 and skipped[0].line == 300


def test_the_event_is_the_last_run_that_did_not_exit_cleanly(tmp_path: Path) -> None:
    me = Host("gpu-box", "boot-1", lambda pid: pid == 4242)
    write_run(tmp_path, "cut", T0, 100, seq=1)  # the power went
    write_run(tmp_path, "after", T0 + 3600, 50, end=True, seq=2)  # back up, then stopped by hand
    write_run(tmp_path, "now", T0 + 7200, 20, seq=3)  # running now
    # The log was written before a reboot: both unfinished runs are over.
    d = summarize(scan_log(tmp_path), 600.0, now_s=T0 + 7220, host=Host("gpu-box", "boot-2", lambda pid: True))
    assert [r["ended"] for r in d["runs"]] == ["host_down", "clean", "host_down"]
    assert d["stop"]["run"] == "now"
    # Same boot, the daemon of the newest run alive: it is recording; the cut is the event.
    d = summarize(scan_log(tmp_path), 600.0, now_s=T0 + 7220, host=me)
    assert [r["ended"] for r in d["runs"]] == ["killed", "clean", "recording"]
    assert d["stop"]["run"] == "cut" and d["stop"]["utc"] == utc_iso(T0 + 100)
    assert d["window"]["run_began_inside"] is True
    # Read elsewhere: a recent last record counts as recording, an old one as cut.
    d = summarize(scan_log(tmp_path), 600.0, now_s=T0 + 7221, host=ELSEWHERE)
    assert [r["ended"] for r in d["runs"]] == ["abrupt", "clean", "recording"]
    d = summarize(scan_log(tmp_path), 600.0, now_s=T0 + 9000, host=ELSEWHERE)
    assert d["stop"]["run"] == "now" and d["stop"]["ended"] == "abrupt"


def test_a_log_that_ended_cleanly_says_so(tmp_path: Path) -> None:
    write_run(tmp_path, "r1", T0, 30, end=True)
    d = summarize(scan_log(tmp_path), 600.0, host=ELSEWHERE)
    assert d["stop"]["ended"] == "clean" and d["stop"]["utc"] == utc_iso(T0 + 30.5)


def test_a_run_spread_over_rotated_files_reads_as_one(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, max_file_bytes=4096, max_total_bytes=1 << 20)
    writer.submit(header("r1", T0))
    for n in range(1, 101):
        writer.submit(sample(n, T0 + n, (120.0, 80.0), (130.0, 90.0), 215.0))
    writer.close()
    index = scan_log(tmp_path)
    assert len(index.files) > 5 and len(index.runs) == 1
    d = summarize(index, 30.0, host=ELSEWHERE)
    assert d["window"]["samples"] == 31 and d["stop"]["utc"] == utc_iso(T0 + 100)


def test_log_report_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, "r1", T0, 900)
    assert main(["log", "report", "--dir", str(tmp_path), "--last", "5m", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["window"]["samples"] == 301 and d["stop"]["utc"] == utc_iso(T0 + 900)
    config = tmp_path / "powerbudgetd.toml"
    config.write_text(
        f'budget_w = 1000\n[feed]\nbreaker_a = 20\nvolts = 120\nups_w = 3000\nhost_w = 200\n'
        f'[recorder]\ndir = "{tmp_path}"\n'
    )
    assert main(["log", "report", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"the log stops at {utc_iso(T0 + 900).replace('T', ' ').replace('Z', ' UTC')}" in out
    assert "sizing: a UPS of at least" in out and "configured UPS 3000 W: held" in out
    assert "configured circuit 20 A" in out
    assert main(["log", "report", "--dir", str(tmp_path / "nothing")]) == 2  # a wrong path: an argument error
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["log", "report", "--dir", str(tmp_path), "--last", "soon"]) == 2
    assert "not a duration" in capsys.readouterr().err


def test_not_a_log(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="no recorder files"):
        scan_log(tmp_path)
    (tmp_path / "power-00000001-20250101T000000Z.jsonl").write_text('{"v": 2, "kind": "header"}\nnot json\n')
    index = scan_log(tmp_path)
    with pytest.raises(ValueError, match="no sample records"):
        summarize(index, 60.0, host=ELSEWHERE)
    samples, skipped = load_samples(index.files)
    assert samples == [] and [s.torn for s in skipped] == [False, False]
    assert "schema version 2" in skipped[0].why


def test_this_hosts_view() -> None:
    h = Host.current()
    assert h.hostname == socket.gethostname() and h.boot_id == boot_id()
    assert h.pid_alive(os.getpid()) in (True, False)  # pytest's own command line may not say powerbudgetd
    assert h.pid_alive(0) is False


def test_the_report_says_whether_the_ups_was_on_battery(tmp_path: Path) -> None:
    """With [ups], each record carries the UPS: the report tells on battery or not, since
    when, at what load and with how much runtime left when the log stopped."""
    recs = [header("r1", T0)]
    for n in range(1, 121):
        smp = sample(n, T0 + n, (200.0, 200.0), (210.0, 210.0), bank_peak=420.0)
        on_battery = n > 60
        smp["ups"] = {
            "state": "ok", "status": "DISCHRG OB" if on_battery else "CHRG OL",
            "load_pct": 45.0 if on_battery else 40.0, "realpower_w": 405.0,
            "runtime_s": 900.0 - 10 * (n - 60) if on_battery else 900.0, "charge_pct": 100.0 - (n > 60) * (n - 60) / 6,
            "budget_w": 500.0 if on_battery else None, "reason": "ups_on_battery" if on_battery else None,
        }
        recs.append(smp)
    (tmp_path / "power-00000001-20250615T000000Z.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    d = summarize(scan_log(tmp_path), 600.0, host=ELSEWHERE)
    u = d["ups"]
    assert u["on_battery"] and u["on_battery_since"] == utc_iso(T0 + 61) and u["on_battery_s"] == 59
    assert u["load_pct"] == 45 and u["runtime_s"] == 300 and u["charge_pct"] == 90
    assert u["budget_w"] == 500 and u["reason"] == "ups_on_battery"
    assert u["transitions"] == [{"utc": utc_iso(T0 + 61), "from": "CHRG OL", "to": "DISCHRG OB"}]
    from powerbudgetd.powerlog.report import format_summary  # noqa: PLC0415

    text = format_summary(d)
    assert "the UPS was ON BATTERY at the stop" in text and "runtime left 5 min" in text and "load 45 %" in text


def test_no_ups_in_the_log_no_ups_in_the_report(tmp_path: Path) -> None:
    write_run(tmp_path, "r1", T0, 100)
    d = summarize(scan_log(tmp_path), 600.0, host=ELSEWHERE)
    assert d["ups"] is None


def test_junk_lines_are_counted_not_held(tmp_path: Path) -> None:
    """20 000 junk lines amid the samples: every one is counted and said in the
    report, but only the first MAX_SKIPPED_KEPT are held (and listed), so the memory a
    report takes is bounded by its samples, not by the junk it read past."""
    from powerbudgetd.powerlog.reader import MAX_SKIPPED_KEPT

    write_run(tmp_path, "r1", T0, 100)
    path = log_files(tmp_path)[0]
    lines = path.read_bytes().splitlines(keepends=True)
    junk = 20_000
    path.write_bytes(b"".join(lines[:50]) + b"not json at all\n" * (junk // 2)
                     + b'{"v": 1, "kind": "sample"}\n' * (junk // 2) + b"".join(lines[50:]))
    index = scan_log(tmp_path)
    samples, skipped = load_samples(index.files)
    assert len(samples) == 100
    assert skipped.total == junk and len(skipped) == MAX_SKIPPED_KEPT
    d = summarize(index, 3600.0, host=ELSEWHERE)
    assert d["skipped_total"] == junk and len(d["skipped_lines"]) == MAX_SKIPPED_KEPT
    assert d["skipped_lines"][0]["line"] == 51  # the first ones, as they came
    text = main_text(tmp_path)
    assert f"{junk} other unreadable line(s) skipped" in text


def main_text(directory: Path) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["log", "report", "--dir", str(directory), "--last", "1h"]) == 0
    return out.getvalue()
