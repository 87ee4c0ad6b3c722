"""What one card counts for against the budget: its worst case, and its bound. Pure.

Every counter of a card uses these two functions: the controller's ledger (through its
``bound_mw`` property), the card set's feasibility check (``run``, ``check-config``) and
``failsafe``. A card's figure is never computed another way, so they cannot disagree.
All limits in integer mW.
"""

from __future__ import annotations

from collections.abc import Iterable


def worst_case_mw(known_mw: Iterable[int | None], stated_max_mw: int | None = None,
                  bank_max_mw: int | None = None) -> int | None:
    """The highest limit a card may have or come back with (mW).

    ``known_mw``: every limit known for the card, read (requested, enforced) or stated by
    NVML (its maximum constraint, its default); None entries are unknown. The worst case
    is the largest of them; with none known, the operator's ``[cards] max_w``
    (``stated_max_mw``); else the largest maximum limit among the bank's other cards
    (``bank_max_mw``); else None (nothing is known anywhere: the caller refuses or
    reserves everything)."""
    known = [v for v in known_mw if v is not None and v > 0]
    if known:
        return max(known)
    return stated_max_mw if stated_max_mw is not None else bank_max_mw


def limit_bound_mw(requested_mw: int | None, enforced_mw: int | None, worst_mw: int,
                   landing_mw: Iterable[int] = (), unknown: bool = False) -> int:
    """The highest limit that may be in force on a card now (mW): the bound.

    ``max(requested, enforced, every write that may still land)``, and the card's worst
    case (``worst_mw``) wherever either limit is unknown (None) or the card's state is
    ``unknown`` (it just appeared, or a call on it has not returned)."""
    # Read every tick for every card, several times: no list is built on the common path.
    if requested_mw is None or enforced_mw is None or unknown:
        bound = worst_mw
        for v in (requested_mw, enforced_mw):
            if v is not None and v > bound:
                bound = v
    else:
        bound = requested_mw if requested_mw > enforced_mw else enforced_mw
    for v in landing_mw:
        if v > bound:
            bound = v
    return bound
