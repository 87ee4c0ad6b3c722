"""Command line: ``powerbudgetd simulate | probe | run``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from powerbudgetd import __version__
from powerbudgetd.errors import ConfigError, NvmlError
from powerbudgetd.logs import configure_logging

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from powerbudgetd.config import Settings
    from powerbudgetd.daemon import Daemon


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

    pr = sub.add_parser("probe", help="read every card's limits and draw (read-only)")
    pr.add_argument("--json", action="store_true")
    pr.add_argument("--backend", choices=("nvml", "sim"), default="nvml")
    pr.add_argument("--scenario", default="workstation-4", help="the simulated bank for --backend sim")

    r = sub.add_parser("run", help="the daemon")
    r.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get("POWERBUDGETD_CONFIG", "/etc/powerbudgetd/powerbudgetd.toml")),
        help="config file (default: $POWERBUDGETD_CONFIG or /etc/powerbudgetd/powerbudgetd.toml)",
    )
    r.add_argument("--dry-run", action="store_true", help="read and decide, log what would be written, write nothing")
    r.add_argument("--backend", choices=("nvml", "sim"), default="nvml")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "probe":
        return _probe(args)
    return _run(args)


def _simulate(args: argparse.Namespace) -> int:
    from powerbudgetd.simulate import format_report, plot, run_scenario
    from powerbudgetd_sim.scenario import ScenarioError, list_scenarios, load_scenario

    configure_logging(level="warning", stream=sys.stderr)
    if args.list:
        for name, desc in list_scenarios():
            print(f"{name:<20} {desc}")
        return 0
    try:
        sc = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return 2
    result = run_scenario(sc, duration_s=args.duration, seed=args.seed, keep_series=bool(args.plot))
    if args.plot:
        plot(result, sc.budget_w, args.plot, f"{sc.name}: {sc.description}")
    if args.json:
        print(json.dumps(result.report, indent=2))
    else:
        print(format_report(result.report))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def _probe(args: argparse.Namespace) -> int:
    from powerbudgetd.backend import make_nvml
    from powerbudgetd.probe import format_probe, probe

    configure_logging(level="warning", stream=sys.stderr)
    try:
        nvml = make_nvml(args.backend, scenario=args.scenario)
        nvml.init()
        result = probe(nvml)
    except NvmlError as exc:
        print(f"powerbudgetd: NVML unavailable: {exc}", file=sys.stderr)
        return 4
    print(json.dumps(result, indent=2) if args.json else format_probe(result))
    nvml.shutdown()
    return 0


def _run(args: argparse.Namespace) -> int:
    from powerbudgetd.backend import make_nvml
    from powerbudgetd.config import load_config
    from powerbudgetd.controller import Controller
    from powerbudgetd.daemon import EXIT_CONFIG, EXIT_NVML, Daemon
    from powerbudgetd_sim.scenario import ScenarioError

    try:
        settings = load_config(args.config)
    except ConfigError as exc:
        configure_logging()
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(level=settings.log_level)
    try:
        nvml = make_nvml(
            args.backend, settings.sim.scenario, settings.sim.seed, settings.sim.lag_s, settings.sim.state_file
        )
    except ScenarioError as exc:
        print(f"powerbudgetd: [sim] scenario: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except NvmlError as exc:
        print(f"powerbudgetd: NVML unavailable: {exc}", file=sys.stderr)
        return EXIT_NVML

    def factory(n):  # type: ignore[no-untyped-def]
        return Controller(
            n, settings.effective_budget_w(), settings.control.timings(), dry_run=args.dry_run, overrides=settings.overrides()
        )

    daemon = Daemon(nvml, factory, config_path=args.config)
    server = _serve_metrics(settings, daemon)
    try:
        return asyncio.run(daemon.run())
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def _serve_metrics(settings: Settings, daemon: Daemon) -> WSGIServer | None:
    """Start /metrics before the daemon boots (so before READY=1). A port that cannot be
    bound is logged, not fatal: keeping the budget matters more than reporting on it."""
    import structlog
    from prometheus_client import CollectorRegistry

    from powerbudgetd.metrics import Metrics, serve

    cfg = settings.metrics
    if not cfg.enabled:
        return None
    metrics = Metrics(CollectorRegistry())
    metrics.reload_result(True)
    metrics.attach(daemon)
    log = structlog.get_logger("powerbudgetd")
    try:
        server = serve(metrics.registry, str(cfg.listen_address), cfg.port)
    except OSError as exc:
        log.error("metrics_unavailable", address=str(cfg.listen_address), port=cfg.port, error=str(exc))
        return None
    log.info("metrics_listening", address=str(cfg.listen_address), port=server.server_port)
    return server
