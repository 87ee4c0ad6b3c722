"""Small helpers shared by the MQTT modules: payload text for logs, number checks."""

from __future__ import annotations

import math
from typing import Any

MAX_SHOWN_PAYLOAD = 64  # characters of a bad payload quoted back in logs and responses


def shown(payload: bytes | str) -> str:
    """A payload as text for a log line or a response, cut to :data:`MAX_SHOWN_PAYLOAD`."""
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    return text if len(text) <= MAX_SHOWN_PAYLOAD else text[:MAX_SHOWN_PAYLOAD] + "..."


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
