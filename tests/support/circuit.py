"""Real parts for the circuit tests: etcd members, a TCP proxy that can be cut, daemon
processes on simulated banks under a systemd-like supervisor, and a checker of the
circuit's wall sum.

- :class:`EtcdCluster`: ``n`` members of Debian's etcd on loopback ports with temporary
  data directories (fast heartbeats, so an election takes well under a second).
- :class:`TcpProxy`: forwards one port to another; :meth:`TcpProxy.cut` drops every
  connection and black-holes new ones (a host cut off from etcd), :meth:`heal` ends it.
- :class:`Host`: ``powerbudgetd run --backend sim`` with its own config, state file and
  metrics port, started as systemd would: ``NOTIFY_SOCKET`` and ``WATCHDOG_USEC`` set;
  a supervisor thread kills it (SIGKILL) when the watchdog pings stop (``WatchdogSec``),
  and after any exit runs ``powerbudgetd failsafe`` (``ExecStopPost=``).
- :class:`Sharer`: an in-process host doing the daemon's grant round on a store client
  (no cards: its draw modelled as its seat plus the grant in use), for load and for
  trees; :func:`rounds_until` runs rounds of several until a condition holds.
- :class:`Checker`: every 100 ms, each host's truth (the simulated cards' limits as the
  bank keeps them in its state file: the highest limit that may be in force per card,
  readable even while a daemon is stopped) through the feed model to the wall; asserts
  the circuit's sum never exceeds its budget and keeps the worst margin.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from powerbudgetd.channels.circuit.store import CircuitStore, HostRecord
from powerbudgetd.core.circuit import GrantPolicy, raise_allowed
from support.daemon import DaemonProcess, json_lines, metric
from support.timings import FALLBACK_S, POLL_S, RELEASE_HOLD_S, REQUEST_TIMEOUT_S, SHARER_LEASE_TTL_S, WATCHDOG_S
from support.wait import free_port, reap, wait_until

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
EXE = str(Path(sys.executable).parent / "powerbudgetd")
PSU_EFFICIENCY = 0.9
HOST_W = 100.0


# -- etcd ------------------------------------------------------------------------------

@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log: Path
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"


@dataclass(frozen=True)
class Certs:
    """A test CA, a server certificate for 127.0.0.1 and a client certificate, made with
    openssl (files mode 0600)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certs(tmp: Path) -> Certs:
    d = tmp / "pki"
    d.mkdir()

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
            "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    for f in d.iterdir():
        f.chmod(0o600)
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")


class EtcdCluster:
    """``n`` members; with ``certs``, clients speak TLS and must show a certificate the
    test CA signed (``--client-cert-auth``)."""

    def __init__(self, tmp: Path, n: int = 1, certs: Certs | None = None) -> None:
        self.certs = certs
        self.members = [
            Member(f"m{i}", free_port(), free_port(), tmp / f"etcd-m{i}", tmp / f"etcd-m{i}.log") for i in range(n)
        ]
        self.initial = ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self, i: int | None = None, *, new: bool = True) -> None:
        for m in self.members if i is None else [self.members[i]]:
            m.data_dir.mkdir(exist_ok=True)
            scheme = "https" if self.certs else "http"
            cmd = [
                ETCD, "--name", m.name, "--data-dir", str(m.data_dir),
                "--listen-client-urls", f"{scheme}://{m.endpoint}", "--advertise-client-urls", f"{scheme}://{m.endpoint}",
                "--listen-peer-urls", f"http://127.0.0.1:{m.peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{m.peer_port}",
                "--initial-cluster", self.initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", "powerbudgetd-test",
                "--heartbeat-interval", "50", "--election-timeout", "500", "--logger", "zap", "--log-outputs", "stderr",
            ]
            if self.certs:
                c = self.certs
                cmd += ["--cert-file", str(c.server_cert), "--key-file", str(c.server_key),
                        "--trusted-ca-file", str(c.ca), "--client-cert-auth"]
            m.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(m.log, "ab"))  # noqa: SIM115
        self.wait_healthy()

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        def healthy() -> bool:
            live = [m for m in self.members if m.proc is not None and m.proc.poll() is None]
            return bool(live) and all(_health(m, self.certs) for m in live)

        wait_until(healthy, timeout_s, "etcd to become healthy", step_s=0.1,
                   log=lambda: "; ".join(m.log.read_text()[-600:] for m in self.members))

    def leader(self) -> int:
        for i, m in enumerate(self.members):
            if m.proc is not None and m.proc.poll() is None and metric(m.client_port, "etcd_server_is_leader") == 1:
                return i
        raise AssertionError("no leader")

    def kill(self, i: int) -> None:
        m = self.members[i]
        if m.proc is not None:
            m.proc.kill()
            m.proc.wait()
            m.proc = None

    def stop_all(self) -> None:
        for i in range(len(self.members)):
            self.kill(i)


def _health(m: Member, certs: Certs | None = None) -> bool:
    ctx = None
    if certs is not None:
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        ctx.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    try:
        with urllib.request.urlopen(f"{'https' if certs else 'http'}://{m.endpoint}/health", timeout=1,
                                    context=ctx) as r:
            return json.loads(r.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


# -- a proxy that can be cut -----------------------------------------------------------

class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut_off = False
        self.frozen = False  # a silent stall: connections stay open, nothing passes
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(client)
                if self.cut_off or self.frozen:
                    continue  # black hole: accepted, never answered
            try:
                upstream = socket.create_connection(self.target, timeout=2)
                upstream.settimeout(None)  # a quiet stream (a watch) is no failure
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self.cut_off:
                data = src.recv(65536)
                if not data or self.cut_off:
                    break
                if not self.frozen:
                    dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def cut(self) -> None:
        with self._lock:
            self.cut_off = True
            for s in self._conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._conns = []

    def freeze(self) -> None:
        """A silent stall (a member hung, or a partition that drops packets): every
        connection stays open and nothing passes either way; no error to see."""
        self.frozen = True

    def heal(self) -> None:
        with self._lock:
            self.cut_off = False
            self.frozen = False

    def close(self) -> None:
        self.cut()
        self.listener.close()


# -- hosts -----------------------------------------------------------------------------

BUSY = """[[cards]]
phases = [{ at_s = 0, kind = "constant", power_w = 300, workload = "compute" }]
"""
IDLE = """[[cards]]
phases = [{ at_s = 0, kind = "idle" }]
"""


def scenario(path: Path, busy: int) -> Path:
    """workstation-4's bank (4 x 150-300 W) with ``busy`` cards at 300 W, the rest idle."""
    body = 'name = "circuit-test"\nbank = "workstation-4"\nbudget_w = 1200\nduration_s = 3600\nseed = 1\nlag_s = 0.1\n'
    body += "".join(BUSY if i < busy else IDLE for i in range(4))
    path.write_text(body)
    return path


@dataclass
class Host:
    name: str
    tmp: Path
    endpoints: list[str]
    circuit: str
    reserve_w: float = 800.0
    busy: int = 4
    watchdog_s: float = WATCHDOG_S
    extra: str = ""
    seat: str | None = None  # the [circuit] host name (default: ``name``)
    machine_id: str = ""  # default: one of its own, from ``name``
    enforce_watchdog: bool = True  # False: WATCHDOG_USEC alone, and nothing kills it when the pings stop
    failsafe_delay_s: float = 0.0  # ExecStopPost waits this long before the failsafe (a slow one)
    fallback_s: float = FALLBACK_S
    poll_s: float = POLL_S
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    failsafe_runs: list[tuple[float, int, str]] = field(default_factory=list)
    killed_by_watchdog: bool = False
    booted: bool = False
    exited_at: float | None = None

    def __post_init__(self) -> None:
        self.dir = self.tmp / self.name
        self.dir.mkdir()
        self.state_file = self.dir / "limits.json"
        self.config = self.dir / "powerbudgetd.toml"
        self.log = self.dir / "daemon.log"
        sc = scenario(self.dir / "scenario.toml", self.busy)
        self.machine_id = self.machine_id or hashlib.md5(self.name.encode()).hexdigest()
        (self.dir / "machine-id").write_text(self.machine_id + "\n")
        eps = ", ".join(f'"{e}"' for e in self.endpoints)
        self.config.write_text(f"""budget_w = 1200
[control]
tick_s = 0.1
[sim]
scenario = "{sc}"
state_file = "{self.state_file}"
[metrics]
port = {self.port}
[recorder]
enabled = false
[circuit]
name = "{self.circuit}"
endpoints = [{eps}]
host = "{self.seat or self.name}"
machine_id_file = "{self.dir / 'machine-id'}"
reserve_w = {self.reserve_w}
psu_efficiency = {PSU_EFFICIENCY}
host_w = {HOST_W}
poll_s = {self.poll_s}
request_timeout_s = {REQUEST_TIMEOUT_S}
fallback_s = {self.fallback_s}
release_hold_s = {RELEASE_HOLD_S}
step_w = 10
{self.extra}
""")

    def join(self) -> None:
        """``circuit join``: the seat registered before the daemon first runs."""
        r = subprocess.run([EXE, "circuit", "join", "--backend", "sim", "--config", str(self.config)],
                           capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr

    def start(self) -> None:
        self.notify_path = str(self.dir / "notify.sock")
        if os.path.exists(self.notify_path):
            os.unlink(self.notify_path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.notify_path)
        self._sock.settimeout(0.05)
        self.ready = threading.Event()
        self.last_ping = time.monotonic()
        self.exited_at = None
        self.daemon = DaemonProcess(self.config, log=self.log, notify=self.notify_path, watchdog_s=self.watchdog_s,
                                    append=True, watchdog_pid=self.enforce_watchdog)
        self.proc = self.daemon.proc
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)
        self._supervisor.start()

    def _supervise(self) -> None:
        """systemd's part: WatchdogSec (kill when the pings stop), then ExecStopPost."""
        assert self.proc is not None
        while self.proc.poll() is None:
            try:
                msg = self._sock.recv(4096).decode()
            except TimeoutError:
                msg = ""
            except OSError:
                msg = ""
            if "READY=1" in msg:
                self.ready.set()
                self.booted = True
            if "WATCHDOG=1" in msg or "READY=1" in msg:
                self.last_ping = time.monotonic()
            if self.enforce_watchdog and self.ready.is_set() and time.monotonic() - self.last_ping > self.watchdog_s:
                self.killed_by_watchdog = True
                self.proc.send_signal(signal.SIGCONT)  # systemd sends SIGABRT then SIGKILL; the result is a kill
                self.proc.kill()
        self.proc.wait()
        self.exited_at = time.monotonic()
        self.run_failsafe()

    def run_failsafe(self) -> None:
        time.sleep(self.failsafe_delay_s)
        r = subprocess.run([EXE, "failsafe", "--backend", "sim", "--config", str(self.config)],
                           capture_output=True, text=True, timeout=60)
        self.failsafe_runs.append((time.monotonic(), r.returncode, r.stdout + r.stderr))

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        assert self.ready.wait(timeout_s), f"{self.name} not ready: {self.daemon.tail(2000)}"

    def metric(self, name: str) -> float | None:
        return metric(self.port, name)

    def state_text(self) -> str | None:
        """The bank's saved state as it is on disk now (None: not there or unreadable)."""
        try:
            return self.state_file.read_text()
        except OSError:
            return None

    def board_bound_w(self, text: str | None = None, at: float | None = None) -> float | None:
        """The truth: sum over cards of the highest limit that may be in force (W), at
        ``at`` (monotonic s; default now) from the saved state ``text`` (default: read now).

        The bank saves its state at each write, with each write still in flight as (s
        after the save, mW) and its clock: one whose time has come is enforced now."""
        try:
            state = json.loads(self.state_text() if text is None else text)
        except (TypeError, ValueError):
            return None
        now = time.monotonic() if at is None else at
        saved = state["clock_origin_s"] + state["now_s"]
        total = 0
        for c in state["cards"]:
            enforced = c["enforced_mw"]
            in_flight = 0
            for dt, mw in sorted(c["pending"]):
                if saved + dt <= now:
                    enforced = mw
                else:
                    in_flight = max(in_flight, mw)
            total += max(c["requested_mw"], enforced, in_flight)
        return total / 1000

    def wall_w(self, text: str | None = None, at: float | None = None) -> float | None:
        board = self.board_bound_w(text, at)
        return None if board is None else (board + HOST_W) / PSU_EFFICIENCY

    def stop(self) -> None:
        reap(getattr(self, "proc", None), 15)
        if getattr(self, "_supervisor", None) is not None:
            self._supervisor.join(60)
        try:
            self._sock.close()
        except (AttributeError, OSError):
            pass

    def events(self) -> list[dict]:
        return json_lines(self.log.read_text())


class Checker:
    """Samples every host's wall power (from its truth) every ``period_s`` and records
    the circuit's sum; :meth:`assert_within` raises on any sample above the budget."""

    def __init__(self, hosts: list[Host], budget_w: float, period_s: float = 0.1,
                 sharers: Sequence[Sharer] = ()) -> None:
        self.hosts = hosts
        self.sharers = sharers  # in-process hosts: their modelled draw, sampled beside the daemons' truth
        self.budget_w = budget_w
        self.period_s = period_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Checker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            t, walls = self.collect()
            walls |= {s.host: s.draw_w() for s in self.sharers}
            self.samples.append((t, walls))
            self._stop.wait(self.period_s)

    def collect(self) -> tuple[float, dict[str, float]]:
        """Every host's wall power at one instant: the state files read twice over, until
        no file changed between its two reads (a double collect), each evaluated at the
        instant between the passes. One pass alone joins a host read before a move to one
        read after it (a donor's old limits beside a recipient's new ones: a sum that
        never was), whenever this thread is held up between two reads."""
        # A host counts from its first READY=1 on (its boot limits confirmed): before
        # that its cards are at whatever they came up with, which nothing enforces.
        hosts = [h for h in self.hosts if h.booted]
        first = {h.name: h.state_text() for h in hosts}
        while True:
            t = time.monotonic()
            second = {h.name: h.state_text() for h in hosts}
            if second == first:
                break
            first = second
        walls = {h.name: w for h in hosts
                 if (text := first[h.name]) is not None and (w := h.wall_w(text, t)) is not None}
        return t, walls

    def worst_margin_w(self) -> float:
        return min(self.budget_w - sum(w.values()) for _, w in self.samples)

    def assert_within(self) -> float:
        assert len(self.samples) > 10
        over = [(t, w) for t, w in self.samples if sum(w.values()) > self.budget_w + 1e-3]
        assert not over, f"circuit over budget {self.budget_w} W at {len(over)} samples, first {over[0]}"
        return self.worst_margin_w()

    def at_reserve_s(self, host: str, reserve_w: float, since: float, until: float | None = None) -> float:
        """Time (s) ``host`` spent at or below its reserve between ``since`` and ``until``."""
        pts = [(t, w.get(host)) for t, w in self.samples if t >= since and (until is None or t <= until)]
        return sum(self.period_s for _, w in pts if w is not None and w <= reserve_w + 1e-3)

    def wall_at(self, host: str, t: float) -> float | None:
        best = min(self.samples, key=lambda s: abs(s[0] - t))
        return best[1].get(host)


def init_circuit(endpoints: list[str], name: str, budget_w: float, ttl_s: int) -> None:
    r = subprocess.run([EXE, "circuit", "init", "--name", name, "--budget-w", str(budget_w), "--ttl", str(ttl_s),
                        *[a for e in endpoints for a in ("--endpoint", e)]], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def circuit_status(endpoints: list[str], name: str) -> dict:
    r = subprocess.run([EXE, "circuit", "status", "--json", "--name", name,
                        *[a for e in endpoints for a in ("--endpoint", e)]], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def circuit_cli(endpoints: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``powerbudgetd circuit ARGS --endpoint ...`` (the operator's box: no config)."""
    return subprocess.run([EXE, "circuit", *args, *[a for e in endpoints for a in ("--endpoint", e)]],
                          capture_output=True, text=True, timeout=30)


def etcd_edit(endpoints: list[str], name: str, *, put: dict[str, bytes] | None = None, delete: tuple[str, ...] = (),
              wipe: bool = False, lease_ttl_s: int | None = None) -> None:
    """What anyone with write access to the circuit's prefix can do: delete all of it
    (``wipe``); then, in one transaction (so no daemon's round falls between them),
    delete keys below it and put raw values there (under a new lease of ``lease_ttl_s``
    s, else none). Keys are relative to the circuit (``seats/h0``)."""
    async def go() -> None:
        store = CircuitStore(endpoints, name, timeout_s=5)
        try:
            if wipe:
                await store.wipe()
            lease = (await store.grant_lease(lease_ttl_s))[0] if lease_ttl_s else None
            if put or delete:
                await store._call(lambda c: c.transaction(compare=[], success=[
                    *[c.transactions.delete(store.base + k.encode()) for k in delete],
                    *[c.transactions.put(store.base + k.encode(), v, lease=lease) for k, v in (put or {}).items()],
                ], failure=[]))
        finally:
            await store.close()

    asyncio.run(go())


def granted(hosts: list[Host], at_least: int) -> bool:
    """Whether at least ``at_least`` of ``hosts`` have a grant in use."""
    return sum(1 for h in hosts if (h.metric("powerbudgetd_circuit_grant_watts") or 0) > 0) >= at_least


def start_hosts(hosts: list[Host]) -> None:
    """The set-up step (each seat registered before its daemon first runs: else a host
    booting while another holds the pool runs on a reserve not yet counted), then the
    daemons, until each is ready."""
    try:
        for h in hosts:
            h.join()
        for h in hosts:
            h.start()
        for h in hosts:
            h.wait_ready()
    except BaseException:
        stop_hosts(hosts)  # no daemon outlives a failed start (the caller's finally never runs)
        raise


def stop_hosts(hosts: list[Host]) -> None:
    for h in hosts:
        h.stop()


# -- in-process hosts: the grant protocol without cards ------------------------------------

# A panel over UPS feeds A and B (8 kW each), an oversubscribed pair shed within 2 s, four
# hosts corded half to each with 1 kW seats.
PAIR_TREE = """
[nodes.root]
kind = "panel"
budget_w = 20000

[nodes.A]
kind = "ups"
parent = "root"
budget_w = 8000

[nodes.B]
kind = "ups"
parent = "root"
budget_w = 8000

[[pairs]]
feeds = ["A", "B"]
mode = "oversubscribed"
shed_s = 2

[hosts]
h1 = { cords = { A = 0.5, B = 0.5 }, reserve_w = 1000 }
h2 = { cords = { A = 0.5, B = 0.5 }, reserve_w = 1000 }
h3 = { cords = { A = 0.5, B = 0.5 }, reserve_w = 1000 }
h4 = { cords = { A = 0.5, B = 0.5 }, reserve_w = 1000 }
"""

ROUND_S = POLL_S  # the daemon's round


class Sharer:
    """One in-process host doing a daemon's grant round (no cards): read the circuit,
    the grant policy's target, raise by transaction or lower; its want published. Its
    modelled wall draw (:meth:`draw_w`) is its seat plus the grant in use: raised after
    etcd, lowered before it, as the daemon's cards are. Its lease lasts ``lease_ttl_s``
    (s; support.timings says which)."""

    def __init__(self, eps: list[str], host: str, release_hold_s: float = 10.0, circuit: str = "row",
                 lease_ttl_s: int = SHARER_LEASE_TTL_S) -> None:
        self.lease_ttl_s = lease_ttl_s
        self.store = CircuitStore(eps, circuit, timeout_s=5)
        self.host = host
        self.policy = GrantPolicy(release_hold_s=release_hold_s)
        self.lease = 0
        self.seat_w = self.in_use_w = 0.0
        self.renewed = 0.0  # when the lease was last renewed (monotonic s)

    def draw_w(self) -> float:
        return self.seat_w + self.in_use_w

    async def join(self, seat_w: float, want_w: float) -> None:
        self.seat_w = seat_w
        self.lease = (await self.store.grant_lease(self.lease_ttl_s))[0]
        self.renewed = time.monotonic()
        await self.store.put_record(self.host, HostRecord(want_w=want_w), self.lease)
        for attempt in range(300):  # a compare that fails only means something changed: read again
            if await self.store.register_seat(await self.store.read(), self.host, seat_w):
                return
            if attempt == 0:  # as the daemon does: its reserve counted while it waits (the others shed for it)
                await self.store.put_pending(self.host, seat_w, self.lease)
            await asyncio.sleep(0.05)
        raise AssertionError(f"{self.host}: its seat of {seat_w} W never fitted")

    async def want(self, want_w: float) -> None:
        await self.store.put_record(self.host, HostRecord(want_w=want_w), self.lease)

    async def round(self) -> None:
        if time.monotonic() - self.renewed >= self.lease_ttl_s / 6:  # as the daemon renews: its grant lives on
            await self.store.keepalive(self.lease)
            self.renewed = time.monotonic()
        read = await self.store.read()
        held = read.view.grants.get(self.host, 0.0)
        target = self.policy.target_w(read.view, self.host, held, time.monotonic())
        if target > held and raise_allowed(read.view, self.host, target):
            if await self.store.raise_grant(read, self.host, target, self.lease):
                self.in_use_w = target
        elif target < held:
            self.in_use_w = target  # the cards first, then etcd
            await self.store.lower_grant(self.host, target, self.lease)


async def rounds_until(sharers: list[Sharer], done, limit_s: float, check=None) -> float:
    """Rounds of every sharer at once, every ROUND_S, until ``done(view)``; ``check(view)``
    after each round. Returns the time taken (s)."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        await asyncio.gather(*(s.round() for s in sharers))
        view = (await sharers[0].store.read()).view
        if check is not None:
            check(view)
        if done(view):
            return time.monotonic() - start
        await asyncio.sleep(ROUND_S)
    raise AssertionError(f"not within {limit_s} s: {(await sharers[0].store.read()).view}")
