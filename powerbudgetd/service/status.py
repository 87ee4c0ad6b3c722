"""``powerbudgetd status``: the running daemon's bank at a glance, from its metrics.

The daemon already publishes everything an operator asks first on its Prometheus
endpoint (``[metrics]``, ``http://127.0.0.1:19400/metrics`` by default), so status reads
that: no second interface to keep in step, and it works from any host that may scrape.
Parsing is prometheus_client's own text parser.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import shutil
import sys
import tomllib
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from powerbudgetd.errors import ConfigError

if TYPE_CHECKING:
    from powerbudgetd.config import MetricsConfig

DEFAULT_URL = "http://127.0.0.1:19400/metrics"
STALE_TICK_S = 30.0  # the PowerBudgetdDown alert's threshold
EXIT_UNREACHABLE = 1


class StatusError(Exception):
    """The daemon could not be read; the message says where and what to check."""


@dataclass
class CardStatus:
    """One card as the daemon last saw it (W; None: unknown)."""

    index: int
    uuid: str
    name: str
    cap_w: float | None  # the enforced power limit
    limit_w: float | None  # the limit set (read back)
    min_w: float | None
    max_w: float | None
    draw_w: float | None  # 1 s average
    instant_w: float | None
    peak_w: float | None  # highest instant draw seen (this status session, or the daemon's peak series)
    role: str | None
    warnings: list[str] = field(default_factory=list)


@dataclass
class BankStatus:
    """The bank: budget (W) and where it comes from, sums, mode, cards, warnings."""

    url: str
    version: str | None
    budget_w: float | None
    budget_source: str
    sum_limits_w: float | None
    sum_draw_w: float | None
    headroom_w: float | None
    mode: str | None
    last_tick_age_s: float | None
    cards: list[CardStatus]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_url(config: Path | None) -> tuple[str, str]:
    """The metrics URL and where it came from: ``config``'s ``[metrics]`` when given or
    when the default config file can be read, else :data:`DEFAULT_URL`.
    Raises ConfigError for a ``--config`` that does not load."""
    from powerbudgetd.config import default_config_path, load_config

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
            return DEFAULT_URL, f"the default (no readable config at {path})"
        print(f"powerbudgetd: warning: {path} does not load ({str(exc).splitlines()[0]}); "
              "reading its [metrics] alone", file=sys.stderr)
        settings_metrics = metrics
    else:
        settings_metrics = settings.metrics
    m = settings_metrics
    if not m.enabled:
        return DEFAULT_URL, f"[metrics] is disabled in {path}: the daemon serves no metrics"
    addr = ipaddress.ip_address(str(m.listen_address))
    if addr.is_unspecified:  # listening everywhere: ask on loopback
        addr = ipaddress.ip_address("::1" if addr.version == 6 else "127.0.0.1")
    host = f"[{addr}]" if addr.version == 6 else str(addr)
    return f"http://{host}:{m.port}/metrics", f"[metrics] listen_address and port in {path}"


def _metrics_table(path: Path) -> MetricsConfig | None:
    """``[metrics]`` of a config file that does not load as a whole, or None."""
    from powerbudgetd.config import MetricsConfig

    try:
        with open(path, "rb") as fh:
            table = tomllib.load(fh).get("metrics", {})
        return MetricsConfig.model_validate(table)
    except (OSError, tomllib.TOMLDecodeError, ValueError):
        return None


def fetch(url: str, timeout_s: float) -> str:
    """The endpoint's text. Raises StatusError naming the URL and the cause."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - an operator's URL
            return resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise StatusError(f"{url} answered HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StatusError(f"cannot reach the daemon's metrics at {url}: {reason}") from None


def parse(text: str, url: str, now_s: float | None = None) -> BankStatus:
    """The bank from one scrape. Raises StatusError when the text is not powerbudgetd's."""
    now_s = time.time() if now_s is None else now_s
    bank: dict[str, float] = {}
    mode: str | None = None
    source: str | None = None
    version: str | None = None
    cards: dict[str, dict[str, Any]] = {}
    errors: dict[str, float] = {}
    reload_ok: float | None = None
    mqtt_seen = False
    meter_budget: float | None = None
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise StatusError(f"{url} does not answer in the Prometheus text format: {exc}") from None
    for fam in families:
        for s in fam.samples:
            name, labels, value = s.name, s.labels, s.value
            if name.startswith("powerbudgetd_mqtt") or name.startswith("powerbudgetd_wall"):
                mqtt_seen = True
            if name in ("powerbudgetd_budget_watts", "powerbudgetd_sum_power_limits_watts",
                        "powerbudgetd_sum_power_draw_watts", "powerbudgetd_headroom_watts",
                        "powerbudgetd_last_tick_timestamp_seconds"):
                bank[name] = value
            elif name == "powerbudgetd_wall_meter_budget_watts":
                meter_budget = value
            elif name == "powerbudgetd_mode" and value == 1:
                mode = labels.get("mode")
            elif name == "powerbudgetd_budget_source" and value == 1:
                source = labels.get("source")
            elif name == "powerbudgetd_build_info":
                version = labels.get("version")
            elif name == "powerbudgetd_config_last_reload_success":
                reload_ok = value
            elif name == "powerbudgetd_nvml_errors_total":
                errors[labels.get("UUID", "")] = errors.get(labels.get("UUID", ""), 0.0) + value
            elif name.startswith("powerbudgetd_gpu_") and "UUID" in labels:
                c = cards.setdefault(labels["UUID"], {"index": int(labels.get("gpu", -1)),
                                                      "name": labels.get("modelName", "")})
                if name == "powerbudgetd_gpu_role":
                    if value == 1:
                        c["role"] = labels.get("role")
                else:
                    c[name] = value
    if "powerbudgetd_budget_watts" not in bank and version is None:
        raise StatusError(f"{url} answers, but not with powerbudgetd's metrics (another exporter on that port?)")
    out = BankStatus(
        url=url, version=version, budget_w=bank.get("powerbudgetd_budget_watts"),
        budget_source=source or _guess_source(mqtt_seen, meter_budget, bank.get("powerbudgetd_budget_watts")),
        sum_limits_w=bank.get("powerbudgetd_sum_power_limits_watts"),
        sum_draw_w=bank.get("powerbudgetd_sum_power_draw_watts"),
        headroom_w=bank.get("powerbudgetd_headroom_watts"), mode=mode,
        last_tick_age_s=(now_s - bank["powerbudgetd_last_tick_timestamp_seconds"])
        if "powerbudgetd_last_tick_timestamp_seconds" in bank else None,
        cards=[],
    )
    for uuid, c in sorted(cards.items(), key=lambda kv: kv[1]["index"]):
        peak = c.get("powerbudgetd_gpu_power_draw_peak_watts", c.get("powerbudgetd_gpu_power_draw_instant_watts"))
        card = CardStatus(
            index=c["index"], uuid=uuid, name=c["name"],
            cap_w=c.get("powerbudgetd_gpu_enforced_power_limit_watts"),
            limit_w=c.get("powerbudgetd_gpu_power_limit_watts"),
            min_w=c.get("powerbudgetd_gpu_power_limit_min_watts"),
            max_w=c.get("powerbudgetd_gpu_power_limit_max_watts"),
            draw_w=c.get("powerbudgetd_gpu_power_draw_watts"),
            instant_w=c.get("powerbudgetd_gpu_power_draw_instant_watts"),
            peak_w=peak, role=c.get("role"),
        )
        card.warnings = _card_warnings(card, c, errors.get(uuid, 0.0))
        out.cards.append(card)
    out.warnings = _bank_warnings(out, reload_ok)
    return out


def _guess_source(mqtt_seen: bool, meter_budget: float | None, budget: float | None) -> str:
    # Until the daemon exports its budget's source, infer what can be inferred.
    if not mqtt_seen:
        return "config"
    if meter_budget is not None and budget is not None and abs(meter_budget - budget) < 0.5:
        return "wall_meter"
    return "config or remote (not exported by this daemon)"


def _card_warnings(card: CardStatus, raw: dict[str, Any], nvml_errors: float) -> list[str]:
    w = []
    if card.role == "lost":
        w.append("unreadable: counted at the highest limit it may come back with")
    if card.role == "fixed":
        w.append("fixed: a write was refused or not confirmed")
    contested = raw.get("powerbudgetd_gpu_contested_power_limit_watts")
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
        w.append("dry-run: decisions are logged, no limit is written")
    if b.budget_w is None:
        w.append("no tick yet: the daemon is still starting")
    elif b.sum_limits_w is not None and b.sum_limits_w > b.budget_w + 0.5 and b.mode not in ("booting", None):
        w.append(f"sum of limits {b.sum_limits_w:.0f} W is above the budget {b.budget_w:.0f} W")
    if b.last_tick_age_s is not None and b.last_tick_age_s > STALE_TICK_S:
        w.append(f"the control loop last ticked {b.last_tick_age_s:.0f} s ago")
    if reload_ok == 0:
        w.append("the last config reload failed: the previous config is in force (see the log)")
    return w


def _w(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def format_status(b: BankStatus, bars: bool = False, width: int = 100) -> str:
    """The bank for people; ``bars``: a bar per card, draw against cap against max."""
    lines = [
        f"powerbudgetd {b.version or '?'} at {b.url}",
        f"budget {_w(b.budget_w)} W ({b.budget_source}), sum of caps {_w(b.sum_limits_w)} W, "
        f"headroom {_w(b.headroom_w)} W, draw {_w(b.sum_draw_w)} W, mode {b.mode or '?'}",
    ]
    lines += [f"  warning: {w}" for w in b.warnings]
    lines.append(f"  {'gpu':>3}  {'name':<22} {'cap W':>6} {'draw W':>7} {'peak W':>7}  {'role':<10} warnings")
    bar_w = max(10, min(50, width - 50))
    for c in b.cards:
        lines.append(
            f"  {c.index:>3}  {c.name[:22]:<22} {_w(c.cap_w):>6} {_w(c.draw_w):>7} {_w(c.peak_w):>7}  "
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
    tty = sys.stdout.isatty()
    peaks: dict[str, float] = {}
    try:
        while True:
            try:
                status = parse(fetch(url, timeout_s), url)
                for c in status.cards:  # the highest instant draw seen while watching
                    if c.peak_w is not None:
                        peaks[c.uuid] = max(peaks.get(c.uuid, 0.0), c.peak_w)
                    c.peak_w = peaks.get(c.uuid, c.peak_w)
                text = format_status(status, bars=True, width=shutil.get_terminal_size().columns)
            except StatusError as exc:
                text = _unreachable(exc, origin) + "\n  (retrying)"
            stamp = time.strftime("%H:%M:%S")
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J")
            sys.stdout.write(f"{text}\n  {stamp}, every {interval_s:g} s; peak = highest seen while watching; "
                             "Ctrl-C to stop\n" + ("" if tty else "\n"))
            sys.stdout.flush()
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0
