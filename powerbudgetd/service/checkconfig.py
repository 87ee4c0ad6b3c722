"""``powerbudgetd check-config``: validate a config file and show how the budget follows.

The budget derivation is printed line by line, the way the brief does the arithmetic:

    circuit   15 A x 120 V x 0.8 derating  = 1440 W at the plug
    ...
    budget    the lower of [feed] and budget_w = 996 W of board power
"""

from __future__ import annotations

from pathlib import Path

from powerbudgetd.service.config import Settings, classify_env


def _n(x: float) -> str:
    """A number as an operator writes it: 1440, 0.8, 249.5."""
    return f"{round(x, 3):g}"


def derivation(settings: Settings) -> list[tuple[str, str, float, str]]:
    """The budget arithmetic as rows of (label, expression, result W, what the W are)."""
    rows: list[tuple[str, str, float, str]] = []
    feed = settings.feed
    if feed is not None:
        circuit = feed.circuit_w()
        rows.append(("circuit", f"{_n(feed.breaker_a)} A x {_n(feed.volts)} V x {_n(feed.derating)} derating",
                     circuit, "at the plug"))
        ups = feed.ups_limit_w()
        if ups is not None:
            rows.append(("UPS", f"{_n(feed.ups_w or 0)} W x (1 - {_n(feed.ups_margin)} margin)", ups, "at the plug"))
            rows.append(("tightest", "the UPS" if ups < circuit else "the circuit", feed.wall_limit_w(), "at the plug"))
        wall = feed.wall_limit_w()
        dc = wall * feed.psu_efficiency
        rows.append(("x efficiency", f"{_n(wall)} W x {_n(feed.psu_efficiency)} PSU efficiency", dc, "out of the PSU"))
        rows.append(("- host", f"{_n(dc)} W - {_n(feed.host_w)} W host draw", feed.board_budget_w(), "of board power"))
    if settings.budget_w is not None:
        rows.append(("budget_w", "as configured", settings.budget_w, "of board power"))
    if feed is not None and settings.budget_w is not None:
        which = "[feed]" if feed.board_budget_w() < settings.budget_w else "budget_w"
        how = f"the lower of [feed] and budget_w: {which}"
    elif feed is not None:
        how = "from [feed]"
    else:
        how = "budget_w (no [feed]: not checked against the plug)"
    rows.append(("budget", how, settings.effective_budget_w(), "of board power"))
    return rows


def describe(settings: Settings, path: Path) -> str:
    """The report ``check-config`` prints for a valid file."""
    rows = derivation(settings)
    lw = max(len(r[0]) for r in rows)
    ew = max(len(r[1]) for r in rows)
    vw = max(len(_n(r[2])) for r in rows)
    lines = [f"{path}: valid", "budget derivation:"]
    lines += [f"  {label:<{lw}}  {expr:<{ew}}  = {_n(w):>{vw}} W {unit}" for label, expr, w, unit in rows]
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
    lines += [f"warning: {w}" for w in settings.warnings]
    return "\n".join(lines)
