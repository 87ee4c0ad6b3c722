"""Command line: ``powerbudgetd simulate | probe | log report | run | check-config``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from powerbudgetd import __version__
from powerbudgetd.errors import ConfigError, ExitStatus, NvmlError
from powerbudgetd.service.logs import configure_logging

POLICY_NAMES = ("static", "slurm", "reactive", "powerbudgetd", "oracle")  # simulate.POLICIES

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

    from powerbudgetd.control.controller import Controller
    from powerbudgetd.hw.nvml import Nvml
    from powerbudgetd.service.config import Settings
    from powerbudgetd.service.daemon import Daemon


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="powerbudgetd",
        description="Keep the sum of this host's GPU power limits under one budget.",
    )
    p.add_argument("--version", action="version", version=f"powerbudgetd {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("simulate", help="run the controller against a simulated bank (virtual time)")
    s.add_argument("--scenario", default="workstation-4", help="a packaged scenario name or a TOML file")
    s.add_argument("--duration", type=float, help="simulated seconds (default: the scenario's)")
    s.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--plot", metavar="FILE.png", help="draw each card's draw and cap over time")
    s.add_argument("--list", action="store_true", help="list the packaged scenarios")
    s.add_argument("--replay", metavar="DIR_OR_FILE", help="replay a recorded power log as demand (instead of --scenario)")
    s.add_argument("--replay-draw", choices=("avg", "peak"), default="avg", help="replay each 1 s average or peak")
    s.add_argument("--budget", type=float, metavar="W", help="the bank's budget (default: the scenario's or log's)")
    s.add_argument(
        "--policy", choices=(*POLICY_NAMES, "all"),
        help="the policy to run (default powerbudgetd), or all of them side by side",
    )
    s.add_argument("--suite", action="store_true", help="every packaged scenario under every policy: the scoreboard")

    pr = sub.add_parser("probe", help="read every card's limits and draw (read-only)")
    pr.add_argument("--json", action="store_true")
    pr.add_argument("--backend", choices=("nvml", "sim"), default="nvml")
    pr.add_argument("--scenario", default="workstation-4", help="the simulated bank for --backend sim")

    lg = sub.add_parser("log", help="the flight recorder's power log").add_subparsers(dest="log_command", required=True)
    lr = lg.add_parser("report", help="where the log stops (the power event) and what was drawn before it")
    lr.add_argument("--last", default="10m", help="the window before the stop: 90s, 10m, 2h (default 10m)")
    lr.add_argument("--dir", type=Path, help="a recorder directory or one file (default: --config's [recorder] dir)")
    lr.add_argument("--config", type=Path, help="take [feed] (for sizing) and [recorder] dir from this config")
    lr.add_argument("--json", action="store_true", help="print one JSON object")

    r = sub.add_parser("run", help="the daemon")
    r.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config file (default: $POWERBUDGETD_CONFIG or /etc/powerbudgetd/powerbudgetd.toml)",
    )
    r.add_argument("--dry-run", action="store_true", help="read and decide, log what would be written, write nothing")
    r.add_argument("--backend", choices=("nvml", "sim"), default="nvml")

    c = sub.add_parser("check-config", help="validate a config file and show how the budget is derived")
    c.add_argument(
        "file", nargs="?", type=Path, default=None,
        help="config file (default: $POWERBUDGETD_CONFIG or /etc/powerbudgetd/powerbudgetd.toml)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "probe":
        return _probe(args)
    if args.command == "check-config":
        return _check_config(args)
    if args.command == "log":
        return _log_report(args)
    return _run(args)


def _check_config(args: argparse.Namespace) -> int:
    from powerbudgetd.service.checkconfig import describe
    from powerbudgetd.service.config import default_config_path, load_config

    path = args.file or default_config_path()
    try:
        settings = load_config(path)
    except ConfigError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    print(describe(settings, path))
    return ExitStatus.OK


def _simulate(args: argparse.Namespace) -> int:
    from powerbudgetd_sim.simulate import format_report, plot, plot_compare, run_policies, run_scenario
    from powerbudgetd_sim.scenario import ScenarioError, list_scenarios, load_scenario

    configure_logging(level="warning", stream=sys.stderr)
    if args.list:
        for name, desc in list_scenarios():
            print(f"{name:<20} {desc}")
        return ExitStatus.OK
    if args.suite:
        return _suite(args)
    try:
        if args.replay:
            from powerbudgetd_sim.replay import load_replay

            sc = load_replay(args.replay, draw=args.replay_draw)
        else:
            sc = load_scenario(args.scenario)
        if args.budget is not None:
            if args.budget <= 0:
                raise ScenarioError(f"--budget must be a positive number of watts, got {args.budget:g}")
            sc = dataclasses.replace(sc, budget_w=args.budget)
    except ScenarioError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    if args.policy == "all":
        from powerbudgetd_sim.scoreboard import check_targets, format_table

        results = run_policies(sc, duration_s=args.duration, seed=args.seed, keep_series=bool(args.plot))
        reports = {p: r.report for p, r in results.items()}
        if args.plot:
            plot_compare(results, sc.budget_w, args.plot, f"{sc.name}: {sc.description}")
        if args.json:
            print(json.dumps(reports, indent=2))
            return ExitStatus.OK
        any_r = reports["powerbudgetd"]
        print(f"scenario {sc.name} (seed {any_r['seed']}): {len(any_r['cards'])} cards, budget {sc.budget_w:g} W, "
              f"{any_r['duration_s']:g} s simulated")
        print(format_table(reports))
        for c in check_targets(sc, reports, args.duration):
            print(f"  [{_MARK[c.met]}] {c.target}: {c.detail}")
        if args.plot:
            print(f"plot written to {args.plot}")
        return ExitStatus.OK
    result = run_scenario(
        sc, duration_s=args.duration, seed=args.seed, keep_series=bool(args.plot), policy=args.policy or "powerbudgetd"
    )
    if args.plot:
        plot(result, sc.budget_w, args.plot, f"{sc.name}: {sc.description}")
    if args.json:
        print(json.dumps(result.report, indent=2))
    else:
        if args.replay:  # what the log cannot tell (demand above a cap) is said here
            print(sc.description)
        print(format_report(result.report))
        if args.plot:
            print(f"plot written to {args.plot}")
    return ExitStatus.OK


_MARK = {True: "met    ", False: "NOT MET", None: "n/a    "}


def _suite(args: argparse.Namespace) -> int:
    from powerbudgetd_sim.scoreboard import format_suite, run_suite

    suite = run_suite(duration_s=args.duration, seed=args.seed)
    print(json.dumps(suite, indent=2) if args.json else format_suite(suite))
    return ExitStatus.OK


def _probe(args: argparse.Namespace) -> int:
    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd.hw.probe import format_probe, probe

    configure_logging(level="warning", stream=sys.stderr)
    from powerbudgetd_sim.scenario import ScenarioError

    try:
        nvml = make_nvml(args.backend, scenario=args.scenario)
        nvml.init()
        result = probe(nvml)
    except ScenarioError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    except NvmlError as exc:
        print(f"powerbudgetd: NVML unavailable: {exc}", file=sys.stderr)
        return ExitStatus.NVML
    print(json.dumps(result, indent=2) if args.json else format_probe(result))
    nvml.shutdown()
    return ExitStatus.OK


def _log_report(args: argparse.Namespace) -> int:
    from powerbudgetd.service.config import RecorderConfig, load_config
    from powerbudgetd.powerlog.report import format_summary, parse_duration, summarize
    from powerbudgetd.powerlog.reader import LogError, scan_log

    try:
        last_s = parse_duration(args.last)
        settings = load_config(args.config) if args.config else None
    except (ValueError, ConfigError) as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    directory = args.dir or (settings.recorder.dir if settings else RecorderConfig().dir)
    try:
        result = summarize(scan_log(directory), last_s, settings.feed if settings else None, str(args.config))
    except (LogError, ValueError) as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.ERROR
    print(json.dumps(result, indent=2) if args.json else format_summary(result))
    return ExitStatus.OK


def _run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd.service.config import default_config_path, load_config
    from powerbudgetd.control.controller import Controller
    from powerbudgetd.service.daemon import Daemon
    from powerbudgetd_sim.scenario import ScenarioError

    # A SIGHUP before the daemon's handler is installed must not kill it (the default).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    config_path = args.config or default_config_path()
    try:
        settings = load_config(config_path)
    except ConfigError as exc:
        configure_logging()
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    configure_logging(level=settings.log_level)
    try:
        nvml = make_nvml(
            args.backend, settings.sim.scenario, settings.sim.seed, settings.sim.lag_s, settings.sim.state_file
        )
    except ScenarioError as exc:
        print(f"powerbudgetd: [sim] scenario: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    except NvmlError as exc:
        print(f"powerbudgetd: NVML unavailable: {exc}", file=sys.stderr)
        return ExitStatus.NVML

    from powerbudgetd.hw.calls import DeadlineCalls

    def factory(n: Nvml) -> Controller:
        timings = settings.control.timings()
        # On the wall clock every NVML call runs with a deadline off the loop, and each
        # write is stamped when it is sent.
        return Controller(
            n, settings.effective_budget_w(), timings, dry_run=args.dry_run, overrides=settings.overrides(),
            allow_monitor_only=settings.allow_monitor_only, calls=DeadlineCalls(timings.call_timeout_s),
            clock=time.monotonic,
        )

    daemon = Daemon(nvml, factory, config_path=config_path, settings=settings)
    assert daemon.arbiter is not None  # built from settings
    feed = None if settings.feed is None else settings.feed.feed()
    if settings.recorder.enabled:
        from powerbudgetd.powerlog.recorder import from_config

        daemon.register(from_config(settings.recorder, feed))
    registry = CollectorRegistry()  # what /metrics serves, MQTT's metrics included
    if settings.mqtt is not None:  # aiomqtt is imported only when MQTT is configured
        from powerbudgetd.channels.mqtt.session import MqttBridge

        daemon.register(MqttBridge(settings.mqtt, daemon.arbiter, feed, registry=registry))
    server = _serve_metrics(settings, daemon, registry)
    try:
        return asyncio.run(daemon.run())
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def _serve_metrics(settings: Settings, daemon: Daemon, registry: CollectorRegistry) -> WSGIServer | None:
    """Start /metrics before the daemon boots (so before READY=1). A port that cannot be
    bound is logged, not fatal: keeping the budget matters more than reporting on it."""
    import structlog

    from powerbudgetd.channels.metrics import Metrics, serve

    cfg = settings.metrics
    if not cfg.enabled:
        return None
    metrics = Metrics(registry, nvml=daemon.nvml, clock=daemon.clock)
    metrics.reload_result(True)
    daemon.register(metrics)
    log = structlog.get_logger("powerbudgetd")
    try:
        server = serve(metrics.registry, str(cfg.listen_address), cfg.port)
    except OSError as exc:
        log.error("metrics_unavailable", address=str(cfg.listen_address), port=cfg.port, error=str(exc))
        return None
    log.info("metrics_listening", address=str(cfg.listen_address), port=server.server_port)
    return server
