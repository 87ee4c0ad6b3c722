"""The collector's young generation sized to the bank: a tick at 1024 cards is collected
no more often than one at 256, so the collector's work grows with the bank, not faster."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from powerbudgetd.service.heap import YOUNG_PER_CARD, size_young_generation
from support.rig import busy, card, idle, make_rig


@pytest.fixture
def thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def collections_per_tick(cards: int, ticks: int = 20) -> float:
    rig = make_rig([card(i, busy() if i % 2 else idle()) for i in range(cards)], 250.0 * cards)
    size_young_generation(cards)
    rig.run(1.0)
    seen: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "stop":
            seen.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        rig.ticks(ticks)
    finally:
        gc.callbacks.remove(count)
    return len(seen) / ticks


def test_a_big_bank_is_collected_no_more_often_a_tick_than_a_smaller_one(thresholds: None) -> None:
    at_256 = collections_per_tick(256)
    at_1024 = collections_per_tick(1024)
    assert at_1024 <= max(at_256, 0.5), (at_256, at_1024)  # CPython's default: about 9 a tick at 1024


def test_the_threshold_is_raised_for_a_big_bank_and_never_lowered(thresholds: None) -> None:
    gc.set_threshold(700, 10, 10)
    assert size_young_generation(8) == 700  # a small bank keeps the default
    assert size_young_generation(1024) == YOUNG_PER_CARD * 1024
    assert size_young_generation(256) == YOUNG_PER_CARD * 1024
    assert gc.get_threshold()[1:] == (10, 10)
