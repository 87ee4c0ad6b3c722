"""``powerbudgetd check-config``: validate a config file and show how the budget follows.

The budget derivation is printed line by line, the way the brief does the arithmetic,
one line per protective device and what it is sized on (the arithmetic itself lives in
:mod:`powerbudgetd.core.peaks`):

    circuit       15 A x 120 V x 0.8 derating                         = 1440 W at the plug
    breaker line  on averages: 1440 W x 0.9 efficiency - 300 W host   =  996 W of board power
    UPS           1000 W x (1 - 0.1 margin)                           =  900 W at the plug
    UPS line      on peaks: (900 W x 0.9 efficiency - 300 W host) / 1.35 transient = 378 W
    budget        the lowest: the UPS line (peaks)                    =  378 W of board power

then whether peaks are covered at all, any budget_w above what a peak-rated device
allows, and whether the cards' floors were checked (only with ``--backend``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from powerbudgetd.core.peaks import FeedLine, peak_wall_w
from powerbudgetd.core.tree import PowerTree
from powerbudgetd.config import Settings, classify_env
from powerbudgetd.service.feasibility import budget_figures

LINE_LABELS = {"circuit": "breaker line", "UPS": "UPS line", "PSU": "PSU line"}


def _n(x: float) -> str:
    """A number as an operator writes it: 1440, 0.8, 249.5."""
    return f"{round(x, 3):g}"


def _w(x: float) -> str:
    """Watts to a tenth: 377.8."""
    return f"{round(x, 1):g}"


def _line_name(line: FeedLine) -> str:
    return f"the {LINE_LABELS[line.device]} ({line.basis}s)"


def derivation(settings: Settings, card_names: list[str] | None = None) -> list[tuple[str, str, float, str]]:
    """The budget arithmetic as rows of (label, expression, result W, what the W are)."""
    rows: list[tuple[str, str, float, str]] = []
    feed = settings.feed
    lines = feed.lines(card_names) if feed is not None else []
    if feed is not None:
        for line in lines:
            if line.device == "circuit":
                rows.append(("circuit", f"{_n(feed.breaker_a)} A x {_n(feed.volts)} V x {_n(feed.derating)} derating",
                             line.limit_w, "at the plug"))
            elif line.device == "UPS":
                rows.append(("UPS", f"{_n(feed.ups_w or 0)} W x (1 - {_n(feed.ups_margin)} margin)", line.limit_w,
                             "at the plug"))
            rows.append((LINE_LABELS[line.device], f"on {line.basis}s: {line.arithmetic}", line.board_budget_w,
                         "of board power"))
    if settings.budget_w is not None:
        rows.append(("budget_w", "as configured", settings.budget_w, "of board power"))
    if feed is not None:
        binding = min(lines, key=lambda line: line.board_budget_w)
        if settings.budget_w is not None and settings.budget_w <= binding.board_budget_w:
            how = "the lowest: budget_w"
        else:
            how = f"the lowest: {_line_name(binding)}" if len(lines) > 1 or settings.budget_w is not None \
                else f"from [feed]: {_line_name(binding)}"
    else:
        how = "budget_w (no [feed]: not checked against the plug)"
    rows.append(("budget", how, settings.effective_budget_w(card_names), "of board power"))
    return rows


def peak_notes(settings: Settings, card_names: list[str] | None = None) -> list[str]:
    """Whether the budget covers the cards' peaks, and any budget_w a peak line refuses."""
    feed = settings.feed
    budget = settings.effective_budget_w(card_names)
    if feed is None:
        from powerbudgetd.core.peaks import MEASURED_TRANSIENT_FACTOR as factor

        return [
            f"peaks: NOT covered: no [feed], so no UPS or PSU rating and no transient reserve: the cards' "
            f"instant peaks reach about {_n(factor)}x their limits ({_w(budget * factor)} W of board power at "
            f"{_w(budget)} W), which a UPS trips on within seconds. Add [feed] with ups_w (or psu_w)"
        ]
    factor = feed.factor(card_names)
    which = "the cards found" if card_names is not None else (
        "the highest configured: cards not read" if feed.transient_factors else "transient_factor")
    out = [f"transient factor: {_n(factor)} ({which})"]
    if not feed.peaks_covered:
        out.append(
            f"peaks: NOT covered: no UPS (ups_w) or PSU rating (psu_w) in [feed]; the circuit is sized on averages, "
            f"and the cards' peaks reach {_w(budget * factor)} W of board power, "
            f"{_w(peak_wall_w(budget, feed.host_w, feed.psu_efficiency, factor))} W at the plug"
        )
    else:
        for line in feed.lines(card_names):
            if line.basis != "peak":
                continue
            if line.device == "UPS":
                at = peak_wall_w(budget, feed.host_w, feed.psu_efficiency, factor)
                rating = feed.ups_w or 0.0
            else:
                at = budget * factor + feed.host_w
                rating = line.limit_w
            out.append(
                f"peaks: covered by the {line.device}: at {_w(budget)} W of limits, peaks x{_n(factor)} plus host reach "
                f"{_w(at)} W {'at the plug' if line.device == 'UPS' else 'of PSU output'}, "
                f"{at / rating:.0%} of its {_w(rating)} W"
            )
            if settings.budget_w is not None and settings.budget_w > line.board_budget_w + 1e-9:
                b = settings.budget_w
                over = (peak_wall_w(b, feed.host_w, feed.psu_efficiency, factor) if line.device == "UPS"
                        else b * factor + feed.host_w)
                what = (f"({_w(b)} W x {_n(factor)} + {_n(feed.host_w)} W host) / {_n(feed.psu_efficiency)}"
                        if line.device == "UPS" else f"{_w(b)} W x {_n(factor)} + {_n(feed.host_w)} W host")
                out.append(
                    f"warning: budget_w {_w(b)} W is above what the {line.device} allows on peaks: {what} = "
                    f"{_w(over)} W, {over / rating:.0%} of its {_w(rating)} W; the {LINE_LABELS[line.device]}, "
                    f"{_w(line.board_budget_w)} W, is in force"
                )
    return out


def describe(
    settings: Settings,
    path: Path,
    *,
    card_names: list[str] | None = None,
    floors: list[tuple[int, str, float | None, float | None]] | None = None,
    source: str | None = None,
    verdict: str = "valid",
) -> str:
    """The report ``check-config`` prints. ``floors``: (index, name, minimum limit W or
    None when not controlled, W counted for it when not controlled) of each card read
    from ``source``; None: not checked."""
    rows = derivation(settings, card_names)
    lw = max(len(r[0]) for r in rows)
    ew = max(len(r[1]) for r in rows)
    vw = max(len(_w(r[2])) for r in rows)
    lines = [f"{path}: {verdict}", "budget derivation:"]
    lines += [f"  {label:<{lw}}  {expr:<{ew}}  = {_w(w):>{vw}} W {unit}" for label, expr, w, unit in rows]
    lines += peak_notes(settings, card_names)
    if floors is None:
        if verdict == "valid":
            lines.append("floors: not checked (no --backend): run refuses a budget below the sum of the cards' "
                         "minimum limits; check-config --backend nvml reads them")
    else:
        known = [f for f in floors if f[2] is not None]
        lines.append(
            f"floors: checked on {len(floors)} card{'s' if len(floors) != 1 else ''} of {source}: minimum limits "
            f"{' + '.join(_w(f[2]) for f in known if f[2] is not None)} = "
            f"{_w(sum(f[2] for f in known if f[2] is not None))} W, within the "
            f"{_w(settings.reserve_budget_w(card_names))} W budget"
            + (" and every other below" if len(budget_figures(settings, card_names)) > 1 else "")
        )
        lines += [f"  GPU {index} ({name}): not controlled, counted at {_w(counted)} W"
                  for index, name, lo, counted in floors if lo is None and counted is not None]
    figures = budget_figures(settings, card_names)
    if len(figures) > 1 or figures[0].source != "budget":  # the budget alone is the derivation's last line
        lines += [f"  {f.source}: {_w(f.budget_w)} W, from {f.origin}" for f in figures]
    c = settings.control
    lines.append(
        f"control: tick {_n(c.tick_s)} s, donor hold {_n(c.donor_hold_s)} s, recipient hold "
        f"{_n(c.recipient_hold_s)} s, release hold {_n(c.release_hold_s)} s, failsafe hold {_n(c.failsafe_hold_s)} s"
    )
    for key, card in sorted(settings.cards.items()):
        what = ["excluded"] if card.exclude else []
        what += [f"max {_n(card.max_w)} W"] if card.max_w is not None else []
        what += [f"priority {card.priority}"] if card.priority else []
        lines.append(f"card {key}: {', '.join(what) or 'defaults'}")
    lines.append(
        "persistence mode: " + ("turned on at boot where off" if settings.enable_persistence_mode else "checked at boot, warned about where off")
    )
    env = classify_env()
    used = [n for n in env.overrides if not any(n in w for w in settings.warnings)]
    if used:
        lines.append(f"environment overrides: {', '.join(used)}")
    if env.links:
        lines.append(f"not settings, ignored (service links an orchestrator sets): {', '.join(env.links)}")
    lines += meter_reach_lines(settings)
    lines += [f"warning: {w}" for w in settings.warnings]
    return "\n".join(lines)


def meter_sources(settings: Settings) -> dict[str, tuple[str, Any]]:
    """The meters this host closes a loop on: source id -> (what it is, its section)."""
    out: dict[str, tuple[str, Any]] = {}
    if settings.ups is not None and settings.ups.measured_load and settings.feed is not None:
        out[settings.ups.source_id()] = ("UPS measured load", settings.ups)
    meter = settings.mqtt.wall_meter if settings.mqtt is not None else None
    if meter is not None:
        out[meter.source_id()] = ("wall meter", meter)
    return out


def meter_reach_lines(settings: Settings) -> list[str]:
    """Which rule applies to each measured source's loop (``core.sensor.Reach``): the
    meter this host's alone, or shared by ``hosts`` / this host's ``share``; how other
    hosts behind it are seen; with ``[circuit]``, that a tree node naming it holds the
    hosts under it to it (``check-config --tree`` says which node)."""
    out = []
    for source, (what, section) in meter_sources(settings).items():
        key = "[ups]" if what.startswith("UPS") else "[mqtt.wall_meter]"
        out.append(f"{what} ({source}): {section.reach().describe()} ({key} hosts / share)")
        if settings.mqtt is not None:
            out.append(f"  other powerbudgetd hosts reading {source} are seen on {settings.mqtt.meters_topic}/+: "
                       f"more than {section.reach().hosts} without a share, or loop gains summing above 1 (each announces "
                       f"its own: {section.reach().fraction:.3g} here), is warned of (meter_shared_unconfigured)")
        else:
            out.append("  without [mqtt] no other host behind it is seen: the configured hosts / share is trusted")
        if settings.circuit is not None:
            out.append(f"  with [circuit]: where a node of the power tree names meter = {source!r}, this host publishes "
                       "its reading and the load no host reports is taken off that node's budget (the tree's "
                       "division); this loop keeps its configured hosts / share")
    if settings.pdu is not None:
        pdu = settings.pdu
        limit = pdu.limit_w if pdu.limit_w is not None else (settings.feed.feed().wall_limit_w() if settings.feed else None)
        out.append(f"PDU over SNMP v{pdu.version}: {pdu.where()}, held to {_w(limit or 0)} W at the plug "
                   f"({'limit_w' if pdu.limit_w is not None else '[feed]'}), every {_n(pdu.poll_s)} s; "
                   f"{pdu.reach().describe()} ([pdu] {'outlets' if pdu.outlets else 'hosts / share'})")
    if settings.bmc is not None:
        bmc = settings.bmc
        limit = bmc.limit_w if bmc.limit_w is not None else (settings.feed.feed().wall_limit_w() if settings.feed else None)
        out.append(f"BMC over Redfish: {bmc.url}{f' chassis {bmc.chassis}' if bmc.chassis else ''}, held to "
                   f"{_w(limit or 0)} W at the plug ({'limit_w' if bmc.limit_w is not None else '[feed]'}), every "
                   f"{_n(bmc.poll_s)} s; the host's own draw")
    if settings.rapl is not None and settings.feed is not None:
        rapl = settings.rapl
        out.append(f"host draw from RAPL: the CPU packages under {rapl.root} + other_w {_n(rapl.other_w)} W, over "
                   f"{_n(rapl.window_s)} s windows; where above [feed] host_w {_n(settings.feed.host_w)} W it lowers "
                   "the feed's budget (never raises it)")
    return out


# WatchdogSec in the packaged unit (systemd/powerbudgetd.service; a test keeps them equal):
# how long a frozen daemon runs on before systemd kills it.
PACKAGED_WATCHDOG_S = 10.0


def tree_place(settings: Settings, tree: PowerTree) -> tuple[list[str], list[str]]:
    """This host's place in a power tree (``check-config --tree``): (lines to print,
    problems). The host is ``[circuit] host``; a problem: no ``[circuit]``, a host the
    tree does not name, or a ``reserve_w`` above the seat the tree counts for it."""
    if settings.circuit is None:
        return [], ["--tree needs [circuit]: its host names this host in the tree"]
    name, reserve = settings.circuit.host, settings.circuit.reserve_w
    host = tree.hosts.get(name)
    if host is None:
        return [], [f"[circuit] host {name!r} is not in the tree (hosts: {', '.join(sorted(tree.hosts))})"]
    cords = ", ".join(f"{leaf} ({share:.0%}) <- {' <- '.join(tree.path(leaf)[1:])}" for leaf, share in host.cords.items())
    pair = tree.pair_of(name)
    mode = tree.mode_of(name)
    shed = next((p.shed_s for p in tree.pairs.values() if p.feeds == pair and p.shed_s is not None), None)
    lines = [f"power tree: host {name}, class {host.priority}: {cords}",
             "  " + (f"feed pair {' / '.join(sorted(pair))}: {mode}" + (f", shed within {_n(shed)} s" if shed else "")
                     if pair else "single-corded: its whole draw on one cord")]
    seats = {h: other.reserve_w for h, other in tree.hosts.items()}
    grant = tree.largest_grant_w(name, seats)
    lines.append(f"  seat {_w(host.reserve_w)} W in the tree; the largest grant beside every other seat: {_w(grant)} W")
    problems = []
    if reserve > host.reserve_w + 1e-9:
        problems.append(f"[circuit] reserve_w {_w(reserve)} W is above this host's seat in the tree ({_w(host.reserve_w)} W): "
                        "the tree would not count the difference")
    elif reserve < host.reserve_w - 1e-9:
        lines.append(f"  note: [circuit] reserve_w {_w(reserve)} W is below the tree's seat: the tree keeps the difference idle")
    on_paths = {n for leaf in host.cords for n in tree.path(leaf)}
    for source, (what, _section) in meter_sources(settings).items():
        named = sorted(n for n, node in tree.nodes.items() if node.meter == source)
        mine = [n for n in named if n in on_paths]
        if mine:
            lines.append(f"  {what} {source} is the meter of node{'s' if len(mine) > 1 else ''} {', '.join(mine)}: "
                         "this host publishes its reading; the load no host reports is taken off the node's budget")
        elif named:
            problems.append(f"{what} {source} is the meter of node {', '.join(named)}, which is not on this host's "
                            "cords' paths: its reading would count another branch's hosts")
        else:
            lines.append(f"  {what} {source}: no node of the tree names it (meter = ...): its configured hosts / "
                         "share applies alone")
    metered = sorted(n for n in on_paths if tree.nodes[n].meter is not None
                     and tree.nodes[n].meter not in meter_sources(settings))
    if metered:
        lines.append("  metered nodes above it read by other hosts: " + ", ".join(
            f"{n} ({tree.nodes[n].meter})" for n in metered))
    ups = settings.ups
    if ups is not None and ups.feed is not None:
        if ups.feed in tree.feeds():
            lines.append(f"  UPS {ups.name}@{ups.host} carries feed {ups.feed}: marked lost in the circuit while it is "
                         "on battery")
        else:
            problems.append(f"[ups] feed {ups.feed!r} is no feed of the tree (feeds: {', '.join(tree.feeds()) or 'none'})")
    frozen_s = PACKAGED_WATCHDOG_S + settings.circuit.fallback_s
    if mode == "oversubscribed" and shed is not None and frozen_s > shed:
        lines.append(f"  note: a frozen daemon sheds only once its watchdog kills it and the failsafe lowers its cards: "
                     f"WatchdogSec ({_n(PACKAGED_WATCHDOG_S)} s in the packaged unit) + fallback_s "
                     f"({_n(settings.circuit.fallback_s)} s) = {_n(frozen_s)} s, beyond the pair's {_n(shed)} s: the "
                     "surviving side must tolerate the overload that long, or shorten both")
    return lines, problems
