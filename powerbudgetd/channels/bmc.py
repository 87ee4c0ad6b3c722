"""The host's BMC over Redfish: the only module that imports ``sushy`` (OpenStack Ironic's
Redfish client; the ``[redfish]`` extra). Each poll GETs the chassis' power resource
(``core.redfishpower``) in a worker thread (sushy is synchronous) and hands the figure
to a :class:`~powerbudgetd.channels.meter.MeterChannel` under the source name ``bmc``.

Why sushy: it verifies the BMC's certificate by default (the system's CAs, or a CA file),
bounds every request with a timeout, and maps HTTP failures to typed errors; its
project's emulator (sushy-tools) is what the tests run against. DMTF's ``redfish``
library, the other maintained client, skips certificate checks unless a CA file is given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from sushy import exceptions as sushy_errors
from sushy.connector import Connector

from powerbudgetd.channels.meter import MeterChannel, MeterError
from powerbudgetd.channels.ups import BudgetSink
from powerbudgetd.config.meters import BmcConfig
from powerbudgetd.core.feed import Feed
from powerbudgetd.core.pdumib import Figure
from powerbudgetd.core.redfishpower import RedfishError, members, power_links, watts

SOURCE = "bmc"
SERVICE_ROOT = "/redfish/v1"


class RedfishBmc:
    """The BMC's Redfish service: :meth:`read` is one poll's :class:`Figure`. The power
    resource is found once (the configured chassis, else the first with a power link)
    and found again after a failure. Raises MeterError ``unreachable``, ``timeout``,
    ``auth_failed`` (401/403), ``absent`` (no such chassis, no power resource, a null
    figure), ``garbled`` or ``error``."""

    def __init__(self, cfg: BmcConfig) -> None:
        self.cfg = cfg
        verify: bool | str = str(cfg.ca_file) if cfg.ca_file is not None else cfg.verify_tls
        self.conn = Connector(cfg.url, verify=verify, default_request_timeout=cfg.timeout_s,
                              connect_timeout=cfg.timeout_s)
        if cfg.username is not None and cfg.password is not None:
            self.conn.set_http_basic_auth(cfg.username, cfg.password.get_secret_value())
        self.source: tuple[str, str] | None = None  # (kind, path) of the power resource

    def _get(self, path: str) -> Any:
        try:
            response = self.conn.get(path)
        except sushy_errors.AccessError as exc:
            raise MeterError("auth_failed", f"{self.cfg.url}{path}: {exc}") from None
        except sushy_errors.ResourceNotFoundError:
            raise MeterError("absent", f"{self.cfg.url}{path}: not found (404)") from None
        except sushy_errors.ConnectionError as exc:
            cause = "timeout" if "timed out" in str(exc).lower() or "timeout" in str(exc).lower() else "unreachable"
            raise MeterError(cause, f"{self.cfg.url}: {exc}") from None
        except sushy_errors.SushyError as exc:
            raise MeterError("error", f"{self.cfg.url}{path}: {exc}") from None
        try:
            return response.json()
        except ValueError:
            raise MeterError("garbled", f"{self.cfg.url}{path}: not JSON") from None

    def _find(self) -> tuple[str, str]:
        if self.cfg.chassis is not None:
            paths = [f"{SERVICE_ROOT}/Chassis/{self.cfg.chassis}"]
        else:
            root = self._get(f"{SERVICE_ROOT}/")
            link = root.get("Chassis", {}).get("@odata.id") if isinstance(root, dict) else None
            if not isinstance(link, str):
                raise MeterError("absent", f"{self.cfg.url}: the service root links no Chassis collection")
            paths = members(self._get(link))
        for path in paths:
            found = power_links(self._get(path))
            if found:
                return found[0]
        raise MeterError("absent", f"{self.cfg.url}: no chassis links a Power or EnvironmentMetrics resource "
                                   f"(looked at {', '.join(paths) or 'none'}); name one with [bmc] chassis")

    def read_sync(self) -> Figure:
        try:
            if self.source is None:
                self.source = self._find()
            kind, path = self.source
            return Figure(watts(kind, self._get(path)))
        except RedfishError as exc:
            raise MeterError(exc.cause, f"{self.cfg.url}: {exc}") from None
        except MeterError as exc:
            if exc.cause != "absent":
                self.source = None  # found again after the BMC comes back (it may have been reset)
            raise

    async def read(self) -> Figure:
        return await asyncio.to_thread(self.read_sync)


def bmc_channel(cfg: BmcConfig, sink: BudgetSink, feed: Feed, *, registry: CollectorRegistry = REGISTRY,
                clock: Callable[[], float] = time.monotonic) -> MeterChannel:
    """The ``bmc`` source: :class:`RedfishBmc` read through a :class:`MeterChannel`."""
    bmc = RedfishBmc(cfg)
    where = f"{cfg.url}{f' chassis {cfg.chassis}' if cfg.chassis else ''}"
    return MeterChannel(SOURCE, cfg, where, bmc.read, sink, feed, registry=registry, clock=clock)


__all__ = ["SOURCE", "RedfishBmc", "bmc_channel"]
