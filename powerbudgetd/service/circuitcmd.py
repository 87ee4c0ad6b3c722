"""``powerbudgetd circuit init | status | leave`` and ``powerbudgetd failsafe``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from powerbudgetd.errors import ConfigError, ExitStatus, NvmlError
from powerbudgetd.config import CircuitConfig, Settings, default_config_path, load_config


def _settings(path: Path | None) -> Settings:
    return load_config(path or default_config_path())


def _circuit_cfg(args: argparse.Namespace) -> CircuitConfig:
    """The [circuit] section of --config, with --endpoint/--name/--host over it; or, with
    --endpoint and --name and no readable config, those alone."""
    overrides: dict[str, Any] = {}
    if getattr(args, "endpoint", None):
        overrides["endpoints"] = args.endpoint
    if getattr(args, "name", None):
        overrides["name"] = args.name
    if getattr(args, "host", None):
        overrides["host"] = args.host
    path = args.config or default_config_path()
    operator_box = args.circuit_command != "join"  # join seats this host's reserve_w: its config is needed
    if operator_box and args.config is None and "endpoints" in overrides and "name" in overrides and not path.is_file():
        return CircuitConfig(reserve_w=1, **overrides)  # an operator's box: no host config needed
    settings = load_config(path)
    if settings.circuit is None:
        raise ConfigError(f"{path}: no [circuit] section (or give --endpoint and --name)")
    return settings.circuit.model_copy(update=overrides)


def circuit_command(args: argparse.Namespace) -> int:
    from powerbudgetd.channels.circuit.channel import store_from_config
    from powerbudgetd.channels.circuit.store import StoreUnavailable

    try:
        cfg = _circuit_cfg(args)
    except ConfigError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    store = store_from_config(cfg)

    async def go() -> int:
        try:
            if args.circuit_command == "init":
                return await _init(store, args)
            if args.circuit_command == "leave":
                return await _leave(store, cfg.host, args.force)
            if args.circuit_command == "join":
                return await _join(store, cfg.host, cfg.reserve_w)
            return await _status(store, args.json)
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except StoreUnavailable as exc:
        print(f"powerbudgetd: etcd unavailable: {exc}\n  endpoints: {', '.join(cfg.endpoints)}", file=sys.stderr)
        return ExitStatus.ERROR


async def _init(store: Any, args: argparse.Namespace) -> int:
    from powerbudgetd.core.feed import Feed

    if args.budget_w is not None:
        budget, how = args.budget_w, "as given"
    else:
        try:
            feed = Feed(breaker_a=args.breaker_a, volts=args.volts, derating=args.derating, ups_w=args.ups_w)
        except ValueError as exc:
            print(f"powerbudgetd: circuit init: {exc}", file=sys.stderr)
            return ExitStatus.CONFIG
        budget = feed.wall_limit_w()
        how = f"{args.breaker_a:g} A x {args.volts:g} V x {args.derating:g}" + (f", UPS {args.ups_w:g} W" if args.ups_w else "")
    ok = await store.init(round(budget, 1), args.ttl, force=args.force)
    if not ok:
        read = await store.read()
        if args.force:
            print(f"powerbudgetd: circuit {store.name}: seats and grants ({read.view.committed_w:g} W) exceed "
                  f"{budget:g} W; lower them first", file=sys.stderr)
        else:
            spec = read.spec
            print(f"powerbudgetd: circuit {store.name} exists ({spec.budget_w:g} W, TTL {spec.ttl_s} s); "
                  "--force replaces its budget and TTL" if spec else f"powerbudgetd: circuit {store.name}: not created",
                  file=sys.stderr)
        return ExitStatus.ERROR
    print(f"circuit {store.name}: budget {budget:g} W at the wall ({how}), lease TTL {args.ttl} s")
    return ExitStatus.OK


async def _join(store: Any, host: str, reserve_w: float) -> int:
    """Register ``host``'s seat before its daemon first runs: from then on its reserve is
    counted, so no other host's grant can stand in its way when it boots."""
    for _ in range(20):  # a compare that fails only means something changed: read again
        read = await store.read()
        if read.spec is None:
            print(f"powerbudgetd: circuit {store.name} is not initialised (powerbudgetd circuit init)", file=sys.stderr)
            return ExitStatus.ERROR
        if read.view.seats.get(host) == reserve_w:
            print(f"circuit {store.name}: {host} already seated with {reserve_w:g} W")
            return ExitStatus.OK
        if not read.view.seat_fits(reserve_w, host):
            v = read.view
            print(f"powerbudgetd: circuit {store.name}: {host}'s seat of {reserve_w:g} W does not fit: other seats "
                  f"{v.seats_w - v.seats.get(host, 0):g} W + grants {v.grants_w - v.grants.get(host, 0):g} W of "
                  f"{v.budget_w:g} W (grants are given back within a release hold: try again, or lower reserve_w)",
                  file=sys.stderr)
            return ExitStatus.ERROR
        if await store.register_seat(read, host, reserve_w):
            print(f"circuit {store.name}: {host} seated with {reserve_w:g} W")
            return ExitStatus.OK
    print(f"powerbudgetd: circuit {store.name}: the circuit kept changing; try again", file=sys.stderr)
    return ExitStatus.ERROR


async def _leave(store: Any, host: str, force: bool) -> int:
    read = await store.read()
    if host in read.leases and not force:
        print(f"powerbudgetd: {host} is alive on circuit {store.name} (its lease is held): stop its daemon first, "
              "or --force (its reserve would then be uncounted while it runs)", file=sys.stderr)
        return ExitStatus.ERROR
    await store.leave(host)
    print(f"circuit {store.name}: {host}'s seat ({read.view.seats.get(host, 0):g} W) removed")
    return ExitStatus.OK


async def _status(store: Any, as_json: bool) -> int:
    read = await store.read()
    v = read.view
    hosts = sorted(set(v.seats) | set(v.grants) | set(v.wants) | set(v.pending))
    rows = []
    for h in hosts:
        lease = read.leases.get(h)
        left = await store.lease_ttl_s(lease) if lease else None
        rows.append({
            "host": h, "seat_w": v.seats.get(h), "pending_w": v.pending.get(h), "want_w": v.wants.get(h),
            "grant_w": v.grants.get(h, 0.0), "alive": lease is not None,
            "lease_left_s": left if left is not None and left >= 0 else None,
        })
    doc = {
        "circuit": store.name, "revision": read.revision, "initialised": read.spec is not None,
        "budget_w": read.spec.budget_w if read.spec else None, "ttl_s": read.spec.ttl_s if read.spec else None,
        "seats_w": v.seats_w, "grants_w": v.grants_w, "pending_w": sum(v.pending.values()),
        "committed_w": v.committed_w, "free_w": v.free_w if read.spec else None,
        "within_budget": v.holds() if read.spec else None, "hosts": rows,
    }
    if as_json:
        print(json.dumps(doc, indent=2))
        return ExitStatus.OK
    if read.spec is None:
        print(f"circuit {store.name}: not initialised (powerbudgetd circuit init --budget W)")
        return ExitStatus.ERROR
    print(f"circuit {store.name}: budget {v.budget_w:g} W, lease TTL {read.spec.ttl_s} s, revision {read.revision}")
    print(f"  seats {v.seats_w:g} W + grants {v.grants_w:g} W = {v.committed_w:g} W "
          f"({'within' if v.holds() else 'OVER'} budget; free {v.free_w:g} W)")
    if v.pending:
        print(f"  NOT SEATED (their seats do not fit): {', '.join(f'{h} {w:g} W' for h, w in sorted(v.pending.items()))}")
    print(f"  {'host':<20} {'seat W':>8} {'want W':>8} {'grant W':>8} {'lease s':>8}")
    for r in rows:
        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:g}"
        seat = f(r["seat_w"]) if r["seat_w"] is not None else f"({f(r['pending_w'])})"
        print(f"  {r['host']:<20} {seat:>8} {f(r['want_w']):>8} {f(r['grant_w']):>8} {f(r['lease_left_s']):>8}")
    return ExitStatus.OK


def failsafe_command(args: argparse.Namespace) -> int:
    """Lower every card to its share of the reserve budget (decreases only); then, when
    every card is confirmed there, give this host's grant back (best effort)."""

    try:
        settings = _settings(args.config)
    except ConfigError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    # The daemon's instance lock: failsafe runs after the daemon, never beside it.
    from powerbudgetd.errors import AlreadyRunning
    from powerbudgetd.service.instance import InstanceLock, lock_path

    path = lock_path(args.backend, False, settings.sim.state_file)
    lock = None
    if path is not None:
        try:
            lock = InstanceLock(path).acquire()
        except AlreadyRunning as exc:
            print(f"powerbudgetd: failsafe: the daemon is running ({exc}); it keeps the budget itself",
                  file=sys.stderr)
            return ExitStatus.ALREADY_RUNNING
        except OSError:
            lock = None  # no runtime directory (not under the unit): go on, lowering is always safe
    try:
        return _failsafe(args, settings)
    finally:
        if lock is not None:
            lock.release()


def _failsafe(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 0 when every card is at or below its share; FAILSAFE_INCOMPLETE when a card
    could not be reached, read or lowered (each logged by name and why); NVML when NVML
    would not start or count the cards. Every NVML call has a deadline."""
    import structlog

    from powerbudgetd.control.failsafe import CALL_TIMEOUT_S, INIT_TIMEOUT_S, failsafe
    from powerbudgetd.hw.calls import DeadlineCalls
    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd.service.logs import configure_logging

    configure_logging(level=settings.log_level)
    log = structlog.get_logger("powerbudgetd")
    calls = DeadlineCalls(CALL_TIMEOUT_S)
    budget = settings.reserve_budget_w()
    source = "the circuit reserve" if settings.circuit else "configured"
    try:
        nvml = make_nvml(args.backend, settings.sim.scenario, settings.sim.seed, settings.sim.lag_s, settings.sim.state_file)
        calls.call("init", nvml.init, timeout_s=INIT_TIMEOUT_S)
    except NvmlError as exc:
        log.error("failsafe_nvml_unavailable", error=str(exc), action="no card lowered")
        print(f"powerbudgetd: failsafe: NVML unavailable: {exc}", file=sys.stderr)
        return ExitStatus.NVML
    try:
        result = failsafe(nvml, budget, settings.overrides(), calls=calls,
                          confirm_timeout_s=settings.control.confirm_timeout_s + 2)
    except NvmlError as exc:
        log.error("failsafe_nvml_unavailable", error=str(exc), action="the cards could not be counted: none lowered")
        print(f"powerbudgetd: failsafe: NVML cannot count the cards: {exc}", file=sys.stderr)
        return ExitStatus.NVML
    finally:
        try:  # with a call abandoned on a hung card it may never return
            DeadlineCalls(2.0).call("shutdown", nvml.shutdown)
        except NvmlError as exc:
            log.warning("nvml_shutdown_abandoned", error=str(exc), after_s=2.0)
    ok = all(r.confirmed for r in result)
    for r in result:
        if not r.reached:
            log.error("failsafe_card_unreachable", index=r.index, uuid=r.uuid or None, error=r.error,
                      counted_w=r.share_w, action="the others lowered to fit it at that" if r.share_w is not None
                      else "no maximum known: the others lowered to their minimum")
            print(f"GPU {r.index}: UNREACHABLE ({r.error}), counted at "
                  f"{'unknown' if r.share_w is None else f'{r.share_w:g} W'}")
            continue
        if r.share_w is None:  # not ours to write: reserved at its bound
            print(f"GPU {r.index}: not written (excluded or invalid constraints), counted at "
                  f"{'unknown' if r.counted_w is None else f'{r.counted_w:g} W'}")
            continue
        if not r.confirmed:
            log.error("failsafe_card_not_lowered", index=r.index, uuid=r.uuid, before_w=r.before_w,
                      share_w=r.share_w, error=r.error, action="the others lowered to fit it at what it read")
        state = "confirmed" if r.confirmed else f"NOT confirmed{f' ({r.error})' if r.error else ''}"
        before = "unreadable" if r.before_w is None else f"{r.before_w:g} W"
        print(f"GPU {r.index}: {before} -> share {r.share_w:g} W, {'lowered' if r.written else 'untouched'}, {state}")
    log.info("failsafe_done", budget_w=budget, budget_source=source, within_share=ok,
             lowered=[r.index for r in result if r.written and r.confirmed],
             not_lowered=[r.index for r in result if not r.confirmed])
    print(f"failsafe: budget {budget:g} W ({source}): "
          f"{'every card within its share' if ok else 'NOT every card confirmed'}")
    if ok and settings.circuit is not None:
        _give_back(settings.circuit)
    return ExitStatus.OK if ok else ExitStatus.FAILSAFE_INCOMPLETE


def _give_back(cfg: CircuitConfig) -> None:
    """The cards are at the reserve share: this host's grant can go (lowering needs no check)."""
    from powerbudgetd.channels.circuit.channel import store_from_config
    from powerbudgetd.channels.circuit.store import LeaseGone, StoreUnavailable

    store = store_from_config(cfg)

    async def go() -> None:
        try:
            await store.give_back(cfg.host)
            print(f"failsafe: {cfg.host}'s grant on circuit {cfg.name} given back")
        except (StoreUnavailable, LeaseGone) as exc:
            print(f"failsafe: grant not given back ({exc}); it lapses with its lease", file=sys.stderr)
        finally:
            await store.close()

    asyncio.run(go())
