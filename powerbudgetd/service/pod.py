"""``powerbudgetd pod``: the container's entrypoint, doing in a pod what systemd does on a host.

``pod run`` (the DaemonSet's command, PID 1 in its container):

1. waits for the GPU operator's driver-ready file (``--wait-for``) before anything
   touches NVML, saying every PROGRESS_S that it still waits;
2. finds ``libnvidia-ml.so.1`` under the driver root the pod is given
   (``$CONTAINER_DRIVER_ROOT``, where the DaemonSet mounts the host's
   ``$NVIDIA_DRIVER_ROOT``, the device plugin's convention), following its symlinks
   inside that root, and links that one file into a private directory put on
   ``LD_LIBRARY_PATH``: nvidia-ml-py's own loader (``CDLL("libnvidia-ml.so.1")``) then
   loads it, and no other library of the host's shadows the container's own;
3. runs ``powerbudgetd run`` as its child, passing on SIGTERM, SIGINT and SIGHUP;
4. after the child exits for any reason (stopped, crashed, killed after
   ``--stop-timeout`` s), runs ``powerbudgetd failsafe`` as the unit's ``ExecStopPost=``
   does, then exits with the daemon's status (the failsafe's when the daemon's was 0).

With ``--ready-file`` it is also systemd's side of ``sd_notify`` for the daemon (its
``NOTIFY_SOCKET``): the file exists from the daemon's ``READY=1`` (every card's fair
share read back, the moment the startup taint goes) until its ``STOPPING=1`` or exit,
for the pod's readinessProbe: a rolling update then waits for each node's cards to be
capped before it moves on, and stops at a node where the new version does not boot.

``pod stop`` (the ``preStop`` hook): signals ``pod run`` (its PID file) and waits until it
has finished, failsafe included. ``pod restore``: steps 1-2, then ``powerbudgetd restore``,
then idles (as a DaemonSet's pod must) until stopped; its ``--ready-file`` exists once
every card is restored.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import structlog

from powerbudgetd.errors import ExitStatus

LIBRARY = "libnvidia-ml.so.1"
# Where a driver root keeps it, in the order the device plugin looks (x86-64, arm64, RPM).
LIBRARY_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu",
                "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "usr/lib", "lib")
PROGRESS_S = 10.0  # how often a wait for the driver says so
STOP_TIMEOUT_S = 30.0  # the daemon's stop, before it is killed and the failsafe runs
PID_FILE = "pod.pid"
MAX_LINKS = 16

log = structlog.get_logger("powerbudgetd")


class DriverNotFound(Exception):
    """No usable ``libnvidia-ml.so.1`` under the driver root; the message names where it looked."""


def driver_root(environ: dict[str, str] | os._Environ[str] | None = None) -> tuple[Path, str]:
    """The driver root as this container sees it, and how it was chosen (for messages)."""
    env = os.environ if environ is None else environ
    if env.get("CONTAINER_DRIVER_ROOT"):
        host = env.get("NVIDIA_DRIVER_ROOT")
        return Path(env["CONTAINER_DRIVER_ROOT"]), "CONTAINER_DRIVER_ROOT" + (f" (the host's {host})" if host else "")
    if env.get("NVIDIA_DRIVER_ROOT"):
        return Path(env["NVIDIA_DRIVER_ROOT"]), "NVIDIA_DRIVER_ROOT"
    return Path("/"), "the container's own root (no NVIDIA_DRIVER_ROOT)"


def resolve_in_root(root: Path, relative: str) -> Path | None:
    """``root/relative`` with every symlink on the way followed as the driver root's own
    system would (chroot-like): an absolute target is read from ``root``, not from this
    container's ``/``, and ``..`` stops at ``root``. The file it names, or None (missing,
    not a file, more than MAX_LINKS links)."""
    top = os.path.normpath(root)
    parts = [p for p in relative.split("/") if p]
    current, hops = top, 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            current = top if current == top else os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        if os.path.islink(candidate):
            hops += 1
            if hops > MAX_LINKS:
                return None
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = top
            parts = [p for p in target.split("/") if p] + parts
            continue
        current = candidate
    return Path(current) if os.path.isfile(current) else None


def find_library(root: Path, how: str = "") -> Path:
    """``libnvidia-ml.so.1`` under ``root``, resolved to its file. Raises DriverNotFound
    naming the root, how it was chosen and every directory looked in."""
    for d in LIBRARY_DIRS:
        found = resolve_in_root(root, f"{d}/{LIBRARY}")
        if found is not None:
            return found
    looked = ", ".join(str(root / d) for d in LIBRARY_DIRS)
    raise DriverNotFound(
        f"{LIBRARY} not found under the driver root {root}{f' ({how})' if how else ''}; looked in {looked}. "
        "Set NVIDIA_DRIVER_ROOT to where the driver is installed on the host (/run/nvidia/driver for the GPU "
        "operator's driver, / for one installed on the host) and mount it at CONTAINER_DRIVER_ROOT")


def library_env(library: Path, directory: Path) -> dict[str, str]:
    """The variables that make a child's bindings load ``library``: a link to it named
    ``libnvidia-ml.so.1`` alone in ``directory``, first on ``LD_LIBRARY_PATH``."""
    link = directory / LIBRARY
    link.unlink(missing_ok=True)
    link.symlink_to(library)
    path = os.environ.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": f"{directory}:{path}" if path else str(directory)}


class _Stop:
    """SIGTERM/SIGINT received (and the last one, to pass on)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.since: float | None = None  # when the first stop came (monotonic s)
        self.child: subprocess.Popen[bytes] | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        if signum != signal.SIGHUP:
            self.signum = signum
            if self.since is None:
                self.since = time.monotonic()
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)


class ReadyRelay:
    """A datagram socket the daemon's sd_notify messages reach (its ``NOTIFY_SOCKET``):
    ``READY=1`` creates ``ready_file``, ``STOPPING=1`` and :meth:`close` remove it."""

    def __init__(self, socket_path: Path, ready_file: Path) -> None:
        self.ready_file = ready_file
        self.ready = False
        ready_file.unlink(missing_ok=True)  # a previous container's, never this daemon's
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(str(socket_path))
        self.sock.settimeout(0.5)
        self.address = str(socket_path)
        self._closed = False
        self._thread = threading.Thread(target=self._read, name="notify-relay", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            keys = {line.split("=", 1)[0] for line in data.decode(errors="replace").splitlines()}
            if "STOPPING" in keys:
                self._set(False)
            elif "READY" in keys:
                self._set(True)

    def _set(self, ready: bool) -> None:
        if ready == self.ready:
            return
        try:
            if ready:
                self.ready_file.touch()
            else:
                self.ready_file.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("pod_ready_file_unwritable", path=str(self.ready_file), error=exc.strerror or str(exc))
            return
        self.ready = ready
        log.info("pod_ready" if ready else "pod_not_ready", file=str(self.ready_file))

    def not_ready(self) -> None:
        """The daemon has exited (however): not ready, whatever it said last."""
        self._set(False)

    def close(self) -> None:
        self._set(False)
        self._closed = True
        self._thread.join(timeout=2.0)
        self.sock.close()


def wait_for_file(path: Path, stop: _Stop, timeout_s: float | None) -> bool:
    """Until ``path`` exists (True), a stop or ``timeout_s`` passes (False)."""
    start = last = time.monotonic()
    if not path.exists():
        log.info("pod_waiting_for_driver", file=str(path), detail="the driver is not ready yet: NVML is not touched")
    while not path.exists():
        if stop.signum is not None:
            return False
        now = time.monotonic()
        if timeout_s is not None and now - start >= timeout_s:
            log.error("pod_driver_not_ready", file=str(path), waited_s=round(now - start, 1))
            return False
        if now - last >= PROGRESS_S:
            log.info("pod_waiting_for_driver", file=str(path), waited_s=round(now - start, 1))
            last = now
        time.sleep(0.2)
    log.info("pod_driver_ready", file=str(path), waited_s=round(time.monotonic() - start, 1))
    return True


def add_parser(sub: argparse._SubParsersAction, formatter_class: type[argparse.HelpFormatter]) -> None:
    """The ``pod`` command's arguments (cli.py's parser calls this)."""
    p = sub.add_parser(
        "pod", help="the container's entrypoint in a Kubernetes pod (run, stop, restore)", formatter_class=formatter_class,
        description="In a pod, what systemd does on a host: wait for the driver, find its NVML library under the "
        "driver root, run the daemon, and run the failsafe after it exits.",
    )
    p.add_argument("action", choices=("run", "stop", "restore"),
                   help="run: the daemon (the container's command); stop: the preStop hook, stop `pod run` and "
                   "wait for its failsafe; restore: `powerbudgetd restore`, then idle")
    p.add_argument("--config", type=Path, default=None,
                   help="config file (default: $POWERBUDGETD_CONFIG or /etc/powerbudgetd/powerbudgetd.toml)")
    p.add_argument("--backend", choices=("nvml", "sim"), default="nvml",
                   help="sim: the config's [sim] bank (no driver looked for)")
    p.add_argument("--wait-for", type=Path, metavar="FILE", default=None,
                   help="wait for this file before touching NVML, e.g. the GPU operator's "
                   "/run/nvidia/validations/driver-ready (default: no wait)")
    p.add_argument("--wait-timeout", type=float, metavar="S", default=None,
                   help="give up waiting after S seconds, exit 4 (default: wait until stopped)")
    p.add_argument("--stop-timeout", type=float, metavar="S", default=STOP_TIMEOUT_S,
                   help="after a stop, kill the daemon if it has not exited within S seconds, then run the failsafe")
    p.add_argument("--force", action="store_true", help="with restore: restore limits that sum over the budget")
    p.add_argument("--ready-file", type=Path, metavar="FILE", default=None,
                   help="a file for the pod's readinessProbe: with run, it exists while the daemon has reported READY=1 "
                   "(every card's fair share read back) and is not stopping; with restore, once every card is "
                   "restored (default: none)")


def command(args: argparse.Namespace) -> int:
    from powerbudgetd.service.instance import runtime_dir
    from powerbudgetd.service.logs import configure_logging

    configure_logging()
    pid_file = runtime_dir() / PID_FILE
    if args.action == "stop":
        return _stop_pod(pid_file, args.stop_timeout + 40.0)
    stop = _Stop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    common = [*(["--config", str(args.config)] if args.config else []), "--backend", args.backend]
    if args.ready_file is not None:
        args.ready_file.unlink(missing_ok=True)  # not ready until this run says so
    with tempfile.TemporaryDirectory(prefix="powerbudgetd-nvml.") as tmp:
        env = dict(os.environ)
        if args.wait_for is not None and not wait_for_file(args.wait_for, stop, args.wait_timeout):
            return ExitStatus.OK if stop.signum is not None else ExitStatus.NVML
        if args.backend == "nvml":
            root, how = driver_root()
            try:
                library = find_library(root, how)
            except DriverNotFound as exc:
                log.error("pod_driver_not_found", error=str(exc))
                print(f"powerbudgetd: {exc}", file=sys.stderr)
                return ExitStatus.NVML
            log.info("pod_driver_found", library=str(library), root=str(root), root_from=how)
            env.update(library_env(library, Path(tmp)))
        me = [sys.executable, "-m", "powerbudgetd"]
        if args.action == "restore":
            status = subprocess.run([*me, "restore", *common, *(["--force"] if args.force else [])], env=env).returncode
            log.info("pod_restore_done", status=status, detail="idle until the pod is deleted")
            if status == ExitStatus.OK and args.ready_file is not None:  # ready: restored
                args.ready_file.touch()
            while stop.signum is None:
                signal.pause()
            return status
        relay = None
        if args.ready_file is not None:
            relay = ReadyRelay(Path(tmp) / "notify", args.ready_file)
            env["NOTIFY_SOCKET"] = relay.address
        try:
            return _run(me, common, env, stop, args.stop_timeout, pid_file, relay)
        finally:
            if relay is not None:
                relay.close()


def _run(me: list[str], common: list[str], env: dict[str, str], stop: _Stop, stop_timeout_s: float,
         pid_file: Path, relay: ReadyRelay | None = None) -> int:
    try:
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(f"{os.getpid()}\n")
    except OSError as exc:
        log.warning("pod_pid_file_unwritable", path=str(pid_file), error=exc.strerror or str(exc),
                    detail="`pod stop` (the preStop hook) cannot find this process; SIGTERM still stops it")
    try:
        if stop.signum is not None:  # stopped while waiting: nothing was written
            return ExitStatus.OK
        stop.child = subprocess.Popen([*me, "run", *common], env=env)
        if stop.signum is not None:  # a signal between the start and the handover
            stop.child.send_signal(stop.signum)
        status = _wait_child(stop, stop_timeout_s)
        if relay is not None:
            relay.not_ready()
        log.info("pod_daemon_exited", status=status, then="failsafe")
        started = time.monotonic()
        env = {k: v for k, v in env.items() if k != "NOTIFY_SOCKET"}
        safe = subprocess.run([*me, "failsafe", *common], env=env).returncode
        log.info("pod_failsafe_done", status=safe, took_s=round(time.monotonic() - started, 1))
        return status if status != ExitStatus.OK else safe
    finally:
        pid_file.unlink(missing_ok=True)


def _wait_child(stop: _Stop, stop_timeout_s: float) -> int:
    """The daemon's exit status (128 + N when signal N ended it, as a shell says); killed
    when it outlives the first stop by ``stop_timeout_s``."""
    assert stop.child is not None
    while True:
        left = 0.5 if stop.since is None else stop.since + stop_timeout_s - time.monotonic()
        try:
            status = stop.child.wait(timeout=max(0.0, left))
            return 128 - status if status < 0 else status
        except subprocess.TimeoutExpired:
            if stop.since is None or time.monotonic() < stop.since + stop_timeout_s:
                continue
            log.error("pod_daemon_stop_timeout", after_s=stop_timeout_s, action="killed; the failsafe runs now")
            stop.child.kill()
            stop.child.wait()
            return 128 + signal.SIGKILL


def _stop_pod(pid_file: Path, timeout_s: float) -> int:
    """SIGTERM to ``pod run`` and wait for it to finish (its failsafe included)."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        print(f"powerbudgetd: pod stop: no running `pod run` ({pid_file} unreadable)", file=sys.stderr)
        return ExitStatus.OK  # nothing to stop: kubelet's SIGTERM follows anyway
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return ExitStatus.OK
    end = time.monotonic() + timeout_s
    while pid_file.exists() and time.monotonic() < end:
        time.sleep(0.2)
    return ExitStatus.OK if not pid_file.exists() else ExitStatus.ERROR
