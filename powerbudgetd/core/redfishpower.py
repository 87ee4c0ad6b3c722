"""Where a BMC's Redfish service gives the chassis' power, and the figure in each answer.
Pure: the HTTP client is ``channels.bmc``'s.

A Chassis resource links its power two ways (DMTF Redfish):

- ``EnvironmentMetrics`` (2020.4 on, the newer schema): ``PowerWatts.Reading`` (W, a
  SensorPowerExcerpt);
- ``Power`` (deprecated in 2020.4, what most BMCs in service serve):
  ``PowerControl[0].PowerConsumedWatts`` (W; the first control is the chassis' whole
  input, as every vendor's BMC fills it).

The newer is preferred where a chassis has both. A figure that is ``null``, missing or
not a number is no figure (:class:`RedfishError` ``absent``); a "no data" value (0,
0xFFFF...) is left to the plausibility rule (``core.plausible``), which refuses it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

KINDS = ("EnvironmentMetrics", "Power")


class RedfishError(ValueError):
    """An answer without the figure: ``cause`` ``absent`` (no power link, no reading) or
    ``garbled`` (not the shape Redfish states)."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


def _link(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if isinstance(value, Mapping) and isinstance(value.get("@odata.id"), str):
        return str(value["@odata.id"])
    return None


def members(collection: Mapping[str, Any]) -> list[str]:
    """The ``@odata.id`` of each member of a Redfish collection (the Chassis)."""
    items = collection.get("Members")
    if not isinstance(items, list):
        raise RedfishError("garbled", "a collection without a Members list")
    return [str(m["@odata.id"]) for m in items if isinstance(m, Mapping) and isinstance(m.get("@odata.id"), str)]


def power_links(chassis: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The chassis' power resources, preferred first: (kind, path) with kind one of
    :data:`KINDS`."""
    return [(kind, path) for kind in KINDS if (path := _link(chassis, kind)) is not None]


def watts(kind: str, doc: Mapping[str, Any]) -> float:
    """The chassis' power (W) in a resource of ``kind``. Raises RedfishError."""
    if kind == "EnvironmentMetrics":
        excerpt = doc.get("PowerWatts")
        value = excerpt.get("Reading") if isinstance(excerpt, Mapping) else None
        where = "EnvironmentMetrics PowerWatts.Reading"
    elif kind == "Power":
        controls = doc.get("PowerControl")
        first = controls[0] if isinstance(controls, list) and controls else None
        value = first.get("PowerConsumedWatts") if isinstance(first, Mapping) else None
        where = "Power PowerControl[0].PowerConsumedWatts"
    else:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if value is None:
        raise RedfishError("absent", f"the BMC gives no {where} (null or missing)")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RedfishError("garbled", f"{where} is not a number: {str(value)[:40]!r}")
    return float(value)
