"""The Prometheus endpoint's section ([metrics]) and the default metrics port."""

from __future__ import annotations


from pydantic import (
    Field,
    IPvAnyAddress,
)

from powerbudgetd.config.base import _Section

# The metrics port's one home (see MetricsConfig): the example config, the manifests and
# the docs are checked against it (tests/test_defaults.py), and so is the command line's
# help, which mirrors it (cli.py).
DEFAULT_METRICS_PORT = 19400


class MetricsConfig(_Section):
    """The Prometheus endpoint, ``http://listen_address:port/metrics``.

    Loopback by default: the daemon runs as root, and its numbers are for this host's
    Prometheus (or a reverse proxy) unless the operator opens them up with
    ``listen_address = "0.0.0.0"`` (or the address of the scrape network). The default
    port (:data:`DEFAULT_METRICS_PORT`) lies outside 9100-9999, which exporters have
    claimed, and clear of dcgm-exporter's 9400.
    At most ``max_connections`` are held at once (fewer where the descriptor limit is
    low); a connection silent for ``idle_timeout_s`` is closed, and one that has not
    sent a whole request ``request_timeout_s`` after its first byte (a client dribbling
    bytes to hold its slot) too.
    """

    enabled: bool = True
    listen_address: IPvAnyAddress = Field(default="127.0.0.1", validate_default=True)
    port: int = Field(DEFAULT_METRICS_PORT, ge=1, le=65535)
    max_connections: int = Field(256, ge=4, le=10_000)
    idle_timeout_s: float = Field(10.0, gt=0, le=300)
    request_timeout_s: float = Field(5.0, gt=0, le=300)
