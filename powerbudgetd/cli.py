"""Command line: ``powerbudgetd simulate | probe | log report | status | run | check-config | failsafe |
circuit | restore | pod``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from powerbudgetd import __version__
from powerbudgetd.core.feed import DEFAULT_UPS_MARGIN
from powerbudgetd.errors import AlreadyRunning, BudgetInfeasible, ConfigError, ExitStatus, NvmlError
from powerbudgetd.service.cliargs import (
    BACKENDS,
    DefaultsHelpFormatter,
    OneLineParser,
    add_card_options,
    duration,
    metrics_url,
    positive_float,
    refuse_conflicts,
    require,
    writable_plot,
)
from powerbudgetd.service.logs import configure_logging
from powerbudgetd.service.output import Progress, pipe_safe

POLICY_NAMES = ("static", "slurm", "reactive", "powerbudgetd", "oracle", "causal", "ruled")  # simulate.POLICIES
DEFAULT_METRICS_PORT = 19400  # config.DEFAULT_METRICS_PORT (not imported: pydantic at every start)
SIM_MIN_DURATION_S, SIM_MAX_DURATION_S = 1.0, 7 * 86400.0  # powerbudgetd_sim.scenario.MIN/MAX_DURATION_S

if TYPE_CHECKING:
    from collections.abc import Callable

    from powerbudgetd.channels.metrics import MetricsServer

    from prometheus_client import CollectorRegistry

    from powerbudgetd.control.controller import Controller
    from powerbudgetd.core.nodemeter import Sample
    from powerbudgetd.core.tree import PowerTree
    from powerbudgetd.hw.card import CardBackend
    from powerbudgetd.hw.nvml import GpuInfo, Nvml
    from powerbudgetd_sim.scenario import Scenario

    from powerbudgetd.config import RecorderConfig, Settings
    from powerbudgetd.service.daemon import Daemon


def version_report(driver_timeout_s: float = 5.0) -> str:
    """Three lines: powerbudgetd's version, nvidia-ml-py's, and the NVIDIA driver's (or
    why NVML gave none: no GPU, no driver, no answer within ``driver_timeout_s`` s)."""
    from powerbudgetd.hw.nvml import bindings_version, query_driver_version

    try:
        driver = f"NVIDIA driver {query_driver_version(timeout_s=driver_timeout_s)}"
    except NvmlError as exc:
        driver = f"NVIDIA driver: no NVML ({exc})"
    return "\n".join((
        f"powerbudgetd {__version__} (Python {platform.python_version()})",
        f"nvidia-ml-py {bindings_version() or 'not installed'}",
        driver,
    ))


class _VersionAction(argparse.Action):
    """``--version``: asks NVML only when given (argparse's own action formats eagerly)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_report())
        parser.exit(0)


def _parser() -> argparse.ArgumentParser:
    fmt = DefaultsHelpFormatter
    p = OneLineParser(
        prog="powerbudgetd",
        description="Keep the sum of this host's GPU power limits under one budget.",
        formatter_class=fmt,
    )
    p.add_argument(
        "--version", action=_VersionAction,
        help="print this version, nvidia-ml-py's and the NVIDIA driver's, and exit",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser(
        "simulate", help="run the controller against a simulated bank (virtual time)", formatter_class=fmt,
        description="Run the real controller against a simulated bank on virtual time (the scenario's duration, "
        "300 s for the packaged ones, in a few seconds) "
        "and report violation ticks, sums of limits and draw, cap changes and each card's role. No GPU needed.",
    )
    s.add_argument("--scenario", metavar="NAME_OR_FILE",
                   help="a packaged scenario name (see --list) or a TOML file (default: workstation-4)")
    s.add_argument("--duration", type=positive_float("seconds", lower=SIM_MIN_DURATION_S, upper=SIM_MAX_DURATION_S),
                   metavar="S", help=f"simulated seconds, {SIM_MIN_DURATION_S:g} to {SIM_MAX_DURATION_S:g} (7 days) "
                   "(default: the scenario's)")
    s.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    s.add_argument("--plot", metavar="FILE.png", type=writable_plot,
                   help="draw each card's draw and cap over time (.png, .svg or .pdf; needs matplotlib; default: no plot)")
    s.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                   help="also print the controller's log lines (JSON, on stderr) from this level up "
                   "(default: none: the report summarises them)")
    s.add_argument("--list", action="store_true", help="list the packaged scenarios and exit")
    s.add_argument("--replay", metavar="DIR_OR_FILE",
                   help="replay a recorded power log as demand (instead of --scenario; default: none)")
    s.add_argument("--replay-draw", choices=("avg", "peak"),
                   help="with --replay: replay each 1 s average or each peak (default: avg)")
    s.add_argument("--budget", type=positive_float("watts"), metavar="W",
                   help="the bank's budget in W (default: the scenario's or the log's)")
    s.add_argument(
        "--policy", choices=(*POLICY_NAMES, "all"),
        help="the policy to run, or all of them side by side (default: powerbudgetd)",
    )
    s.add_argument("--suite", action="store_true",
                   help="every packaged scenario under every policy: the scoreboard; exits 1 when a target is not met "
                   "(takes minutes)")
    s.add_argument(
        "--fidelity", action="store_true",
        help="replay each recorded trace into a simulated card: real vs simulated peaks, overshoot, rise time",
    )
    s.add_argument("--circuit", metavar="A,B,...", nargs="?", const="",
                   help="several hosts (one packaged scenario each) on one circuit: static reserves vs sharing "
                   "through a lease store vs oracle grants, and sharing through a 30 s etcd outage (default: none); "
                   "alone, with --tree: the hosts of a power tree")
    s.add_argument("--tree", metavar="NAME|FILE",
                   help="with --circuit: a power tree file (or a packaged one: row-4, lab-2) through a feed loss: static reserves "
                   "vs tree sharing, redundant and oversubscribed, vs an oracle (default: none)")
    s.add_argument("--sweep", action="store_true",
                   help="with --tree: hosts per feed: the tree's hosts swept from its nameplate count N (every card at "
                   "its maximum limit within every node's rating) to 1.5 N (on to 2.0 N until nameplate trips) under static nameplate, the best static "
                   "cap, powerbudgetd and an oracle, through a feed loss: the largest count with zero breaker or UPS "
                   "trips, work per host and satisfaction ratio (--duration: each run, default 30 s; --plot: hosts vs "
                   "work per host)")
    s.add_argument("--demand", choices=("scenario", "inference", "training"),
                   help="with --sweep: each host's packaged scenario; inference: its cards driven by a request-rate "
                   "curve (a diurnal day compressed into each run, bursts, a mix of models; --seed sets phase and mix) "
                   "through the recorded H200 serving trace; training: a mix of training jobs that start together and "
                   "hold every card of their hosts at TGP in lockstep (--seed sets which host runs which job) "
                   "(default: scenario)")

    pr = sub.add_parser(
        "probe", help="read every card's limits and draw (read-only)", formatter_class=fmt,
        description="Read every card's limit constraints, limits, draw and persistence mode; writes nothing. "
        "Run it first on new hardware. Without a GPU, --backend sim probes the simulated bank.",
    )
    pr.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    pr.add_argument("--backend", choices=BACKENDS, default="nvml",
                    help="nvml: this host's GPUs through the NVIDIA driver; hwmon / amdsmi: its AMD (and Intel) cards; "
                    "auto: every backend with a card; sim: a simulated bank, no GPU needed")
    pr.add_argument("--scenario", metavar="NAME_OR_FILE",
                    help="with --backend sim: the simulated bank (default: workstation-4)")
    pr.add_argument(
        "--compare-sim", action="store_true",
        help="each NVML call's answer beside the simulator's for the nearest preset card (read-only)",
    )
    pr.add_argument("--preset", metavar="MODEL",
                    help="with --compare-sim: compare every card with this preset (default: the nearest preset per card)")

    lg = sub.add_parser(
        "log", help="the flight recorder's power log", formatter_class=fmt,
        description="Read the flight recorder's power log.",
    ).add_subparsers(dest="log_command", required=True, metavar="SUBCOMMAND")
    lr = lg.add_parser(
        "report", help="where the log stops (the power event) and what was drawn before it", formatter_class=fmt,
        description="After a power event: where the power log stops, what each card and the bank drew before "
        "it, and the UPS and circuit those peaks need.",
    )
    lr.add_argument("--last", default="10m", type=duration, metavar="DURATION",
                    help="the window before the stop, with its unit: 90s, 10m, 2h, 1d (default: 10m)")
    lr.add_argument("--dir", type=Path,
                    help="a recorder directory or one file (default: --config's [recorder] dir, else "
                    "$STATE_DIRECTORY or /var/lib/powerbudgetd)")
    lr.add_argument("--config", type=Path, help="take [feed] (for sizing) and [recorder] dir from this config "
                    "(default: none: the [feed] recorded in the log)")
    lr.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")

    st = sub.add_parser(
        "status", help="the running daemon's bank at a glance (from its metrics endpoint)", formatter_class=fmt,
        description="Read the running daemon's Prometheus endpoint and show the budget and its source, the "
        "sum of caps, the mode, and per card its cap, draw, role and warnings.",
    )
    st.add_argument("--url", type=metrics_url, help="the daemon's metrics URL (default: from --config's [metrics], else "
                    f"http://127.0.0.1:{DEFAULT_METRICS_PORT}/metrics)")
    st.add_argument("--config", type=Path,
                    help="take [metrics] listen_address and port from this config (default: $POWERBUDGETD_CONFIG "
                    "or /etc/powerbudgetd/powerbudgetd.toml, when readable)")
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.add_argument("--watch", action="store_true", help="refresh in place on a terminal, with bars for cap and draw")
    st.add_argument("--interval", type=positive_float("seconds", upper=3600), metavar="S",
                    help="with --watch: seconds between refreshes (default: 2)")
    st.add_argument("--timeout", type=positive_float("seconds", upper=60), default=3.0, metavar="S",
                    help="how long to wait for the endpoint")

    r = sub.add_parser(
        "run", help="the daemon", formatter_class=fmt,
        description="The daemon: boot every card to its fair share, then lend and reclaim under the budget.",
    )
    r.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config file (default: $POWERBUDGETD_CONFIG or /etc/powerbudgetd/powerbudgetd.toml)",
    )
    r.add_argument("--dry-run", action="store_true",
                   help="read and decide, log each power_limit_would_set, write no power limit or persistence "
                   "mode (the recorder and metrics still run)")
    r.add_argument("--backend", choices=BACKENDS, default="nvml",
                   help="nvml: this host's GPUs; hwmon / amdsmi: its AMD (and Intel) cards; auto: every backend "
                   "with a card; sim: the config's [sim] bank, no GPU needed (recorded apart from real runs)")

    c = sub.add_parser(
        "check-config", help="validate a config file and show how the budget is derived", formatter_class=fmt,
        description="Validate a config file (and POWERBUDGETD_* variables) and print the budget derivation.",
    )
    c.add_argument(
        "file", nargs="?", type=Path, default=None,
        help="config file (default: $POWERBUDGETD_CONFIG or /etc/powerbudgetd/powerbudgetd.toml)",
    )
    c.add_argument("--config", type=Path, default=None, dest="config_file", metavar="FILE",
                   help="the config file, as run takes it (instead of FILE; default: as FILE's)")
    c.add_argument(
        "--backend", choices=BACKENDS, default=None,
        help="also read the cards (read-only) and check the budget against their floors, as run does "
        "(default: none: the floors are not checked)",
    )
    c.add_argument("--tree", metavar="FILE", type=Path,
                   help="also check this host's place in a power tree file: [circuit] host among its hosts, "
                   "its cords, feed pair and seat against [circuit] reserve_w (default: none)")
    c.add_argument("--scenario", metavar="NAME_OR_FILE",
                   help="the simulated bank for --backend sim (default: the config's [sim] scenario)")
    fs = sub.add_parser(
        "failsafe", help="lower every card to its share of the reserve budget (decreases only)", formatter_class=fmt,
        description="Lower every card above its share of the reserve budget ([circuit] reserve_w through the "
        "feed model, else the configured budget) to that share, read back; never raises a limit. The unit "
        "runs it as ExecStopPost=, so any exit leaves the cards at a share the circuit counts. Then gives "
        "this host's circuit grant back. Not while the daemon runs.",
    )
    add_card_options(fs)

    ci = sub.add_parser(
        "circuit", help="a circuit several hosts share through etcd: init, status, join, leave", formatter_class=fmt,
        description="Create a circuit, show it, register or remove a host's seat. Endpoints and name come from "
        "--config's [circuit], or --endpoint and --name.",
    ).add_subparsers(dest="circuit_command", required=True, metavar="SUBCOMMAND")
    circuit_parsers = {}
    for name, text in (("init", "create the circuit: its wall budget and lease TTL"),
                       ("status", "members, seats, wants, grants, lease time left, sum vs budget"),
                       ("join", "register this host's seat (its reserve_w) before its daemon first runs"),
                       ("leave", "remove a host's seat (its daemon stopped)"),
                       ("feed-down", "mark a feed of the power tree lost: every host divides by where its draw "
                        "now flows, within one round"),
                       ("feed-up", "the feed is back: the hosts share it again"),
                       ("roles", "print the etcdctl commands that make the operator's role and one role per host "
                        "that writes only that host's own keys")):
        cp = ci.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".", formatter_class=fmt)
        cp.add_argument("--config", type=Path, default=None,
                        help="take [circuit] from this config (default: $POWERBUDGETD_CONFIG or "
                        "/etc/powerbudgetd/powerbudgetd.toml)")
        cp.add_argument("--endpoint", action="append", metavar="HOST:PORT",
                        help="an etcd endpoint, repeatable (default: the config's)")
        cp.add_argument("--name", help="the circuit (default: the config's)")
        circuit_parsers[name] = cp
    ini = circuit_parsers["init"]
    ini.add_argument("--budget-w", type=positive_float("watts"), metavar="W", help="the circuit's wall budget in W (default: none, give it or --breaker-a)")
    ini.add_argument("--breaker-a", type=positive_float("amperes"), metavar="A",
                     help="instead of --budget-w: the breaker's rating (with --volts; default: none)")
    ini.add_argument("--volts", type=positive_float("volts"), default=120.0, metavar="V", help="with --breaker-a")
    ini.add_argument("--derating", type=positive_float("fraction", upper=1), default=0.8, metavar="F",
                     help="with --breaker-a: continuous load share (NEC: 0.8)")
    ini.add_argument("--ups-w", type=positive_float("watts"), metavar="W",
                     help=f"with --breaker-a: a UPS's real watt rating, budgeted at {(1 - DEFAULT_UPS_MARGIN) * 100:.0f} %% "
                     "(the [feed] default ups_margin; default: no UPS)")
    ini.add_argument("--tree", type=Path, metavar="FILE",
                     help="instead of --budget-w or --breaker-a: the power tree file (nodes, pairs, hosts); the "
                     "circuit is that tree, its budget the root's, every grant fitting every node above its host (default: none)")
    ini.add_argument("--ttl", type=int, default=30, metavar="S",
                     help="lease TTL in s: must exceed each host's WatchdogSec + fallback_s + TTL/6")
    ini.add_argument("--force", action="store_true", help="replace an existing circuit's budget and TTL "
                     "(refused when its seats and grants exceed the new budget)")
    circuit_parsers["status"].add_argument("--json", action="store_true", help="print one JSON object")
    for name in ("feed-down", "feed-up"):
        circuit_parsers[name].add_argument("feed", metavar="FEED", help="a node that is one side of a feed pair")
    circuit_parsers["join"].add_argument("--host", help="the host to seat (default: the config's [circuit] host)")
    circuit_parsers["join"].add_argument(
        "--backend", choices=BACKENDS, default="nvml",
        help="where the cards are read, to refuse a reserve below their floors (sim: the config's [sim] bank)")
    ro = circuit_parsers["roles"]
    ro.add_argument("--host", action="append", metavar="NAME", dest="hosts",
                    help="a host to make a role and user for, repeatable (default: the config's [circuit] host)")
    ro.add_argument("--prefix", help="the circuits' key prefix (default: the config's [circuit] prefix, "
                    "else /powerbudgetd/circuits)")
    ro.add_argument("--operator-user", default="ops", metavar="NAME", help="the operator's etcd user")
    ro.add_argument("--tree", metavar="FILE", help="the circuit's power tree file: each host may also write the "
                    "lease of watts of each delegated node above it")
    lv = circuit_parsers["leave"]
    lv.add_argument("--host", help="the host whose seat goes (default: the config's [circuit] host)")
    lv.add_argument("--force", action="store_true", help="even while the host's lease is held")
    from powerbudgetd.service import pod, restore  # their own modules: each command's arguments beside its code

    restore.add_parser(sub, fmt)
    pod.add_parser(sub, fmt)
    _SUBPARSERS.update(simulate=s, probe=pr, report=lr, status=st, run=r, check_config=c, failsafe=fs,
                       circuit_init=ini)
    return p


_SUBPARSERS: dict[str, argparse.ArgumentParser] = {}

# Options that cannot go together, and options that need another: checked before any work.
_SIMULATE_CONFLICTS = (
    ("--list", ("--scenario", "--replay", "--policy", "--suite", "--plot", "--budget", "--duration", "--json",
                "--circuit"),
     "--list only lists the scenarios"),
    ("--replay", ("--scenario",), "the replayed log is the scenario"),
    ("--circuit", ("--scenario", "--replay", "--policy", "--suite", "--plot", "--budget", "--seed", "--fidelity"),
     "the circuit runs each host's packaged scenario under each way of splitting the circuit"),
    ("--tree", ("--scenario", "--replay", "--policy", "--suite", "--budget", "--fidelity", "--list"),
     "the tree file names each host's packaged scenario and the feed lost"),
    ("--sweep", ("--scenario", "--replay", "--policy", "--suite", "--budget", "--fidelity", "--list"),
     "the sweep plays the tree file's hosts, as many as each step puts on the tree"),
    ("--suite", ("--scenario", "--replay", "--policy", "--plot", "--budget"),
     "the suite runs every packaged scenario under every policy at its own budget"),
    ("--fidelity", ("--scenario", "--replay", "--policy", "--suite", "--plot", "--budget", "--duration", "--list"),
     "--fidelity replays each recorded trace, whole, at the limit it was recorded at"),
)
_SIMULATE_NEEDS = (("--replay-draw", "--replay", lambda a: a.replay is not None),
                   ("--tree", "--circuit without hosts (the tree names them), or --sweep",
                    lambda a: a.circuit == "" or a.sweep),
                   ("--sweep", "--tree", lambda a: bool(a.tree)),
                   ("--demand", "--sweep", lambda a: a.sweep),
                   ("--plot", "no --tree, or --sweep with it (the tree's split draws no plot)",
                    lambda a: not a.tree or a.sweep),
                   ("--seed", "no --tree, or --sweep with it (the tree's split runs each host's own seed)",
                    lambda a: not a.tree or a.sweep))


def _validate(args: argparse.Namespace) -> None:
    """The checks argparse cannot express alone; exits 2 naming the options."""
    if args.command == "simulate":
        refuse_conflicts(_SUBPARSERS["simulate"], args, _SIMULATE_CONFLICTS)
        require(_SUBPARSERS["simulate"], args, _SIMULATE_NEEDS)
    elif args.command == "probe":
        require(_SUBPARSERS["probe"], args, (("--scenario", "--backend sim", lambda a: a.backend == "sim"),))
    elif args.command == "check-config":
        require(_SUBPARSERS["check_config"], args, (("--scenario", "--backend sim", lambda a: a.backend == "sim"),))
        if args.file is not None and args.config_file is not None:
            _SUBPARSERS["check_config"].error("give the config file once: FILE or --config FILE")
    elif args.command == "circuit" and args.circuit_command == "init":
        ini = _SUBPARSERS["circuit_init"]
        if [args.budget_w, args.breaker_a, args.tree].count(None) != 2:
            ini.error("give --budget-w, --breaker-a (with --volts) or --tree, one of them")
        if args.budget_w is not None and args.ups_w is not None:
            ini.error("--ups-w goes with --breaker-a")
        if not 2 <= args.ttl <= 3600:
            ini.error(f"--ttl must be 2..3600 s, got {args.ttl}")
    elif args.command == "status":
        require(_SUBPARSERS["status"], args, (("--interval", "--watch", lambda a: a.watch),))
        refuse_conflicts(_SUBPARSERS["status"], args, (("--watch", ("--json",), "--watch redraws a terminal"),))


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. Ctrl-C (SIGINT) stops any command with one line
    and 130, the status a shell gives a program killed by SIGINT (``run`` handles SIGINT
    itself: a clean stop)."""
    try:
        return pipe_safe(lambda: _main(argv))
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C during clean-up stays quiet
        print("powerbudgetd: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED


# Options taking a number or a duration: ``--last -5m`` reaches argparse as an option
# ("expected one argument"); joined as ``--last=-5m`` the value's own check names it.
_VALUE_OPTIONS = ("--last", "--duration", "--budget", "--interval", "--timeout", "--seed")


def _join_negative_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if word in _VALUE_OPTIONS and len(nxt) > 1 and nxt[0] == "-" and (nxt[1].isdigit() or nxt[1] == "."):
            out.append(f"{word}={nxt}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def _main(argv: list[str] | None) -> int:
    try:  # argparse exits on --help and on usage errors: hand its status back as ours
        args = _parser().parse_args(_join_negative_values(sys.argv[1:] if argv is None else list(argv)))
        _validate(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else ExitStatus.CONFIG
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "probe":
        return _probe(args)
    if args.command == "check-config":
        return _check_config(args)
    if args.command == "log":
        return _log_report(args)
    if args.command == "status":
        from powerbudgetd.service.status import command as status_command

        return status_command(args)
    if args.command == "failsafe":
        from powerbudgetd.service.circuitcmd import failsafe_command

        return failsafe_command(args)
    if args.command == "circuit":
        from powerbudgetd.service.circuitcmd import circuit_command

        return circuit_command(args)
    if args.command == "restore":
        from powerbudgetd.service.restore import command as restore_command

        return restore_command(args)
    if args.command == "pod":
        from powerbudgetd.service.pod import command as pod_command

        return pod_command(args)
    return _run(args)


def _check_config(args: argparse.Namespace) -> int:
    from powerbudgetd.service.checkconfig import describe
    from powerbudgetd.config import default_config_path, load_config

    path = args.file or args.config_file or default_config_path()
    try:
        settings = load_config(path)
    except ConfigError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    tree = None
    if args.tree is not None:  # an argument, checked before any work (the report, the cards)
        from powerbudgetd.config.tree import load_tree

        try:
            tree, _ = load_tree(args.tree)
        except ConfigError as exc:
            print(f"powerbudgetd: {exc}", file=sys.stderr)
            return ExitStatus.CONFIG
        if settings.circuit is None:
            print(f"powerbudgetd: {path}: --tree needs [circuit]: its host names this host in the tree",
                  file=sys.stderr)
            return ExitStatus.CONFIG
    if args.backend is None:
        print(describe(settings, path))
    status = ExitStatus.OK if args.backend is None else _check_config_cards(args, settings, path)
    return _check_config_tree(args.tree, tree, settings) if tree is not None and status == ExitStatus.OK else status


def _check_config_tree(tree_file: Path, tree: PowerTree, settings: Settings) -> int:
    """check-config --tree: this host's place in the tree file (read and checked already)."""
    from powerbudgetd.service.checkconfig import tree_place

    lines, problems = tree_place(settings, tree)
    for line in lines:
        print(line)
    for problem in problems:
        print(f"powerbudgetd: {tree_file}: {problem}", file=sys.stderr)
    return ExitStatus.CONFIG if problems else ExitStatus.OK


def _check_config_cards(args: argparse.Namespace, settings: Settings, path: Path) -> int:
    """check-config --backend: read the cards and refuse what run would refuse."""
    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd.service.checkconfig import describe
    from powerbudgetd.hw.calls import DeadlineCalls
    from powerbudgetd.hw.nvmlscope import NvmlScope
    from powerbudgetd.service.feasibility import card_names, check_feasible, floors
    from powerbudgetd_sim.scenario import ScenarioError

    configure_logging(level="error", stream=sys.stderr)
    scenario = args.scenario or settings.sim.scenario
    try:
        nvml = make_nvml(args.backend, scenario, settings.sim.seed, settings.sim.lag_s)
        scope = NvmlScope(nvml)
        scope.open()
    except ScenarioError as exc:
        print(f"powerbudgetd: {'--scenario' if args.scenario else '[sim] scenario'}: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    except NvmlError as exc:
        print(_nvml_unavailable(exc, f"check-config {path} --backend sim"), file=sys.stderr)
        return ExitStatus.NVML
    source = f"the simulated bank {scenario!r}" if args.backend == "sim" else "NVML"
    try:
        calls = DeadlineCalls(settings.control.call_timeout_s)  # run's deadline: a hung card fails, as there
        names = card_names(nvml, calls)
        ctl = check_feasible(nvml, settings, calls)
        counted = floors(ctl)
    except BudgetInfeasible as exc:
        print(describe(settings, path, card_names=names, floors=None, verdict="budget infeasible"))
        print(f"powerbudgetd: budget_infeasible ({source}): {exc}", file=sys.stderr)
        return ExitStatus.INFEASIBLE
    except NvmlError as exc:
        print(f"powerbudgetd: NVML error reading the cards: {exc}", file=sys.stderr)
        return ExitStatus.NVML
    finally:
        scope.close()  # within its deadline: with a call abandoned on a hung card it may never return
    print(describe(settings, path, card_names=names, floors=counted, source=source))
    for text in ctl.override_warnings:
        print(f"warning: {text}")
    return ExitStatus.OK


def _simulate(args: argparse.Namespace) -> int:
    from powerbudgetd_sim.simulate import format_report, plot, plot_compare, run_policies, run_scenario
    from powerbudgetd_sim.scenario import ScenarioError, list_scenarios, load_scenario

    from powerbudgetd_sim.libnvml import on_sigint

    signal.signal(signal.SIGINT, on_sigint)  # never a KeyboardInterrupt inside a simulated NVML call
    # The controller's log lines are summarised in the report; stderr carries only
    # progress (on a terminal) unless --log-level asks for them.
    configure_logging(level=args.log_level or "off", stream=sys.stderr)
    if args.list:
        for name, desc in list_scenarios():
            print(f"{name:<20} {desc}")
        return ExitStatus.OK
    if args.suite:
        return _suite(args)
    if args.fidelity:
        return _fidelity(args)
    if args.sweep:
        return _sweep(args)
    if args.tree:
        return _tree_sim(args)
    if args.circuit is not None:
        return _circuit_sim(args)
    try:
        if args.replay:
            from powerbudgetd_sim.replay import load_replay

            # --budget goes in here: the replay's description says at what budget it ran
            sc = load_replay(args.replay, draw=args.replay_draw or "avg", budget_w=args.budget)
        else:
            sc = load_scenario(args.scenario or "workstation-4")
        if args.budget is not None:
            sc = dataclasses.replace(sc, budget_w=args.budget)
        _check_floors(sc)
    except ScenarioError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    except BudgetInfeasible as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.INFEASIBLE
    if args.policy == "all":
        from powerbudgetd_sim.scoreboard import check_targets, format_table

        results = run_policies(sc, duration_s=args.duration, seed=args.seed, keep_series=bool(args.plot))
        reports = {p: r.report for p, r in results.items()}
        if args.json:
            print(json.dumps(reports, indent=2))
        else:
            any_r = reports["powerbudgetd"]
            print(f"scenario {sc.name} (seed {any_r['seed']}): {len(any_r['cards'])} cards, budget {sc.budget_w:g} W, "
                  f"{any_r['duration_s']:g} s simulated")
            print(format_table(reports))
            for c in check_targets(sc, reports, args.duration):
                print(f"  [{_MARK[c.met]}] {c.target}: {c.detail}")
        if args.plot:  # after the report: a plot that fails at the end loses nothing else
            return _save_plot(plot_compare, results, sc.budget_w, args.plot, sc, quiet=args.json)
        return ExitStatus.OK
    result = run_scenario(
        sc, duration_s=args.duration, seed=args.seed, keep_series=bool(args.plot), policy=args.policy or "powerbudgetd"
    )
    if args.json:
        print(json.dumps(result.report, indent=2))
    else:
        if args.replay:  # what the log cannot tell (demand above a cap) is said here
            print(sc.description)
        print(format_report(result.report))
    if args.plot:
        return _save_plot(plot, result, sc.budget_w, args.plot, sc, quiet=args.json)
    return ExitStatus.OK


def _save_plot(draw: Any, result: Any, budget_w: float, path: str, sc: Scenario, quiet: bool) -> int:
    """Draw and save the plot (after the report is printed); one line on stderr and
    ExitStatus.ERROR when the file cannot be written after all (checked before the run,
    but a disk fills and a directory goes)."""
    sys.stdout.flush()
    try:
        draw(result, budget_w, path, f"{sc.name}: {sc.description}")
    except OSError as exc:
        print(f"powerbudgetd: --plot {path}: cannot write the plot: {exc.strerror or exc} "
              "(the report above is complete)", file=sys.stderr)
        return ExitStatus.ERROR
    if not quiet:
        print(f"plot written to {path}")
    return ExitStatus.OK


def _circuit_sim(args: argparse.Namespace) -> int:
    from powerbudgetd_sim.circuit import compare, format_compare
    from powerbudgetd_sim.scenario import ScenarioError

    hosts = [h.strip() for h in args.circuit.split(",") if h.strip()]
    if len(hosts) < 2:
        print("powerbudgetd: --circuit needs two hosts or more (A,B,...)", file=sys.stderr)
        return ExitStatus.CONFIG
    try:
        result = compare(hosts, duration_s=args.duration or 300.0)
    except (ScenarioError, ValueError, BudgetInfeasible) as exc:
        print(f"powerbudgetd: --circuit: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    print(json.dumps(result, indent=2) if args.json else format_compare(result))
    return ExitStatus.OK


def _tree_sim(args: argparse.Namespace) -> int:
    from powerbudgetd_sim.scenario import ScenarioError
    from powerbudgetd_sim.tree import compare, format_compare

    try:
        result = compare(args.tree, duration_s=args.duration or 120.0)
    except (ScenarioError, ConfigError, ValueError) as exc:
        print(f"powerbudgetd: --tree: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    print(json.dumps(result, indent=2) if args.json else format_compare(result))
    return ExitStatus.OK


def _sweep(args: argparse.Namespace) -> int:
    from powerbudgetd_sim.scenario import ScenarioError
    from powerbudgetd_sim.sweep import (BEYOND, DEFAULT_DURATION_S, WARMUP_S, format_sweep, inference_source, plot_sweep,
                                        sweep, training_source)

    duration = args.duration or DEFAULT_DURATION_S
    if duration <= WARMUP_S:
        print(f"powerbudgetd: --sweep: --duration {duration:g} s is not over the sweep's {WARMUP_S:g} s warm-up",
              file=sys.stderr)
        return ExitStatus.CONFIG
    progress = Progress(enabled=not args.json)
    try:
        seed = args.seed if args.seed is not None else 1
        sources = {"inference": inference_source, "training": training_source}
        source = sources[args.demand](seed, duration) if args.demand in sources else None
        result = sweep(args.tree, duration_s=duration, seed=seed, scenario_source=source, beyond=BEYOND,
                       on_step=lambda count, policy: progress.update(f"sweep: {count} hosts, {policy}"))
        if source is not None:
            result["demand"] = args.demand
    except (ScenarioError, ConfigError, ValueError) as exc:
        progress.done()
        print(f"powerbudgetd: --sweep: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    progress.done()
    print(json.dumps(result, indent=2) if args.json else format_sweep(result))
    if args.plot:
        sys.stdout.flush()
        try:
            plot_sweep(result, args.plot)
        except OSError as exc:
            print(f"powerbudgetd: --plot {args.plot}: cannot write the plot: {exc.strerror or exc} "
                  "(the report above is complete)", file=sys.stderr)
            return ExitStatus.ERROR
        if not args.json:
            print(f"plot written to {args.plot}")
    return ExitStatus.OK


def _check_floors(sc: Scenario) -> None:
    """Refuse a budget below the cards' minimum limits before simulating anything.
    Raises BudgetInfeasible naming each card's floor."""
    floors = [c.min_w for c in sc.cards]
    if sum(floors) > sc.budget_w:
        detail = ", ".join(f"GPU {i} {w:g} W" for i, w in enumerate(floors))
        raise BudgetInfeasible(
            f"budget {sc.budget_w:g} W is below the sum of the cards' minimum power limits, "
            f"{sum(floors):g} W ({detail}): no policy can hold it; give --budget {sum(floors):g} or more"
        )


_MARK = {True: "met    ", False: "NOT MET", None: "n/a    "}


def _suite(args: argparse.Namespace) -> int:
    from powerbudgetd_sim.scenario import list_scenarios
    from powerbudgetd_sim.scoreboard import (
        TARGETS,
        format_suite_footer,
        format_suite_head,
        format_suite_meter,
        format_suite_scenario,
        run_suite,
    )

    names = [n for n, _ in list_scenarios()]
    progress = Progress(enabled=not args.json)
    finished: dict[str, dict[str, Any]] = {}
    shown = 0
    if not args.json:
        print(format_suite_head(list(TARGETS)), flush=True)
    progress.update(f"suite: 0 of {len(names)} scenarios done")

    def on_scenario(name: str, scored: dict[str, Any]) -> None:
        # Text: each scenario's block as soon as it and every one before it are done.
        nonlocal shown
        finished[name] = scored
        while not args.json and shown < len(names) and names[shown] in finished:
            progress.done()
            print(format_suite_scenario(names[shown], finished[names[shown]]), flush=True)
            shown += 1
        if len(finished) < len(names):
            progress.update(f"suite: {len(finished)} of {len(names)} scenarios done (last: {name})")

    suite = run_suite(names, duration_s=args.duration, seed=args.seed, on_scenario=on_scenario)
    progress.done()
    if not args.json:
        print(format_suite_meter(suite), flush=True)
    print(json.dumps(suite, indent=2) if args.json else format_suite_footer(suite))
    # A miss fails the command, as --fidelity does: scripts and CI see it in the status.
    return ExitStatus.OK if suite["all_met"] else ExitStatus.ERROR


def _fidelity(args: argparse.Namespace) -> int:
    from powerbudgetd_sim.fidelity import SEED, fidelity, format_fidelity

    rep = fidelity(seed=SEED if args.seed is None else args.seed)
    print(json.dumps(rep, indent=2) if args.json else format_fidelity(rep))
    return 0 if rep["all_met"] else 1


def _probe(args: argparse.Namespace) -> int:
    from powerbudgetd.hw.nvml import Nvml
    from powerbudgetd.hw.probe import format_compare, format_probe, probe

    configure_logging(level="warning", stream=sys.stderr)
    from powerbudgetd.hw.nvmlscope import NvmlScope
    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd_sim.scenario import ScenarioError

    if args.preset and not args.compare_sim:
        print("powerbudgetd: --preset needs --compare-sim", file=sys.stderr)
        return ExitStatus.CONFIG
    scope: NvmlScope | None = None
    try:
        nvml = make_nvml(args.backend, scenario=args.scenario or "workstation-4")
        scope = NvmlScope(nvml)
        scope.open()
        if args.compare_sim:
            if not isinstance(nvml, Nvml):
                print("powerbudgetd: --compare-sim compares NVML's calls: give --backend nvml or a sim scenario "
                      "of NVIDIA cards only", file=sys.stderr)
                return ExitStatus.CONFIG
            result = {"backend": args.backend or "nvml", **_compare_sim(nvml, args.preset)}
        else:
            result = probe(nvml)
    except ScenarioError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    except NvmlError as exc:
        print(_nvml_unavailable(exc, "probe --compare-sim --backend sim" if args.compare_sim else "probe --backend sim"),
              file=sys.stderr)
        return ExitStatus.NVML
    finally:
        if scope is not None:
            scope.close()  # within its deadline: NVML is not needed past this point
    if args.compare_sim:
        print(json.dumps(result, indent=2) if args.json else format_compare(result))
    else:
        print(json.dumps(result, indent=2) if args.json else format_probe(result))
    return ExitStatus.OK


def _nvml_unavailable(exc: NvmlError, sim_command: str) -> str:
    """The lines every command prints when NVML cannot start: the error, what to do
    about it, and the same command on a simulated bank."""
    from powerbudgetd.hw.nvml import init_advice

    return (f"powerbudgetd: NVML unavailable: {exc}\n  {init_advice(exc.code)}\n"
            f"  no GPU here? `powerbudgetd {sim_command}` runs it on a simulated bank")


def _compare_sim(nvml: Nvml, preset: str | None) -> dict[str, Any]:
    from powerbudgetd_sim.compare import nearest_model, preset_bank

    from powerbudgetd.hw.probe import compare_sim

    def sim_for(cards: list[GpuInfo]) -> tuple[list[str], Nvml]:
        presets = [preset or nearest_model(c) for c in cards]
        return presets, preset_bank(presets)

    return compare_sim(nvml, sim_for)


def _log_report(args: argparse.Namespace) -> int:
    from powerbudgetd.config import RecorderConfig, load_config
    from powerbudgetd.powerlog.report import format_summary, summarize
    from powerbudgetd.powerlog.reader import LogError, scan_log

    try:
        settings = load_config(args.config) if args.config else None
    except ConfigError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    recorder = settings.recorder if settings else RecorderConfig()
    directory = args.dir or recorder.dir
    if not Path(directory).exists():  # a wrong path is an argument error, as for simulate --replay
        print(f"powerbudgetd: {directory}: no such file or directory{_log_dir_hint(args, recorder)}", file=sys.stderr)
        return ExitStatus.CONFIG
    try:
        result = summarize(scan_log(directory), args.last, settings.feed if settings else None, str(args.config))
    except (LogError, ValueError) as exc:
        hint = _log_dir_hint(args, recorder) if isinstance(exc, LogError) else ""
        print(f"powerbudgetd: {exc}{hint}", file=sys.stderr)
        return ExitStatus.ERROR
    print(json.dumps(result, indent=2) if args.json else format_summary(result))
    return ExitStatus.OK


def _log_dir_hint(args: argparse.Namespace, recorder: RecorderConfig) -> str:
    """Where else to look, not repeating what was given."""
    if args.dir is not None:
        return ""
    if args.config is not None:
        source = (f"that is {args.config}'s [recorder] dir" if "dir" in recorder.model_fields_set
                  else f"{args.config} sets no [recorder] dir: that is the default")
        return (f"\n  {source}; give --dir DIR (a copied recorder directory); simulated runs record under "
                f"{recorder.dir_for('sim')}")
    return ("\n  give --dir DIR (a copied recorder directory), or --config FILE to use its [recorder] dir;"
            " simulated runs record under " + str(recorder.dir_for("sim")))


def _run(args: argparse.Namespace) -> int:
    from powerbudgetd.service import signals

    # Held since the first instruction under the `powerbudgetd` command (__main__); here
    # for a caller of main(): SIGHUP and SIGTERM must not kill it before the daemon's
    # own handlers are in, nor after they are gone.
    held = signals.hold()
    try:
        return _run_held(args)
    finally:
        signals.restore(held)  # in a process started as `powerbudgetd run`: held again, as before


def _run_held(args: argparse.Namespace) -> int:
    from powerbudgetd.config import default_config_path, load_config
    from powerbudgetd.service.instance import InstanceLock, lock_path

    config_path = args.config or default_config_path()
    try:
        settings = load_config(config_path)
    except ConfigError as exc:
        configure_logging()
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    configure_logging(level=settings.log_level)
    import structlog

    for warning in settings.warnings:
        structlog.get_logger("powerbudgetd").warning("config_warning", detail=warning)
    # The instance lock comes before NVML is even loaded: no write (not even the
    # start-up permission probe) may happen while another daemon owns these cards.
    path = lock_path(args.backend, args.dry_run, settings.sim.state_file)
    lock = None
    if path is not None:
        try:
            lock = InstanceLock(path).acquire()
        except AlreadyRunning as exc:
            print(f"powerbudgetd: {exc}", file=sys.stderr)
            return ExitStatus.ALREADY_RUNNING
        except PermissionError as exc:
            if os.geteuid() == 0:
                print(f"powerbudgetd: cannot take the instance lock {path}: {exc.strerror or exc}", file=sys.stderr)
                return ExitStatus.ERROR
            # Not root: this process most likely cannot write limits either (the start-up
            # permission probe decides); say what is unguarded and go on.
            structlog.get_logger("powerbudgetd").warning(
                "instance_lock_unavailable", path=str(path), error=exc.strerror or str(exc),
                detail="not root: running without the single-instance lock",
            )
        except OSError as exc:
            print(f"powerbudgetd: cannot take the instance lock {path}: {exc.strerror or exc}", file=sys.stderr)
            return ExitStatus.ERROR
    try:
        return _run_locked(args, settings, config_path)
    finally:
        if lock is not None:
            lock.release()


def _run_locked(args: argparse.Namespace, settings: Settings, config_path: Path) -> int:
    from prometheus_client import CollectorRegistry

    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd.service.daemon import Daemon
    from powerbudgetd.service.feasibility import make_controller
    from powerbudgetd_sim.scenario import ScenarioError

    try:
        nvml = make_nvml(
            args.backend, settings.sim.scenario, settings.sim.seed, settings.sim.lag_s, settings.sim.state_file
        )
    except ScenarioError as exc:
        print(f"powerbudgetd: [sim] scenario: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    except NvmlError as exc:
        print(f"powerbudgetd: NVML unavailable: {exc}\n  no GPU here? --backend sim runs on a simulated bank",
              file=sys.stderr)
        return ExitStatus.NVML

    from powerbudgetd.hw.calls import DeadlineCalls

    def factory(n: CardBackend) -> Controller:
        timings = settings.control.timings()
        if not args.dry_run:  # before the first write: the limits `restore` gives back
            from powerbudgetd.service.originals import RECORD_CALL_TIMEOUT_S, originals_path, record_found_logged

            record_found_logged(n, originals_path(settings, args.backend),
                                DeadlineCalls(max(timings.call_timeout_s, RECORD_CALL_TIMEOUT_S)))
        # On the wall clock every NVML call runs with a deadline off the loop, and each
        # write is stamped when it is sent.
        return make_controller(
            n, settings, dry_run=args.dry_run, calls=DeadlineCalls(timings.call_timeout_s), clock=time.monotonic,
        )

    daemon = Daemon(nvml, factory, config_path=config_path, settings=settings)
    assert daemon.arbiter is not None  # built from settings
    feed = None if settings.feed is None else settings.feed.feed()
    recorder = None
    if settings.recorder.enabled:
        from powerbudgetd.powerlog.recorder import from_config

        recorder = from_config(settings.recorder, feed, backend=args.backend, nvml=nvml,
                               tick_s=settings.control.tick_s)
        daemon.register(recorder)
    registry = CollectorRegistry()  # what /metrics serves, MQTT's metrics included
    bridge = None
    guest = args.dry_run  # beside the service: none of its topics, seats or ports
    if guest and (settings.mqtt is not None or settings.circuit is not None):
        import structlog

        structlog.get_logger("powerbudgetd").info(
            "dry_run_guest", left_out=[s for s, c in (("mqtt", settings.mqtt), ("circuit", settings.circuit)) if c],
            detail="a dry run publishes nothing on the service's MQTT topics and takes no seat or grant on its "
            "circuit: it decides on the configured budget, the UPS and the recorder alone")
    if settings.mqtt is not None and not guest:  # aiomqtt is imported only when MQTT is configured
        from powerbudgetd.channels.mqtt.session import MqttBridge

        bridge = MqttBridge(settings.mqtt, daemon.arbiter, feed, registry=registry, energy_j=daemon.nvml.energy_j)
        daemon.register(bridge)
    ups = None
    if settings.ups is not None:  # aionut is imported only when a UPS is configured
        from powerbudgetd.channels.ups import UpsChannel

        ups = UpsChannel(settings.ups, daemon.arbiter, feed, registry=registry)
        daemon.register(ups)
        if recorder is not None:
            recorder.extras["ups"] = ups.record
        if bridge is not None:  # Home Assistant's UPS sensor and "on battery"
            bridge.attach_ups(ups.record)
            if settings.ups.measured_load and settings.feed is not None:  # other hosts behind it: announced, checked
                bridge.announce_meter(settings.ups.source_id(), settings.ups.reach(), "[ups]")
    meters: dict[str, Callable[[], Sample | None]] = {}  # what a tree node may name as its meter
    if settings.pdu is not None and feed is not None:  # pysnmp is imported only when a PDU is configured
        from powerbudgetd.channels.pdu import pdu_channel

        pdu = pdu_channel(settings.pdu, daemon.arbiter, feed, registry=registry)
        daemon.register(pdu)
        meters[settings.pdu.source_id()] = pdu.loop.sample
        if bridge is not None and not settings.pdu.outlets:  # an inlet other hosts may draw through
            bridge.announce_meter(settings.pdu.source_id(), settings.pdu.reach(), "[pdu]")
        if recorder is not None:
            recorder.extras["pdu"] = pdu.record
    if settings.bmc is not None and feed is not None:  # sushy is imported only when a BMC is configured
        from powerbudgetd.channels.bmc import bmc_channel

        bmc = bmc_channel(settings.bmc, daemon.arbiter, feed, registry=registry)
        daemon.register(bmc)
        meters[settings.bmc.source_id()] = bmc.loop.sample
        if recorder is not None:
            recorder.extras["bmc"] = bmc.record
    if settings.rapl is not None and settings.feed is not None:  # the host's own draw measured
        from powerbudgetd.channels.rapl import RaplChannel

        daemon.register(RaplChannel(settings.rapl, settings.feed, daemon.arbiter, registry=registry))
    if settings.circuit is not None and not guest:  # aetcd is imported only when a circuit is configured
        from powerbudgetd.channels.circuit.channel import CircuitChannel

        cc = settings.circuit
        circuit = CircuitChannel(
            cc, cc.host_power(settings.feed), daemon.arbiter, lower_s=cc.fence_lower_s(settings.control.timings()),
            registry=registry, clock=daemon.clock, on_fatal=daemon.request_exit,
        )
        daemon.register(circuit)
        daemon.circuit_status = circuit.status
        circuit.meter_sources.update(meters)  # a tree node may name this PDU or BMC as its meter ...
        if ups is not None and settings.ups is not None:  # ... or this UPS
            circuit.meter_sources[settings.ups.source_id()] = ups.guard.sample
        if bridge is not None and bridge.meter is not None and settings.mqtt is not None \
                and settings.mqtt.wall_meter is not None:  # ... or this wall meter
            circuit.meter_sources[settings.mqtt.wall_meter.source_id()] = bridge.meter.loop.sample
        if ups is not None and settings.ups is not None and settings.ups.feed is not None:
            ups_feed, ups_name = settings.ups.feed, f"{settings.ups.name}@{settings.ups.host}"
            ups.on_feed = lambda on_battery: circuit.ups_on_battery(ups_feed, ups_name, on_battery)
            circuit.marks_feed = True
        if recorder is not None:
            recorder.extras["circuit"] = lambda: circuit.status(daemon.clock()).fields()
    if settings.kubernetes is not None and not guest:  # in a pod: the node's startup taint and labels
        from powerbudgetd.channels.kubeapi import KubeApi, KubeError
        from powerbudgetd.channels.node import NodeGate

        try:
            daemon.register(NodeGate(settings.kubernetes, KubeApi.from_config(settings.kubernetes)))
        except KubeError as exc:
            print(f"powerbudgetd: [kubernetes]: {exc}", file=sys.stderr)
            return ExitStatus.CONFIG
    server = _serve_metrics(settings, daemon, registry, guest=guest)
    if bridge is not None and server is not None:  # Home Assistant's device page links to /metrics
        from powerbudgetd.channels.metrics import endpoint_url

        bridge.configuration_url = endpoint_url(str(settings.metrics.listen_address), server.server_port)
    try:
        return asyncio.run(daemon.run())
    finally:
        if server is not None:
            server.close()
        import structlog

        from powerbudgetd.service import signals

        if signals.take()[1] and not daemon.reload_ignored:  # SIGHUP after the daemon's handlers were gone
            structlog.get_logger("powerbudgetd").info("reload_ignored", reason="stopping")


def _serve_metrics(settings: Settings, daemon: Daemon, registry: CollectorRegistry,
                   guest: bool = False) -> MetricsServer | None:
    """Start /metrics before the daemon boots (so before READY=1). A port that cannot be
    bound is logged, not fatal: keeping the budget matters more than reporting on it.
    ``guest`` (a dry run): on a port the system picks, never the service's."""
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
        server = serve(metrics, str(cfg.listen_address), 0 if guest else cfg.port,
                       max_connections=cfg.max_connections, idle_timeout_s=cfg.idle_timeout_s,
                       request_timeout_s=cfg.request_timeout_s)
    except OSError as exc:
        log.error("metrics_unavailable", address=str(cfg.listen_address), port=cfg.port, error=str(exc))
        return None
    log.info("metrics_listening", address=str(cfg.listen_address), port=server.server_port,
             max_connections=server.max_connections, idle_timeout_s=cfg.idle_timeout_s,
             request_timeout_s=cfg.request_timeout_s)
    return server
