"""Where the watts are in a meter's JSON payload: a dotted path, one rule for the daemon
(each reading) and the config (checked against the preset's sample payloads).

A path is dotted keys; a number picks a list item (``ENERGY.Power.1``: the second
channel of a multi-channel Tasmota), ``*`` sums every item of a list
(``ENERGY.Power.*``: all channels). Empty: the payload itself is the number.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

SUM = "*"


class PathError(ValueError):
    """The path does not lead to a finite number of watts; the message says where it broke."""


def watts_at(value: Any, path: Sequence[str]) -> float:
    """The watts at ``path`` in a parsed JSON ``value`` (W).

    Raises PathError naming the part of the path that is missing, or what it found
    instead of a number (a list: with the hint to pick a channel or sum them)."""
    for i, key in enumerate(path):
        where = ".".join(path[: i + 1])
        if key == SUM and isinstance(value, list):
            if not value:
                raise PathError(f"{where}: an empty list")
            return math.fsum(watts_at(item, path[i + 1 :]) for item in value)
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise PathError(f"no {where}")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        where = ".".join(path) or "payload"
        if isinstance(value, list):
            raise PathError(f"{where} is a list of {len(value)} channels: pick one ({where}.0) or sum them ({where}.*)")
        raise PathError(f"{where} is not a number")
    return float(value)
