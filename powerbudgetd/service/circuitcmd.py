"""``powerbudgetd circuit init | status | leave`` and ``powerbudgetd failsafe``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from powerbudgetd.errors import ConfigError, ExitStatus, NvmlError
from powerbudgetd.config import CircuitConfig, Settings, default_config_path, load_config
from powerbudgetd.service.output import printable


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
    _check_options(overrides)
    path = args.config or default_config_path()
    operator_box = args.circuit_command != "join"  # join seats this host's reserve_w: its config is needed
    if operator_box and args.config is None and "endpoints" in overrides and "name" in overrides and not path.is_file():
        # An operator's box: no host config needed (nor a machine id for a default name).
        return CircuitConfig(reserve_w=1, **{"host": "operator", **overrides})
    settings = load_config(path)
    if settings.circuit is None:
        raise ConfigError(f"{path}: no [circuit] section (or give --endpoint and --name)")
    return settings.circuit.model_copy(update=overrides)


_OPTIONS = {"endpoints": "--endpoint", "name": "--name", "host": "--host"}


def _check_options(overrides: dict[str, Any]) -> None:
    """--endpoint, --name and --host held to the rules of [circuit]'s keys. Raises
    ConfigError: one line, the option and why."""
    try:
        CircuitConfig.model_validate({"name": "x", "reserve_w": 1, **overrides})
    except ValidationError as exc:
        err = exc.errors()[0]
        option = _OPTIONS.get(str(err["loc"][0]) if err["loc"] else "", "an option")
        raise ConfigError(f"{option}: {err['msg'].removeprefix('Value error, ')} "
                          f"(got {printable(repr(err.get('input')))[:120]})") from None


def _hosts_w(hosts: dict[str, float]) -> str:
    """``host W, ...`` with every name made safe for a terminal."""
    return ", ".join(f"{printable(h)} {w:g} W" for h, w in sorted(hosts.items()))


def circuit_command(args: argparse.Namespace) -> int:
    from powerbudgetd.channels.circuit.channel import store_from_config
    from powerbudgetd.channels.circuit.store import StoreUnavailable

    try:
        if args.circuit_command == "roles":
            return _roles(args)
        cfg = _circuit_cfg(args)
    except ConfigError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    if args.circuit_command == "join":
        refused = _reserve_refused(args)
        if refused is not None:
            return refused
    store = store_from_config(cfg)

    async def go() -> int:
        try:
            if args.circuit_command == "init":
                return await _init(store, args)
            if args.circuit_command == "leave":
                return await _leave(store, cfg.host, args.force)
            if args.circuit_command == "join":
                return await _join(store, cfg.host, cfg.reserve_w)
            if args.circuit_command in ("feed-down", "feed-up"):
                return await _feed(store, args.feed, down=args.circuit_command == "feed-down")
            return await _status(store, args.json)
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except StoreUnavailable as exc:
        print(f"powerbudgetd: etcd unavailable: {exc}\n  endpoints: {', '.join(cfg.endpoints)}", file=sys.stderr)
        return ExitStatus.ERROR


def _roles(args: argparse.Namespace) -> int:
    """``circuit roles``: the etcdctl commands for least-privilege roles (nothing is sent
    to etcd). The circuit's name, prefix and a host from --config's [circuit] unless
    --name, --prefix and --host are all given. Raises ConfigError."""
    from powerbudgetd.channels.circuit.roles import roles_script
    from powerbudgetd.channels.circuit.store import CircuitStore

    overrides: dict[str, Any] = {k: v for k, v in (("name", args.name), ("prefix", args.prefix)) if v}
    for host in args.hosts or []:
        _check_options({"host": host})
    try:
        CircuitConfig.model_validate({"name": "x", "reserve_w": 1, "host": "x", **overrides})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(f"--{err['loc'][0]}: {err['msg']} (got {printable(repr(err.get('input')))[:120]})") from None
    if not (args.name and args.hosts):
        cfg = _circuit_cfg(args)
        overrides = {"name": cfg.name, "prefix": cfg.prefix, **overrides}
        hosts = args.hosts or [cfg.host]
    else:
        hosts = args.hosts
    store = CircuitStore(["127.0.0.1:2379"], overrides["name"], prefix=overrides.get("prefix", "/powerbudgetd/circuits"))
    tree = None
    if getattr(args, "tree", None):
        from powerbudgetd.config.tree import load_tree

        tree, _ = load_tree(args.tree)  # ConfigError: the file and one line per problem
    print("\n".join(roles_script(store, hosts, operator_user=args.operator_user, tree=tree)))
    return ExitStatus.OK


def _reserve_refused(args: argparse.Namespace) -> int | None:
    """``circuit join``: the reserve this host would be seated with, through the feed
    model, checked against its cards' floors (``--backend``); the exit status when it
    is refused or the cards cannot be read, None when it fits."""
    from powerbudgetd.errors import BudgetInfeasible
    from powerbudgetd.hw.nvmlscope import NvmlScope
    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd.service.feasibility import start_at_reserve

    settings = _settings(args.config)
    try:
        nvml = make_nvml(args.backend, settings.sim.scenario, settings.sim.seed, settings.sim.lag_s)
        scope = NvmlScope(nvml)
        scope.open()
    except NvmlError as exc:
        print(f"powerbudgetd: circuit join: NVML unavailable, the reserve cannot be checked against the cards' "
              f"floors: {exc}", file=sys.stderr)
        return ExitStatus.NVML
    try:
        start_at_reserve(nvml, settings)
    except BudgetInfeasible as exc:
        print(f"powerbudgetd: circuit join: refused: {exc}", file=sys.stderr)
        return ExitStatus.INFEASIBLE
    except NvmlError as exc:
        print(f"powerbudgetd: circuit join: NVML error reading the cards: {exc}", file=sys.stderr)
        return ExitStatus.NVML
    finally:
        scope.close()  # within its deadline: a hung shutdown does not hold the join
    return None


async def _init(store: Any, args: argparse.Namespace) -> int:
    from powerbudgetd.core.feed import Feed

    tree = None
    budget: float | None
    if args.tree is not None:
        from powerbudgetd.config.tree import load_tree

        try:
            tree, _ = load_tree(args.tree)
        except ConfigError as exc:
            print(f"powerbudgetd: circuit init: {exc}", file=sys.stderr)
            return ExitStatus.CONFIG
        root = next(n for n in tree.nodes.values() if n.parent is None)
        budget = root.budget_w
        how = f"the power tree {args.tree}: {len(tree.nodes)} nodes, {len(tree.hosts)} hosts; its root {root.name}"
    elif args.budget_w is not None:
        budget, how = args.budget_w, "as given"
    else:
        try:
            feed = Feed(breaker_a=args.breaker_a, volts=args.volts, derating=args.derating, ups_w=args.ups_w)
        except ValueError as exc:
            print(f"powerbudgetd: circuit init: {exc}", file=sys.stderr)
            return ExitStatus.CONFIG
        budget = feed.wall_limit_w()
        how = f"{args.breaker_a:g} A x {args.volts:g} V x {args.derating:g}" + (f", UPS {args.ups_w:g} W" if args.ups_w else "")
    if budget is None:
        print("powerbudgetd: circuit init: no budget: give --budget-w, --breaker-a or --tree", file=sys.stderr)
        return ExitStatus.CONFIG
    ok = await store.init(round(budget, 1), args.ttl, force=args.force, tree=tree)
    if not ok:
        read = await store.read()
        if args.force:
            live = read.view.unseated
            over = "" if tree is None else "".join(f"; node {n} over by {w:.0f} W" for n, w in sorted(
                dataclasses.replace(read.view, tree=tree.with_reserves(read.view.seats), budget_w=budget).nodes_over_w().items()))
            print(f"powerbudgetd: circuit {store.name}: seats and grants ({read.view.committed_w:g} W)"
                  + (f" and live hosts without a seat ({_hosts_w(live)})" if live else "")
                  + f" exceed {budget:g} W{over}; lower them first", file=sys.stderr)
        elif read.spec is None:
            print(f"powerbudgetd: circuit {store.name}: live hosts without a seat ({_hosts_w(read.view.unseated)}) "
                  f"exceed {budget:g} W: their daemons still run on those reserves", file=sys.stderr)
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
    counted, so no other host's grant can stand in its way when it boots. Refused when it
    does not fit beside the seats, grants and live hosts without a seat (a wiped circuit
    whose daemons have not seated themselves again yet), naming them."""
    for _ in range(20):  # a compare that fails only means something changed: read again
        read = await store.read()
        if read.spec is None:
            print(f"powerbudgetd: circuit {store.name} is not initialised (powerbudgetd circuit init)", file=sys.stderr)
            return ExitStatus.ERROR
        if read.view.seats.get(host) == reserve_w:
            print(f"circuit {store.name}: {host} already seated with {reserve_w:g} W")
            return ExitStatus.OK
        tree = read.view.tree
        if read.view.tree_bad:  # not a matter of room: nothing is seated until it is put right
            why = "; ".join(f"{printable(k)}: {printable(w)}" for k, w in sorted(read.bad.items())
                            if k in (store.tree_key.decode(), store.down.decode()))
            print(f"powerbudgetd: circuit {store.name}: its power tree or feed marks cannot be used ({why}): no seat is "
                  "registered until they are put right (circuit init --tree FILE --force, circuit feed-up FEED)",
                  file=sys.stderr)
            return ExitStatus.ERROR
        if tree is not None and host not in tree.hosts:
            print(f"powerbudgetd: circuit {store.name}: {printable(host)} is not in its power tree (add it under "
                  "[hosts] in the tree file and run circuit init --tree FILE --force)", file=sys.stderr)
            return ExitStatus.ERROR
        if tree is not None and not read.view.fits_tree(host, reserve_w):
            full = dataclasses.replace(read.view, seats={**read.view.seats, host: reserve_w},
                                       grants={h: w for h, w in read.view.grants.items() if h != host})
            print(f"powerbudgetd: circuit {store.name}: {printable(host)}'s seat of {reserve_w:g} W does not fit its "
                  "power tree, failover counted: " + ", ".join(f"node {n} over by {w:.0f} W" for n, w in sorted(
                      full.nodes_over_w().items())), file=sys.stderr)
            return ExitStatus.ERROR
        if not read.view.seat_fits(reserve_w, host):
            v = read.view
            live = {h: w for h, w in read.view.unseated.items() if h != host}
            print(f"powerbudgetd: circuit {store.name}: {printable(host)}'s seat of {reserve_w:g} W does not fit: other "
                  f"seats {v.seats_w - v.seats.get(host, 0):g} W + grants {v.grants_w - v.grants.get(host, 0):g} W"
                  + (f" + live hosts without a seat ({_hosts_w(live)})" if live else "")
                  + f" of {v.budget_w:g} W (grants are given back within a release hold: try again, or lower "
                  "reserve_w)", file=sys.stderr)
            return ExitStatus.ERROR
        if await store.register_seat(read, host, reserve_w):
            print(f"circuit {store.name}: {host} seated with {reserve_w:g} W")
            return ExitStatus.OK
    print(f"powerbudgetd: circuit {store.name}: the circuit kept changing; try again", file=sys.stderr)
    return ExitStatus.ERROR


async def _feed(store: Any, feed: str, *, down: bool) -> int:
    """``circuit feed-down FEED`` / ``feed-up FEED``: one feed of the tree at a time."""
    import getpass
    import socket

    read = await store.read()
    tree = read.view.tree
    if tree is None:
        print(f"powerbudgetd: circuit {store.name} has no power tree (circuit init --tree FILE)", file=sys.stderr)
        return ExitStatus.ERROR
    if down and feed not in tree.feeds():
        print(f"powerbudgetd: circuit {store.name}: {printable(feed)} is no side of a feed pair (feeds: "
              f"{', '.join(tree.feeds()) or 'none'})", file=sys.stderr)
        return ExitStatus.ERROR
    others = sorted(f for f in read.down if f != feed)
    if down and others:
        print(f"powerbudgetd: circuit {store.name}: feed {others[0]} is down already; the tree's arithmetic "
              f"counts one loss at a time (circuit feed-up {others[0]} first)", file=sys.stderr)
        return ExitStatus.ERROR
    if down:
        # Compared against the read: a host's UPS may mark another feed meanwhile.
        if not await store.mark_feed_lost(read, feed, f"{getpass.getuser()}@{socket.gethostname()}"[:100]):
            print(f"powerbudgetd: circuit {store.name}: a feed was marked lost meanwhile (a UPS on battery?); "
                  "see circuit status, then run it again", file=sys.stderr)
            return ExitStatus.ERROR
        print(f"circuit {store.name}: feed {feed} marked lost; every host divides by where its draw now flows "
              "at its next round (circuit status shows each node)")
        return ExitStatus.OK
    if not await store.feed_up(feed):
        print(f"powerbudgetd: circuit {store.name}: feed {printable(feed)} was not marked lost", file=sys.stderr)
        return ExitStatus.ERROR
    print(f"circuit {store.name}: feed {feed} back; the hosts share it again")
    return ExitStatus.OK


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
    """The circuit as etcd holds it and as the hosts measure it; see :func:`status_doc`."""
    read = await store.read()
    lease_info = {}
    for lease in set(read.leases.values()):
        lease_info[lease] = await store.lease_info(lease)
    doc = status_doc(store.name, read, lease_info)
    if as_json:
        print(json.dumps(doc, indent=2, allow_nan=False))
        return ExitStatus.OK
    if read.spec is None:
        why = doc["spec_error"]
        print(f"circuit {printable(store.name)}: " + (f"its spec is unreadable ({printable(why)}): re-create it "
              "(powerbudgetd circuit init --force)" if why else "not initialised (powerbudgetd circuit init --budget W)"))
        return ExitStatus.ERROR
    v = read.view
    print(f"circuit {printable(store.name)}: budget {v.budget_w:g} W, lease TTL {read.spec.ttl_s} s, revision {read.revision}")
    print(f"  records: seats {v.seats_w:g} W + grants {v.grants_w:g} W = {v.committed_w:g} W "
          f"({'within' if v.holds() else 'OVER'} budget; free {v.free_w:g} W)")
    for label, key in (("caps", "caps_w"), ("measured draw", "draw_w")):
        total = doc[key]
        print(f"  hosts' {label}: {'unknown' if total is None else f'{total:g} W'} at the wall"
              + ("" if total is None else f" ({'within' if total <= v.budget_w else 'OVER'} budget)"))
    for flag, text in (("no_seat", "LIVE WITHOUT A SEAT (their reserves are not counted)"),
                       ("duplicate", "TWO DAEMONS BEHIND ONE NAME"), ("stale", "STALE (missed renewals: frozen or cut off?)"),
                       ("unreadable", "UNREADABLE RECORDS (counted at the whole budget)"),
                       ("lowered", "GRANT LOWERED BY ANOTHER WRITER (their cards may not be down yet)")):
        if doc["flags"][flag]:
            print(f"  {text}: {', '.join(printable(h) for h in doc['flags'][flag])}")
    if v.pending:
        print(f"  NOT SEATED (their seats do not fit): {_hosts_w(dict(v.pending))}")
    print(f"  {'host':<24} {'seat W':>8} {'want W':>8} {'grant W':>8} {'caps W':>8} {'draw W':>8} {'lease s':>8}")
    for r in doc["hosts"]:
        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:g}"
        seat = f(r["seat_w"]) if r["seat_w"] is not None else f"({f(r['pending_w'])})"
        print(f"  {printable(r['host'])[:24]:<24} {seat:>8} {f(r['want_w']):>8} {f(r['grant_w']):>8} {f(r['caps_w']):>8} "
              f"{f(r['draw_w']):>8} {f(r['lease_left_s']):>8}" + (f"  {','.join(r['flags'])}" if r["flags"] else ""))
    if doc["nodes"]:
        print("  power tree (committed: seats + grants, failover counted; draw: measured, where it flows now)")
        if doc["feed_lost"]:
            print(f"  FEED LOST: {printable(doc['feed_lost'])} (flow: seats + grants where they flow with it dead)")
        metered = any(n["meter"] is not None for n in doc["nodes"])
        if metered:
            print("  measured: the node's own meter; reported: its hosts' draw; unmanaged: measured - reported, "
                  "taken off the budget the hosts share")
        leased = any(n["delegate"] for n in doc["nodes"])
        if leased:
            print("  lease: the watts a delegated node holds from its parent; lease free: the lease less what "
                  "its subtree commits")
        print(f"  {'node':<26} {'kind':<8} {'budget W':>9} {'committed W':>11} {'caps W':>8} {'draw W':>8} "
              f"{'headroom W':>10}" + (f" {'flow W':>8}" if doc["feed_lost"] else "")
              + (f" {'lease W':>8} {'lease free W':>12}" if leased else "")
              + (f" {'measured W':>10} {'reported W':>10} {'unmanaged W':>11} {'age s':>6}" if metered else ""))
        for n in doc["nodes"]:
            def g(x: float | None) -> str:
                return "-" if x is None else f"{x:g}"
            label = ("  " * n["depth"] + printable(n["node"]))[:26]
            flow = "" if not doc["feed_lost"] else f" {'dead' if n['dead'] else g(n['flow_w']):>8}"
            meter = "" if not metered else (
                f" {g(n['measured_w']):>10} {g(n['reported_w']):>10} {g(n['unmanaged_w']):>11} {g(n['meter_age_s']):>6}"
                + ("" if n["meter_fresh"] is not False else "  STALE"))
            lease = "" if not leased else (f" {g(n['lease_w']):>8} {g(n['lease_free_w']):>12}" if n["delegate"]
                                           else f" {'':>8} {'':>12}")
            print(f"  {label:<26} {printable(n['kind']):<8} {n['budget_w']:>9g} {n['committed_w']:>11g} {g(n['caps_w']):>8} "
                  f"{g(n['draw_w']):>8} {n['headroom_w']:>10g}{flow}{lease}{meter}" + ("" if n["within_budget"] else "  OVER"))
            if n["meter_note"]:
                print(f"    {printable(n['node'])}: meter {printable(n['meter'] or '')}: {printable(n['meter_note'])}")
    elif doc["tree_error"]:
        print(f"  POWER TREE UNREADABLE ({printable(doc['tree_error'])}): nothing is seated or raised until it is "
              "written again (powerbudgetd circuit init --tree FILE --force)")
    for key, why in sorted(read.bad.items()):
        print(f"  unreadable: {printable(key)}: {printable(why)}")
    return ExitStatus.OK


def status_doc(name: str, read: Any, lease_info: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """``circuit status --json``: every figure finite (records are parsed bounded), every
    host name as etcd holds it (JSON escapes it). Per host: seat, pending seat, want,
    grant, caps and measured draw at the wall (W, as the host published them), lease
    seconds left, flags (``no_seat``: live without a seat; ``duplicate``: a record under
    another lease than the claim's; ``stale``: its lease missed two renewals;
    ``unreadable``: a record that could not be read; ``lowered``: its grant is below
    the one its record was published under). ``lease_info``: lease id -> (seconds left,
    granted TTL).

    A host lowers its grant and publishes its record under it in one transaction, so
    ``lowered`` means another writer lowered or removed the grant (an operator, a wipe)
    and the host has not acted on it yet: its caps and draw are counted as published,
    since its cards may still be where they were."""
    from powerbudgetd.channels.circuit.channel import KEEPALIVES_PER_TTL

    v = read.view
    ttl = read.spec.ttl_s if read.spec else None
    bad_hosts = {k.rsplit("/", 1)[-1] for k in read.bad
                 if k.count("/") >= 2 and not k.endswith(("/spec", "/tree", "/down/"))}
    hosts = sorted(set(v.seats) | set(v.grants) | set(v.wants) | set(v.pending) | set(read.claims) | bad_hosts)
    rows = []
    flags: dict[str, list[str]] = {"no_seat": [], "duplicate": [], "stale": [], "unreadable": [], "lowered": []}
    for h in hosts:
        lease = read.leases.get(h)
        left, granted = lease_info.get(lease, (-1, 0)) if lease else (-1, 0)
        alive = lease is not None and left >= 0
        rec = read.records.get(h)
        claim = read.claims.get(h)
        mine: list[str] = []
        if alive and h not in v.seats:
            mine.append("no_seat")
        if rec is not None and claim is not None and rec.lease and rec.lease != claim.lease:
            mine.append("duplicate")
        if alive and ttl and left < granted - 2 * ttl / KEEPALIVES_PER_TTL - 1:
            mine.append("stale")
        if h in bad_hosts:
            mine.append("unreadable")
        # At the record's precision (0.1 W: ``stored_fields``); the grant is stored whole.
        lowered = rec is not None and rec.grant_w is not None and rec.grant_w > round(v.grants.get(h, 0.0), 1) + 1e-6
        if lowered:
            mine.append("lowered")
        for flag in mine:
            flags[flag].append(h)
        rows.append({
            "host": h, "seat_w": v.seats.get(h), "pending_w": v.pending.get(h), "want_w": v.wants.get(h),
            "grant_w": v.grants.get(h, 0.0), "caps_w": rec.caps_w if rec else None,
            "draw_w": rec.draw_w if rec else None, "alive": alive, "lease_left_s": left if alive else None,
            "identity": claim.identity() if claim else None, "flags": mine,
        })
    live = {r["host"]: r for r in rows if r["alive"]}

    def total(key: str) -> float | None:
        vals = [r[key] for r in live.values()]
        return None if not live or any(x is None for x in vals) else round(sum(vals), 1)

    caps, draw = total("caps_w"), total("draw_w")
    budget = read.spec.budget_w if read.spec else None
    nodes = _nodes(v, live, read.meters, read.delegations)
    nodes_within = all(n["within_budget"] is not False for n in nodes)
    spec_key = next((k for k in read.bad if k.endswith("/spec")), None)
    return {
        "circuit": name, "revision": read.revision, "initialised": read.spec is not None,
        "spec_error": read.bad.get(spec_key) if spec_key else None,
        "budget_w": budget, "ttl_s": ttl,
        "seats_w": v.seats_w if not v.unknown else None, "grants_w": v.grants_w if not v.unknown else None,
        "pending_w": sum(v.pending.values()),
        "committed_w": v.committed_w if not v.unknown else None,
        "free_w": v.free_w if read.spec and not v.unknown else None,
        "within_budget": (v.holds() and not v.unknown and not flags["no_seat"] and not flags["duplicate"]
                          and (caps is None or caps <= budget) and (draw is None or draw <= budget) and nodes_within)
        if budget is not None else None,
        "caps_w": caps, "draw_w": draw,
        "draw_within_budget": None if draw is None or budget is None else draw <= budget,
        "flags": flags, "unreadable": dict(sorted(read.bad.items())), "hosts": rows,
        "tree_error": next((why for k, why in read.bad.items() if k.endswith("/tree")), None), "nodes": nodes,
        "feed_lost": v.lost,
    }


def _nodes(v: Any, live: dict[str, dict[str, Any]], meters: dict[str, Any],
           delegations: dict[str, float]) -> list[dict[str, Any]]:
    """A power tree's nodes, root first, each under its parent (depth): its budget, the
    seats and grants it carries (failover counted, as the invariant bounds them), the
    live hosts' caps counted the same way and their measured draw where it flows now
    (W, at the wall; None while a host's figure is unknown), and its headroom: budget
    minus the larger of committed and measured (W; < 0: over). With a feed lost,
    ``flow_w``: the seats and grants where they now flow (None for a dead node), which
    the headroom and the verdict count too.

    Held against its meter (``core.nodemeter``): ``meter`` (its source id; None: not
    metered), ``measured_w`` (the meter's reading), ``reported_w`` (the hosts' draw
    through it: ``draw_w``), ``unmanaged_w`` (the load no host reports, taken off the
    budget: its own meter's or its children's, the larger), ``hosts_budget_w`` (what the
    hosts under it may commit: budget - unmanaged), ``meter_age_s``, ``meter_fresh``
    and ``meter_note`` (why no unmanaged load is counted, where none is).

    A node marked ``delegate`` (``core.delegation``): ``lease_w``, the lease of watts it
    holds from its parent (None: none taken yet), and ``lease_free_w``, the lease less
    what its subtree commits (< 0: over its lease, which the verdict counts)."""
    tree = v.tree
    if tree is None:
        return []
    committed = tree.loads_w(v.held_w())
    flow = tree.loads_w(v.held_w(), v.lost) if v.lost is not None else {}

    def rounded(loads: dict[str, float | None]) -> dict[str, float | None]:
        return {n: None if x is None else round(x, 1) for n, x in loads.items()}

    caps = rounded(tree.loads_known_w({h: r["caps_w"] for h, r in live.items()}))
    draw = rounded(tree.loads_known_w({h: r["draw_w"] for h, r in live.items()}, v.lost, flow=True))
    children: dict[str | None, list[str]] = {}
    for node in tree.nodes.values():
        children.setdefault(node.parent, []).append(node.name)
    rows: list[dict[str, Any]] = []

    def visit(name: str, depth: int) -> None:
        node = tree.nodes[name]
        rated, unmanaged = node.rated_w, node.unmanaged_w
        dead = v.lost is not None and name not in flow
        carried = None if v.lost is None or dead else round(flow[name], 1)
        reported = draw.get(name)
        meter = meters.get(name)
        measured = None if meter is None else meter.measured_w
        used = max(committed[name] + unmanaged, (reported or 0.0) + unmanaged, (carried or 0.0) + unmanaged,
                   measured if meter is not None and meter.fresh and measured is not None else 0.0)
        lease = delegations.get(name) if node.delegate else None
        lease_free = None if lease is None else round(lease - committed[name], 1)
        within = (dead or (committed[name] <= node.budget_w + 1e-6 and all(
            x is None or x <= node.budget_w + 1e-6 for x in (caps[name], reported, carried))
            and (meter is None or measured is None or not meter.fresh or measured <= rated + 1e-6))) \
            and (lease_free is None or lease_free >= 0)
        rows.append({"node": name, "kind": node.kind, "parent": node.parent, "depth": depth,
                     "budget_w": rated, "hosts_budget_w": round(node.budget_w, 1),
                     "committed_w": round(committed[name], 1), "caps_w": caps[name],
                     "draw_w": reported, "flow_w": carried, "dead": dead,
                     "headroom_w": round(rated - used, 1), "within_budget": within,
                     "meter": node.meter, "measured_w": measured, "reported_w": reported,
                     "unmanaged_w": round(unmanaged, 1),
                     "delegate": node.delegate, "lease_w": lease, "lease_free_w": lease_free,
                     "meter_age_s": None if meter is None else meter.age_s,
                     "meter_fresh": None if meter is None else meter.fresh,
                     "meter_host": None if meter is None else meter.host,
                     "meter_note": None if meter is None or not meter.why else meter.why})
        for child in sorted(children.get(name, [])):
            visit(child, depth + 1)

    for root in sorted(children.get(None, [])):
        visit(root, 0)
    return rows


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
    from powerbudgetd.hw.nvmlscope import NvmlScope
    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd.service.feasibility import reserve_figure
    from powerbudgetd.service.logs import configure_logging

    configure_logging(level=settings.log_level)
    log = structlog.get_logger("powerbudgetd")
    calls = DeadlineCalls(CALL_TIMEOUT_S)
    figure = reserve_figure(settings)
    budget = figure.budget_w
    source = "the circuit reserve" if figure.source == "circuit reserve" else "configured"
    try:
        nvml = make_nvml(args.backend, settings.sim.scenario, settings.sim.seed, settings.sim.lag_s, settings.sim.state_file)
        scope = NvmlScope(nvml, init_timeout_s=INIT_TIMEOUT_S)
        scope.open()
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
    finally:  # within its deadline: with a call abandoned on a hung card it may never return
        if (abandoned := scope.close()) is not None:
            log.warning("nvml_shutdown_abandoned", error=str(abandoned), after_s=scope.shutdown_timeout_s)
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
    held_w = sum(r.share_w for r in result if r.share_w is not None)
    infeasible = held_w > budget + 0.5  # the shares were clamped up to the cards' minimums
    if infeasible:
        log.error("failsafe_budget_below_floors", budget_w=budget, budget_source=source, origin=figure.origin,
                  floors_w=held_w, action="every card at its minimum")
        print(f"powerbudgetd: failsafe: {figure.source} {budget:g} W ({figure.origin}) is below what the cards can be "
              f"held to: their minimum limits sum to {held_w:g} W; every card is at its minimum", file=sys.stderr)
    print(f"failsafe: budget {budget:g} W ({source}): "
          f"{'every card within its share' if ok and not infeasible else 'every card at its minimum, ABOVE the budget' if ok else 'NOT every card confirmed'}")
    if ok and settings.circuit is not None:
        _give_back(settings.circuit)
    if not ok:
        return ExitStatus.FAILSAFE_INCOMPLETE
    return ExitStatus.INFEASIBLE if infeasible else ExitStatus.OK


def _give_back(cfg: CircuitConfig) -> None:
    """The cards are at the reserve share: this host's grant can go (lowering needs no
    check), unless another machine or boot holds the host's name (a duplicate refused at
    start: the grant is the holder's)."""
    from powerbudgetd.channels.circuit.channel import boot_id, store_from_config
    from powerbudgetd.channels.circuit.store import LeaseGone, StoreUnavailable

    store = store_from_config(cfg)

    async def go() -> None:
        try:
            holder = await store.give_back(cfg.host, cfg.machine_id(), boot_id())
            if holder is not None:
                print(f"failsafe: {cfg.host} on circuit {cfg.name} is claimed by {printable(holder.identity())}: "
                      "its grant is not this machine's to give back", file=sys.stderr)
                return
            print(f"failsafe: {cfg.host}'s grant on circuit {cfg.name} given back")
        except (StoreUnavailable, LeaseGone, ValueError, OSError) as exc:  # ValueError, OSError: no machine id
            print(f"failsafe: grant not given back ({exc}); it lapses with its lease", file=sys.stderr)
        finally:
            await store.close()

    asyncio.run(go())
