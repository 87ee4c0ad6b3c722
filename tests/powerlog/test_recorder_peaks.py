"""The recorder keeps every peak: instants read at NVML's 100 ms refresh, whatever tick_s (by the
ticks themselves at 0.1 s, by the sampler between slower ones)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from powerbudgetd.core.model import Timings
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.powerlog.peaks import PeakSampler
from powerbudgetd.powerlog.recorder import LogWriter, Recorder, log_files
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import CardSpec, SimBank
from powerbudgetd_sim.profiles import Phase
from support.rig import card, make_rig


def records(directory: Path) -> list[dict]:
    return [json.loads(line) for p in log_files(directory) for line in p.read_text().splitlines()]


def spiky_cards(has_instant: bool = True) -> list[CardSpec]:
    # One 100 ms burst a second, out of phase with a 1 s tick: a single-refresh spike
    # (300 W demand at a 250 W cap from idle) that a once-a-second reading misses.
    busy = card(0, Phase(0.0), Phase(0.45, "square", high_w=300.0, on_s=0.1, off_s=0.9), has_instant=has_instant)
    quiet = card(1, Phase(0.0, "constant", power_w=120.0), has_instant=has_instant)
    return [busy, quiet]


def run(tmp_path: Path, *, tick_s: float, sampler: bool, has_instant: bool = True, seconds: int = 30):
    """The controller ticking every ``tick_s`` on virtual time, the sampler at every refresh."""
    rig = make_rig(spiky_cards(has_instant), 500.0, Timings(
        tick_s=tick_s, recipient_hold_s=max(2.0, tick_s), donor_hold_s=max(5.0, tick_s),
        release_hold_s=max(10.0, tick_s)), lag_s=0.0, seed=3)
    bank, nvml, ctl = rig.bank, rig.nvml, rig.ctl
    writer = LogWriter(tmp_path, queue_records=10_000)
    peaks = PeakSampler(nvml) if sampler else None
    rec = Recorder(writer, interval_s=1.0, sampler=peaks, wall_clock=lambda: 1e9 + bank.now)
    truth: dict[int, list[float]] = {}  # per record window: every refresh's instant of card 0
    bank.observers.append(lambda t: truth.setdefault(int((t - 1e-6) // 1.0) if t > 0 else -1, []).append(
        bank.cards[0].instant_w))
    steps = round(tick_s / 0.1)
    for k in range(int(seconds / 0.1) + 1):
        t = round(k * 0.1, 9)
        bank.advance_to(t)
        if peaks is not None and rec._header_sent:
            peaks.sample_once()  # the sampler's thread, run here in step with virtual time
        if k % steps == 0:
            rec.on_tick(ctl.tick(t))
    writer.close()
    return [r for r in records(tmp_path) if r["kind"] == "sample"], truth


def test_at_tick_1_s_every_single_refresh_spike_is_recorded(tmp_path: Path) -> None:
    samples, truth = run(tmp_path / "with", tick_s=1.0, sampler=True)
    assert len(samples) >= 25
    for s in samples[1:]:
        window = int(round(s["mono_s"])) - 1  # the refreshes in (t - 1, t]
        assert s["cards"][0]["peak_w"] == pytest.approx(max(truth[window]), abs=0.05)
    assert all(s["cards"][0]["peak_w"] > 1.1 * 250 for s in samples[1:])  # every burst's spike


def test_without_the_sampler_a_1_s_tick_misses_them(tmp_path: Path) -> None:
    # What the recorder did before: one reading a tick. Most spikes are lost.
    samples, truth = run(tmp_path / "without", tick_s=1.0, sampler=False)
    missed = sum(1 for s in samples[1:] if s["cards"][0]["peak_w"] < 0.95 * max(truth[int(round(s["mono_s"])) - 1]))
    assert missed >= 0.8 * len(samples[1:])


def test_at_the_refresh_rate_the_ticks_alone_record_every_spike_and_no_sampler_is_started(tmp_path: Path) -> None:
    # At tick_s = 0.1 the ticks read every refresh themselves: the sampler would be a
    # second reader of the same readings (its thread and calls for nothing).
    samples, truth = run(tmp_path / "ticks", tick_s=0.1, sampler=False)
    assert len(samples) >= 25
    for s in samples[1:]:
        window = int(round(s["mono_s"])) - 1
        assert s["cards"][0]["peak_w"] == pytest.approx(max(truth[window]), abs=0.05)
    from powerbudgetd.config import RecorderConfig
    from powerbudgetd.powerlog.recorder import from_config

    nvml = make_rig(spiky_cards(), 500.0).nvml
    made = {tick_s: from_config(RecorderConfig(dir=tmp_path / str(tick_s)), None, nvml=nvml, tick_s=tick_s)
            for tick_s in (0.05, 0.1, 0.2, 1.0)}
    assert {t: r.sampler is not None for t, r in made.items()} == {0.05: False, 0.1: False, 0.2: True, 1.0: True}
    for r in made.values():
        r.writer.close()


def test_the_bank_peak_is_a_sum_read_together(tmp_path: Path) -> None:
    samples, _ = run(tmp_path, tick_s=1.0, sampler=True)
    for s in samples[1:]:
        assert s["bank"]["peak_w"] <= sum(c["peak_w"] for c in s["cards"]) + 0.2
        assert s["bank"]["peak_w"] >= s["cards"][0]["peak_w"]


def test_a_card_without_the_instant_field_has_an_unknown_peak_not_its_average(tmp_path: Path) -> None:
    samples, _ = run(tmp_path, tick_s=0.1, sampler=True, has_instant=False, seconds=10)
    assert samples
    for s in samples:
        assert all(c["peak_w"] is None for c in s["cards"])
        assert all(c["avg_w"] is not None for c in s["cards"])
        assert s["bank"]["peak_w"] is None and s["bank"]["wall_peak_w"] is None


def test_the_sampler_thread_runs_at_the_refresh_rate_and_stops() -> None:
    bank = SimBank([card(0, Phase(0.0, "constant", power_w=200.0))], seed=1, clock=time.monotonic)
    nvml = Nvml(SimNvmlLibrary(bank))
    nvml.init()
    sampler = PeakSampler(nvml)
    sampler.set_cards([c.spec.uuid for c in bank.cards])
    sampler.start()
    time.sleep(1.05)
    sampler.stop()
    passes = sampler.stats.passes
    assert 6 <= passes <= 12  # ~10 a second (a loaded machine may run late; never much faster)
    peaks = sampler.take()
    assert peaks.card_w[bank.cards[0].spec.uuid] is not None
    time.sleep(0.25)
    assert sampler.stats.passes == passes  # stopped
