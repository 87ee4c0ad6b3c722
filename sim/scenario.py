"""Scenarios: a bank, a budget, each card's demand, a duration and a seed (TOML).

A scenario file (see ``scenarios/*.toml`` for commented examples)::

    name = "workstation-4"           # defaults to the file name
    description = "..."
    bank = "workstation-4"           # a preset bank (BANKS) or omit and list cards
    budget_w = 1000                  # defaults to the preset bank's budget
    duration_s = 300
    seed = 1
    lag_s = 0.1                      # a written limit takes effect after this
    tick_s = 0.1                     # the controller's tick

    [[cards]]                        # one table per card, in index order
    model = "rtx-pro-6000-maxq"      # a preset card (MODELS), or give the numbers:
    # name = "..."; min_w = 150; max_w = 300; default_w = 300; idle_w = 30; tgp_w = 300
    # has_instant = false            # an older card without field 186
    # persistence_mode = false       # boots with persistence mode off
    phases = [                       # demand over time (see profiles.py for the kinds)
      { at_s = 0, kind = "idle" },
      { at_s = 60, kind = "trace", trace = "h200-serving" },
    ]

An optional ``[feed]`` table states the box's electrical feed (host draw, PSU efficiency,
breaker, volts, UPS; see ``feed.py``); the scoreboard uses it to tell whether a breaker or
UPS would have tripped. With ``battery_wh`` and ``mains_lost`` (see ``mains.py``) the UPS
goes on battery and comes back at the given times; powerbudgetd hears it as a UPS
behind NUT would tell it, and the scoreboard shows the runtime each policy leaves.

With a preset ``bank``, ``[[cards]]`` entries override that bank's cards by position
(only the keys they give); cards not listed stay idle.

Faults and misbehaviours, so a case can be scripted without writing Python::

    [[faults]]                       # an NVML call fails (see libnvml.Fault)
    call = "nvmlDeviceSetPowerManagementLimit"   # or "*" for every call
    error = "NO_PERMISSION"          # NVML error name ("NOT_SUPPORTED" per call, ...),
                                     # "SLOW" (a real-time hang of delay_s) or
                                     # "HANG" (delay_s of bank time: the caller's deadline
                                     # passes, a write lands when the call returns)
    card = 1                         # omit: every card, and nvmlInit
    from_s = 3.0                     # active from (bank time, s) ...
    until_s = 10.0                   # ... until (omit: forever)
    count = 2                        # only the first N matching calls
    delay_s = 2.0                    # SLOW: real seconds per call; HANG: bank seconds

    [[events]]                       # behind the daemon's back (see physics.BankEvent)
    at_s = 5.0
    card = 0
    action = "set_limit"             # another tool writes a limit ...
    limit_w = 350
    every_s = 30                     # ... and again every 30 s
    # action = "reset"               # driver reload / GPU reset: back to default
    # action = "floor"; limit_w = 300  # an outside limiter holds enforced >= 300 W
    # action = "ceiling"; limit_w = 200  # ... or <= 200 W (no limit_w: it lets go)
    # action = "appear" / "disappear"  # the card comes onto / falls off the bus
    # action = "reindex"; order = [1, 0]  # NVML enumerates the cards in a new order
    # action = "bad_reading"; limit_w = -5  # power reads an impossible value (no limit_w: sane)
    # action = "freeze" / "unfreeze"   # power readings stop moving while energy does not

    # per card: constraints NVML reports that differ from the real ones, and a card
    # whose limit stays put whatever is written:
    # reported_min_w = 5; reported_max_w = 95; ignores_writes = true
    # present = false                # not on the bus at start (an "appear" event brings it)
    # mig_devices = 2                # MIG mode on, with 2 MIG devices (their own handles)
    # vendor = "amd"                 # served by the simulated hwmon tree (amdgpu), not NVML

Every table is checked as it is read (``scenario_tables``: pydantic, as the daemon's
config is): an unknown key, a value of the wrong type (``"300"`` is not a number), a key
that a phase's ``kind`` or an event's ``action`` needs and lacks or has no use for, is a
ScenarioError naming the file, the table, its index and the key, one line per problem.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from powerbudgetd_sim.libnvml import Fault
from powerbudgetd_sim.mains import MAINS_KEYS, Mains
from powerbudgetd_sim.physics import BankEvent, CardSpec
from powerbudgetd_sim.profiles import Phase, Profile
from powerbudgetd_sim.scenario_tables import CardTable, ScenarioTable
from powerbudgetd_sim.tables import problems

# Card models. Limits from the brief's reference banks; idle draws: H200 measured
# (80-125 W), the workstation cards' assumed (not measured).
MODELS: dict[str, dict[str, Any]] = {
    "rtx-pro-6000-maxq": dict(
        name="NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        min_w=150.0, max_w=300.0, default_w=300.0, idle_w=30.0,  # min assumed until probed
    ),
    "rtx-6000-ada": dict(
        name="NVIDIA RTX 6000 Ada Generation", min_w=100.0, max_w=300.0, default_w=300.0, idle_w=25.0,
    ),
    "h200": dict(name="NVIDIA H200", min_w=200.0, max_w=700.0, default_w=700.0, idle_w=80.0),
    # AMD's documented 750 W board power; the floor and idle draw are assumed, not measured.
    "mi300x": dict(name="AMD Instinct MI300X", min_w=300.0, max_w=750.0, default_w=750.0, idle_w=140.0, vendor="amd"),
}

# The brief's reference banks: (card model, count, budget W).
BANKS: dict[str, tuple[str, int, float]] = {
    "workstation-4": ("rtx-pro-6000-maxq", 4, 1000.0),
    "ada-2": ("rtx-6000-ada", 2, 400.0),
    "h200-1": ("h200", 1, 700.0),
    "hgx-8": ("h200", 8, 4400.0),
}


class ScenarioError(ValueError):
    """A scenario file is invalid; the message names the file and the key, one line per problem."""


@dataclass(frozen=True)
class Scenario:
    name: str
    budget_w: float
    cards: tuple[CardSpec, ...]
    duration_s: float = 300.0
    seed: int = 1
    lag_s: float = 0.1
    tick_s: float = 0.1
    description: str = ""
    faults: tuple[Fault, ...] = ()
    events: tuple[BankEvent, ...] = ()
    feed: dict[str, Any] = field(default_factory=dict)  # without the mains keys
    mains: Mains | None = None  # a UPS battery and mains outages, from [feed]

    def shifted(self, offset_s: float) -> Scenario:
        """The same scenario with every card's demand ``offset_s`` (s) ahead: the demand at
        t is the one the scenario gives at t + ``offset_s``. Faults, events and the mains
        keep their times."""
        cards = tuple(dataclasses.replace(c, profile=dataclasses.replace(c.profile, shift_s=c.profile.shift_s + offset_s))
                      for c in self.cards)
        return dataclasses.replace(self, cards=cards)


def scenario_dir() -> Path:
    return Path(str(resources.files("powerbudgetd_sim") / "scenarios"))


def list_scenarios() -> list[tuple[str, str]]:
    """(name, description) of every packaged scenario."""
    out = []
    for path in sorted(scenario_dir().glob("*.toml")):
        sc = load_scenario(path)
        out.append((sc.name, sc.description))
    return out


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a packaged scenario by name, or a TOML file by path. Raises ScenarioError."""
    path = Path(name_or_path)
    if not path.suffix:
        path = scenario_dir() / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(scenario_dir().glob("*.toml")))
        raise ScenarioError(f"no scenario {str(name_or_path)!r}: not a file, nor one of: {known}")
    from powerbudgetd.config import parse_toml  # one reader for every TOML file: encodings, depth
    from powerbudgetd.errors import ConfigError

    try:
        data = parse_toml(path)
    except ConfigError as exc:
        raise ScenarioError(str(exc)) from None
    try:
        return parse_scenario(data, default_name=path.stem)
    except ScenarioError as exc:
        raise ScenarioError("\n".join(f"{path}: {line}" for line in str(exc).splitlines())) from None


# A run shorter than a few ticks reports nothing meaningful (the controller has not
# even booted); one longer than a week of simulated time is a typo that runs for hours.
MIN_DURATION_S = 1.0
MAX_DURATION_S = 7 * 86400.0


def check_duration(duration_s: float, what: str = "duration_s") -> float:
    """``duration_s`` when within [MIN_DURATION_S, MAX_DURATION_S]; else ScenarioError
    naming ``what`` and the bounds."""
    if not MIN_DURATION_S <= duration_s <= MAX_DURATION_S:
        raise ScenarioError(f"{what} {duration_s:g} s is out of range: simulate between {MIN_DURATION_S:g} s "
                            f"and {MAX_DURATION_S:g} s (7 days)")
    return duration_s


def parse_scenario(data: dict[str, Any], default_name: str = "scenario") -> Scenario:
    """The scenario a parsed TOML file describes. Raises ScenarioError, one line per problem."""
    try:
        top = ScenarioTable.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError("\n".join(problems(exc, ScenarioTable))) from None
    tables, budget, model = list(top.cards), top.budget_w, None
    if top.bank is not None:
        if top.bank not in BANKS:
            raise ScenarioError(f"bank: {top.bank!r} is not one of {', '.join(BANKS)}")
        model, count, budget = BANKS[top.bank]
        if len(tables) > count:
            raise ScenarioError(f"cards: bank {top.bank} has {count} cards, {len(tables)} given")
        tables += [CardTable() for _ in range(count - len(tables))]
        budget = top.budget_w if top.budget_w is not None else budget
    elif not tables:
        raise ScenarioError("give a preset 'bank' or at least one [[cards]] table")
    if budget is None or budget <= 0:
        raise ScenarioError(f"budget_w must be a positive number of watts, got {budget!r}")
    cards = tuple(_card(i, t, model) for i, t in enumerate(tables))
    for what, indices in (("faults", [f.card for f in top.faults]), ("events", [e.card for e in top.events])):
        for i, card in enumerate(indices):
            if card is not None and not 0 <= card < len(cards):
                raise ScenarioError(f"{what}[{i}].card: card {card} is not in this {len(cards)}-card bank")
    feed = dict(data.get("feed", {}))  # as the file orders it: validated above
    try:
        mains = Mains.from_feed(feed)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    return Scenario(
        name=top.name if top.name is not None else default_name,
        budget_w=float(budget),
        cards=cards,
        duration_s=check_duration(float(top.duration_s)),
        seed=top.seed,
        lag_s=float(top.lag_s),
        tick_s=float(top.tick_s),
        description=top.description,
        faults=tuple(f.built for f in top.faults),
        events=tuple(e.built for e in top.events),
        feed={k: v for k, v in feed.items() if k not in MAINS_KEYS},
        mains=mains,
    )


def _card(index: int, table: CardTable, bank_model: str | None) -> CardSpec:
    """Card ``index``: its model's preset (a preset bank's by default) under the keys given."""
    given = table.given()
    model, phases = given.pop("model", bank_model), given.pop("phases", None)
    if model is not None and model not in MODELS:
        raise ScenarioError(f"cards[{index}].model: {model!r} is not one of {', '.join(MODELS)}")
    base = {**(MODELS[model] if model else {}), **given}
    missing = {"name", "min_w", "max_w", "default_w", "idle_w"} - set(base)
    if missing:
        raise ScenarioError(f"cards[{index}]: missing {', '.join(sorted(missing))} (or give a model)")
    base.setdefault("uuid", f"GPU-5151{index:04d}-0000-4000-8000-{index:012d}")
    try:
        return CardSpec(profile=Profile(tuple(p.built for p in phases) if phases is not None else (Phase(0.0, "idle"),)),
                        **base)
    except ValueError as exc:
        raise ScenarioError(f"cards[{index}]: {exc}") from None
