"""The tables of a scenario file (``scenario.py`` describes the format) as pydantic models.

Each refuses a key it does not know and a value of the wrong type; a phase's ``kind``
and an event's ``action`` say which keys the table needs and which it may give. Phases,
faults and events build their simulator objects (``Phase``, ``Fault``, ``BankEvent``)
while they are validated, so those objects' own checks report at the table's path
too. What needs the whole file (a preset bank's cards, an event's card index) is
checked where the scenario is assembled (``scenario.parse_scenario``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator

from powerbudgetd_sim.feed import FeedTable
from powerbudgetd_sim.libnvml import Fault
from powerbudgetd_sim.physics import ACTIONS, BankEvent
from powerbudgetd_sim.profiles import KINDS, Phase
from powerbudgetd_sim.tables import Builds, Kinded, Number, Table
from powerbudgetd_sim.traces import TRACES


def _known_trace(name: str) -> str:
    if name not in TRACES:  # Phase would raise KeyError (load_trace's)
        raise ValueError(f"{name!r} is not one of {', '.join(TRACES)}")
    return name


# The fields mirror the dataclasses' (tests/sim/test_scenario_files.py holds them to it);
# None stands for a key left out, so that the dataclass's own default applies.


class PhaseTable(Kinded):
    """One of a card's ``phases`` (see ``profiles.py`` for what each kind's keys mean)."""

    kind: str = "idle"
    at_s: Number
    workload: str | None = None
    power_w: Number | None = None
    high_w: Number | None = None
    low_w: Number | None = None
    on_s: Number | None = None
    off_s: Number | None = None
    from_w: Number | None = None
    to_w: Number | None = None
    over_s: Number | None = None
    trace: Annotated[str, AfterValidator(_known_trace)] | None = None
    offset_s: Number | None = None
    scale: Number | None = None
    KINDS = KINDS
    KEYS = {"constant": ({"power_w"}, set()), "square": ({"high_w"}, {"low_w", "on_s", "off_s"}),
            "ramp": ({"to_w"}, {"from_w", "over_s"}), "trace": (set(), {"trace", "offset_s", "scale"})}

    def build(self) -> Phase:
        return Phase(**self.given())


class EventTable(Kinded):
    """One of ``[[events]]`` (see ``physics.BankEvent``)."""

    action: str
    at_s: Number
    card: int
    every_s: Number | None = None
    limit_w: Number | None = None
    order: list[int] | None = None
    KINDS = ACTIONS
    KEYS = {"set_limit": ({"limit_w"}, set()), "floor": (set(), {"limit_w"}), "ceiling": (set(), {"limit_w"}),
            "bad_reading": (set(), {"limit_w"}), "reindex": ({"order"}, set())}

    def build(self) -> BankEvent:
        given = self.given()
        if "order" in given:
            given["order"] = tuple(given["order"])
        return BankEvent(**given)


class FaultTable(Builds):
    """One of ``[[faults]]`` (see ``libnvml.Fault``)."""

    call: str
    error: str
    card: int | None = None
    from_s: Number | None = None
    until_s: Number | None = None
    count: int | None = None
    delay_s: Number | None = None

    def build(self) -> Fault:
        return Fault(**self.given())


class CardTable(Table):
    """One of ``[[cards]]``: a preset ``model`` and/or a ``physics.CardSpec``'s keys."""

    model: str | None = None
    name: str | None = None
    uuid: str | None = None
    min_w: Number | None = None
    max_w: Number | None = None
    default_w: Number | None = None
    idle_w: Number | None = None
    tgp_w: Number | None = None
    has_instant: bool | None = None
    persistence_mode: bool | None = None
    reported_min_w: Number | None = None
    reported_max_w: Number | None = None
    ignores_writes: bool | None = None
    present: bool | None = None
    mig_devices: int | None = None
    vendor: Literal["nvidia", "amd", "intel"] | None = None
    phases: list[PhaseTable] | None = None


class ScenarioFeedTable(FeedTable):
    """``[feed]``: the feed's keys and a UPS battery's (see ``mains.py``)."""

    battery_wh: Number | None = None
    mains_lost: list[Any] | None = None  # Mains.from_feed says what each outage must be


class ScenarioTable(Table):
    """The file's top level."""

    name: str | None = None
    description: str = ""
    bank: str | None = None
    budget_w: Number | None = None
    duration_s: Number = 300.0
    seed: int = 1
    lag_s: Number = 0.1
    tick_s: Number = 0.1
    cards: list[CardTable] = []
    faults: list[FaultTable] = []
    events: list[EventTable] = []
    feed: ScenarioFeedTable | None = None
