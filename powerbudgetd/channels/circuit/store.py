"""The circuit in etcd: keys, reads, and the transactions that keep it within budget.

Keys, under ``<prefix>/<circuit>/``::

    spec            {"budget_w", "ttl_s"}      written once by ``circuit init``
    seats/<host>    {"reserve_w"}              persistent: the host's reserve (wall W)
    grants/<host>   {"grant_w"}                under the host's lease
    wants/<host>    {"want_w"}                 under the host's lease (also: it is alive)
    pending/<host>  {"reserve_w"}              under the lease: a seat that did not fit

A grant (or a seat) is raised only by a transaction whose compares fail when the spec,
any seat or any grant changed since the read it was computed from: each key's mod
revision as read, and every key in the seats and grants ranges no newer than the read
revision (a key created since). A deletion can only lower the sum, so it need not
fail the compare. Lowering a grant is a plain put or delete. Hence at every revision
``sum(seats) + sum(grants) <= budget``.

Several endpoints: each call goes to the current one; a call that fails or takes
longer than ``timeout_s`` raises :class:`StoreUnavailable` and the next call goes to
the next endpoint (etcd forwards writes to its leader).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.utils
import aetcd.watcher
import grpc

from powerbudgetd.core.circuit import CircuitView

T = TypeVar("T")


class StoreUnavailable(Exception):
    """No answer from etcd within the timeout (or an error on the way); retried."""


class LeaseGone(Exception):
    """The lease is not known to etcd any more: it expired or was revoked."""


@dataclass(frozen=True)
class Spec:
    """A circuit as ``circuit init`` stored it: wall budget (W) and lease TTL (s)."""

    budget_w: float
    ttl_s: int


@dataclass(frozen=True)
class Read:
    """One consistent read of a circuit (one etcd revision).

    ``mods``: every seat and grant key's mod revision; ``leases``: each live host's
    lease id (from its want); ``spec_mod``: the spec key's mod revision (0: none).
    """

    spec: Spec | None
    view: CircuitView
    revision: int
    spec_mod: int = 0
    mods: dict[bytes, int] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)


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


def _range_end(prefix: bytes) -> bytes:
    return aetcd.utils.prefix_range_end(prefix)


def _loads(value: bytes) -> dict[str, Any]:
    try:
        out = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return {}
    return out if isinstance(out, dict) else {}


def _watts(doc: dict[str, Any], key: str) -> float | None:
    v = doc.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else None


def _dumps(**fields: Any) -> bytes:
    return json.dumps(fields, sort_keys=True).encode()


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
        self.seats = base + b"seats/"
        self.grants = base + b"grants/"
        self.wants = base + b"wants/"
        self.pending = base + b"pending/"
        self.calls = 0  # etcd requests sent (for the load test's ops/s)

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._index]

    def _connect(self) -> _Client:
        if self._client is None:
            host, _, port = self.endpoint.rpartition(":")
            self._client = _Client(host.strip("[]"), int(port), tls=self._tls, username=self._auth[0],
                                   password=self._auth[1], timeout=None)
        return self._client

    async def _call(self, fn: Callable[[_Client], Awaitable[T]]) -> T:
        client = self._connect()
        self.calls += 1
        try:
            return await asyncio.wait_for(fn(client), self.timeout_s)
        except (TimeoutError, aetcd.exceptions.ClientError, grpc.RpcError, OSError) as exc:
            if _lease_not_found(exc):
                raise LeaseGone(str(exc)) from None
            failed = self.endpoint
            await self._rotate()
            raise StoreUnavailable(f"{failed}: {type(exc).__name__}: {exc}".rstrip(": ")) from None

    async def _rotate(self) -> None:
        client, self._client = self._client, None
        self._index = (self._index + 1) % len(self.endpoints)
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), 1.0)
            except Exception:  # noqa: BLE001 - a dead channel may fail to close; it is dropped
                pass

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), 1.0)
            except Exception:  # noqa: BLE001
                pass

    def key(self, kind: bytes, host: str) -> bytes:
        return kind + host.encode()

    # -- reads ----------------------------------------------------------------------
    async def read(self) -> Read:
        """The circuit at one revision (a single range read over its prefix)."""
        res = await self._call(lambda c: c.get_prefix(self.base))
        revision = int(res.header.revision)
        spec: Spec | None = None
        spec_mod = 0
        seats: dict[str, float] = {}
        grants: dict[str, float] = {}
        wants: dict[str, float] = {}
        pending: dict[str, float] = {}
        mods: dict[bytes, int] = {}
        leases: dict[str, int] = {}
        for kv in res:
            key, doc = bytes(kv.key), _loads(kv.value)
            if key == self.spec_key:
                budget, ttl = _watts(doc, "budget_w"), doc.get("ttl_s")
                if budget is not None and isinstance(ttl, int) and ttl > 0:
                    spec, spec_mod = Spec(budget, ttl), int(kv.mod_revision)
                continue
            for kind, out, field_name in ((self.seats, seats, "reserve_w"), (self.grants, grants, "grant_w"),
                                          (self.wants, wants, "want_w"), (self.pending, pending, "reserve_w")):
                if key.startswith(kind):
                    host = key[len(kind):].decode(errors="replace")
                    w = _watts(doc, field_name)
                    if kind in (self.seats, self.grants):
                        mods[key] = int(kv.mod_revision)
                        if w is None:  # unreadable: count it as the whole budget (safe)
                            w = spec.budget_w if spec else float("inf")
                    if w is not None:
                        out[host] = w
                    if kind == self.wants and kv.lease:
                        leases[host] = int(kv.lease)
        view = CircuitView(spec.budget_w if spec else 0.0, seats, grants, wants, pending, revision)
        return Read(spec, view, revision, spec_mod, mods, leases)

    async def lease_ttl_s(self, lease_id: int) -> int:
        """Seconds left on ``lease_id`` (-1: gone)."""
        res = await self._call(lambda c: c.get_lease_info(lease_id, keys=False))
        return int(res.TTL)

    # -- the operator's writes --------------------------------------------------------
    async def init(self, budget_w: float, ttl_s: int, *, force: bool = False) -> bool:
        """Create the circuit (False: it exists and ``force`` is off). ``force`` replaces
        the budget only when the seats and grants fit the new one (else False)."""
        body = _dumps(budget_w=budget_w, ttl_s=ttl_s)
        if not force:
            ok, _ = await self._call(lambda c: c.transaction(
                compare=[c.transactions.create(self.spec_key) == 0],
                success=[c.transactions.put(self.spec_key, body)], failure=[]))
            return bool(ok)
        read = await self.read()
        if read.view.committed_w > budget_w:
            return False
        ok, _ = await self._call(lambda c: c.transaction(
            compare=self._unchanged(c, read), success=[c.transactions.put(self.spec_key, body)], failure=[]))
        return bool(ok)

    async def leave(self, host: str) -> None:
        """Remove ``host``'s seat, grant, want and pending seat (lowering: no check)."""
        await self._call(lambda c: c.transaction(compare=[], success=[
            c.transactions.delete(self.key(kind, host)) for kind in (self.seats, self.grants, self.wants, self.pending)
        ], failure=[]))

    # -- a host's writes --------------------------------------------------------------
    def _unchanged(self, c: _Client, read: Read) -> list[Any]:
        """Compares that fail when the spec, a seat or a grant changed since ``read``."""
        t = c.transactions
        compares = [t.mod(self.spec_key) == read.spec_mod]
        compares += [t.mod(key) == mod for key, mod in sorted(read.mods.items())]
        # A key created (or changed) since the read has a newer mod revision.
        compares += [t.mod(kind, _range_end(kind)) < read.revision + 1 for kind in (self.seats, self.grants)]
        return compares

    async def register_seat(self, read: Read, host: str, reserve_w: float) -> bool:
        """Write ``host``'s seat if it fits beside every seat and grant of ``read`` and
        nothing changed since (False otherwise: read again)."""
        if not read.view.seat_fits(reserve_w, host):
            return False
        key = self.key(self.seats, host)
        ok, _ = await self._call(lambda c: c.transaction(
            compare=self._unchanged(c, read),
            success=[c.transactions.put(key, _dumps(reserve_w=reserve_w)), c.transactions.delete(self.key(self.pending, host))],
            failure=[]))
        return bool(ok)

    async def put_pending(self, host: str, reserve_w: float, lease_id: int) -> None:
        await self._call(lambda c: c.put(self.key(self.pending, host), _dumps(reserve_w=reserve_w), lease=lease_id))

    async def raise_grant(self, read: Read, host: str, grant_w: float, lease_id: int) -> bool:
        """Set ``host``'s grant to ``grant_w`` under ``lease_id`` if nothing changed since
        ``read`` (False: read again). The caller has checked it fits ``read``."""
        key = self.key(self.grants, host)
        ok, _ = await self._call(lambda c: c.transaction(
            compare=self._unchanged(c, read),
            success=[c.transactions.put(key, _dumps(grant_w=grant_w), lease=lease_id)], failure=[]))
        return bool(ok)

    async def lower_grant(self, host: str, grant_w: float, lease_id: int) -> None:
        """Lower ``host``'s grant (no check needed: it only lowers the sum); 0 deletes it."""
        key = self.key(self.grants, host)
        if grant_w <= 0:
            await self._call(lambda c: c.delete(key))
        else:
            await self._call(lambda c: c.put(key, _dumps(grant_w=grant_w), lease=lease_id))

    async def give_back(self, host: str) -> None:
        """Delete ``host``'s grant and want (a daemon that is gone: lowering, no check)."""
        await self._call(lambda c: c.transaction(compare=[], success=[
            c.transactions.delete(self.key(self.grants, host)), c.transactions.delete(self.key(self.wants, host)),
        ], failure=[]))

    async def put_want(self, host: str, want_w: float, lease_id: int) -> None:
        await self._call(lambda c: c.put(self.key(self.wants, host), _dumps(want_w=round(want_w, 1)), lease=lease_id))

    # -- leases -----------------------------------------------------------------------
    async def grant_lease(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (id, TTL s as etcd granted it)."""
        lease = await self._call(lambda c: c.lease(ttl_s))
        return int(lease.id), int(lease.ttl)

    async def keepalive(self, lease_id: int) -> int:
        """Renew ``lease_id``; returns its TTL (s). Raises LeaseGone when etcd no longer
        has it (its reply's TTL is 0 or less)."""
        reply = await self._call(lambda c: c.refresh_lease(lease_id))
        ttl = int(getattr(reply, "TTL", 0)) if reply is not None else 0
        if ttl <= 0:
            raise LeaseGone(f"lease {lease_id:x} expired")
        return ttl

    async def revoke(self, lease_id: int) -> None:
        await self._call(lambda c: c.revoke_lease(lease_id))


def _lease_not_found(exc: BaseException) -> bool:
    return "lease not found" in str(exc)
