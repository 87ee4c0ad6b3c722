"""Where command output goes: stdout for results, stderr for progress, and a reader
that stops early (``| head``) ends a command quietly.

A closed pipe is the reader saying "enough", not an error: the command stops, without
a traceback, with the status a program killed by SIGPIPE has (128 + 13 = 141), so
``set -o pipefail`` scripts see what they see for any other Unix tool.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from typing import TextIO

EXIT_BROKEN_PIPE = 141

# C0 and C1 control characters and DEL: an escape sequence from the network (a metric
# label, an etcd value, an MQTT payload) could move the cursor, retitle the terminal or
# write the clipboard (OSC 52) if printed raw.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: object) -> str:
    """``text`` as a string safe to print on a terminal: every control character but
    none of the printable ones replaced by its escape (``\x1b`` -> ``\\x1b``), so an
    operator sees what was sent and the terminal obeys none of it. For every string
    that comes from outside the process."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def pipe_safe(command: Callable[[], int]) -> int:
    """Run ``command`` (returns an exit status); a closed stdout ends it with 141.

    The flush inside the guard makes a write buffered until exit fail here rather than
    in the interpreter's shutdown, and stdout is then pointed at /dev/null so that the
    final flush has nowhere to fail ("Exception ignored ... BrokenPipeError").
    """
    try:
        status = command()
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout replaced (tests) or already closed
        pass


class Progress:
    """One line of progress on stderr, rewritten in place, only on a terminal.

    Silent when stderr is not a terminal (a pipe, a file, the journal) or when
    ``enabled`` is False (``--json``), so scripts see results only.
    """

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled and _isatty(self.stream)
        self.t0 = time.monotonic()
        self._shown = False

    def update(self, text: str) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.t0
        self.stream.write(f"\r\x1b[K{text} ({elapsed:.0f} s)")
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
