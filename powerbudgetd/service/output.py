"""Where command output goes: stdout for results, stderr for progress, and a reader
that stops early (``| head``) ends a command quietly.

A closed pipe is the reader saying "enough", not an error: the command stops, without
a traceback, with the status a program killed by SIGPIPE has (128 + 13 = 141), so
``set -o pipefail`` scripts see what they see for any other Unix tool.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

EXIT_BROKEN_PIPE = 141


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
