"""Signals for ``powerbudgetd run`` from its first instruction to its last.

Python leaves SIGHUP and SIGTERM at their default, which ends the process (exit 129,
143): a ``systemctl reload`` or a stray ``kill -HUP`` in the ~0.3 s the interpreter
takes to import the daemon, or after its event loop has let its handlers go during a
stop, killed it. So ``run`` calls :func:`hold` before anything else: from then on
SIGHUP, SIGTERM and SIGINT only set a flag (async-signal-safe) until the daemon's own
handlers take over, and again once they are gone:

- a stop (SIGTERM, SIGINT) asked for before the daemon runs is handed to it at once
  (:func:`take`): it leaves through its normal stop path, nothing written if boot had
  not begun;
- a reload (SIGHUP) asked for during start is deferred: the daemon reloads once it is
  ready, as it does for one asked for during boot; one asked for during the stop is
  ignored. Either is said once in the log by the daemon;
- once ``run`` is done they are ignored (:func:`ignore_to_exit`) through the
  interpreter's finalization, which would otherwise reset them to their defaults.

Only flags here: no logging, no allocation worth the name, nothing that could deadlock
in a handler.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

HELD = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


class _Asked:
    stop = False
    reloads = 0


def _note(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGHUP:
        _Asked.reloads += 1
    else:
        _Asked.stop = True


Handlers = dict[int, Any]


def hold() -> Handlers:
    """From now on SIGHUP, SIGTERM and SIGINT only note that they came (see :func:`take`).
    Returns the handlers they had, for :func:`restore`.

    The three are blocked for the moment their handlers go in (one mask change): one
    sent between two installs waits and is noted once unblocked, instead of meeting the
    default of a signal not yet held (a SIGINT there ended ``run`` with a traceback)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        return {sig: signal.signal(sig, _note) for sig in HELD}
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def restore(handlers: Handlers) -> None:
    """Put back what :func:`hold` returned (each swap atomic: no moment at the default)."""
    for sig, handler in handlers.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def ignore_to_exit() -> None:
    """The daemon is done: SIGHUP, SIGTERM and SIGINT are ignored to the process's exit.
    Python's finalization resets every signal it has a handler for to the default (a
    SIGHUP there exits 129), and leaves an ignored one ignored."""
    for sig in HELD:
        signal.signal(sig, signal.SIG_IGN)


def take() -> tuple[bool, int]:
    """What was asked since the last take: (a stop, how many reloads); clears both."""
    asked = (_Asked.stop, _Asked.reloads)
    _Asked.stop, _Asked.reloads = False, 0
    return asked


def is_run(argv: list[str]) -> bool:
    """Whether ``argv`` (without the program name) is the ``run`` command: its first word
    that is not an option."""
    words = [a for a in argv if not a.startswith("-")]
    return bool(words) and words[0] == "run"
