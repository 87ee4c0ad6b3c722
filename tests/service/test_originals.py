"""original-limits.json: written atomically, by UUID, at the first start only.

A fake bank whose limits the test sets: the first start records what it finds; a later
start, with the daemon's shares in force, keeps the record byte for byte and adds only a
card it has never seen; a write that fails half-way leaves the previous record whole; a
record that cannot be read is never replaced (it may be the only copy of the
operator's limits).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from powerbudgetd.hw.nvml import GpuInfo, PowerReading
from powerbudgetd.service import originals
from powerbudgetd.service.originals import FILE_NAME, OriginalsError, load, record_found


class Bank:
    """The three calls record_found makes, on cards whose limits the test sets (W)."""

    def __init__(self, limits_w: dict[str, float]) -> None:
        self.limits_w = dict(limits_w)

    def device_count(self) -> int:
        return len(self.limits_w)

    def device(self, index: int) -> GpuInfo:
        uuid = list(self.limits_w)[index]
        return GpuInfo(index, uuid, "Test GPU", 150.0, 300.0, 300.0)

    def read(self, uuid: str) -> PowerReading:
        return PowerReading(50.0, 50.0, self.limits_w[uuid], self.limits_w[uuid])


def test_the_first_start_records_and_a_later_one_keeps_it_adding_only_a_new_card(tmp_path: Path) -> None:
    path = tmp_path / "rec" / FILE_NAME
    bank = Bank({"GPU-a": 300.0, "GPU-b": 240.0})
    assert record_found(bank, path) == ["GPU-a", "GPU-b"]  # type: ignore[arg-type]
    first = path.read_bytes()
    bank.limits_w = {"GPU-a": 270.0, "GPU-b": 270.0}  # the daemon's shares, left at its stop
    assert record_found(bank, path) == []  # type: ignore[arg-type]
    assert path.read_bytes() == first
    bank.limits_w["GPU-c"] = 200.0  # a card added since
    assert record_found(bank, path) == ["GPU-c"]  # type: ignore[arg-type]
    assert {u: o.limit_w for u, o in load(path).items()} == {"GPU-a": 300.0, "GPU-b": 240.0, "GPU-c": 200.0}
    assert sorted(p.name for p in path.parent.iterdir()) == [FILE_NAME]  # no temporary file left


def test_a_write_that_fails_half_way_leaves_the_old_record_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / FILE_NAME
    record_found(Bank({"GPU-a": 300.0}), path)  # type: ignore[arg-type]
    before = path.read_bytes()

    def crash(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(originals.os, "fsync", crash)  # the new file written, not yet made durable
    with pytest.raises(OSError):
        record_found(Bank({"GPU-a": 250.0, "GPU-new": 200.0}), path)  # type: ignore[arg-type]
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]
    assert os.stat(path).st_size == len(before)


def test_a_record_that_cannot_be_read_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_text('{"format": 1, "cards": {"GPU-a": {"limit_w": 300')  # torn by hand
    with pytest.raises(OriginalsError, match=FILE_NAME):
        record_found(Bank({"GPU-a": 270.0}), path)  # type: ignore[arg-type]
    assert path.read_text().endswith('"limit_w": 300')
    path.write_text(json.dumps({"format": 2, "cards": {}}))
    with pytest.raises(OriginalsError, match="format 1"):
        record_found(Bank({"GPU-a": 270.0}), path)  # type: ignore[arg-type]
