"""The controller as ``run`` builds it, shared with ``check-config --backend``.

One path from a config and an NVML layer to a started controller, so that
``check-config`` refuses exactly the budgets ``run`` refuses: the budget for the cards
found (their model names pick the transient factor), checked against their floors by
:meth:`Controller.start` itself.
"""

from __future__ import annotations

from collections.abc import Callable

from powerbudgetd.control.cardset import START_TIMEOUT_S
from powerbudgetd.control.controller import Controller
from powerbudgetd.hw.calls import DeadlineCalls, InlineCalls
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.config import Settings


def card_names(nvml: Nvml, calls: InlineCalls | None = None) -> list[str]:
    """The model name of every card, in index order (NVML must be initialised); through
    ``calls`` (the controller's deadline) where given, as the controller's own enumeration."""
    found = (calls or InlineCalls()).call("bank", nvml.devices, timeout_s=START_TIMEOUT_S)
    return [info.name for info in found]


def make_controller(
    nvml: Nvml,
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
    return [(c.index, c.info.name, c.min_mw / 1000 if c.controllable else None,
             None if c.controllable else ctl.bank.counted_mw(c) / 1000) for c in ctl.cards]


def check_feasible(nvml: Nvml, settings: Settings, calls: InlineCalls | None = None) -> Controller:
    """Enumerate the cards and check the budget against their floors, writing nothing.

    Every NVML call goes through ``calls``, by default with ``run``'s deadline
    (``call_timeout_s``; enumeration START_TIMEOUT_S), so a hung card fails the check as
    it fails ``run``'s start instead of hanging it. Returns the started (dry-run)
    controller; raises BudgetInfeasible naming each card's floor against its share, as
    ``run`` does, or NvmlError (NvmlTimeout for a hung card).
    """
    calls = calls or DeadlineCalls(settings.control.call_timeout_s)
    ctl = make_controller(nvml, settings, dry_run=True, calls=calls)
    ctl.start()
    return ctl
