"""What a metered PDU's SNMP agent serves, and how its integers become watts: the OIDs to
get for one PDU (:func:`oids`) and the figure they give (:func:`figure`). Pure: the SNMP
client is ``channels.pdu``'s.

- **APC** (PowerNet-MIB, rPDU2, enterprise 318): ``rPDU2DeviceStatusPower`` (column 5 of
  ``rPDU2DeviceStatusTable``, 1.3.6.1.4.1.318.1.1.26.4.3.1) in hundredths of kW and
  ``rPDU2DeviceStatusApparentPower`` (column 16) in hundredths of kVA, indexed by the
  device (``pdu``); ``rPDU2OutletMeteredStatusActivePower`` (column 7 of
  ``rPDU2OutletMeteredStatusTable``, 1.3.6.1.4.1.318.1.1.26.9.4.3.1) in W, by outlet.
  The agent says -1 for a figure it does not have.
- **Raritan** (PDU2-MIB, enterprise 13742.6): ``measurementsInletSensorValue``
  (1.3.6.1.4.1.13742.6.5.2.3.1.4.pdu.inlet.sensorType) and
  ``measurementsOutletSensorValue`` (…6.5.4.3.1.4.pdu.outlet.sensorType), sensor types
  ``activePower`` (5) and ``apparentPower`` (6); each value is an integer to divide by
  10 ^ the sensor's ``DecimalDigits`` (column 7 of ``inletSensorConfigurationTable``
  …6.3.3.4.1 / ``outletSensorConfigurationTable`` …6.3.5.4.1), in the sensor's
  ``Units`` (column 6: watt(3), voltamp(4)); ``IsAvailable`` (column 2 of the
  measurements tables) false(2) for a sensor without a reading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from powerbudgetd.core.plausible import raw_sentinel

VENDORS = ("apc", "raritan")
APC_DEVICE = "1.3.6.1.4.1.318.1.1.26.4.3.1"
APC_OUTLET = "1.3.6.1.4.1.318.1.1.26.9.4.3.1"
RARITAN = "1.3.6.1.4.1.13742.6"
RARITAN_INLET_MEASURE = f"{RARITAN}.5.2.3.1"
RARITAN_OUTLET_MEASURE = f"{RARITAN}.5.4.3.1"
RARITAN_INLET_CONFIG = f"{RARITAN}.3.3.4.1"
RARITAN_OUTLET_CONFIG = f"{RARITAN}.3.5.4.1"
ACTIVE_POWER, APPARENT_POWER = 5, 6  # PDU2-MIB SensorTypeEnumeration
UNITS = {-1: "none", 0: "other", 1: "V", 2: "A", 3: "W", 4: "VA", 5: "Wh", 6: "VAh"}  # SensorUnitsEnumeration
MAX_DECIMAL_DIGITS = 6


class PduError(ValueError):
    """A PDU's answer that gives no figure: ``cause`` ``absent`` (an OID it does not
    serve: the wrong vendor, PDU, inlet or outlet) or ``garbled`` (not an integer)."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class Figure:
    """One poll's figure: ``value_w`` (real power, W, as the source states it);
    ``units``: the units the source gives it in (``W`` unless it says otherwise);
    ``apparent_va``: the apparent power beside it (None: not given); ``sentinel``: the
    raw value was a "no data" one (:func:`powerbudgetd.core.plausible.raw_sentinel`),
    ``value_w`` is then the raw value; ``resolution_w``: the figure's step (W);
    ``parts``: per outlet (name -> W), where outlets were read."""

    value_w: float
    units: str = "W"
    apparent_va: float | None = None
    sentinel: bool = False
    resolution_w: float = 1.0
    parts: Mapping[str, float] = field(default_factory=dict)


def oids(vendor: str, pdu: int, inlet: int, outlets: Sequence[int]) -> list[str]:
    """The OIDs to get in one poll, in the order :func:`figure` reads them."""
    if vendor == "apc":
        if outlets:
            return [f"{APC_OUTLET}.7.{n}" for n in outlets]
        return [f"{APC_DEVICE}.5.{pdu}", f"{APC_DEVICE}.16.{pdu}"]
    if vendor == "raritan":
        out: list[str] = []
        rows = [(RARITAN_OUTLET_MEASURE, RARITAN_OUTLET_CONFIG, n) for n in outlets] or [
            (RARITAN_INLET_MEASURE, RARITAN_INLET_CONFIG, inlet)]
        for measure, config, n in rows:
            for sensor in (ACTIVE_POWER, APPARENT_POWER):
                index = f"{pdu}.{n}.{sensor}"
                out += [f"{measure}.2.{index}", f"{measure}.4.{index}", f"{config}.6.{index}", f"{config}.7.{index}"]
        return out
    raise ValueError(f"vendor must be one of {VENDORS}, got {vendor!r}")


def figure(vendor: str, pdu: int, inlet: int, outlets: Sequence[int], values: Mapping[str, int | None]) -> Figure:
    """The figure in one poll's ``values`` (OID -> integer; None: the agent has no such
    object). Raises PduError ``absent`` for an object it does not serve, ``garbled``
    for a Raritan decimal-digits count out of range."""
    def get(oid: str) -> int:
        value = values.get(oid)
        if value is None:
            raise PduError("absent", f"the PDU serves no {oid}: check vendor, pdu, inlet and outlets")
        return value

    if vendor == "apc":
        if outlets:
            raws = {str(n): get(f"{APC_OUTLET}.7.{n}") for n in outlets}
            bad = [r for r in raws.values() if raw_sentinel(r)]
            if bad:
                return Figure(float(bad[0]), sentinel=True)
            return Figure(float(sum(raws.values())), resolution_w=1.0, parts={k: float(v) for k, v in raws.items()})
        raw_w, raw_va = get(f"{APC_DEVICE}.5.{pdu}"), get(f"{APC_DEVICE}.16.{pdu}")
        if raw_sentinel(raw_w):
            return Figure(float(raw_w), sentinel=True)
        apparent = None if raw_sentinel(raw_va) else raw_va * 10.0
        return Figure(raw_w * 10.0, apparent_va=apparent, resolution_w=10.0)  # hundredths of kW
    if vendor != "raritan":
        raise ValueError(f"vendor must be one of {VENDORS}, got {vendor!r}")
    rows = [(RARITAN_OUTLET_MEASURE, RARITAN_OUTLET_CONFIG, n) for n in outlets] or [
        (RARITAN_INLET_MEASURE, RARITAN_INLET_CONFIG, inlet)]
    total_w = total_va = 0.0
    has_va = True
    units: set[str] = set()
    resolution = 0.0
    parts: dict[str, float] = {}
    for measure, config, n in rows:
        read: dict[int, tuple[float, str, float] | None] = {}
        for sensor in (ACTIVE_POWER, APPARENT_POWER):
            index = f"{pdu}.{n}.{sensor}"
            available = values.get(f"{measure}.2.{index}")
            raw = values.get(f"{measure}.4.{index}")
            if sensor == APPARENT_POWER and (raw is None or available != 1):
                read[sensor] = None  # apparent power is optional: a check when present
                continue
            raw = get(f"{measure}.4.{index}")
            if available == 2 or raw_sentinel(raw):  # false(2): no reading
                if sensor == ACTIVE_POWER:
                    return Figure(float(raw), sentinel=True)
                read[sensor] = None
                continue
            digits = get(f"{config}.7.{index}")
            if not 0 <= digits <= MAX_DECIMAL_DIGITS:
                raise PduError("garbled", f"decimal digits {digits} for {measure}.4.{index}: not 0 to "
                                          f"{MAX_DECIMAL_DIGITS}")
            unit = UNITS.get(get(f"{config}.6.{index}"), "unknown units")
            read[sensor] = (raw / 10 ** digits, unit, 10.0 ** -digits)
        act, app = read[ACTIVE_POWER], read[APPARENT_POWER]
        assert act is not None
        total_w += act[0]
        units.add(act[1])
        resolution = max(resolution, act[2])
        if outlets:
            parts[str(n)] = act[0]
        if app is None or app[1] != "VA":
            has_va = False
        else:
            total_va += app[0]
    unit = units.pop() if len(units) == 1 else "mixed units"
    return Figure(total_w, unit, total_va if has_va else None, resolution_w=max(resolution, 1.0), parts=parts)
