"""A log read is bounded by bytes of parsed samples, not by a count of records: a window
of wide records is refused sooner than one of narrow records, with a message that says
to narrow it; a UPS block keeps the recorder's fields only; strings that repeat in
every record are held once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from powerbudgetd.powerlog.reader import UPS_KEYS, LogError, load_samples, sample_cost_b, scan_log
from support.powerlog import T0, header, sample


def write(directory: Path, records: list[dict]) -> Path:
    path = directory / "power-00000001-20250615T000000Z.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def wide(n: int, cards: int) -> dict:
    rec = sample(n, T0 + n, (100.0, 100.0), (110.0, 110.0), 220.0)
    rec["cards"] = [{**rec["cards"][0], "index": i, "uuid": f"GPU-{i:04d}"} for i in range(cards)]
    return rec


@pytest.mark.parametrize("cards", [2, 64, 1024])
def test_the_window_is_capped_by_bytes_whatever_the_width(tmp_path: Path, cards: int) -> None:
    cap_b = 40 * sample_cost_b(64)  # forty 64-card records' worth
    fits = cap_b // sample_cost_b(cards)
    write(tmp_path, [header("r1", T0)] + [wide(n, cards) for n in range(1, fits + 1)])
    samples, _ = load_samples(scan_log(tmp_path).files, max_bytes=cap_b)
    assert len(samples) == fits
    write(tmp_path, [header("r1", T0)] + [wide(n, cards) for n in range(1, fits + 2)])
    with pytest.raises(LogError, match=f"more than .* MiB of sample records .*{cards} cards each.*shorter window"):
        load_samples(scan_log(tmp_path).files, max_bytes=cap_b)


def test_a_padded_ups_block_keeps_the_recorders_fields_and_strings_are_shared(tmp_path: Path) -> None:
    recs = [header("r1", T0)]
    for n in (1, 2):
        rec = wide(n, 4)
        rec["ups"] = {"state": "ok", "status": "OL", "load_pct": 41.0, "runtime_s": True,
                      **{f"junk{i}": "x" * 50 for i in range(500)}}
        recs.append(rec)
    write(tmp_path, recs)
    samples, _ = load_samples(scan_log(tmp_path).files)
    ups = samples[0].ups
    assert ups is not None and set(ups) == set(UPS_KEYS)
    assert ups["status"] == "OL" and ups["load_pct"] == 41.0 and ups["runtime_s"] is None  # a bool is no number
    assert samples[0].cards[3].uuid is samples[1].cards[3].uuid  # one string for every record
