"""One daemon per set of cards: an ``flock`` on a lock file, taken before any NVML write.

Two daemons writing the same power limits fight until both sit in failsafe. The lock
is held for the life of the process (the kernel drops it when the process dies, even
on ``kill -9``), and the file holds the holder's PID so a second instance can name it.

Which cards a run writes decides which lock it takes (:func:`lock_path`):

- real NVML: one lock per host, ``$RUNTIME_DIRECTORY/powerbudgetd.lock`` (systemd's
  ``RuntimeDirectory=powerbudgetd``), else ``/run/powerbudgetd/powerbudgetd.lock``;
- ``--backend sim`` with ``[sim] state_file``: ``<state_file>.lock`` (those simulated
  cards are shared through that file, as real ones are through the driver);
- ``--dry-run``, or a simulated bank private to its process: no lock. They write
  nothing another daemon could contest, so they neither block nor wait for it.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from powerbudgetd.errors import AlreadyRunning

DEFAULT_RUNTIME_DIR = Path("/run/powerbudgetd")
LOCK_NAME = "powerbudgetd.lock"


def runtime_dir() -> Path:
    """``$RUNTIME_DIRECTORY`` (first entry; systemd sets it), else ``/run/powerbudgetd``."""
    env = os.environ.get("RUNTIME_DIRECTORY", "")
    return Path(env.split(":")[0]) if env else DEFAULT_RUNTIME_DIR


def lock_path(backend: str, dry_run: bool, sim_state_file: str | None) -> Path | None:
    """The lock file a run must hold before writing a limit, or None (see module doc)."""
    if dry_run:
        return None
    if backend == "sim":
        return None if not sim_state_file else Path(f"{sim_state_file}.lock")
    return runtime_dir() / LOCK_NAME


class InstanceLock:
    """An exclusive, non-blocking ``flock`` on ``path``; :meth:`acquire` or raise.

    Keep the object alive as long as the lock must be held; :meth:`release` (or the
    process's end) lets it go. The file is left in place: deleting it would let a third
    instance lock a new inode while the second still holds the old one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> InstanceLock:
        """Take the lock and write this PID into the file.

        Raises AlreadyRunning (naming the holder's PID) when another process holds it,
        OSError when the file cannot be created (e.g. no permission on its directory).
        """
        self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        # O_NOFOLLOW: the daemon runs as root; a symlink planted here must not make it
        # truncate another file.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            who = f"PID {holder}" if holder is not None else "a process whose PID is not recorded"
            raise AlreadyRunning(
                f"another powerbudgetd ({who}) already controls these cards: it holds {self.path}. "
                "Two daemons writing the same power limits fight each other; stop that one first "
                "(systemctl stop powerbudgetd), or use --dry-run to watch beside it",
                str(self.path), holder,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> InstanceLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
