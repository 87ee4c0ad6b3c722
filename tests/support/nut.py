"""A real Network UPS Tools server for tests: Debian's ``upsd`` and the ``dummy-ups``
driver, unprivileged in a temporary config directory on a free loopback port.

The driver serves the variables of a ``.dev`` file and re-reads it when its time stamp
changes (``mode = dummy-once``): :meth:`Nut.set` rewrites it and moves the time stamp
forward one second each time, so two rewrites within a second are both seen.
``/usr/sbin/upsd`` on Debian is a wrapper that refuses to start unless
``/etc/nut/nut.conf`` sets MODE; the real binaries sit in NUT's library directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from support.wait import free_port, reap, wait_until

LIBDIRS = ("/lib/nut", "/usr/lib/nut", "/usr/libexec/nut")


def nut_binary(name: str) -> str:
    for d in LIBDIRS:
        path = Path(d) / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise AssertionError(f"NUT's {name} is missing: run scripts/install-test-deps (Debian package nut-server)")


class Nut:
    """``upsd`` serving one dummy UPS named ``name``; users in ``users`` (name ->
    password) get ``upsmon secondary``."""

    def __init__(self, workdir: Path, name: str = "gpuups", users: dict[str, str] | None = None,
                 maxage_s: int = 5) -> None:
        self.dir = workdir
        self.name = name
        self.port = free_port()
        self.state = workdir / "state"
        self.state.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dev = workdir / f"{name}.dev"
        self._stamp = time.time() - 1000.0
        self.set("OL CHRG", **{"ups.load": "20", "ups.realpower.nominal": "900", "battery.charge": "100",
                                "battery.runtime": "1800"})
        self._write_ups_conf()
        (workdir / "upsd.conf").write_text(f"LISTEN 127.0.0.1 {self.port}\nMAXAGE {maxage_s}\n")
        users_text = "".join(f"[{u}]\n  password = {p}\n  upsmon secondary\n" for u, p in (users or {}).items())
        (workdir / "upsd.users").write_text(users_text)
        os.chmod(workdir / "upsd.users", 0o600)
        self.env = {**os.environ, "NUT_CONFPATH": str(workdir), "NUT_STATEPATH": str(self.state)}
        # As root, NUT drops to its own user; keep this one so it can read the temp dir.
        self.user_args = ["-u", "root"] if os.geteuid() == 0 else []
        self.driver: subprocess.Popen[bytes] | None = None
        self.upsd: subprocess.Popen[bytes] | None = None

    def _write_ups_conf(self, names: tuple[str, ...] | None = None) -> None:
        names = (self.name,) if names is None else names
        text = "".join(
            f"[{n}]\n  driver = dummy-ups\n  port = {self.dev.name}\n  mode = dummy-once\n  pollinterval = 1\n"
            f'  desc = "test UPS"\n' for n in names
        )
        (self.dir / "ups.conf").write_text(text or "\n")

    def set(self, status: str | None, **variables: str) -> None:
        """Serve ``ups.status`` = ``status`` (None: no status at all) and ``variables``."""
        lines = [] if status is None else [f"ups.status: {status}"]
        lines += [f"{k}: {v}" for k, v in variables.items()]
        tmp = self.dev.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        self._stamp += 1.0
        os.utime(tmp, (self._stamp, self._stamp))
        tmp.replace(self.dev)

    def start(self) -> Nut:
        self.start_driver()
        self.start_upsd()
        return self

    def start_driver(self) -> None:
        log = open(self.dir / "driver.log", "ab")  # noqa: SIM115 - closed with the process
        self.driver = subprocess.Popen(
            [nut_binary("dummy-ups"), "-a", self.name, "-F", *self.user_args],
            env=self.env, stdout=log, stderr=log, cwd=self.dir,
        )
        self._wait(lambda: any(p.name.startswith(f"dummy-ups-{self.name}") for p in self.state.iterdir()),
                   "the driver's socket", self.driver)

    def start_upsd(self) -> None:
        log = open(self.dir / "upsd.log", "ab")  # noqa: SIM115 - closed with the process
        self.upsd = subprocess.Popen(
            [nut_binary("upsd"), "-F", *self.user_args], env=self.env, stdout=log, stderr=log, cwd=self.dir,
        )
        self._wait(lambda: self.query("ups.status") is not None, "upsd to serve the UPS", self.upsd)

    def _wait(self, ok, what: str, proc: subprocess.Popen[bytes]) -> None:  # type: ignore[no-untyped-def]
        wait_until(ok, 15, what, proc=proc,
                   log=lambda: "\n".join(p.read_text(errors="replace") for p in self.dir.glob("*.log")))

    def query(self, var: str) -> str | None:
        """``upsc``'s answer for one variable, None when upsd gives none."""
        upsc = shutil.which("upsc") or "/usr/bin/upsc"
        out = subprocess.run([upsc, f"{self.name}@127.0.0.1:{self.port}", var], capture_output=True, text=True,
                             timeout=5, check=False)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None

    def wait_for(self, var: str, value: str, timeout_s: float = 10.0) -> float:
        """Wait until upsd serves ``var`` = ``value``; returns when (time.monotonic)."""
        wait_until(lambda: self.query(var) == value, timeout_s, f"upsd to serve {var} = {value!r}",
                   log=lambda: f"last: {self.query(var)!r}")
        return time.monotonic()

    def remove_ups(self) -> None:
        """Take the UPS out of ups.conf and have upsd reload it (SIGHUP)."""
        self._write_ups_conf(names=())
        assert self.upsd is not None
        self.upsd.send_signal(1)

    def stop_upsd(self) -> None:
        reap(self.upsd, 5)
        self.upsd = None

    def stop_driver(self) -> None:
        reap(self.driver, 5)
        self.driver = None

    def close(self) -> None:
        self.stop_upsd()
        self.stop_driver()

