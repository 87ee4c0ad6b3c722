"""Bounded parsing of every value read from the circuit's keys in etcd.

Anyone who can write the circuit's prefix can put anything there: a value megabytes
long, JSON nested ten thousand deep (Python's parser recurses and raises
RecursionError), ``NaN`` or ``Infinity`` (which ``json.loads`` accepts and
``json.dumps`` prints as invalid JSON), a number of watts that is negative or absurd.
Every value goes through :func:`parse` first, which checks, in this order and each in
bounded time and memory:

- size: at most :data:`MAX_VALUE_BYTES` bytes;
- depth: brackets nested at most :data:`MAX_DEPTH` deep (counted outside strings,
  before the parser runs);
- a JSON object whose numbers are all finite (``NaN``/``Infinity`` refused);

and :func:`watts`, :func:`seconds`, :func:`fraction` and :func:`text` read one field within its bounds.
A bad value raises :class:`BadRecord` with a reason short enough for one log line.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_VALUE_BYTES = 4096  # the largest record the daemon writes is a few hundred bytes
MAX_TREE_BYTES = 1_048_576  # a power tree: about 100 bytes a node or host; core.tree allows 4096 of each
MAX_DEPTH = 4  # the daemon's records are flat objects (depth 1)
MAX_WATTS = 10_000_000.0  # 10 MW: more than any circuit one etcd prefix describes
MAX_SECONDS = 86_400.0
MAX_TEXT = 128


class BadRecord(ValueError):
    """A value that is not a record the daemon could have written (``str``: why)."""


def _depth_within(value: bytes, limit: int) -> bool:
    depth, in_string, escaped = 0, False, False
    for byte in value:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return False
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return True


def _no_constant(name: str) -> float:
    raise BadRecord(f"non-finite number {name}")


def parse(value: bytes, max_bytes: int = MAX_VALUE_BYTES) -> dict[str, Any]:
    """The JSON object in ``value``; BadRecord when it is longer than ``max_bytes``, too
    deep, not UTF-8 JSON, not an object, or holds a non-finite number."""
    if len(value) > max_bytes:
        raise BadRecord(f"{len(value)} bytes, more than {max_bytes}")
    if not _depth_within(value, MAX_DEPTH):
        raise BadRecord(f"nested more than {MAX_DEPTH} deep")
    try:
        doc = json.loads(value, parse_constant=_no_constant)
    except BadRecord:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRecord(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise BadRecord(f"a JSON {type(doc).__name__}, not an object")
    return doc


def _number(doc: dict[str, Any], key: str, lo: float, hi: float, unit: str) -> float:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadRecord(f"{key}: not a number")
    v = float(v)  # an int too large for a float raises OverflowError
    if not math.isfinite(v) or not lo <= v <= hi:
        raise BadRecord(f"{key}: {v:g} {unit} outside [{lo:g}, {hi:g}]")
    return v


def watts(doc: dict[str, Any], key: str, *, optional: bool = False) -> float | None:
    """``doc[key]`` as watts in [0, MAX_WATTS] (None when absent and ``optional``)."""
    if optional and doc.get(key) is None:
        return None
    try:
        return _number(doc, key, 0.0, MAX_WATTS, "W")
    except OverflowError:
        raise BadRecord(f"{key}: a number too large") from None


def seconds(doc: dict[str, Any], key: str, *, lo: float = 0.0, optional: bool = False) -> float | None:
    """``doc[key]`` as seconds in [``lo``, MAX_SECONDS] (None when absent and ``optional``)."""
    if optional and doc.get(key) is None:
        return None
    try:
        return _number(doc, key, lo, MAX_SECONDS, "s")
    except OverflowError:
        raise BadRecord(f"{key}: a number too large") from None


def stamp(doc: dict[str, Any], key: str) -> float:
    """``doc[key]`` as a wall-clock time (s since the epoch, up to the year 5000)."""
    try:
        return _number(doc, key, 0.0, 1e11, "s")
    except OverflowError:
        raise BadRecord(f"{key}: a number too large") from None


def fraction(doc: dict[str, Any], key: str) -> float:
    """``doc[key]`` as a fraction in [0, 1] (a cord's share of its host's draw)."""
    return _number(doc, key, 0.0, 1.0, "")


def text(doc: dict[str, Any], key: str) -> str:
    """``doc[key]`` as a non-empty string of at most MAX_TEXT printable ASCII characters."""
    v = doc.get(key)
    if not isinstance(v, str) or not 0 < len(v) <= MAX_TEXT or not v.isascii() or not v.isprintable():
        raise BadRecord(f"{key}: not a short printable string")
    return v


def dumps(**fields: Any) -> bytes:
    """A record as the daemon writes it (finite numbers only: ValueError otherwise)."""
    return json.dumps(fields, sort_keys=True, allow_nan=False).encode()
