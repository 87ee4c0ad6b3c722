"""The controller as ``run`` builds it, shared with ``check-config --backend``.

One path from a config and an NVML layer to a started controller, so that
``check-config`` refuses exactly the budgets ``run`` refuses: the budget for the cards
found (their model names pick the transient factor), checked against their floors by
:meth:`Controller.start` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from powerbudgetd.control.cardset import START_TIMEOUT_S
from powerbudgetd.control.controller import Controller
from powerbudgetd.core.units import to_mw, to_w
from powerbudgetd.errors import BudgetInfeasible
from powerbudgetd.hw.calls import DeadlineCalls, InlineCalls
from powerbudgetd.hw.card import CardBackend
from powerbudgetd.config import Settings


@dataclass(frozen=True)
class BudgetFigure:
    """One budget the bank may be held to (board W), ``source`` naming it and ``origin``
    saying where the figure comes from (the settings and the arithmetic)."""

    source: str
    budget_w: float
    origin: str


def _n(x: float) -> str:
    return f"{round(x, 1):g}"


def reserve_figure(settings: Settings, names: Sequence[str] | None = None) -> BudgetFigure:
    """The budget boot and ``failsafe`` hold the cards to: the configured one, or with a
    ``[circuit]`` the reserve through the feed model when that is lower."""
    configured = settings.effective_budget_w(names)
    if settings.circuit is None:
        return BudgetFigure("budget", configured, "budget_w / [feed]")
    power = settings.circuit.host_power(settings.feed)
    board = power.board_budget_w()
    if board >= configured:
        return BudgetFigure("budget", configured, "budget_w / [feed] (below the circuit reserve)")
    origin = (f"[circuit] reserve_w {_n(power.reserve_w)} W at the wall x {_n(power.feed.psu_efficiency)} PSU "
              f"efficiency - {_n(power.feed.host_w or 0.0)} W host")
    return BudgetFigure("circuit reserve", board, origin)


def budget_figures(settings: Settings, names: Sequence[str] | None = None) -> list[BudgetFigure]:
    """Every budget a source may hold the bank to, lowest last: the configured budget
    (or the circuit reserve below it) and, with ``[ups]``, the on-battery budget. (A low
    battery holds every card at its floor by design; a remote budget is refused below
    the floors by the channel itself.)"""
    figures = [reserve_figure(settings, names)]
    ups = settings.ups
    if ups is not None:
        configured = settings.effective_budget_w(names)
        if ups.on_battery_budget_w is not None:
            on_battery = min(ups.on_battery_budget_w, configured)
            origin = f"[ups] on_battery_budget_w {_n(ups.on_battery_budget_w)} W"
        else:
            fraction = ups.battery_fraction() or 0.0
            on_battery = configured * fraction
            origin = f"[ups] on_battery_fraction {fraction:g} x {_n(configured)} W"
        figures.append(BudgetFigure("UPS on battery", on_battery, origin))
    return figures


def check_figures(ctl: Controller, figures: Sequence[BudgetFigure]) -> None:
    """Raise BudgetInfeasible, naming the figure and where it comes from, for the first
    of ``figures`` below what ``ctl``'s cards can be held to (``ctl`` started)."""
    for f in figures:
        try:
            ctl.bank.check_feasible(to_mw(f.budget_w))
        except BudgetInfeasible as exc:
            raise BudgetInfeasible(f"{f.source} {_n(f.budget_w)} W ({f.origin}): {exc}") from None


def card_names(nvml: CardBackend, calls: InlineCalls | None = None) -> list[str]:
    """The model name of every card, in index order (NVML must be initialised); through
    ``calls`` (the controller's deadline) where given, as the controller's own enumeration."""
    found = (calls or InlineCalls()).call("bank", nvml.devices, timeout_s=START_TIMEOUT_S)
    return [info.name for info in found]


def make_controller(
    nvml: CardBackend,
    settings: Settings,
    *,
    dry_run: bool = False,
    calls: InlineCalls | None = None,
    clock: Callable[[], float] | None = None,
) -> Controller:
    """The controller ``run`` uses, at the budget in force for the cards found (with a
    ``[circuit]``: within the reserve; a grant comes later, through the arbiter)."""
    return Controller(
        nvml, settings.reserve_budget_w(card_names(nvml, calls)), settings.control.timings(), dry_run=dry_run,
        overrides=settings.overrides(), allow_monitor_only=settings.allow_monitor_only, calls=calls, clock=clock,
    )


def floors(ctl: Controller) -> list[tuple[int, str, float | None, float | None]]:
    """Each card of a started controller as ``check-config`` reports it: (index, name,
    minimum limit W where controlled, W it is counted at where not: read afresh, by the
    bound the controller and ``failsafe`` count it at)."""
    return [(c.index, c.info.name, to_w(c.min_mw) if c.controllable else None,
             None if c.controllable else to_w(ctl.bank.counted_mw(c))) for c in ctl.cards]


def check_feasible(nvml: CardBackend, settings: Settings, calls: InlineCalls | None = None) -> Controller:
    """Enumerate the cards and check every budget a source may hold them to
    (:func:`budget_figures`) against their floors, writing nothing; NVML calls through
    ``calls`` (see :func:`start_at_reserve`).

    Returns the started (dry-run) controller; raises BudgetInfeasible naming the budget,
    where it comes from, and each card's floor against its share, or NvmlError.
    """
    ctl = start_at_reserve(nvml, settings, calls)
    check_figures(ctl, budget_figures(settings, [c.info.name for c in ctl.cards]))
    return ctl


def start_at_reserve(nvml: CardBackend, settings: Settings, calls: InlineCalls | None = None) -> Controller:
    """The dry-run controller started at the budget boot holds the cards to (the circuit
    reserve where lower: :func:`reserve_figure`). Every NVML call goes through ``calls``,
    by default with ``run``'s deadline (``call_timeout_s``; enumeration START_TIMEOUT_S),
    so a hung card fails as it fails ``run``'s start instead of hanging the command.
    Raises BudgetInfeasible naming that budget and where it comes from, or NvmlError
    (NvmlTimeout for a hung card)."""
    calls = calls or DeadlineCalls(settings.control.call_timeout_s)
    ctl = make_controller(nvml, settings, dry_run=True, calls=calls)
    try:
        ctl.start()
    except BudgetInfeasible as exc:
        figure = reserve_figure(settings, card_names(nvml, calls))
        raise BudgetInfeasible(f"{figure.source} {_n(figure.budget_w)} W ({figure.origin}): {exc}") from None
    return ctl
