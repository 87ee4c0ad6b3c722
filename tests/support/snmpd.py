"""A real SNMP agent for tests: Debian's net-snmp ``snmpd``, unprivileged in a temporary
directory on a free loopback UDP port, serving a PDU vendor's OID subtree through a
``pass_persist`` script.

The script (:data:`PASS_PERSIST`, written beside the config) answers ``get`` and
``getnext`` from a JSON file (OID -> [type, value]) that it re-reads on every request:
:meth:`Snmpd.set` rewrites that file, so a test changes the PDU's readings between polls.
snmpd answers v2c for ``community`` and v3 for the user ``pbuser`` (SHA/AES,
:data:`AUTH_KEY` / :data:`PRIV_KEY`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.wait import free_udp_port, reap, wait_until

SNMPD = "/usr/sbin/snmpd"
AUTH_KEY = "authkey-Zq9x"
PRIV_KEY = "privkey-Zq9x"
V3_USER = "pbuser"
PASS_PERSIST = '''\
import json, sys
path = sys.argv[1]

def key(oid):
    return tuple(int(x) for x in oid.strip(".").split("."))

def answer(oid, values):
    kind, value = values[oid]
    print(f".{oid}\\n{kind}\\n{value}", flush=True)

for line in sys.stdin:
    cmd = line.strip()
    if cmd == "PING":
        print("PONG", flush=True)
    elif cmd in ("get", "getnext"):
        oid = sys.stdin.readline().strip().lstrip(".")
        with open(path) as f:
            values = json.load(f)
        if cmd == "get":
            answer(oid, values) if oid in values else print("NONE", flush=True)
        else:
            later = sorted((o for o in values if key(o) > key(oid)), key=key)
            answer(later[0], values) if later else print("NONE", flush=True)
    elif cmd == "set":
        sys.stdin.readline()
        sys.stdin.readline()
        print("not-writable", flush=True)
    elif not cmd:
        break
'''


def snmpd_binary() -> str:
    if not os.access(SNMPD, os.X_OK):
        raise AssertionError(f"{SNMPD} is missing: run scripts/install-test-deps (Debian package snmpd)")
    return SNMPD


class Snmpd:
    """``snmpd`` on 127.0.0.1:``port`` serving ``subtree`` from :meth:`set`'s values."""

    def __init__(self, workdir: Path, subtree: str, community: str = "pdu-c0mmunity") -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_udp_port()
        self.started = False
        self.community = community
        self.values = workdir / "values.json"
        self.set({})
        script = workdir / "pass_persist.py"
        script.write_text(PASS_PERSIST)
        conf = workdir / "snmpd.conf"
        conf.write_text(
            f"rocommunity {community} 127.0.0.1\n"
            f"createUser {V3_USER} SHA {AUTH_KEY} AES {PRIV_KEY}\n"
            f"rouser {V3_USER} authpriv\n"
            f"pass_persist .{subtree.lstrip('.')} {sys.executable} {script} {self.values}\n"
        )
        conf.chmod(0o600)
        self.conf = conf
        # No MIBs are needed (numeric OIDs only): without these snmpd complains about each.
        self.env = {**os.environ, "MIBS": "", "MIBDIRS": str(workdir / "no-mibs"),
                    "SNMP_PERSISTENT_DIR": str(workdir / "persist")}
        self.proc: subprocess.Popen[bytes] | None = None

    def set(self, values: dict[str, tuple[str, int]]) -> None:
        """Serve ``values`` (OID -> (pass_persist type: integer, gauge..., value)) from now."""
        tmp = self.values.with_suffix(".tmp")
        tmp.write_text(json.dumps({k.lstrip("."): list(v) for k, v in values.items()}))
        tmp.replace(self.values)

    def start(self) -> Snmpd:
        """Start snmpd. The first start takes another free port where the one picked was
        taken meanwhile (a parallel test's socket: CI once lost a run to it); a restart
        keeps its port, as the tests that restart it expect."""
        log_path = self.dir / "snmpd.log"
        for tries_left in range(2, -1, -1):
            log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
            since = log.tell()  # this start's lines only
            self.proc = subprocess.Popen(
                [snmpd_binary(), "-f", "-Lo", "-C", "-c", str(self.conf), "-p", str(self.dir / "snmpd.pid"), "-r",
                 f"udp:127.0.0.1:{self.port}"],
                env=self.env, stdout=log, stderr=log, cwd=self.dir,
            )
            try:
                wait_until(lambda since=since: "NET-SNMP version" in self._log_since(since), 15,
                           "snmpd to start", proc=self.proc, log=log_path)
            except AssertionError:
                taken = "Error opening specified endpoint" in self._log_since(since)
                reap(self.proc, 5)
                if self.started or not taken or not tries_left:
                    raise
                self.port = free_udp_port()
                continue
            self.started = True
            return self
        raise AssertionError("unreachable")

    def _log_since(self, offset: int) -> str:
        with open(self.dir / "snmpd.log", "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def stop(self) -> None:
        reap(self.proc, 5)
        self.proc = None

    def close(self) -> None:
        self.stop()
