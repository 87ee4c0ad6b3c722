"""The metrics contract: every series ``/metrics`` serves, declared once.

Each :class:`MetricSpec` names one metric (``powerbudgetd_`` prefix, base units W, J,
s, ratios 0-1), its type, its help text and its label names. The exporters
(:mod:`~powerbudgetd.channels.metrics`, the UPS, MQTT and circuit channels) build their
metrics from these specs and nothing else; every reader (``powerbudgetd status``, the
alert rules and the Grafana dashboard under ``config/``) uses only the names declared
here, which a test checks against a running daemon's scrape.

Per-card series are labelled :data:`CARD_LABELS` (``gpu`` index, ``UUID``,
``modelName``), spelled as dcgm-exporter spells them so a dashboard can join our caps
with its draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

CARD_LABELS = ("gpu", "UUID", "modelName")  # dcgm-exporter's spelling
PEAK_WINDOW_S = 60.0  # the window of the per-card peak: the highest 100 ms reading in it

Kind = Literal["gauge", "counter", "histogram", "info"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric: ``name`` as declared (a counter's without ``_total``), ``kind``,
    ``doc`` (its HELP), ``labels`` (label names) and ``unit`` (the name's unit suffix,
    OpenMetrics' UNIT; "" for none)."""

    name: str
    kind: Kind
    doc: str
    labels: tuple[str, ...] = ()
    unit: str = ""

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names a scrape carries for it in Prometheus' text format (a
        counter's ``_total``; a histogram's ``_bucket``, ``_sum``, ``_count``; an info's
        ``_info``)."""
        return {
            "gauge": (self.name,),
            "counter": (self.name + "_total",),
            "histogram": (self.name + "_bucket", self.name + "_sum", self.name + "_count"),
            "info": (self.name + "_info",),
        }[self.kind]

    @property
    def sample(self) -> str:
        """The one sample name a reader of a gauge, a counter or an info uses."""
        return self.series[0]


_ALL: list[MetricSpec] = []


def _declare(name: str, kind: Kind, doc: str, labels: Sequence[str] = (), unit: str = "") -> MetricSpec:
    spec = MetricSpec("powerbudgetd_" + name, kind, doc, tuple(labels), unit)
    _ALL.append(spec)
    return spec


# -- the process and the control loop --------------------------------------------------
BUILD = _declare("build", "info", "powerbudgetd build", ("version", "python_version"))  # labels: its keys
TICK_DURATION = _declare(
    "tick_duration_seconds", "histogram",
    "Wall time of one control tick (reads, decisions, writes), start to the metrics listener",
)
GPU_INFO = _declare(
    "gpu_info", "gauge",
    "1 for each card of the bank, labelled with its vendor (nvidia, amd, intel) and the backend that reaches it "
    "(nvml, hwmon)",
    ("gpu", "UUID", "modelName", "vendor", "backend"),
)
LAST_TICK = _declare(
    "last_tick_timestamp_seconds", "gauge", "Unix time at which the last control tick completed"
)
RELOAD_SUCCESS = _declare(
    "config_last_reload_success", "gauge",
    "1 if the last configuration load succeeded, 0 if it was refused (reload_failed in the log says what is in force)",
)
RELOAD_TIMESTAMP = _declare(
    "config_last_reload_timestamp_seconds", "gauge", "Unix time of the last configuration load, successful or not"
)
LIMIT_CHANGES = _declare(
    "gpu_limit_changes", "counter",
    "Power limit writes that NVML accepted, by reason (boot, lend, reclaim, release, fail_static, shutdown, ...)",
    (*CARD_LABELS, "reason"),
)
NVML_ERRORS = _declare(
    "nvml_errors", "counter",
    "NVML calls that failed, by kind (reads each tick, limit writes, energy reads at scrape time)",
    (*CARD_LABELS, "kind"),
)

# -- the bank ----------------------------------------------------------------------------
BUDGET = _declare("budget_watts", "gauge", "The bank's board-power budget in force", unit="watts")
SUM_LIMITS = _declare(
    "sum_power_limits_watts", "gauge",
    "Sum over cards of the highest power limit that may be in force (requested, enforced or in flight); "
    "stays <= the budget once booted",
    unit="watts",
)
SUM_DRAW = _declare(
    "sum_power_draw_watts", "gauge",
    "Sum of the cards' 1 s average board power (absent while a card is unreadable)", unit="watts",
)
HEADROOM = _declare("headroom_watts", "gauge", "Budget minus the sum of power limits", unit="watts")
FLOOR = _declare(
    "floor_watts", "gauge",
    "The lowest budget the bank can be held to (controllable cards at their minimum limits)", unit="watts",
)
HELD_AT_FLOORS = _declare(
    "held_at_floors", "gauge",
    "1 while a budget source asks for less than the floor: every controllable card is held at its minimum",
)
OVER_BUDGET = _declare(
    "over_budget", "gauge",
    "1 while the sum of power limits that may be in force is above the budget (any cause: boot's descent, "
    "a limit held or raised elsewhere, a card that appeared); corrected by decreases only",
)
OVER_BUDGET_EPISODES = _declare(
    "over_budget_episodes", "counter",
    "Episodes of the bank over budget since start (one over_budget log line each, with the cause)",
)
OVER_BUDGET_SECONDS = _declare(
    "over_budget_seconds", "counter", "Time the bank spent over budget since start", unit="seconds"
)
MODE = _declare("mode", "gauge", "1 for the bank's current operating mode, 0 for the others", ("mode",))
BUDGET_SOURCE_WATTS = _declare(
    "budget_source_watts", "gauge",
    "Each budget source's current value: config (the file or its [feed] derivation), ups, wall_meter, pdu, bmc, "
    "rapl, remote, circuit; the lowest is in force, never above config",
    ("source",), "watts",
)
BUDGET_SOURCE_IN_FORCE = _declare(
    "budget_source_in_force", "gauge", "1 for the budget source whose value is in force, 0 for the others",
    ("source",),
)

# -- each card -------------------------------------------------------------------------
GPU_LIMIT = _declare(
    "gpu_power_limit_watts", "gauge", "Power limit set on the card (nvmlDeviceGetPowerManagementLimit, read back)",
    CARD_LABELS, "watts",
)
GPU_ENFORCED = _declare(
    "gpu_enforced_power_limit_watts", "gauge",
    "Power limit in force after every limiter (nvmlDeviceGetEnforcedPowerLimit)", CARD_LABELS, "watts",
)
GPU_LIMIT_MIN = _declare(
    "gpu_power_limit_min_watts", "gauge", "Lowest power limit the card accepts", CARD_LABELS, "watts"
)
GPU_LIMIT_MAX = _declare(
    "gpu_power_limit_max_watts", "gauge",
    "Highest power limit powerbudgetd will set (the card's, or lower from [cards] max_w)", CARD_LABELS, "watts",
)
GPU_DRAW = _declare(
    "gpu_power_draw_watts", "gauge", "Board power, trailing 1 s average (nvmlDeviceGetPowerUsage)",
    CARD_LABELS, "watts",
)
GPU_DRAW_INSTANT = _declare(
    "gpu_power_draw_instant_watts", "gauge", "Board power, instant (NVML field 186, refreshed every 100 ms)",
    CARD_LABELS, "watts",
)
GPU_DRAW_PEAK = _declare(
    "gpu_power_draw_peak_watts", "gauge",
    f"Highest instant board power read (every tick, 100 ms) over the last {PEAK_WINDOW_S:.0f} s",
    CARD_LABELS, "watts",
)
GPU_CONTESTED = _declare(
    "gpu_contested_power_limit_watts", "gauge",
    "The power limit another tool keeps writing on this card; present only while the card is contested "
    "(nothing is raised then)", CARD_LABELS, "watts",
)
GPU_OUTSIDE_CAP = _declare(
    "gpu_outside_power_cap_watts", "gauge",
    "The enforced limit an outside limiter (a BMC, a node-level cap) holds this card at, below what powerbudgetd "
    "requested; present only while it does (the card is given what it can use, the rest lent)",
    CARD_LABELS, "watts",
)
GPU_EXCURSIONS = _declare(
    "gpu_power_excursions", "counter",
    "Times the instant draw rose above the enforced limit (normal at load onset: the limit caps the 1 s average)",
    CARD_LABELS,
)
GPU_READINGS_REJECTED = _declare(
    "gpu_power_readings_rejected", "counter",
    "Power readings not believed, by reason: impossible (negative, overflowed, far above the card's maximum) "
    "or frozen (stuck while the energy counter moves); the draw counts as unknown meanwhile",
    (*CARD_LABELS, "reason"),
)
GPU_EXCURSION_PEAK = _declare(
    "gpu_power_excursion_peak_watts", "gauge", "Highest instant draw seen above the enforced limit",
    CARD_LABELS, "watts",
)
GPU_MIG = _declare(
    "gpu_mig_mode", "gauge",
    "1 while MIG is enabled on the GPU, 0 while disabled; absent where the card has no MIG. Limits are set on "
    "the parent GPU and cover all its MIG devices", CARD_LABELS,
)
GPU_ROLE = _declare("gpu_role", "gauge", "1 for the card's current role, 0 for the others", (*CARD_LABELS, "role"))
GPU_ENERGY = _declare(
    "gpu_energy_joules", "counter",
    "Board energy since the driver loaded (nvmlDeviceGetTotalEnergyConsumption), read at scrape time",
    CARD_LABELS, "joules",
)

# -- the UPS ([ups], Network UPS Tools) ------------------------------------------------------
UPS_DATA_STATE = _declare(
    "ups_data_state", "gauge", "1 for the state of the UPS data: ok, waiting, or why it is silent", ("state",)
)
UPS_STATUS = _declare(
    "ups_status", "gauge", "1 while the UPS reports the ups.status flag (OL, OB, LB, FSD, OVER, ...)", ("flag",)
)
UPS_ON_BATTERY = _declare(
    "ups_on_battery", "gauge",
    "1 while the UPS is judged on battery, by the evidence: OB, OL DISCHRG (a falling charge), input.voltage (near 0 V)",
    ("evidence",),
)
UPS_LOAD = _declare("ups_load_ratio", "gauge", "UPS load (ups.load / 100)")
UPS_REALPOWER = _declare(
    "ups_realpower_watts", "gauge", "UPS output real power: ups.realpower, else ups.load x ups.realpower.nominal",
    unit="watts",
)
UPS_REALPOWER_NOMINAL = _declare("ups_realpower_nominal_watts", "gauge", "ups.realpower.nominal", unit="watts")
UPS_CHARGE = _declare("ups_battery_charge_ratio", "gauge", "battery.charge / 100")
UPS_RUNTIME = _declare("ups_battery_runtime_seconds", "gauge", "battery.runtime", unit="seconds")
UPS_DATA_AGE = _declare("ups_data_age_seconds", "gauge", "Seconds since the last fresh UPS reading", unit="seconds")
UPS_BUDGET = _declare(
    "ups_budget_watts", "gauge", "Board budget the UPS allows (the configured budget when it does not limit)",
    unit="watts",
)
UPS_BUDGET_REASON = _declare(
    "ups_budget_reason", "gauge", "1 for the reason the UPS lowers the budget, if it does", ("reason",)
)
UPS_POLLS_FAILED = _declare("ups_polls_failed", "counter", "Polls of upsd that gave no usable data, by cause", ("cause",))
UPS_VALUES_REJECTED = _declare(
    "ups_values_rejected", "counter", "NUT values ignored as non-numeric or out of bounds, by variable", ("variable",)
)
UPS_READINGS_IMPLAUSIBLE = _declare(
    "ups_readings_implausible", "counter",
    "UPS measured loads ignored by the plausibility rule (sentinel, below our own cards' draw, frozen)", ("reason",),
)
UPS_MEASURED_LOAD_TRUSTED = _declare(
    "ups_measured_load_trusted", "gauge",
    "1 while the UPS's measured load may raise the budget; 0 after an implausible one, until plausible readings return",
)

# -- polled meters: a PDU over SNMP ([pdu]), the host's BMC over Redfish ([bmc]) ----------------
METER_STATE = _declare(
    "meter_state", "gauge", "1 for the state of each polled meter (source pdu, bmc): ok, waiting, implausible, or why "
    "it is silent", ("source", "state"),
)
METER_POWER = _declare(
    "meter_power_watts", "gauge", "The meter's last plausible figure: real power at the plug (a PDU's inlet or the "
    "sum of the named outlets, the BMC's chassis power)", ("source",), "watts",
)
METER_PART_POWER = _declare(
    "meter_part_power_watts", "gauge", "Each named outlet's real power as the PDU last gave it", ("source", "part"),
    "watts",
)
METER_READING_AGE = _declare(
    "meter_reading_age_seconds", "gauge",
    "Seconds since the meter's figure last changed (a figure that stands is no new reading)", ("source",), "seconds",
)
METER_BUDGET = _declare(
    "meter_budget_watts", "gauge", "Board budget the meter allows (the configured budget when it does not limit)",
    ("source",), "watts",
)
METER_TRUSTED = _declare(
    "meter_trusted", "gauge",
    "1 while the meter's figures may raise the budget; 0 after an implausible one, until plausible ones return",
    ("source",),
)
METER_READINGS_IMPLAUSIBLE = _declare(
    "meter_readings_implausible", "counter",
    "Meter figures refused by the plausibility rule (sentinel, below_own_draw, frozen, not_watts)", ("source", "reason"),
)
METER_POLLS_FAILED = _declare(
    "meter_polls_failed", "counter", "Polls of a meter that gave no figure, by cause", ("source", "cause"),
)

# -- the host's own draw measured: the CPU packages' RAPL counters ([rapl]) ------------------------
HOST_CPU_POWER = _declare(
    "host_cpu_power_watts", "gauge", "The CPU packages' power over the last RAPL window (NaN: not read)",
    unit="watts",
)
HOST_CPU_POWER_AGE = _declare(
    "host_cpu_power_age_seconds", "gauge", "Seconds since the last RAPL window closed", unit="seconds",
)
HOST_DRAW = _declare(
    "host_draw_watts", "gauge",
    "The host's own draw in the feed's budget: [feed] host_w, or the packages + [rapl] other_w where higher",
    unit="watts",
)

# -- MQTT: broker, wall meter, remote budget ([mqtt]) -----------------------------------------
MQTT_CONNECTED = _declare("mqtt_connected", "gauge", "1 while connected to the MQTT broker")
MQTT_DROPPED = _declare(
    "mqtt_messages_dropped", "counter", "MQTT messages dropped unhandled, by topic kind and reason", ("kind", "reason")
)
MQTT_MESSAGE_AGE = _declare(
    "mqtt_last_message_age_seconds", "gauge", "Seconds since the last message on each subscribed topic", ("topic",),
    "seconds",
)
MQTT_NODE_ID_CONFLICTS = _declare(
    "mqtt_node_id_conflicts", "counter", "Other instances seen announcing this node id"
)
WALL_METER_WAITING = _declare("wall_meter_waiting", "gauge", "1 until the wall meter's first valid reading")
WALL_METER_BUDGET = _declare(
    "wall_meter_budget_watts", "gauge",
    "Board budget the wall meter allows after hysteresis (the configured budget when it does not limit)",
    unit="watts",
)
WALL_METER_OK = _declare("wall_meter_ok", "gauge", "1 while the wall meter's last reading is fresh and valid")
WALL_READINGS_IGNORED = _declare("wall_readings_ignored", "counter", "Wall readings ignored, by reason", ("reason",))
REMOTE_COMMANDS = _declare("remote_budget_commands", "counter", "Remote budget commands, by result", ("result",))
WALL_POWER = _declare("wall_power_watts", "gauge", "Last valid wall (plug) power reading", unit="watts")
WALL_NON_GPU = _declare(
    "wall_non_gpu_watts", "gauge", "Wall power not explained by GPU board power / PSU efficiency", unit="watts"
)

# -- a circuit shared through etcd ([circuit]) ---------------------------------------------
CIRCUIT_BUDGET = _declare("circuit_budget_watts", "gauge", "The circuit's wall budget (W), as etcd holds it", unit="watts")
CIRCUIT_RESERVE = _declare("circuit_reserve_watts", "gauge", "This host's reserve: wall W it may always use", unit="watts")
CIRCUIT_GRANT = _declare(
    "circuit_grant_watts", "gauge", "This host's grant in use above its reserve (wall W)", unit="watts"
)
CIRCUIT_GRANT_HELD = _declare(
    "circuit_grant_held_watts", "gauge", "This host's grant as etcd holds it (wall W)", unit="watts"
)
CIRCUIT_WANT = _declare(
    "circuit_want_watts", "gauge", "What this host's recipients could use above its reserve (wall W)", unit="watts"
)
CIRCUIT_LEASE_VALID = _declare(
    "circuit_lease_valid_seconds", "gauge",
    "Seconds the grant stays valid here without a renewal (the fence: before the lease can expire in etcd)",
    unit="seconds",
)
CIRCUIT_ETCD_REACHABLE = _declare("circuit_etcd_reachable", "gauge", "1 when the last etcd call answered")
CIRCUIT_SEAT_FITS = _declare(
    "circuit_seat_fits", "gauge", "1 when this host's seat is registered (fits the circuit)"
)
CIRCUIT_SEATS = _declare("circuit_seats_watts", "gauge", "Sum of every seat (wall W)", unit="watts")
CIRCUIT_COMMITTED = _declare("circuit_committed_watts", "gauge", "Sum of seats and grants (wall W)", unit="watts")
CIRCUIT_PENDING = _declare(
    "circuit_pending_watts", "gauge", "Reserves of hosts whose seat did not fit (wall W)", unit="watts"
)
CIRCUIT_GRANTS_ALLOWED = _declare(
    "circuit_grants_allowed", "gauge",
    "1 when this host may take grants (seat fits, claim held, watchdog enforced)",
)
CIRCUIT_CLAIM_HELD = _declare("circuit_claim_held", "gauge", "1 when this daemon holds the claim on its host name")
CIRCUIT_AT_FLOORS = _declare(
    "circuit_at_floors", "gauge",
    "1 when this host runs at its cards' floors: its seat vanished and does not fit again, or lies beyond the budget",
)
CIRCUIT_BAD_RECORDS = _declare(
    "circuit_bad_records", "gauge", "Keys under the circuit whose value could not be read (last read)"
)
CIRCUIT_CAPS = _declare(
    "circuit_caps_watts", "gauge", "This host's sum of caps at the wall, as published (feed model, W)", unit="watts"
)
CIRCUIT_DRAW = _declare(
    "circuit_draw_watts", "gauge",
    "This host's measured draw at the wall, as published (the cards' 1 s averages through the feed model, W)",
    unit="watts",
)
CIRCUIT_INFO = _declare("circuit_info", "gauge", "The circuit this host is on (label circuit); always 1", ("circuit",))
CIRCUIT_NODE_BUDGET = _declare(
    "circuit_node_budget_watts", "gauge", "A power tree node on this host's cords' paths: its budget (wall W)",
    ("node",), unit="watts",
)
CIRCUIT_NODE_COMMITTED = _declare(
    "circuit_node_committed_watts", "gauge",
    "A node on this host's paths: the seats and grants it carries (wall W; failover counted, and with a feed lost "
    "where they now flow)", ("node",), unit="watts",
)
CIRCUIT_NODE_DRAW = _declare(
    "circuit_node_draw_watts", "gauge",
    "A node on this host's paths: its reported draw, the live hosts' published measured draw through it, where it "
    "flows now (wall W; absent while a host's draw is unknown)", ("node",), unit="watts",
)
CIRCUIT_NODE_MEASURED = _declare(
    "circuit_node_measured_watts", "gauge",
    "A metered node on this host's paths: its measured draw, the reading of the meter the tree names for it, as a "
    "host under it published it (wall W; absent before a reading)", ("node",), unit="watts",
)
CIRCUIT_NODE_UNMANAGED = _declare(
    "circuit_node_unmanaged_watts", "gauge",
    "A node on this host's paths: the unmanaged load taken off its budget (measured - reported, floored at 0, from a "
    "fresh reading; or its children's, the larger) (wall W; absent for a node without one)", ("node",), unit="watts",
)
CIRCUIT_NODE_METER_AGE = _declare(
    "circuit_node_meter_age_seconds", "gauge",
    "A metered node on this host's paths: seconds since a poll last showed its meter's value (stale after 3 "
    "refreshes, at least 10 s: no unmanaged load counted)", ("node",), unit="seconds",
)
CIRCUIT_FEED_LOST = _declare(
    "circuit_feed_lost", "gauge", "1 while a feed of the power tree is marked lost (label feed); absent otherwise",
    ("feed",),
)
CIRCUIT_GRANT_LOST = _declare(
    "circuit_grant_lost", "counter", "Grants lost: the lease expired before a renewal"
)
CIRCUIT_TXN_CONFLICTS = _declare(
    "circuit_txn_conflicts", "counter", "Raise transactions that failed their compare"
)
CIRCUIT_ROUNDS = _declare(
    "circuit_rounds", "counter",
    "Circuit rounds this host ran, by what started each: poll (poll_s or the keepalive; the first round too), chance "
    "(a change woke it, from the wake budget) or pressing (a change that may lower a grant, a UPS on battery, the "
    "watch opened, a stop)", ("cause",)
)
CIRCUIT_SEAT_VANISHED = _declare(
    "circuit_seat_vanished", "counter", "Times this host's seat was found gone (or changed) while it ran"
)
CIRCUIT_GRANT_VANISHED = _declare(
    "circuit_grant_vanished", "counter",
    "Times this host's grant was found lowered under it while its cards might draw more, and could not be put back",
)
CIRCUIT_BAD_RECORDS_SEEN = _declare(
    "circuit_bad_records_seen", "counter", "Bad values read under the circuit (once per key and value)"
)

DECLARED: tuple[MetricSpec, ...] = tuple(_ALL)
"""Every metric powerbudgetd serves, in declaration order."""


def declared_series() -> dict[str, MetricSpec]:
    """Every sample name a scrape may carry (see :attr:`MetricSpec.series`) -> its spec."""
    return {series: spec for spec in DECLARED for series in spec.series}


def gauge(spec: MetricSpec, registry: CollectorRegistry) -> Gauge:
    """``spec``'s gauge on ``registry``. Raises ValueError when ``spec`` is not a gauge."""
    _kind(spec, "gauge")
    return Gauge(spec.name, spec.doc, spec.labels, registry=registry)


def counter(spec: MetricSpec, registry: CollectorRegistry) -> Counter:
    """``spec``'s counter on ``registry``. Raises ValueError when ``spec`` is not a counter."""
    _kind(spec, "counter")
    return Counter(spec.name, spec.doc, spec.labels, registry=registry)


def histogram(spec: MetricSpec, registry: CollectorRegistry, buckets: Sequence[float]) -> Histogram:
    """``spec``'s histogram on ``registry`` with ``buckets`` (upper bounds)."""
    _kind(spec, "histogram")
    return Histogram(spec.name, spec.doc, spec.labels, buckets=buckets, registry=registry)


def info(spec: MetricSpec, registry: CollectorRegistry) -> Info:
    """``spec``'s info metric on ``registry`` (its declared labels are the keys given to
    ``Info.info``)."""
    _kind(spec, "info")
    return Info(spec.name, spec.doc, registry=registry)


def _kind(spec: MetricSpec, kind: Kind) -> None:
    if spec.kind != kind:
        raise ValueError(f"{spec.name} is declared a {spec.kind}, not a {kind}")


def _check_unique() -> None:
    seen: set[str] = set()
    for spec in DECLARED:
        for series in spec.series:
            if series in seen:
                raise ValueError(f"metric series {series} declared twice")
            seen.add(series)


_check_unique()
