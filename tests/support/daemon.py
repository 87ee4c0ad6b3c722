"""powerbudgetd as a subprocess: one command run to its end (:func:`cli`), or the daemon
on a simulated bank as systemd runs it.

:class:`DaemonProcess` starts ``powerbudgetd run --backend sim --config FILE`` with its
stdout (the JSON log) and stderr in files of their own, optionally a ``NOTIFY_SOCKET``
(:class:`NotifySocket`, a unix datagram socket like systemd's) and ``WATCHDOG_USEC``;
:meth:`DaemonProcess.stop` ends it with SIGTERM and reaps it, and leaving its ``with``
block stops it whatever happened.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from support.wait import reap, wait_until

T = TypeVar("T")
# The variables a test must not pass on by accident: systemd's (settings from the
# environment, POWERBUDGETD_*, are dropped too).
_NOT_INHERITED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without systemd's variables and POWERBUDGETD_*
    settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED and not k.startswith("POWERBUDGETD_")}
    return {**env, **extra}


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120,
        closed_stdout: bool = False, python: tuple[str, ...] = ("-m", "powerbudgetd")) -> subprocess.CompletedProcess[str]:
    """``powerbudgetd ARGS`` in a fresh interpreter, as a user runs it (``python``: what
    the interpreter runs instead of the package). ``closed_stdout``: stdout is a pipe
    whose reader has already gone (``| head`` that stopped reading)."""
    cmd = [sys.executable, *python, *args]
    full_env = clean_env(**(env or {}))
    if not closed_stdout:
        return subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout)
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the command writes a byte
    try:
        proc = subprocess.run(cmd, stdout=w, stderr=subprocess.PIPE, text=True, env=full_env, cwd=cwd, timeout=timeout)
    finally:
        os.close(w)
    return subprocess.CompletedProcess(cmd, proc.returncode, "", proc.stderr)


def no_traceback(p: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among ``text``'s lines (a torn last line is left out)."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


class NotifySocket:
    """A unix datagram socket like systemd's in a short temporary directory (a socket's
    path must fit in 108 bytes); records (arrival time, {KEY: value}) per message."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="pbd")
        self.path = os.path.join(self._dir.name, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines())
            self.messages.append((time.time(), fields))

    def with_key(self, key: str) -> list[tuple[float, dict[str, str]]]:
        return [(t, m) for t, m in list(self.messages) if key in m]

    def close(self) -> None:
        self._closed = True
        self._thread.join()
        self.sock.close()
        self._dir.cleanup()

    def __enter__(self) -> NotifySocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DaemonProcess:
    """``powerbudgetd run --backend BACKEND --config CONFIG ARGS`` (``sim`` unless said); stdout in ``log``, stderr
    in ``log`` + ``.stderr`` (default: beside the config; written afresh unless
    ``append``). ``notify``: a socket path (or :class:`NotifySocket`) passed as
    NOTIFY_SOCKET; ``watchdog_s`` (s): WATCHDOG_USEC, with WATCHDOG_PID naming the
    daemon's process as systemd sets it (``watchdog_pid=False``: left unset, a watchdog
    nobody is known to enforce); ``env``: more variables."""

    def __init__(self, config: Path, *args: str, log: Path | None = None, notify: NotifySocket | str | None = None,
                 watchdog_s: float | None = None, env: dict[str, str] | None = None,
                 append: bool = False, watchdog_pid: bool = True, backend: str = "sim") -> None:
        self.config = config
        self.log = log or config.with_name(config.stem + ".log")
        self.stderr_log = self.log.with_name(self.log.name + ".stderr")
        extra = dict(env or {})
        if notify is not None:
            extra["NOTIFY_SOCKET"] = notify if isinstance(notify, str) else notify.path
        if watchdog_s is not None:
            extra["WATCHDOG_USEC"] = str(int(watchdog_s * 1e6))
        mode = "ab" if append else "wb"
        with self.log.open(mode) as out, self.stderr_log.open(mode) as err:
            cmd = [sys.executable, "-m", "powerbudgetd", "run", "--backend", backend, "--config", str(config), *args]
            if watchdog_s is not None and watchdog_pid:  # the shell's PID is the daemon's after exec
                cmd = ["/bin/sh", "-c", 'WATCHDOG_PID=$$ exec "$@"', "sh", *cmd]
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=clean_env(**extra))

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def output(self) -> str:
        """Everything it wrote to stdout so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def errors(self) -> str:
        """Everything it wrote to stderr so far."""
        return self.stderr_log.read_text(errors="replace") if self.stderr_log.exists() else ""

    def tail(self, chars: int = 3000) -> str:
        return f"stdout: ...{self.output()[-chars:]}\nstderr: ...{self.errors()[-chars:]}"

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """Its JSON log lines so far (those named ``name``)."""
        return [e for e in json_lines(self.output()) if name is None or e.get("event") == name]

    def wait_for(self, predicate: Callable[[], T | None], what: str, timeout_s: float = 30.0, **kw: Any) -> T:
        """:func:`wait_until`, failing at once (with its output) should the daemon exit."""
        return wait_until(predicate, timeout_s, what, proc=self.proc, log=self.tail, **kw)

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 20.0) -> int:
        """Its exit status, once it has exited (TimeoutExpired after ``timeout_s``)."""
        return self.proc.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, then its exit status; killed (and reaped) should it not exit within
        ``timeout_s`` (s), which fails the test."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the daemon ignored SIGTERM for {timeout_s} s\n{self.tail()}") from None

    def kill(self) -> int:
        """SIGKILL (no chance to clean up) and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        reap(self.proc)


# What the ``launch`` fixture gives: launch(config, *args, **kw) -> DaemonProcess.
Launch = Callable[..., DaemonProcess]


def scrape(port: int, timeout_s: float = 5.0) -> str:
    """The exposition at http://127.0.0.1:PORT/metrics (OSError when not served)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as resp:
        return str(resp.read().decode())


def metric(port: int, name: str) -> float | None:
    """The first sample of ``name`` served on ``port``; None when absent or not served."""
    try:
        text = scrape(port, timeout_s=1.0)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return None
