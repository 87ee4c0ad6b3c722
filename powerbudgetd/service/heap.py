"""The garbage collector's young generation sized to the bank.

A tick makes a few container objects per card that live until its end (a reading, a
policy view, a target, a plan step, a snapshot entry, and the tuples and dicts that hold
them): about 6 per card net at 1024 cards, measured. CPython collects its young
generation every 700 net allocations, so a bank of hundreds of cards was collected
several times a tick, each collection promoting the tick's live objects toward the
older generations, whose collections traverse the whole heap: at 1024 cards 1312
young, 120 middle and 11 full collections in 150 ticks, against 152 / 13 / 1 at 256
(``benchmarks/tick_time.py`` with ``gc.callbacks``). Sized to ``YOUNG_PER_CARD`` objects
a card, the young generation is collected about once every ten ticks at any size
(11-12 collections in 150 ticks at 256 and at 1024), so the collector's work grows with
the bank, not faster. Small banks keep CPython's default.
"""

from __future__ import annotations

import gc

YOUNG_PER_CARD = 8  # container objects a card may hold young in one tick (about 6 measured), with room


def size_young_generation(cards: int) -> int:
    """Raise the young generation's threshold to ``YOUNG_PER_CARD`` x ``cards`` where that
    is above the one in force (never lowered; the older generations' are kept). Returns
    the threshold in force."""
    young, middle, old = gc.get_threshold()
    if (want := YOUNG_PER_CARD * cards) > young:
        gc.set_threshold(want, middle, old)
    return gc.get_threshold()[0]
