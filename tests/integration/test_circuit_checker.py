"""The circuit tests' checker: a sample is the hosts' truth at one instant, never a
host read before a move joined to another read after it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from support.circuit import Checker, Host


def _save(host: Host, limit_w: float) -> None:
    card = {"enforced_mw": int(limit_w * 1000), "requested_mw": int(limit_w * 1000), "pending": []}
    host.state_file.write_text(json.dumps({"clock_origin_s": time.monotonic(), "now_s": 0.0, "cards": [card]}))


def test_a_move_between_two_reads_is_not_summed_as_one_instant(tmp_path: Path) -> None:
    donor, recipient = (Host(n, tmp_path, [], "lab") for n in ("h0", "h1"))
    for h in (donor, recipient):
        h.booted = True
        _save(h, 300.0)
    read = recipient.state_text
    moves = []

    def donor_lends_as_the_checker_reads() -> str | None:
        if not moves:  # the donor was read at 300 W; before the recipient is read, 100 W move
            _save(donor, 200.0)
            _save(recipient, 400.0)
            moves.append(1)
        return read()

    recipient.state_text = donor_lends_as_the_checker_reads  # type: ignore[method-assign]
    _, walls = Checker([donor, recipient], budget_w=0).collect()
    assert moves and walls == {"h0": (200 + 100) / 0.9, "h1": (400 + 100) / 0.9}
