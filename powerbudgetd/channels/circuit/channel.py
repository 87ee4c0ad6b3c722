"""The circuit side channel: this host's seat, want and grant in etcd, and the budget
source behind the arbiter (lowering only).

Each round (every ``poll_s``): renew the lease when due, read the circuit, publish the
want, and move the grant toward this host's fair share:

- **raise**: a transaction on the read (see ``store``) first, then the offer to the
  arbiter; a failed compare simply reads again next round;
- **lower**: the offer first; the grant in etcd is lowered only once the tick snapshot
  shows every card's bound within the lower board budget.

The offer is ``board(reserve + grant)`` valid until the fence's deadline from the last
acknowledged keepalive (``core.circuit.Fence``), and ``board(reserve)`` after it: the
arbiter falls back on its own, whatever this task is doing. A renewal that etcd
answers with an expired lease drops the grant (``circuit_grant_lost``).

A host whose seat does not fit, whose lease TTL is too short for its watchdog, or that
runs without a watchdog, takes no grant and says so (it runs on its reserve).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry

from powerbudgetd.channels import metricnames as names
from powerbudgetd.channels.circuit.store import CircuitStore, LeaseGone, Read, StoreUnavailable, Tls
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.circuit import Fence, GrantPolicy, HostPower, raise_allowed, required_ttl_s
from powerbudgetd.core.snapshot import CircuitStatus

if TYPE_CHECKING:
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.core.snapshot import BankSnapshot
    from powerbudgetd.config import CircuitConfig, Settings

log = structlog.get_logger("powerbudgetd.circuit")

SOURCE = "circuit"  # the arbiter's name for this budget source
KEEPALIVES_PER_TTL = 6  # renew six times per TTL: five may be lost before the fence


def watchdog_s(environ: dict[str, str] | None = None) -> float | None:
    """``$WATCHDOG_USEC`` in s (systemd's WatchdogSec), None when unset or not ours."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


def store_from_config(cfg: CircuitConfig) -> CircuitStore:
    """The etcd store a ``[circuit]`` section describes."""
    tls = Tls(cfg.ca_file, cfg.cert_file, cfg.key_file) if cfg.tls else None
    return CircuitStore(
        cfg.endpoints, cfg.name, prefix=cfg.prefix, timeout_s=cfg.request_timeout_s, tls=tls,
        username=cfg.username, password=None if cfg.password is None else cfg.password.get_secret_value(),
    )


class CircuitMetrics:
    """The circuit's gauges, in the registry ``/metrics`` serves."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.budget = names.gauge(names.CIRCUIT_BUDGET, registry)
        self.reserve = names.gauge(names.CIRCUIT_RESERVE, registry)
        self.grant = names.gauge(names.CIRCUIT_GRANT, registry)
        self.grant_held = names.gauge(names.CIRCUIT_GRANT_HELD, registry)
        self.want = names.gauge(names.CIRCUIT_WANT, registry)
        self.lease_left = names.gauge(names.CIRCUIT_LEASE_VALID, registry)
        self.reachable = names.gauge(names.CIRCUIT_ETCD_REACHABLE, registry)
        self.seated = names.gauge(names.CIRCUIT_SEAT_FITS, registry)
        self.seats = names.gauge(names.CIRCUIT_SEATS, registry)
        self.committed = names.gauge(names.CIRCUIT_COMMITTED, registry)
        self.pending = names.gauge(names.CIRCUIT_PENDING, registry)
        self.grants_ok = names.gauge(names.CIRCUIT_GRANTS_ALLOWED, registry)
        self.lost = names.counter(names.CIRCUIT_GRANT_LOST, registry)
        self.conflicts = names.counter(names.CIRCUIT_TXN_CONFLICTS, registry)


class CircuitChannel:
    """See the module docstring. ``clock``: the daemon's (monotonic, s)."""

    def __init__(
        self,
        cfg: CircuitConfig,
        power: HostPower,
        arbiter: BudgetArbiter,
        *,
        lower_s: float,
        store: CircuitStore | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.host = cfg.host
        self.power = power
        self.arbiter = arbiter
        self.store = store or store_from_config(cfg)
        self.clock = clock
        self.fence = Fence(lower_s=lower_s, clock_rate_allowance=cfg.clock_rate_allowance)
        self.policy = GrantPolicy(step_w=cfg.step_w, release_hold_s=cfg.release_hold_s)
        self.metrics = CircuitMetrics(registry or CollectorRegistry())
        self.watchdog_s = watchdog_s(environ)
        self.lease_id: int | None = None
        self.ttl_s: int | None = None
        self.valid_until = float("-inf")
        self.last_sent = float("-inf")
        self.held_w = 0.0  # the grant as etcd holds it (as far as we know: never below)
        self.in_use_w = 0.0  # the grant offered to the arbiter (<= held_w)
        self.want_w = 0.0
        self.published_want: float | None = None
        self.seated = False
        self.grants_ok = False
        self.reachable = False
        self.last_read: Read | None = None
        self.snapshot: BankSnapshot | None = None
        self.stopping = False
        self._said: dict[str, object] = {}
        self.metrics.reserve.set(power.reserve_w)
        # From the first tick: the reserve, whatever etcd says (or does not).
        self.arbiter.offer(SOURCE, power.board_budget_w(), clock())

    def status(self, now: float) -> CircuitStatus:
        """This host's place on the circuit at ``now`` (the daemon's clock, s)."""
        read = self.last_read
        valid = self.in_use_w > 0 and now < self.valid_until
        return CircuitStatus(
            name=self.store.name, budget_w=None if read is None or read.spec is None else read.spec.budget_w,
            reserve_w=self.power.reserve_w, grant_w=self.in_use_w if valid else 0.0, held_w=self.held_w,
            lease_left_s=max(0.0, self.valid_until - now) if self.lease_id is not None else 0.0,
            etcd_reachable=self.reachable, seat_fits=self.seated, grants_allowed=self.grants_ok,
        )

    # -- SideChannel --------------------------------------------------------------------
    def on_tick(self, report: TickReport) -> None:
        snap = report.snapshot
        self.snapshot = snap
        if snap.mode == "stopping":
            self.stopping = True
        self.want_w = self.power.want_w(snap)
        self.metrics.want.set(self.want_w)
        self.metrics.lease_left.set(max(0.0, self.valid_until - self.clock()) if self.in_use_w > 0 else 0.0)
        if self.clock() >= self.valid_until and self.in_use_w > 0:
            self.metrics.grant.set(0.0)  # the arbiter has fallen back to the reserve already

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        pass  # [circuit] needs a restart (daemon.RESTART_ONLY)

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.round()
                    self._set_reachable(True)
                except StoreUnavailable as exc:
                    self._set_reachable(False, str(exc))
                except LeaseGone:  # a put under a lease etcd no longer has
                    self._set_reachable(True)
                    self._lease_lost()
                except Exception:  # noqa: BLE001 - never die: log, keep the reserve, retry
                    log.exception("circuit_round_failed", host=self.host)
                    self.in_use_w = 0.0
                    self._offer()
                await asyncio.sleep(self._next_wait_s())
        except asyncio.CancelledError:
            await self._leave_cleanly()
            raise
        finally:
            await self.store.close()

    # -- one round ----------------------------------------------------------------------
    async def round(self) -> None:
        """Renew, read, publish the want, move the grant. Raises StoreUnavailable."""
        read = await self.store.read()
        self.last_read = read
        self._show(read)
        if read.spec is None:
            self._say("circuit_not_initialised", True, log.error, circuit=self.store.name,
                      action="create it once: powerbudgetd circuit init --budget W; running on the reserve")
            return
        self._check_ttl(read.spec.ttl_s)
        await self._ensure_lease(read.spec.ttl_s)
        assert self.lease_id is not None
        if self.clock() - self.last_sent >= self._keepalive_every_s():
            await self._keepalive()
            if self.lease_id is None:
                return
        if not self.seated:
            await self._seat(read)
            read = await self.store.read()
            self.last_read = read
        await self._publish_want()
        await self._move_grant(read)
        self._offer()

    def _keepalive_every_s(self) -> float:
        return max(0.05, (self.ttl_s or 1) / KEEPALIVES_PER_TTL)

    def _next_wait_s(self) -> float:
        until_keepalive = self.last_sent + self._keepalive_every_s() - self.clock()
        return max(0.02, min(self.cfg.poll_s, until_keepalive))

    def _check_ttl(self, ttl_s: int) -> None:
        keepalive = ttl_s / KEEPALIVES_PER_TTL
        if self.watchdog_s is None:
            ok, why = False, "no watchdog (WATCHDOG_USEC unset): a hung daemon could keep a grant's watts after its lease expires"
        else:
            need = required_ttl_s(self.watchdog_s, self.cfg.fallback_s, keepalive)
            ok = ttl_s >= need and self.fence.usable_s(ttl_s) > 0
            why = (f"lease TTL {ttl_s} s < watchdog {self.watchdog_s:g} s + fallback_s {self.cfg.fallback_s:g} s "
                   f"+ keepalive {keepalive:g} s = {need:g} s")
        self.grants_ok = ok and self.seated
        if not ok:
            self._say("circuit_grants_refused", why, log.error, reason=why,
                      action="running on the reserve; raise the circuit's TTL (circuit init --force) or lower WatchdogSec")

    async def _ensure_lease(self, ttl_s: int) -> None:
        if self.lease_id is not None:
            return
        sent = self.clock()
        self.lease_id, self.ttl_s = await self.store.grant_lease(ttl_s)
        self.last_sent = sent
        self.valid_until = self.fence.valid_until(sent, self.ttl_s)
        self.published_want = None
        log.info("circuit_lease", lease=f"{self.lease_id:x}", ttl_s=self.ttl_s, circuit=self.store.name, host=self.host)

    async def _keepalive(self) -> None:
        assert self.lease_id is not None
        sent = self.clock()
        try:
            ttl = await self.store.keepalive(self.lease_id)
        except LeaseGone:
            self._lease_lost()
            return
        self.last_sent = sent
        self.ttl_s = ttl
        self.valid_until = self.fence.valid_until(sent, ttl)

    def _lease_lost(self) -> None:
        was = self.held_w
        self.lease_id, self.held_w, self.in_use_w = None, 0.0, 0.0
        self.published_want = None
        self.arbiter.offer(SOURCE, self.power.board_budget_w(), self.clock())
        if was > 0:
            self.metrics.lost.inc()
            log.error("circuit_grant_lost", grant_w=was, host=self.host,
                      detail="the lease expired in etcd before a renewal; the cards were at the reserve before then")

    async def _seat(self, read: Read) -> None:
        reserve = self.power.reserve_w
        if read.view.seats.get(self.host) == reserve or await self.store.register_seat(read, self.host, reserve):
            self.seated = True
            self._said.pop("circuit_seat_does_not_fit", None)
            log.info("circuit_seated", host=self.host, reserve_w=reserve, circuit=self.store.name)
            return
        if read.view.seat_fits(reserve, self.host):
            return  # the compare failed: something changed; try again next round
        assert self.lease_id is not None
        await self.store.put_pending(self.host, reserve, self.lease_id)
        others = read.view.seats_w - read.view.seats.get(self.host, 0.0)
        self._say("circuit_seat_does_not_fit", True, log.error, host=self.host, reserve_w=reserve,
                  other_seats_w=others, grants_w=read.view.grants_w, budget_w=read.view.budget_w,
                  action="this host takes no grant and runs on its reserve, which the circuit does NOT cover: "
                  "lower reserve_w here or elsewhere, or raise the circuit budget")

    async def _publish_want(self) -> None:
        assert self.lease_id is not None
        want = round(self.want_w / 5) * 5.0  # 5 W steps: no churn for noise
        if self.published_want is None or abs(want - self.published_want) >= max(5.0, self.cfg.step_w / 2):
            await self.store.put_want(self.host, want, self.lease_id)
            self.published_want = want

    async def _move_grant(self, read: Read) -> None:
        assert self.lease_id is not None
        now = self.clock()
        held = read.view.grants.get(self.host, 0.0)
        if held < self.held_w:  # etcd holds less than we thought (we never raise without it)
            self.held_w = held
            self.in_use_w = min(self.in_use_w, held)
        allowed = self.grants_ok and not self.stopping and now < self.valid_until
        target = self.policy.target_w(read.view, self.host, self.held_w, now) if allowed else 0.0
        if target > self.held_w and self.in_use_w == self.held_w:  # no lowering under way
            if not raise_allowed(read.view, self.host, target):
                return
            if await self.store.raise_grant(read, self.host, target, self.lease_id):
                self.held_w = target
                if self.clock() < self.valid_until:
                    self.in_use_w = target
                log.info("circuit_grant_raised", grant_w=target, want_w=round(self.want_w, 1), host=self.host)
            else:
                self.metrics.conflicts.inc()
            return
        if target < self.in_use_w:
            # The offer first (a lapsed fence or a stop gives the whole grant back); etcd
            # once the cards are down.
            self.in_use_w = target
        if self.held_w > self.in_use_w and self._cards_within(self.in_use_w):
            await self.store.lower_grant(self.host, self.in_use_w, self.lease_id)
            log.info("circuit_grant_lowered", from_w=self.held_w, to_w=self.in_use_w, host=self.host)
            self.held_w = self.in_use_w

    def _cards_within(self, grant_w: float) -> bool:
        """Every card's bound (highest limit that may be in force) fits the board budget
        for ``grant_w``, in a snapshot taken after that budget was set."""
        snap = self.snapshot
        return snap is not None and snap.budget_w <= self.power.board_budget_w(grant_w) + 1e-6 and \
            snap.sum_limit_bound_w <= self.power.board_budget_w(grant_w) + 1e-6

    def _offer(self) -> None:
        now = self.clock()
        reserve_board = self.power.board_budget_w()
        if self.in_use_w > 0 and now < self.valid_until:
            self.arbiter.offer(SOURCE, self.power.board_budget_w(self.in_use_w), now,
                               expires_at_s=self.valid_until, expired_w=reserve_board)
        else:
            self.arbiter.offer(SOURCE, reserve_board, now)
        self.metrics.grant.set(self.in_use_w if now < self.valid_until else 0.0)
        self.metrics.grant_held.set(self.held_w)
        self.metrics.lease_left.set(max(0.0, self.valid_until - now) if self.lease_id is not None else 0.0)

    def _show(self, read: Read) -> None:
        v = read.view
        self.metrics.budget.set(v.budget_w)
        self.metrics.seats.set(v.seats_w)
        self.metrics.committed.set(v.committed_w)
        self.metrics.pending.set(sum(v.pending.values()))
        self.metrics.seated.set(1 if self.seated else 0)
        self.metrics.grants_ok.set(1 if self.grants_ok else 0)

    def _set_reachable(self, ok: bool, error: str = "") -> None:
        if ok != self.reachable:
            (log.info if ok else log.error)(
                "circuit_etcd_reachable" if ok else "circuit_etcd_unreachable", endpoint=self.store.endpoint,
                **({} if ok else {"error": error, "detail": "the grant stays valid only until the fence; then the reserve"}),
            )
        self.reachable = ok
        self.metrics.reachable.set(1 if ok else 0)
        if not ok:
            self._offer()

    def _say(self, event: str, key: object, fn: Callable[..., object], **fields: object) -> None:
        if self._said.get(event) != key:
            self._said[event] = key
            fn(event, **fields)

    async def _leave_cleanly(self) -> None:
        """On the way out: give the grant back only when the cards are known to be within
        the reserve's board budget; else let the lease expire (the fence and ExecStopPost
        cover the cards)."""
        if self.lease_id is None:
            return
        if self.held_w > 0 and not self._cards_within(0.0):
            log.warning("circuit_grant_left_to_expire", grant_w=self.held_w, host=self.host)
            return
        try:
            await self.store.revoke(self.lease_id)
            log.info("circuit_left", host=self.host, lease=f"{self.lease_id:x}")
        except (StoreUnavailable, LeaseGone):
            pass
        except Exception:  # noqa: BLE001 - on the way out: the lease lapses on its own
            log.exception("circuit_leave_failed", host=self.host)
