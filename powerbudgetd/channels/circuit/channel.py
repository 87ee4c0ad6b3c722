"""The circuit side channel: this host's seat, want and grant in etcd, and the budget
source behind the arbiter (lowering only).

Each round: renew the lease when due, read the circuit, publish the want, and move the
grant toward this host's fair share. A round follows a change at once: a watch on the
circuit's prefix (on the member the reads use) wakes the channel on any other host's
seat, claim or meter, a grant lowered where this host is held back (watts freed; a
raise takes watts: read at the poll's pace), a feed mark, the spec or the tree; the
cards wake it when this host's want rises by a step with free watts to take, and when
they are down to a grant given back (etcd follows them, below). Another host's record
(its want), this host's want falling, or rising with none free, are read at the pace
of ``poll_s``; a raise whose compare finds the circuit moved reads it again at once.
Woken rounds are spaced by :func:`wake_gap_s` (0.1 s on a small circuit, longer on a
large one: the circuit's hosts together read at most ``WOKEN_READS_PER_S`` times a
second). A round woken by a chance to take or tidy watts (another host's grant
lowered, its seat, a lease of watts resized; this host's want risen, its grant given
back, a compare lost) spends the host's wake budget (``core.circuit.WakeBudget``);
what may call for a grant to come down (``CircuitStore.pressing``: the spec, the
tree, feed marks, a meter's news, a host pending on its reserve or claiming its
name), a UPS on battery, the watch's opening and a stop never wait for it. Between
changes a round comes every ``poll_s`` while anything is in motion or the watch is
down, and only at the keepalive when this host is settled
(:meth:`CircuitChannel._settled`): an idle host reads nothing between renewals.

- **raise**: a transaction on the read (see ``store``) first, then the offer to the
  arbiter; a failed compare reads again in a round woken at once;
- **lower**: the offer first; the grant in etcd follows the cards down, to the least
  grant covering what the last tick snapshot says they may draw (their bounds and the
  budget in force: ``HostPower.lowered_grant_w``), never on a snapshot from a tick that
  began before the last raise; the tick that shows them down to the offer wakes the
  round that gives the rest back (and, wanted again meanwhile, that round wakes the
  raise that waited for it).

The offer is ``board(reserve + grant)`` valid until the fence's deadline from the last
acknowledged keepalive (``core.circuit.Fence``), and ``board(reserve)`` after it: the
arbiter falls back on its own, whatever this task is doing. A renewal that etcd
answers with an expired lease drops the grant (``circuit_grant_lost``).

Each round is also an audit of the records against this host (see :meth:`round`):
its claim on its name (one daemon per name, see ``store.Claim``), the circuit's spec
(a re-created circuit is validated again), its seat (a vanished seat is registered
again, or the cards go to their floors), and whether seats and grants fit the budget.

A host whose seat does not fit, or whose watchdog is not enforced (systemd's
``WATCHDOG_USEC`` with ``WATCHDOG_PID`` naming this process), takes no grant and says
so (it runs on its reserve). A sharing host's lease outlives the circuit's TTL by its
grace (``core.circuit.fenced_lease_ttl_s``). Lease deadlines are kept on
``CLOCK_BOOTTIME``, which counts a system suspend.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry

from powerbudgetd.channels import metricnames as names
from powerbudgetd.channels.circuit.store import (
    CircuitStore,
    Claim,
    HostRecord,
    LeaseGone,
    Read,
    StoreFull,
    StoreRefused,
    StoreUnavailable,
    Tls,
    off_loop,
    raise_if_cancelled,
    stored_fields,
)
from powerbudgetd.channels.circuit import leases
from powerbudgetd.core.arbiter import BudgetArbiter
from powerbudgetd.core.circuit import (
    WAKE_GAP_S,
    Fence,
    GrantPolicy,
    HostPower,
    WakeBudget,
    fenced_lease_ttl_s,
    raise_allowed,
)
from powerbudgetd.core.nodemeter import MeterReport, Sample, report_of, stale_after_s
from powerbudgetd.core.snapshot import CircuitStatus
from powerbudgetd.errors import ExitStatus

if TYPE_CHECKING:
    from powerbudgetd.control.report import TickReport
    from powerbudgetd.core.snapshot import BankSnapshot
    from powerbudgetd.config import CircuitConfig, Settings

log = structlog.get_logger("powerbudgetd.circuit")
_JITTER = random.Random()  # spreads periodic work between hosts (not security)

SOURCE = "circuit"  # the arbiter's name for this budget source
KEEPALIVES_PER_TTL = 6  # renew six times per TTL: five may be lost before the fence
WOKEN_READS_PER_S = 500  # the whole circuit's woken reads a second, at most (etcd's load on a large circuit)
ROUND_CAUSES = ("poll", "chance", "pressing")  # what starts a round (powerbudgetd_circuit_rounds_total)
WATCH_RETRY_MAX_S = 30.0  # a broken watch is opened again after 1 s, doubling up to this (s)


BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def wake_gap_s(hosts: int, poll_s: float) -> float:
    """The least time (s) between two rounds a change wakes on a circuit of ``hosts``:
    ``WAKE_GAP_S``, or longer where the hosts together would read more than
    ``WOKEN_READS_PER_S`` times a second; never longer than ``poll_s``."""
    return min(poll_s, max(WAKE_GAP_S, hosts / WOKEN_READS_PER_S))


def boottime() -> float:
    """Seconds on CLOCK_BOOTTIME: monotonic, and counting a system suspend (CLOCK_MONOTONIC
    stops during one, so a lease deadline on it would outlive the lease)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def boot_id(path: str = BOOT_ID_FILE) -> str:
    """The kernel's id of this boot (a new one at each boot)."""
    with open(path) as fh:
        return fh.read().strip()[:64] or "unknown"


def watchdog_s(environ: dict[str, str] | None = None) -> float | None:
    """``$WATCHDOG_USEC`` in s (systemd's WatchdogSec) when systemd enforces it on this
    process: ``$WATCHDOG_PID`` must name it (systemd sets both for the service's main
    process). None otherwise: unset, malformed, or meant for another process."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or pid != str(os.getpid()):
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
        rounds = names.counter(names.CIRCUIT_ROUNDS, registry)
        self.rounds = {cause: rounds.labels(cause=cause) for cause in ROUND_CAUSES}
        self.claim_ok = names.gauge(names.CIRCUIT_CLAIM_HELD, registry)
        self.at_floors = names.gauge(names.CIRCUIT_AT_FLOORS, registry)
        self.bad_records = names.gauge(names.CIRCUIT_BAD_RECORDS, registry)
        self.caps = names.gauge(names.CIRCUIT_CAPS, registry)
        self.draw = names.gauge(names.CIRCUIT_DRAW, registry)
        self.info = names.gauge(names.CIRCUIT_INFO, registry)
        self.node_budget = names.gauge(names.CIRCUIT_NODE_BUDGET, registry)
        self.node_committed = names.gauge(names.CIRCUIT_NODE_COMMITTED, registry)
        self.node_draw = names.gauge(names.CIRCUIT_NODE_DRAW, registry)
        self.node_measured = names.gauge(names.CIRCUIT_NODE_MEASURED, registry)
        self.node_unmanaged = names.gauge(names.CIRCUIT_NODE_UNMANAGED, registry)
        self.node_meter_age = names.gauge(names.CIRCUIT_NODE_METER_AGE, registry)
        self.feed_lost = names.gauge(names.CIRCUIT_FEED_LOST, registry)
        self.vanished = names.counter(names.CIRCUIT_SEAT_VANISHED, registry)
        self.vanished_grant = names.counter(names.CIRCUIT_GRANT_VANISHED, registry)
        self.bad_seen = names.counter(names.CIRCUIT_BAD_RECORDS_SEEN, registry)


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
        lease_clock: Callable[[], float] = boottime,
        environ: dict[str, str] | None = None,
        on_fatal: Callable[[int], None] | None = None,
        boot: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.host = cfg.host
        self.power = power
        self.arbiter = arbiter
        self.store = store or store_from_config(cfg)
        self.clock = clock  # the daemon's (the arbiter's times)
        self.lease_clock = lease_clock  # lease deadlines: counts a suspend
        self.on_fatal = on_fatal
        self.fence = Fence(lower_s=lower_s, clock_rate_allowance=cfg.clock_rate_allowance)
        self.policy = GrantPolicy(step_w=cfg.step_w, release_hold_s=cfg.release_hold_s)
        self.metrics = CircuitMetrics(registry or CollectorRegistry())
        self.watchdog_s = watchdog_s(environ)
        self.identity = Claim(cfg.machine_id(), boot or boot_id(), os.getpid(), self.watchdog_s or 0.0,
                              cfg.fallback_s, power.reserve_w)
        self.claimed = False  # this daemon holds the claim on its name
        self.ever_claimed = False
        self.spec_created = 0  # the spec this host validated its seat against (create revision)
        self.at_floors = False
        self.had_seat = False  # seated once: a seat lost with no room again sends the cards to their floors
        self.hold_w: float | None = None  # unseated: what the cards are held at (wall W) instead of the reserve
        self.raises_after = float("-inf")  # no raise before (lease clock): a circuit just (re-)created
        self._leases_due = float("-inf")  # the next periodic resize of the leases of watts above us (clock s)
        self._lease_asked_at = float("-inf")  # the last time a lease held a raise back and we asked for more
        self._lease_given_at = float("-inf")  # the last time we gave a lease's watts back to a host waiting
        self.lease_id: int | None = None
        self.ttl_s: int | None = None
        self.valid_until = float("-inf")
        self.last_sent = float("-inf")
        self.held_w = 0.0  # the grant as etcd holds it (as far as we know: never below)
        self.in_use_w = 0.0  # the grant offered to the arbiter (<= held_w)
        self.want_w = 0.0
        self.published: HostRecord | None = None
        self.sharing_ok = False
        self.seated = False
        self.grants_ok = False
        self.reachable = False
        self._reach_said: str | None = None  # the last state of etcd said: reachable, unreachable, refused
        self.nospace = False  # etcd's NOSPACE alarm seen and not yet seen cleared
        self._full_asked = float("-inf")  # when etcd was last asked whether it refuses writes (lease clock)
        self.credential_checked = False
        self._unleased_said: set[str] = set()
        self.last_read: Read | None = None
        self.snapshot: BankSnapshot | None = None
        self._raised_at = -math.inf  # when the grant in use was last raised (the daemon's clock, s)
        self.stopping = False
        self._said: dict[str, object] = {}
        self._nodes_shown: set[str] = set()  # the node labels exported
        self._feed_shown: str | None = None
        self._bad_said: dict[str, str] = {}
        self.ups_feed: tuple[str, bool, str] | None = None  # (feed, on battery, mark) from [ups] feed
        self.marks_feed = False  # [ups] feed is set: this host's feed mark is its to keep or lift
        # The meters this host reads (source id -> its standing value): a node of the tree
        # naming one of them is published under this host's lease (core.nodemeter).
        self.meter_sources: dict[str, Callable[[], Sample | None]] = {}
        self._meters_sent: dict[str, MeterReport] = {}
        # Woken rounds: the watch (or the cards) set ``wake``; ``urgent``: a change told
        # (a round at once), else the watch went down (a settled wait ends: polling again);
        # ``pressing``: an urgent change that does not wait for the wake budget (_wake).
        self.wake = asyncio.Event()
        self.urgent = self.pressing = self.nudged = False
        self.watching = False  # the watch is in place: a change is told, not polled for
        self._watching_at: str | None = None  # the member the watch is on (while watching)
        self._watch_task: asyncio.Task[None] | None = None
        self._round_at = float("-inf")  # the last round's start (lease clock s)
        self._want_at_round = 0.0  # the want (W) as the last round saw it
        self._reread_at = 0  # the revision of the read whose raise last failed its compare
        # A pressing round's lost compare reads again without the wake budget, once: the
        # round so started is flagged (_from_reread), and its own lost compare is a chance.
        self._free_reread = self._from_reread = False
        self._given_back: tuple[float, float] | None = None  # (held, in use) W the cards' wake was for
        self._grant_settled = False  # the last round found the grant at its target and wrote nothing
        self.woken = WakeBudget()  # rounds a change may start before the poll (on the lease clock)
        self._cause = "poll"  # what started the round about to run (ROUND_CAUSES)
        self.metrics.reserve.set(power.reserve_w)
        self.metrics.info.labels(circuit=cfg.name).set(1)
        # From the first tick: the reserve, whatever etcd says (or does not).
        self.arbiter.offer(SOURCE, power.board_budget_w(), clock())

    def status(self, now: float) -> CircuitStatus:
        """This host's place on the circuit at ``now`` (the daemon's clock, s; the lease
        figures are read on the lease clock)."""
        read = self.last_read
        left = self.valid_until - self.lease_clock()
        valid = self.in_use_w > 0 and left > 0
        return CircuitStatus(
            name=self.store.name, budget_w=None if read is None or read.spec is None else read.spec.budget_w,
            reserve_w=self.power.reserve_w, grant_w=self.in_use_w if valid else 0.0, held_w=self.held_w,
            lease_left_s=max(0.0, left) if self.lease_id is not None else 0.0,
            etcd_reachable=self.reachable, seat_fits=self.seated, grants_allowed=self.grants_ok,
        )

    # -- SideChannel --------------------------------------------------------------------
    def on_tick(self, report: TickReport) -> None:
        snap = report.snapshot
        self.snapshot = snap
        if snap.mode == "stopping" and not self.stopping:
            self.stopping = True
            self._wake(urgent=True)  # the grant given back now, not at the next poll
        self.want_w = self.power.want_w(snap)
        self.metrics.want.set(self.want_w)
        if self.want_w <= self._want_at_round - self._want_step_w:
            self._wake(urgent=False)  # watts to give back: published at the poll's pace, not the keepalive's
        elif self.want_w >= max(self.held_w, self._want_at_round) + self._want_step_w:
            # A raise may be due now, not at the next poll; with no free watts to take as
            # the last read saw it, the want is published at the poll's pace.
            read = self.last_read
            self._wake(urgent=read is None or read.view.free_w >= self.cfg.step_w, chance=True)
        if self.in_use_w < self.held_w and self.lease_id is not None and self.reachable \
                and self._given_back != (self.held_w, self.in_use_w):
            # Our grant given back to the offer first: the cards are down to it now, so
            # etcd follows at once (a host waiting for these watts, or this one's raise
            # if it wants them again, is held until then), not at the next poll. Once for
            # each grant given back: a round that does not lower it (the circuit wiped,
            # the claim lost, etcd refusing writes) is not woken again every tick.
            cards = self._cards_board_w()
            if cards is not None and self.power.given_back(self.held_w, self.in_use_w, cards):
                self._given_back = (self.held_w, self.in_use_w)
                self._wake(urgent=True, chance=True)  # the cards are down: etcd's record is bookkeeping
        left = self.valid_until - self.lease_clock()
        self.metrics.lease_left.set(max(0.0, left) if self.in_use_w > 0 else 0.0)
        if left <= 0 and self.in_use_w > 0:
            # Past the deadline on the clock that counts a suspend: whatever the daemon's
            # clock says, the grant is over (after a resume: at the first tick).
            self.in_use_w = 0.0
            self._offer()

    def on_reload(self, ok: bool, settings: Settings | None) -> None:
        pass  # [circuit] needs a restart (daemon.RESTART_ONLY)

    def ups_on_battery(self, feed: str, ups: str, on_battery: bool) -> None:
        """The UPS ``ups`` (``name@host``) carrying the tree's ``feed`` went on battery (or
        came back): acted on at the next round (:meth:`_follow_ups_feed`)."""
        # The mark names this host too: only the host that made it lifts it (two hosts on
        # one UPS whose holds end apart must not lift and make it in turn).
        self.ups_feed = (feed, on_battery, f"ups {ups} seen by {self.host}")
        self._wake(urgent=True)
        (log.warning if on_battery else log.info)(
            "circuit_feed_on_battery" if on_battery else "circuit_feed_on_line", feed=feed, ups=ups,
            circuit=self.store.name,
            action="marking the feed lost: every host re-budgets as if it were dead" if on_battery
            else "lifting this host's mark on the feed, if it made one")

    async def run(self) -> None:
        first = True
        self._watch_task = asyncio.create_task(self._watch())
        try:
            while True:
                try:
                    if first:  # whatever etcd does, a line about the circuit within a second of start
                        first = False
                        await self._first_round()
                    else:
                        await self.round()
                    self._set_reachable(True)
                    await self._after_round()
                    await self._follow_reads()
                except StoreFull as exc:
                    self._set_full(True, str(exc))
                    self._set_reachable(True)
                except StoreRefused as exc:
                    self._set_reachable(False, str(exc), refused=True)
                except StoreUnavailable as exc:
                    self._set_reachable(False, str(exc))
                except LeaseGone:  # a put under a lease etcd no longer has
                    self._set_reachable(True)
                    self._lease_lost()
                except Exception:  # noqa: BLE001 - never die: log, keep the reserve, retry
                    log.exception("circuit_round_failed", host=self.host)
                    self.in_use_w = 0.0
                    self._offer()
                await self._wait()
        except asyncio.CancelledError:
            await self._leave_cleanly()
            raise
        finally:
            await self._stop_watch()
            await self.store.close()

    async def _stop_watch(self) -> None:
        task, self._watch_task = self._watch_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _follow_reads(self) -> None:
        """The watch moved to the member the reads moved to (after a failed call): a
        member cut off from its cluster may keep a stream open and answer its pings while
        it tells no change; the one that answers reads is the one to watch."""
        if self._watching_at is not None and self._watching_at != self.store.endpoint:
            log.info("circuit_watch_moved", endpoint=self.store.endpoint, was=self._watching_at,
                     circuit=self.store.name, host=self.host)
            await self._stop_watch()
            self.watching, self._watching_at = False, None
            self._watch_task = asyncio.create_task(self._watch())

    def _wake(self, *, urgent: bool, chance: bool = False) -> None:
        """A round due: at once where ``urgent``, else at the poll's pace. ``chance``: a
        chance to take or tidy watts (another's grant lowered, a want risen, a compare
        lost), which spends the wake budget; any other urgent wake (what may call for a
        grant to come down, ``CircuitStore.pressing``; a stop) is pressing and spends none."""
        self.urgent = self.urgent or urgent
        self.pressing = self.pressing or (urgent and not chance)
        self.nudged = True  # not settled until the next round has looked
        self.wake.set()

    async def _watch(self) -> None:
        """Wake the rounds on the circuit's changes (see the module docstring), through
        the endpoints in turn from the one in use; opened again after a break (1 s,
        doubling), with a round at once after each opening (what changed meanwhile)."""
        own = set(self.store.host_keys(self.host))
        mine = self.store.meter_prefix(self.host)
        retry_s, index = 1.0, self.store.endpoints.index(self.store.endpoint)
        while True:
            endpoint = self.store.endpoints[index % len(self.store.endpoints)]
            try:
                async for key in self.store.changes(endpoint):
                    if key is None:
                        self.watching, self._watching_at, retry_s = True, endpoint, 1.0
                        log.info("circuit_watching", endpoint=endpoint, circuit=self.store.name, host=self.host)
                        self._wake(urgent=True)
                    elif key.startswith(self.store.grants) and key not in own:
                        # Another host's grant lowered (a raise is not told): the watts freed
                        # matter now only to a host held back from what it wants.
                        self._wake(urgent=self._held_back(), chance=True)
                    elif key not in own and not key.startswith(mine):
                        # Another host's record (its want) moves with its load: read at the
                        # poll's pace, not at once (a busy circuit's records woke every host
                        # ten times a second, each round publishing its own in turn). A seat or
                        # a lease of watts resized is a chance; the rules are not (store.pressing).
                        wants = key.startswith(self.store.wants)
                        self._wake(urgent=not wants, chance=not wants and not self.store.pressing(key))
            except StoreUnavailable as exc:
                self._watch_down(str(exc))
            except Exception as exc:  # noqa: BLE001 - the rounds go on polling whatever the watch does
                self._watch_down(f"{type(exc).__name__}: {exc}")
            # A stop's cancel swallowed on the way (aetcd's close lets one pass by while it
            # waits for its stream's task): the stop, not a watch to open again.
            raise_if_cancelled()
            index += 1
            await asyncio.sleep(retry_s)
            retry_s = min(WATCH_RETRY_MAX_S, retry_s * 2)

    def _watch_down(self, error: str) -> None:
        if self.watching:
            log.warning("circuit_watch_down", error=error, circuit=self.store.name, host=self.host,
                        detail=f"reading the circuit every {self.cfg.poll_s:g} s until it is back")
        self.watching, self._watching_at = False, None
        self._wake(urgent=False)  # from a settled wait back to polling

    def _reread(self, read: Read) -> None:
        """A raise failed its compare: the circuit moved under ``read`` (another host's
        raise, which is not told), so a round reads it again now; once for each read (one
        refused before etcd was asked finds the same read next time). A chance, except
        once after a round answering a pressing change: the hosts it woke raise together
        and all but one lose their compare, and an operator's raised budget must not wait
        for a token. Only once: on a busy circuit every reread may lose again, and a chain
        of them would read at the wake gap's pace, budget or not."""
        if read.revision != self._reread_at:
            self._reread_at = read.revision
            free = self._cause == "pressing" and not self._from_reread
            self._free_reread = free
            self._wake(urgent=True, chance=not free)

    def _held_back(self) -> bool:
        """Whether watts freed on the circuit are this host's to take at once: it waits
        for a seat, or wants a step or more above its grant."""
        return not self.seated or self.want_w >= self.held_w + self._want_step_w

    @property
    def _want_step_w(self) -> float:
        """The least move of the want (W) that is news to a round: a step, 5 W at least."""
        return max(self.cfg.step_w, 5.0)

    def _settled(self) -> bool:
        """Nothing for this host's rounds to do until a change is told: the watch is in
        place, the grant is at its target with nothing written or released on a timer,
        raises are allowed, and no meter of its is published (on its own cadence) nor a
        lease of watts resized above it (periodically)."""
        read = self.last_read
        tree = None if read is None else read.view.tree
        return (self.watching and not self.nudged and self._grant_settled and self.grants_ok and not self.policy.releasing
                and self.in_use_w == self.held_w and self.lease_clock() >= self.raises_after
                and not self._meters_sent and not (tree is not None and leases.delegated_above(tree, self.host)))

    async def _wait(self) -> None:
        """Until the next round: a change told (urgent: at once, at least
        :func:`wake_gap_s` after the last round, and within the wake budget,
        ``core.circuit.WakeBudget``), the keepalive, or ``poll_s`` unless settled."""
        while True:
            wait = self._next_wait_s()
            if not self.urgent:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):  # not wait_for: on 3.11 it may swallow a stop's cancel
                        await self.wake.wait()
            self.wake.clear()
            if self.urgent or self._next_wait_s() <= 0.02:
                break
        read = self.last_read
        hosts = 1 if read is None else len(read.view.seats.keys() | read.view.unseated.keys())
        gap = self._round_at + wake_gap_s(hosts, self.cfg.poll_s) - self.lease_clock()
        if gap > 0:
            await asyncio.sleep(gap)
        self._cause = "pressing" if self.pressing else "poll"
        if self._next_wait_s() > 0.02 and not self.pressing:
            # Woken by a chance before its poll or keepalive: a round from the wake budget,
            # waited for (a pressing wake, or the poll falling due meanwhile, ends the wait;
            # the poll's round spends nothing).
            await self._wait_for(lambda: min(self.woken.wait_s(self.lease_clock()), self._next_wait_s()))
            if self.pressing:
                self._cause = "pressing"
            elif self._next_wait_s() > 0.02:
                self.woken.spend(self.lease_clock())
                self._cause = "chance"
        self.urgent = self.pressing = False  # what was told meanwhile, the round about to read sees

    async def _wait_for(self, left_s: Callable[[], float]) -> None:
        """Until ``left_s()`` (s) is 0.02 or less, or a pressing wake."""
        while (left := left_s()) > 0.02 and not self.pressing:
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.wake.wait()

    FIRST_WORD_S = 0.5  # the first round not done by then: said (within a second of start, on a loaded host)

    async def _first_round(self) -> None:
        task = asyncio.ensure_future(self.round())
        try:
            done, _ = await asyncio.wait({task}, timeout=self.FIRST_WORD_S)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            log.warning("circuit_etcd_no_answer_yet", endpoint=self.store.endpoint, circuit=self.store.name,
                        waited_s=self.FIRST_WORD_S, timeout_s=self.store.timeout_s, host=self.host,
                        detail="running on the reserve until etcd answers")
        await task

    async def _after_round(self) -> None:
        """After a round etcd answered: whether etcd refuses writes (the NOSPACE alarm),
        asked without writing, once per keepalive period (a round may write nothing for a
        long while) and every round while it is seen; this credential's reach, once."""
        now = self.lease_clock()
        if self.nospace or now - self._full_asked >= self._keepalive_every_s():
            self._full_asked = now
            full = await self.store.writes_refused(self.host)
            if full != self.nospace:
                self._set_full(full, "etcd refuses writes: database space exceeded (NOSPACE alarm)")
        if not self.credential_checked and not self.nospace:
            self.credential_checked = True
            await self._check_credential()

    async def _check_credential(self) -> None:
        """Warn, naming each key, where this daemon's etcd user may write what only the
        operator should (the spec, the tree, the operator's feed marks, other hosts' seats,
        claims or grants): whoever holds this host's password could then raise every host
        on the circuit, or take another host's name or grant."""
        broad = [(key.decode(errors="replace"), what) for key, what in self.store.operator_keys()
                 if await self.store.can_write(key)]
        if broad:
            log.warning("circuit_credential_too_broad", host=self.host, circuit=self.store.name,
                        user=self.cfg.username, keys=[k for k, _ in broad], writes=[w for _, w in broad],
                        action="give this host a role that writes only its own keys: powerbudgetd circuit roles")

    def _set_full(self, full: bool, error: str = "") -> None:
        """etcd's NOSPACE alarm: one warning when it is seen, one line when it clears."""
        if full and not self.nospace:
            log.warning("circuit_etcd_nospace", endpoint=self.store.endpoint, error=error, circuit=self.store.name,
                        host=self.host, detail="etcd answers reads but refuses every write: no seat, grant or record "
                        "changes; grants run out at the fence. Compact, defragment, then etcdctl alarm disarm")
        elif not full and self.nospace:
            log.info("circuit_etcd_nospace_cleared", endpoint=self.store.endpoint, circuit=self.store.name,
                     host=self.host)
        self.nospace = full

    # -- one round ----------------------------------------------------------------------
    async def round(self) -> None:
        """Read; audit the records against this host (claim, spec, seat, the budget);
        renew; publish this host's record; move the grant. Raises StoreUnavailable."""
        self._round_at, self._want_at_round, self._grant_settled = self.lease_clock(), self.want_w, False
        self.nudged = False
        self._from_reread, self._free_reread = self._free_reread, False
        self.metrics.rounds[self._cause].inc()
        read = await self._read()
        self.last_read = read
        self._report_bad(read)
        self._show(read)
        if read.spec is None:
            self._to_reserve()
            self.seated = False
            if self.lease_id is not None:  # wiped: keep the lease and claim the name again, so
                # that an operator re-creating the circuit sees this live host (its reserve)
                if self.lease_clock() - self.last_sent >= self._keepalive_every_s():
                    await self._keepalive()
                if self.lease_id is not None:
                    await self._check_claim(read)
            bad = read.bad.get(self.store.spec_key.decode())
            if bad:
                self._say("circuit_spec_unreadable", bad, log.error, circuit=self.store.name, error=bad,
                          action="running on the reserve; re-create it: powerbudgetd circuit init --force")
            else:
                self._say("circuit_not_initialised", True, log.error, circuit=self.store.name,
                          action="create it once: powerbudgetd circuit init --budget W; running on the reserve")
            return
        self._check_spec(read)
        self._check_sharing()
        await self._ensure_lease(read.spec.ttl_s)
        assert self.lease_id is not None
        if self.lease_clock() - self.last_sent >= self._keepalive_every_s():
            await self._keepalive()
            if self.lease_id is None:
                return
        if not await self._check_claim(read):
            return
        await self._adopt_mark(read)
        if await self._follow_ups_feed(read):  # a mark of this host's, under its lease (it holds the name)
            read = await self._read()
            self.last_read = read
            if read.spec is None:
                return  # wiped since the first read: the next round says so
        if not await self._check_seat(read):
            read = await self._read()
            self.last_read = read
        self.grants_ok = self.sharing_ok and self.seated and self.claimed and not self.at_floors
        self._show(read)
        await self._publish(read)
        await self._publish_meters(read)
        await self._move_grant(read)
        self._offer()
        await self._resize_leases(read)

    async def _read(self) -> Read:
        """The circuit (``store.read``), and the figures a round computes from it, on the
        circuit's worker thread (:func:`_prepare`, ``store.off_loop``): on a hall they
        take a few hundred milliseconds of Python, which must not hold up the event loop,
        and with it the control ticks."""
        read = await self.store.read()
        if read.view.tree is not None and not read.view.tree_bad:
            await off_loop(_prepare, read, self.host, self.cfg.step_w)
        return read

    async def _resize_leases(self, read: Read) -> None:
        """The leases of watts above this host: resized every ``leases.REBALANCE_S`` (jittered) where
        this host is a node's first, and so at once where such a lease holds watts another
        host waits for (``leases.gives_back``); grown at once where one holds this host's
        raise back; each at most every ``leases.ASK_S`` (``channels.circuit.leases``)."""
        tree = read.view.tree
        if tree is None or not self.grants_ok or not leases.delegated_above(tree, self.host):
            return
        now = self.clock()
        periodic = now >= self._leases_due
        if periodic:
            self._leases_due = now + leases.rebalance_wait_s(_JITTER)
        elif now - self._lease_given_at >= leases.ASK_S \
                and leases.gives_back(read, self.host, read.view.wants, None, self.cfg.step_w):
            # Watts another host waits for, leased above this one's figure where it is
            # the writer: given back now, as the periodic resize would.
            periodic, self._lease_given_at = True, now
        # Held back from what it asked for: it asks (after a give-back of its own, too).
        ask = leases.held_back(read, self.host, self.cfg.step_w) and now - self._lease_asked_at >= leases.ASK_S
        if ask:
            self._lease_asked_at = now
        sent = failed = 0
        changed = False
        for mode in ([True] if periodic else []) + ([False] if ask else []):
            s, f, c = await leases.resize(self.store, read, self.host, wants_w=read.view.wants, margin_w=None,
                                          periodic=mode)
            sent, failed, changed = sent + s, failed + f, changed or c
            if c:
                break  # an ask waits for the round this change wakes (its read shows the lease moved)
        if changed:
            log.info("circuit_lease_resized", host=self.host, circuit=self.store.name, tries=sent, failed=failed)

    async def _follow_ups_feed(self, read: Read) -> bool:
        """Mark the feed our UPS carries lost while it is on battery; lift the mark once
        it is back (only this host's mark: another host's or an operator's stays). One
        feed of the tree at a time: another feed down already is said, and nothing is
        marked. True when etcd changed."""
        if self.ups_feed is None:
            return False
        feed, on_battery, by = self.ups_feed
        mark = read.marks.get(self.host)
        mine = None if mark is None else mark[:2]
        if not on_battery:
            self._said.pop("circuit_ups_feed_not_marked", None)  # said again at the next outage
            if mine is None or not await self.store.unmark_host(self.host):
                return False
            log.info("circuit_feed_mark_lifted", feed=mine[0], by=mine[1], circuit=self.store.name)
            return True
        tree = read.view.tree
        if tree is None or feed not in tree.feeds():
            self._say("circuit_ups_feed_unknown", feed, log.error, feed=feed, circuit=self.store.name,
                      feeds=None if tree is None else tree.feeds(),
                      action="[ups] feed names no feed of the circuit's tree: nothing is marked")
            return False
        self._said.pop("circuit_ups_feed_unknown", None)
        if mine == (feed, by):
            return False
        if feed in read.down and mine is None:
            return False  # marked already (the operator, or another host on the same UPS)
        if read.down.keys() - {feed}:
            self._say("circuit_ups_feed_not_marked", (feed, tuple(read.down)), log.error, feed=feed,
                      down=sorted(read.down), circuit=self.store.name,
                      action="another feed is down already: one feed of the tree at a time")
            return False
        assert self.lease_id is not None
        if await self.store.mark_host_feed_lost(read, self.host, feed, by, self.lease_id):
            log.warning("circuit_feed_marked_lost", feed=feed, by=by, circuit=self.store.name)
            return True
        return False  # a feed marked since the read: looked at again next round

    async def _adopt_mark(self, read: Read) -> None:
        """This host's feed mark, left by an earlier daemon of it (a restart during an
        outage), put under this daemon's lease: it stays until the UPS says which, and
        then ends with this daemon."""
        assert self.lease_id is not None
        if self.marks_feed and self.host in read.marks and read.marks[self.host][2] != self.lease_id:
            if await self.store.adopt_host_mark(read, self.host, self.lease_id):
                log.info("circuit_feed_mark_adopted", feed=read.marks[self.host][0], host=self.host,
                         lease=f"{self.lease_id:x}")

    def _keepalive_every_s(self) -> float:
        return max(0.05, self._circuit_ttl_s() / KEEPALIVES_PER_TTL)

    def _circuit_ttl_s(self) -> int:
        """The circuit's TTL (s; keepalives every sixth of it), not the longer lease's."""
        read = self.last_read
        return read.spec.ttl_s if read is not None and read.spec is not None else (self.ttl_s or 1)

    def _next_wait_s(self) -> float:
        """Seconds to the next round with no change told: the keepalive, and ``poll_s``
        after the last round unless settled (0.02 s at least)."""
        now = self.lease_clock()
        # No lease held (the circuit not initialised, etcd unreachable): no keepalive due.
        until = self.last_sent + self._keepalive_every_s() - now if self.lease_id is not None else math.inf
        if not self._settled():
            until = min(until, self._round_at + self.cfg.poll_s - now)
        return max(0.02, until)

    def _check_sharing(self) -> None:
        """Grants only with an enforced watchdog: the grace that keeps a hung host's
        grant from being handed on counts on it."""
        ok = self.watchdog_s is not None
        self.sharing_ok = ok
        if not ok:
            why = ("no enforced watchdog (WATCHDOG_USEC with WATCHDOG_PID naming this process, as systemd sets "
                   "them under WatchdogSec=): a hung daemon could keep a grant's watts after its lease expires")
            self._say("circuit_grants_refused", why, log.error, reason=why,
                      action="running on the reserve; run it under the unit (WatchdogSec=)")

    def _check_spec(self, read: Read) -> None:
        """A circuit re-created (a new create revision of its spec) is validated again:
        the seat is checked against it as if new."""
        assert read.spec is not None
        if read.spec_created != self.spec_created:
            if self.spec_created:
                log.warning("circuit_redefined", circuit=self.store.name, budget_w=read.spec.budget_w,
                            ttl_s=read.spec.ttl_s, host=self.host, raises_after_s=read.spec.ttl_s,
                            detail="the circuit was created again: this host's seat and claim are checked against "
                            "it; nothing is raised for one TTL, while every live host seats itself again")
            self.seated = False
            # Every live host renews within a TTL and seats itself in that round: until
            # then a raise could take watts an unseated live host's reserve uses.
            if self.spec_created:
                self.raises_after = self.lease_clock() + read.spec.ttl_s
        self.spec_created = read.spec_created
        v = read.view
        if v.lost is not None:
            self._say("circuit_feed_lost", v.lost, log.warning, feed=v.lost, host=self.host,
                      cord_on_it=v.tree is not None and self.host in v.tree.hosts and any(
                          v.lost in v.tree.path(leaf) for leaf in v.tree.hosts[self.host].cords),
                      action="dividing by where the hosts' draw now flows: grants above it given back at once")
        elif self._said.pop("circuit_feed_lost", None) is not None:
            log.info("circuit_feed_back", host=self.host)

    async def _ensure_lease(self, ttl_s: int) -> None:
        if self.lease_id is not None:
            return
        want_ttl = ttl_s
        if self.watchdog_s is not None:
            want_ttl = fenced_lease_ttl_s(ttl_s, self.watchdog_s, self.cfg.fallback_s, self.cfg.clock_rate_allowance)
        sent = self.lease_clock()
        self.lease_id, self.ttl_s = await self.store.grant_lease(want_ttl)
        self.last_sent = sent
        self.valid_until = self.fence.valid_until(sent, min(self.ttl_s, ttl_s))
        self.published = None
        self.claimed = False
        log.info("circuit_lease", lease=f"{self.lease_id:x}", ttl_s=self.ttl_s, circuit_ttl_s=ttl_s,
                 circuit=self.store.name, host=self.host)

    async def _keepalive(self) -> None:
        assert self.lease_id is not None
        sent = self.lease_clock()
        try:
            ttl = await self.store.keepalive(self.lease_id)
        except LeaseGone:
            self._lease_lost()
            return
        self.last_sent = sent
        self.ttl_s = ttl
        # The fence runs on the circuit's TTL, not the longer lease's: a host that is
        # alive but cut off is at its reserve as before; the grace only covers a hung one.
        self.valid_until = self.fence.valid_until(sent, min(ttl, self._circuit_ttl_s()))

    def _lease_lost(self) -> None:
        was = self.held_w
        self.lease_id, self.held_w, self.in_use_w = None, 0.0, 0.0
        self.published = None
        self.claimed = False
        self._offer()
        if was > 0:
            self.metrics.lost.inc()
            log.error("circuit_grant_lost", grant_w=was, host=self.host,
                      detail="the lease expired in etcd before a renewal; the cards were at the reserve before then")

    def _to_reserve(self) -> None:
        """The grant out of use at once (the offer; etcd follows once the cards are down)."""
        self.in_use_w = 0.0
        self._offer()

    async def _check_claim(self, read: Read) -> bool:
        """This daemon's claim on its name: made once (create-only), made again when it
        vanished. Another machine's claim: refused at start (``on_fatal``), or the reserve
        at once at runtime. Another boot of this machine (a reboot within the TTL): wait
        at the reserve for its lease to end. False: not held."""
        assert self.lease_id is not None
        mine = self.identity
        theirs = read.claims.get(self.host)
        if theirs is not None and theirs.lease == self.lease_id and theirs.same_boot(mine):
            self.claimed = True
        elif theirs is None or theirs.same_boot(mine):
            # None there, or an earlier daemon of this same boot (the instance lock allows
            # one at a time): take it, create-only or over exactly what was read.
            # (An unreadable value there is no claim of ours: create-only fails on it, and
            # the host stays at its reserve while the bad key is reported.)
            # A claim under no lease has no writer left: taken over exactly as it was read.
            replace = theirs.mod if theirs is not None else read.free_claims.get(self.host, 0)
            self.claimed = await self.store.claim(self.host, mine, self.lease_id, replace_mod=replace)
            if self.claimed:
                self.ever_claimed = True
                self._said.pop("circuit_claim_lost", None)
                log.info("circuit_claimed", host=self.host, identity=mine.identity(), lease=f"{self.lease_id:x}")
        else:
            self.claimed = False
        self.metrics.claim_ok.set(1 if self.claimed else 0)
        if self.claimed:
            return True
        self._to_reserve()
        self.grants_ok = False
        if theirs is None:
            return False  # a race: read again next round
        if theirs.machine_id == mine.machine_id:
            self._say("circuit_claim_wait", theirs.identity(), log.warning, host=self.host, holder=theirs.identity(),
                      mine=mine.identity(), detail="another boot of this machine holds the name (a reboot within "
                      "the lease, or a clone with the same machine id): running on the reserve until its lease ends")
            return False
        if not self.ever_claimed and self.on_fatal is not None:
            if "circuit_duplicate_host" not in self._said:  # once: the daemon stops within a few ticks
                self._say("circuit_duplicate_host", True, log.error, host=self.host, holder=theirs.identity(),
                          mine=mine.identity(), action="two machines use one circuit host name: give each its own "
                          "[circuit] host (or leave it unset: the default adds the machine id); this daemon stops")
                self.on_fatal(ExitStatus.DUPLICATE_HOST)
            return False
        self._say("circuit_claim_lost", theirs.identity(), log.error, host=self.host, holder=theirs.identity(),
                  mine=mine.identity(), action="another machine claimed this host name: this host dropped to its "
                  "reserve at once and takes no grant; give each machine its own [circuit] host")
        return False

    async def _check_seat(self, read: Read) -> bool:
        """The seat as etcd holds it against this host's reserve, and against the budget.
        Registered again when gone or changed and it fits; else the cards go to their
        floors. True: nothing was written."""
        reserve = self.power.reserve_w
        seat = read.view.seats.get(self.host)
        if seat == reserve and self.host not in read.view.unknown:
            if not self.seated:
                log.info("circuit_seated", host=self.host, reserve_w=reserve, circuit=self.store.name)
            self.seated = self.had_seat = True
            self._unhold()
            self._said.pop("circuit_seat_does_not_fit", None)
            v = read.view
            short = v.short_under_loss(self.host)
            self._set_floors(not v.seat_in_budget(self.host) or short, read, f"feed {v.lost} is lost and the "
                             "surviving side cannot carry this host's seat beside higher classes" if short else
                             "the seats exceed the budget and this seat is among the latest registered")
            return True
        if self.seated:
            self.metrics.vanished.inc()
            log.error("circuit_seat_vanished", host=self.host, reserve_w=reserve, found_w=seat, circuit=self.store.name,
                      action="registering it again where it fits; else the cards go to their floors")
        self.seated = False
        # The seat comes with a grant covering what the cards may draw above the reserve
        # (a running host whose seat was removed: its cards hold their watts until a
        # tick, a write and a read-back after this round), in one transaction, so that
        # no other host raises into watts still in use. Unknown before the first
        # snapshot: no seat until then (a live host without a seat holds every raise).
        board = self._cards_board_w()
        assert self.lease_id is not None
        if board is not None:
            cover = self.power.grant_covering_w(board)
            if read.view.seat_fits(reserve + cover, self.host) and await self.store.register_seat(
                    read, self.host, reserve, grant_w=cover, lease_id=self.lease_id):
                self.seated = self.had_seat = True
                self._unhold()
                self.held_w = cover
                if self.lease_clock() < self.valid_until:  # counted: in use, as after a raise (the
                    self.in_use_w = cover                    # policy moves it from here; cards that
                    self._raised_at = self.clock()           # cannot come down are not held apart)
                else:
                    self._to_reserve()
                self._said.pop("circuit_seat_waits_for_cards", None)
                self._set_floors(False, read, "")
                log.info("circuit_seated", host=self.host, reserve_w=reserve, covering_grant_w=round(cover, 1),
                         circuit=self.store.name)
                return False
            if read.view.seat_fits(reserve, self.host) and cover > 0:
                self._say("circuit_seat_waits_for_cards", True, log.warning, host=self.host, reserve_w=reserve,
                          cards_above_reserve_w=round(cover, 1), circuit=self.store.name,
                          action="room for the seat but not for what the cards may draw above it: no seat until "
                          "they are down to the reserve (meanwhile no host raises)")
        self._to_reserve()  # not seated: the reserve, until it is
        if read.view.seat_fits(reserve, self.host):
            return False  # the compare failed, or the cards are still coming down to fit: next round
        await self.store.put_pending(self.host, reserve, self.lease_id)
        v = read.view
        # Not counted: the cards are held at what the nodes carry beside everyone else
        # (their floors at the least) until the seat fits; the others shed to make room
        # (the division counts this reserve before any want).
        floor = self._floor_wall_w()
        hold = v.unseated_hold_w(self.host, reserve, reserve if floor is None else floor)
        self.hold_w = hold
        self._offer()
        others = v.seats_w - v.seats.get(self.host, 0.0)
        if self.had_seat:
            # Running, and the seat it had is gone with no room for it: the reserve is not
            # covered any more, so the cards go to the lowest level they can be held to.
            self._set_floors(True, read, "its seat vanished and no longer fits")
        tree: dict[str, object] = {}
        if v.tree is not None:  # which node is full, or that the tree has no place for this host
            seated = dataclasses.replace(v, seats={**v.seats, self.host: reserve},
                                         grants={h: w for h, w in v.grants.items() if h != self.host})
            tree = {"in_tree": self.host in v.tree.hosts, "nodes_over_w": seated.nodes_over_w()}
        self._say("circuit_seat_does_not_fit", True, log.error, host=self.host, reserve_w=reserve,
                  other_seats_w=others, grants_w=v.grants_w, budget_w=v.budget_w, held_at_w=round(hold, 1), **tree,
                  action="this host takes no grant and holds its cards at held_at_w (what the circuit carries beside "
                  "the others, its cards' floors at the least) until its seat fits; the others shed to make room. "
                  "If it never fits: lower reserve_w here or elsewhere, or raise the circuit budget (or the tree's nodes)")
        return False

    def _unhold(self) -> None:
        if self.hold_w is not None:
            log.info("circuit_seat_hold_lifted", host=self.host, held_at_w=round(self.hold_w, 1))
            self.hold_w = None

    def _floor_wall_w(self) -> float | None:
        """The least the cards can be held to, at the wall (W): their minimum limits
        through the feed model; None before the first snapshot."""
        snap = self.snapshot
        if snap is None:
            return None
        return self.power.feed.wall_w(sum(c.min_limit_w or 0.0 for c in snap.cards))

    def _set_floors(self, on: bool, read: Read, why: str) -> None:
        if on and not self.at_floors:
            log.error("circuit_at_floors", host=self.host, reason=why, budget_w=read.view.budget_w,
                      seats_w=read.view.seats_w, action="the cards are held at their floors; fix the seats "
                      "(circuit status) or raise the budget")
        elif not on and self.at_floors:
            log.info("circuit_floors_lifted", host=self.host)
        self.at_floors = on
        self.metrics.at_floors.set(1 if on else 0)
        if on:
            self._to_reserve()

    def _record(self, read: Read, grant_w: float) -> HostRecord:
        """This host's record under ``grant_w`` (W): want, caps and measured draw (at the
        wall, through the feed model), seat and grant, nameplate."""
        snap = self.snapshot
        return HostRecord(
            want_w=round(self.want_w / 5) * 5.0,
            caps_w=None if snap is None else self.power.feed.wall_w(snap.sum_limit_bound_w),
            draw_w=None if snap is None or snap.sum_power_known_w is None else self.power.feed.wall_w(snap.sum_power_known_w),
            seat_w=read.view.seats.get(self.host), grant_w=grant_w,
            max_w=None if snap is None else self.power.nameplate_w(snap),
        )

    async def _publish(self, read: Read) -> None:
        """This host's record (:meth:`_record`); again each round any of its figures moved
        (5 W or more), and with each lowering of the grant (``_move_grant``)."""
        assert self.lease_id is not None
        rec = self._record(read, self.held_w)
        self.metrics.caps.set(rec.caps_w or 0.0)
        self.metrics.draw.set(rec.draw_w or 0.0)
        stored = read.records.get(self.host)
        # What etcd holds is checked against what was published: a record removed
        # (``circuit leave --force``) or overwritten is published again at once (left
        # out, this host's want would be missing from every host's division).
        drifted = self.published is not None and (stored is None or stored_fields(stored) != stored_fields(self.published))
        if drifted:
            log.info("circuit_record_restored", host=self.host, found="none" if stored is None else "changed",
                     circuit=self.store.name)
        if self.published is None or drifted or _moved(self.published, rec, max(5.0, self.cfg.step_w / 2)):
            await self.store.put_record(self.host, rec, self.lease_id)
            self.published = rec

    async def _publish_meters(self, read: Read) -> None:
        """Each meter this host reads that the tree names for a node above it: its
        standing value, published under this host's lease (``meters/<host>/<node>``) when
        it changed, was seen again after a change, or a third of its freshness has gone
        by since the last report (so that its age, not a silence, says when it is stale)."""
        assert self.lease_id is not None
        tree = read.view.tree
        if tree is None or not self.meter_sources or self.host not in tree.hosts:
            return
        mine = {n for leaf in tree.hosts[self.host].cords for n in tree.path(leaf)}
        now, wall = self.clock(), self.store.wall_clock()
        for node in sorted(mine):
            source = tree.nodes[node].meter
            sample = None if source is None or source not in self.meter_sources else self.meter_sources[source]()
            if sample is None:
                continue
            report = report_of(sample, node, self.host, now, wall)
            last = self._meters_sent.get(node)
            due = last is None or last.value_w != report.value_w or report.age_s < last.age_at(wall) - 0.5 \
                or wall - last.at >= stale_after_s(report.refresh_s) / 3
            if due:
                await self.store.put_meter(report, self.lease_id)
                self._meters_sent[node] = report

    async def _move_grant(self, read: Read) -> None:
        assert self.lease_id is not None
        now = self.lease_clock()
        held = read.view.grants.get(self.host, 0.0)
        if self.host in read.view.unknown:
            held = self.held_w  # our own key unreadable: we know what we hold; rewritten below
            await self.store.lower_grant(self.host, self.held_w, self.lease_id)
        if held < self.held_w:  # etcd holds less than we thought (we never raise without it)
            if held < self.in_use_w:
                self.in_use_w = held
                self._offer()  # the cards down at once, before the transaction below
            if self.host in read.view.seats:  # unseated: the seat's registration covers the cards
                held = await self._cover(read, held)
            self.held_w = held
        allowed = self.grants_ok and not self.stopping and now < self.valid_until
        target = self.policy.target_w(read.view, self.host, self.held_w, now) if allowed else 0.0
        if now < self.raises_after:
            target = min(target, self.held_w)  # keep (or lower) the grant; raise nothing
        target = min(target, max(self.held_w, leases.room_w(read, self.host)))  # within the leases of watts above
        if target > self.held_w and self.in_use_w == self.held_w:  # no lowering under way
            # No raise at all while another live host waits for a seat (raise_allowed
            # leaves room for its reserve; the policy's share did not count it).
            if not raise_allowed(read.view, self.host, target) or read.view.unseated.keys() - {self.host}:
                self._grant_settled = True  # until another host's seat, grant or claim changes (told)
                return
            if await self.store.raise_grant(read, self.host, target, self.lease_id):
                self.held_w = target
                if self.lease_clock() < self.valid_until:
                    self.in_use_w = target
                    self._raised_at = self.clock()
                log.info("circuit_grant_raised", grant_w=target, want_w=round(self.want_w, 1), host=self.host)
            else:
                self.metrics.conflicts.inc()
                self._reread(read)
            return
        if target < self.in_use_w:
            # The offer first (a lapsed fence or a stop gives the whole grant back); etcd
            # as the cards come down.
            self.in_use_w = target
        lowered = self.power.lowered_grant_w(self.held_w, self.in_use_w, self._cards_board_w())
        if lowered < self.held_w:
            # The record with it, in one transaction: the cards are down to what the
            # lowered grant carries (lowered_grant_w), and a reader must not see the
            # figures read under the old grant beside the others' raises that follow.
            rec = self._record(read, lowered)
            await self.store.lower_grant(self.host, lowered, self.lease_id, record=rec)
            self.published = rec
            log.info("circuit_grant_lowered", from_w=self.held_w, to_w=lowered, host=self.host)
            self.held_w = lowered
            if target > lowered and self.in_use_w == lowered:
                self._wake(urgent=True, chance=True)  # wanted again meanwhile: the raise that waited for the lowering
        else:
            self._grant_settled = target == self.held_w

    async def _cover(self, read: Read, held_w: float) -> float:
        """The grant etcd holds for this host was lowered or removed under it (an operator,
        a restore) while its cards may still draw more: put back, where it fits beside
        every seat, grant and live unseated host's reserve, the grant covering what they
        may draw (they come down meanwhile: the offer dropped before), so that no other
        host raises into watts still in use. Returns the grant etcd holds now (W)."""
        assert self.lease_id is not None
        board = self._cards_board_w()
        cover = self.held_w if board is None else min(self.held_w, self.power.grant_covering_w(board))
        if cover <= held_w + 1e-6:
            return held_w
        if raise_allowed(read.view, self.host, cover) and await self.store.raise_grant(
                read, self.host, cover, self.lease_id):
            log.warning("circuit_grant_restored", host=self.host, found_w=held_w, grant_w=round(cover, 1),
                        circuit=self.store.name, detail="the grant was lowered under this host while its cards "
                        "may still draw more: put back to cover them while they come down")
            return cover
        self.metrics.vanished_grant.inc()
        log.error("circuit_grant_vanished", host=self.host, found_w=held_w, cards_need_w=round(cover, 1),
                  circuit=self.store.name, action="the cards are coming down to what etcd holds; the room was "
                  "taken before it could be covered again: the circuit may be over until they are down")
        return held_w

    def _cards_board_w(self) -> float | None:
        """The most the cards may draw from now on (board W), from the last snapshot: the
        sum of their bounds (highest limits that may be in force) and the budget in
        force (no card is raised above it until the circuit offers more: the circuit's
        offer caps every other source). None before the first snapshot, and while the
        last one is from a tick that began before the grant in use was last raised (that
        tick, or the one under way, may be raising the cards past what it shows)."""
        snap = self.snapshot
        if snap is None or snap.now <= self._raised_at:
            return None
        return max(snap.budget_w, snap.sum_limit_bound_w)

    def _cards_within(self, grant_w: float) -> bool:
        """The cards fit the board budget for ``grant_w`` (:meth:`_cards_board_w`)."""
        board = self._cards_board_w()
        return board is not None and board <= self.power.board_budget_w(grant_w) + 1e-6

    def _offer(self) -> None:
        now = self.clock()
        left = self.valid_until - self.lease_clock()
        reserve_board = 0.0 if self.at_floors else self.power.board_budget_w() if self.hold_w is None else \
            max(0.0, self.power.board_w(min(self.hold_w, self.power.reserve_w)))
        if self.in_use_w > 0 and left > 0 and not self.at_floors:
            self.arbiter.offer(SOURCE, self.power.board_budget_w(self.in_use_w), now,
                               expires_at_s=now + left, expired_w=reserve_board)
        else:
            self.arbiter.offer(SOURCE, reserve_board, now)
        self.metrics.grant.set(self.in_use_w if left > 0 else 0.0)
        self.metrics.grant_held.set(self.held_w)
        self.metrics.lease_left.set(max(0.0, left) if self.lease_id is not None else 0.0)

    def _report_bad(self, read: Read) -> None:
        """One log line per bad key and value (again only when its value changes)."""
        self.metrics.bad_records.set(len(read.bad))
        for key, why in read.bad.items():
            if self._bad_said.get(key) != why:
                self._bad_said[key] = why
                self.metrics.bad_seen.inc()
                log.error("circuit_record_unreadable", key=key, error=why, host=self.host,
                          detail="left out (a seat or grant: counted at the whole budget, nothing raised while it is "
                          "there); fix or delete the key")
        for key in list(self._bad_said):
            if key not in read.bad:
                del self._bad_said[key]
        for key in read.unleased.keys() - self._unleased_said:
            log.warning("circuit_record_unleased", key=key, host=self.host, circuit=self.store.name,
                        detail="under no lease, so no live writer: ignored (a claim, grant, record, pending seat or "
                        "feed mark lives under its writer's lease); delete the key")
        self._unleased_said = set(read.unleased)

    def _show(self, read: Read) -> None:
        v = read.view
        self.metrics.budget.set(v.budget_w)
        self.metrics.seats.set(v.seats_w)
        self.metrics.committed.set(v.committed_w)
        self.metrics.pending.set(sum(v.pending.values()))
        self.metrics.seated.set(1 if self.seated else 0)
        self.metrics.grants_ok.set(1 if self.grants_ok else 0)
        self._show_tree(read)

    def _show_tree(self, read: Read) -> None:
        """The nodes on this host's cords' paths (a handful: the label set stays small
        whatever the tree's size), and the lost feed, if any; stale labels removed."""
        v, m = read.view, self.metrics
        tree = v.tree
        paths = set() if tree is None or self.host not in tree.hosts else {
            n for leaf in tree.hosts[self.host].cords for n in tree.path(leaf)}
        for gone in self._nodes_shown - paths:
            for g in (m.node_budget, m.node_committed, m.node_draw, m.node_measured, m.node_unmanaged,
                      m.node_meter_age):
                with contextlib.suppress(KeyError):
                    g.remove(gone)
        self._nodes_shown = paths
        if tree is not None and paths:
            committed = v.node_loads_w()
            draw = tree.loads_known_w({h: r.draw_w for h, r in read.records.items()}, v.lost, flow=True)
            for n in paths:
                m.node_budget.labels(node=n).set(tree.nodes[n].rated_w)
                self._show_meter(read, n)
                m.node_committed.labels(node=n).set(committed[n])
                through = draw.get(n)  # None: a host's draw unknown, or the node dead
                if through is None:
                    with contextlib.suppress(KeyError):
                        m.node_draw.remove(n)
                else:
                    m.node_draw.labels(node=n).set(through)
        if v.lost != self._feed_shown:
            if self._feed_shown is not None:
                m.feed_lost.remove(self._feed_shown)
            if v.lost is not None:
                m.feed_lost.labels(feed=v.lost).set(1)
            self._feed_shown = v.lost

    def _show_meter(self, read: Read, node: str) -> None:
        """A node's measured draw, its meter's age and the unmanaged load taken off it;
        a reading that is stale (or unusable) said once per change, naming why."""
        m, tree = self.metrics, read.view.tree
        assert tree is not None
        meter = read.meters.get(node)
        unmanaged = tree.nodes[node].unmanaged_w
        if meter is None and not unmanaged:
            for g in (m.node_measured, m.node_unmanaged, m.node_meter_age):
                with contextlib.suppress(KeyError):
                    g.remove(node)
            return
        m.node_unmanaged.labels(node=node).set(unmanaged)
        if meter is None or meter.measured_w is None or meter.age_s is None:
            for g in (m.node_measured, m.node_meter_age):
                with contextlib.suppress(KeyError):
                    g.remove(node)
        else:
            m.node_measured.labels(node=node).set(meter.measured_w)
            m.node_meter_age.labels(node=node).set(meter.age_s)
        if meter is not None:
            state = meter.why.split(" (")[0]  # the reason, not its changing figures
            if self._said.get(f"meter:{node}") != state:
                self._said[f"meter:{node}"] = state
                (log.warning if meter.why else log.info)(
                    "circuit_node_meter_ignored" if meter.why else "circuit_node_meter_used", node=node,
                    meter=meter.source, measured_w=meter.measured_w, reported_w=meter.reported_w,
                    unmanaged_w=round(unmanaged, 1), circuit=self.store.name,
                    detail=meter.why or "the unmanaged load (measured - reported) is taken off the node's budget: "
                    "the hosts under it share what is left")

    def _set_reachable(self, ok: bool, error: str = "", *, refused: bool = False) -> None:
        state = "reachable" if ok else "refused" if refused else "unreachable"
        if state != self._reach_said:
            if ok:
                log.info("circuit_etcd_reachable", endpoint=self.store.endpoint, circuit=self.store.name)
            elif refused:
                log.error("circuit_etcd_refused", endpoint=self.store.endpoint, error=error, circuit=self.store.name,
                          user=self.cfg.username, detail="etcd answered but refused this user (its name, password or "
                          "role): running on the reserve")
            else:
                log.error("circuit_etcd_unreachable", endpoint=self.store.endpoint, error=error,
                          circuit=self.store.name,
                          detail="the grant stays valid only until the fence; then the reserve")
            self._reach_said = state
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
        read = self.last_read
        try:
            if read is not None and read.marks.get(self.host, ("", "", 0))[2] == self.lease_id:
                # A feed mark of this host's lives on until its lease ends: a restart adopts it.
                await self.store.give_back(self.host, self.identity.machine_id, self.identity.boot_id)
                log.info("circuit_left_feed_mark_kept", host=self.host, feed=read.marks[self.host][0],
                         lease=f"{self.lease_id:x}", detail="the grant given back; the mark ends with the lease")
                return
            await self.store.revoke(self.lease_id)
            log.info("circuit_left", host=self.host, lease=f"{self.lease_id:x}")
        except (StoreUnavailable, LeaseGone):
            pass
        except Exception:  # noqa: BLE001 - on the way out: the lease lapses on its own
            log.exception("circuit_leave_failed", host=self.host)


def _prepare(read: Read, host: str, step_w: float) -> None:
    """What a round computes from ``read`` whatever the host, once for the read (each is
    kept with it): the tree's division (``CircuitView.division``: the grant target) and,
    under a lease of watts, the leases' figures and who waits (``leases.prepare``). A
    warm-up: what it raises, the round meets where it asks."""
    with contextlib.suppress(Exception):
        read.view.division()
        tree = read.view.tree
        if tree is not None and read.delegations and leases.delegated_above(tree, host):
            leases.prepare(read, step_w)


def _moved(old: HostRecord, new: HostRecord, step_w: float) -> bool:
    """Whether a record changed enough to publish again: seat or grant at all; want,
    caps, draw or nameplate by ``step_w`` (W) or more, or appearing or vanishing."""
    if (old.seat_w, old.grant_w) != (new.seat_w, new.grant_w):
        return True
    for a, b in ((old.want_w, new.want_w), (old.caps_w, new.caps_w), (old.draw_w, new.draw_w), (old.max_w, new.max_w)):
        if (a is None) != (b is None) or (a is not None and b is not None and abs(a - b) >= step_w):
            return True
    return False
