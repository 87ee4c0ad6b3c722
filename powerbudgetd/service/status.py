"""``powerbudgetd status``: the running daemon's bank at a glance, from its metrics.

The daemon already publishes everything an operator asks first on its Prometheus
endpoint (``[metrics]``, on loopback at the default port unless configured), so status reads
that: no second interface to keep in step, and it works from any host that may scrape.
Parsing is prometheus_client's own text parser.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import shutil
import sys
import tomllib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from powerbudgetd.channels import metricnames as n
from powerbudgetd.errors import ConfigError
from powerbudgetd.service import scrape
from powerbudgetd.service.instance import LOCK_NAME, runtime_dir
from powerbudgetd.service.output import printable

if TYPE_CHECKING:
    from powerbudgetd.config import MetricsConfig

STALE_TICK_S = 30.0  # the PowerBudgetdDown alert's threshold
EXIT_UNREACHABLE = 1


class StatusError(Exception):
    """The daemon could not be read; the message says where and what to check."""


@dataclass
class CardStatus:
    """One card as the daemon last saw it (W; None: unknown)."""

    index: int | None  # None: the daemon's gpu label is not an index
    uuid: str
    name: str
    cap_w: float | None  # the enforced power limit
    limit_w: float | None  # the limit set (read back)
    min_w: float | None
    max_w: float | None
    draw_w: float | None  # 1 s average
    instant_w: float | None
    peak_w: float | None  # highest 100 ms instant draw over the daemon's peak window
    role: str | None
    warnings: list[str] = field(default_factory=list)


@dataclass
class UpsStatus:
    """The UPS as the daemon last read it: ``ups.status`` flags set, load and charge
    (0-1), runtime (s), the board budget it allows (W) and why it lowers it, if it does."""

    flags: list[str]
    load_ratio: float | None
    runtime_s: float | None
    charge_ratio: float | None
    budget_w: float | None
    limiting: str | None


@dataclass
class CircuitSeat:
    """This host on a shared circuit (wall W): the circuit's budget, this host's reserve
    and grant, whether its seat fits and etcd answers."""

    budget_w: float | None
    reserve_w: float | None
    grant_w: float | None
    seat_fits: bool
    etcd_reachable: bool


@dataclass
class BankStatus:
    """The bank: the budget in force (W) and the source the arbiter chose it from, the
    configured budget, sums, floor, mode, UPS and circuit where configured, cards,
    warnings. ``caps_in_force_w``: the sum of caps the cards hold (a dry run's cards keep
    their own; ``sum_limits_w`` is then what it would set); ``headroom_w``: the budget
    less the caps in force."""

    url: str
    version: str | None
    budget_w: float | None
    budget_source: str
    configured_w: float | None
    sum_limits_w: float | None
    sum_draw_w: float | None
    headroom_w: float | None
    floor_w: float | None
    held_at_floors: bool
    mode: str | None
    last_tick_age_s: float | None
    cards: list[CardStatus]
    caps_in_force_w: float | None = None
    ups: UpsStatus | None = None
    circuit: CircuitSeat | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_url(config: Path | None) -> tuple[str, str]:
    """The metrics URL and where it came from: ``config``'s ``[metrics]`` when given or
    when the default config file can be read, else ``[metrics]``'s defaults.
    Raises ConfigError for a ``--config`` that does not load."""
    from powerbudgetd.config import MetricsConfig, default_config_path, load_config

    default = _url_of(MetricsConfig())
    path = config or default_config_path()
    try:
        settings = load_config(path, euid=-1)  # only reading: not the daemon's root check
    except ConfigError as exc:
        # A file broken since the daemon loaded it must not hide the running daemon:
        # its [metrics] alone (it keeps the config it had), else the default.
        metrics = _metrics_table(path)
        if metrics is None:
            if config is not None:
                raise
            return default, f"the default (no readable config at {path})"
        print(f"powerbudgetd: warning: {path} does not load ({str(exc).splitlines()[0]}); "
              "reading its [metrics] alone", file=sys.stderr)
        settings_metrics = metrics
    else:
        settings_metrics = settings.metrics
    m = settings_metrics
    if not m.enabled:
        return default, f"[metrics] is disabled in {path}: the daemon serves no metrics"
    return _url_of(m), f"[metrics] listen_address and port in {path}"


def _url_of(m: MetricsConfig) -> str:
    """The URL where ``m``'s endpoint answers this host."""
    addr = ipaddress.ip_address(str(m.listen_address))
    if addr.is_unspecified:  # listening everywhere: ask on loopback
        addr = ipaddress.ip_address("::1" if addr.version == 6 else "127.0.0.1")
    host = f"[{addr}]" if addr.version == 6 else str(addr)
    return f"http://{host}:{m.port}/metrics"


def _metrics_table(path: Path) -> MetricsConfig | None:
    """``[metrics]`` of a config file that does not load as a whole, or None. Keys
    ``[metrics]`` does not know are left aside: the address is what matters here."""
    from powerbudgetd.config import MetricsConfig

    try:
        with open(path, "rb") as fh:
            table = tomllib.load(fh).get("metrics", {})
        if not isinstance(table, dict):
            return None
        return MetricsConfig.model_validate({k: v for k, v in table.items() if k in MetricsConfig.model_fields})
    except (OSError, tomllib.TOMLDecodeError, ValueError, RecursionError):
        return None


def fetch(url: str, timeout_s: float, euid: int | None = None) -> str:
    """The endpoint's text, read within ``timeout_s`` (s, the whole exchange) and a byte
    cap (see ``service.scrape``). As root (``euid`` 0; default: this process's), a local
    listener is read only when it is the daemon's. Raises StatusError naming the URL."""
    euid = os.geteuid() if euid is None else euid
    try:
        target = scrape.Target.parse(url)
        if euid == 0 and scrape.is_local(target.host):
            ok, why = scrape.listener_trusted(target.port, runtime_dir() / LOCK_NAME)
            if not ok and why.startswith("nothing listens"):
                raise StatusError(f"cannot reach the daemon's metrics at {printable(url)}: {why}")
            if not ok:
                raise StatusError(f"not reading {printable(url)} as root: {why}. Any local user can listen on a "
                                  "free port; start the daemon, or run status as an unprivileged user")
        return scrape.get(url, timeout_s)
    except scrape.ScrapeError as exc:
        raise StatusError(str(exc)) from None


def _card_index(text: str) -> int | None:
    """A ``gpu`` label as an index; None for anything but a few ASCII digits ("1.5",
    "-1", "²", a 20-digit number)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 6 else None


def parse(text: str, url: str, now_s: float | None = None) -> BankStatus:
    """The bank from one scrape. Raises StatusError when the text is not powerbudgetd's.
    Reads only the names declared in ``channels.metricnames``; every label value comes
    from outside and is shown through ``printable``."""
    now_s = time.time() if now_s is None else now_s
    single: dict[str, float] = {}
    mode: str | None = None
    source: str | None = None
    version: str | None = None
    cards: dict[str, dict[str, Any]] = {}
    errors: dict[str, float] = {}
    ups_flags: list[str] = []
    ups_reason: str | None = None
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise StatusError(f"{printable(url)} does not answer in the Prometheus text format: "
                          f"{printable(str(exc)[:200])}") from None
    for fam in families:
        for s in fam.samples:
            name, labels, value = s.name, s.labels, s.value
            if name in _SINGLE:
                single[name] = value
            elif name == n.MODE.sample and value == 1:
                mode = printable(labels.get("mode", "?"))
            elif name == n.BUDGET_SOURCE_IN_FORCE.sample and value == 1:
                source = printable(labels.get("source", "?"))
            elif name == n.BUILD.sample:
                version = printable(labels.get("version", "?"))
            elif name == n.UPS_STATUS.sample and value == 1:
                ups_flags.append(printable(labels.get("flag", "?")))
            elif name == n.UPS_BUDGET_REASON.sample and value == 1:
                ups_reason = printable(labels.get("reason", "?"))
            elif name == n.NVML_ERRORS.sample:
                errors[labels.get("UUID", "")] = errors.get(labels.get("UUID", ""), 0.0) + value
            elif name in _CARD and "UUID" in labels:
                c = cards.setdefault(labels["UUID"], {"index": _card_index(labels.get("gpu", "")),
                                                      "name": printable(labels.get("modelName", ""))})
                if name == n.GPU_ROLE.sample:
                    if value == 1:
                        c["role"] = printable(labels.get("role", "?"))
                else:
                    c[name] = value
    if n.BUDGET.sample not in single and version is None:
        raise StatusError(f"{printable(url)} answers, but not with powerbudgetd's metrics "
                          "(another exporter on that port?)")

    def get(spec: n.MetricSpec) -> float | None:
        v = single.get(spec.sample)
        return None if v is None or math.isnan(v) else v

    out = BankStatus(
        url=printable(url), version=version, budget_w=get(n.BUDGET),
        budget_source=source or "?", configured_w=None,
        sum_limits_w=get(n.SUM_LIMITS), sum_draw_w=get(n.SUM_DRAW), headroom_w=get(n.HEADROOM),
        floor_w=get(n.FLOOR), held_at_floors=get(n.HELD_AT_FLOORS) == 1, mode=mode,
        last_tick_age_s=(now_s - single[n.LAST_TICK.sample]) if n.LAST_TICK.sample in single else None,
        cards=[],
    )
    for fam in families:  # the configured budget, when another source holds a lower one
        for s in fam.samples:
            if s.name == n.BUDGET_SOURCE_WATTS.sample and s.labels.get("source") == "config":
                out.configured_w = s.value
    if n.UPS_DATA_STATE.sample in {f.name for f in families}:
        out.ups = UpsStatus(
            flags=ups_flags, load_ratio=get(n.UPS_LOAD), runtime_s=get(n.UPS_RUNTIME), charge_ratio=get(n.UPS_CHARGE),
            budget_w=get(n.UPS_BUDGET), limiting=ups_reason,
        )
    if get(n.CIRCUIT_RESERVE) is not None:
        out.circuit = CircuitSeat(
            budget_w=get(n.CIRCUIT_BUDGET), reserve_w=get(n.CIRCUIT_RESERVE), grant_w=get(n.CIRCUIT_GRANT),
            seat_fits=get(n.CIRCUIT_SEAT_FITS) == 1, etcd_reachable=get(n.CIRCUIT_ETCD_REACHABLE) == 1,
        )
    for uuid, c in sorted(cards.items(), key=lambda kv: (kv[1]["index"] is None, kv[1]["index"] or 0)):
        card = CardStatus(
            index=c["index"], uuid=printable(uuid), name=c["name"],
            cap_w=c.get(n.GPU_ENFORCED.sample), limit_w=c.get(n.GPU_LIMIT.sample),
            min_w=c.get(n.GPU_LIMIT_MIN.sample), max_w=c.get(n.GPU_LIMIT_MAX.sample),
            draw_w=c.get(n.GPU_DRAW.sample), instant_w=c.get(n.GPU_DRAW_INSTANT.sample),
            peak_w=c.get(n.GPU_DRAW_PEAK.sample), role=c.get("role"),
        )
        card.warnings = _card_warnings(card, c, errors.get(uuid, 0.0))
        out.cards.append(card)
    if out.mode == "dry-run":  # nothing is written: the caps in force are the cards' own
        caps = [c.cap_w for c in out.cards]
        out.caps_in_force_w = None if None in caps else sum(c or 0.0 for c in caps)
        if out.caps_in_force_w is not None and out.budget_w is not None:  # the bank's, as the text says
            out.headroom_w = out.budget_w - out.caps_in_force_w
    else:
        out.caps_in_force_w = out.sum_limits_w
    out.warnings = _bank_warnings(out, get(n.RELOAD_SUCCESS))
    return out


_SINGLE = {spec.sample for spec in (
    n.BUDGET, n.SUM_LIMITS, n.SUM_DRAW, n.HEADROOM, n.FLOOR, n.HELD_AT_FLOORS, n.LAST_TICK, n.RELOAD_SUCCESS,
    n.UPS_LOAD, n.UPS_RUNTIME, n.UPS_CHARGE, n.UPS_BUDGET,
    n.CIRCUIT_BUDGET, n.CIRCUIT_RESERVE, n.CIRCUIT_GRANT, n.CIRCUIT_SEAT_FITS, n.CIRCUIT_ETCD_REACHABLE,
)}
_CARD = {spec.sample for spec in (
    n.GPU_ENFORCED, n.GPU_LIMIT, n.GPU_LIMIT_MIN, n.GPU_LIMIT_MAX, n.GPU_DRAW, n.GPU_DRAW_INSTANT, n.GPU_DRAW_PEAK,
    n.GPU_CONTESTED, n.GPU_ROLE,
)}
READS = (*_SINGLE, *_CARD, n.MODE.sample, n.BUDGET_SOURCE_IN_FORCE.sample, n.BUDGET_SOURCE_WATTS.sample,
         n.BUILD.sample, n.UPS_STATUS.sample, n.UPS_BUDGET_REASON.sample, n.UPS_DATA_STATE.sample, n.NVML_ERRORS.sample)
"""Every sample name status reads (the metrics contract's test checks each is declared and served)."""


def _card_warnings(card: CardStatus, raw: dict[str, Any], nvml_errors: float) -> list[str]:
    w = []
    if card.role == "lost":
        w.append("unreadable: counted at the highest limit it may come back with")
    if card.role == "fixed":
        w.append("fixed: a write was refused or not confirmed")
    contested = raw.get(n.GPU_CONTESTED.sample)
    if contested is not None:
        w.append(f"contested: another tool keeps writing {contested:.0f} W")
    if card.cap_w is not None and card.limit_w is not None and abs(card.cap_w - card.limit_w) > 1:
        w.append(f"enforced {card.cap_w:.0f} W differs from the {card.limit_w:.0f} W set (another limiter)")
    if card.draw_w is None and card.role != "lost":
        w.append("draw unknown")
    if nvml_errors:
        w.append(f"{nvml_errors:.0f} NVML error(s) since start")
    return w


def _bank_warnings(b: BankStatus, reload_ok: float | None) -> list[str]:
    w = []
    if b.mode == "failsafe":
        w.append("failsafe: every card held at fair share after an NVML fault")
    elif b.mode == "monitor-only":
        w.append("monitor-only: no permission to write limits, the budget is NOT enforced")
    elif b.mode == "dry-run":
        w.append(f"dry-run: no limit is written; the cards hold {_w(b.caps_in_force_w)} W of caps, "
                 f"the daemon would set {_w(b.sum_limits_w)} W")
    if b.held_at_floors:
        w.append(f"held at floors: the {b.budget_source} budget is below the cards' minimum limits "
                 f"({_w(b.floor_w)} W); every card is at its minimum")
    if b.budget_w is None:
        w.append("no tick yet: the daemon is still starting")
    elif (b.mode != "dry-run" and b.sum_limits_w is not None and b.sum_limits_w > b.budget_w + 0.5
          and b.mode not in ("booting", None)):
        w.append(f"sum of limits {b.sum_limits_w:.0f} W is above the budget {b.budget_w:.0f} W")
    if b.last_tick_age_s is not None and b.last_tick_age_s > STALE_TICK_S:
        w.append(f"the control loop last ticked {b.last_tick_age_s:.0f} s ago")
    if reload_ok == 0:
        w.append("the last config reload failed: see reload_failed in the log for what is in force")
    return w


def _w(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def format_status(b: BankStatus, bars: bool = False, width: int = 100) -> str:
    """The bank for people; ``bars``: a bar per card, draw against cap against max."""
    caps, headroom = b.caps_in_force_w, b.headroom_w
    configured = (f", configured {_w(b.configured_w)} W" if b.configured_w is not None and b.budget_w is not None
                  and abs(b.configured_w - b.budget_w) > 0.5 else "")
    lines = [
        f"powerbudgetd {b.version or '?'} at {b.url}",
        f"budget {_w(b.budget_w)} W (source: {b.budget_source}{configured}), sum of caps {_w(caps)} W, "
        f"headroom {_w(headroom)} W, draw {_w(b.sum_draw_w)} W, mode {b.mode or '?'}",
    ]
    if b.ups is not None:
        u = b.ups
        state = "on battery" if "OB" in u.flags else "on line" if "OL" in u.flags else "state unknown"
        flags = " ".join(u.flags) or "-"
        load = "-" if u.load_ratio is None else f"{u.load_ratio * 100:.0f} %"
        runtime = "-" if u.runtime_s is None else f"{u.runtime_s:.0f} s"
        charge = "-" if u.charge_ratio is None else f"{u.charge_ratio * 100:.0f} %"
        limit = f", lowers the budget to {_w(u.budget_w)} W ({u.limiting})" if u.limiting else ""
        lines.append(f"ups {state} ({flags}), load {load}, battery {charge}, runtime {runtime}{limit}")
    if b.circuit is not None:
        cs = b.circuit
        lines.append(f"circuit budget {_w(cs.budget_w)} W, seat (reserve) {_w(cs.reserve_w)} W"
                     f"{'' if cs.seat_fits else ' NOT SEATED'}, grant {_w(cs.grant_w)} W (wall), "
                     f"etcd {'reachable' if cs.etcd_reachable else 'UNREACHABLE'}")
    lines += [f"  warning: {w}" for w in b.warnings]
    lines.append(f"  {'gpu':>3}  {'name':<22} {'cap W':>6} {'draw W':>7} {'peak W':>7}  {'role':<10} warnings"
                 f"  (peak: highest 100 ms reading over {n.PEAK_WINDOW_S:.0f} s)")
    bar_w = max(10, min(50, width - 50))
    for c in b.cards:
        lines.append(
            f"  {'?' if c.index is None else c.index:>3}  {c.name[:22]:<22} {_w(c.cap_w):>6} {_w(c.draw_w):>7} {_w(c.peak_w):>7}  "
            f"{(c.role or '?'):<10} {'; '.join(c.warnings)}"
        )
        if bars:
            lines.append(f"       {bar(c, bar_w)}")
    return "\n".join(lines)


def bar(c: CardStatus, width: int) -> str:
    """``[####----|....]``: draw (#) and the cap (|) on a scale of the card's max (W)."""
    top = c.max_w or c.cap_w or c.draw_w or 1.0
    cells = ["."] * width
    draw = min(width, int(round((c.draw_w or 0.0) / top * width)))
    for i in range(draw):
        cells[i] = "#"
    if c.cap_w is not None:
        cells[min(width - 1, max(0, int(round(c.cap_w / top * width)) - 1))] = "|"
    return "[" + "".join(cells) + f"] 0-{_w(top)} W"


def command(args: argparse.Namespace) -> int:
    """``powerbudgetd status``: exit 0 with the bank, 1 when the daemon cannot be read,
    2 for a ``--config`` that does not load."""
    try:
        url, origin = (args.url, "--url") if args.url else default_url(args.config)
    except ConfigError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return 2
    if args.watch:
        return _watch(url, origin, args.interval or 2.0, args.timeout)
    try:
        status = parse(fetch(url, args.timeout), url)
    except StatusError as exc:
        print(_unreachable(exc, origin), file=sys.stderr)
        return EXIT_UNREACHABLE
    print(json.dumps(status.to_dict(), indent=2) if args.json else format_status(status))
    return 0


def _unreachable(exc: StatusError, origin: str) -> str:
    return (
        f"powerbudgetd: {exc}\n"
        f"  the URL comes from {origin}; give another with --url, or --config FILE\n"
        "  is the daemon running? `systemctl status powerbudgetd`; is [metrics] enabled?"
    )


def _watch(url: str, origin: str, interval_s: float, timeout_s: float) -> int:
    """Redraw every ``interval_s`` until Ctrl-C, which ``cli.main`` turns into one line
    and exit 130."""
    tty = sys.stdout.isatty()
    while True:
        try:
            status = parse(fetch(url, timeout_s), url)
            text = format_status(status, bars=True, width=shutil.get_terminal_size().columns)
        except StatusError as exc:
            text = _unreachable(exc, origin) + "\n  (retrying)"
        stamp = time.strftime("%H:%M:%S")
        if tty:
            sys.stdout.write("\x1b[H\x1b[2J")
        sys.stdout.write(f"{text}\n  {stamp}, every {interval_s:g} s; Ctrl-C to stop\n" + ("" if tty else "\n"))
        sys.stdout.flush()
        time.sleep(interval_s)
