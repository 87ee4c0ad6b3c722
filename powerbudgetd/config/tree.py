"""The power tree file: the operator's TOML description of feeds, PDUs, breakers and hosts.

::

    [nodes.row]                 # the site, or a row's panel: the root has no parent
    kind = "site"               # site, feed, ups, panel, pdu, circuit, outlet (for the reader)
    budget_w = 40000            # stated in wall W ...

    [nodes.feed-a]
    kind = "ups"
    parent = "row"
    ups_w = 30000               # ... or derived as [feed] derives one: a UPS's real
    # ups_margin = 0.1          #   watts x (1 - margin) on peaks, / transient_factor
    # transient_factor = 1.35
    # delegate = true           # its budget may be leased to its subtree (not the root)

    [nodes.r1-a]
    kind = "pdu"
    parent = "feed-a"
    meter = "mqtt:pdu/r1-a/power"  # its own meter (optional): a host under it that reads it
    # (ups:NAME@HOST, a wall meter's mqtt:TOPIC, a [pdu]'s pdu:HOST/inletN, a [bmc]'s
    # bmc:HOST) publishes it; the load no host reports is taken off the budget the hosts share
    breaker_a = 32              # breaker amps x volts x derating (continuous loads at
    volts = 230                 #   80 %), on averages; budget_w, where also given,
    # derating = 0.8            #   can only lower it

    [[pairs]]                   # a feed pair: the two sides a dual-corded host's cords part at
    feeds = ["feed-a", "feed-b"]
    mode = "oversubscribed"     # or "redundant" (the default for a pair not listed)
    shed_s = 2                  # oversubscribed: every host on the surviving side lowered within

    [hosts.r1-h01]
    cords = { r1-a = 0.5, r1-b = 0.5 }   # leaf -> share of the host's draw (one cord: 1.0)
    reserve_w = 900             # its seat: wall W it may always use
    priority = 1                # its class: higher keeps its watts longer (default 0)

    [sim]                       # read by `simulate --circuit --tree` only
    scenarios = { r1-h01 = "workstation-4" }
    feed_lost = "feed-a"
    lost_at_s = 60

A node's budget is wall watts on averages. A breaker trips on the average, so its line
is ``breaker_a x volts x derating``. A UPS trips on peaks (the brief: over 150 % in
under 0.5 s): the cards' instant draw reaches ``transient_factor`` times their limits,
so its line is ``ups_w x (1 - ups_margin) / transient_factor`` (the host's own draw
counted as spiking too: the safe side). The arithmetic is ``core.feed.Feed``'s, at the
plug (PSU efficiency 1, no host draw). Three-phase: state ``budget_w``.

Every problem is one line naming the node, host or pair and the field. The seats must
fit every node, failover counted (``core.tree``); a tree that does not fit is refused.
Config layer: imports only core and errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from powerbudgetd.config import parse_toml
from powerbudgetd.core.feed import DEFAULT_DERATING, DEFAULT_UPS_MARGIN, Feed
from powerbudgetd.core.nodemeter import check_source
from powerbudgetd.core.peaks import MEASURED_TRANSIENT_FACTOR, FeedLine
from powerbudgetd.core.tree import KINDS, MODES, Host, Node, Pair, PowerTree
from powerbudgetd.errors import ConfigError

Watts = Annotated[float, Field(gt=0, le=10_000_000)]
UpsWatts = Annotated[float, Field(gt=0, le=100_000)]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class NodeTable(_Table):
    """One ``[nodes.NAME]``: its parent, kind and budget (stated or derived)."""

    kind: str = "circuit"
    parent: str | None = None
    budget_w: Watts | None = None
    breaker_a: float | None = Field(None, gt=0, le=400)
    volts: float | None = Field(None, gt=0, le=480)
    derating: float = Field(DEFAULT_DERATING, gt=0, le=1)
    ups_w: UpsWatts | None = None
    delegate: bool = False
    ups_margin: float = Field(DEFAULT_UPS_MARGIN, ge=0, lt=1)
    transient_factor: float = Field(MEASURED_TRANSIENT_FACTOR, ge=1, le=3)
    meter: str | None = None

    @model_validator(mode="after")
    def _has_a_budget(self) -> NodeTable:
        if self.meter is not None:
            check_source(self.meter)
        if self.kind not in KINDS:
            raise ValueError(f"kind: {self.kind!r} is not one of {', '.join(KINDS)}")
        if (self.breaker_a is None) != (self.volts is None):
            raise ValueError("breaker_a and volts go together: the breaker's line is breaker_a x volts x derating")
        if self.budget_w is None and self.breaker_a is None and self.ups_w is None:
            raise ValueError("no budget: give budget_w (wall W), breaker_a with volts, or ups_w")
        return self

    def feed(self) -> Feed | None:
        """The node's devices as ``core.feed.Feed`` at the plug (efficiency 1, no host
        draw): its lines are then wall W. None without a breaker or UPS."""
        if self.breaker_a is None and self.ups_w is None:
            return None
        return Feed(breaker_a=self.breaker_a, volts=self.volts or 120.0, derating=self.derating, ups_w=self.ups_w,
                    ups_margin=self.ups_margin, psu_efficiency=1.0, host_w=0.0, transient_factor=self.transient_factor)

    def lines(self) -> list[FeedLine]:
        """The wall budget each stated device allows (breaker on averages, UPS on peaks)."""
        feed = self.feed()
        return [] if feed is None else feed.lines()

    def budget(self) -> float:
        """The least of ``budget_w`` and the devices' lines (wall W)."""
        stated = [] if self.budget_w is None else [self.budget_w]
        return min(stated + [line.board_budget_w for line in self.lines()])


class PairTable(_Table):
    """One ``[[pairs]]``: two sibling nodes and their mode."""

    feeds: list[str]
    mode: str = "redundant"
    shed_s: float | None = Field(None, gt=0, le=3600)

    @model_validator(mode="after")
    def _consistent(self) -> PairTable:
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if len(set(self.feeds)) != 2:
            raise ValueError(f"feeds: two different nodes, got {self.feeds}")
        if self.mode == "oversubscribed" and self.shed_s is None:
            raise ValueError("shed_s: oversubscribed needs the time within which the surviving side is shed (s)")
        if self.mode == "redundant" and self.shed_s is not None:
            raise ValueError("shed_s: only for oversubscribed (a redundant pair sheds nothing)")
        return self


class HostTable(_Table):
    """One ``[hosts.NAME]``: its cords, seat and class."""

    cords: dict[str, Annotated[float, Field(gt=0, le=1)]]
    reserve_w: Watts
    priority: int = Field(0, ge=-100, le=100)


class SimTable(_Table):
    """``[sim]``: what ``simulate --circuit --tree`` plays on this tree."""

    scenarios: dict[str, str] = {}
    feed_lost: str | None = None
    lost_at_s: float | None = Field(None, ge=0)


class TreeFile(_Table):
    """The whole file."""

    nodes: dict[str, NodeTable]
    pairs: list[PairTable] = []
    hosts: dict[str, HostTable] = {}
    sim: SimTable = SimTable()


def _where(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).removeprefix(".")


def _lines(exc: ValidationError) -> list[str]:
    """One line per pydantic error: the field's path, the reason, the value given."""
    out = []
    for err in exc.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] not in ("missing", "value_error") and not isinstance(value, dict):
            msg += f", got {value!r}"
        out.append(f"{_where(err['loc'])}: {msg}" if err["loc"] else msg)
    return out


def tree_from_dict(data: dict[str, Any]) -> tuple[PowerTree, TreeFile]:
    """The :class:`PowerTree` a parsed file describes, and the file's tables (for the
    budget lines and ``[sim]``). Raises ValueError with one problem per line."""
    try:
        file = TreeFile.model_validate(data)
    except ValidationError as exc:
        raise ValueError("\n".join(_lines(exc))) from None
    nodes = {name: Node(name, t.budget(), t.parent, t.kind, t.meter, delegate=t.delegate) for name, t in file.nodes.items()}
    hosts = {name: Host(name, dict(t.cords), t.reserve_w, t.priority) for name, t in file.hosts.items()}
    pairs = {frozenset(p.feeds): Pair(frozenset(p.feeds), p.mode, p.shed_s) for p in file.pairs}
    try:
        tree = PowerTree(nodes, hosts, pairs)
    except ValueError as exc:
        raise ValueError("\n".join(str(exc).split("; "))) from None
    problems = [*_delegate_problems(tree), *_pair_problems(tree, file), *_seat_problems(tree),
                *_sim_problems(tree, file.sim)]
    if problems:
        raise ValueError("\n".join(problems))
    return tree, file


def _delegate_problems(tree: PowerTree) -> list[str]:
    """``delegate`` on the root means nothing (no parent lends it watts): refused."""
    return [f"nodes.{n}.delegate: the root's budget has no parent to be leased from; mark the nodes below it"
            for n, node in tree.nodes.items() if node.delegate and node.parent is None]


def _pair_problems(tree: PowerTree, file: TreeFile) -> list[str]:
    parted = {tree.pair_of(h) for h in tree.hosts}
    out = []
    for i, pair in enumerate(file.pairs):
        missing = [f for f in pair.feeds if f not in tree.nodes]
        if missing:
            out.append(f"pairs[{i}].feeds: no node {', '.join(map(repr, missing))}")
        elif frozenset(pair.feeds) not in parted:
            out.append(f"pairs[{i}].feeds: no dual-corded host's cords part at {' and '.join(pair.feeds)}")
    return out


def _seat_problems(tree: PowerTree) -> list[str]:
    seats = {h: host.reserve_w for h, host in tree.hosts.items()}
    loads = tree.loads_w(seats)
    return [f"nodes.{n}: the seats (reserve_w) of the hosts below, failover counted, come to {loads[n]:.0f} W, "
            f"over its budget of {tree.nodes[n].budget_w:.0f} W by {over:.0f} W"
            for n, over in sorted(tree.over_w(seats).items())]


def _sim_problems(tree: PowerTree, sim: SimTable) -> list[str]:
    out = [f"sim.scenarios.{h}: no host {h!r}" for h in sim.scenarios if h not in tree.hosts]
    if sim.feed_lost is not None and sim.feed_lost not in tree.feeds():
        out.append(f"sim.feed_lost: {sim.feed_lost!r} is no side of a feed pair (feeds: {', '.join(tree.feeds())})")
    return out


def load_tree(path: str | Path) -> tuple[PowerTree, TreeFile]:
    """Read and check a tree file. Raises ConfigError: the file, then one line per problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such tree file")
    try:
        return tree_from_dict(parse_toml(path))
    except ValueError as exc:
        raise ConfigError(f"{path}: invalid power tree\n" + "\n".join(f"  {line}" for line in str(exc).splitlines())) from None
