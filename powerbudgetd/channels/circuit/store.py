"""The circuit in etcd: keys, reads, and the transactions that keep it within budget.

Keys, under ``<prefix>/<circuit>/``::

    spec            {"budget_w", "ttl_s"}      written once by ``circuit init``
    tree            {"nodes", "hosts", "pairs"} a power tree (``circuit init --tree``),
                                               written with the spec: its root's budget
    seats/<host>    {"reserve_w"}              persistent: the host's reserve (wall W)
    claims/<host>   {"machine_id", "boot_id", "pid", "watchdog_s", "fallback_s",
                     "reserve_w"}              under the host's lease, created only where
                                               none is: one daemon per name
    grants/<host>   {"grant_w"}                under the host's lease
    wants/<host>    {"want_w", "caps_w", "draw_w", "seat_w", "grant_w", "max_w"}
                                               under the lease: the host's record, each round
    pending/<host>  {"reserve_w"}              under the lease: a seat that did not fit
    down/<feed>     {"by"}                     persistent: a feed of the tree known lost
                                               (the operator's ``circuit feed-down``; one at a time)
    marks/<host>    {"feed", "by"}             under the host's lease: the feed its UPS carries,
                                               on battery (``[ups] feed``): lost while it lives
    meters/<host>/<node>  {"value_w", "age_s", "changed_s", "refresh_s", "at"}
                                               under the host's lease: its reading of the meter
                                               the tree names for a node above it
                                               (``core.nodemeter``): one key per host, never shared
    delegations/<node> {"watts_w", "by"}       persistent: the lease of watts a node marked
                                               ``delegate`` holds from its parent
                                               (``core.delegation``); written by a host under
                                               it, removed only by ``circuit init``

Every key but the spec, the tree, seats and the operator's ``down/`` marks is written
under its writer's lease, so it ends with its writer. One found without a lease (written
by hand, or over a daemon's) has no live writer: it is left out of the read and named in
:attr:`Read.unleased` (a host's name then is free to claim, and no unseated "live" host
holds anyone's seat out). Seats are persistent on purpose: a host's reserve stays counted
while its daemon is down. Each host writes only keys named after it (and its seat), so
etcd's per-key permissions can confine it (:func:`roles_script`).

Every value read goes through ``records`` (bounded size and depth, finite numbers);
one that fails is reported in :attr:`Read.bad` and never raises.

A grant (or a seat) is raised only by a transaction whose compares fail when the spec,
any seat, any grant or any claim changed since the read it was computed from: the
spec's mod revision as read, and every key in the seats, grants and claims ranges no
newer than the read revision (one compare per range, so the transaction's size does
not grow with the hosts). A deletion can only lower the sum, so it need not fail the
compare. Lowering a grant is a plain put or delete. Hence at every revision
``sum(seats) + sum(grants) <= budget``; on a power tree the same at every node (the
caller checks each node on the host's paths, ``core.circuit``; the tree's key is
compared too), so two hosts under different branches raising at once cannot overfill
their shared parent: one transaction fails and reads again.

With delegations stored, every check is ``core.delegation``'s (each node's charge within
its bound), and a raise under a delegated node compares only its zone: its neighbours'
seats, grants and claims (no newer than the read) and the delegation records it depends
on (at exactly the mod revision read), so raises under different delegated nodes never
conflict. A delegation is changed only by a transaction comparing what the parent's
check depends on (``core.delegation.lease_compares``: every seat and claim range, the
feed marks, the grants charged outside any lease on its path up to the nearest lease
above it, that lease, the leases beside it under that one and those just below it), so
a raise under another delegated node does not fail it, nor a lease nested under another.

Reads: while a watch stands (:meth:`CircuitStore.changes`) a read is built from its
mirror (``channels.circuit.mirror``), with no key read from etcd; else one range read.

Several endpoints: each call goes to the current one; a call that fails or takes
longer than ``timeout_s`` raises :class:`StoreUnavailable` and the next call goes to
the next endpoint (etcd forwards writes to its leader).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.utils
import aetcd.watcher
import grpc

from powerbudgetd.channels.circuit import records
from powerbudgetd.channels.circuit.mirror import CircuitMirror, Entry
from powerbudgetd.core.circuit import CircuitView
from powerbudgetd.core.nodemeter import MeterReport, NodeMeter, check_source, node_meters, unmanaged_by_node
from powerbudgetd.core.delegation import Charges, active, delegation_fits, larger_w, lease_compares, raise_compares
from powerbudgetd.core.tree import KINDS, MODES, Host, Node, Pair, PowerTree
from powerbudgetd.core.units import to_ms

T = TypeVar("T")

# Tree values parsed in this process, and what each gave (a few: one daemon reads one
# circuit; in-process hosts of one circuit share the shape, and with it its memo).
_SHAPES: dict[bytes, PowerTree | str] = {}

# The circuit's Python work (a tree's checks, a read's build, the division and the leases'
# figures): tens to hundreds of milliseconds on a hall, none of it on the event loop, on
# a thread of its own (named in the daemon's per-thread CPU), which nothing else queues on.
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="powerbudgetd-circuit")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the circuit's worker thread, its context (the log's bound fields)
    with it; the loop goes on meanwhile."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_WORKER, call)


MIRROR_CONFIRM_S = 1.0  # a read from the watch's mirror checks it against etcd's revision at least this often (s)
MIRROR_WAIT_S = 0.5  # ... and waits this long for it to get there before reading the range (s)


class StoreUnavailable(Exception):
    """No answer from etcd within the timeout (or an error on the way); retried."""


class StoreRefused(StoreUnavailable):
    """etcd answered but refused: authentication failed, or this user may not do that."""


class StoreFull(StoreUnavailable):
    """etcd's NOSPACE alarm is raised: reads are answered, every write refused until an
    operator compacts, defragments and disarms it."""


_REFUSED = ("permission denied", "authentication failed", "invalid auth token", "user name is empty",
            "user name not found", "role is not granted", "auth: ")
_FULL = ("database space exceeded", "no space")


class LeaseGone(Exception):
    """The lease is not known to etcd any more: it expired or was revoked."""


@dataclass(frozen=True)
class Spec:
    """A circuit as ``circuit init`` stored it: wall budget (W) and lease TTL (s)."""

    budget_w: float
    ttl_s: int


@dataclass(frozen=True)
class Claim:
    """A daemon's claim on a host name (``claims/<host>``, under its lease): which
    machine (``/etc/machine-id``) and boot (``boot_id``) it runs on, its PID, the
    deadlines that bound its grace (``watchdog_s``: 0 when no watchdog is enforced;
    ``fallback_s``), its reserve (W) and its lease."""

    machine_id: str
    boot_id: str
    pid: int
    watchdog_s: float
    fallback_s: float
    reserve_w: float
    lease: int = 0
    mod: int = 0

    def identity(self) -> str:
        return f"machine {self.machine_id} boot {self.boot_id} pid {self.pid}"

    def same_boot(self, other: Claim) -> bool:
        return (self.machine_id, self.boot_id) == (other.machine_id, other.boot_id)


@dataclass(frozen=True)
class HostRecord:
    """What a live host publishes each round under its lease (``wants/<host>``), in wall
    W: its want above the reserve, its sum of caps (the highest limit that may be in
    force on each card) and its measured draw (the cards' 1 s averages; None while a
    card's reading is unknown), both through its feed model to the plug, the seat
    and grant it holds as it sees them, and its nameplate (``max_w``: every card at its
    maximum limit, through its feed model; None where not known): the ceiling of the
    spare room it may be handed (``CircuitView.ceilings``)."""

    want_w: float
    caps_w: float | None = None
    draw_w: float | None = None
    seat_w: float | None = None
    grant_w: float | None = None
    lease: int = 0
    max_w: float | None = None


@dataclass(frozen=True)
class Read:
    """One consistent read of a circuit (one etcd revision).

    ``leases``: each live host's
    lease id (from its claim, else its record); ``spec_mod``/``spec_created``: the spec
    key's mod and create revisions (0: none; a new create revision is a re-created
    circuit); ``claims``, ``records``: each host's; ``bad``: each key whose value could
    not be read, with why (see ``records``).
    """

    spec: Spec | None
    view: CircuitView
    revision: int
    spec_mod: int = 0
    leases: dict[str, int] = field(default_factory=dict)
    spec_created: int = 0
    claims: dict[str, Claim] = field(default_factory=dict)
    records: dict[str, HostRecord] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)
    tree_mod: int = 0  # the tree key's mod revision (0: none)
    down: dict[str, str] = field(default_factory=dict)  # each feed marked lost: who marked it
    marks: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # each host's mark: (feed, by, lease)
    unleased: dict[str, int] = field(default_factory=dict)  # keys left out for want of a lease: mod revision
    free_claims: dict[str, int] = field(default_factory=dict)  # hosts whose claim has no lease: its mod revision
    meters: dict[str, NodeMeter] = field(default_factory=dict)  # each metered node's figures (core.nodemeter)
    delegations: dict[str, float] = field(default_factory=dict)  # each node's lease of watts (W)
    delegation_mods: dict[str, int] = field(default_factory=dict)  # each delegation record's mod revision

    _memo: dict[object, Any] = field(default_factory=dict, compare=False, repr=False)  # what one read computes once

    def charges(self) -> Charges | None:
        """The tree's charges under the delegations read (``core.delegation``), None off a
        tree, on one that could not be read, or with no delegation in force (computed
        once per read)."""
        if "charges" not in self._memo:
            tree = self.view.tree
            live = {} if tree is None or self.view.tree_bad else active(tree, self.delegations)
            self._memo["charges"] = Charges(tree, live, self.view.lost) if tree is not None and live else None
        return self._memo["charges"]

    def table_charged_w(self) -> list[dict[str, float]]:
        """Each node's charge under the delegations read, per table (W;
        ``Charges.table_loads_w`` at :meth:`held_w`; empty with none in force; computed
        once per read)."""
        if "table_charged" not in self._memo:
            charges = self.charges()
            self._memo["table_charged"] = [] if charges is None else charges.table_loads_w(self.held_w())
        out: list[dict[str, float]] = self._memo["table_charged"]
        return out

    def charged_w(self) -> dict[str, float]:
        """Each node's charge under the delegations read (W; ``core.delegation``: the
        larger of committed and flow, ``larger_w``; empty with none in force;
        computed once per read)."""
        if "charged" not in self._memo:
            self._memo["charged"] = larger_w(self.table_charged_w())
        charged: dict[str, float] = self._memo["charged"]
        return charged

    def held_w(self) -> dict[str, float]:
        """Each host's seat (or pending reserve) plus grant, and each live unseated host's
        claimed reserve (W): what a check counts (computed once per read; not to be
        changed)."""
        if "held" not in self._memo:
            self._memo["held"] = self.view.carried_by_host_w()
        held: dict[str, float] = self._memo["held"]
        return held

    def room_for_w(self, host: str) -> float:
        """The most ``host`` may hold in all (W, seat + grant) under the delegations read
        (``Charges.room_for_w`` from the read's own charges; inf with none in force)."""
        charges = self.charges()
        if charges is None:
            return math.inf
        return charges.room_for_w(host, self.held_w(), self.table_charged_w())


@dataclass(frozen=True)
class Tls:
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None


class _Client(aetcd.Client):
    """aetcd's client over a TLS channel when asked (aetcd itself dials plain text)."""

    def __init__(self, host: str, port: int, *, tls: Tls | None, **kwargs: Any) -> None:
        super().__init__(host, port, **kwargs)
        self._tls = tls

    async def connect(self) -> None:
        if self._tls is None or self._connected.is_set():
            await super().connect()
            return

        def read(path: Path | None) -> bytes | None:
            return None if path is None else path.read_bytes()

        creds = grpc.ssl_channel_credentials(read(self._tls.ca_file), read(self._tls.key_file), read(self._tls.cert_file))
        self.channel = aetcd.rpc.secure_channel(f"{self._host}:{self._port}", creds, options=self._options.items())
        if self._username is not None and self._password is not None:
            self.auth_stub = aetcd.rpc.AuthStub(self.channel)
            resp = await self.auth_stub.Authenticate(
                aetcd.rpc.AuthenticateRequest(name=self._username, password=self._password), timeout=self._timeout
            )
            self.metadata = (("token", resp.token),)
        self.kvstub = aetcd.rpc.KVStub(self.channel)
        self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
        self.leasestub = aetcd.rpc.LeaseStub(self.channel)
        self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
        self._watcher = aetcd.watcher.Watcher(aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata)
        self._connected.set()


WATCH_PING_S = 6.0  # a watch's stream pinged this often (etcd refuses pings under 5 s apart)


def raise_if_cancelled() -> None:
    """A call's failure while this task is being cancelled is the cancellation: grpc's
    asyncio calls answer a cancel with a CANCELLED error, which aetcd turns into its own
    and Python 3.11's ``asyncio.wait_for`` passes on. Taken for an etcd outage, a stop
    would be swallowed and the daemon would never leave."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _range_end(prefix: bytes) -> bytes:
    return aetcd.utils.prefix_range_end(prefix)


def _spec(doc: dict[str, Any]) -> Spec:
    budget = records.watts(doc, "budget_w")
    ttl = doc.get("ttl_s")
    if budget is None or budget <= 0 or isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= 3600:
        raise records.BadRecord("budget_w must be > 0 W and ttl_s a whole number of seconds in [1, 3600]")
    return Spec(budget, ttl)


def tree_doc(tree: PowerTree) -> dict[str, Any]:
    """The power tree as the ``tree`` key stores it (reserves are the seats: not kept)."""
    return {
        "nodes": {n.name: {"budget_w": n.rated_w, "parent": n.parent, "kind": n.kind,
                           **({} if n.meter is None else {"meter": n.meter}),
                           **({"delegate": True} if n.delegate else {})} for n in tree.nodes.values()},
        "hosts": {h.name: {"cords": dict(h.cords), "priority": h.priority} for h in tree.hosts.values()},
        "pairs": [{"feeds": sorted(p.feeds), "mode": p.mode, "shed_s": p.shed_s} for p in tree.pairs.values()],
    }


def tree_from_doc(doc: dict[str, Any], seats: dict[str, float]) -> PowerTree:
    """The ``tree`` key's power tree, each host's seat as its reserve; BadRecord naming
    the node, host or pair that is not one ``circuit init --tree`` could have written."""
    nodes, hosts, pairs = doc.get("nodes"), doc.get("hosts"), doc.get("pairs", [])
    if not isinstance(nodes, dict) or not isinstance(hosts, dict) or not isinstance(pairs, list):
        raise records.BadRecord("nodes and hosts must be objects, pairs a list")
    out_nodes: dict[str, Node] = {}
    for name, n in nodes.items():
        if not isinstance(n, dict):
            raise records.BadRecord(f"nodes.{name}: not an object")
        parent = n.get("parent")
        kind = n.get("kind", "circuit")
        meter = n.get("meter")
        delegate = n.get("delegate", False)
        if parent is not None and not isinstance(parent, str) or kind not in KINDS or not isinstance(delegate, bool):
            raise records.BadRecord(f"nodes.{name}: parent must be a node's name, kind one of {', '.join(KINDS)}, "
                                    "delegate true or false")
        if meter is not None:
            try:
                check_source(meter if isinstance(meter, str) else "")
            except ValueError as exc:
                raise records.BadRecord(f"nodes.{name}: {exc}") from None
        out_nodes[name] = Node(name, records.watts(n, "budget_w") or 0.0, parent, kind, meter, delegate=delegate)
    out_hosts: dict[str, Host] = {}
    for name, h in hosts.items():
        cords, priority = (h.get("cords"), h.get("priority", 0)) if isinstance(h, dict) else (None, None)
        if not isinstance(cords, dict) or isinstance(priority, bool) or not isinstance(priority, int) \
                or not -100 <= priority <= 100:
            raise records.BadRecord(f"hosts.{name}: cords must be an object, priority a whole number in [-100, 100]")
        shares = {leaf: records.fraction(cords, leaf) for leaf in cords}
        out_hosts[name] = Host(name, shares, seats.get(name, 0.0), priority)
    out_pairs: dict[frozenset[str], Pair] = {}
    for i, p in enumerate(pairs):
        feeds = p.get("feeds") if isinstance(p, dict) else None
        if not isinstance(feeds, list) or len(set(map(str, feeds))) != 2 or p.get("mode") not in MODES:
            raise records.BadRecord(f"pairs[{i}]: two feeds and a mode ({', '.join(MODES)})")
        pair = frozenset(map(str, feeds))
        out_pairs[pair] = Pair(pair, p["mode"], records.seconds(p, "shed_s", optional=True))
    try:
        return PowerTree(out_nodes, out_hosts, out_pairs)
    except ValueError as exc:
        raise records.BadRecord(str(exc)[:200]) from None


def _meter_report(rest: str, doc: dict[str, Any]) -> MeterReport:
    """``meters/<host>/<node>``'s report; BadRecord for a key or value the daemon would not write."""
    host, sep, node = rest.partition("/")
    if not sep or not host or not node or "/" in node:
        raise records.BadRecord("a meter key is meters/<host>/<node>")
    return MeterReport(node, host, records.watts(doc, "value_w") or 0.0, records.seconds(doc, "age_s") or 0.0,
                       records.seconds(doc, "changed_s") or 0.0, records.seconds(doc, "refresh_s", optional=True),
                       records.stamp(doc, "at"))


def _meter_news(rest: str, before: Entry | None, after: Entry | None, now: float, alone: bool) -> bool:
    """Whether a meter report's change (``meters/<rest>``, told at wall-clock ``now``)
    may call for a grant to come down: any report of a node another host also reports
    (the node counts whichever report is newest, ``core.nodemeter.node_meters``: one
    host's same reading may replace another's lower one), a new or removed report, one
    that cannot be read, a reading that rose, or one replacing a reading stale by then
    (a stale reading counts no unmanaged load). Its only reporter's same or lower
    reading replacing a fresh one leaves as much room or more. ``alone``: no other
    host reports the node."""
    if not alone or before is None or after is None:
        return True
    try:
        was, new = _meter_report(rest, before.doc()), _meter_report(rest, after.doc())
    except records.BadRecord:
        return True
    return new.value_w > was.value_w or not was.fresh_at(max(now, new.at))


def _claim(doc: dict[str, Any], lease: int, mod: int) -> Claim:
    pid = doc.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:
        raise records.BadRecord("pid: not a process id")
    return Claim(records.text(doc, "machine_id"), records.text(doc, "boot_id"), pid,
                 records.seconds(doc, "watchdog_s") or 0.0, records.seconds(doc, "fallback_s") or 0.0,
                 records.watts(doc, "reserve_w") or 0.0, lease, mod)


def stored_fields(record: HostRecord) -> dict[str, float]:
    """A record's figures as etcd holds them (W, to 0.1 W; an unknown one left out)."""
    return {k: round(v, 1) for k, v in (("want_w", record.want_w), ("caps_w", record.caps_w),
            ("draw_w", record.draw_w), ("seat_w", record.seat_w), ("grant_w", record.grant_w),
            ("max_w", record.max_w)) if v is not None}


def _grant_w(entry: Entry | None) -> float | None:
    """The grant (W) a grant key's entry holds: 0 where there is none, None where it
    cannot be read."""
    if entry is None:
        return 0.0
    try:
        return records.watts(entry.doc(), "grant_w")
    except records.BadRecord:
        return None


def _record(doc: dict[str, Any], lease: int) -> HostRecord:
    def w(key: str) -> float | None:
        return records.watts(doc, key, optional=True)

    return HostRecord(records.watts(doc, "want_w") or 0.0, w("caps_w"), w("draw_w"), w("seat_w"), w("grant_w"), lease,
                      w("max_w"))


class CircuitStore:
    """One circuit's keys in etcd, over ``endpoints`` (``host:port``).

    Every method raises :class:`StoreUnavailable` when etcd does not answer within
    ``timeout_s``, and :class:`LeaseGone` when a put names a lease etcd no longer has.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        name: str,
        *,
        prefix: str = "/powerbudgetd/circuits",
        timeout_s: float = 2.0,
        tls: Tls | None = None,
        username: str | None = None,
        password: str | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.name = name
        self.timeout_s = timeout_s
        self._tls = tls
        self._auth = (username, password)
        self._index = 0
        self._client: _Client | None = None
        base = f"{prefix.rstrip('/')}/{name}/".encode()
        self.base = base
        self.spec_key = base + b"spec"
        self.tree_key = base + b"tree"
        self.seats = base + b"seats/"
        self.grants = base + b"grants/"
        self.wants = base + b"wants/"
        self.pending = base + b"pending/"
        self.claims = base + b"claims/"
        self.down = base + b"down/"
        self.marks = base + b"marks/"
        self.meters = base + b"meters/"
        self.wall_clock = wall_clock  # a meter report's age: hosts on one circuit keep NTP time
        self.delegations = base + b"delegations/"
        self._meters_calm: set[bytes] = set()  # meter keys whose last change told was no news (_meter_news)
        self._reporters: dict[str, set[str]] = {}  # a metered node's reporting hosts, as the watch has them
        self.calls = 0  # etcd requests sent (for the load test's ops/s)
        self.range_reads = self.keys_read = 0  # range reads of the circuit sent, and the keys they returned
        self.mirror_lagged = 0  # reads that found the mirror behind this store's own write (read the range)
        self.mirror = CircuitMirror()  # kept by the watch (changes); reads are served from it while it stands
        self._wrote = True  # a write since the last read: the mirror must reach etcd's revision first
        self.confirm_s = MIRROR_CONFIRM_S
        self._confirmed_at = -math.inf  # when a read last found the mirror at etcd's revision (monotonic s)
        self._last_range: dict[bytes, Entry] = {}  # the last range read's keys (their parsed values reused)
        self._probe_key = base + b"\x00"  # no key: a read of it answers etcd's revision alone
        self._tree_last: PowerTree | str | None = None  # what the tree value last read gave

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._index]

    def _connect(self) -> _Client:
        if self._client is None:
            host, _, port = self.endpoint.rpartition(":")
            self._client = _Client(host.strip("[]"), int(port), tls=self._tls, username=self._auth[0],
                                   password=self._auth[1], timeout=None)
        return self._client

    async def _call(self, fn: Callable[[_Client], Awaitable[T]], *, write: bool = True) -> T:
        """``fn`` on the current endpoint's client (``write``: it may change the circuit,
        so that the next read from the mirror waits to see it)."""
        client = self._connect()
        self.calls += 1
        self._wrote = self._wrote or write
        try:
            async with asyncio.timeout(self.timeout_s):  # not wait_for: on 3.11 it may swallow a cancel
                return await fn(client)
        except (TimeoutError, aetcd.exceptions.ClientError, grpc.RpcError, OSError) as exc:
            raise_if_cancelled()
            if _lease_not_found(exc):
                raise LeaseGone(str(exc)) from None
            failed = self.endpoint
            text = str(exc).lower()
            if any(s in text for s in _FULL):  # every member shares the alarm: no use moving on
                raise StoreFull(f"{failed}: {exc}") from None
            await self._rotate()  # refused too: a new connection authenticates again (an expired token)
            cls = StoreRefused if any(s in text for s in _REFUSED) else StoreUnavailable
            raise cls(f"{failed}: {type(exc).__name__}: {exc}".rstrip(": ")) from None
        finally:
            self._wrote = self._wrote or write  # a read begun while it was on its way asks again

    async def _rotate(self) -> None:
        client, self._client = self._client, None
        self._index = (self._index + 1) % len(self.endpoints)
        if client is not None:
            try:
                async with asyncio.timeout(1.0):
                    await client.close()
            except Exception:  # noqa: BLE001 - a dead channel may fail to close; it is dropped
                pass

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                async with asyncio.timeout(1.0):
                    await client.close()
            except Exception:  # noqa: BLE001
                pass

    def key(self, kind: bytes, host: str) -> bytes:
        return kind + host.encode()

    def host_keys(self, host: str) -> list[bytes]:
        """Every key ``host``'s daemon (and its ``circuit join`` and ``failsafe``) writes:
        the only ones its etcd role needs write access to."""
        return [self.key(k, host) for k in (self.seats, self.claims, self.grants, self.wants, self.pending, self.marks)]

    def meter_prefix(self, host: str) -> bytes:
        """The prefix of ``host``'s meter reports (``meters/<host>/``, one key a node): its
        role writes under it (the trailing slash: ``gpu1``'s does not cover ``gpu10``'s)."""
        return self.meters + host.encode() + b"/"

    def pressing(self, key: bytes) -> bool:
        """Whether a change of ``key`` (another host's, as :meth:`changes` last told it)
        may call for this host's grant to come down, and so must not wait for the wake
        budget (``core.circuit.WakeBudget``): the circuit's rules (spec, tree, feed
        marks), a meter's report unless it was no news (:func:`_meter_news`), a host
        running on a reserve not yet seated (pending) or claiming its name. Seats (each
        registered only where it fits), grants, wants and leases of watts (a lease never
        shrinks below what its hosts hold) are chances."""
        if key.startswith(self.meters):
            return key not in self._meters_calm
        return key.startswith((self.spec_key, self.tree_key, self.down, self.marks, self.pending, self.claims))

    def meter_key(self, host: str, node: str) -> bytes:
        return self.meter_prefix(host) + node.encode()

    def operator_keys(self) -> list[tuple[bytes, str]]:
        """Keys only the operator should write, as (key, what), for the start-up check of
        a daemon's credential (a host that can write them can raise every host, or take
        another host's name or grant)."""
        return [(self.spec_key, "the spec (the budget)"), (self.tree_key, "the power tree"),
                (self.down, "the operator's feed marks"), (self.seats, "other hosts' seats"),
                (self.claims, "other hosts' claims"), (self.grants, "other hosts' grants")]

    async def changes(self, endpoint: str) -> AsyncIterator[bytes | None]:
        """The circuit's keys as etcd changes them: one range read, then a watch on its
        prefix from the next revision, through ``endpoint`` (``host:port``), on a
        connection of its own (a stream never holds up a read or a keepalive). Keeps
        :attr:`mirror` (``channels.circuit.mirror``): every change applied before it is
        told, live from the read until the watch ends. Yields ``None`` once the watch is
        in place (changes from then on are all told), then each changed key (a record
        whose draw or caps alone moved, and a grant raised, are not told).
        Raises :class:`StoreUnavailable` when the watch cannot be opened within
        ``timeout_s`` or its stream ends (a member stopped, a partition healed into a
        compacted revision), or a ping is not answered within ``timeout_s`` (a member
        hung, or cut off with the connection left open: a quiet stream says nothing)."""
        host, _, port = endpoint.rpartition(":")
        # A stream with no events says nothing: pinged, so that a member that stopped
        # answering (hung, or cut off with the connection left open) ends the watch.
        pings = {"grpc.keepalive_time_ms": to_ms(WATCH_PING_S),
                 "grpc.keepalive_timeout_ms": max(1000, to_ms(self.timeout_s)),
                 "grpc.http2.ping_timeout_ms": max(1000, to_ms(self.timeout_s)),
                 "grpc.http2.max_pings_without_data": 0}  # else gRPC stops pinging a quiet stream after 2
        client = _Client(host.strip("[]"), int(port), tls=self._tls, username=self._auth[0], password=self._auth[1],
                         timeout=None, options=pings)
        mirror = self.mirror
        try:
            try:
                async with asyncio.timeout(self.timeout_s):
                    res = await client.get_prefix(self.base)
                    revision = int(res.header.revision)
                    self.range_reads += 1
                    kvs = self._entries(res)
                    self.keys_read += len(kvs)
                    watch = await client.watch_prefix(self.base, start_revision=revision + 1)
            except (TimeoutError, aetcd.exceptions.ClientError, grpc.RpcError, OSError) as exc:
                raise_if_cancelled()
                raise StoreUnavailable(f"{endpoint}: watch: {type(exc).__name__}: {exc}".rstrip(": ")) from None
            mirror.load(kvs, revision)
            mirror.live = True
            self._meters_calm.clear()
            self._reporters.clear()
            for key, _ in kvs:
                if key.startswith(self.meters):
                    self._count_reporter(key, True)
            yield None
            told: dict[bytes, tuple[float | None, ...]] = {}  # a record's want, seat and grant, as last told
            try:
                # No await but the stream's between two events: a revision's events are
                # applied together before any other task looks (``mirror``).
                async for event in watch:
                    kv = event.kv
                    key = bytes(kv.key)
                    was = _grant_w(mirror.kvs.get(key)) if key.startswith(self.grants) else None
                    meter = key.startswith(self.meters)
                    before = mirror.kvs.get(key) if meter else None
                    if event.kind == "DELETE":
                        mirror.delete(key, int(kv.mod_revision))
                    else:
                        mirror.put(key, bytes(kv.value), int(kv.mod_revision), int(kv.create_revision), int(kv.lease))
                        now = _grant_w(mirror.kvs.get(key)) if was is not None else None
                        if now is not None and was is not None and now >= was:
                            # A grant raised takes watts (its transaction checked it beside
                            # every seat and grant): no other host has anything to do at
                            # once, and its record tells the new grant at the poll's pace.
                            # Told, each raise on a busy circuit woke every other host.
                            continue
                    if key.startswith(self.wants) and not self._metered():
                        # A record's measured draw and caps move with every load swing: told
                        # only with its want, seat or grant (else each host's woken round
                        # publishing its draw woke every other host's: a storm of reads and
                        # writes on a busy circuit). Under a meter, its draw counts: told.
                        try:
                            r = _record(mirror.kvs[key].doc(), 0) if key in mirror.kvs else None
                            figures: tuple[float | None, ...] = (None,) if r is None else \
                                (round(r.want_w, 1), r.seat_w, r.grant_w)
                        except records.BadRecord:
                            figures = (None,)
                        if told.get(key) == figures:
                            continue
                        told[key] = figures
                    if meter:  # (a meter publishes every few seconds: mostly no news)
                        after = mirror.kvs.get(key)
                        alone = self._count_reporter(key, after is not None) <= 1
                        calm = not _meter_news(key[len(self.meters):].decode(errors="replace"), before, after,
                                               self.wall_clock(), alone)
                        (self._meters_calm.add if calm else self._meters_calm.discard)(key)
                    yield key
            except (aetcd.exceptions.ClientError, grpc.RpcError, OSError) as exc:
                raise_if_cancelled()
                raise StoreUnavailable(f"{endpoint}: watch ended: {type(exc).__name__}: {exc}".rstrip(": ")) from None
            raise StoreUnavailable(f"{endpoint}: watch ended")
        finally:
            mirror.stop()
            with contextlib.suppress(Exception):  # a dead channel may fail to close; it is dropped
                async with asyncio.timeout(1.0):
                    await client.close()

    def _count_reporter(self, key: bytes, present: bool) -> int:
        """A meter key (``meters/<host>/<node>``) present or gone: its node's reporting
        hosts now, counted."""
        host, _, node = key[len(self.meters):].decode(errors="replace").partition("/")
        hosts = self._reporters.setdefault(node, set())
        (hosts.add if present else hosts.discard)(host)
        return len(hosts)

    def _metered(self) -> bool:
        """Whether the tree last read has a metered node (the hosts' draw counts)."""
        tree = self._tree_last
        return isinstance(tree, PowerTree) and any(n.meter is not None for n in tree.nodes.values())

    # -- reads ----------------------------------------------------------------------
    async def _tree_shape(self, value: bytes) -> PowerTree | str:
        """The tree key's power tree (no reserves), or why it could not be read: parsed
        and checked only when the value changes, in a worker thread (a large tree's
        checks must not hold up the event loop, and with it the watchdog's ping; the
        process keeps the few values it parsed, ``_SHAPES``)."""
        def parse() -> PowerTree | str:
            try:
                return tree_from_doc(records.parse(value, records.MAX_TREE_BYTES), {})
            except records.BadRecord as exc:
                return str(exc)

        shape = _SHAPES.get(value)
        if shape is None:
            shape = await off_loop(parse)
            if len(_SHAPES) >= 4:
                _SHAPES.clear()
            _SHAPES[value] = shape
        self._tree_last = shape
        return shape

    async def read(self) -> Read:
        """The circuit at one revision: from the watch's mirror while it stands
        (``channels.circuit.mirror``: nothing read from etcd, but after a write of this
        store's, etcd's revision, which the mirror must reach), else a single range read
        over its prefix. A value that cannot be read is left out and named in
        :attr:`Read.bad`; an unreadable seat or grant is counted at the whole budget and
        its host marked unknown."""
        mirror = self.mirror
        now = time.monotonic()
        if mirror.live and (self._wrote or now - self._confirmed_at >= self.confirm_s):
            # This store's own writes seen before its next read, and the watch confirmed
            # in step with etcd at least every confirm_s (a member cut off may keep a
            # stream open, telling nothing): etcd's revision asked, the mirror to reach it.
            self._wrote = False  # a write during the probe asks again at the next read
            probe = await self._call(lambda c: c.get_prefix(self._probe_key), write=False)
            revision = int(probe.header.revision)
            if not await mirror.reached(revision, min(self.timeout_s, MIRROR_WAIT_S)):
                async with mirror.lock:  # one range read brings it forward (the watch's events then skipped)
                    if mirror.revision < revision:
                        self.mirror_lagged += 1
                        kvs, revision = await self._range()
                        if not mirror.live:
                            return await self._build(kvs, revision)
                        mirror.load(kvs, revision)
            self._confirmed_at = now
        if mirror.live:
            revision = mirror.revision
            memo = mirror.memo
            if memo is None or memo[0] != revision:
                # One build per revision, shared by every reader that comes while it runs
                # (the load test's hosts share one mirror): a future, not the Read.
                built = asyncio.ensure_future(self._build(list(mirror.kvs.items()), revision))
                memo = mirror.memo = (revision, built)
                built.add_done_callback(functools.partial(_kept_if_good, mirror, memo))
            read: Read = await asyncio.shield(memo[1])
            return read
        return await self._range_read()

    async def _range_read(self) -> Read:
        kvs, revision = await self._range()
        return await self._build(kvs, revision)

    async def _range(self) -> tuple[list[tuple[bytes, Entry]], int]:
        """The circuit's keys and revision: one range read over its prefix."""
        res = await self._call(lambda c: c.get_prefix(self.base), write=False)
        kvs = self._entries(res)
        self.range_reads += 1
        self.keys_read += len(kvs)
        self._last_range = dict(kvs)
        return kvs, int(res.header.revision)

    def _entries(self, res: Any) -> list[tuple[bytes, Entry]]:
        """A range read's keys as entries, those unchanged since the last one kept (parsed once)."""
        seen = self.mirror.kvs if self.mirror.live else self._last_range
        out = []
        for kv in res:
            key, mod, value = bytes(kv.key), int(kv.mod_revision), bytes(kv.value)
            old = seen.get(key)
            out.append((key, old if old is not None and old.mod == mod and old.value == value else
                        Entry(value, mod, int(kv.create_revision), int(kv.lease))))
        return out

    async def _build(self, kvs: list[tuple[bytes, Entry]], revision: int) -> Read:
        """The :class:`Read` of ``kvs``, the circuit's keys at ``revision``, built on the
        circuit's worker thread (:meth:`_assemble`, :func:`off_loop`): on a hall of
        thousands of hosts that is tens of milliseconds of Python, which on the event loop
        would hold up the control ticks and the watchdog's ping for as long. ``kvs`` is a
        snapshot: the watch goes on changing the mirror meanwhile."""
        tree_value = next((e.value for key, e in kvs if key == self.tree_key), None)
        shape = None if tree_value is None else await self._tree_shape(tree_value)
        return await off_loop(self._assemble, kvs, revision, shape)

    def _assemble(self, kvs: list[tuple[bytes, Entry]], revision: int, shape: PowerTree | str | None) -> Read:
        """:meth:`_build`'s work, off the event loop: ``shape`` is the tree key's power
        tree (no reserves) or why it could not be read (None: no tree key)."""
        spec: Spec | None = None
        spec_mod = spec_created = tree_mod = 0
        tree_value: bytes | None = None
        down: list[str] = []
        marked: dict[str, str] = {}
        host_marks: dict[str, tuple[str, str, int]] = {}
        bad: dict[str, str] = {}
        unleased: dict[str, int] = {}
        free_claims: dict[str, int] = {}
        reports: list[tuple[bytes, MeterReport]] = []
        delegations: dict[str, float] = {}
        delegation_mods: dict[str, int] = {}

        def name(key: bytes) -> str:
            return key.decode(errors="replace")

        for key, e in kvs:
            value, mod, created, lease = e.value, e.mod, e.created, e.lease
            if key == self.spec_key:
                spec_mod, spec_created = mod, created
                try:
                    spec = _spec(e.doc())
                except records.BadRecord as exc:
                    bad[name(key)] = str(exc)
            elif key == self.tree_key:
                tree_mod, tree_value = mod, value
            elif key.startswith(self.down):
                down.append(key[len(self.down):].decode(errors="replace"))
                try:
                    marked[down[-1]] = str(e.doc().get("by", ""))
                except records.BadRecord:
                    marked[down[-1]] = ""
            elif key.startswith(self.meters):
                if not lease:
                    unleased[name(key)] = mod
                    continue
                try:
                    reports.append((key, _meter_report(key[len(self.meters):].decode(errors="replace"),
                                                       e.doc())))
                except records.BadRecord as exc:
                    bad[name(key)] = str(exc)
            elif key.startswith(self.delegations):
                node = key[len(self.delegations):].decode(errors="replace")
                delegation_mods[node] = mod  # compared even when unreadable (left out: safe)
                try:
                    delegations[node] = records.watts(e.doc(), "watts_w") or 0.0
                except records.BadRecord as exc:
                    bad[name(key)] = str(exc)
            elif key.startswith(self.marks):
                if not lease:
                    unleased[name(key)] = mod
                    continue
                try:
                    doc = e.doc()
                    feed, by = records.text(doc, "feed"), records.text(doc, "by")
                except records.BadRecord as exc:
                    bad[name(key)] = str(exc)
                    continue
                host_marks[key[len(self.marks):].decode(errors="replace")] = (feed, by, lease)
                if feed not in marked:  # an operator's mark on the same feed is the one shown
                    down.append(feed)
                    marked[feed] = by
        budget = spec.budget_w if spec else float("inf")
        seats: dict[str, float] = {}
        grants: dict[str, float] = {}
        pending: dict[str, float] = {}
        order: dict[str, int] = {}
        unknown: dict[bytes, set[str]] = {self.seats: set(), self.grants: set()}
        claims: dict[str, Claim] = {}
        recs: dict[str, HostRecord] = {}
        for key, e in kvs:
            mod, created, lease = e.mod, e.created, e.lease
            kind = next((k for k in (self.seats, self.grants, self.wants, self.pending, self.claims)
                         if key.startswith(k)), None)
            if kind is None:
                continue
            host = key[len(kind):].decode(errors="replace")
            if not lease and kind != self.seats:  # its writer's lease is gone (or it never had one)
                unleased[name(key)] = mod
                if kind == self.claims:
                    free_claims[host] = mod
                continue
            try:
                doc = e.doc()
                if kind == self.seats:
                    seats[host], order[host] = records.watts(doc, "reserve_w") or 0.0, created
                elif kind == self.grants:
                    grants[host] = records.watts(doc, "grant_w") or 0.0
                elif kind == self.pending:
                    pending[host] = records.watts(doc, "reserve_w") or 0.0
                elif kind == self.claims:
                    claims[host] = _claim(doc, lease, mod)
                else:
                    recs[host] = _record(doc, lease)
            except records.BadRecord as exc:
                bad[name(key)] = str(exc)
                if kind in (self.seats, self.grants):  # unknown watts: count the whole budget (safe)
                    (seats if kind == self.seats else grants)[host] = budget
                    order.setdefault(host, created)
                    unknown[kind].add(host)
        leases = {h: r.lease for h, r in recs.items() if r.lease}
        leases.update({h: c.lease for h, c in claims.items() if c.lease})
        wants = {h: r.want_w for h, r in recs.items()}
        # Each host's ceiling above its seat (or pending reserve): its nameplate less it.
        ceilings = {h: max(0.0, r.max_w - seats.get(h, pending.get(h, 0.0)))
                    for h, r in recs.items() if r.max_w is not None and h not in unknown[self.seats]}
        tree: PowerTree | None = None
        if tree_value is not None:
            assert shape is not None
            if isinstance(shape, str):
                bad[name(self.tree_key)] = shape
            else:
                tree = shape.with_reserves(seats)
        lost = down[0] if len(down) == 1 else None
        meters: dict[str, NodeMeter] = {}
        if tree is not None and any(n.meter is not None for n in tree.nodes.values()):
            meters = self._node_meters(tree, reports, recs, lost if lost in tree.feeds() else None, bad)
            tree = tree.with_unmanaged(unmanaged_by_node(tree, meters))
        else:
            bad.update({name(k): "a meter report on a circuit whose tree names no meter: ignored" for k, _ in reports})
        if down and tree_value is None:  # a flat circuit has no feeds: a mark means nothing there
            bad[name(self.down)] = f"feeds marked down {down} on a circuit without a power tree: ignored; " \
                "remove them (circuit feed-up FEED)"
            down, lost = [], None
        down_bad = bool(down) and (tree is None or len(down) > 1 or lost not in tree.feeds())
        if down_bad:  # no arithmetic for it: nothing is seated or raised until it is put right
            bad[name(self.down)] = f"feeds down {down}: one feed of the tree at a time (feeds: " + \
                (", ".join(tree.feeds()) if tree else "no tree") + ")"
        view = CircuitView(spec.budget_w if spec else 0.0, seats, grants, wants, pending, revision,
                           unknown_seats=frozenset(unknown[self.seats]), unknown_grants=frozenset(unknown[self.grants]),
                           seat_order=order, tree=tree, tree_bad=(tree_value is not None and tree is None) or down_bad,
                           lost=None if down_bad else lost,
                           unseated={h: c.reserve_w for h, c in claims.items() if h not in seats},
                           ceilings=ceilings)
        return Read(spec, view, revision, spec_mod, leases, spec_created, claims, recs, bad, tree_mod, marked,
                    host_marks, unleased, free_claims, meters, delegations, delegation_mods)

    def _node_meters(self, tree: PowerTree, reports: list[tuple[bytes, MeterReport]], recs: dict[str, HostRecord],
                     lost: str | None, bad: dict[str, str]) -> dict[str, NodeMeter]:
        """Each metered node's figures from the reports of hosts under it (another's is
        named in ``bad`` and left out) and the live hosts' published draw through it."""
        under = tree.coefficients()
        by_node: dict[str, dict[str, MeterReport]] = {}
        for key, r in reports:
            node = tree.nodes.get(r.node)
            if node is None or node.meter is None:
                bad[key.decode(errors="replace")] = f"a reading for {r.node!r}, which is no metered node of the tree"
            elif r.host not in under.get(r.node, {}):
                bad[key.decode(errors="replace")] = f"host {r.host!r} is not under node {r.node!r}: its reading is ignored"
            else:
                by_node.setdefault(r.node, {})[r.host] = r
        reported = tree.loads_known_w({h: r.draw_w for h, r in recs.items()}, lost, flow=True)
        return node_meters(tree, by_node, reported, self.wall_clock())

    async def lease_info(self, lease_id: int) -> tuple[int, int]:
        """(seconds left, granted TTL s) of ``lease_id``; seconds left -1: gone."""
        res = await self._call(lambda c: c.get_lease_info(lease_id, keys=False), write=False)
        return int(res.TTL), int(res.grantedTTL)

    # -- the operator's writes --------------------------------------------------------
    async def init(self, budget_w: float, ttl_s: int, *, force: bool = False, tree: PowerTree | None = None) -> bool:
        """Create the circuit (False: it exists and ``force`` is off, or live hosts
        without a seat, their claimed reserves, exceed ``budget_w``: a wiped circuit whose
        daemons still run). ``force`` replaces the budget only when the seats, grants and
        those live hosts fit the new one (else False). ``tree``: the circuit is that power
        tree (stored with the spec, in the same transaction; without it a tree stored
        before is removed), and with ``force`` the seats and grants must fit every node."""
        body = records.dumps(budget_w=budget_w, ttl_s=ttl_s)

        def writes(c: _Client) -> list[Any]:
            t = c.transactions
            tree_op = t.delete(self.tree_key) if tree is None else \
                t.put(self.tree_key, json.dumps(tree_doc(tree), sort_keys=True, allow_nan=False).encode())
            # Leases of watts were sized against the old budgets: every one is removed
            # (each host's raise read before fails on the spec's revision).
            return [t.put(self.spec_key, body), tree_op, t.delete(self.delegations, _range_end(self.delegations))]

        if not force:
            if (await self.read()).view.unseated_w > budget_w:
                return False
            ok, _ = await self._call(lambda c: c.transaction(
                compare=[c.transactions.create(self.spec_key) == 0], success=writes(c), failure=[]))
            return bool(ok)
        read = await self.read()
        seated = None if tree is None else tree.with_reserves(read.view.seats)
        after = replace(read.view, budget_w=budget_w, tree=seated, tree_bad=False)
        if after.carried_w > budget_w or after.nodes_over_w():
            return False
        ok, _ = await self._call(lambda c: c.transaction(compare=self._unchanged(c, read), success=writes(c), failure=[]))
        return bool(ok)

    async def leave(self, host: str) -> None:
        """Remove ``host``'s seat, record and pending seat (lowering: no check). Its claim
        stays (a daemon still running there re-seats itself or lowers its cards), and so
        does its grant: it is under the host's lease, and watts its cards may still draw
        until the daemon gives it back or the lease ends."""
        await self._call(lambda c: c.transaction(compare=[], success=[
            c.transactions.delete(self.key(kind, host)) for kind in (self.seats, self.wants, self.pending)
        ], failure=[]))

    async def feed_down(self, feed: str, by: str) -> None:
        """Mark ``feed`` lost (persistent until :meth:`feed_up`): every raise computed
        before fails its compare, and each host divides by the flow with it dead."""
        await self._call(lambda c: c.put(self.down + feed.encode(), records.dumps(by=by)))

    async def mark_feed_lost(self, read: Read, feed: str, by: str) -> bool:
        """Mark ``feed`` lost (as :meth:`feed_down`) unless a feed was marked since ``read``
        (one at a time; the caller checks ``read.down`` itself). False: read again."""
        def txn(c: Any) -> Any:
            return c.transaction(compare=self._no_mark_since(c, read),
                                 success=[c.transactions.put(self.down + feed.encode(), records.dumps(by=by))], failure=[])
        ok, _ = await self._call(txn)
        return bool(ok)

    async def mark_host_feed_lost(self, read: Read, host: str, feed: str, by: str, lease_id: int) -> bool:
        """``host``'s UPS mark: ``feed`` lost, under the host's lease (it ends with the
        host), unless a feed was marked since ``read``. False: read again."""
        def txn(c: Any) -> Any:
            return c.transaction(compare=self._no_mark_since(c, read), success=[c.transactions.put(
                self.key(self.marks, host), records.dumps(feed=feed, by=by), lease=lease_id)], failure=[])
        ok, _ = await self._call(txn)
        return bool(ok)

    async def adopt_host_mark(self, read: Read, host: str, lease_id: int) -> bool:
        """Put ``host``'s own mark, left by an earlier daemon of it, under ``lease_id`` (as
        it was read; False: it changed or went meanwhile)."""
        key = self.key(self.marks, host)
        if host not in read.marks:
            return False
        feed, by, _ = read.marks[host]
        value = records.dumps(feed=feed, by=by)

        def txn(c: Any) -> Any:
            t = c.transactions
            return c.transaction(compare=[t.mod(key) < read.revision + 1, t.version(key) > 0],
                                 success=[t.put(key, value, lease=lease_id)], failure=[])
        ok, _ = await self._call(txn)
        return bool(ok)

    async def unmark_host(self, host: str) -> bool:
        """Lift ``host``'s own UPS mark. True when there was one."""
        res = await self._call(lambda c: c.delete(self.key(self.marks, host)))
        return bool(res)

    def _no_mark_since(self, c: _Client, read: Read) -> list[Any]:
        t = c.transactions
        return [t.mod(k, _range_end(k)) < read.revision + 1 for k in (self.down, self.marks)]

    async def feed_up(self, feed: str) -> bool:
        """The feed is back: the operator's mark and every host's on it lifted (a UPS
        still on battery marks it again at its host's next round). False: it was not
        marked lost."""
        read = await self.read()
        keys = [self.down + feed.encode()] + [self.key(self.marks, h) for h, (f, _, _) in read.marks.items() if f == feed]
        _, responses = await self._call(lambda c: c.transaction(
            compare=[], success=[c.transactions.delete(k) for k in keys], failure=[]))
        return any(int(r.response_delete_range.deleted) for r in responses)

    async def wipe(self) -> None:
        """Delete every key of the circuit (the operator's reset; tests)."""
        await self._call(lambda c: c.delete_prefix(self.base))

    # -- a host's writes --------------------------------------------------------------
    def _unchanged(self, c: _Client, read: Read) -> list[Any]:
        """Compares that fail when the spec, a seat or a grant changed since ``read``."""
        t = c.transactions
        # A key created (or changed) since the read has a newer mod revision: one compare
        # per range, whatever the number of hosts (etcd allows 128 operations in a
        # transaction by default; a compare per key stopped the circuit at about 60).
        # A deletion only lowers the sum. A claim created since: a live host whose
        # reserve the read did not see. A feed marked lost since: less may flow.
        return [t.mod(self.spec_key) == read.spec_mod, t.mod(self.tree_key) == read.tree_mod] + [
            t.mod(kind, _range_end(kind)) < read.revision + 1
            for kind in (self.seats, self.grants, self.claims, self.down, self.marks, self.delegations)]

    def _zone_unchanged(self, c: _Client, read: Read, host: str) -> list[Any]:
        """The compares of a raise of ``host``: its zone's (``core.delegation``) where a
        delegation cuts it off from the root, else the whole circuit's."""
        charges = read.charges()
        plan = None if charges is None or host not in charges.tree.hosts else raise_compares(charges, host)
        if plan is None or plan.whole:
            return self._unchanged(c, read)
        t = c.transactions
        return [t.mod(self.spec_key) == read.spec_mod, t.mod(self.tree_key) == read.tree_mod] + [
            t.mod(kind, _range_end(kind)) < read.revision + 1 for kind in (self.down, self.marks)] + [
            t.mod(self.key(kind, h)) < read.revision + 1
            for h in sorted(plan.hosts) for kind in (self.seats, self.grants, self.claims)] + [
            t.mod(self.key(self.delegations, m)) == read.delegation_mods.get(m, 0) for m in sorted(plan.delegations)]

    async def register_seat(self, read: Read, host: str, reserve_w: float, *, grant_w: float = 0.0,
                            lease_id: int | None = None) -> bool:
        """Write ``host``'s seat if it fits beside every seat, grant and other live
        unseated host's reserve of ``read`` and nothing changed since (False otherwise:
        read again). With ``lease_id`` (a running host), its grant is set in the same
        transaction to ``grant_w`` (W; 0 deletes it) and fitted with the seat: what its
        cards may still draw above the reserve. Without, the grant is left as it is."""
        if grant_w > 0 and lease_id is None:
            raise ValueError("a grant written with a seat needs the host's lease")
        grant_after = max(0.0, grant_w) if lease_id is not None else read.view.grants.get(host, 0.0)
        if not read.view.seat_fits(reserve_w + grant_after, host) or not _fits_delegations(read, host, reserve_w + grant_after):
            return False

        def txn(c: Any) -> Any:
            t = c.transactions
            grant = self.key(self.grants, host)
            success = [t.put(self.key(self.seats, host), records.dumps(reserve_w=reserve_w)),
                       t.delete(self.key(self.pending, host))]
            if lease_id is not None:
                success.append(t.put(grant, records.dumps(grant_w=grant_w), lease=lease_id) if grant_w > 0
                               else t.delete(grant))
            return c.transaction(compare=self._unchanged(c, read), success=success, failure=[])
        ok, _ = await self._call(txn)
        return bool(ok)

    async def put_pending(self, host: str, reserve_w: float, lease_id: int) -> None:
        await self._call(lambda c: c.put(self.key(self.pending, host), records.dumps(reserve_w=reserve_w), lease=lease_id))

    async def raise_grant(self, read: Read, host: str, grant_w: float, lease_id: int) -> bool:
        """Set ``host``'s grant to ``grant_w`` under ``lease_id`` if nothing changed since
        ``read`` (False: read again). The caller has checked it fits ``read``."""
        key = self.key(self.grants, host)
        seat = read.view.seats.get(host, 0.0) + read.view.pending.get(host, 0.0)
        if not _fits_delegations(read, host, seat + grant_w):  # within the leases of watts too
            return False
        ok, _ = await self._call(lambda c: c.transaction(
            compare=self._zone_unchanged(c, read, host),
            success=[c.transactions.put(key, records.dumps(grant_w=grant_w), lease=lease_id)], failure=[]))
        return bool(ok)

    async def put_delegation(self, read: Read, node: str, watts_w: float, by: str) -> bool:
        """Set ``node``'s lease of watts to ``watts_w`` (W) if it keeps every node of
        ``read`` within its bound (``core.delegation.delegation_fits``: the parent's sum
        checked, and the subtree's own charge under the new figure) and nothing that check
        depends on changed since (``core.delegation.lease_compares``: a raise under
        another lease does not fail it; False otherwise: read again). ``by``: the writer, shown
        by ``circuit status``. Persistent: the watts stay leased until a host under the
        node (or ``circuit init``) changes them."""
        tree = read.view.tree
        if tree is None or read.view.tree_bad or not delegation_fits(
                tree, read.held_w(), read.delegations, node, watts_w, read.view.lost, read.table_charged_w()):
            return False
        key = self.key(self.delegations, node)
        body = records.dumps(watts_w=watts_w, by=by)
        ok, _ = await self._call(lambda c: c.transaction(
            compare=[*self._lease_unchanged(c, read, tree, node, watts_w),
                     c.transactions.mod(key) == read.delegation_mods.get(node, 0)],
            success=[c.transactions.put(key, body)], failure=[]))
        return bool(ok)

    def _lease_unchanged(self, c: _Client, read: Read, tree: PowerTree, node: str, watts_w: float) -> list[Any]:
        """The compares of a change to ``node``'s lease to ``watts_w`` (W;
        ``core.delegation.lease_compares``: a resize compares less than a creation)."""
        plan = lease_compares(read.charges() or Charges(tree, {}, read.view.lost), node, watts_w)
        if plan.whole:
            return self._unchanged(c, read)
        t = c.transactions
        ranges = (self.seats, self.claims, self.down, self.marks) + ((self.delegations,) if plan.delegations is None else ())
        return [t.mod(self.spec_key) == read.spec_mod, t.mod(self.tree_key) == read.tree_mod] + [
            t.mod(kind, _range_end(kind)) < read.revision + 1 for kind in ranges] + [
            t.mod(self.key(self.grants, h)) < read.revision + 1 for h in sorted(plan.hosts)] + [
            t.mod(self.key(self.delegations, m)) == read.delegation_mods.get(m, 0) for m in sorted(plan.delegations or ())]

    async def lower_grant(self, host: str, grant_w: float, lease_id: int, record: HostRecord | None = None) -> None:
        """Lower ``host``'s grant (no check needed: it only lowers the sum); 0 deletes it.
        ``record``: ``host``'s record under the lowered grant, put in the same transaction,
        so that no reader sees the grant lowered beside figures read under the old one."""
        key = self.key(self.grants, host)
        body = None if record is None else records.dumps(**stored_fields(record))

        def lower(c: _Client) -> Any:
            t = c.transactions
            ops = [t.delete(key) if grant_w <= 0 else t.put(key, records.dumps(grant_w=grant_w), lease=lease_id)]
            if body is not None:
                ops.append(t.put(self.key(self.wants, host), body, lease=lease_id))
            return c.transaction(compare=[], success=ops, failure=[])
        await self._call(lower)

    async def give_back(self, host: str, machine_id: str, boot_id: str) -> Claim | None:
        """Delete ``host``'s grant and record (a daemon that is gone: lowering, no check),
        unless another machine or boot claims ``host`` (a duplicate's failsafe must not
        take the grant the name's holder uses): then nothing, and that claim is returned.
        The delete is conditional on the claim read being unchanged."""
        key = self.key(self.claims, host)
        res = await self._call(lambda c: c.get_prefix(key))  # the exact key, with its mod revision
        claim: Claim | None = None
        mod = 0
        for kv in res:
            if bytes(kv.key) == key:
                mod = int(kv.mod_revision)
                try:
                    claim = _claim(records.parse(bytes(kv.value)), int(kv.lease), mod)
                except records.BadRecord:
                    claim = None
        if mod and (claim is None or (claim.machine_id, claim.boot_id) != (machine_id, boot_id)):
            return claim or Claim("unreadable", "unreadable", 1, 0.0, 0.0, 0.0)
        ok, _ = await self._call(lambda c: c.transaction(
            compare=[c.transactions.mod(key) == mod], success=[
                c.transactions.delete(self.key(self.grants, host)), c.transactions.delete(self.key(self.wants, host)),
            ], failure=[]))
        return None if ok else await self.give_back(host, machine_id, boot_id)

    async def put_record(self, host: str, record: HostRecord, lease_id: int) -> None:
        """Publish ``host``'s record (its want, caps, draw, seat and grant) under its lease."""
        fields = stored_fields(record)
        await self._call(lambda c: c.put(self.key(self.wants, host), records.dumps(**fields), lease=lease_id))

    async def put_meter(self, report: MeterReport, lease_id: int) -> None:
        """``report.host``'s reading of ``report.node``'s meter, under its lease."""
        value = records.dumps(value_w=round(report.value_w, 1), age_s=round(report.age_s, 2),
                              changed_s=round(report.changed_s, 2), at=round(report.at, 3),
                              **({} if report.refresh_s is None else {"refresh_s": round(report.refresh_s, 2)}))
        key = self.meter_key(report.host, report.node)
        await self._call(lambda c: c.put(key, value, lease=lease_id))

    async def put_want(self, host: str, want_w: float, lease_id: int) -> None:
        """A record with the want alone (the load benchmark's clients have no cards)."""
        await self.put_record(host, HostRecord(want_w), lease_id)

    async def claim(self, host: str, claim: Claim, lease_id: int, *, replace_mod: int = 0) -> bool:
        """Claim ``host`` under ``lease_id``: created only where no claim is (or, with
        ``replace_mod``, only over the claim read at that mod revision: an earlier
        instance of this same daemon). False: someone else's claim is there."""
        key = self.key(self.claims, host)
        body = records.dumps(machine_id=claim.machine_id, boot_id=claim.boot_id, pid=claim.pid,
                             watchdog_s=claim.watchdog_s, fallback_s=claim.fallback_s, reserve_w=claim.reserve_w)
        ok, _ = await self._call(lambda c: c.transaction(
            compare=[c.transactions.create(key) == 0] if not replace_mod else [c.transactions.mod(key) == replace_mod],
            success=[c.transactions.put(key, body, lease=lease_id)], failure=[]))
        return bool(ok)

    async def can_write(self, key: bytes) -> bool:
        """Whether this credential may write ``key``, asked without writing it: a
        transaction whose compare never holds (a version below 0) with a put on ``key``;
        etcd checks the permission of every operation in it, run or not. Raises
        StoreUnavailable (StoreFull under the NOSPACE alarm)."""
        try:
            await self._call(lambda c: c.transaction(compare=[c.transactions.version(key) < 0],
                                                     success=[c.transactions.put(key, b"")], failure=[]))
        except StoreRefused as exc:
            if "permission denied" in str(exc):
                return False
            raise
        return True

    async def writes_refused(self, host: str) -> bool:
        """Whether etcd refuses writes now (the NOSPACE alarm), asked without writing: the
        same never-true transaction on ``host``'s record. Raises StoreUnavailable."""
        try:
            await self.can_write(self.key(self.wants, host))
        except StoreFull:
            return True
        return False

    # -- leases -----------------------------------------------------------------------
    async def grant_lease(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (id, TTL s as etcd granted it)."""
        lease = await self._call(lambda c: c.lease(ttl_s), write=False)
        return int(lease.id), int(lease.ttl)

    async def keepalive(self, lease_id: int) -> int:
        """Renew ``lease_id``; returns its TTL (s). Raises LeaseGone when etcd no longer
        has it (its reply's TTL is 0 or less)."""
        reply = await self._call(lambda c: c.refresh_lease(lease_id), write=False)
        ttl = int(getattr(reply, "TTL", 0)) if reply is not None else 0
        if ttl <= 0:
            raise LeaseGone(f"lease {lease_id:x} expired")
        return ttl

    async def revoke(self, lease_id: int) -> None:
        await self._call(lambda c: c.revoke_lease(lease_id))


def _fits_delegations(read: Read, host: str, total_w: float) -> bool:
    """Whether ``host`` holding ``total_w`` (W, seat + grant) keeps every node's charge
    within its bound under the delegations of ``read`` (True when none is in force)."""
    charges = read.charges()
    if charges is None:
        return True
    if host not in charges.tree.hosts:
        return False
    return total_w <= read.room_for_w(host) + 1e-9


def _lease_not_found(exc: BaseException) -> bool:
    return "lease not found" in str(exc)


def _kept_if_good(mirror: CircuitMirror, memo: tuple[int, Any], built: asyncio.Future[Read]) -> None:
    """A shared build done: its Read stays the mirror's memo for its revision unless the
    build was cancelled (every reader gone: a loop stopping), failed, or read a meter
    (whose age moves with the clock): the next read builds again. Its outcome is taken,
    so that one no reader waited for is not reported as never retrieved."""
    good = not built.cancelled() and built.exception() is None and not built.result().meters
    if not good and mirror.memo is memo:
        mirror.memo = None
