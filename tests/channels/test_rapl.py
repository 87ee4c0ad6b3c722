"""The host's own draw from RAPL: a test tree of powercap files (the root is configurable),
the counters moved between samples, their wrap at max_energy_range_uj, and a file that
cannot be read (the constant host_w back in force, said once)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from powerbudgetd.channels.rapl import RaplChannel
from powerbudgetd.config import FeedConfig
from powerbudgetd.config.meters import RaplConfig
from powerbudgetd.core.rapl import RaplPower, ZoneSample, energy_j

RANGE_UJ = 262_143_328_850  # a Xeon's max_energy_range_uj
FEED = FeedConfig(breaker_a=15, volts=120, psu_efficiency=0.9, host_w=100, transient_factor=1.0)


class Sink:
    configured_w = 1200.0

    def __init__(self) -> None:
        self.value: float | None = None

    def offer(self, source: str, budget_w: float, now: float) -> None:
        assert source == "rapl"
        self.value = budget_w

    def withdraw(self, source: str) -> None:
        self.value = None


class Tree:
    """A powercap tree: packages intel-rapl:0 and :1, each with a sub-zone (not read)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for zone in ("intel-rapl:0", "intel-rapl:1", "intel-rapl:0:0", "intel-rapl:1:0"):
            (root / zone).mkdir(parents=True)
            (root / zone / "name").write_text("package-0\n" if zone.count(":") == 1 else "dram\n")
            (root / zone / "max_energy_range_uj").write_text(f"{RANGE_UJ}\n")
        self.energy = {"intel-rapl:0": 0, "intel-rapl:1": 0, "intel-rapl:0:0": 0, "intel-rapl:1:0": 0}
        self.write()

    def write(self) -> None:
        for zone, uj in self.energy.items():
            (self.root / zone / "energy_uj").write_text(f"{uj}\n")

    def draw(self, seconds: float, **watts: float) -> None:
        """Count ``watts`` per package (package0=..., package1=...) for ``seconds``."""
        for pkg, w in watts.items():
            zone = f"intel-rapl:{pkg[-1]}"
            self.energy[zone] = (self.energy[zone] + round(w * seconds * 1e6)) % RANGE_UJ
        self.energy["intel-rapl:0:0"] += 123_456_789  # a sub-zone's count is never added
        self.write()


def channel(tree: Tree, sink: Sink, **extra: object) -> RaplChannel:
    cfg = RaplConfig.model_validate({"root": str(tree.root), "window_s": 1.0, **extra})
    return RaplChannel(cfg, FEED, sink, registry=CollectorRegistry(), clock=lambda: 0.0)


def test_package_power_over_host_w_lowers_the_feed_budget(tmp_path: Path) -> None:
    tree, sink = Tree(tmp_path / "powercap"), Sink()
    ch = channel(tree, sink, other_w=40)
    ch.sample(0.0)
    assert ch.cpu_w is None and sink.value is None  # the first sample opens the window
    tree.draw(1.0, package0=30, package1=20)  # 50 + 40 W: under host_w 100 W, host_w stays
    ch.sample(1.0)
    assert ch.cpu_w == pytest.approx(50) and ch.host_w == 100 and sink.value is None
    tree.draw(2.0, package0=150, package1=110)  # 260 + 40 = 300 W: 200 W more than host_w says
    ch.sample(3.0)
    assert ch.cpu_w == pytest.approx(260) and ch.host_w == pytest.approx(300)
    # the circuit: 15 A x 120 V x 0.8 = 1440 W x 0.9 = 1296 W - 300 W of host = 996 W of board power
    assert sink.value == pytest.approx(1440 * 0.9 - 300)
    assert ch.metrics_cpu._value.get() == pytest.approx(260)  # type: ignore[attr-defined]


def test_a_counter_that_wraps_counts_across_the_wrap(tmp_path: Path) -> None:
    tree, sink = Tree(tmp_path / "powercap"), Sink()
    tree.energy["intel-rapl:0"] = RANGE_UJ - 100_000_000  # 100 J before the wrap
    tree.write()
    ch = channel(tree, sink)
    ch.sample(0.0)
    tree.draw(1.0, package0=400)  # wraps: 300 J past 0
    ch.sample(1.0)
    assert tree.energy["intel-rapl:0"] < RANGE_UJ - 100_000_000
    assert ch.cpu_w == pytest.approx(400)


@pytest.mark.parametrize("break_it", ["unreadable", "garbled", "gone"])
def test_an_unreadable_counter_falls_back_to_host_w_said_once(tmp_path: Path, break_it: str) -> None:
    tree, sink = Tree(tmp_path / "powercap"), Sink()
    ch = channel(tree, sink)
    ch.sample(0.0)
    tree.draw(1.0, package0=300)
    ch.sample(1.0)
    assert sink.value is not None
    target = tree.root / "intel-rapl:1" / "energy_uj"
    if break_it == "unreadable":  # a directory where the file was: EISDIR even for root
        target.unlink()
        target.mkdir()
    elif break_it == "garbled":
        target.write_text("n/a\n")
    else:  # no package zone left
        shutil.rmtree(tree.root)
        tree.root.mkdir()
    with capture_logs() as logs:
        for t in (2.0, 3.0, 4.0):
            ch.sample(t)
    assert sink.value is None and ch.state == "unreadable" and ch.host_w is None
    lines = [e for e in logs if e["event"] == "rapl_unavailable"]
    assert len(lines) == 1 and ("intel-rapl" in lines[0]["detail"])
    assert "host_w 100 W is in force" in lines[0]["action"]
    # repaired: measured again after a fresh window
    if break_it == "unreadable":
        target.rmdir()
    if break_it != "gone":
        tree.write()
    else:
        tree.root.rmdir()
        tree = Tree(tmp_path / "powercap")
    ch.sample(5.0)
    tree.draw(1.0, package0=300)
    ch.sample(6.0)
    assert ch.state == "ok" and ch.cpu_w == pytest.approx(300)


def test_no_rapl_at_all_is_said_once(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    sink = Sink()
    ch = RaplChannel(RaplConfig(root=tmp_path / "empty"), FEED, sink, registry=CollectorRegistry())
    with capture_logs() as logs:
        ch.sample(0.0)
        ch.sample(1.0)
    assert [e["event"] for e in logs] == ["rapl_unavailable"] and "no RAPL package zone" in logs[0]["detail"]


@given(st.integers(0, RANGE_UJ), st.integers(0, 10**9))
def test_the_energy_across_any_wrap_is_what_was_counted(start: int, counted: int) -> None:
    before = ZoneSample(start, RANGE_UJ)
    after = ZoneSample((start + counted) % RANGE_UJ, RANGE_UJ)
    assert energy_j(before, after) == pytest.approx(counted / 1e6)


def test_power_waits_for_the_window() -> None:
    p = RaplPower(1.0)
    assert p.add(0.0, {"a": ZoneSample(0, RANGE_UJ)}) is None
    assert p.add(0.5, {"a": ZoneSample(50_000_000, RANGE_UJ)}) is None
    assert p.add(1.0, {"a": ZoneSample(100_000_000, RANGE_UJ)}) == pytest.approx(100)
